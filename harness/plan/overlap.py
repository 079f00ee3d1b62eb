"""Collectives in time: every collective of harness.plan.comm's exact ledger priced on the link its group runs on
(`timed_calls`), and how much of it is exposed beside the compute, by the overlap rule its catalogue entry names
(`OVERLAP_RULES`, docs/time-model.md: overlap): DDP buckets under the remaining backward; FSDP/FSDP2 gathers one unit
ahead and reduce-scatters under the next unit's backward (the first gather and the last reduction are exposed);
ZeRO-1/2 nothing (DeepSpeed's overlap_comm is off below stage 3); ZeRO-3 prefetched gathers and asynchronous reduce
buckets, the first gather of each pass, the last bucket and the after-step gathers exposed. The compute is the
compute model's (harness.plan.compute), run back to back on one stream, the collectives on another (`simulate`).

Pure arithmetic, no torch; every result a function of frozen inputs (the cell's `CommCell`, the executor, the
rates), cached with functools.cache.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import NamedTuple

from harness.core.catalogue import CATALOGUE
from harness.core.zoo import ModelConfig, Param, parameters
from harness.plan import comm as cm
from harness.plan.calibration import Rates
from harness.plan.comm import CommCell
from harness.plan.compute import Compute
from harness.plan.links import POINT_TO_POINT, ClusterView, host_ranks, link_on
from harness.scenario.cluster import Cluster
from harness.scenario.spec import RunSpec


class Coll(NamedTuple):
    """One collective call: its kind, size, group and seconds (a NamedTuple: planning builds ~10^5 of them)."""

    what: str
    collective: str
    nbytes: int
    ranks: int
    seconds: float
    unit: str | None
    """the FSDP unit it concerns ("root", "blocks.<i>"), when it concerns one"""
    phase: str
    """forward | backward | step"""


UNIT_RE = re.compile(r"(?:unit|group) (root|blocks\.\d+) \(")
"""the FSDP unit a ledger item's description names (harness.plan.comm's and harness.plan.layouts' wording)"""


def unit_of(what: str) -> str | None:
    """The FSDP unit ("root", "blocks.<i>") a ledger item's description names, or None."""
    m = UNIT_RE.search(what)
    return m.group(1) if m else None


@dataclass(frozen=True)
class TimedCalls:
    """Every collective kind of a ledger as (one call, calls per step), timed on its link, and their total."""

    calls: tuple[tuple[Coll, float], ...]
    total: float
    """seconds of collectives per step"""

    def __hash__(self) -> int:
        return self._content_hash

    @functools.cached_property
    def _content_hash(self) -> int:
        # NOTE: computed once: the overlap schedules are cached on the timed calls
        return hash((self.calls, self.total))


def timed_calls(cell: CommCell, *, executor: str, rates: Rates) -> TimedCalls:
    """The collectives of a cell without tensor or pipeline parallelism (its `CommCell`'s ledger), each call priced
    on its group's link with `rates`."""
    on_host = host_ranks(cell.gpus, cell.gpus_per_node, executor=executor)
    return price_ledger(
        cm.plain_ledger(cell), cm.groups_for(cell), gpus=cell.gpus, on_host=on_host, executor=executor, rates=rates
    )


