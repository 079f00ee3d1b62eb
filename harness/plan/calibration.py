"""Calibration files and the rates the step-time model reads from them (or from the profile's `performance:` block).

`harness calibrate --cluster NAME` (harness.cli.calibrate → harness.launch.calibrate → harness.worker.calibrate)
measures this cluster's rates and writes `<profile dir>/<NAME>.calibration.json` (next to the profile, or under
the user's data dir when the profiles' folder is read-only; `HARNESS_CALIBRATION_DIR` overrides both). This module
is the file's format, its reader and the `Rates` interface of harness.plan.time: pure, torch-free, so `harness
plan` reads a calibration without importing torch.

A calibration describes one machine. For a `local` profile the file records this host's fingerprint (hostname,
CPU model and count, torch version) and a file whose fingerprint differs is refused (`CalibrationMismatch`, exit 2
from the CLI) unless forced. A SLURM profile's file was measured on its compute nodes; `harness plan` runs on a
login node that cannot observe them, so there only the cluster name is checked.

Units: seconds, bytes; bandwidths in GB/s (1e9 B/s), matmul rates in TFLOPS (1e12 FLOP/s).
"""

from __future__ import annotations

import bisect
import dataclasses
import functools
import hashlib
import json
import math
import os
import socket
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from harness.core.catalogue import CATALOGUE
from harness.core.errors import InputError, Problem
from harness.scenario.performance import Performance

FORMAT = "harness-calibration/1"
CALIBRATION_DIR_ENV = "HARNESS_CALIBRATION_DIR"
"""a folder that replaces both default places (reading and writing): tests, read-only checkouts"""
SUFFIX = ".calibration.json"
MATCH_KEYS = ("hostname", "cpu_model", "cpu_count", "torch")
"""fingerprint fields that must equal this host's for a local profile's calibration to apply"""

BUS_FACTORS: dict[str, Callable[[int], float]] = {
    "all_reduce": lambda n: 2 * (n - 1) / n,
    "all_gather": lambda n: (n - 1) / n,
    "reduce_scatter": lambda n: (n - 1) / n,
    "broadcast": lambda n: 1.0,
}
"""busbw / algbw for a group of n ranks (nccl-tests doc/PERFORMANCE.md), the collectives the model times; the
same factors as harness.worker.meters.comm.BUS_FACTORS, which a test holds equal (this floor cannot import it)"""


def bus_factor(collective: str, n: int) -> float:
    """busbw / algbw of `collective` in a group of `n` ranks; 0 for a one-rank group (nothing crosses a link)."""
    return BUS_FACTORS[collective](n) if n > 1 else 0.0


def algbw_gbps(nbytes: float, seconds: float) -> float:
    """nccl-tests algorithm bandwidth: bytes (the convention of harness.worker.meters.comm) per second, GB/s."""
    return nbytes / seconds / 1e9


def busbw_gbps(collective: str, n: int, nbytes: float, seconds: float) -> float:
    """nccl-tests bus bandwidth: algbw × the collective's factor for n ranks (GB/s)."""
    return algbw_gbps(nbytes, seconds) * bus_factor(collective, n)


class Unknown(Exception):
    """A rate the model needs is not known: the message is the null reason."""


class CalibrationMismatch(InputError):
    """A calibration file that belongs to another machine or cluster (exit 2 from the CLI)."""


class ClusterProfile(Protocol):
    """What the rates read of a cluster profile (harness.scenario.cluster.Cluster, or its `RatesSource`)."""

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


@dataclass(frozen=True)
class RatesSource:
    """Exactly what `rates_for` reads of a cluster profile: frozen and hashable, so the rates are cached on it (the
    profile itself holds dicts: its environment, its SLURM options)."""

    name: str
    path: str
    executor: str
    device: str
    cpu_allocator: str
    performance: Performance

    @classmethod
    def of(cls, cluster: ClusterProfile) -> RatesSource:
        return cls(
            name=cluster.name,
            path=cluster.path,
            executor=cluster.executor,
            device=cluster.device,
            cpu_allocator=cluster.cpu_allocator,
            performance=cluster.performance,
        )


