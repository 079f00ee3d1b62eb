"""A scenario whose model is a Hugging Face config.json, swept for real (gloo, the local profile): a CPU-sized
Qwen2 config (tests/fixtures/hf/tiny-qwen2.json: q, k, v biases, grouped-query attention) beside the same
dimensions written by hand. The two are one model: the same parameter count, FLOPs, collective bytes, and the same
losses step for step (keyed initialisation); FSDP2 (meta-device build, DTensor shards of the biases) trains it to
the same losses as DDP."""

from __future__ import annotations

import json

import pytest

from harness.cli import main
from tests.conftest import REPO, load_docs

pytestmark = pytest.mark.dist

CONFIG = REPO / "tests" / "fixtures" / "hf" / "tiny-qwen2.json"
HAND = {"d_model": 64, "n_layers": 2, "n_heads": 4, "n_kv_heads": 2, "ffn": 176, "vocab": 512, "qkv_bias": True,
        "norm_eps": 1e-6, "rope_theta": 1e6}  # fmt: skip


def test_an_hf_config_model_sweeps_as_its_hand_written_twin(tmp_path):
    scenario = tmp_path / "hf.yaml"
    doc = {
        "name": "hf",
        "models": {"hf-qwen": {"hf_config": str(CONFIG)}, "hand-qwen": HAND},
        "matrix": {
            "model": ["hf-qwen", "hand-qwen"],
            "strategy": ["ddp"],
            "precision": ["fp32"],
            "gpus": [2],
        },
        "settings": {"micro_batch": 2, "seq_len": 32, "warmup_steps": 2, "measure_steps": 3},
    }
    scenario.write_text(json.dumps(doc))
    assert main(["sweep", str(scenario), "--results", str(tmp_path / "results")]) == 0
    records, warnings = load_docs(tmp_path / "results")
    assert warnings == []
    cells = {(r["spec"]["model"], r["spec"]["strategy"]): r for r in records}
    assert set(cells) == {("hf-qwen", "ddp"), ("hand-qwen", "ddp")}
    assert all(r["status"] == "ok" for r in records), [(r["run_id"], r["reason"]) for r in records]
    hf, hand = cells["hf-qwen", "ddp"], cells["hand-qwen", "ddp"]
    assert hf["spec"]["model_config"] == hand["spec"]["model_config"] == HAND
    for key in ("n_params", "flops_per_step", "tokens_per_step"):
        assert hf["metrics"][key] == hand["metrics"][key], key
    assert hf["metrics"]["n_params"] == 158_272  # 166,208 of `tiny` - 8,192 for 2 KV heads + 2 x 128 biases
    assert hf["comm"]["bytes_per_step"] == hand["comm"]["bytes_per_step"] == hf["predicted"]["comm_bytes_per_step"]
    assert hf["metrics"]["losses"] == hand["metrics"]["losses"]
