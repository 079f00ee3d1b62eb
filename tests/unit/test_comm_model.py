"""The analytic collective model (harness.plan.comm), as arithmetic: shapes, padding, relations between
strategies, group split. Numbers marked "measured" come from real gloo runs (torch 2.13, deepspeed 0.19.8;
tests/dist/test_comm.py and docs/comm.md) and pin the padding rules on a model whose shapes do not divide."""

from __future__ import annotations

import dataclasses

import pytest

from harness.core.zoo import ZOO, ModelConfig, Param, parameters
from harness.plan import predict as planner
from harness.plan.comm import (
    DDP_BUCKET_CAP_BYTES,
    DDP_FIRST_BUCKET_BYTES,
    ddp_buckets,
    fsdp1_flat_numel,
    fsdp2_padded_numel,
    no_comm_model_reason,
    predict_comm,
)
from harness.plan.zero3 import Zero3Config, ds_ipg_buckets, zero3_module_trace, zero3_sub_groups, zero3_trace
from harness.scenario.cluster import load_cluster
from tests.conftest import make_spec

TINY_P = ZOO["tiny"].n_params()  # 166208
# every dimension odd or prime-ish: FSDP1 alignment, FSDP2 dim-0 and DeepSpeed partition padding all show
ODD = ModelConfig(d_model=66, n_layers=2, n_heads=3, ffn=175, vocab=509)
HYBRIDS = ["fsdp.hybrid_shard", "fsdp.hybrid_shard_zero2", "fsdp2.hybrid_shard"]


def spec(strategy, precision="fp32", gpus=None, *, model_config=None, gpus_per_node=2, **settings):
    gpus = gpus or (4 if "hybrid" in strategy else 2)
    s = make_spec(strategy=strategy, precision=precision, gpus=gpus, gpus_per_node=gpus_per_node, **settings)
    return dataclasses.replace(s, model="custom", model_config=model_config) if model_config else s


def total(strategy, precision="fp32", gpus=None, **kw) -> float:
    return predict_comm(spec(strategy, precision, gpus, **kw))["comm_bytes_per_step"]


# --------------------------------------------------------------------------------------------------
# the parameter list is the model's


@pytest.mark.parametrize(
    "cfg",
    [ZOO["tiny"], ODD, ZOO["70b"], ModelConfig(d_model=64, n_layers=3, n_heads=8, ffn=96, vocab=100, n_kv_heads=2)],
    ids=["tiny", "odd", "70b", "gqa"],
)
def test_parameters_match_the_torch_model(cfg):
    pytest.importorskip("torch")
    from harness.worker.models import build_model

    model = build_model(cfg, seed=0, device="meta")
    got = [(n, tuple(p.shape)) for n, p in model.named_parameters()]
    assert got == [(p.name, p.shape) for p in parameters(cfg)]
    assert sum(p.numel for p in parameters(cfg)) == cfg.n_params()


def test_output_contract():
    r = predict_comm(spec("zero3", "bf16"))
    assert set(r) >= {"comm_bytes_per_step", "bytes_per_step", "calls_per_step", "by_collective", "by_group", "notes"}
    assert r["bytes_per_step"] == r["comm_bytes_per_step"]  # harness.plan.predict reads `bytes_per_step`
    for c in r["by_collective"].values():
        assert set(c) >= {"calls", "bytes", "dtype"}
    assert sum(c["bytes"] for c in r["by_collective"].values()) == r["comm_bytes_per_step"]
    assert sum(g["bytes"] for g in r["by_group"].values()) == r["comm_bytes_per_step"]
    assert sum(i["bytes"] for i in r["items"]) == r["comm_bytes_per_step"]
    assert sum(c["calls"] for c in r["by_collective"].values()) == r["calls_per_step"]


def test_planner_fills_predicted_comm():
    s = spec("fsdp.full_shard", "bf16")
    assert planner.predict(s, load_cluster("local")).comm_bytes_per_step == predict_comm(s)["comm_bytes_per_step"]


# --------------------------------------------------------------------------------------------------
# DDP


