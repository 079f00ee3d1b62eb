"""The rates the step-time model prices with (harness.plan.time): a calibration file's, or the profile's
`performance:` figures when the cluster has none.

`Rates` is the interface: each method returns seconds or raises Unknown(reason). `CalibratedRates` interpolates a
calibration (harness.plan.calibration.file: GEMMs on their grid, curves per collective, link and group size, the
host's sharing); `ProfileRates` prices with the profile's few figures. `rates_for(cluster)` picks one, cached per
version of the cluster's file. Pure and torch-free, so `harness plan` prices without importing torch.

Units: seconds, bytes; bandwidths in GB/s (1e9 B/s), matmul rates in TFLOPS (1e12 FLOP/s).
"""

from __future__ import annotations

import bisect
import dataclasses
import functools
import hashlib
import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness.core.catalogue import CATALOGUE
from harness.core.precisions import of_dtype
from harness.plan.calibration import gpu_model
from harness.plan.calibration.bus import bus_factor
from harness.plan.calibration.file import (
    AttentionPoint,
    CommCurve,
    ElementwisePoint,
    FrameworkCost,
    GemmPoint,
    Sharing,
    Storage,
)
from harness.plan.calibration.find import ClusterProfile, Found, candidate_paths, find_calibration
from harness.scenario.performance import Performance


class Unknown(Exception):
    """A rate the model needs is not known: the message is the null reason."""


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
    gpus_per_node: int = 1
    description: str = ""
    """the profile's description, which names its GPU (a log calibration of another GPU is refused: find)"""

    @classmethod
    def of(cls, cluster: ClusterProfile) -> RatesSource:
        return cls(
            name=cluster.name,
            path=cluster.path,
            executor=cluster.executor,
            device=cluster.device,
            cpu_allocator=cluster.cpu_allocator,
            performance=cluster.performance,
            gpus_per_node=getattr(cluster, "gpus_per_node", 1),
            description=getattr(cluster, "description", ""),
        )


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
    """One collective on one link at one group size: measured (bytes, seconds) points, the latency that prices
    messages below the smallest (its time: the latency-bound end of the curve is flat) and the bus bandwidth that
    prices those beyond the largest. A log of large messages only has no latency, one of small messages only no bus
    bandwidth (None): the curve does not price those sizes (`covers`)."""

    ranks: int
    sizes: tuple[float, ...]
    times: tuple[float, ...]
    latency_s: float | None
    busbw_gbps: float | None

    def covers(self, nbytes: float) -> bool:
        """Whether the curve prices a message of `nbytes`: inside its sizes, below them with a latency, above them
        with a bus bandwidth."""
        if nbytes < self.sizes[0]:
            return self.latency_s is not None
        return nbytes <= self.sizes[-1] or self.busbw_gbps is not None

    def seconds(self, collective: str, nbytes: float) -> float:
        if nbytes <= 0:
            return 0.0
        if not self.covers(nbytes):
            raise Unknown(f"{collective} of {nbytes:,.0f} B is outside the measured sizes")
        if nbytes <= self.sizes[-1] or self.busbw_gbps is None:
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

    def in_step(self, dtype: str) -> tuple[float, float, float]:
        """(kernels, elementwise, host) factors by which the isolated rates' prices of a micro-step's matmuls and
        attention, elementwise bytes and per-op host overhead in compute dtype `dtype` stretch inside a step (a CPU
        calibration's `compute.in_step`, harness.calibrate.in_step, times its `in_step_drift`); 1 without a
        measurement."""
        return 1.0, 1.0, 1.0

    def framework_s(self, strategy: str, precision: str, *, blocks: int, elements: float) -> float:
        """The strategy's own host work per micro-step beyond the priced ops: per step, per block, and per element
        of the parameters this rank's optimizer updates."""
        raise NotImplementedError

    def collective_s(self, collective: str, *, link: str, ranks: int, nbytes: float, dtype: str) -> float:
        raise NotImplementedError

    def storage_s(self, nbytes: float, *, op: str) -> float:
        """Writing (`op` write, fsync included) or reading (`op` read) `nbytes` of checkpoint from one node (s)."""
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
        different moments. Measured by the calibration (harness.calibrate.group.measure_sharing); 0 without a
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


