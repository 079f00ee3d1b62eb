"""harness.worker.meters.profile's analysis: a Chrome trace's events → the traced step's parts.

Synthetic traces with known answers: a gloo-shaped one (main-thread operators, `gloo:*` spans on a worker thread)
and a GPU-shaped one (kernels, NCCL kernels, launches with correlation ids). No GPU runs here, so the NCCL path is
also checked on one recorded trace (two-rank DDP on A100s, from Holistic Trace Analysis's test data:
tests/fixtures/gpu_trace/README.md) against an independent reading of its device timeline. Real gloo traces are
analysed in tests/dist/test_trace.py. Times are µs, as in the trace.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from harness.worker.meters.profile import (
    PARTS,
    RECOMPUTE_MARK,
    STEP_MARK,
    RankTime,
    analyse,
    analyse_steps,
    combine,
    length,
    median_step,
    minus,
    split_window,
    union,
)

MAIN, GLOO = 100, 200


def x(name, ts, dur, *, tid=MAIN, cat="cpu_op", **args):
    return {"ph": "X", "cat": cat, "name": name, "pid": 1, "tid": tid, "ts": ts, "dur": dur, "args": args}


def test_gloo_trace_parts():
    """Step 0–100: forward ops 0–30, a gap 30–32, backward 32–60 (recompute 40–50 inside), the allreduce issued
    55–57 (a c10d op: not compute) and run by gloo 56–80, the main thread idle 60–80 (waiting), optimizer 80–95
    (its annotation 80–97: 95–97 idle), the rest idle. A gloo span before the step is outside the window."""
    events = [
        x(STEP_MARK, 0, 100, cat="user_annotation"),
        x("aten::linear", 0, 30),
        x("aten::mm", 5, 10),  # nested: counts once
        x("autograd::engine::evaluate_function: MmBackward0", 32, 23),
        x(RECOMPUTE_MARK, 40, 10, cat="user_annotation"),
        x("c10d::allreduce_", 55, 2),
        x("aten::add_", 57, 3),
        x("gloo:all_reduce", 56, 24, tid=GLOO, cat="user_annotation"),
        x("gloo:all_reduce", -50, 20, tid=GLOO, cat="user_annotation"),
        x("aten::copy_", 70, 5, tid=GLOO),  # gloo's own work on its thread: not the rank's compute
        x("Optimizer.step#AdamW.step", 80, 17, cat="user_annotation"),
        x("aten::_foreach_add_", 80, 15),
    ]
    r = analyse({"traceEvents": events}, rank=3, step_s=0.000101)
    assert r.basis == "main thread operators"
    got = {p: getattr(r, p) * 1e6 for p in PARTS}
    assert got == pytest.approx(
        {"compute": 30 + 8 + 5 + 3, "recompute": 10, "optimizer": 15, "comm_exposed": 1 + 20, "other": 2 + 1 + 5}
    )
    assert sum(got.values()) == pytest.approx(100)
    assert r.comm_total * 1e6 == pytest.approx(24)
    assert r.window == pytest.approx(100e-6) and r.step == 0.000101 and r.rank == 3


def test_gpu_trace_parts_from_kernels():
    """A made-up GPU trace (no GPU here): compute kernels 10–40 and 60–70, an NCCL all-reduce kernel 30–55
    (hidden under compute 30–40, exposed 40–55), an optimizer kernel 80–90 whose launch (correlation 3) lies in
    the optimizer's annotation, a recomputed kernel 45–50 launched inside the recompute annotation. Host-side
    operators do not count as busy on a GPU."""
    events = [
        x(STEP_MARK, 0, 100, cat="user_annotation"),
        x("aten::mm", 0, 100),  # the host is busy all along: irrelevant on a GPU
        x(RECOMPUTE_MARK, 20, 5, cat="user_annotation", tid=7),
        x("Optimizer.step#AdamW.step", 75, 5, cat="user_annotation"),
        x("cudaLaunchKernel", 1, 1, cat="cuda_runtime", correlation=1),
        x("cudaLaunchKernel", 22, 1, cat="cuda_runtime", correlation=2),
        x("cudaLaunchKernel", 76, 1, cat="cuda_runtime", correlation=3),
        x("sm90_gemm", 10, 30, tid=7, cat="kernel", correlation=1),
        x("ncclDevKernel_AllReduce_Sum_f32_RING_LL", 30, 25, tid=9, cat="kernel"),
        x("elementwise", 45, 5, tid=7, cat="kernel", correlation=2),
        x("Memcpy DtoD", 60, 10, tid=7, cat="gpu_memcpy"),
        x("multi_tensor_apply_kernel", 80, 10, tid=7, cat="kernel", correlation=3),
    ]
    r = analyse({"traceEvents": events}, rank=0, step_s=0.0001)
    assert r.basis == "device kernels"
    got = {p: getattr(r, p) * 1e6 for p in PARTS}
    assert got == pytest.approx(
        {"compute": 30 + 10, "recompute": 5, "optimizer": 10, "comm_exposed": 15 - 5, "other": 10 + 5 + 10 + 10}
    )
    assert r.comm_total * 1e6 == pytest.approx(25)


def test_recompute_is_null_with_its_reason_when_not_marked():
    events = [x(STEP_MARK, 0, 10, cat="user_annotation"), x("aten::mm", 0, 10)]
    r = analyse({"traceEvents": events}, rank=0, step_s=1e-5, recompute_reason="torch.compile: …")
    assert r.recompute is None and r.null_reasons == {"recompute": "torch.compile: …"}
    assert r.compute == pytest.approx(10e-6)
    with pytest.raises(ValueError, match="has 0 'harness.traced_step' annotations, not a step 0"):
        analyse({"traceEvents": events[1:]}, rank=0, step_s=1e-5)


def test_combine_takes_the_slowest_rank_and_names_who_waits_least():
    def rank(k, step, exposed):
        return RankTime(k, step, step, step - exposed, 0.0, 0.0, exposed, 0.0, exposed, "main thread operators")

    t = combine([rank(0, 0.10, 0.03), rank(1, 0.12, 0.01), rank(2, 0.11, 0.02)])
    assert (t["step"], t["comm_exposed"], t["slowest_rank"], t["waits_least_rank"]) == (0.12, 0.01, 1, 1)
    assert t["spread_s"] == pytest.approx(0.02)
    assert [r["rank"] for r in t["by_rank"]] == [0, 1, 2]


def test_median_step_takes_the_median_by_the_slowest_rank_and_keeps_every_step():
    """Five traced steps: the parts are those of the step whose slowest rank's wall time is the median, so one
    stalled step (or the profiler's slower first) does not stand for the cell."""

    def rank(k, step, exposed):
        return RankTime(k, step, step, step - exposed, 0.0, 0.0, exposed, 0.0, exposed, "main thread operators")

    walls = [(0.30, 0.10), (0.11, 0.12), (0.10, 0.09), (0.50, 0.2), (0.13, 0.14)]  # (rank 0, rank 1) per step
    steps = [[rank(0, a, 0.01 * i), rank(1, b, 0.02 * i)] for i, (a, b) in enumerate(walls)]
    t = median_step(steps)
    assert t["steps"] == [0.30, 0.12, 0.10, 0.50, 0.14]  # each step's slowest rank
    assert t["index"] == 4 and t["step"] == 0.14 and t["slowest_rank"] == 1
    assert t["comm_exposed"] == pytest.approx(0.08)  # rank 1's at step 4
    two = median_step(steps[1:3])  # an even count: the lower middle
    assert two["index"] == 1 and two["step"] == 0.10
    assert "untraced_steps" not in t and "profiler_cost" not in t  # none run: nothing to say of the profiler


def test_profiler_cost_is_the_traced_median_over_the_untraced_neighbours_median():
    """Each untraced neighbour's wall time is its slowest rank's (as the traced steps'); the profiler's cost is the
    traced steps' median over theirs (an even count's median: the middle two's mean)."""

    def rank(k, step):
        return RankTime(k, step, step, step, 0.0, 0.0, 0.0, 0.0, 0.0, "main thread operators")

    steps = [[rank(0, w), rank(1, w - 0.01)] for w in (0.30, 0.24, 0.22, 0.26, 0.25)]  # median 0.25
    untraced = [[0.20, 0.21, 0.19, 0.24, 0.20, 0.22], [0.21, 0.20, 0.18, 0.20, 0.23, 0.22]]  # by rank
    t = median_step(steps, untraced=untraced)
    assert t["untraced_steps"] == [0.21, 0.21, 0.19, 0.24, 0.23, 0.22]
    assert t["profiler_cost"] == pytest.approx(0.25 / 0.215)
    with pytest.raises(ValueError):  # a rank with a different count of untraced steps is a bug, not a ratio
        median_step(steps, untraced=[[0.2, 0.2], [0.2]])


def test_analyse_reads_the_step_it_is_asked_for():
    """Several traced steps in one trace: `index` picks the step by time, whatever the events' order."""
    events = [
        x(STEP_MARK, 500, 100, cat="user_annotation"),
        x("aten::mm", 510, 50),
        x(STEP_MARK, 0, 100, cat="user_annotation"),
        x("aten::mm", 10, 20),
    ]
    doc = {"traceEvents": events}
    first, second = (analyse(doc, rank=0, step_s=1e-4, index=i) for i in (0, 1))
    assert (first.compute, second.compute) == (pytest.approx(20e-6), pytest.approx(50e-6))
    with pytest.raises(ValueError, match="has 2 'harness.traced_step' annotations, not a step 2"):
        analyse(doc, rank=0, step_s=1e-4, index=2)
    # every step at once (the trace read once): the same breakdowns
    assert analyse_steps(doc, rank=0, steps_s=[1e-4, 2e-4]) == [first, analyse(doc, rank=0, step_s=2e-4, index=1)]


BASE_NS = 1_790_857_026_000_000_000
"""a trace's `baseTimeNanoseconds`: its timestamps are µs since this Unix time (torch.profiler's Chrome export)"""


def test_the_parts_fill_the_step_not_its_annotation():
    """Issue 48, item 11: a traced DDP step of 14.9 ms whose annotation spans 19.0 ms (the host did something for
    4.1 ms between the annotation's entry and the step's first perf_counter): the parts fill the 14.9 ms the step
    took, placed on the trace's clock by the wall clock read at its start, and the 4.1 ms before it is in no part.
    Without that reading the annotation is the window (the earlier behaviour: 19.0 ms of parts for a 14.9 ms step)."""
    events = [
        x(STEP_MARK, 1000, 19000, cat="user_annotation"),
        x("aten::linear", 5100, 10200),  # compute 10.2 ms
        x("c10d::allreduce_", 15300, 100),
        x("gloo:all_reduce", 15400, 1600, tid=GLOO, cat="user_annotation"),  # exposed 15.4–17.0 ms
        x("Optimizer.step#AdamW.step", 17000, 900, cat="user_annotation"),
        x("aten::_foreach_add_", 17000, 900),  # optimizer 0.9 ms
    ]
    doc = {"traceEvents": events, "baseTimeNanoseconds": BASE_NS}
    start_ns = BASE_NS + 5_100_000  # the step's start: 4.1 ms into the annotation (ts 5100 µs)
    r = analyse(doc, rank=1, step_s=0.0149, start_ns=start_ns)
    got = {p: getattr(r, p) * 1e3 for p in PARTS}
    assert got == pytest.approx(
        {"compute": 10.2, "recompute": 0.0, "optimizer": 0.9, "comm_exposed": 1.6, "other": 2.2}
    )
    assert sum(got.values()) == pytest.approx(14.9, rel=1e-9) and r.window == pytest.approx(r.step, rel=1e-9)
    (every,) = analyse_steps(doc, rank=1, steps_s=[0.0149], starts_ns=[start_ns])
    assert every == r
    plain = analyse(doc, rank=1, step_s=0.0149)  # no wall-clock reading: the annotation's span
    assert sum(getattr(plain, p) for p in PARTS) == pytest.approx(0.019) and plain.other == pytest.approx(0.0063)
    # a trace without its base time cannot place the step: the annotation again
    assert analyse({"traceEvents": events}, rank=1, step_s=0.0149, start_ns=start_ns) == plain


def test_a_cuda_traces_device_copy_of_the_step_annotation_is_no_step():
    """On a GPU the profiler also draws each annotation on the device's timeline (cat gpu_user_annotation, from its
    first kernel to its last): those copies are not steps, so the second step is the host's second annotation."""
    events = [
        x(STEP_MARK, 0, 100, cat="user_annotation"),
        x(STEP_MARK, 5, 80, cat="gpu_user_annotation", tid=7),
        x("aten::mm", 10, 20),
        x(STEP_MARK, 200, 100, cat="user_annotation"),
        x(STEP_MARK, 205, 90, cat="gpu_user_annotation", tid=7),
        x("aten::mm", 210, 60),
    ]
    first, second = analyse_steps({"traceEvents": events}, rank=0, steps_s=[1e-4, 1e-4])
    assert (first.compute, second.compute) == (pytest.approx(20e-6), pytest.approx(60e-6))
    assert second.window == pytest.approx(100e-6)


spans = st.lists(st.tuples(st.integers(-20, 120), st.integers(0, 40)).map(lambda t: (t[0], t[0] + t[1])), max_size=12)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(busy=spans, comm=spans, opt=spans, rec=spans)
def test_parts_fill_the_window_and_exposed_never_exceeds_total(busy, comm, opt, rec):
    """Any timelines: the parts add up to the window, and the exposed part is the window's communication not under
    busy time (so never more than the communication)."""
    b, c = union(busy), union(comm)
    parts = split_window((0, 100), busy=b, comm=c, optimizer=union(opt), recompute=union(rec))
    assert sum(parts.values()) == pytest.approx(100)
    in_window = [(max(a, 0), min(z, 100)) for a, z in c if z > 0 and a < 100]
    assert parts["comm_exposed"] == pytest.approx(length(minus(in_window, b)))
    assert parts["comm_exposed"] <= length(in_window) + 1e-9
    assert all(v >= 0 for v in parts.values())


# --------------------------------------------------------------------------------------------------
# a recorded GPU trace (tests/fixtures/gpu_trace/README.md: two-rank DDP on A100s, NCCL, from HTA's test data)

GPU_TRACE = Path(__file__).resolve().parents[1] / "fixtures" / "gpu_trace" / "hta-nccl-2rank-rank0.trace.json.gz"
GRID = 10
"""samples per µs of the reference timelines below"""


def _recorded_gpu_trace() -> dict:
    """The recorded trace with its `ProfilerStep#k` annotations renamed to the harness's step mark (the only change:
    the harness's traced step annotates itself so)."""
    doc = json.loads(gzip.decompress(GPU_TRACE.read_bytes()))
    for e in doc["traceEvents"]:
        if e["cat"] == "user_annotation" and e["name"].startswith("ProfilerStep#"):
            e["name"] = STEP_MARK
    return doc


def _reference(doc: dict, lo: float, hi: float) -> dict[str, float]:
    """The device's timelines on a 0.1 µs grid, built independently of the analysis: a sample is busy under any
    kernel, memcpy or memset not NCCL's; communication under an NCCL kernel; optimizer when busy under a kernel
    whose launch (the cuda_runtime event with its correlation id) lies in an Optimizer.* annotation. Seconds."""
    n = round((hi - lo) * GRID)
    busy, comm, opt = np.zeros(n, bool), np.zeros(n, bool), np.zeros(n, bool)
    events = doc["traceEvents"]
    launch = {
        e["args"]["correlation"]: e["ts"] for e in events if e["cat"] == "cuda_runtime" and "correlation" in e["args"]
    }
    optimizer = [(e["ts"], e["ts"] + e["dur"]) for e in events if e["name"].startswith("Optimizer.")]
    for e in events:
        if e["cat"] not in ("kernel", "gpu_memcpy", "gpu_memset"):
            continue
        a, b = max(e["ts"], lo), min(e["ts"] + e["dur"], hi)
        if b <= a:
            continue
        i, j = round((a - lo) * GRID), round((b - lo) * GRID)
        if "nccl" in e["name"].lower():
            comm[i:j] = True
            continue
        busy[i:j] = True
        t = launch.get(e["args"].get("correlation"))
        if t is not None and any(s <= t < f for s, f in optimizer):
            opt[i:j] = True
    s = 1e6 * GRID
    return {
        "busy": busy.sum() / s,
        "optimizer": opt.sum() / s,
        "comm_total": comm.sum() / s,
        "comm_exposed": (comm & ~busy).sum() / s,
        "other": (~busy & ~comm).sum() / s,
    }


def test_recorded_nccl_trace_parts_match_an_independent_reading_of_the_device_timeline():
    """Three recorded training steps (ProfilerStep#4-6, 220-225 ms each, the device idle most of the time: a small
    model): the analysis reads them on the device's timeline, and every part equals the grid reference within 5 µs
    (the grid's rounding); the NCCL all_reduces ran 12.0, 12.3 and 22.6 ms, of which 10.0, 10.4 and 18.7 ms with no
    compute kernel beside them."""
    doc = _recorded_gpu_trace()
    marks = sorted((e for e in doc["traceEvents"] if e["name"] == STEP_MARK), key=lambda e: e["ts"])
    assert len(marks) == 3
    got = analyse_steps(doc, rank=0, steps_s=[m["dur"] / 1e6 for m in marks])
    exposed = []
    for mark, t in zip(marks, got):
        ref = _reference(doc, mark["ts"], mark["ts"] + mark["dur"])
        assert t.basis == "device kernels"
        assert t.window == pytest.approx(mark["dur"] / 1e6)
        assert sum(getattr(t, p) or 0.0 for p in PARTS) == pytest.approx(t.window, rel=1e-9)
        assert t.compute + t.optimizer + t.recompute == pytest.approx(ref["busy"], abs=5e-6)
        assert t.optimizer == pytest.approx(ref["optimizer"], abs=5e-6) and t.optimizer > 0
        assert t.comm_total == pytest.approx(ref["comm_total"], abs=5e-6)
        assert t.comm_exposed == pytest.approx(ref["comm_exposed"], abs=5e-6)
        assert t.other == pytest.approx(ref["other"], abs=5e-6)
        assert t.recompute == 0  # nothing annotated as recomputation
        exposed.append((round(t.comm_total * 1e3, 1), round(t.comm_exposed * 1e3, 1)))
    assert exposed == [(12.0, 10.0), (12.3, 10.4), (22.6, 18.7)]
