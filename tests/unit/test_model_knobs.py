"""The decoder's knobs (harness.core.zoo.ModelConfig) through scenario validation and the planner: canonical
forms keep run_ids, layouts that cannot shard a knob are refused with the reason, every current config.json
plans on a GPU profile with a time (the parameter counts, FLOPs and activations are held to transformers and to
torch in test_transformers_parity.py and test_model_budget.py; the bytes on gloo in tests/dist/test_model_knobs.py)."""

from __future__ import annotations

import json

import pytest

from harness.cli import main
from harness.core.errors import InputError
from harness.core.zoo import ZOO, ModelConfig
from harness.plan.predict import predict
from harness.scenario.cluster import load_cluster
from harness.scenario.schema import parse_scenario
from tests.conftest import REPO

TINY = ZOO["tiny"].to_dict()
HF = REPO / "tests" / "fixtures" / "hf"


def _doc(model: dict, **settings) -> dict:
    return {
        "name": "k",
        "models": {"m": model},
        "matrix": {"model": ["m"], "strategy": ["fsdp2.full_shard"], "precision": ["bf16"], "gpus": [4]},
        "settings": settings,
    }


def test_canonical_forms_keep_the_run_id():
    """Writing a default out (head_dim = d_model / heads, RoPE over the whole head, an integer RoPE base) is the
    same model and the same cell; a knob at a non-default value is another cell."""
    plain = parse_scenario(_doc(TINY), "k").expand(gpus_per_node=4)[0]
    spelled = parse_scenario(_doc({**TINY, "head_dim": 16, "rope_dims": 16, "rope_theta": 10000}), "k")
    assert spelled.expand(gpus_per_node=4)[0].run_id == plain.run_id
    other = parse_scenario(_doc({**TINY, "rope_theta": 500000}), "k").expand(gpus_per_node=4)[0]
    assert other.run_id != plain.run_id and other.model_config.rope_theta == 500000.0


@pytest.mark.parametrize(
    ("model", "settings", "message"),
    [
        ({"tied_embeddings": True}, {"tp": 2}, "settings.tp: tp 2 with tied embeddings"),
        ({"tied_embeddings": True}, {"pp": 2}, "settings.pp: pp 2 with tied embeddings"),
        ({"qk_norm": "head"}, {"tp": 2}, "settings.tp: tp 2 with qk_norm head"),
        ({"norm_place": "sandwich"}, {"tp": 2, "sequence_parallel": True},
         "settings.sequence_parallel: norm_place sandwich: sequence parallelism shards the norms before each"),
        ({"positions": "learned", "max_positions": 32}, {"seq_len": 64},
         "settings.seq_len: seq_len 64 is longer than the model's learned position table (32 positions)"),
        ({"norm": "batch"}, {}, "models.m.norm: 'batch' is not one of rms, layer"),
        ({"rope_theta": -1}, {}, "models.m.rope_theta: -1 is not a positive number"),
    ],
)  # fmt: skip
def test_a_knob_a_layout_cannot_take_is_refused_with_the_reason(tmp_path, capsys, model, settings, message):
    path = tmp_path / "k.yaml"
    path.write_text(json.dumps(_doc({**TINY, **model}, **settings)))
    assert main(["plan", str(path)]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err, err
    with pytest.raises(InputError):
        parse_scenario(_doc({**TINY, **model}, **settings), "k")


def test_a_knob_that_composes_is_planned_under_tensor_and_pipeline_parallelism():
    """Phi's knobs (parallel blocks on a LayerNorm, a plain MLP, biases, partial rotary) under tp 2 x pp 2: the
    stage's parameters and activations follow the knobs (a plain MLP has no w3; a row-wise bias is replicated)."""
    phi = {**TINY, "norm": "layer", "norm_place": "parallel", "mlp": "plain", "rope_dims": 8, "qkv_bias": True,
           "o_bias": True, "mlp_bias": True, "head_bias": True}  # fmt: skip
    doc = _doc(phi, tp=2, pp=2, micro_batch=2)
    doc["matrix"]["gpus"] = [8]
    (spec,) = parse_scenario(doc, "k").expand(gpus_per_node=4)
    pred = predict(spec, load_cluster("h100")).to_dict()
    assert pred["memory_gib"]["total"] > 0 and pred["comm_bytes_per_step"] > 0
    assert pred["step_time_s"] > 0 and pred["mfu"] > 0


REAL = sorted(p.name for p in HF.glob("*.json") if p.name not in ("mixtral-8x7b.json", "t5-small.json"))


def test_every_dense_config_plans_with_a_time_on_h100(tmp_path, capsys):
    """Each current dense config.json on 8 H100s (FSDP2 and ZeRO-3, bf16, full checkpointing, 2,048 tokens): every
    cell has memory, collective bytes, a step time and an MFU."""
    models = {"hf-" + p.removesuffix(".json"): {"hf_config": str(HF / p)} for p in REAL}
    doc = {
        "name": "real",
        "models": models,
        "matrix": {"model": list(models), "strategy": ["fsdp2.full_shard", "zero3"], "precision": ["bf16"],
                   "gpus": [8]},
        "settings": {"micro_batch": 1, "seq_len": 1024, "activation_checkpointing": "full"},
    }  # fmt: skip
    path = tmp_path / "real.yaml"
    path.write_text(json.dumps(doc))
    assert main(["plan", str(path), "--cluster", "h100", "--format", "json"]) == 0
    cells = json.loads(capsys.readouterr().out)
    assert len(cells) == 2 * len(models)
    for c in cells:
        p = c
        assert p["memory_gib"]["total"] > 0 and p["comm_bytes_per_step"] > 0, c["spec"]["model"]
        assert p["step_time_s"] > 0 and p["mfu"] > 0, (c["spec"]["model"], p.get("time_null_reasons"))


def test_model_flops_count_a_local_layers_window():
    """A sliding-window layer counts its window's keys, a global layer the sequence (PaLM's full square)."""
    cfg = ModelConfig(**{**TINY, "sliding_window": 16, "global_every": 2})
    full = ZOO["tiny"]
    seq = 64
    assert full.flops_per_token(seq) - cfg.flops_per_token(seq) == 12 * cfg.q_width * (seq - 16)


def test_a_yaml_number_without_a_dot_is_a_number(tmp_path):
    """PyYAML reads `1e-6` (no dot) as a string: a number knob takes it as the number it says, the same cell as 1e-06
    written as a float."""
    from harness.scenario.schema import load_scenario

    path = tmp_path / "k.yaml"
    path.write_text(
        "name: k\nmodels:\n  m: {d_model: 64, n_layers: 2, n_heads: 4, ffn: 176, vocab: 512, norm_eps: 1e-6}\n"
        "matrix: {model: [m], strategy: [ddp], precision: [fp32], gpus: [2]}\n"
    )
    (spec,) = load_scenario(path).expand(gpus_per_node=2)
    assert spec.model_config.norm_eps == 1e-6
    (twin,) = parse_scenario(_doc({**TINY, "norm_eps": 1e-6}), "k").expand(gpus_per_node=4)
    assert twin.model_config == spec.model_config
