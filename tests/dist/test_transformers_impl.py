"""`implementation: transformers` (issue 53): tiny Llama-, Qwen3-, Gemma-2-, Phi- and GPT-2-shaped configs trained
through the transformers classes themselves (transformers runs for real: `AutoModelForCausalLM.from_config`, keyed
init, no download) under ddp, fsdp2.full_shard and zero3 on 2 gloo ranks.

What must hold for each: every cell ok; the fp32 losses of the three strategies equal (1e-4 relative); the
collectives the meter counted equal the plan's, to the byte and the call (the plan reads the class's parameters,
wrap units and module order from the class itself, built on the meta device: harness.scenario.transformers_model);
the record names the class and the transformers version.
"""

from __future__ import annotations

import json

import pytest

from harness.scenario.schema import parse_scenario
from harness.scenario.spec import RunSpec
from tests.conftest import assert_comm_is_plans, assert_memory_is_plans, run_cell

pytestmark = pytest.mark.dist
pytest.importorskip("transformers")

SMALL = {"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4, "intermediate_size": 96,
         "vocab_size": 160}  # fmt: skip
CONFIGS: dict[str, dict] = {
    "llama": {"model_type": "llama", **SMALL, "num_key_value_heads": 2, "tie_word_embeddings": True},
    "qwen3": {"model_type": "qwen3", **SMALL, "num_key_value_heads": 2, "head_dim": 32},
    "gemma2": {"model_type": "gemma2", **SMALL, "num_key_value_heads": 2, "head_dim": 24, "sliding_window": 16},
    "phi": {"model_type": "phi", **SMALL, "partial_rotary_factor": 0.5},
    "gpt2": {"model_type": "gpt2", "n_embd": 64, "n_layer": 2, "n_head": 4, "vocab_size": 160, "n_positions": 64},
}
STRATEGIES = ("ddp", "fsdp2.full_shard", "zero3")
CLASSES = {"llama": "LlamaForCausalLM", "qwen3": "Qwen3ForCausalLM", "gemma2": "Gemma2ForCausalLM",
           "phi": "PhiForCausalLM", "gpt2": "GPT2LMHeadModel"}  # fmt: skip


@pytest.fixture(scope="module")
def cells(tmp_path_factory) -> dict[str, RunSpec]:
    folder = tmp_path_factory.mktemp("hf_configs")
    out = {}
    for name, config in CONFIGS.items():
        (folder / f"{name}.json").write_text(json.dumps(config))
        doc = {
            "name": "t",
            "models": {name: {"hf_config": str(folder / f"{name}.json"), "implementation": "transformers"}},
            "matrix": {"model": [name], "strategy": list(STRATEGIES), "precision": ["fp32"], "gpus": [2]},
            "settings": {"micro_batch": 2, "seq_len": 32, "warmup_steps": 2, "measure_steps": 2},
        }
        for spec in parse_scenario(doc, str(folder / "t.yaml")).expand(gpus_per_node=2):
            out[f"{name}/{spec.strategy}"] = spec
    return out


@pytest.fixture(scope="module")
def records(cells, tmp_path_factory) -> dict[str, dict]:
    # NOTE: the ranks fork from tests/dist's zygote, which imported transformers (tests/dist/conftest.py)
    results = tmp_path_factory.mktemp("transformers_impl") / "results"
    return {name: run_cell(spec, results) for name, spec in cells.items()}


@pytest.mark.parametrize("model", sorted(CONFIGS))
def test_every_strategy_trains_the_same_transformers_model(model, records):
    first = records[f"{model}/ddp"]
    for s in STRATEGIES:
        rec = records[f"{model}/{s}"]
        assert rec["status"] == "ok", (s, rec.get("reason"))
        assert rec["metrics"]["losses"] == pytest.approx(first["metrics"]["losses"], rel=1e-4), s
        assert rec["env"]["model_class"].endswith(CLASSES[model]) and rec["env"]["transformers"], rec["env"]


@pytest.mark.parametrize("name", [f"{m}/{s}" for m in sorted(CONFIGS) for s in STRATEGIES])
def test_measured_collectives_are_the_plans(name, records, cells):
    assert_comm_is_plans(records[name], cells[name])


@pytest.mark.parametrize("name", [f"{m}/{s}" for m in sorted(CONFIGS) for s in STRATEGIES])
def test_measured_memory_is_the_plans(name, records, cells):
    # NOTE: the activations the plan took from the class's own forward on fake tensors (GPT-2's attention saves 26%
    # more than the harness decoder's activation model, which planned these cells before); measured: 9 of the 15
    # within 2%, the rest within 7% (GPT-2 under FSDP2 6.4% above the plan, Llama and Qwen3 DDP ~3% below)
    assert_memory_is_plans(records[name], cells[name], total_rel=0.07)