# --------------------------------------------------------------------------------------------------
# where files live, and this host's fingerprint


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
    first, fallback = candidate_paths(cluster)[0], None
    if os.environ.get(CALIBRATION_DIR_ENV):
        return first
    fallback = user_dir() / first.name
    return first if os.access(first.parent, os.W_OK) else fallback


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


def host_fingerprint() -> dict[str, Any]:
    """This host, as far as it can be seen without importing torch (the worker adds the device's name)."""
    return {
        "hostname": socket.gethostname(),
        "cpu_model": cpu_model(),
        "cpu_count": usable_cores(),
        "torch": torch_version(),
    }


def describe_fingerprint(fp: dict[str, Any]) -> str:
    gpu = f", {fp['device_name']}" if fp.get("device_name") else ""
    cpus = f"{fp.get('cpu_model')}, {fp.get('cpu_count')} CPUs{gpu}"
    return f"host {fp.get('hostname')} ({cpus}, torch {fp.get('torch')})"


def mismatch_reason(data: dict[str, Any], cluster: ClusterProfile) -> str | None:
    """Why a calibration does not describe this cluster (and, for a local profile, this host), or None."""
    if data.get("cluster") != cluster.name:
        return f"it calibrates cluster {data.get('cluster')!r}, not {cluster.name!r}"
    fp = data.get("fingerprint") or {}
    # NOTE: a file from before the key was measured with glibc's defaults
    measured_with = fp.get("cpu_allocator", "system")
    if cluster.device == "cpu" and measured_with != cluster.cpu_allocator:
        return (
            f"it was measured with cpu_allocator {measured_with!r} and the profile now says "
            f"{cluster.cpu_allocator!r} (freed memory kept or not changes every step's time on a CPU)"
        )
    if cluster.executor != "local":
        return None
    here = host_fingerprint()
    differs = [k for k in MATCH_KEYS if fp.get(k) != here[k]]
    if differs:
        return (
            f"it was measured on {describe_fingerprint(fp)}, this is {describe_fingerprint(here)} "
            f"({', '.join(differs)} differ)"
        )
    return None


# --------------------------------------------------------------------------------------------------
# reading


def read_file(path: Path) -> dict[str, Any]:
    """A calibration file's JSON, checked for its format; InputError when it is not one."""
    try:
        data = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise InputError([Problem(str(path), "", f"not a readable calibration file: {e}")]) from e
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        got = data.get("format") if isinstance(data, dict) else type(data).__name__
        raise InputError([Problem(str(path), "format", f"{got!r} is not {FORMAT!r}")])
    return data


@dataclass(frozen=True)
class Found:
    path: Path
    data: dict[str, Any]
    forced: str | None
    """the mismatch that --force accepted, else None"""


def find_calibration(cluster: ClusterProfile, *, force: bool = False) -> Found | None:
    """The calibration of `cluster`, or None when there is none. A file of another machine or cluster raises
    CalibrationMismatch with the reason, unless `force`."""
    for path in candidate_paths(cluster):
        try:
            path.stat()
        except OSError:
            continue
        data = read_file(path)
        why = mismatch_reason(data, cluster)
        if why is not None and not force:
            raise CalibrationMismatch(
                [
                    Problem(
                        str(path),
                        "",
                        f"this calibration does not apply here: {why}; run `harness calibrate --cluster "
                        f"{cluster.name}` on this machine, or pass --force to use it anyway",
                    )
                ]
            )
        return Found(path, data, why)
    return None


# --------------------------------------------------------------------------------------------------
# rates


def _interp_loglog(xs: Sequence[float], ys: Sequence[float], x: float) -> float:
    """y at x by linear interpolation in log-log space between sorted points; clamped to the end values."""
    if x <= xs[0]:
        return ys[0]
    if x >= xs[-1]:
        return ys[-1]
    i = bisect.bisect_right(xs, x)
    x0, x1, y0, y1 = math.log(xs[i - 1]), math.log(xs[i]), math.log(ys[i - 1]), math.log(ys[i])
    return math.exp(y0 + (y1 - y0) * (math.log(x) - x0) / (x1 - x0))