SHARE_KINDS: dict[str, tuple[str, ...]] = {
    "compute": ("step", "gemm"),
    "compute_bfloat16": ("step_bfloat16", "gemm_bfloat16"),
    "memory": ("step", "elementwise"),
    "optimizer": ("optimizer",),
}
"""`Rates.share`'s kinds of work → the calibration's sharing probes that measured each, the first one a file has
at every rank count: a micro-step's matmuls, elementwise work and host overhead by the plain-step probe (what they
are, mixed as in a step), else (a file from before that probe) by the GEMM and the elementwise product. NOTE: on the
2-core development host the fp32 GEMM probe measured 0.87x (clamped to 1), 1.02x and 1.16-1.38x at 2 ranks in
different calibrations, while two ranks' cells ran a median 13-15 % over a prediction made with it"""

GemmTable = dict[tuple[str, str], list[tuple[float, float, float, float]]]
"""(dtype, layout) → the measured shapes as (log2 m, log2 n, log2 k, FLOP/s)"""


def gemm_table(points: Sequence[GemmPoint]) -> GemmTable:
    """The GEMM grid as `_grid_rate` reads it: per (dtype, layout), each shape in log2 space with its throughput."""
    table: GemmTable = {}
    for p in points:
        flops = 2.0 * p.m * p.n * p.k
        table.setdefault((p.dtype, p.layout), []).append((math.log2(p.m), math.log2(p.n), math.log2(p.k), flops / p.s))
    return table


def elementwise_curves(points: Sequence[ElementwisePoint]) -> dict[str, tuple[list[float], list[float]]]:
    """dtype → (operand bytes, GB/s), sorted by size."""
    curves = {}
    for dtype in {p.dtype for p in points}:
        pts = sorted((p.op_bytes, p.gbps) for p in points if p.dtype == dtype)
        curves[dtype] = ([x for x, _ in pts], [y for _, y in pts])
    return curves


def sharing_curves(entries: Sequence[Sharing]) -> dict[str, list[tuple[int, float]]]:
    """`Rates.share`'s kind → (ranks, slowdown ≥ 1) at each measured rank count; a kind whose probe some count lacks
    (a file from before that probe) is left out, and `share` falls back to the fp32 figure."""
    shared = {e.ranks: e for e in entries}
    if 1 not in shared:
        return {}
    curves: dict[str, list[tuple[int, float]]] = {}
    for kind, probes in SHARE_KINDS.items():
        for probe in probes:
            times = {r: e.seconds(probe) for r, e in shared.items()}
            base = times[1]
            if base is None or any(t is None for t in times.values()):
                continue
            curves[kind] = sorted((r, max(1.0, slowdown_of(e, probe, base=base))) for r, e in shared.items())
            break
    return curves


def slowdown_of(entry: Sharing, probe: str, *, base: float) -> float:
    """The probe's slowdown at the entry's rank count: the one measured against the rank alone in the same minute;
    a file from before that pairing has only each count's own time, divided by the one-rank time `base` (s)."""
    paired = entry.slowdown(probe)
    if paired is not None:
        return paired
    return (entry.seconds(probe) or 0.0) / base


def sync_wait_points(entries: Sequence[Sharing]) -> list[tuple[int, float]]:
    """(ranks, seconds per collective call) measured on more than one rank, with (1, 0); empty when none was."""
    waits = [(e.ranks, e.sync_wait_s) for e in entries if e.ranks > 1 and e.sync_wait_s is not None]
    return sorted([(1, 0.0), *waits]) if waits else []


