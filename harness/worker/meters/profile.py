"""Traced steps after the timed ones: each rank's torch.profiler trace, and the measured step-time breakdown.

With `trace: true` every rank runs TRACED_STEPS more steps under `torch.profiler` (CPU activities; CUDA activities
too on a GPU) after the counted-comm step — the timed steps are never profiled — writes the trace as a gzipped
Chrome trace (what Perfetto and chrome://tracing open) beside the record, and reads it back to split each step into
the parts the time model predicts (`predicted.time_s`): compute, recompute, optimizer, comm_exposed, other, and
comm_total beside them. Rank 0 gathers every rank's parts into `metrics.time_s`: those of the median traced step
(by the slowest rank's wall time), so one step the host stalled in (or the profiler's first, which sets itself up)
does not stand for the cell. Before them a CPU rank faults in heap headroom (harness.worker.allocator.keep_headroom):
the profiler's own buffers would otherwise push the step's large buffers onto fresh, page-faulted heap.

Around the traced steps run UNTRACED_AROUND untraced steps on each side (the same steps without the profiler,
adjacent in time): the traced steps' median over theirs is `profiler_cost`, the profiler's own cost measured beside
every trace. A traced step outside the timed steps' p10–p90 whose untraced neighbours are outside too says the
host's pace moved between the timed steps and the traced ones, not that the profiler changed the step.

How the parts are derived (docs/time-model.md, "Measured breakdown"): inside the traced step's window every instant
is given to one part. The window is the step itself: the interval its wall time (`perf_counter` around the step and
its device synchronisation) was taken over, placed on the trace's clock by the wall clock read beside the first
`perf_counter` (the trace counts its timestamps from `baseTimeNanoseconds`, a Unix time). The `harness.traced_step`
annotation around it starts a little before and ends a little after (its own entry and exit: 4–30 µs measured), and
anything the host did between the annotation's entry and the step's first `perf_counter` (a garbage collection, the
thread descheduled) would otherwise be counted as a part of a step it was not in. Without the wall-clock reading (a
trace without `baseTimeNanoseconds`, a caller that passes none) the annotation is the window.

- the *busy* timeline is what computes. On a GPU: the device's kernels, memcpys and memsets that are not NCCL's. On
  CPU (gloo): the rank's main thread inside a profiled operator, minus the collective operators themselves (c10d::*,
  _c10d_functional::*, wait_tensor, record_param_comms) — gloo runs collectives on its own threads, and while the
  main thread waits on a work handle it runs no operator;
- the *communication* timeline is where collectives run: NCCL kernels on their streams; gloo's `gloo:*` spans on its
  threads. comm_total is its length inside the window;
- an instant that is busy is recompute when it lies in a checkpointed block's recomputation (a `harness.recompute`
  annotation this module adds for the traced step), optimizer when in the optimizer's step or zero_grad, else
  compute (on a GPU a kernel belongs to the region its launch was made in); an instant that is not busy while a
  collective runs is comm_exposed (the rank waits for communication); anything else is other (host overhead between
  operators, launch gaps, the framework's bookkeeping).

So the parts add up to the traced step exactly, and comm_exposed <= comm_total. The analysis below is pure (a
trace's events in, seconds out): tests feed it synthetic events as well as real traces.
"""

from __future__ import annotations

import bisect
import gzip
import json
import os
import statistics
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