@functools.cache
def price_ledger(
    ledger: cm.Ledger, g: cm.Groups, *, gpus: int, on_host: int, executor: str, rates: Rates
) -> TimedCalls:
    """Each call of `ledger` priced on its group's link: `g` the cell's groups (their sizes), `gpus` its ranks,
    `on_host` those of them on one host (a CPU host's sharing), `executor` the links' (harness.plan.links)."""
    sizes = {g.world: gpus, g.shard: g.shard_size}
    if g.replicate is not None:
        sizes[g.replicate] = g.replicate_size
    groups: dict[tuple[str, int], tuple[int, str, float]] = {}
    # each collective call also waits for the ranks the host's scheduler has not run yet (a CPU host with more
    # ranks than cores; 0 elsewhere)
    wait = rates.sync_wait_s(ranks_on_host=on_host)
    calls = []
    collective_s, new = rates.collective_s, tuple.__new__  # NOTE: bound once: ~10^5 items per plan
    for it in ledger.items:
        unit, phase = item_meta(it.what, it.collective)
        gr = groups.get((it.group, it.ranks))
        if gr is None:
            # a layout cell's items name their group's size (tp, pp and dp groups can be of one kind)
            ranks = it.ranks or sizes.get(it.group, gpus)
            # a sub-group's curve was measured with only its own ranks on the host; in the cell, the other
            # sub-groups (a hybrid's) run theirs at the same time on the same cores and memory
            stretch = 1.0
            if rates.device == "cpu" and ranks < on_host:
                stretch = rates.share("memory", ranks=on_host) / rates.share("memory", ranks=ranks)
            gr = groups[(it.group, it.ranks)] = (ranks, link_on(it.group, executor=executor), stretch)
        ranks, link, stretch = gr
        if it.collective in POINT_TO_POINT:
            sec = stretch * rates.p2p_s(link=link, nbytes=it.bytes_per_call, dtype=it.dtype)
        else:
            sec = stretch * collective_s(
                it.collective, link=link, ranks=ranks, nbytes=it.bytes_per_call, dtype=it.dtype
            ) + (wait if ranks > 1 else 0.0)
        calls.append((new(Coll, (it.what, it.collective, it.bytes_per_call, ranks, sec, unit, phase)), it.calls))
    return TimedCalls(calls=tuple(calls), total=float(sum(c.seconds * n for c, n in calls)))


def collective_calls(spec: RunSpec, cluster: Cluster | ClusterView, rates: Rates) -> list[tuple[Coll, float]]:
    """Every collective kind of the ledger of a cell without tensor or pipeline parallelism as (one call, calls per
    step), timed on its link."""
    return list(timed_calls(CommCell.of(spec), executor=cluster.executor, rates=rates).calls)


@functools.cache
def item_meta(what: str, collective: str) -> tuple[str | None, str]:
    """(the FSDP unit it concerns or None, its phase: forward | backward | step) of a ledger item, from its
    description (harness.plan.comm's wording; ledgers of one model at other accumulations and strategies repeat
    them)."""
    m = UNIT_RE.search(what)
    if "issued in forward" in what or what.endswith("forward") or "first forward" in what:
        phase = "forward"
    elif "after the step" in what or collective == "all_gather" and "updated flat" in what:
        phase = "step"
    elif "norm" in what or "overflow" in what or "found_inf" in what:
        phase = "step"
    else:
        phase = "backward"
    return (m.group(1) if m else None), phase


def simulate(segments: list[float], colls: list[tuple[float, int, int]]) -> float:
    """End time of compute `segments` (run back to back) with collectives on one serial stream beside them.

    A collective (seconds, issue, need) is issued when segment `issue` is about to start (len(segments): after the
    last) and must be done before segment `need` starts (len(segments): before the step ends); collectives issued at
    the same point run in the order given. Returns the step's end; minus sum(segments), the exposed communication."""
    return run_schedule(segments, Schedule.of(colls, len(segments)))


@dataclass(frozen=True)
class Schedule:
    """Collectives arranged against `segments` compute segments: each one's seconds, and per point (before each
    segment, and after the last) the collectives issued and the ones needed there."""

    seconds: tuple[float, ...]
    issued: tuple[tuple[int, ...], ...]
    needed: tuple[tuple[int, ...], ...]

    @classmethod
    def of(cls, colls: list[tuple[float, int, int]], segments: int) -> Schedule:
        n = segments
        issued: list[list[int]] = [[] for _ in range(n + 1)]
        needed: list[list[int]] = [[] for _ in range(n + 1)]
        for i, (_, issue, need) in enumerate(colls):
            issued[min(issue, n)].append(i)
            needed[min(need, n)].append(i)
        return cls(tuple(c[0] for c in colls), tuple(map(tuple, issued)), tuple(map(tuple, needed)))


def run_schedule(segments: list[float], schedule: Schedule) -> float:
    """`simulate` with the collectives already arranged (`Schedule.of`): the step's end."""
    seconds, issued, needed = schedule.seconds, schedule.issued, schedule.needed
    n = len(segments)
    ends = [0.0] * len(seconds)
    t = comm_free = 0.0
    for s in range(n + 1):
        for i in issued[s]:
            comm_free = ends[i] = (t if t > comm_free else comm_free) + seconds[i]
        for i in needed[s]:
            if ends[i] > t:
                t = ends[i]
        if s < n:
            t += segments[s]
    return max(t, comm_free)