@pytest.mark.parametrize("gpus", [2, 4, 8])
@pytest.mark.parametrize("precision", ["fp32", "bf16", "fp16"])
def test_ddp_is_one_all_reduce_of_fp32_gradients(gpus, precision):
    r = predict_comm(spec("ddp", precision, gpus, gpus_per_node=8))
    assert r["comm_bytes_per_step"] == 4 * TINY_P == 664832
    assert r["calls_per_step"] == 1  # 650 KiB fit the 1 MiB first bucket
    assert r["by_collective"]["all_reduce"]["dtype"] == "float32"


def test_ddp_buckets_at_scale():
    cfg = ZOO["1.3b"]
    r = predict_comm(spec("ddp", "bf16", 8, gpus_per_node=8, model_config=cfg))
    assert r["comm_bytes_per_step"] == 4 * cfg.n_params()
    sizes = [p.numel * 4 for p in reversed(parameters(cfg))]
    buckets = ddp_buckets(sizes)
    assert sum(buckets) == 4 * cfg.n_params() and r["calls_per_step"] == len(buckets)
    assert buckets[0] >= DDP_FIRST_BUCKET_BYTES and all(b >= DDP_BUCKET_CAP_BYTES for b in buckets[1:-1])
    # the head (262 MB) closes the first bucket alone; 25 MiB buckets thereafter
    assert buckets[0] == 32000 * 2048 * 4
    assert 4 * cfg.n_params() / DDP_BUCKET_CAP_BYTES * 0.5 < len(buckets) < 4 * cfg.n_params() / DDP_BUCKET_CAP_BYTES


def test_ddp_gradient_accumulation_reduces_once():
    assert total("ddp", grad_accum=4, micro_batch=1) == 4 * TINY_P


# --------------------------------------------------------------------------------------------------
# FSDP1 / FSDP2: padding and per-strategy structure


def test_fsdp1_flat_padding_rule():
    unit = [Param("a", (3,), "u"), Param("b", (5,), "u")]
    # fp32: align 4 elements -> 3 + 1 pad + 5 = 9 -> world 2 -> 10
    assert fsdp1_flat_numel(unit, shard_size=2, param_dtype_bytes=4) == 10
    # bf16 forward dtype: align 8 elements -> 3 + 5 pad + 5 = 13 -> 14
    assert fsdp1_flat_numel(unit, shard_size=2, param_dtype_bytes=2) == 14
    # no padding after the last parameter except to the world
    assert fsdp1_flat_numel([Param("a", (8,), "u")], shard_size=3, param_dtype_bytes=4) == 9


def test_fsdp2_pads_dim0_to_the_shard_group():
    assert fsdp2_padded_numel(Param("w", (509, 66), "u"), shard_size=2) == 510 * 66
    assert fsdp2_padded_numel(Param("w", (509, 66), "u"), shard_size=4) == 512 * 66
    assert fsdp2_padded_numel(Param("n", (66,), "u"), shard_size=4) == 68


def test_tiny_has_no_padding_anywhere():
    # every dimension of tiny is a multiple of 8: the measured tables for tiny are the unpadded formulas
    P = TINY_P
    root = 2 * 512 * 64 + 64
    block = (P - root) // 2
    assert total("fsdp.full_shard") == 4 * (root + 4 * block) + 4 * P
    assert total("fsdp.full_shard", "bf16") == 2 * (root + 4 * block) + 4 * P
    assert total("fsdp.shard_grad_op") == 4 * P + 4 * P
    assert total("fsdp.no_shard", "bf16") == 4 * P
    assert total("fsdp2.full_shard") == 2 * 4 * P + 4 * P
    assert total("fsdp2.full_shard", "bf16") == 2 * 2 * P + 4 * P


