"""harness.plan.time for tensor- and pipeline-parallel cells (docs/time-model.md: layouts), and the planner's caches:
a cached prediction equals a cold one. Rates come from profile figures written here (round numbers), or the synthetic
calibration of harness.plan.calibration.example_calibration; never this machine's."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from harness.core.zoo import ZOO
from harness.plan import calibration as cal
from harness.plan import compute as cp
from harness.plan import layout_time as lt
from harness.plan import predict as planner
from harness.plan import time as tm
from harness.plan.layouts import layout_collectives
from harness.scenario.cluster import load_cluster
from harness.scenario.performance import LinkFigures, Performance
from tests.conftest import make_spec

LAT_INTRA_S, BW_INTRA = 10e-6, 400.0  # the test profile: 10 us, 400 GB/s inside a node
LAT_INTER_S, BW_INTER = 20e-6, 40.0  # 20 us, 40 GB/s across nodes


def profile(**perf) -> object:
    """The h100 profile (8 GPUs per node, SLURM) with every figure the model needs, round numbers."""
    figures = dict(
        matmul_tflops={"bf16": 800.0, "fp32": 50.0},
        memory_gbps=2000.0,
        intra_node=LinkFigures(busbw_gbps=BW_INTRA, latency_us=LAT_INTRA_S * 1e6),
        inter_node=LinkFigures(busbw_gbps=BW_INTER, latency_us=LAT_INTER_S * 1e6),
        sources={"all": "round numbers for a test"},
    )
    figures.update(perf)
    return dataclasses.replace(load_cluster("h100"), performance=Performance(**figures))


def layout_spec(**kw):
    base = dict(strategy="fsdp2.full_shard", precision="bf16", model="1.3b", gpus_per_node=8, micro_batch=8)
    return make_spec(**{**base, "seq_len": 1024, **kw})


# ---- tensor parallelism


def test_tp_collectives_are_bytes_over_busbw_plus_latency_and_exposed():
    cluster = profile()
    rates = cal.ProfileRates(cluster)
    # one node, tp 8, dp 1: FSDP2 has a one-rank shard group (no collective); only TP's
    spec = layout_spec(gpus=8, tp=8, micro_batch=1)
    cfg = ZOO["1.3b"]
    x = 1 * 1024 * cfg.d_model * 2  # one (tokens, d_model) bf16 activation: 4,194,304 B
    factor = 2 * 7 / 8  # all_reduce on 8 ranks
    one = LAT_INTRA_S + x * factor / (BW_INTRA * 1e9)
    assert one == pytest.approx(28.35e-6, rel=1e-3)
    # per forward: 2 per block forward (o, down) + 5 backward (q, k, v, gate, up) + embedding + head = 7 L + 2;
    # loss parallel: 3 fp32 values per token
    expected = (7 * cfg.n_layers + 2) * one + 3 * (LAT_INTRA_S + 1024 * 4 * factor / (BW_INTRA * 1e9))
    for overlap in (True, False):
        pred = tm.predict_time(spec, cluster, rates, overlap=overlap).to_dict()
        t = pred["time_s"]
        assert t["comm_total"] == pytest.approx(expected, rel=1e-12)
        assert t["comm_exposed"] == t["comm_total"]  # TP's collectives are on the critical path: never hidden
        parts = [t[k] for k in ("compute", "recompute", "optimizer", "comm_exposed", "other")]
        assert pred["step_time_s"] == pytest.approx(sum(parts), rel=1e-12)


def test_tp_splits_the_matmuls():
    cluster = profile()
    rates = cal.ProfileRates(cluster)
    one = cp.micro_step_compute(layout_spec(gpus=8, tp=1), rates)
    eight = cp.micro_step_compute(layout_spec(gpus=8, tp=8), rates)
    # ProfileRates price a GEMM at 800 TFLOPS whatever its shape: the block's matmul time divides by tp exactly
    cfg = ZOO["1.3b"]
    tokens = 8 * 1024
    block_mm = sum(6 * tokens * o * i for _, o, i in cp.block_linears(cfg)) / 800e12
    block_mm8 = sum(6 * tokens * o * i for _, o, i in cp.tp_linears(cfg, 8)) / 800e12
    assert block_mm8 == pytest.approx(block_mm / 8, rel=1e-12)
    # the rest of the block (attention ÷ 8, elementwise partly) shrinks too, but less than 8x
    assert one.block_fwd / 8 < eight.block_fwd < one.block_fwd


def test_tp_with_data_parallel_across_nodes_uses_both_links():
    cluster = profile()
    rates = cal.ProfileRates(cluster)
    spec = layout_spec(gpus=16, tp=8)  # dp 2 across two nodes
    items, _ = layout_collectives(spec, ddp_buckets=lambda sizes: sizes)
    kinds = {(it.role, it.group, it.ranks) for it in items}
    assert ("tp", "intra", 8) in kinds and ("dp", "inter", 2) in kinds
    lc = lt.layout_comm(spec, cluster, rates)
    dp = sum(c.seconds * n for c, n in lc.dp)
    expected = sum(
        it.calls * (LAT_INTER_S + it.bytes_per_call * cal.bus_factor(it.collective, 2) / (BW_INTER * 1e9))
        for it in items
        if it.role == "dp"
    )
    assert dp == pytest.approx(expected, rel=1e-12)
    off = tm.predict_time(spec, cluster, rates, overlap=False).to_dict()["time_s"]
    on = tm.predict_time(spec, cluster, rates).to_dict()["time_s"]
    assert off["comm_exposed"] == pytest.approx(off["comm_total"], rel=1e-12)
    assert on["comm_total"] == pytest.approx(off["comm_total"], rel=1e-12)
    assert lc.tp <= on["comm_exposed"] < off["comm_exposed"]  # FSDP2's gathers hide behind compute, TP's do not


# ---- pipeline parallelism


def test_bubble_fraction_formula():
    assert lt.bubble_fraction(8, 4) == pytest.approx(3 / 11)  # (pp - 1) / (m + pp - 1)
    assert lt.bubble_fraction(4, 2) == pytest.approx(1 / 5)
    assert lt.bubble_fraction(4, 4, virtual=2) == pytest.approx(3 / 11)  # (pp - 1) / (v m + pp - 1)
    assert lt.pipeline_weights(8, 4, 1) == (8.0, 0.75)


@pytest.mark.parametrize("schedule,virtual", [("gpipe", 1), ("1f1b", 1), ("interleaved_1f1b", 2)])
def test_pipeline_step_is_m_times_the_slowest_rank_plus_the_bubble(schedule, virtual):
    cluster = profile()
    rates = cal.ProfileRates(cluster)
    spec = layout_spec(model="7b", gpus=32, pp=4, pp_schedule=schedule, microbatches=8)
    step = lt.layout_parts(spec, cluster, rates, overlap=True)
    parts = step.parts
    T, m, pp = step.rank_s, step.microbatches, 4
    assert m == 8 and len(T) == pp
    pipeline = m * max(T) + (pp - 1) / virtual * sum(T) / pp
    busy = parts["compute"] + parts["recompute"] + parts["other"]
    rest = parts["comm_exposed"] + parts["optimizer"] + busy - pipeline  # the data-parallel tail and the optimizer
    assert rest > 0
    assert step.bubble_s == pytest.approx((pp - 1) / virtual * sum(T) / pp, rel=1e-12)
    # 7b's 32 blocks split evenly; the first and last stages carry the embedding and the head: near balance, the
    # idle share is the textbook (pp - 1) / (v m + pp - 1)
    assert step.bubble_s / pipeline == pytest.approx(lt.bubble_fraction(m, pp, virtual), rel=0.05)
    pred = tm.predict_time(spec, cluster, rates).to_dict()
    assert pred["step_time_s"] == pytest.approx(sum(parts[k] for k in tm.PARTS if k != "comm_total"), rel=1e-12)


def test_more_microbatches_shrink_the_bubble():
    cluster = profile()
    rates = cal.ProfileRates(cluster)
    steps = [
        tm.predict_time(layout_spec(model="7b", gpus=32, pp=4, microbatches=m), cluster, rates).to_dict()["step_time_s"]
        for m in (4, 8)
    ]
    # same tokens per step; per microbatch half the work: (4 + 3) T vs (8 + 3) T / 2 (plus fixed per-step parts)
    assert steps[1] < steps[0]
    gpipe = tm.predict_time(layout_spec(model="7b", gpus=32, pp=4, pp_schedule="gpipe"), cluster, rates).to_dict()
    one_f = tm.predict_time(layout_spec(model="7b", gpus=32, pp=4, pp_schedule="1f1b"), cluster, rates).to_dict()
    assert gpipe["step_time_s"] == one_f["step_time_s"]  # same bubble; they differ in memory, not time


def test_pipeline_receives_are_priced_as_two_rank_transfers():
    cluster = profile()
    rates = cal.ProfileRates(cluster)
    assert rates.p2p_s(link="inter", nbytes=40e9, dtype="bfloat16") == pytest.approx(LAT_INTER_S + 1.0)
    spec = layout_spec(model="7b", gpus=32, pp=4)  # a stage per node: the pipeline's links are inter-node
    lc = lt.layout_comm(spec, cluster, rates, pp_rank=1)
    x = (8 // 4) * 1024 * 4096 * 2  # a microbatch's (tokens, d_model) bf16 activation
    # a middle stage receives its input and its output's gradient per microbatch: 2 x 4 microbatches
    assert lc.recv == pytest.approx(8 * (LAT_INTER_S + x / (BW_INTER * 1e9)), rel=1e-12)


# ---- nulls


def test_layout_cells_that_are_not_modelled_say_why(tmp_path, monkeypatch):
    cluster = profile()
    rates = cal.ProfileRates(cluster)
    # activation checkpointing under TP is modelled (issue 49): its recompute's collectives cost time
    plain, ckpt = (layout_spec(gpus=8, tp=8, activation_checkpointing=p) for p in ("none", "full"))
    t_plain, t_ckpt = (tm.predict_time(s, cluster, rates).to_dict()["step_time_s"] for s in (plain, ckpt))
    assert t_plain is not None and t_ckpt is not None and t_ckpt > t_plain
    no_memory = profile(memory_gbps=None)
    pred = tm.predict_time(layout_spec(gpus=8, tp=8), no_memory, cal.ProfileRates(no_memory)).to_dict()
    assert pred["step_time_s"] is None and "memory_gbps" in pred["time_null_reasons"]["step_time_s"]
    # a CPU host: DTensor's and the schedule's host work is not calibrated
    monkeypatch.setenv(cal.CALIBRATION_DIR_ENV, str(tmp_path))
    local = load_cluster("local")
    cpu = cal.CalibratedRates(cal.Found(Path("x.json"), cal.example_calibration("local"), None))
    for kw in (dict(tp=2), dict(pp=2)):
        spec = make_spec(strategy="fsdp2.full_shard", gpus=2, gpus_per_node=2, **kw)
        pred = tm.predict_time(spec, local, cpu).to_dict()
        assert pred["step_time_s"] is None and pred["time_null_reasons"]["step_time_s"] == lt.LAYOUT_ON_CPU


# ---- the default layout is unchanged


# (model, strategy, checkpointing, step_time_s, comm_exposed, step_time_s without overlap) of bf16 cells at 16 GPUs
# (2 nodes of 8), micro_batch 2 x 1024, grad_accum 2, on h100 with example_calibration(tflops=400): computed with the
# model before tensor and pipeline parallelism were added to it (commit a672ec4)
BEFORE = [
    ("125m", "ddp", "none", 5.2856108315712405, 1.7239386960294807, 6.130211379636523),
    ("125m", "fsdp.full_shard", "full", 5.637355834912449, 2.48104857085613, 7.781623105620864),
    ("125m", "zero3", "none", 3.8248776435311944, 1.2406291559894342, 4.562805236064597),
    ("1.3b", "ddp", "full", 42.06932772395216, 17.724042746364976, 49.36457901185232),
    ("1.3b", "fsdp2.hybrid_shard", "none", 32.43936462318846, 21.226066178936303, 42.02184973927087),
    ("1.3b", "zero2", "full", 27.215586484040717, 13.13232396405352, 27.215586484040717),
    ("1.3b", "zero3", "full", 25.147012134425253, 11.063749614438056, 36.0470253229784),
]


def test_tp1_pp1_predictions_are_unchanged():
    cluster = load_cluster("h100")
    data = cal.example_calibration("h100", device="cuda", tflops=400)
    rates = cal.CalibratedRates(cal.Found(Path("h100.json"), data, None))
    for model, strategy, ckpt, step, exposed, no_overlap in BEFORE:
        spec = make_spec(
            strategy=strategy, precision="bf16", gpus=16, model=model, gpus_per_node=8, micro_batch=2,
            seq_len=1024, grad_accum=2, activation_checkpointing=ckpt,
        )  # fmt: skip
        pred = tm.predict_time(spec, cluster, rates).to_dict()
        # NOTE: equal to the last bits but for summation order (the root's elementwise bytes are added up before
        # they are priced, since every elementwise byte is priced at one operand size)
        assert pred["step_time_s"] == pytest.approx(step, rel=1e-12)
        assert pred["time_s"]["comm_exposed"] == pytest.approx(exposed, rel=1e-12)
        no = tm.predict_time(spec, cluster, rates, overlap=False).to_dict()["step_time_s"]
        assert no == pytest.approx(no_overlap, rel=1e-12)


# ---- caches


def test_cached_predictions_equal_cold_ones(tmp_path, monkeypatch):
    """A spread of cells (every strategy family, both precisions, 1 to 64 GPUs, checkpointing, accumulation, TP and
    PP layouts), predicted one after another with the planner's caches filling, equals each predicted alone from
    empty caches."""
    monkeypatch.setenv(cal.CALIBRATION_DIR_ENV, str(tmp_path))
    cluster = profile()
    specs = []
    for i, strategy in enumerate(
        ["ddp", "fsdp.full_shard", "fsdp.shard_grad_op", "fsdp.hybrid_shard", "fsdp2.full_shard", "zero1", "zero3"]
    ):
        for gpus in (1, 8, 16, 64):
            kw = dict(activation_checkpointing=("none", "full")[i % 2], grad_accum=1 + gpus % 3)
            spec = make_spec(strategy=strategy, precision=("bf16", "fp32")[gpus % 2], gpus=gpus, model="125m",
                             gpus_per_node=8, micro_batch=2, seq_len=512, **kw)  # fmt: skip
            if spec.unsupported_reason() is None:
                specs.append(spec)
    specs += [
        layout_spec(gpus=16, tp=8),
        layout_spec(gpus=16, tp=4, sequence_parallel=True),
        layout_spec(gpus=32, pp=4, pp_schedule="interleaved_1f1b"),
        layout_spec(gpus=32, tp=2, pp=2, strategy="fsdp2.hybrid_shard"),
        layout_spec(gpus=16, pp=2, strategy="ddp"),
    ]
    assert len(specs) > 25
    rates = cal.ProfileRates(cluster)
    planner.clear_caches()
    warm = [
        planner.predict(s, cluster, rates=rates).to_dict() for s in specs + specs
    ]  # the second pass hits every cache
    for i, spec in enumerate(specs):
        planner.clear_caches()
        cold = planner.predict(spec, cluster, rates=rates).to_dict()
        assert cold == warm[i] == warm[len(specs) + i], spec.run_id
    assert sum(1 for p in warm if p["step_time_s"] is not None) >= 20