def comm_curves(curves: Sequence[CommCurve]) -> dict[tuple[str, str, str], list[CollectiveCurve]]:
    """(link, collective, dtype) → its measured curves, one per group size."""
    out: dict[tuple[str, str, str], list[CollectiveCurve]] = {}
    for e in curves:
        pts = sorted(zip(e.sizes, e.times))
        curve = CollectiveCurve(
            ranks=e.ranks,
            sizes=tuple(s for s, _ in pts),
            times=tuple(t for _, t in pts),
            latency_s=e.latency_s,
            busbw_gbps=e.busbw_gbps,
        )
        out.setdefault((e.link, e.collective, e.dtype), []).append(curve)
    return out


class CalibratedRates(Rates):
    """Rates from a calibration file (harness.calibrate says how each part is measured)."""

    def __init__(self, found: Found) -> None:
        cal = found.calibration
        self.path = found.path
        created = cal.created_at if cal.created_at is not None else "?"
        self.source = f"calibrated {found.path} {created[:10]}" + (f" (forced: {found.forced})" if found.forced else "")
        self.device = cal.fingerprint.device
        self.device_name = cal.fingerprint.device_name
        self.host_cores = cal.fingerprint.cpu_count if self.device == "cpu" else None
        c = cal.compute
        self.gemm_grid = gemm_table(c.gemm)
        self._attention: list[AttentionPoint] = c.attention
        self._elementwise = elementwise_curves(c.elementwise)
        self._dispatch = c.dispatch
        self._optimizer = c.optimizer
        self._framework: dict[str, FrameworkCost] = c.framework
        self._in_step: dict[str, tuple[float, float, float]] = {}
        for k, v in c.in_step.items():
            d = cal.in_step_drift(k)
            self._in_step[k] = (float(v.kernels) * d, float(v.elementwise) * d, float(v.host) * d)
        self._sharing = sharing_curves(cal.sharing)
        self._sync_wait = sync_wait_points(cal.sharing)
        self._comm = comm_curves(cal.comm)
        self._storage: Storage | None = cal.storage
        # NOTE: the figures' digest from pydantic's JSON of the model (in Rust: a third of the time of hashing the
        # dict, which was most of reading a file); equal files give equal JSON, with their defaults filled in
        figures = hashlib.sha256(cal.model_dump_json().encode()).hexdigest()
        self._seal([self.source, str(found.path), figures])

    def sync_wait_s(self, *, ranks_on_host: int) -> float:
        """The measured wait per collective call at `ranks_on_host` ranks, 0 at one rank, interpolated as `share`."""
        if not self._sync_wait or self.device != "cpu":
            return 0.0
        return _per_ranks(self._sync_wait, ranks_on_host)

    def share(self, kind: str, *, ranks: int) -> float:
        """The measured slowdown at `ranks` ranks on the host (harness.calibrate.group.measure_sharing): linear
        between measured counts, and beyond the largest proportional to the ranks (each rank's share of the host
        shrinks as 1/ranks)."""
        pts = self._sharing.get(kind) or self._sharing.get(kind.split("_", 1)[0])
        if not pts or self.device != "cpu":
            return super().share(kind, ranks=ranks)
        return _per_ranks(pts, ranks)

    def storage_s(self, nbytes: float, *, op: str) -> float:
        if self._storage is None:
            raise Unknown(f"no storage bandwidth measured in {self.path.name}; run `harness calibrate` again")
        gbps = self._storage.write_gbps if op == "write" else self._storage.read_gbps
        return nbytes / (gbps * 1e9)

    def gemm_s(self, dtype: str, m: int, n: int, k: int, layout: str) -> float:
        return _calibrated_gemm_s(self, dtype, m, n, k, layout)

    def attention_s(self, dtype: str, *, batch: int, heads: int, seq: int, head_dim: int, phase: str) -> float:
        def per_unit(p: AttentionPoint) -> float:
            """seconds per unit of batch · heads · head_dim · seq² at the measured shape"""
            return (p.forward_s if phase == "forward" else p.backward_s) / (p.batch * p.heads * p.head_dim * p.seq**2)

        pts = sorted((p.seq, per_unit(p)) for p in self._attention if p.dtype == dtype)
        if not pts:
            raise Unknown(f"no {dtype} attention measured in {self.path.name}")
        at_seq = _interp_loglog([s for s, _ in pts], [u for _, u in pts], seq)
        return at_seq * batch * heads * head_dim * seq**2

    def elementwise_s(self, dtype: str, nbytes: float, *, op_bytes: float) -> float:
        curve = self._elementwise.get(dtype) or self._elementwise.get("float32")
        if curve is None:
            raise Unknown(f"no elementwise bandwidth measured in {self.path.name}")
        return nbytes / (_interp_loglog(curve[0], curve[1], max(op_bytes, 1.0)) * 1e9)

    def dispatch_s(self) -> tuple[float, float]:
        if self._dispatch is None:
            raise Unknown(f"no per-op overhead measured in {self.path.name}")
        return self._dispatch.forward_s, self._dispatch.backward_s

    def optimizer_s(self, *, elements: float, tensors: int) -> float:
        o = self._optimizer
        if o is None:
            raise Unknown(f"no optimizer cost measured in {self.path.name}")
        return o.per_tensor_s * tensors + o.per_element_s * elements

    def in_step(self, dtype: str) -> tuple[float, float, float]:
        return self._in_step.get(dtype) or self._in_step.get("float32") or (1.0, 1.0, 1.0)

    def framework_s(self, strategy: str, precision: str, *, blocks: int, elements: float) -> float:
        key = f"{CATALOGUE[strategy].framework_cost}/{precision}"
        f = self._framework.get(key)
        if f is None:
            raise Unknown(f"no framework overhead measured for {key} in {self.path.name}")
        return f.fixed_s + f.per_block_s * blocks + f.per_element_s * elements

    def collective_s(self, collective: str, *, link: str, ranks: int, nbytes: float, dtype: str) -> float:
        # NOTE: a calibration measures groups across nodes one rank per node; a group of several ranks per node
        # ("mixed") is priced on those curves
        link = "inter" if link == "mixed" else link
        return _calibrated_collective_s(self, collective, link, ranks, nbytes, dtype)

    def interpolated_collective_s(self, collective: str, link: str, ranks: int, nbytes: float, dtype: str) -> float:
        """`collective_s` computed (not cached): the curve of `ranks` ranks, or the nearest group size's."""
        curves = self._comm.get((link, collective, dtype)) or self._comm.get((link, collective, "float32"))
        if not curves:
            raise Unknown(f"no {collective} measured on the {link} link in {self.path.name}")
        return curves_s(curves, collective, ranks=ranks, nbytes=nbytes, where=f"the {link} link in {self.path.name}")