def fsdp_segments(comp: Compute, L: int, A: int) -> list[float]:
    """Per micro-step: embedding forward (0), blocks 0..L-1, head+loss; head backward, blocks L-1..0, embedding."""
    one = [0.0] + [comp.block_fwd] * L + [comp.root_fwd, comp.root_bwd_head]
    one += [comp.block_bwd + comp.block_recompute] * L + [comp.root_bwd_embedding]
    return one * A


def fsdp_segment_count(L: int, A: int) -> int:
    """len(fsdp_segments(…, L, A))."""
    return (2 * L + 4) * A


def fsdp_colls(calls: Sequence[tuple[Coll, float]], *, n_layers: int, grad_accum: int) -> list[tuple[float, int, int]]:
    """When each FSDP collective is issued and needed, against `fsdp_segments` (of `n_layers` blocks and `grad_accum`
    micro-steps).

    A unit holds the blocks from the one it is named after to the next unit's (`wrap_blocks`, harness.plan.wrap):
    its all-gather is needed when its first block's forward starts, and in backward when its last block's backward
    starts; it is issued when the unit before it (in that pass's order) starts, so it hides behind that unit's
    blocks (`ahead` units before: prefetch_units; in backward, when the unit is needed where the ledger says its
    backward all-gather is not prefetched). A unit's reduction follows its first block's backward."""
    L, A = n_layers, grad_accum
    per = 2 * L + 3
    starts = sorted({int(c.unit.split(".")[1]) for c, _ in calls if c.unit is not None and c.unit != "root"})
    last_of = {b: (starts[i + 1] - 1 if i + 1 < len(starts) else L - 1) for i, b in enumerate(starts)}

    def fwd_seg(a: int, first: int) -> int:
        return a * per + 1 + first

    def bwd_seg(a: int, block: int) -> int:
        return a * per + L + 2 + L - block

    def fwd_issue(a: int, k: int, ahead: int) -> int:
        # the unit `ahead` units before it starts its forward (the root, first of all: exposed)
        return fwd_seg(a, starts[k - ahead]) if k - ahead >= 0 else a * per

    def bwd_issue(a: int, k: int, ahead: int) -> int:
        # backward runs the units in reverse: the one `ahead` after it starts its backward (the root's head backward
        # first)
        j = k + ahead
        return bwd_seg(a, last_of[starts[j]]) if j < len(starts) else a * per + L + 2

    out: list[tuple[float, int, int]] = []
    end = per * A
    for c, n_calls in calls:
        unit = c.unit
        if unit is None:  # a step-level flag (fp16 found_inf): after the backward
            out.extend((c.seconds, end, end) for _ in range(int(round(n_calls))))
            continue
        ahead = _units_ahead(c.what)
        k = starts.index(int(unit.split(".")[1])) if unit != "root" else -1
        if c.collective == "all_gather":
            per_micro = n_calls / A
            micros = range(A) if per_micro >= 1 else range(1)  # SHARD_GRAD_OP: the first forward only
            for a in micros:
                if unit == "root":
                    out.append((c.seconds, a * per, a * per))  # the first of the forward: exposed
                else:
                    out.append((c.seconds, fwd_issue(a, k, ahead), fwd_seg(a, starts[k])))
                if per_micro >= 2:  # gathered again for its backward, prefetched ahead
                    if unit == "root":
                        need_b = a * per + L + 2
                        out.append((c.seconds, need_b, need_b))
                        continue
                    need_b = bwd_seg(a, last_of[starts[k]])
                    issue = need_b if cm.BACKWARD_NOT_PREFETCHED in c.what else bwd_issue(a, k, ahead)
                    out.append((c.seconds, min(issue, need_b), need_b))
        else:  # gradient reductions: after the unit's backward in the last micro-step, done before the step
            after = bwd_seg(A - 1, starts[k]) + 1 if unit != "root" else A * per
            out.extend((c.seconds, after, end) for _ in range(int(round(n_calls))))
    return out


AHEAD_RE = re.compile(r"prefetched (\d+) units ahead")


