"""Where a cluster's calibration file lives, this host's fingerprint, and whether a file applies here.

`harness calibrate --cluster NAME` writes `<profile dir>/<NAME>.calibration.json` (next to the profile, or under
the user's data dir when the profiles' folder is read-only; `HARNESS_CALIBRATION_DIR` overrides both), and the
planner looks in the same places.

A calibration describes one machine. For a `local` profile the file records this host's fingerprint (hostname,
CPU model and count, torch version) and a file whose fingerprint differs is refused (`CalibrationMismatch`, exit 2
from the CLI) unless forced. A SLURM profile's file was measured on its compute nodes; `harness plan` runs on a
login node that cannot observe them, so there only the cluster name is checked. On a CPU the allocator the file was
measured with must be the profile's (freed memory kept or not changes every step's time).
"""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from harness.core.errors import InputError, Problem
from harness.plan.calibration.file import Calibration, Fingerprint, parse_calibration, read_calibration
from harness.scenario.cluster import find_peak
from harness.scenario.performance import Performance

CALIBRATION_DIR_ENV = "HARNESS_CALIBRATION_DIR"
"""a folder that replaces both default places (reading and writing): tests, read-only checkouts"""
SUFFIX = ".calibration.json"
MATCH_KEYS = ("hostname", "cpu_model", "cpu_count", "torch")
"""fingerprint fields that must equal this host's for a local profile's calibration to apply"""


class CalibrationMismatch(InputError):
    """A calibration file that belongs to another machine or cluster (exit 2 from the CLI)."""


class ClusterProfile(Protocol):
    """What calibrations and rates read of a cluster profile (harness.scenario.cluster.Cluster, or its
    `RatesSource`)."""

    @property
    def name(self) -> str: ...

    @property
    def path(self) -> str: ...

    @property
    def executor(self) -> str: ...

    @property
    def device(self) -> str: ...

    @property
    def cpu_allocator(self) -> str: ...

    @property
    def performance(self) -> Performance: ...


# --------------------------------------------------------------------------------------------------
# where files live


def user_dir() -> Path:
    """Per-user place for calibrations when the profiles' folder is read-only: $XDG_DATA_HOME/harness/calibration
    (default ~/.local/share/harness/calibration)."""
    base = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(base) / "harness" / "calibration"


def candidate_paths(cluster: ClusterProfile) -> list[Path]:
    """Where a calibration of `cluster` is looked for, in order."""
    name = f"{cluster.name}{SUFFIX}"
    override = os.environ.get(CALIBRATION_DIR_ENV)
    if override:
        return [Path(override) / name]
    return [Path(cluster.path).resolve().parent / name, user_dir() / name]


def write_path(cluster: ClusterProfile) -> Path:
    """Where `harness calibrate` writes: next to the profile when that folder is writable, else the user dir."""
    first = candidate_paths(cluster)[0]
    if os.environ.get(CALIBRATION_DIR_ENV):
        return first
    return first if os.access(first.parent, os.W_OK) else user_dir() / first.name


# --------------------------------------------------------------------------------------------------
# this host


def cpu_model() -> str | None:
    """The CPU's model name from /proc/cpuinfo (Linux), else platform's processor string, else None."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    import platform

    return platform.processor() or None


def usable_cores() -> int:
    """CPU cores this process may run on (its affinity), which local ranks share."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def torch_version() -> str | None:
    from importlib import metadata  # NOTE: here, not at the top: 30 ms of `harness plan`'s start for a SLURM profile

    try:
        return metadata.version("torch")
    except metadata.PackageNotFoundError:
        return None


def host_fingerprint() -> Fingerprint:
    """This host, as far as it can be seen without importing torch (the device process adds the device's fields)."""
    return Fingerprint(
        hostname=socket.gethostname(), cpu_model=cpu_model(), cpu_count=usable_cores(), torch=torch_version()
    )