STEP_MARK = "harness.traced_step"
"""the annotation around the traced step (and its device synchronisation): which thread is the step's, and the
window the parts fill where the step's start on the trace's clock is not known"""
GPU_ANNOTATION = "gpu_user_annotation"
"""the category of the copy of an annotation that a CUDA trace draws on the device's timeline (from its first
kernel to its last): not the host's annotation, so never a step's mark"""
RECOMPUTE_MARK = "harness.recompute"
"""the annotation around each recomputation of a checkpointed block in the traced step's backward"""
OPTIMIZER_MARK = "harness.optimizer"
"""the annotation around DeepSpeed's engine.step in the traced step (torch optimizers annotate themselves)"""
OPTIMIZER_PREFIXES = ("Optimizer.step#", "Optimizer.zero_grad#", OPTIMIZER_MARK)
"""the annotations of the optimizer's region (torch.optim.Optimizer names its step and zero_grad so)"""
COMM_OP_PREFIXES = ("c10d::", "_c10d_functional::", "c10d_functional::", "record_param_comms", "nccl:", "gloo:")
"""main-thread operators that issue or wait on a collective: not compute"""
PARTS: tuple[str, ...] = ("compute", "recompute", "optimizer", "comm_exposed", "other")
"""the parts that fill the traced step (the keys of predicted.time_s that add up to its total)"""
DEVICE_CATEGORIES = ("kernel", "gpu_memcpy", "gpu_memset")
"""the trace's device activities (CUDA): what runs on the GPU"""
TRACED_STEPS = 5
"""steps run under the profiler; the breakdown is the median one's. NOTE: one step is a single sample of a noisy
step time: with 10 timed steps and independent noise, a single untraced step falls outside their p10–p90 about one
time in three by chance alone (the band is narrow and itself estimated from 10 samples), the median of three about
one in five, of five about one in eight (simulated, lognormal noise); the median of five costs four more steps
under the profiler, small beside a cell's setup"""
UNTRACED_AROUND = 3
"""untraced steps run just before and just after the traced ones (the profiler's cost is the traced median over
theirs). NOTE: neighbours on both sides, because the host's pace drifts between blocks of steps more than within
one: with the profiler off, a block of five more untraced steps after the timed ones had its median inside the
timed p10–p90 in only 11 of 16 and 18 of 25 cells (2026-12-04, 2-core VM; docs/time-model.md), so the timed band
alone cannot tell the profiler's cost from the host's drift; the same number either side cancels a linear drift"""
PHASE_STEPS = TRACED_STEPS + 2 * UNTRACED_AROUND
"""steps the traced phase trains: the traced ones and their untraced neighbours"""
TRACE_DIR = "traces"
"""where a sweep's traces go, beside its records: <sweep>/traces/<run_id>/rank<k>.trace.json.gz"""


# --------------------------------------------------------------------------------------------------
# intervals


Intervals = list[tuple[float, float]]
"""sorted, disjoint [start, end) spans (µs, the trace's clock)"""


def union(spans: Iterable[tuple[float, float]]) -> Intervals:
    """The union of `spans` as sorted, disjoint intervals (empty spans dropped)."""
    out: Intervals = []
    for a, b in sorted(s for s in spans if s[1] > s[0]):
        if out and a <= out[-1][1]:
            if b > out[-1][1]:
                out[-1] = (out[-1][0], b)
        else:
            out.append((a, b))
    return out


def minus(base: Intervals, cut: Intervals) -> Intervals:
    """`base` without `cut` (both sorted and disjoint)."""
    out: Intervals = []
    j = 0
    for a, b in base:
        while j < len(cut) and cut[j][1] <= a:
            j += 1
        k, start = j, a
        while k < len(cut) and cut[k][0] < b:
            if cut[k][0] > start:
                out.append((start, cut[k][0]))
            start = max(start, cut[k][1])
            k += 1
        if start < b:
            out.append((start, b))
    return out


def clip(spans: Intervals, *, lo: float, hi: float) -> Intervals:
    """`spans` inside [lo, hi)."""
    return [(max(a, lo), min(b, hi)) for a, b in spans if b > lo and a < hi]


def length(spans: Intervals) -> float:
    """Their total length (µs)."""
    return sum(b - a for a, b in spans)


class _Member:
    """Whether an instant lies in a set of sorted, disjoint intervals (bisect over their starts)."""

    def __init__(self, spans: Intervals) -> None:
        self.spans, self.starts = spans, [a for a, _ in spans]

    def __contains__(self, t: float) -> bool:
        i = bisect.bisect_right(self.starts, t) - 1
        return i >= 0 and t < self.spans[i][1]


def split_window(
    window: tuple[float, float], *, busy: Intervals, comm: Intervals, optimizer: Intervals, recompute: Intervals
) -> dict[str, float]:
    """Each part's share of the window [lo, hi) (µs): busy instants are recompute, optimizer or compute (in that
    precedence), idle ones comm_exposed while a collective runs, else other. The parts add up to hi − lo."""
    lo, hi = window
    sets = [clip(s, lo=lo, hi=hi) for s in (busy, comm, optimizer, recompute)]
    cuts = sorted({lo, hi, *(t for s in sets for span in s for t in span)})
    is_busy, is_comm, in_opt, in_rec = (_Member(s) for s in sets)
    parts = dict.fromkeys(PARTS, 0.0)
    for a, b in zip(cuts, cuts[1:]):
        mid = (a + b) / 2
        if mid in is_busy:
            part = "recompute" if mid in in_rec else "optimizer" if mid in in_opt else "compute"
        else:
            part = "comm_exposed" if mid in is_comm else "other"
        parts[part] += b - a
    return parts