@pytest.mark.parametrize(
    "strategy,precision,measured",
    [
        ("ddp", "fp32", 686664),
        ("fsdp.full_shard", "fp32", 1791200),
        ("fsdp.full_shard", "bf16", 1239404),
        ("fsdp.shard_grad_op", "fp32", 1373488),
        ("fsdp.shard_grad_op", "bf16", 1030452),
        ("fsdp.no_shard", "fp32", 686744),
        ("fsdp.no_shard", "bf16", 686968),
        ("fsdp2.full_shard", "fp32", 2064744),
        ("fsdp2.full_shard", "bf16", 1376496),
        ("zero1", "fp32", 1373340),
        ("zero1", "bf16", 686673),
        ("zero2", "bf16", 686673),
        ("zero3", "fp32", 1373336),
        ("zero3", "bf16", 686672),
        ("fsdp.hybrid_shard", "fp32", 2134572),
        ("fsdp.hybrid_shard", "bf16", 1582888),
        ("fsdp.hybrid_shard_zero2", "bf16", 1373936),
        ("fsdp2.hybrid_shard", "fp32", 2408868),
        ("fsdp2.hybrid_shard", "bf16", 1720620),
    ],
)
def test_padding_matches_measured_odd_model(strategy, precision, measured):
    """The odd model (d 66, ffn 175, vocab 509) measured on gloo at world 2 (hybrids 4 = 2x2)."""
    assert total(strategy, precision, model_config=ODD) == measured


@pytest.mark.parametrize(
    "strategy,gpus,precision,measured",
    [
        ("ddp", 3, "fp32", 686664),
        ("fsdp.full_shard", 3, "fp32", 1791240),
        ("fsdp.full_shard", 3, "bf16", 1239420),
        ("fsdp2.full_shard", 3, "fp32", 2067912),
        ("zero2", 3, "bf16", 686669),
        ("zero3", 3, "fp32", 1373336),
    ],
)
def test_padding_matches_measured_odd_model_world3(strategy, gpus, precision, measured):
    """The odd model measured at world 3 (every dimension padded to 3)."""
    assert total(strategy, precision, gpus, model_config=ODD, gpus_per_node=2) == measured


@pytest.mark.parametrize(
    "strategy,measured,calls",
    [
        ("ddp", 4 * TINY_P, 1),
        ("fsdp.full_shard", 4 * TINY_P, 3),
        ("fsdp2.full_shard", 0, 0),
        ("zero1", 4 * TINY_P + 4, 2),
        ("zero3", 4 * TINY_P + 8, 2),
    ],
)
def test_world_one_measured(strategy, measured, calls):
    """World 1, measured: DDP and DeepSpeed still reduce on the one-rank group, FSDP1 runs as NO_SHARD,
    FSDP2 issues nothing."""
    r = predict_comm(spec(strategy, "fp32", 1, gpus_per_node=1))
    assert (r["comm_bytes_per_step"], r["calls_per_step"]) == (measured, calls)
    assert set(r["by_group"]) <= {"self"}


def test_full_shard_gathers_twice_shard_grad_op_once():
    # FSDP1 FULL_SHARD: root once (not resharded after forward), Blocks twice; SHARD_GRAD_OP: once each
    r_fs = predict_comm(spec("fsdp.full_shard"))["by_collective"]
    r_sgo = predict_comm(spec("fsdp.shard_grad_op"))["by_collective"]
    assert r_fs["all_gather"]["calls"] == 1 + 2 * 2 and r_sgo["all_gather"]["calls"] == 3
    assert r_fs["reduce_scatter"] == r_sgo["reduce_scatter"]
    # FSDP2 with reshard_after_forward=True everywhere: the root is gathered twice too
    assert predict_comm(spec("fsdp2.full_shard"))["by_collective"]["all_gather"]["calls"] == 6


def test_gradient_accumulation_structure():
    # FULL_SHARD gathers every micro-step, reduces once; SHARD_GRAD_OP keeps parameters across no_sync
    fs1 = predict_comm(spec("fsdp.full_shard"))["by_collective"]
    fs4 = predict_comm(spec("fsdp.full_shard", grad_accum=4, micro_batch=1))["by_collective"]
    assert fs4["all_gather"]["bytes"] == 4 * fs1["all_gather"]["bytes"]
    assert fs4["reduce_scatter"] == fs1["reduce_scatter"]
    assert total("fsdp.shard_grad_op", grad_accum=4, micro_batch=1) == total("fsdp.shard_grad_op")
    # ZeRO-1 reduces at the boundary, ZeRO-2 every micro-step
    z1 = predict_comm(spec("zero1", grad_accum=4, micro_batch=1))["by_collective"]["all_reduce"]["bytes"]
    z2 = predict_comm(spec("zero2", grad_accum=4, micro_batch=1))["by_collective"]["all_reduce"]["bytes"]
    assert z1 == 4 * TINY_P + 4 and z2 == 4 * 4 * TINY_P + 4


