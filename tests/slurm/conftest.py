"""The real SLURM cluster on localhost (scripts/slurm-local.sh), for tests marked `slurm`.

`slurm_cluster` brings the cluster up once per session, unless it is already up, and takes it down at the end only
if it started it. It skips (not fails) only when the machine cannot have a cluster: not root, no apt-get, or the
package install failed (the script's exit code 3). Any other failure to come up is a test error.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import textwrap
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "slurm-local.sh"
PREREQUISITES_MISSING = 3
"""slurm-local.sh's exit code for: not root / no apt-get / install failed"""
UP_TIMEOUT_S = 600
"""a first `up` installs packages (about 15 s from the apt cache, longer from the network)"""

# name -> seconds, printed at the end of the session (tests never assert on wall-clock speed)
TIMINGS_S: dict[str, float] = {}


@dataclass(frozen=True)
class SlurmCluster:
    """What tests need to know about the running localhost cluster."""

    partition: str
    nodes: tuple[str, ...]
    state_dir: Path
    slurm_conf: Path
    started_here: bool
    """True when this session brought it up (and so takes it down)"""
    up_s: float
    """seconds `slurm-local.sh up` took in this session (0.0 when it was already up)"""


def _script(*args: str, timeout_s: float) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(SCRIPT), *args], capture_output=True, text=True, timeout=timeout_s)


@pytest.fixture(scope="session")
def slurm_cluster():
    if os.geteuid() != 0:
        pytest.skip("SLURM on localhost needs root (packages, /etc/hosts, daemons); run as root or skip -m 'not slurm'")
    if shutil.which("slurmctld") is None and shutil.which("apt-get") is None:
        pytest.skip("SLURM is not installed and apt-get is not available to install it")
    state_dir = Path(os.environ.get("HARNESS_SLURM_DIR", "/tmp/harness-slurm"))
    already_up = _script("status", timeout_s=60).returncode == 0
    t0 = time.perf_counter()
    up = _script("up", timeout_s=UP_TIMEOUT_S)
    up_s = time.perf_counter() - t0
    if up.returncode == PREREQUISITES_MISSING:
        pytest.skip(f"no SLURM cluster on this machine: {up.stderr.strip() or up.stdout.strip()}")
    if up.returncode != 0:
        pytest.fail(
            f"scripts/slurm-local.sh up failed (exit {up.returncode}):\n{up.stdout}\n{up.stderr}", pytrace=False
        )
    if not already_up:
        TIMINGS_S["slurm-local.sh up"] = up_s
    slurm_conf = state_dir / "etc" / "slurm.conf"
    # NOTE: submitit runs sbatch/sacct/scancel from this process: they must find this cluster's config even when
    # /etc/slurm/slurm.conf belongs to someone else (then the script leaves it alone)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("SLURM_CONF", str(slurm_conf))
        yield SlurmCluster(
            partition="debug",
            nodes=("node1", "node2"),
            state_dir=state_dir,
            slurm_conf=slurm_conf,
            started_here=not already_up,
            up_s=0.0 if already_up else up_s,
        )
    if not already_up:
        t0 = time.perf_counter()
        down = _script("down", timeout_s=120)
        TIMINGS_S["slurm-local.sh down"] = time.perf_counter() - t0
        if down.returncode != 0:
            raise RuntimeError(
                f"scripts/slurm-local.sh down failed (exit {down.returncode}):\n{down.stdout}\n{down.stderr}"
            )


@pytest.fixture
def slurm_folder(slurm_cluster, tmp_path) -> Path:
    """A fresh submitit folder: job ids restart at 1 when the cluster state is wiped, and submitit would return an
    old job's result from a reused folder."""
    folder = tmp_path / "submitit"
    folder.mkdir()
    return folder


@pytest.fixture(scope="session")
def slurm_timings() -> dict[str, float]:
    """Where a test records a measured duration (s) for the session's summary."""
    return TIMINGS_S


@pytest.fixture(autouse=True)
def _time_each_test(request):
    t0 = time.perf_counter()
    yield
    if request.node.get_closest_marker("slurm"):  # the cluster's tests; the pure ones take no time
        TIMINGS_S[request.node.name] = time.perf_counter() - t0


def pytest_terminal_summary(terminalreporter):
    if TIMINGS_S:
        terminalreporter.section("SLURM timings (s)")
        for name, seconds in TIMINGS_S.items():
            terminalreporter.write_line(f"{name:<58} {seconds:7.1f}")


# ---- helpers shared by the SLURM test modules -----------------------------------------------------------


def write(path: Path, text: str) -> Path:
    path.write_text(textwrap.dedent(text))
    return path


def manifest_cells(results: Path, sweep: str) -> dict[str, dict]:
    path = results / sweep / "manifest.json"
    return json.loads(path.read_text())["cells"] if path.exists() else {}


def sacct_states(job_id: str) -> list[str]:
    """The job's state per run (-D: a requeued job has one row per run), straight from sacct."""
    out = subprocess.run(
        ["sacct", "-D", "-n", "-X", "-P", "-j", job_id, "-o", "JobID,State"], check=True, capture_output=True, text=True
    ).stdout
    return [line.split("|")[1] for line in out.splitlines() if line.split("|")[0] == job_id]


def wait_for(predicate, *, timeout_s: float, what: str):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if value := predicate():
            return value
        time.sleep(0.3)
    raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")