def _idw_rate(pts: list[tuple[float, float, float, float]], q: tuple[float, float, float]) -> float:
    """Throughput at log2-shape q: inverse-distance weighting of log-throughput over the four nearest points."""
    near = sorted(((q[0] - a) ** 2 + (q[1] - b) ** 2 + (q[2] - c) ** 2, rate) for a, b, c, rate in pts)[:4]
    if near[0][0] < 1e-12:
        return near[0][1]
    w = [1.0 / dist for dist, _ in near]
    return math.exp(sum(wi * math.log(r) for wi, (_, r) in zip(w, near)) / sum(w))


def _bracket(axis: list[float], x: float) -> tuple[float, float, float]:
    """(lower, upper, weight of upper) of x among sorted grid values, clamped to the ends."""
    if x <= axis[0]:
        return axis[0], axis[0], 0.0
    if x >= axis[-1]:
        return axis[-1], axis[-1], 0.0
    i = bisect.bisect_right(axis, x)
    lo, hi = axis[i - 1], axis[i]
    return lo, hi, (x - lo) / (hi - lo)


def _grid_rate(pts: list[tuple[float, float, float, float]], lm: float, ln: float, lk: float) -> float:
    """GEMM throughput at log2-shape (lm, ln, lk): trilinear interpolation of log-throughput between the eight
    surrounding grid shapes in log2 space (clamped at the grid's ends); a corner that was not measured (the grid's
    slow corner) is estimated from the nearest measured shapes."""
    table = {(a, b, c): r for a, b, c, r in pts}
    axes = [sorted({p[i] for p in pts}) for i in range(3)]
    (m0, m1, wm), (n0, n1, wn), (k0, k1, wk) = _bracket(axes[0], lm), _bracket(axes[1], ln), _bracket(axes[2], lk)
    total = 0.0
    for a, fa in ((m0, 1 - wm), (m1, wm)):
        for b, fb in ((n0, 1 - wn), (n1, wn)):
            for c, fc in ((k0, 1 - wk), (k1, wk)):
                f = fa * fb * fc
                if f == 0.0:
                    continue
                r = table.get((a, b, c))
                total += f * math.log(r if r is not None else _idw_rate(pts, (a, b, c)))
    return math.exp(total)


@dataclass(frozen=True)
class CollectiveCurve:
    """One collective on one link at one group size: measured (bytes, seconds) points, and the fitted latency and
    bus bandwidth used beyond the largest measured message."""

    ranks: int
    sizes: tuple[float, ...]
    times: tuple[float, ...]
    latency_s: float
    busbw_gbps: float

    def seconds(self, collective: str, nbytes: float) -> float:
        if nbytes <= 0:
            return 0.0
        if nbytes <= self.sizes[-1]:
            return _interp_loglog(self.sizes, self.times, max(nbytes, self.sizes[0]))
        factor = bus_factor(collective, self.ranks) or 1.0
        return self.times[-1] + (nbytes - self.sizes[-1]) * factor / (self.busbw_gbps * 1e9)