def _units_ahead(what: str) -> int:
    """Units an all-gather is issued ahead of its own (harness.plan.comm.fsdp_prefetch's words; 1 by default)."""
    m = AHEAD_RE.search(what)
    return int(m.group(1)) if m else 1


def ddp_segments(comp: Compute, L: int, A: int) -> list[float]:
    """Earlier micro-steps whole (no_sync), then the last one's forward and its backward segment by segment."""
    segs: list[float] = []
    for _ in range(A - 1):
        segs += [comp.forward, comp.backward]
    segs += [comp.forward, comp.root_bwd_head] + [comp.block_bwd + comp.block_recompute] * L
    return segs + [comp.root_bwd_embedding]


def ddp_segment_count(L: int, A: int) -> int:
    """len(ddp_segments(…, L, A))."""
    return 2 * (A - 1) + L + 3


def ddp_colls(
    calls: Sequence[tuple[Coll, float]], *, cfg: ModelConfig, grad_accum: int
) -> list[tuple[float, int, int]]:
    """DDP: buckets of gradients in ready order (head first, embedding last); a bucket's all_reduce is issued when
    the backward segment that completes it ends, in the last micro-step; all done before the optimizer step."""
    points = ddp_points(cfg, grad_accum, tuple(c.nbytes for c, _ in calls))
    return [(c.seconds, issue, need) for (c, _), (issue, need) in zip(calls, points)]


@functools.cache
def ddp_points(cfg: ModelConfig, A: int, buckets: tuple[int, ...]) -> tuple[tuple[int, ...], ...]:
    """(issue, need) of each of DDP's bucket all_reduces (`buckets`: their bytes, in ready order: the ledger's,
    whatever the bucket cap) against `ddp_segments`."""
    L = cfg.n_layers
    first_bwd = 2 * (A - 1) + 1
    end = first_bwd + L + 2
    params = list(reversed(parameters(cfg)))

    def segment_of(p: Param) -> int:
        if p.unit == "root":
            return first_bwd + (L + 1 if p.name.startswith("tok_emb") else 0)
        return first_bwd + 1 + (L - 1 - int(p.unit.split(".")[1]))

    closes = _ddp_bucket_closers([p.numel * 4 for p in params], buckets)
    out = []
    for i in range(len(buckets)):
        last = params[closes[i]] if i < len(closes) else params[-1]
        out.append((segment_of(last) + 1, end))
    return tuple(out)


def _ddp_bucket_closers(sizes_bytes: list[int], buckets: Sequence[int]) -> list[int]:
    """Index of the gradient that closes each DDP bucket: the buckets (bytes, harness.plan.comm.ddp_buckets') fill
    with the gradients in ready order."""
    closes, cur, k = [], 0, 0
    for i, b in enumerate(sizes_bytes):
        cur += b
        if k < len(buckets) and cur >= buckets[k]:
            closes.append(i)
            cur, k = 0, k + 1
    return closes


@functools.cache
def zero3_sums(
    timed: TimedCalls, *, grad_accum: int
) -> tuple[tuple[float, float] | None, tuple[float, float] | None, float]:
    """Per pass (forward; backward with its reduce buckets): (seconds of its collectives per micro-step, the part
    that cannot hide), or None without any; and the step's own (only compute differs between the cells that share
    these calls)."""
    calls, A = timed.calls, grad_accum
    fwd = [(c.seconds, n / A) for c, n in calls if c.collective == "all_gather" and c.phase == "forward"]
    bwd = [(c.seconds, n / A) for c, n in calls if c.collective == "all_gather" and c.phase == "backward"]
    red = [(c.seconds, n / A) for c, n in calls if c.collective == "reduce_scatter"]
    step = sum(c.seconds * n for c, n in calls if c.phase == "step" or c.collective == "all_reduce")
    f = (sum(s * n for s, n in fwd), fwd[0][0]) if fwd else None
    b = None
    if bwd or red:
        last = red[-1][0] if red else 0.0
        b = (sum(s * n for s, n in bwd + red), last + (bwd[0][0] if bwd else 0.0))
    return f, b, step


# --------------------------------------------------------------------------------------------------
# the overlap rules: a catalogue entry's `overlap` → the exposed seconds of its collectives beside the compute