# --------------------------------------------------------------------------------------------------
# a trace → this rank's breakdown (pure)


@dataclass(frozen=True)
class RankTime:
    """One rank's traced step, split (s)."""

    rank: int
    step: float
    """the traced step's wall time: perf_counter around the step and its device synchronisation (s)"""
    window: float
    """the span the parts fill (s): the step's own interval on the trace's clock, so `step` up to the clocks'
    rounding (nanoseconds); the annotation's span where the step's start could not be placed"""
    compute: float
    recompute: float | None
    optimizer: float
    comm_exposed: float
    other: float
    comm_total: float
    """time a collective ran during the step, hidden or not (s)"""
    basis: str
    """what the busy timeline was: `device kernels` (GPU) or `main thread operators` (CPU)"""
    null_reasons: dict[str, str] = field(default_factory=dict)


def _events(doc: Mapping[str, Any]) -> list[dict[str, Any]]:
    return [e for e in doc.get("traceEvents", ()) if e.get("ph") == "X" and "dur" in e and "ts" in e]


def _span(e: Mapping[str, Any]) -> tuple[float, float]:
    return float(e["ts"]), float(e["ts"]) + float(e["dur"])


def _is_comm_op(name: str) -> bool:
    return name.startswith(COMM_OP_PREFIXES) or "wait_tensor" in name


def _is_nccl(name: str) -> bool:
    return "nccl" in name.lower()


def analyse(
    doc: Mapping[str, Any],
    *,
    rank: int,
    step_s: float,
    index: int = 0,
    start_ns: int | None = None,
    recompute_reason: str | None = None,
) -> RankTime:
    """This rank's breakdown of its `index`-th traced step (0-based, in time order) from its trace (the Chrome
    trace's JSON document). `start_ns`: the wall clock (`time.time_ns()`) read beside the step's first
    `perf_counter`: the window is then [start, start + step_s] on the trace's clock (else the step's annotation).
    `recompute_reason`: why the recomputation could not be marked (then recompute is null and its time is in
    compute)."""
    starts = None if start_ns is None else {index: start_ns}
    return _analyse(doc, rank=rank, steps={index: step_s}, starts_ns=starts, recompute_reason=recompute_reason)[0]


def analyse_steps(
    doc: Mapping[str, Any],
    *,
    rank: int,
    steps_s: Sequence[float],
    starts_ns: Sequence[int] | None = None,
    recompute_reason: str | None = None,
) -> list[RankTime]:
    """`analyse` of every traced step (`steps_s[i]`: step i's wall time, `starts_ns[i]` the wall clock at its
    start), the trace's events read and its timelines built once for all of them."""
    starts = None if starts_ns is None else dict(enumerate(starts_ns))
    return _analyse(doc, rank=rank, steps=dict(enumerate(steps_s)), starts_ns=starts, recompute_reason=recompute_reason)


def _window(
    doc: Mapping[str, Any], mark: Mapping[str, Any], *, step_s: float, start_ns: int | None
) -> tuple[float, float]:
    """The span (µs, the trace's clock) a step's parts fill: [start, start + step_s] where the step's start is known
    on the trace's clock (its wall-clock reading and the trace's base time), else its annotation's span."""
    base = doc.get("baseTimeNanoseconds")
    if start_ns is None or not isinstance(base, int) or isinstance(base, bool):
        return _span(mark)
    # NOTE: integer nanoseconds first, so the µs start keeps the trace's own precision (its ts are µs since base)
    lo = (start_ns - base) / 1e3
    return lo, lo + step_s * 1e6