# --------------------------------------------------------------------------------------------------
# hybrids: intra / inter split


@pytest.mark.parametrize("strategy", HYBRIDS)
@pytest.mark.parametrize("gpus,gpn", [(4, 2), (16, 8), (64, 8)])
def test_hybrid_inter_node_traffic_is_the_fp32_gradient_shard(strategy, gpus, gpn):
    r = predict_comm(spec(strategy, "bf16", gpus, gpus_per_node=gpn))
    rs = r["by_collective"]["reduce_scatter"]["bytes"]
    assert r["by_group"]["inter"]["bytes"] == rs / gpn == r["by_collective"]["all_reduce"]["bytes"]
    assert r["by_group"]["intra"]["bytes"] == r["by_collective"]["all_gather"]["bytes"] + rs
    # the shard group is the node: hybrid traffic inside a node equals the non-hybrid strategy at world gpn
    flat = {
        "fsdp.hybrid_shard": "fsdp.full_shard",
        "fsdp.hybrid_shard_zero2": "fsdp.shard_grad_op",
        "fsdp2.hybrid_shard": "fsdp2.full_shard",
    }[strategy]
    assert r["by_group"]["intra"]["bytes"] == total(flat, "bf16", gpn, gpus_per_node=gpn)


def test_non_hybrid_across_nodes_is_mixed():
    r = predict_comm(spec("fsdp.full_shard", gpus=4, gpus_per_node=2))
    assert set(r["by_group"]) == {"mixed"}
    assert set(predict_comm(spec("ddp", gpus=1, gpus_per_node=1))["by_group"]) == {"self"}


# --------------------------------------------------------------------------------------------------
# DeepSpeed


def test_zero12_bytes():
    P = TINY_P
    # fp32: gradients all_reduced whole + grad norm (fp32) + all_gather of the flat buffer
    assert total("zero1") == total("zero2") == 4 * P + 4 + 4 * P
    # bf16: everything in bf16, plus the overflow flag (uint8)
    r = predict_comm(spec("zero2", "bf16"))
    assert r["comm_bytes_per_step"] == 2 * P + 1 + 4 + 2 * P
    assert r["by_collective"]["all_reduce"]["dtypes"] == {"bfloat16": 2 * P, "uint8": 1, "float32": 4}
    assert r["calls_per_step"] == 4


def test_ds_buckets():
    assert ds_ipg_buckets([3, 3, 3], cap=6) == [[0, 1], [2]]
    assert ds_ipg_buckets([7, 1], cap=6) == [[0], [1]]  # an oversized gradient is its own bucket
    cfg = ZOO["7b"]
    r = predict_comm(spec("zero2", "bf16", 8, gpus_per_node=8, model_config=cfg))
    grads = r["by_collective"]["all_reduce"]["dtypes"]["bfloat16"]
    assert grads == 2 * cfg.n_params()
    assert r["by_collective"]["all_reduce"]["calls"] - 2 == len(ds_ipg_buckets([p.numel for p in parameters(cfg)]))


def test_zero3_tiny_is_all_persistent():
    # every tiny parameter has <= 1e5 elements: resident in forward and backward, gathered once after the step
    P = TINY_P
    r = predict_comm(spec("zero3", "bf16"))
    assert r["by_collective"]["all_gather"] == {
        "calls": 21,
        "bytes": 2 * P,
        "dtypes": {"bfloat16": 2 * P},
        "dtype": "bfloat16",
    }
    assert r["by_collective"]["reduce_scatter"]["bytes"] == 2 * P and r["by_collective"]["reduce_scatter"]["calls"] == 1
    assert r["by_collective"]["all_reduce"]["dtypes"] == {"float64": 8}
    assert r["comm_bytes_per_step"] == 2 * P + 2 * P + 8


