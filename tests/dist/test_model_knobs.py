"""Current dense architectures' knobs (issue 53: harness.core.zoo.ModelConfig, read from config.json files by
harness.scenario.hf_config) on real gloo ranks, under every sharding family and, where they compose, tensor and
pipeline parallelism.

Four small models, each a family's combination of knobs: Gemma 2's (sandwich norms, soft-capped attention and
logits, alternating sliding-window layers, head_dim ≠ d_model / heads, tied embeddings, GeGLU, the √d embedding
scale), GPT-2's (LayerNorm, a plain GELU MLP, learned positions, tied head, every bias), OLMo 2's (norms after each
sublayer, qk-norm over the projections) and Phi's (parallel blocks on one LayerNorm, partial rotary, biases, a head
bias). What must hold for each:

- every cell is ok, and the fp32 losses of ddp, fsdp.full_shard, fsdp2.full_shard and zero3 on 2 ranks are equal
  (1e-4 relative; the untied models under ddp and zero3 only, whose module trace their knobs change); Phi's under tp 2 (fsdp2) and pp 2 (ddp) equal its single-rank ddp cell's (the same data-parallel
  degree, 1);
- the collectives the meter counted equal the plan's, to the byte and the call, per collective;
- the measured tensor memory within 5% of the plan's in total, the parameters and optimizer states within 1%.

Knobs that do not compose with a layout are refused before launch (tests/unit/test_layouts.py).
"""

from __future__ import annotations

import pytest

from harness.launch.local import prefork
from harness.scenario.cluster import load_cluster
from harness.scenario.schema import parse_scenario
from harness.scenario.spec import RunSpec
from tests.conftest import assert_comm_is_plans, assert_memory_is_plans, run_cell

pytestmark = pytest.mark.dist

BASE = {"d_model": 64, "n_layers": 2, "n_heads": 4, "ffn": 128, "vocab": 256}
MODELS: dict[str, dict] = {
    "gemma2ish": {**BASE, "n_kv_heads": 2, "head_dim": 24, "norm_place": "sandwich", "attn_softcap": 20.0,
                  "final_softcap": 15.0, "sliding_window": 16, "global_every": 2, "tied_embeddings": True,
                  "act": "gelu_tanh", "embed_scale": True, "norm_eps": 1e-6},
    "gpt2ish": {**BASE, "norm": "layer", "mlp": "plain", "act": "gelu_tanh", "positions": "learned",
                "max_positions": 64, "tied_embeddings": True, "qkv_bias": True, "o_bias": True, "mlp_bias": True},
    "olmo2ish": {**BASE, "norm_place": "post", "qk_norm": "proj", "rope_theta": 500000.0},
    "phiish": {**BASE, "norm": "layer", "norm_place": "parallel", "mlp": "plain", "rope_dims": 8, "qkv_bias": True,
               "o_bias": True, "mlp_bias": True, "head_bias": True},
}  # fmt: skip
STRATEGIES = ("ddp", "fsdp.full_shard", "fsdp2.full_shard", "zero3")


def cell(model: str, strategy: str, gpus: int = 2, **settings) -> RunSpec:
    doc = {
        "name": "t",
        "models": {model: MODELS[model]},
        "matrix": {"model": [model], "strategy": [strategy], "precision": ["fp32"], "gpus": [gpus]},
        "settings": {"micro_batch": 2, "seq_len": 32, "warmup_steps": 2, "measure_steps": 2, **settings},
    }
    (spec,) = parse_scenario(doc, "test").expand(gpus_per_node=2)
    return spec


STRATEGIES_OF = {"gemma2ish": STRATEGIES, "gpt2ish": STRATEGIES, "olmo2ish": ("ddp", "zero3"), "phiish": ("ddp", "zero3")}
"""the tied models under every family (FSDP1 and FSDP2 re-tie a head their own ways); the others where their knobs
change what is planned (DDP's buckets, ZeRO-3's module trace)"""
CELLS = {
    **{f"{m}/{s}": cell(m, s) for m in MODELS for s in STRATEGIES_OF[m]},
    "phiish/ddp-g1": cell("phiish", "ddp", gpus=1),
    "phiish/fsdp2-tp2": cell("phiish", "fsdp2.full_shard", tp=2),
    "phiish/ddp-pp2": cell("phiish", "ddp", pp=2),
}


@pytest.fixture(scope="module")
def records(tmp_path_factory) -> dict[str, dict]:
    results = tmp_path_factory.mktemp("model_knobs") / "results"
    with prefork.zygote(load_cluster("local").env, label="test_model_knobs"):
        return {name: run_cell(spec, results) for name, spec in CELLS.items()}


@pytest.mark.parametrize("model", sorted(MODELS))
def test_every_strategy_trains_the_same_model(model, records):
    first = records[f"{model}/ddp"]
    for s in STRATEGIES_OF[model]:
        rec = records[f"{model}/{s}"]
        assert rec["status"] == "ok", (s, rec.get("reason"))
        assert rec["metrics"]["losses"] == pytest.approx(first["metrics"]["losses"], rel=1e-4), s


@pytest.mark.parametrize("name", ["phiish/fsdp2-tp2", "phiish/ddp-pp2"])
def test_tensor_and_pipeline_parallel_train_the_same_model(name, records):
    rec, single = records[name], records["phiish/ddp-g1"]
    assert rec["status"] == "ok", rec.get("reason")
    assert rec["metrics"]["losses"] == pytest.approx(single["metrics"]["losses"], rel=1e-4)


@pytest.mark.parametrize("name", list(CELLS))
def test_measured_collectives_are_the_plans(name, records):
    assert_comm_is_plans(records[name], CELLS[name])


@pytest.mark.parametrize("name", [n for n in CELLS if "tp2" not in n and "pp2" not in n])
def test_measured_memory_is_the_plans(name, records):
    assert_memory_is_plans(records[name], CELLS[name])
