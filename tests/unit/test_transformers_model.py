"""`implementation: transformers` at the edge and in the planner (harness.scenario.transformers_model): the model
entry's keys, what the planner reads of the class (its parameters, wrap units and module order, from the class built
on the meta device in a child interpreter), and the layouts it refuses. The class trains on gloo in
tests/dist/test_transformers_impl.py."""

from __future__ import annotations

import json

import pytest

from harness.cli import main
from harness.core.errors import InputError
from harness.plan.zero3 import zero3_module_trace
from harness.scenario.schema import parse_scenario
from harness.scenario.transformers_model import TransformersModel

pytest.importorskip("transformers")

TIED_LLAMA = {"model_type": "llama", "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
              "intermediate_size": 96, "vocab_size": 160, "num_key_value_heads": 2,
              "tie_word_embeddings": True}  # fmt: skip


def _doc(folder, entry: dict, config: dict | None = None, **settings) -> dict:
    (folder / "config.json").write_text(json.dumps(config or TIED_LLAMA))
    return {
        "name": "t",
        "models": {"m": {"hf_config": str(folder / "config.json"), **entry}},
        "matrix": {"model": ["m"], "strategy": ["zero3"], "precision": ["fp32"], "gpus": [2]},
        "settings": settings,
    }


def test_the_class_is_what_the_plan_shards(tmp_path):
    """The planner's parameters are the class's own (names, order, the tied head once, wrap units from
    `_no_split_modules`), their count the harness decoder's for the same config (held to transformers for every
    family in test_transformers_parity.py), and ZeRO-3's module trace the order the class's hooks fire in."""
    (spec,) = parse_scenario(_doc(tmp_path, {"implementation": "transformers"}), "t").expand(gpus_per_node=2)
    cfg = spec.model_config
    assert isinstance(cfg, TransformersModel) and cfg.family == "transformers" and cfg.attn_implementation == "sdpa"
    params = cfg.parameter_inventory()
    assert params[0].name == "inner.model.embed_tokens.weight" and params[0].unit == "root"
    assert "inner.lm_head.weight" not in {p.name for p in params}  # tied: the embedding's
    assert {p.unit for p in params} == {"root", "blocks.0", "blocks.1"}
    assert sum(p.numel for p in params) == cfg.n_params() == 72_000
    fwd, bwd = zero3_module_trace(cfg)
    assert fwd[0] == ("model", ()) and ("inner.lm_head", (0,)) in bwd  # the head fetches the embedding's weight
    used = [i for name, own in fwd for i in own if name != "inner.lm_head"]
    assert sorted(used) == list(range(len(params))) and used != sorted(used)  # a norm runs before its block's q


def test_the_config_is_the_cell(tmp_path):
    """The config's content is part of the cell: the same file is the same run_id, another value another; the
    harness's own implementation of the same file is another cell."""
    (a,) = parse_scenario(_doc(tmp_path, {"implementation": "transformers"}), "t").expand(gpus_per_node=2)
    (own,) = parse_scenario(_doc(tmp_path, {}), "t").expand(gpus_per_node=2)
    assert a.run_id != own.run_id and own.model_config.family == "decoder"
    TIED_LLAMA["rms_norm_eps"] = 1e-5
    try:
        (b,) = parse_scenario(_doc(tmp_path, {"implementation": "transformers"}), "t").expand(gpus_per_node=2)
    finally:
        del TIED_LLAMA["rms_norm_eps"]
    assert b.run_id != a.run_id


@pytest.mark.parametrize(
    ("entry", "settings", "message"),
    [
        ({"implementation": "jax"}, {}, "models.m.implementation: 'jax' is not one of harness, transformers"),
        ({"attn_implementation": "eager"}, {}, "models.m.attn_implementation: only with implementation: transformers"),
        ({"implementation": "transformers", "attn_implementation": "flash"}, {},
         "models.m.attn_implementation: 'flash' is not one of sdpa, eager"),
        ({"d_model": 64}, {}, "cannot be given with it"),
    ],
)  # fmt: skip
def test_bad_entries_are_refused_with_the_key(tmp_path, entry, settings, message):
    with pytest.raises(InputError, match=message):
        parse_scenario(_doc(tmp_path, entry, **settings), "t")


def test_tensor_parallel_is_refused_with_the_reason(tmp_path, capsys):
    doc = _doc(tmp_path, {"implementation": "transformers"}, {**TIED_LLAMA, "tie_word_embeddings": False}, tp=2)
    doc["matrix"]["strategy"] = ["fsdp2.full_shard"]
    path = tmp_path / "t.yaml"
    path.write_text(json.dumps(doc))
    assert main(["list", "cells", str(path)]) == 0
    out = capsys.readouterr().out
    assert "skipped: implementation: transformers does not compose with tensor or pipeline parallelism" in out, out
