"""Issue 33 on real gloo ranks: the traced step's profiler traces and the measured breakdown derived from them.

One traced cell (DDP, 2 ranks, full activation checkpointing, the checkpoint phase after the traced one, through
the worker like any sweep cell) serves the record's assertions and the traces' structure; one more two-rank launch
builds DDP twice, with one gradient bucket (the all_reduce starts when the backward has ended: nothing to hide it
behind) and with small buckets (each all_reduce starts while the backward goes on), and traces both. No GPU here:
the NCCL path is tested on a made-up trace and on a recorded one (two-rank DDP on A100s) in
tests/unit/test_trace_analysis.py.
"""

from __future__ import annotations

import gzip
import json
import os
import statistics
from pathlib import Path

import pytest

from harness.core.ports import free_port
from harness.worker.meters.profile import PARTS, RECOMPUTE_MARK, STEP_MARK, TRACED_STEPS, UNTRACED_AROUND
from tests.conftest import make_spec, run_cell


@pytest.fixture(scope="module")
def traced(tmp_path_factory) -> dict:
    results = tmp_path_factory.mktemp("trace") / "results"
    # NOTE: the checkpoint phase runs after the traced one (nothing measured follows it): it says how many steps
    # the traced phase trained
    spec = make_spec(strategy="ddp", trace=True, activation_checkpointing="full", measure_steps=5, checkpoint=True)
    rec = run_cell(spec, results)
    assert rec["status"] == "ok", rec.get("reason")
    return rec