def _analyse(
    doc: Mapping[str, Any],
    *,
    rank: int,
    steps: Mapping[int, float],
    starts_ns: Mapping[int, int] | None,
    recompute_reason: str | None,
) -> list[RankTime]:
    """The breakdown of each traced step `index` → its wall time in `steps` (and its start in `starts_ns`), in
    that order."""
    events = _events(doc)
    marks = sorted(
        (e for e in events if e.get("name") == STEP_MARK and e.get("cat") != GPU_ANNOTATION),
        key=lambda e: float(e["ts"]),
    )
    for index in steps:
        if len(marks) <= index:
            raise ValueError(f"the trace has {len(marks)} {STEP_MARK!r} annotations, not a step {index}")
    opt = union(_span(e) for e in events if str(e.get("name", "")).startswith(OPTIMIZER_PREFIXES))
    rec = union(_span(e) for e in events if e.get("name") == RECOMPUTE_MARK)
    device = [e for e in events if e.get("cat") in DEVICE_CATEGORIES]
    on_device = _device_timelines(events, device, optimizer=opt, recompute=rec) if device else None
    on_host: dict[Any, tuple[Intervals, Intervals]] = {}  # the main thread's (busy, comm), by thread id
    reasons = {} if recompute_reason is None else {"recompute": recompute_reason}
    out = []
    for index, step_s in steps.items():
        mark = marks[index]
        lo, hi = _window(doc, mark, step_s=step_s, start_ns=None if starts_ns is None else starts_ns[index])
        if on_device is not None and any(_span(e)[1] > lo and _span(e)[0] < hi for e in device):
            busy, comm, o, r = on_device
            basis = "device kernels"
        else:
            main = mark.get("tid")
            if main not in on_host:
                ops = [e for e in events if e.get("tid") == main and e.get("cat") == "cpu_op"]
                comm_ops = union(_span(e) for e in ops if _is_comm_op(str(e.get("name", ""))))
                gloo = union(_span(e) for e in events if str(e.get("name", "")).startswith("gloo:"))
                on_host[main] = (minus(union(_span(e) for e in ops), comm_ops), gloo)
            (busy, comm), o, r = on_host[main], opt, rec
            basis = "main thread operators"
        parts = split_window((lo, hi), busy=busy, comm=comm, optimizer=o, recompute=r)
        out.append(
            RankTime(
                rank=rank,
                step=step_s,
                window=(hi - lo) / 1e6,
                compute=parts["compute"] / 1e6,
                recompute=None if recompute_reason is not None else parts["recompute"] / 1e6,
                optimizer=parts["optimizer"] / 1e6,
                comm_exposed=parts["comm_exposed"] / 1e6,
                other=parts["other"] / 1e6,
                comm_total=length(clip(comm, lo=lo, hi=hi)) / 1e6,
                basis=basis,
                null_reasons=dict(reasons),
            )
        )
    return out


def _device_timelines(
    events: list[dict[str, Any]], device: list[dict[str, Any]], *, optimizer: Intervals, recompute: Intervals
) -> tuple[Intervals, Intervals, Intervals, Intervals]:
    """(busy, comm, optimizer, recompute) on the device: NCCL kernels are communication, every other kernel,
    memcpy and memset is busy; a busy kernel is the optimizer's (recompute's) when the host call that launched it
    (same correlation id) lies in the optimizer's (a recomputation's) annotation."""
    launched = {
        (e.get("args") or {}).get("correlation"): float(e["ts"])
        for e in events
        if e.get("cat") in ("cuda_runtime", "cuda_driver") and (e.get("args") or {}).get("correlation") is not None
    }
    in_opt, in_rec = _Member(optimizer), _Member(recompute)
    comm, busy, opt, rec = [], [], [], []
    for e in device:
        span = _span(e)
        if _is_nccl(str(e.get("name", ""))):
            comm.append(span)
            continue
        busy.append(span)
        t = launched.get((e.get("args") or {}).get("correlation"))
        if t is not None and t in in_rec:
            rec.append(span)
        elif t is not None and t in in_opt:
            opt.append(span)
    return union(busy), union(comm), union(opt), union(rec)


# --------------------------------------------------------------------------------------------------
# every rank's breakdown → metrics.time_s