class Rates:
    """What the time model asks of a cluster: each method returns seconds or raises Unknown(reason).

    Frozen and hashable by content: equal (and of equal hash) when they answer alike, i.e. of the same kind, from the
    same figures (a digest of the calibration file's data, or of the profile's figures) and the same source, so the
    time model's caches (functools.cache) key on the rates themselves, never on the object's id."""

    source: str
    """"calibrated <file> <date>" or "uncalibrated: profile figures (<sources>)" """
    device: str
    host_cores: int | None
    """cores the ranks of one host share (CPU devices); None on GPUs"""
    device_name: str | None = None
    """the GPU's name as torch reports it (MFU's peak), when the rates were measured on one"""
    digest: str
    """sha-256 of everything the rates answer from (set once, by `_seal`)"""

    def _seal(self, content: Any) -> None:
        """Freeze the rates: their digest from `content` (JSON data: the figures and the source), no more changes."""
        blob = json.dumps([type(self).__name__, content], sort_keys=True, separators=(",", ":"), default=str)
        self.digest = hashlib.sha256(blob.encode()).hexdigest()
        self._hash = hash(self.digest)
        self._sealed = True

    def __setattr__(self, name: str, value: Any) -> None:
        if getattr(self, "_sealed", False):
            raise AttributeError(f"{type(self).__name__} is frozen: {name} cannot change")
        object.__setattr__(self, name, value)

    def __eq__(self, other: object) -> bool:
        return type(other) is type(self) and isinstance(other, Rates) and other.digest == self.digest

    def __hash__(self) -> int:
        return self._hash

    def gemm_s(self, dtype: str, m: int, n: int, k: int, layout: str) -> float:
        raise NotImplementedError

    def attention_s(self, dtype: str, *, batch: int, heads: int, seq: int, head_dim: int, phase: str) -> float:
        raise NotImplementedError

    def elementwise_s(self, dtype: str, nbytes: float, *, op_bytes: float) -> float:
        raise NotImplementedError

    def dispatch_s(self) -> tuple[float, float]:
        """(forward op, backward op) host overhead per op (s)"""
        raise NotImplementedError

    def optimizer_s(self, *, elements: float, tensors: int) -> float:
        raise NotImplementedError

    def framework_s(self, strategy: str, precision: str, *, blocks: int, elements: float) -> float:
        """The strategy's own host work per micro-step beyond the priced ops: per step, per block, and per element
        of the parameters this rank's optimizer updates."""
        raise NotImplementedError

    def collective_s(self, collective: str, *, link: str, ranks: int, nbytes: float, dtype: str) -> float:
        raise NotImplementedError

    def p2p_s(self, *, link: str, nbytes: float, dtype: str) -> float:
        """One point-to-point transfer (a pipeline's send or recv of `nbytes`) on `link`: priced as a broadcast
        between two ranks, whose bus factor is 1 (nccl-tests' sendrecv and broadcast both have busbw = algbw): the
        link's latency plus the bytes at its bus bandwidth."""
        return self.collective_s("broadcast", link=link, ranks=2, nbytes=nbytes, dtype=dtype)

    def share(self, kind: str, *, ranks: int) -> float:
        """How much slower one rank's `kind` of work (compute | compute_<dtype> | memory | optimizer) runs while
        `ranks` ranks share its host, relative to one rank alone (>= 1; 1 on GPUs); compute_<dtype> is the compute
        of cells in that dtype where it was measured (else compute's). Without a measurement: the cores rule, max(1,
        ranks / cores)."""
        if self.device != "cpu" or not self.host_cores:
            return 1.0
        return max(1.0, ranks / self.host_cores)

    def overlap(self, *, ranks_on_host: int) -> bool:
        """Whether collectives can run while compute runs (GPUs: comm kernels beside compute; a CPU host: only when
        cores are left over for the communication threads)."""
        if self.device == "cuda":
            return True
        return self.host_cores is not None and ranks_on_host < self.host_cores

    def sync_wait_s(self, *, ranks_on_host: int) -> float:
        """Seconds each collective call waits, beyond its own time, for ranks the host's scheduler has not run yet:
        on a CPU host with more ranks than cores, ranks that compute between collectives reach each one at
        different moments. Measured by the calibration (harness.worker.calibrate.measure_sharing); 0 without a
        measurement and on GPUs."""
        return 0.0


def _per_ranks(pts: list[tuple[int, float]], ranks: int) -> float:
    """A figure measured at some rank counts (sorted), at `ranks`: the first point's at or below it, linear between
    measured counts, and beyond the largest proportional to the ranks (each rank's share of the host shrinks as
    1/ranks)."""
    if ranks <= pts[0][0]:
        return pts[0][1]
    for (r0, f0), (r1, f1) in zip(pts, pts[1:]):
        if ranks <= r1:
            return f0 + (f1 - f0) * (ranks - r0) / (r1 - r0)
    r_max, f_max = pts[-1]
    return f_max * ranks / r_max