def nearest_curve(curves: list[CollectiveCurve], ranks: int) -> CollectiveCurve:
    """The curve that prices a group of `ranks`: its own, else the nearest measured group size below (else
    above)."""
    exact = [c for c in curves if c.ranks == ranks]
    if exact:
        return exact[0]
    below = [c for c in curves if c.ranks <= ranks]
    return max(below, key=lambda c: c.ranks) if below else min(curves, key=lambda c: c.ranks)


def curves_s(curves: list[CollectiveCurve], collective: str, *, ranks: int, nbytes: float, where: str) -> float:
    """One call's seconds from a collective's measured curves: the curve of `ranks` ranks, or the nearest group
    size's; Unknown (naming `where`) when only one-rank curves exist, or another group size's curve has no
    latency."""
    c = nearest_curve(curves, ranks)
    if c.ranks == ranks:
        return c.seconds(collective, nbytes)
    # another group size: busbw carries over (nccl-tests' point of busbw), the latency part scales with the ring's
    # n - 1 steps
    if c.ranks <= 1 or ranks <= 1 or c.latency_s is None:
        raise Unknown(f"no {collective} measured on {where} for {ranks} ranks")
    steps = (ranks - 1) / (c.ranks - 1)
    factor_ratio = (bus_factor(collective, ranks) or 1.0) / (bus_factor(collective, c.ranks) or 1.0)
    return c.latency_s * steps + (c.seconds(collective, nbytes) - c.latency_s) * factor_ratio