def median_step(
    steps: Sequence[Sequence[RankTime]], *, untraced: Sequence[Sequence[float]] | None = None
) -> dict[str, Any]:
    """`metrics.time_s` from every traced step (`steps[i]`: each rank's breakdown of step i): `combine` of the
    median step by its slowest rank's wall time (the lower middle of an even count), with every step's wall time
    (`steps`) and which one the parts are from (`index`). `untraced[k]`: rank k's untraced neighbours' wall times
    (s, in the order they ran): each one's slowest rank is `untraced_steps`, and the traced steps' median over
    theirs is `profiler_cost`."""
    walls = [max(r.step for r in ranks) for ranks in steps]
    order = sorted(range(len(walls)), key=lambda i: (walls[i], i))
    index = order[(len(order) - 1) // 2]
    out = {**combine(steps[index]), "steps": walls, "index": index}
    if untraced:
        plain = [max(each) for each in zip(*untraced, strict=True)]
        out["untraced_steps"] = plain
        reference = statistics.median(plain)
        out["profiler_cost"] = statistics.median(walls) / reference if reference > 0 else None
    return out


def combine(ranks: Sequence[RankTime]) -> dict[str, Any]:
    """One traced step's `metrics.time_s` (harness.results.record.TimeBreakdown): the slowest rank's parts (a step
    ends when its slowest rank ends, as for the timed steps), how much slower it was than the fastest, and each
    rank's step and exposed communication (the rank that waits least is the one the others wait for)."""
    slowest = max(ranks, key=lambda r: r.step)
    fastest = min(ranks, key=lambda r: r.step)
    waits_least = min(ranks, key=lambda r: r.comm_exposed)
    return {
        "step": slowest.step,
        "compute": slowest.compute,
        "recompute": slowest.recompute,
        "optimizer": slowest.optimizer,
        "comm_exposed": slowest.comm_exposed,
        "other": slowest.other,
        "comm_total": slowest.comm_total,
        "window": slowest.window,
        "slowest_rank": slowest.rank,
        "spread_s": slowest.step - fastest.step,
        "waits_least_rank": waits_least.rank,
        "by_rank": [
            {"rank": r.rank, "step": r.step, "comm_exposed": r.comm_exposed, "compute": r.compute}
            for r in sorted(ranks, key=lambda r: r.rank)
        ],
        "basis": slowest.basis,
        "null_reasons": dict(slowest.null_reasons),
    }


# --------------------------------------------------------------------------------------------------
# the traced step (torch)


def trace_name(rank: int) -> str:
    return f"rank{rank}.trace.json.gz"


def trace_paths(run_id: str, world_size: int) -> list[str]:
    """Every rank's trace, relative to the record's folder (what `artifacts.traces` lists)."""
    return [f"{TRACE_DIR}/{run_id}/{trace_name(k)}" for k in range(world_size)]


@dataclass
class Traced:
    """What the traced step gives rank 0 for the record."""

    time_s: dict[str, Any]
    """metrics.time_s"""
    traces: list[str]
    """artifacts.traces: every rank's trace, relative to the record"""


def traced_step(
    step: Callable[[], Any],
    *,
    trainer: Any,
    device: Any,
    sweep_dir: str | Path,
    run_id: str,
    rank: int,
    world_size: int,
    compiled: bool,
    checkpointing: bool,
) -> Traced | None:
    """Run `step` TRACED_STEPS times under the profiler between UNTRACED_AROUND untraced steps on either side,
    write this rank's trace, and gather every rank's breakdown of each step: rank 0 gets `Traced` (the median
    step's parts, the profiler's cost), the others None. Every rank must call it (it ends with a gather)."""
    import torch.distributed as dist
    from torch.profiler import ProfilerActivity, profile, record_function

    from harness.worker.meters.timing import synchronize, time_steps

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    folder = Path(sweep_dir) / TRACE_DIR / run_id
    folder.mkdir(parents=True, exist_ok=True)
    raw = folder / f".rank{rank}.{os.getpid()}.json"
    step_s: list[float] = []
    starts_ns: list[int] = []
    if device.type == "cpu":
        from harness.worker.allocator import keep_headroom
        from harness.worker.meters.memory import peak_rss_bytes

        # NOTE: the profiler's buffers would push the step's freed blocks to fresh, page-faulted heap (allocator)
        keep_headroom(peak_rss_bytes(), ranks_here=world_size)
    # NOTE: every block of steps starts with the ranks together (a barrier), as the timed steps do after warmup
    dist.barrier()
    before, _ = time_steps(step, n=UNTRACED_AROUND, device=device)
    with _marks(trainer, compiled=compiled, checkpointing=checkpointing) as recompute_reason:
        with profile(activities=activities, record_shapes=False, with_stack=False, profile_memory=False) as prof:
            # NOTE: the ranks start the traced steps together and run them back to back, as the timed steps: a
            # barrier before each step would take the ranks' skew out of the traced steps that the timed ones keep
            # (ZeRO's traced steps came out 0.86x the timed median that way)
            dist.barrier()
            synchronize(device)
            for _ in range(TRACED_STEPS):
                with record_function(STEP_MARK):
                    t0 = time.perf_counter()
                    # NOTE: the wall clock beside t0 places the step on the trace's clock: the parts fill the step
                    starts_ns.append(time.time_ns())
                    step()
                    synchronize(device)
                    step_s.append(time.perf_counter() - t0)
    try:
        prof.export_chrome_trace(str(raw))
        data = raw.read_bytes()
    finally:
        raw.unlink(missing_ok=True)
    del prof  # NOTE: its parsed events (tens of thousands of objects) would stay alive through the steps after
    dist.barrier()
    after, _ = time_steps(step, n=UNTRACED_AROUND, device=device)
    mine = analyse_steps(
        json.loads(data), rank=rank, steps_s=step_s, starts_ns=starts_ns, recompute_reason=recompute_reason
    )
    from harness.results.store import atomic_write_bytes

    atomic_write_bytes(folder / trace_name(rank), gzip.compress(data, compresslevel=6, mtime=0))
    gathered: list[Any] = [None] * world_size
    dist.all_gather_object(gathered, {"traced": [asdict(m) for m in mine], "untraced": before + after})
    if rank != 0:
        return None
    by_step = [[RankTime(**g["traced"][i]) for g in gathered] for i in range(TRACED_STEPS)]
    untraced = [g["untraced"] for g in gathered]
    return Traced(time_s=median_step(by_step, untraced=untraced), traces=trace_paths(run_id, world_size))


@contextmanager
def _marks(trainer: Any, *, compiled: bool, checkpointing: bool) -> Iterator[str | None]:
    """For the traced step only: annotate each checkpointed block's recomputation and DeepSpeed's engine.step.
    Yields why recomputation is not marked (None when it is, or when nothing is checkpointed)."""
    from torch.autograd.profiler import record_function

    blocks = [m._checkpoint_wrapped_module for m in _modules(trainer) if type(m).__name__ == "CheckpointWrapper"]
    reason = None
    if checkpointing and compiled:
        # NOTE: wrapping a compiled block's forward would make dynamo recompile it inside the traced step
        reason = "torch.compile: the traced step leaves compiled blocks as they are; recompute is counted in compute"
        blocks = []
    elif checkpointing and not blocks:
        reason = "no checkpointed block found in the trainer's modules; recompute is counted in compute"
    for b in blocks:
        b.forward = _marking_recompute(b.forward)
    engine = getattr(trainer, "engine", None)
    if engine is not None:
        original = engine.step

        def annotated_step(*args: Any, **kwargs: Any) -> Any:
            with record_function(OPTIMIZER_MARK):
                return original(*args, **kwargs)

        engine.step = annotated_step
    try:
        yield reason
    finally:
        for b in blocks:
            del b.forward  # NOTE: the instance attribute shadowed the class's forward; removing it restores that
        if engine is not None:
            del engine.step  # NOTE: the instance attribute shadowed the class's method; removing it restores that


def _marking_recompute(forward: Callable[..., Any]) -> Callable[..., Any]:
    """`forward`, annotated RECOMPUTE_MARK when autograd calls it from a backward: the checkpoint's recomputation.

    NOTE: a wrapper around the call, not a pre- and a post-hook: the non-reentrant checkpoint stops a recomputation
    early (an exception) once it has what the backward needs, and a post-hook would never close the annotation."""
    from torch.autograd.profiler import record_function

    def marked(*args: Any, **kwargs: Any) -> Any:
        import torch

        if torch._C._current_graph_task_id() == -1:  # not inside a backward: the block's own forward
            return forward(*args, **kwargs)
        with record_function(RECOMPUTE_MARK):
            return forward(*args, **kwargs)

    return marked


def _modules(trainer: Any) -> list[Any]:
    """Every module of the trainer's model (or of its pipeline stages)."""
    roots = [getattr(trainer, "model", None), *(getattr(trainer, "modules", None) or [])]
    return [m for root in roots if callable(getattr(root, "modules", None)) for m in root.modules()]