class CalibratedRates(Rates):
    """Rates from a calibration file (see harness.worker.calibrate for how each part is measured)."""

    def __init__(self, found: Found) -> None:
        d = found.data
        self.path = found.path
        self.source = f"calibrated {found.path} {str(d.get('created_at', '?'))[:10]}" + (
            f" (forced: {found.forced})" if found.forced else ""
        )
        fp = d.get("fingerprint") or {}
        self.device = fp.get("device", "cpu")
        self.device_name = fp.get("device_name")
        self.host_cores = fp.get("cpu_count") if self.device == "cpu" else None
        c = d.get("compute") or {}
        self._gemm: dict[tuple[str, str], list[tuple[float, float, float, float]]] = {}
        for p in c.get("gemm", []):
            flops = 2.0 * p["m"] * p["n"] * p["k"]
            self._gemm.setdefault((p["dtype"], p["layout"]), []).append(
                (math.log2(p["m"]), math.log2(p["n"]), math.log2(p["k"]), flops / p["s"])
            )
        self._attention = c.get("attention", [])
        self._elementwise: dict[str, tuple[list[float], list[float]]] = {}
        for dtype in {p["dtype"] for p in c.get("elementwise", [])}:
            pts = sorted((p["op_bytes"], p["gbps"]) for p in c["elementwise"] if p["dtype"] == dtype)
            self._elementwise[dtype] = ([x for x, _ in pts], [y for _, y in pts])
        self._dispatch = c.get("dispatch")
        self._optimizer = c.get("optimizer")
        self._framework = c.get("framework", {})
        probes = {
            "compute": "gemm_s",
            "compute_bfloat16": "gemm_bfloat16_s",
            "memory": "elementwise_s",
            "optimizer": "optimizer_s",
        }
        self._sharing: dict[str, list[tuple[int, float]]] = {}
        shared = {e["ranks"]: e for e in d.get("sharing", [])}
        if 1 in shared:
            for kind, probe in probes.items():
                if not all(probe in e for e in shared.values()):
                    continue  # NOTE: a file from before that probe: share() falls back to the fp32 figure
                slowdown = probe.replace("_s", "_slowdown")
                base = shared[1][probe]
                # the slowdown measured against the rank alone in the same minute; a file from before that pairing
                # has only each count's own time, divided by the one-rank figure
                self._sharing[kind] = sorted(
                    (r, max(1.0, e[slowdown] if slowdown in e else e[probe] / base)) for r, e in shared.items()
                )
        waits = [(r, e["sync_wait_s"]) for r, e in shared.items() if r > 1 and "sync_wait_s" in e]
        self._sync_wait: list[tuple[int, float]] = sorted([(1, 0.0), *waits]) if waits else []
        self._comm: dict[tuple[str, str, str], list[CollectiveCurve]] = {}
        for e in d.get("comm", []):
            pts = sorted(zip(e["sizes"], e["times"]))
            curve = CollectiveCurve(
                ranks=e["ranks"],
                sizes=tuple(s for s, _ in pts),
                times=tuple(t for _, t in pts),
                latency_s=e["latency_s"],
                busbw_gbps=e["busbw_gbps"],
            )
            self._comm.setdefault((e["link"], e["collective"], e.get("dtype", "float32")), []).append(curve)
        self._seal([self.source, str(found.path), d])

    def sync_wait_s(self, *, ranks_on_host: int) -> float:
        """The measured wait per collective call at `ranks_on_host` ranks, 0 at one rank, interpolated as `share`."""
        if not self._sync_wait or self.device != "cpu":
            return 0.0
        return _per_ranks(self._sync_wait, ranks_on_host)

    def share(self, kind: str, *, ranks: int) -> float:
        """The measured slowdown at `ranks` ranks on the host (harness.worker.calibrate.measure_sharing): linear
        between measured counts, and beyond the largest proportional to the ranks (each rank's share of the host
        shrinks as 1/ranks)."""
        pts = self._sharing.get(kind) or self._sharing.get(kind.split("_", 1)[0])
        if not pts or self.device != "cpu":
            return super().share(kind, ranks=ranks)
        return _per_ranks(pts, ranks)

    def gemm_s(self, dtype: str, m: int, n: int, k: int, layout: str) -> float:
        return _calibrated_gemm_s(self, dtype, m, n, k, layout)

    def attention_s(self, dtype: str, *, batch: int, heads: int, seq: int, head_dim: int, phase: str) -> float:
        pts = sorted((p["seq"], p[f"{phase}_s"] / (p["batch"] * p["heads"] * p["head_dim"] * p["seq"] ** 2))
                     for p in self._attention if p["dtype"] == dtype)  # fmt: skip
        if not pts:
            raise Unknown(f"no {dtype} attention measured in {self.path.name}")
        per_unit = _interp_loglog([s for s, _ in pts], [u for _, u in pts], seq)
        return per_unit * batch * heads * head_dim * seq**2

    def elementwise_s(self, dtype: str, nbytes: float, *, op_bytes: float) -> float:
        curve = self._elementwise.get(dtype) or self._elementwise.get("float32")
        if curve is None:
            raise Unknown(f"no elementwise bandwidth measured in {self.path.name}")
        return nbytes / (_interp_loglog(curve[0], curve[1], max(op_bytes, 1.0)) * 1e9)

    def dispatch_s(self) -> tuple[float, float]:
        if not self._dispatch:
            raise Unknown(f"no per-op overhead measured in {self.path.name}")
        return self._dispatch["forward_s"], self._dispatch["backward_s"]

    def optimizer_s(self, *, elements: float, tensors: int) -> float:
        if not self._optimizer:
            raise Unknown(f"no optimizer cost measured in {self.path.name}")
        o = self._optimizer
        return o["per_tensor_s"] * tensors + o["per_element_s"] * elements

    def framework_s(self, strategy: str, precision: str, *, blocks: int, elements: float) -> float:
        key = f"{CATALOGUE[strategy].framework_cost}/{precision}"
        f = self._framework.get(key)
        if f is None:
            raise Unknown(f"no framework overhead measured for {key} in {self.path.name}")
        return f["fixed_s"] + f["per_block_s"] * blocks + f.get("per_element_s", 0.0) * elements

    def collective_s(self, collective: str, *, link: str, ranks: int, nbytes: float, dtype: str) -> float:
        return _calibrated_collective_s(self, collective, link, ranks, nbytes, dtype)

    def interpolated_collective_s(self, collective: str, link: str, ranks: int, nbytes: float, dtype: str) -> float:
        """`collective_s` computed (not cached): the curve of `ranks` ranks, or the nearest group size's."""
        curves = self._comm.get((link, collective, dtype)) or self._comm.get((link, collective, "float32"))
        if not curves:
            raise Unknown(f"no {collective} measured on the {link} link in {self.path.name}")
        exact = [c for c in curves if c.ranks == ranks]
        if exact:
            return exact[0].seconds(collective, nbytes)
        # another group size: the nearest measured one below (else above); busbw carries over (nccl-tests' point
        # of busbw), the latency part scales with the ring's n - 1 steps
        below = [c for c in curves if c.ranks <= ranks] or curves
        c = max(below, key=lambda c: c.ranks) if below is not curves else min(curves, key=lambda c: c.ranks)
        if c.ranks <= 1 or ranks <= 1:
            raise Unknown(f"no {collective} measured on the {link} link for {ranks} ranks in {self.path.name}")
        steps = (ranks - 1) / (c.ranks - 1)
        factor_ratio = (bus_factor(collective, ranks) or 1.0) / (bus_factor(collective, c.ranks) or 1.0)
        return c.latency_s * steps + (c.seconds(collective, nbytes) - c.latency_s) * factor_ratio