@functools.cache
def _calibrated_gemm_s(rates: CalibratedRates, dtype: str, m: int, n: int, k: int, layout: str) -> float:
    """One GEMM's seconds at the calibrated grid's interpolated throughput (cached: planning prices each shape of a
    model once per rates)."""
    pts = rates.gemm_grid.get((dtype, layout)) or rates.gemm_grid.get((dtype, "nt"))
    if not pts:
        raise Unknown(f"no {dtype} matmul measured in {rates.path.name}")
    return 2.0 * m * n * k / _grid_rate(pts, math.log2(max(m, 1)), math.log2(max(n, 1)), math.log2(max(k, 1)))


@functools.cache
def _calibrated_collective_s(
    rates: CalibratedRates, collective: str, link: str, ranks: int, nbytes: float, dtype: str
) -> float:
    """One collective call's seconds (cached: ledgers repeat their sizes)."""
    return rates.interpolated_collective_s(collective, link, ranks, nbytes, dtype)


class ProfileRates(Rates):
    """Rates from the profile's `performance:` block: one matmul rate per precision, one memory bandwidth, the
    links' NCCL figures, and (with `efficiency:`) the kernel-efficiency curves of harness.plan.calibration.gpu_model.
    No per-op overhead or framework figure exists for a profile; on a GPU the host runs ahead of the device, so those
    are taken as hidden (zero) — stated in docs/time-model.md."""

    def __init__(self, cluster: ClusterProfile) -> None:
        self._profile(cluster)
        self._seal([self.source, self.name, self.device, self.gpus_per_node, dataclasses.asdict(self.perf)])

    def _profile(self, cluster: ClusterProfile) -> None:
        """The profile's figures and their sources (before sealing)."""
        perf = cluster.performance
        self.name = cluster.name  # the profile's, in a null reason's advice
        self.perf = perf
        self.device = cluster.device
        self.host_cores = None
        self.gpus_per_node = int(getattr(cluster, "gpus_per_node", 1) or 1)
        self.efficiency = dict(perf.efficiency)
        self._collectives: dict[tuple[str, str, int, float], float] = {}
        """collective_s's answers (a plan asks ~10^5 times, mostly the same calls)"""
        self._links: dict[str, tuple[float, float, float] | str] = {}
        for link in ("intra", "inter"):
            try:
                self._links[link] = self._link_figures(link)
            except Unknown as e:
                self._links[link] = str(e)
        srcs = "; ".join(f"{k}: {v}" for k, v in perf.sources.items()) or "none given"
        self.source = f"uncalibrated: profile figures ({srcs})"

    def _need(self, value: float | None, what: str) -> float:
        if value is None:
            raise Unknown(
                f"uncalibrated: the {self.name} profile has no {what}; run `harness calibrate --cluster {self.name}`"
            )
        return value

    def _tflops(self, dtype: str) -> float:
        key = of_dtype(dtype)
        return self._need(self.perf.matmul_tflops.get(key), f"achievable {key} matmul rate")

    def gemm_s(self, dtype: str, m: int, n: int, k: int, layout: str) -> float:
        tflops = self._tflops(dtype)
        if not self.efficiency:
            return 2.0 * m * n * k / (tflops * 1e12)
        bw = self._need(self.perf.memory_gbps, "achievable memory bandwidth (memory_gbps)")
        size = 4 if dtype == "float32" else 2
        return gpu_model.gemm_seconds(m, n, k, tflops=tflops, memory_gbps=bw, element_bytes=size)

    def attention_s(self, dtype: str, *, batch: int, heads: int, seq: int, head_dim: int, phase: str) -> float:
        if self.efficiency:
            return gpu_model.attention_seconds(
                batch=batch,
                heads=heads,
                seq=seq,
                head_dim=head_dim,
                phase=phase,
                tflops=self._tflops(dtype),
                efficiency=self.efficiency,
            )
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

    def _link(self, link: str) -> tuple[float, float, float]:
        """`_link_figures`, read once (planning prices ~10^5 collectives)."""
        fig = self._links[link]
        if isinstance(fig, str):
            raise Unknown(fig)
        return fig

    def _link_figures(self, link: str) -> tuple[float, float, float]:
        """(base latency us, hop latency us, bus bandwidth GB/s) of the intra- or inter-node figures."""
        fig = self.perf.intra_node if link == "intra" else self.perf.inter_node
        name = "intra_node" if link == "intra" else "inter_node"
        bw = self._need(fig.busbw_gbps, f"{name}.busbw_gbps")
        lat = self._need(fig.latency_us, f"{name}.latency_us")
        hop = self._need(fig.hop_latency_us, f"{name}.hop_latency_us")
        return lat, hop, bw

    def storage_s(self, nbytes: float, *, op: str) -> float:
        gbps = self.perf.storage.write_gbps if op == "write" else self.perf.storage.read_gbps
        return nbytes / (self._need(gbps, f"storage.{op}_gbps (the checkpoint folder's bandwidth)") * 1e9)

    def collective_s(self, collective: str, *, link: str, ranks: int, nbytes: float, dtype: str) -> float:
        if ranks <= 1:
            return 0.0
        if self.perf.collectives == "nccl-ring":
            key = (collective, link, ranks, nbytes)
            t = self._collectives.get(key)
            if t is None:
                intra = self._link("intra")
                if link == "intra":
                    t = _ring_s(collective, ranks, nbytes, ranks, intra, None)
                else:
                    per_node = min(self.gpus_per_node, ranks) if link == "mixed" else 1
                    t = _ring_s(collective, ranks, nbytes, per_node, intra, self._link("inter"))
                self._collectives[key] = t
            return t
        fig = self.perf.intra_node if link == "intra" else self.perf.inter_node
        name = "intra_node" if link == "intra" else "inter_node"
        bw = self._need(fig.busbw_gbps, f"{name}.busbw_gbps")
        lat = self._need(fig.latency_us, f"{name}.latency_us")
        return lat * 1e-6 + nbytes * bus_factor(collective, ranks) / (bw * 1e9)