def test_zero3_vs_full_shard():
    # mid-size model, nothing beyond the reuse distance: ZeRO-3 gathers the non-persistent parameters once
    # (forward) and the persistent ones after the step — one full copy per step, like SHARD_GRAD_OP;
    # FULL_SHARD gathers twice. Gradients: a reduce_scatter of the whole model either way.
    mid = ModelConfig(d_model=384, n_layers=2, n_heads=6, ffn=1024, vocab=1024)
    P = mid.n_params()
    z3 = predict_comm(spec("zero3", "bf16", model_config=mid))["by_collective"]
    fs = predict_comm(spec("fsdp.full_shard", "bf16", model_config=mid))["by_collective"]
    sgo = predict_comm(spec("fsdp.shard_grad_op", "bf16", model_config=mid))["by_collective"]
    assert z3["all_gather"]["bytes"] == 2 * P == sgo["all_gather"]["bytes"]
    assert fs["all_gather"]["bytes"] > 1.5 * 2 * P
    assert z3["reduce_scatter"]["bytes"] == 2 * P  # bf16: DeepSpeed reduces in the model dtype
    assert fs["reduce_scatter"]["bytes"] == 4 * P  # FSDP reduces in fp32
    # (a 5e7-element prefetch covers this whole trace at the first module and marks every reuse: kept)
    # without reuse window and prefetch every non-persistent parameter is gathered again in backward
    tr = zero3_trace(mid, conf=Zero3Config(max_reuse_distance=0, prefetch_bucket=0))
    big = [i for i, p in enumerate(parameters(mid)) if p.numel > 100_000]
    assert sorted(tr.regathered) == big


MID = ModelConfig(d_model=384, n_layers=2, n_heads=6, ffn=1024, vocab=1024)


@pytest.mark.parametrize(
    "model,knobs,checkpointing,measured,calls",
    [
        (MID, {}, False, 34618376, 8),
        (MID, {}, True, 34618376, 8),
        (MID, {"max_reuse_distance": 2_000_000, "prefetch_bucket": 300_000}, False, 38550536, 19),
        (MID, {"max_reuse_distance": 5_000_000, "prefetch_bucket": 0}, False, 41696264, 30),
        (MID, {"max_reuse_distance": 5_000_000, "prefetch_bucket": 0}, True, 43269128, 31),
        (MID, {"max_reuse_distance": 8_000_000, "prefetch_bucket": 300_000}, False, 34618376, 17),
        (MID, {"max_reuse_distance": 8_000_000, "prefetch_bucket": 300_000}, True, 38550536, 19),
        (
            ZOO["tiny"],
            {"persistence_threshold": 1000, "max_reuse_distance": 60_000, "prefetch_bucket": 10_000},
            False,
            1526280,
            19,
        ),
    ],
)
def test_zero3_coordinator_simulation_matches_measured(monkeypatch, model, knobs, checkpointing, measured, calls):
    """ZeRO-3 fp32 at world 2, measured on gloo with DeepSpeed's stage3_* knobs lowered (a diagnostic config,
    not the harness's) so that releases after forward, re-gathers in backward, prefetch batching and the
    recomputed forward of activation checkpointing all show on a CPU-sized model."""
    import harness.plan.comm as cm

    monkeypatch.setattr(cm, "ZERO3", cm.Zero3Config(**knobs))
    r = predict_comm(spec("zero3", "fp32", model_config=model, activation_checkpointing=checkpointing))
    assert (r["comm_bytes_per_step"], r["calls_per_step"]) == (measured, calls)


def test_zero3_sub_groups():
    assert zero3_sub_groups([5, 5, 5], sub_group_size=6) == 2 and zero3_sub_groups([5, 5, 5], sub_group_size=100) == 1
    cfg = ZOO["70b"]
    r = predict_comm(spec("zero3", "bf16", 8, gpus_per_node=8, model_config=cfg))
    norms = r["by_collective"]["all_reduce"]["calls"]
    assert 8 <= norms <= 9  # ~69e9 / 8 ranks in >= 1e9-element sub-groups