@functools.cache
def _calibrated_gemm_s(rates: CalibratedRates, dtype: str, m: int, n: int, k: int, layout: str) -> float:
    """One GEMM's seconds at the calibrated grid's interpolated throughput (cached: planning prices each shape of a
    model once per rates)."""
    pts = rates._gemm.get((dtype, layout)) or rates._gemm.get((dtype, "nt"))
    if not pts:
        raise Unknown(f"no {dtype} matmul measured in {rates.path.name}")
    return 2.0 * m * n * k / _grid_rate(pts, math.log2(max(m, 1)), math.log2(max(n, 1)), math.log2(max(k, 1)))


@functools.cache
def _calibrated_collective_s(
    rates: CalibratedRates, collective: str, link: str, ranks: int, nbytes: float, dtype: str
) -> float:
    """One collective call's seconds (cached: ledgers repeat their sizes)."""
    return rates.interpolated_collective_s(collective, link, ranks, nbytes, dtype)


PROFILE_DTYPE_KEY = {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16"}


class ProfileRates(Rates):
    """Rates from the profile's `performance:` block: one matmul rate per precision, one memory bandwidth, one
    latency and bus bandwidth per link. No per-op overhead or framework figure exists for a profile; on a GPU the
    host runs ahead of the device, so those are taken as hidden (zero) — stated in docs/time-model.md."""

    def __init__(self, cluster: ClusterProfile) -> None:
        perf = cluster.performance
        self.name = cluster.name  # the profile's, in a null reason's advice
        self.perf = perf
        self.device = cluster.device
        self.host_cores = None
        srcs = "; ".join(f"{k}: {v}" for k, v in perf.sources.items()) or "none given"
        self.source = f"uncalibrated: profile figures ({srcs})"
        self._seal([self.source, self.name, self.device, dataclasses.asdict(perf)])

    def _need(self, value: float | None, what: str) -> float:
        if value is None:
            raise Unknown(
                f"uncalibrated: the {self.name} profile has no {what}; run `harness calibrate --cluster {self.name}`"
            )
        return value

    def gemm_s(self, dtype: str, m: int, n: int, k: int, layout: str) -> float:
        key = PROFILE_DTYPE_KEY.get(dtype, dtype)
        tflops = self._need(self.perf.matmul_tflops.get(key), f"achievable {key} matmul rate")
        return 2.0 * m * n * k / (tflops * 1e12)

    def attention_s(self, dtype: str, *, batch: int, heads: int, seq: int, head_dim: int, phase: str) -> float:
        # flash attention at the matmul rate: the causal half of the score and value matmuls (forward 2·b·h·s²·hd),
        # backward 2.5 times the forward (FlashAttention-2's count: five matmuls against two)
        fwd = self.gemm_s(dtype, seq, seq, head_dim, "nt") * batch * heads
        return fwd if phase == "forward" else 2.5 * fwd

    def elementwise_s(self, dtype: str, nbytes: float, *, op_bytes: float) -> float:
        return nbytes / (self._need(self.perf.memory_gbps, "achievable memory bandwidth (memory_gbps)") * 1e9)

    def dispatch_s(self) -> tuple[float, float]:
        if self.device == "cuda":
            return 0.0, 0.0
        raise Unknown(f"uncalibrated: the {self.name} profile has no per-op overhead; run `harness calibrate "
                      f"--cluster {self.name}`")  # fmt: skip

    def optimizer_s(self, *, elements: float, tensors: int) -> float:
        # AdamW reads parameter, gradient and two moments and writes three of them: 28 bytes per fp32 element
        return self.elementwise_s("float32", 28.0 * elements, op_bytes=4.0 * elements / max(tensors, 1))

    def framework_s(self, strategy: str, precision: str, *, blocks: int, elements: float) -> float:
        self.dispatch_s()  # unknown on a CPU profile; on GPUs the host's framework work runs ahead of the device
        return 0.0

    def collective_s(self, collective: str, *, link: str, ranks: int, nbytes: float, dtype: str) -> float:
        if ranks <= 1:
            return 0.0
        fig = self.perf.intra_node if link == "intra" else self.perf.inter_node
        name = "intra_node" if link == "intra" else "inter_node"
        bw = self._need(fig.busbw_gbps, f"{name}.busbw_gbps")
        lat = self._need(fig.latency_us, f"{name}.latency_us")
        return lat * 1e-6 + nbytes * bus_factor(collective, ranks) / (bw * 1e9)


def rates_for(cluster: ClusterProfile, *, force: bool = False) -> Rates:
    """The calibrated rates of `cluster` when it has a calibration file, else its profile figures. Raises
    CalibrationMismatch for another machine's file unless `force`. Cached per file version (its path, modification
    time and size) and per what is read of the profile: a sweep or a plan asks once per cell."""
    stamps: list[tuple[str, int | None, int | None]] = []
    for path in candidate_paths(cluster):
        try:
            st = path.stat()
            stamps.append((str(path), st.st_mtime_ns, st.st_size))
        except OSError:
            stamps.append((str(path), None, None))
    return _rates_of(RatesSource.of(cluster), tuple(stamps), force)


@functools.cache
def _rates_of(source: RatesSource, stamps: tuple[tuple[str, int | None, int | None], ...], force: bool) -> Rates:
    """`rates_for` of one profile and one version of its candidate files (`stamps`: what makes a cached answer
    stale)."""
    found = find_calibration(source, force=force)
    return CalibratedRates(found) if found is not None else ProfileRates(source)


def clear_caches() -> None:
    """Forget the rates read from files and every rate computed from them (tests compare cold and warm)."""
    for f in (_rates_of, _calibrated_gemm_s, _calibrated_collective_s):
        f.cache_clear()


def example_calibration(
    cluster: str, *, device: str = "cpu", fingerprint: dict[str, Any] | None = None, tflops: float = 0.05
) -> dict[str, Any]:
    """A complete calibration with round-number rates (every GEMM at `tflops`, 10 GB/s elementwise, 10 us per op,
    1 GB/s busbw and 100 us latency per collective, 1 ms + 1 ms/block framework overhead) for this host, dated
    now: what tests and benches use where a measured file would make results depend on the machine."""
    import datetime

    dims = (64, 256, 1024, 4096, 32768)
    gemm = [
        {"dtype": dt, "layout": lay, "m": m, "n": n, "k": k, "s": 2.0 * m * n * k / (tflops * 1e12)}
        for dt in ("float32", "bfloat16", "float16")
        for lay in ("nt", "nn", "tn")
        for m in dims
        for n in dims
        for k in dims
    ]

    def att(dt: str, s: int) -> dict[str, Any]:
        fwd = 2.0 * 4 * s * s * 64 / (tflops * 1e12)  # causal half of 4·h·s²·hd, at the matmul rate
        shape = {"batch": 1, "heads": 4, "seq": s, "head_dim": 64}
        return {"dtype": dt, **shape, "forward_s": fwd, "backward_s": 2.5 * fwd}

    attention = [att(dt, s) for dt in ("float32", "bfloat16", "float16") for s in (128, 512, 2048)]
    keys = {e.framework_cost for e in CATALOGUE.values()}
    comm = [
        {"link": link, "collective": c, "dtype": "float32", "ranks": n, "sizes": [1024.0, 2.0**30],
         "times": [1e-4, 1e-4 + 2.0**30 * (bus_factor(c, n) or 1.0) / 1e9], "latency_s": 1e-4, "busbw_gbps": 1.0}
        for link, ranks in (("self", (1,)), ("intra", (2, 4, 8)), ("inter", (2, 4, 8)))
        for n in ranks for c in BUS_FACTORS
    ]  # fmt: skip
    fp = dict(host_fingerprint(), device=device, device_name=None, cpu_allocator="caching")
    fp.update(fingerprint or {})
    return {
        "format": FORMAT,
        "cluster": cluster,
        "created_at": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "fingerprint": fp,
        "compute": {
            "gemm": gemm,
            "attention": attention,
            "elementwise": [
                {"dtype": dt, "op_bytes": b, "gbps": 10.0} for dt in ("float32", "bfloat16") for b in (1e4, 1e8)
            ],  # fmt: skip
            "dispatch": {"forward_s": 1e-5, "backward_s": 1e-5},
            "optimizer": {"per_tensor_s": 1e-5, "per_element_s": 2.8e-9},
            "framework": {
                f"{k}/{p}": {"fixed_s": 1e-3, "per_block_s": 1e-3, "per_element_s": 0.0}
                for k in keys
                for p in ("fp32", "bf16", "fp16")
            },
        },
        "comm": comm,
    }