class LoggedRates(ProfileRates):
    """The profile's figures, with those the user's logs measured in their place (a calibration built by
    `harness calibrate --from`: nccl-tests curves per collective, link and group size; matmul rates per dtype).
    What no log measured is the profile's, as in ProfileRates.

    An inter-node log measured whole nodes (e.g. 2 × 8 ranks, which NCCL runs hierarchically over NVLink and every
    NIC): it prices only groups of whole nodes like it (a multiple of its ranks per host, at least its rank count),
    never a group of one rank per node (a hybrid's replicate group), whose per-GPU figure is another one
    (docs/time-model.md: profile figures).

    A log prices only the message sizes it measured (CollectiveCurve.covers): below its smallest size only with a
    latency, above its largest only with a bus bandwidth, and another group size only with a latency to scale;
    the rest is the profile's."""

    def __init__(self, cluster: ClusterProfile, found: Found) -> None:
        self._profile(cluster)
        cal = found.calibration
        self.path = found.path
        self.device_name = cal.fingerprint.device_name
        self._matmul_tflops = {r.dtype: float(r.tflops) for r in cal.compute.matmul}
        self._logged = comm_curves(cal.comm)
        self._per_host = {(e.link, e.ranks): e.ranks // (e.hosts or 1) for e in cal.comm}
        logs = ", ".join(Path(p).name for p in cal.from_logs or [])
        self.source = f"logs {found.path} ({logs}); the rest: {self.source}"
        figures = hashlib.sha256(cal.model_dump_json().encode()).hexdigest()
        self._seal(
            [
                self.source,
                self.name,
                self.device,
                self.gpus_per_node,
                dataclasses.asdict(self.perf),
                str(found.path),
                figures,
            ]
        )

    def gemm_s(self, dtype: str, m: int, n: int, k: int, layout: str) -> float:
        tflops = self._matmul_tflops.get(dtype)
        if tflops is None:
            return super().gemm_s(dtype, m, n, k, layout)
        return 2.0 * m * n * k / (tflops * 1e12)

    def collective_s(self, collective: str, *, link: str, ranks: int, nbytes: float, dtype: str) -> float:
        if ranks <= 1:
            return 0.0
        # NOTE: a group of several ranks on each of several nodes ("mixed", harness.plan.links) is what an inter-node
        # log measured; a group of one rank per node ("inter") it never prices (_prices)
        logged = "inter" if link == "mixed" else link
        curves = [
            c for c in self._logged_curves(collective, link=logged, dtype=dtype) if self._prices(c, logged, ranks)
        ]
        # NOTE: sizes the log did not measure are the profile's: below its smallest size without a latency (a log
        # of large messages: `-b 512M`), above its largest without a bus bandwidth (one of small messages), and other
        # group sizes without a latency to scale (harness.calibrate.logs says which, in the file's null_reasons)
        chosen = nearest_curve(curves, ranks) if curves else None
        if chosen is None or not chosen.covers(nbytes) or (chosen.ranks != ranks and chosen.latency_s is None):
            return super().collective_s(collective, link=link, ranks=ranks, nbytes=nbytes, dtype=dtype)
        return curves_s([chosen], collective, ranks=ranks, nbytes=nbytes, where=f"the {link} link in {self.path.name}")

    def _prices(self, curve: CollectiveCurve, link: str, ranks: int) -> bool:
        """Whether a logged curve may price a group of `ranks` on `link`: any size inside a node; across nodes,
        whole nodes like the log's (see the class)."""
        if link != "inter":
            return True
        per_host = self._per_host.get((link, curve.ranks), 1)
        return ranks % per_host == 0 and ranks >= curve.ranks

    def _logged_curves(self, collective: str, *, link: str, dtype: str) -> list[CollectiveCurve]:
        """The logs' curves of `collective` on `link`: in `dtype`, else float32's, else any dtype's (bus bandwidth
        is bytes per second whatever the elements)."""
        for key in ((link, collective, dtype), (link, collective, "float32")):
            if key in self._logged:
                return self._logged[key]
        return next((v for (lk, c, _), v in self._logged.items() if lk == link and c == collective), [])


@functools.cache
def _ring_s(
    collective: str,
    ranks: int,
    nbytes: float,
    per_node: int,
    intra: tuple[float, float, float],
    inter: tuple[float, float, float] | None,
) -> float:
    """`gpu_model.nccl_ring_seconds`, cached (ledgers of many cells repeat their calls)."""
    return gpu_model.nccl_ring_seconds(
        collective, ranks=ranks, nbytes=nbytes, ranks_per_node=per_node, intra=intra, inter=inter
    )


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
    if found is not None and found.calibration.from_logs:
        return LoggedRates(source, found)
    return CalibratedRates(found) if found is not None else ProfileRates(source)


def clear_caches() -> None:
    """Forget the rates read from files and every rate computed from them (tests compare cold and warm)."""
    for f in (_rates_of, _calibrated_gemm_s, _calibrated_collective_s, _ring_s):
        f.cache_clear()