@functools.cache
def ddp_schedule(timed: TimedCalls, *, cfg: ModelConfig, grad_accum: int) -> Schedule:
    """DDP's bucket all_reduces arranged against `ddp_segments`."""
    colls = ddp_colls(timed.calls, cfg=cfg, grad_accum=grad_accum)
    return Schedule.of(colls, ddp_segment_count(cfg.n_layers, grad_accum))


@functools.cache
def fsdp_schedule(timed: TimedCalls, *, n_layers: int, grad_accum: int) -> Schedule:
    """FSDP's gathers and reductions arranged against `fsdp_segments`."""
    colls = fsdp_colls(timed.calls, n_layers=n_layers, grad_accum=grad_accum)
    return Schedule.of(colls, fsdp_segment_count(n_layers, grad_accum))


def exposed_ddp_buckets(comp: Compute, *, timed: TimedCalls, cfg: ModelConfig, grad_accum: int) -> float:
    """DDP: each bucket's all_reduce under the rest of the last micro-step's backward."""
    segs = ddp_segments(comp, cfg.n_layers, grad_accum)
    return run_schedule(segs, ddp_schedule(timed, cfg=cfg, grad_accum=grad_accum)) - sum(segs)


def exposed_fsdp_prefetch(comp: Compute, *, timed: TimedCalls, cfg: ModelConfig, grad_accum: int) -> float:
    """FSDP/FSDP2: gathers one unit ahead, reduce-scatters under the next unit's backward."""
    segs = fsdp_segments(comp, cfg.n_layers, grad_accum)
    return run_schedule(segs, fsdp_schedule(timed, n_layers=cfg.n_layers, grad_accum=grad_accum)) - sum(segs)


def exposed_zero3_prefetch(comp: Compute, *, timed: TimedCalls, cfg: ModelConfig, grad_accum: int) -> float:
    """ZeRO-3 (overlap_comm on): per micro-step, the gathers of each pass hide behind that pass's compute except the
    first call, reduce buckets behind the backward except the last; after-step gathers and norms are exposed."""
    fwd, bwd, step = zero3_sums(timed, grad_accum=grad_accum)

    def hidden(pass_: tuple[float, float] | None, window: float) -> float:
        if pass_ is None:
            return 0.0
        total, exposed_one = pass_
        return exposed_one + max(0.0, total - exposed_one - window)

    exposed = hidden(fwd, comp.forward) + hidden(bwd, comp.backward)
    return grad_accum * exposed + step


def exposed_all(comp: Compute, *, timed: TimedCalls, cfg: ModelConfig, grad_accum: int) -> float:
    """Nothing hides: ZeRO-1/2 (DeepSpeed's overlap_comm defaults to off below stage 3)."""
    return timed.total


OverlapRule = Callable[..., float]
OVERLAP_RULES: dict[str, OverlapRule] = {
    "ddp_buckets": exposed_ddp_buckets,
    "fsdp_prefetch": exposed_fsdp_prefetch,
    "zero3_prefetch": exposed_zero3_prefetch,
    "none": exposed_all,
}
"""a catalogue entry's `overlap` → (compute, *, timed calls, model, accumulation) → its collectives' exposed seconds
per step (before clamping to [0, total]); the keys are harness.core.catalogue.OVERLAPS"""


def comm_times(
    spec: RunSpec, cluster: Cluster | ClusterView, rates: Rates, comp: Compute, *, overlap: bool
) -> tuple[float, float, float]:
    """(total, exposed) seconds of collectives per step of a cell without tensor or pipeline parallelism, and the
    compute the schedule ran beside them; `overlap` False: everything exposed."""
    timed = timed_calls(CommCell.of(spec), executor=cluster.executor, rates=rates)
    A, total = spec.settings.grad_accum, timed.total
    compute = A * comp.total
    if not overlap or total == 0.0:
        return total, total, compute
    rule = OVERLAP_RULES[CATALOGUE[spec.strategy].overlap]
    exposed = rule(comp, timed=timed, cfg=spec.model_config, grad_accum=A)
    return total, max(0.0, min(total, exposed)), compute


def clear_caches() -> None:
    """Forget every timed ledger and schedule (tests compare cold and warm predictions)."""
    for f in (price_ledger, item_meta, ddp_points, ddp_schedule, fsdp_schedule, zero3_sums):
        f.cache_clear()