def test_measured_parts_add_up_to_the_traced_step(traced, record_property):
    """The parts fill the traced step: its wall time, to the nanosecond (the window is the step's own interval on
    the trace's clock); the gradients' all_reduce ran (comm_total > 0) and no more of it was exposed than ran;
    checkpointing's recomputation and the optimizer were found. The traced step against the timed ones is printed,
    not asserted (the profiler's cost)."""
    t = traced["metrics"]["time_s"]
    parts = sum(t[p] for p in PARTS)
    assert parts == pytest.approx(t["window"], rel=1e-9)
    assert parts == pytest.approx(t["step"], rel=1e-6, abs=0), (parts, t["step"])
    assert t["comm_total"] > 0
    assert 0 <= t["comm_exposed"] <= t["comm_total"]
    assert t["recompute"] > 0 and t["optimizer"] > 0 and t["compute"] > 0
    assert t["basis"] == "main thread operators" and t["null_reasons"] == {}
    assert [r["rank"] for r in t["by_rank"]] == [0, 1]
    assert t["slowest_rank"] in (0, 1) and t["step"] == max(r["step"] for r in t["by_rank"])
    assert t["spread_s"] == pytest.approx(abs(t["by_rank"][0]["step"] - t["by_rank"][1]["step"]))
    # the parts are the median traced step's, by its slowest rank's wall time
    assert len(t["steps"]) == TRACED_STEPS and all(s > 0 for s in t["steps"])
    assert t["step"] == t["steps"][t["index"]] == sorted(t["steps"])[(TRACED_STEPS - 1) // 2]
    # the untraced neighbours: UNTRACED_AROUND each side, and the profiler's cost is the medians' ratio
    assert len(t["untraced_steps"]) == 2 * UNTRACED_AROUND and all(s > 0 for s in t["untraced_steps"])
    assert t["profiler_cost"] == pytest.approx(statistics.median(t["steps"]) / statistics.median(t["untraced_steps"]))
    # every step of the traced phase trained: the checkpoint saved after them all, and training resumed exactly
    s, c = traced["spec"], traced["metrics"]["checkpoint"]
    assert c["step"] == s["warmup_steps"] + s["measure_steps"] + 2 + TRACED_STEPS + 2 * UNTRACED_AROUND  # memory, counted
    assert abs(c["resume_loss_delta"]) <= 1e-6
    timed = traced["metrics"]["step_time_s"]
    within = timed["p10"] <= t["step"] <= timed["p90"]
    plain = statistics.median(t["untraced_steps"])
    note = (
        f"traced step {t['step'] * 1e3:.1f} ms; timed p10 {timed['p10'] * 1e3:.1f}, median {timed['median'] * 1e3:.1f}, "
        f"p90 {timed['p90'] * 1e3:.1f} ms; within p10-p90: {within}; untraced neighbours' median "
        f"{plain * 1e3:.1f} ms (within: {timed['p10'] <= plain <= timed['p90']}); profiler cost {t['profiler_cost']:.2f}x"
    )
    record_property("traced_vs_timed", note)
    print(note)


def test_a_plain_ddp_cells_parts_add_up_to_its_traced_step(tmp_path, record_property):
    """Issue 48, item 11: `trace: true` on the smoke model, DDP fp32, 2 ranks (no checkpointing): the parts summed
    to the trace's annotation (19.0 ms once) rather than to the traced step they describe (14.9 ms). The record's
    parts (the slowest rank's, of the median traced step) add up to that step now, and that rank's annotation of
    the step in its trace holds it (the annotation is the step and its own entry and exit: what it spans beyond
    the step is in no part)."""
    spec = make_spec(strategy="ddp", trace=True, measure_steps=5)
    rec = run_cell(spec, tmp_path / "results")
    assert rec["status"] == "ok", rec.get("reason")
    t = rec["metrics"]["time_s"]
    parts = {p: t[p] for p in PARTS}
    assert sum(parts.values()) == pytest.approx(t["step"], rel=1e-6, abs=0)
    assert t["window"] == pytest.approx(t["step"], rel=1e-6, abs=0)
    assert t["step"] == max(r["step"] for r in t["by_rank"]) == t["steps"][t["index"]]
    folder = Path(rec["_path"]).parent
    doc = json.loads(gzip.decompress((folder / rec["artifacts"]["traces"][t["slowest_rank"]]).read_bytes()))
    marks = sorted((e for e in doc["traceEvents"] if e.get("name") == STEP_MARK), key=lambda e: e["ts"])
    annotation_s = marks[t["index"]]["dur"] / 1e6
    assert annotation_s >= t["step"]  # the annotation holds the step: what it spans beyond is in no part
    note = (
        f"traced step {t['step'] * 1e3:.3f} ms, parts {sum(parts.values()) * 1e3:.3f} ms, "
        f"annotation {annotation_s * 1e3:.3f} ms"
    )
    record_property("ddp_parts", note)
    print(note, {p: round(v * 1e3, 3) for p, v in parts.items()})


def test_the_record_lists_each_ranks_trace_and_perfetto_can_read_it(traced):
    """Perfetto's JSON trace format (the Chrome trace event format), gzipped: an object with `traceEvents`, whose
    complete events ('X') have a name, numeric ts and dur (µs) and integer-or-string pid and tid; the step's
    annotation on the main thread, gloo's all_reduce on another thread, the recomputations inside the step."""
    from harness.results.store import read_record

    assert read_record(traced["_path"]).contract_problems() == []  # every field it wrote is a declared one
    folder = Path(traced["_path"]).parent
    run_id = traced["run_id"]
    assert traced["artifacts"]["traces"] == [f"traces/{run_id}/rank{k}.trace.json.gz" for k in (0, 1)]
    assert traced["spec"]["trace"] is True
    for rel in traced["artifacts"]["traces"]:
        raw = (folder / rel).read_bytes()
        assert raw[:2] == b"\x1f\x8b"  # gzip
        doc = json.loads(gzip.decompress(raw))
        assert isinstance(doc["traceEvents"], list) and doc.get("displayTimeUnit") in ("ms", "ns")
        complete = [e for e in doc["traceEvents"] if e.get("ph") == "X"]
        assert len(complete) > 100
        for e in complete:
            assert isinstance(e["name"], str) and isinstance(e["ts"], (int, float)) and isinstance(e["dur"], (int, float))
            assert e["dur"] >= 0 and isinstance(e["pid"], (int, str)) and isinstance(e["tid"], (int, str))
        steps = sorted((e for e in complete if e["name"] == STEP_MARK), key=lambda e: e["ts"])
        assert len(steps) == TRACED_STEPS
        for step in steps:
            lo, hi = step["ts"], step["ts"] + step["dur"]
            gloo = [e for e in complete if e["name"] == "gloo:all_reduce" and lo <= e["ts"] < hi]
            assert gloo and all(e["tid"] != step["tid"] for e in gloo)
            recomputed = [e for e in complete if e["name"] == RECOMPUTE_MARK and lo <= e["ts"] <= hi]
            assert len(recomputed) == 2  # the tiny model's 2 blocks
        assert len([e for e in complete if e["name"] == RECOMPUTE_MARK]) == 2 * TRACED_STEPS


# --------------------------------------------------------------------------------------------------
# a cell built to expose its communication, and the same cell with overlap

BUCKETS_MB = {"one bucket": 25.0, "small buckets": 0.15}
"""DDP's bucket cap: the tiny model's 0.66 MB of gradients in one bucket (reduced after the backward), or in about
five (the first reduced while the blocks' backward still runs)"""
TRACED_CALLS = 3
"""traced_step calls per bucket cap (each traces TRACED_STEPS steps)"""


def _overlap_rank(rank: int, port: int, out: str) -> None:
    """One rank: DDP with each bucket cap, warmed up, then TRACED_CALLS traced phases, each written as its own
    traces (run id `<cap>-<k>`)."""
    import torch
    import torch.distributed as dist

    from harness.worker.meters.profile import traced_step
    from harness.worker.runner import build_trainer
    from harness.worker.teardown import end_process_group

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=2)
    for name, cap in BUCKETS_MB.items():
        # NOTE: the setting (issue 53); at its default, torch's own buckets: the tiny model's 0.66 MB in one
        spec = make_spec(strategy="ddp", micro_batch=4, seq_len=128, bucket_cap_mb=cap)
        trainer, batches = build_trainer(spec, rank=rank, world_size=2, local_rank=rank, device=torch.device("cpu"))
        for _ in range(3):  # DDP rebuilds its buckets in the backward order at step 2
            trainer.step(batches)
        for k in range(TRACED_CALLS):
            traced_step(
                lambda: trainer.step(batches),
                trainer=trainer,
                device=torch.device("cpu"),
                sweep_dir=out,
                run_id=f"{name.replace(' ', '-')}-{k}",
                rank=rank,
                world_size=2,
                compiled=False,
                checkpointing=False,
            )
    end_process_group()


