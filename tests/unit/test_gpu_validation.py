"""The uncalibrated GPU model against published runs (validation/llm_foundry.csv), and its pieces' arithmetic.

No GPU runs here: the figures are the published ones (llm-foundry's A100 tables, in-sample: the attention curve was
fitted on them, bench/fit_gpu_efficiency.py) and the model's predictions of them. A model change that worsens the
in-sample error past the issue's targets fails.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from harness.core.errors import InputError
from harness.plan.calibration import gpu_model
from harness.plan.validation import FIT_TABLES, errors_of, predict_published, read_published

REPO = Path(__file__).resolve().parents[2]
CSV = REPO / "validation" / "llm_foundry.csv"


@pytest.fixture(scope="module")
def fitted():
    return [predict_published(r) for r in read_published(CSV) if r.table in FIT_TABLES]


def test_the_a100_rows_stay_within_the_targets(fitted):
    assert len(fitted) == 139 and all(c.predicted is not None for c in fitted)
    every = errors_of(fitted)
    assert every.mape <= 0.12 and every.spearman >= 0.9
    long = errors_of([c for c in fitted if c.run.seq_len >= 16384])
    multi = errors_of([c for c in fitted if c.run.gpus >= 16])
    assert long.rows == 31 and long.mape <= 0.15
    assert multi.rows == 34 and multi.mape <= 0.15


def test_a_bad_row_names_the_file_the_row_and_the_field(tmp_path):
    lines = CSV.read_text().splitlines()
    bad = lines[1].split(",")
    bad[12] = "eight"  # gpus
    path = tmp_path / "bad.csv"
    path.write_text("\n".join([lines[0], lines[1], ",".join(bad)]) + "\n")
    with pytest.raises(InputError) as e:
        read_published(path)
    assert f"{path}:3: gpus" in str(e.value) and "eight" in str(e.value)


def test_nccl_ring_latency_and_hierarchical_bandwidth():
    intra, inter = (6.6, 0.6, 230.0), (6.6, 2.7, 24.0)
    # one node of 8: base + 2·7 hops (NCCL tuning.cc's Ring/LL on NVLink): 15.0 us
    assert gpu_model.nccl_ring_seconds(
        "all_reduce", ranks=8, nbytes=0, ranks_per_node=8, intra=intra, inter=None
    ) == pytest.approx(15.0e-6)
    # 16 ranks on 2 nodes: 2·15 steps, 2 of them across the network; bandwidth min(230, 8 × 24) = 192 GB/s
    t = gpu_model.nccl_ring_seconds("all_gather", ranks=16, nbytes=1e9, ranks_per_node=8, intra=intra, inter=inter)
    assert t == pytest.approx((6.6 + 14 * 0.6 + 1 * 2.7) * 1e-6 + 1e9 * 15 / 16 / 192e9)
    # one rank per node (a hybrid's replicate group): its own NIC
    t = gpu_model.nccl_ring_seconds("all_reduce", ranks=4, nbytes=1e9, ranks_per_node=1, intra=intra, inter=inter)
    assert t == pytest.approx((6.6 + 6 * 2.7) * 1e-6 + 1e9 * 1.5 / 24e9)
    # a small all_reduce over 128 nodes of 8 takes NCCL's tree: 6.8 + 2(7 · 0.6 + 7 · 5.0) us, not the ring's 2046 steps
    t = gpu_model.nccl_ring_seconds("all_reduce", ranks=1024, nbytes=8, ranks_per_node=8, intra=intra, inter=inter)
    assert t == pytest.approx((6.8 + 2 * (7 * 0.6 + 7 * 5.0)) * 1e-6 + 8 / (0.46 * 192e9))


def test_gemm_roofline_and_attention_curve():
    # a square GEMM is compute bound: its flops at the rate
    t = gpu_model.gemm_seconds(4096, 4096, 4096, tflops=271.2, memory_gbps=1732, element_bytes=2)
    assert t == pytest.approx(2 * 4096**3 / 271.2e12)
    # a thin one (8 tokens) is memory bound: far below the matmul rate
    thin = gpu_model.gemm_seconds(8, 4096, 4096, tflops=271.2, memory_gbps=1732, element_bytes=2)
    assert 2 * 8 * 4096 * 4096 / thin / 1e12 < 15
    assert thin == pytest.approx(2 * (8 * 4096 * 2 + 4096 * 4096) / 1732e9)
    eff = {"attention": 0.42, "attention_seq_half": 64.0, "attention_head_dim_half": 8.0}
    rate = gpu_model.attention_rate_tflops(271.2, seq=2048, head_dim=128, efficiency=eff)
    assert rate == pytest.approx(271.2 * 0.42 * 2048 / 2112 * 128 / 136)
    fwd = gpu_model.attention_seconds(
        batch=1, heads=1, seq=2048, head_dim=128, phase="forward", tflops=271.2, efficiency=eff
    )
    bwd = gpu_model.attention_seconds(
        batch=1, heads=1, seq=2048, head_dim=128, phase="backward", tflops=271.2, efficiency=eff
    )
    assert fwd == pytest.approx(2 * 2048**2 * 128 / (rate * 1e12)) and bwd == pytest.approx(2.5 * fwd)


@pytest.mark.parametrize("profile", ["a100", "a100-40gb", "h100", "h200"])
def test_every_runnable_cell_is_priced_on_every_gpu_profile(profile, tmp_path, capsys):
    """A corner of validation/plan-grid.yaml (the smallest and the largest model, every strategy and precision, one
    node and 128 nodes): a step time, tokens/s and MFU for every cell that can run, the rest null with why."""
    import json

    from harness.cli import main

    scenario = tmp_path / "corner.yaml"
    scenario.write_text(
        "name: corner\nmatrix:\n  model: [125m, 70b]\n  strategy: [ddp, fsdp.full_shard, fsdp.shard_grad_op, "
        "fsdp.no_shard, fsdp.hybrid_shard, fsdp.hybrid_shard_zero2, fsdp2.full_shard, fsdp2.hybrid_shard, zero1, "
        "zero2, zero3]\n  precision: [fp32, bf16, fp16]\n  gpus: [8, 1024]\nsettings:\n  seq_len: 2048\n"
        "  micro_batch: 1\n  activation_checkpointing: full\n"
    )
    assert main(["plan", str(scenario), "--cluster", profile, "--format", "json"]) == 0
    cells = json.loads(capsys.readouterr().out)
    assert len(cells) == 132
    runnable = [c for c in cells if not c["unsupported"]]
    assert len(runnable) == 132 - 2 * 3 * 3  # the three hybrids on one node, per model and precision
    for c in runnable:
        assert c["step_time_s"] > 0 and c["tokens_per_s_per_gpu"] > 0 and 0 < c["mfu"] < 1, c["spec"]
    for c in cells:
        if c["unsupported"]:
            assert c["step_time_s"] is None and "shards inside a node" in c["time_null_reasons"]["step_time_s"]