def test_zero3_reuse_distance_at_scale():
    # 1.3b: ~2.7e9 elements of trace; parameters whose backward use lies > 1e9 elements ahead are released
    # after forward and gathered again — the early ones (embedding, first blocks), not the last blocks
    cfg = ZOO["1.3b"]
    ps = parameters(cfg)
    tr = zero3_trace(cfg)
    names = {ps[i].name for i in tr.regathered}
    assert "tok_emb.weight" in names and "blocks.0.mlp.w2.weight" in names
    assert "head.weight" not in names and f"blocks.{cfg.n_layers - 1}.attn.wq.weight" not in names
    assert all(ps[i].numel > 100_000 for i in tr.regathered)
    gathered_fwd = {i for ph, idx in tr.gathers if ph == "forward" for i in idx}
    assert gathered_fwd == {i for i, p in enumerate(ps) if p.numel > 100_000}


def test_zero3_module_trace_shape():
    P = len(parameters(ZOO["tiny"]))
    fwd, bwd = zero3_module_trace(ZOO["tiny"])
    assert [pi for _, own in fwd for pi in own] == list(range(P))  # forward uses = registration order
    assert sorted(pi for _, own in bwd for pi in own) == list(range(P))
    assert fwd[0] == bwd[0] == ("model", ()) and bwd[1] == ("head", (P - 1,)) and bwd[-1] == ("tok_emb", (0,))
    assert [m for m, _ in bwd[3:16]] == [
        "blocks.1", "blocks.1.mlp", "blocks.1.mlp.w2", "blocks.1.mlp.w3", "blocks.1.mlp.w1", "blocks.1.mlp_norm",
        "blocks.1.attn", "blocks.1.attn.wo", "blocks.1.attn.wv", "blocks.1.attn.wk", "blocks.1.attn.wq",
        "blocks.1.attn_norm", "blocks.0",
    ]  # fmt: skip
    # checkpointing: each block's forward runs again inside backward
    fwd_c, bwd_c = zero3_module_trace(ZOO["tiny"], checkpointing=True)
    assert len([m for m in bwd_c if m[1]]) == P + (P - 3)


def test_zero3_module_trace_of_every_knob():
    """Biases and norms with biases are fetched with their module's weight (one call); a tied head fetches the
    embedding's weight; every parameter is used once per forward, in registration order."""
    cfg = ModelConfig(**{**ZOO["tiny"].to_dict(), "qkv_bias": True, "norm": "layer", "tied_embeddings": True})
    ps = parameters(cfg)
    fwd, bwd = zero3_module_trace(cfg)
    own = dict(fwd)
    assert [ps[i].name for i in own["blocks.0.attn.wq"]] == ["blocks.0.attn.wq.weight", "blocks.0.attn.wq.bias"]
    assert [ps[i].name for i in own["blocks.0.attn_norm"]] == ["blocks.0.attn_norm.weight", "blocks.0.attn_norm.bias"]
    assert own["head"] == (0,) and "head.weight" not in {p.name for p in ps}
    assert [pi for m, o in fwd if m != "head" for pi in o] == list(range(len(ps)))


# --------------------------------------------------------------------------------------------------


def test_unmodelled_combinations_return_none_with_a_reason():
    for s in (
        spec("zero2", offload="optimizer"),
        spec("zero3", offload="optimizer+params"),
        spec("fsdp.hybrid_shard", gpus=2, gpus_per_node=1),
        spec("fsdp.hybrid_shard", gpus=2),
    ):
        assert predict_comm(s) is None and no_comm_model_reason(s)
    assert predict_comm(spec("zero1", "fp16")) is not None  # fp16 DeepSpeed runs on GPUs
    # FSDP1 CPU offload: same collectives (not measurable on this machine)
    assert total("fsdp.full_shard", offload="optimizer+params") == total("fsdp.full_shard")


@pytest.mark.parametrize(
    "strategy,measured",
    [("ddp", 664832), ("fsdp.full_shard", 1198468), ("fsdp2.full_shard", 1329668), ("fsdp.hybrid_shard", 1530884)],
)
def test_fp16_measured(strategy, measured):
    """fp16 on gloo, measured: as bf16, plus ShardedGradScaler's found_inf all_reduce (4 bytes) for FSDP."""
    assert total(strategy, "fp16") == measured
