"""Hugging Face config.json files as models (harness.scenario.hf_config) and the zoo's current open models.

The fixtures under tests/fixtures/hf/ are the published config.json files (tests/fixtures/hf/README.md says which);
the parameter counts checked here are the model cards' published figures."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from harness.cli import main
from harness.core.errors import InputError
from harness.core.zoo import ZOO, ZOO_SOURCES, ModelConfig, parameters
from harness.plan.predict import predict
from harness.scenario.cluster import load_cluster
from harness.scenario.hf_config import load_hf_model
from harness.scenario.schema import load_scenario, parse_scenario
from tests.conftest import REPO

HF = REPO / "tests" / "fixtures" / "hf"

PUBLISHED: dict[str, tuple[str, float, float]] = {
    # zoo name: (config fixture, published parameter count, the unit of its last published digit)
    "llama3.1-8b": ("llama3.1-8b.json", 8.03e9, 0.01e9),
    "llama3.1-70b": ("", 70.6e9, 0.1e9),
    "llama3.1-405b": ("", 406e9, 1e9),
    "mistral-7b": ("mistral-7b-v0.3.json", 7.25e9, 0.01e9),
    "qwen2.5-7b": ("qwen2.5-7b.json", 7.61e9, 0.01e9),
    "qwen2.5-72b": ("", 72.7e9, 0.1e9),
}
"""the model cards' counts (the zoo's ZOO_SOURCES cite them); a count matches when it is within one unit of the
card's last digit (cards round or truncate: Qwen2.5-7B's 7,615,616,512 is published as 7.61B)"""


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_zoo_additions_match_their_published_parameter_counts(name):
    _, published, unit = PUBLISHED[name]
    cfg = ZOO[name]
    assert abs(cfg.n_params() - published) < unit, (name, cfg.n_params())
    assert sum(p.numel for p in parameters(cfg)) == cfg.n_params()
    assert "config.json" in ZOO_SOURCES[name] and "published" in ZOO_SOURCES[name]


def test_exact_counts_of_the_zoo_additions():
    """The exact counts (embedding + blocks + final norm + untied head; Qwen2's q, k, v biases included), and
    Qwen2.5-7B's non-embedding count, which its card publishes as 6.53B."""
    counts = {name: ZOO[name].n_params() for name in PUBLISHED}
    assert counts == {
        "llama3.1-8b": 8_030_261_248,
        "llama3.1-70b": 70_553_706_496,
        "llama3.1-405b": 405_853_388_800,
        "mistral-7b": 7_248_023_552,
        "qwen2.5-7b": 7_615_616_512,
        "qwen2.5-72b": 72_706_203_648,
    }
    qwen = ZOO["qwen2.5-7b"]
    assert qwen.bias_params() == (28 + 2 * 4) * 128 == 4608
    assert qwen.n_params() - qwen.embedding_params() - qwen.head_params() == 6_525_621_760


@pytest.mark.parametrize("name", [n for n, (f, _, _) in PUBLISHED.items() if f])
def test_a_config_json_reads_as_the_zoo_shape(name):
    cfg = load_hf_model(HF / PUBLISHED[name][0])
    assert cfg == ZOO[name]


REAL: dict[str, tuple[float, float, dict]] = {
    # config.json: (published parameter count, the unit of its last digit, knobs it must read)
    "llama3.2-1b.json": (1.24e9, 0.01e9, {"tied_embeddings": True, "rope_theta": 500000.0}),
    "qwen2.5-3b.json": (3.09e9, 0.01e9, {"tied_embeddings": True, "qkv_bias": True}),
    "qwen3-0.6b.json": (0.6e9, 0.01e9, {"head_dim": 128, "qk_norm": "head", "tied_embeddings": True}),
    "qwen3-8b.json": (8.19e9, 0.01e9, {"qk_norm": "head"}),
    "mistral-nemo.json": (12.2e9, 0.1e9, {"head_dim": 128}),
    "mistral-7b-v0.1.json": (7.24e9, 0.01e9, {"sliding_window": 4096}),
    "gemma-2-9b.json": (9.24e9, 0.01e9, {"norm_place": "sandwich", "attn_softcap": 50.0, "final_softcap": 30.0,
                                         "global_every": 2, "act": "gelu_tanh", "embed_scale": True}),
    "gemma-2-27b.json": (27.2e9, 0.1e9, {"head_dim": 128, "attn_scale_dim": 144}),
    "phi-1.json": (1.42e9, 0.01e9, {"norm": "layer", "norm_place": "parallel", "rope_dims": 32, "head_bias": True}),
    "phi-4.json": (14.7e9, 0.1e9, {"rope_theta": 250000.0}),
    "olmo-2-7b.json": (7.30e9, 0.01e9, {"norm_place": "post", "qk_norm": "proj"}),
    "gpt2.json": (124.4e6, 0.1e6, {"positions": "learned", "max_positions": 1024, "mlp": "plain", "norm": "layer"}),
    "pythia-1b.json": (1.01e9, 0.01e9, {"norm_place": "parallel2", "act": "gelu", "rope_dims": 64}),
    # Gemma 3 4B's language model (its card's 4.3B counts the 0.42B SigLIP vision tower the harness leaves out)
    "gemma-3-4b.json": (3.88e9, 0.01e9, {"qk_norm": "head", "global_every": 6, "sliding_window": 1024,
                                         "rope_local_theta": 10000.0}),
}  # fmt: skip
"""published config.json files of current dense models (tests/fixtures/hf/README.md), with their model cards'
counts (the cards round: Qwen3-0.6B's 596,049,920 is published as 0.6B)"""


@pytest.mark.parametrize("fixture", sorted(REAL))
def test_current_dense_configs_read_with_their_published_parameter_counts(fixture):
    published, unit, knobs = REAL[fixture]
    cfg = load_hf_model(HF / fixture)
    assert abs(cfg.n_params() - published) <= unit, (fixture, cfg.n_params())
    assert abs(cfg.n_params() - published) / published < 0.01
    assert {k: getattr(cfg, k) for k in knobs} == knobs
    assert sum(p.numel for p in parameters(cfg)) == cfg.n_params()


@pytest.mark.parametrize(
    ("fixture", "lines"),
    [
        ("mixtral-8x7b.json", ["num_local_experts: cannot build: 8: a mixture of experts"]),
        ("t5-small.json", ["is_encoder_decoder: cannot build: an encoder-decoder model"]),
    ],
)
def test_architectures_it_cannot_build_are_refused_with_the_field_and_the_reason(tmp_path, capsys, fixture, lines):
    """What a model is (a mixture of experts, an encoder-decoder) is refused in one line, its own."""
    scenario = _scenario(tmp_path, {"m": {"hf_config": str(HF / fixture)}}, model="m")
    assert main(["plan", str(scenario)]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    for line in lines:
        assert f"{HF / fixture}: {line}" in err, err
    assert len([e for e in err.splitlines() if e.startswith("error:")]) == 1, err


@pytest.mark.parametrize(
    ("change", "field", "message"),
    [
        ({"model_type": "olmo"}, "model_type", "'olmo' is not a family the harness builds"),
        ({"hidden_act": "relu"}, "hidden_act", "'relu': the harness builds silu"),
        (
            {"sliding_window": 4096, "layer_types": ["full_attention"] * 31 + ["sliding_attention"]},
            "layer_types",
            "global attention on layers [0, 1, 2",
        ),
        ({"model_type": "phi", "qk_layernorm": True}, "qk_layernorm", "LayerNorms on q and k"),
        ({"head_dim": 3}, "head_dim", "RoPE rotates pairs: 3 is odd"),
        ({"hidden_size": "4096"}, "hidden_size", "'4096'"),
        ({"num_hidden_layers": None}, "num_hidden_layers", "missing (required)"),
        ({"num_key_value_heads": 0}, "num_key_value_heads", "0 is not a positive integer"),
        (
            {"num_key_value_heads": 5},
            "num_key_value_heads: cannot build",
            "n_heads 32 is not divisible by n_kv_heads 5",
        ),
    ],
)
def test_a_field_it_cannot_build_names_the_file_and_the_key(tmp_path, change, field, message):
    doc = {**json.loads((HF / "llama3.1-8b.json").read_text()), **change}
    (tmp_path / "config.json").write_text(json.dumps(doc))
    with pytest.raises(InputError) as e:
        load_scenario(_scenario(tmp_path, {"m": {"hf_config": "config.json"}}, model="m"))
    text = str(e.value)
    assert field in text and message in text, text


def test_a_missing_or_broken_file_and_extra_keys_are_input_errors(tmp_path):
    (tmp_path / "bad.json").write_text("{not json")
    cases = {
        "gone.json": "cannot read the Hugging Face config",
        "bad.json": "not a JSON config.json",
    }
    for name, message in cases.items():
        with pytest.raises(InputError) as e:
            load_scenario(_scenario(tmp_path, {"m": {"hf_config": name}}, model="m"))
        assert str(tmp_path / name) in str(e.value) and message in str(e.value)
    with pytest.raises(InputError) as e:
        load_scenario(_scenario(tmp_path, {"m": {"hf_config": "x.json", "d_model": 64}}, model="m"))
    assert (
        "models.m: hf_config stands alone (or with implementation, attn_implementation): d_model cannot be given"
        in str(e.value)
    )


def test_an_hf_config_model_plans_exactly_as_the_hand_written_one_on_h100(tmp_path):
    """The Llama 3.1 8B config.json against the same shape written by hand: the same cells (but for the name), the
    same parameters, FLOPs, memory and collective bytes on h100."""
    hand = {
        "d_model": 4096, "n_layers": 32, "n_heads": 32, "ffn": 14336, "vocab": 128256, "n_kv_heads": 8,
        "rope_theta": 500000,
    }  # fmt: skip
    models = {"hf-8b": {"hf_config": str(HF / "llama3.1-8b.json")}, "hand-8b": hand}
    sc = load_scenario(_scenario(tmp_path, models, model=["hf-8b", "hand-8b"], strategy="fsdp2.full_shard", gpus=8))
    h100 = load_cluster("h100")
    hf_spec, hand_spec = sc.expand(gpus_per_node=h100.gpus_per_node)
    assert hf_spec.model_config == hand_spec.model_config == ModelConfig(**hand)
    assert hf_spec.identity() | {"model": "x"} == hand_spec.identity() | {"model": "x"}
    a, b = predict(hf_spec, h100).to_dict(), predict(hand_spec, h100).to_dict()
    assert a == b
    tokens = hf_spec.settings.micro_batch * hf_spec.settings.seq_len * hf_spec.settings.grad_accum * 8
    assert a["flops_per_step"] == pytest.approx(tokens * ZOO["llama3.1-8b"].flops_per_token(hf_spec.settings.seq_len))
    assert a["memory_gib"]["params"] == pytest.approx(8_030_261_248 * 4 / 8 / 2**30, rel=1e-3)


def test_list_models_shows_where_each_model_comes_from(tmp_path, capsys):
    models = {"hf-qwen": {"hf_config": str(HF / "tiny-qwen2.json")}, "mine": {**_TINY}}
    path = _scenario(tmp_path, models, model="mine")
    assert main(["list", "models", str(path)]) == 0
    lines = {line.split()[0]: line for line in capsys.readouterr().out.splitlines() if line.strip()}
    assert lines["hf-qwen"].endswith(f"source: hf_config {HF / 'tiny-qwen2.json'}")
    assert " 158,272 params" in lines["hf-qwen"] and "qkv_bias" in lines["hf-qwen"]
    assert lines["mine"].endswith("source: s.yaml")
    assert lines["llama3.1-8b"].endswith(
        "source: zoo: meta-llama/Llama-3.1-8B config.json; published 8.03B (model card)"
    )


def test_qkv_bias_at_its_default_keeps_every_run_id():
    """A model without q, k, v biases writes no `qkv_bias` key, so the run_ids of earlier cells stand; with it, the
    cell is another cell."""
    assert "qkv_bias" not in ZOO["tiny"].to_dict()
    doc = {"name": "t", "matrix": {"model": ["tiny"], "strategy": ["ddp"], "precision": ["fp32"], "gpus": [2]}}
    (spec,) = parse_scenario(doc, "t").expand(gpus_per_node=2)
    biased = {"name": "t", "models": {"tb": {**_TINY, "qkv_bias": True}}, "matrix": {**doc["matrix"], "model": ["tb"]}}
    (spec_b,) = parse_scenario(biased, "t").expand(gpus_per_node=2)
    assert spec.run_id == "tiny-ddp-fp32-g2-" + spec.run_id.rsplit("-", 1)[1]
    assert spec_b.model_config.to_dict()["qkv_bias"] is True
    assert spec_b.run_id.rsplit("-", 1)[1] != spec.run_id.rsplit("-", 1)[1]
    with pytest.raises(InputError, match="models.tb.qkv_bias: 1 is not true or false"):
        parse_scenario({**biased, "models": {"tb": {**_TINY, "qkv_bias": 1}}}, "t")


def test_the_built_model_has_the_counted_parameters():
    """harness.worker.models builds Qwen2's q, k, v biases: `named_parameters()` is `parameters(cfg)`, name for
    name and shape for shape, and the biases start at zero."""
    import torch

    from harness.worker.models import build_model

    cfg = load_hf_model(HF / "tiny-qwen2.json")
    model = build_model(cfg, seed=0, device="cpu")
    built = [(n, tuple(p.shape)) for n, p in model.named_parameters()]
    assert built == [(p.name, p.shape) for p in parameters(cfg)]
    assert sum(p.numel() for p in model.parameters()) == cfg.n_params() == 158_272
    assert torch.count_nonzero(model.blocks[0].attn.wk.bias) == 0 and model.blocks[0].attn.wk.bias.shape == (32,)


_TINY = {"d_model": 64, "n_layers": 2, "n_heads": 4, "ffn": 176, "vocab": 512}


def _scenario(tmp_path: Path, models: dict, *, model: str | list[str], strategy: str = "ddp", gpus: int = 2) -> Path:
    path = tmp_path / "s.yaml"
    matrix = {"model": model if isinstance(model, list) else [model], "strategy": [strategy], "precision": ["bf16"]}
    path.write_text(json.dumps({"name": "s", "models": models, "matrix": {**matrix, "gpus": [gpus]}}))
    return path