def describe_fingerprint(fp: Fingerprint) -> str:
    """`host NAME (CPU model, N CPUs[, GPU name], torch VERSION)`: a machine in one phrase, for the user."""
    gpu = f", {fp.device_name}" if fp.device_name else ""
    cpus = f"{fp.cpu_model}, {fp.cpu_count} CPUs{gpu}"
    return f"host {fp.hostname} ({cpus}, torch {fp.torch})"


def mismatch_reason(calibration: Calibration, cluster: ClusterProfile) -> str | None:
    """Why a calibration does not describe this cluster (and, for a local profile, this host), or None."""
    if calibration.cluster != cluster.name:
        return f"it calibrates cluster {calibration.cluster!r}, not {cluster.name!r}"
    if calibration.from_logs:
        # NOTE: the logs describe the cluster's nodes, not the host that read them: only their GPU is checked
        return logged_gpu_mismatch(calibration.fingerprint.device_name, getattr(cluster, "description", ""))
    fp = calibration.fingerprint
    measured_with = fp.cpu_allocator  # NOTE: a file from before the key was measured with glibc's defaults
    if cluster.device == "cpu" and measured_with != cluster.cpu_allocator:
        return (
            f"it was measured with cpu_allocator {measured_with!r} and the profile now says "
            f"{cluster.cpu_allocator!r} (freed memory kept or not changes every step's time on a CPU)"
        )
    if cluster.executor != "local":
        return None
    here = host_fingerprint()
    differs = [k for k in MATCH_KEYS if getattr(fp, k) != getattr(here, k)]
    if differs:
        return (
            f"it was measured on {describe_fingerprint(fp)}, this is {describe_fingerprint(here)} "
            f"({', '.join(differs)} differ)"
        )
    return None


def logged_gpu_mismatch(device_name: str | None, description: str) -> str | None:
    """Why logs of the GPU `device_name` do not describe a profile whose `description` names another (the peak
    FLOPS table's entries, harness.scenario.cluster.PEAKS), or None: their rates, and MFU's peak, would be that
    GPU's. A description that names no GPU the table knows, or logs that name none, are not compared."""
    profile_gpu = find_peak(description)
    if device_name is None or profile_gpu is None:
        return None
    logged_gpu = find_peak(device_name)
    if logged_gpu is profile_gpu:
        return None
    seen = f" ({logged_gpu.name})" if logged_gpu is not None else ""
    return (
        f"the logs ran on {device_name!r}{seen} and the profile describes {profile_gpu.name} ({description!r}): its "
        "rates and MFU's peak would be another GPU's"
    )


# --------------------------------------------------------------------------------------------------
# finding a cluster's file


@dataclass(frozen=True)
class Found:
    """A calibration found for a cluster: its file, its content, and whether it was forced. `calibration` may be
    given as the file's JSON document (tests, benches: harness.plan.calibration.example.example_calibration); it is
    validated here, InputError naming `path` when it is not a calibration."""

    path: Path
    calibration: Calibration
    forced: str | None
    """the mismatch that --force accepted, else None"""

    def __post_init__(self) -> None:
        given: Any = self.calibration
        if isinstance(given, Mapping):
            object.__setattr__(self, "calibration", parse_calibration(given, file=str(self.path)))


def find_calibration(cluster: ClusterProfile, *, force: bool = False) -> Found | None:
    """The calibration of `cluster`, or None when there is none. A file of another machine or cluster raises
    CalibrationMismatch with the reason, unless `force`; a file that is not a calibration, InputError."""
    for path in candidate_paths(cluster):
        try:
            path.stat()
        except OSError:
            continue
        calibration = read_calibration(path)
        why = mismatch_reason(calibration, cluster)
        if why is not None and not force:
            raise CalibrationMismatch(
                [
                    Problem(
                        str(path),
                        "",
                        f"this calibration does not apply here: {why}; run `harness calibrate --cluster "
                        f"{cluster.name}` on this machine (`harness plan --force-calibration` uses it anyway)",
                    )
                ]
            )
        return Found(path, calibration, why)
    return None