def test_one_bucket_exposes_its_communication_small_buckets_hide_some(tmp_path, record_property):
    """With one bucket the all_reduce runs after the backward, with nothing left to compute: (nearly) all of it is
    exposed. With small buckets the first ones run under the rest of the backward: a smaller share of the
    communication is exposed. Compared as the median, over every traced step of both ranks (3 phases of 5 steps,
    30 steps per cap), of the share of the step's communication that was exposed: small buckets also make more
    calls, each with its own latency, so their absolute times are not the same communication.

    Why the median of the steps: on this 2-core host gloo's span of a collective sometimes ends milliseconds after
    the rank's main thread has gone on (its worker thread is descheduled between finishing the transfer and closing
    the span), which makes that step's one-bucket share look small (0.3-0.8 in about one step in ten; it pushed a
    pooled share to 0.61 once). Measured, 6 runs of this test's shape: one bucket's median 0.999-1.000, small
    buckets' 0.36-0.66 (0.62-0.66 with both cores busy with other work). The processes must also exit cleanly
    (harness.worker.teardown): mp.start_processes fails the test on a rank's abort at exit."""
    import torch.multiprocessing as mp

    from harness.worker.meters.profile import analyse_steps

    mp.start_processes(_overlap_rank, args=(free_port(), str(tmp_path)), nprocs=2, start_method="spawn")
    shares: dict[str, list[float]] = {}
    for name in BUCKETS_MB:
        for k in range(TRACED_CALLS):
            folder = tmp_path / "traces" / f"{name.replace(' ', '-')}-{k}"
            for rank in (0, 1):
                doc = json.loads(gzip.decompress((folder / f"rank{rank}.trace.json.gz").read_bytes()))
                for t in analyse_steps(doc, rank=rank, steps_s=[0.0] * TRACED_STEPS):
                    assert t.comm_total > 0 and 0 <= t.comm_exposed <= t.comm_total
                    shares.setdefault(name, []).append(t.comm_exposed / t.comm_total)
    median = {name: statistics.median(v) for name, v in shares.items()}
    assert {name: len(v) for name, v in shares.items()} == {name: TRACED_CALLS * TRACED_STEPS * 2 for name in BUCKETS_MB}
    record_property("exposed_share_median", median)
    print({name: sorted(round(x, 2) for x in v) for name, v in shares.items()}, median)
    assert median["one bucket"] >= 0.8
    assert median["small buckets"] < median["one bucket"]
