"""The recipes of docs/extending.md, shown: a new model family and a new precision, each one registry entry, are
picked up by every stage — scenario validation, `harness list models`, the planner (parameters, collective bytes,
memory, the MFU's peak), the worker (the family's module, the precision's dtype) and the record read back.

The entries are registered the way a site would: a `sitecustomize.py` on PYTHONPATH that every process of the run
imports at start (the sweep, the warm zygote, each rank), so the test changes nothing in the harness. The family is
a real one (parallel attention and MLP on one norm, as GPT-J and PaLM build their blocks); the precision is bf16 under
another name, so its cells must train exactly as bf16's do.
"""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
import textwrap

import pytest
import yaml

from tests.conftest import REPO

SHAPES = '''
from dataclasses import dataclass

from harness.core.zoo import ModelConfig, Param


@dataclass(frozen=True)
class ParallelShapes(ModelConfig):
    """A decoder whose blocks run attention and the MLP side by side on one norm: one RMSNorm weight less each."""

    family: str = "parallel"

    def block_params(self) -> int:
        return super().block_params() - self.d_model

    def parameter_inventory(self) -> tuple[Param, ...]:
        return tuple(p for p in super().parameter_inventory() if ".mlp_norm." not in p.name)
'''

MODULE = """
from torch import nn

from harness.worker.models import Attention, RMSNorm, SwiGLU, Transformer


class ParallelBlock(nn.Module):
    def __init__(self, cfg, *, layer, seed):
        super().__init__()
        self.attn_norm = RMSNorm(cfg.d_model)
        self.attn = Attention(cfg, layer=layer, seed=seed)
        self.mlp = SwiGLU(cfg, layer=layer, seed=seed)

    def forward(self, x):
        h = self.attn_norm(x)
        return x + self.attn(h) + self.mlp(h)


class ParallelTransformer(Transformer):
    def __init__(self, cfg, *, seed=0):
        super().__init__(cfg, seed=seed)
        self.blocks = nn.ModuleList(ParallelBlock(cfg, layer=i, seed=seed) for i in range(cfg.n_layers))
"""

SITE = """
from harness.core import families, precisions
from harness_ext_shapes import ParallelShapes

families.register(families.Family("parallel", ParallelShapes, "harness_ext_module:ParallelTransformer", "test"))
precisions.register(precisions.Precision("bf16x", "bfloat16", loss_scaling=False, peak="bf16", doc="bf16, renamed"))
"""

DIMS = {"d_model": 64, "n_layers": 2, "n_heads": 4, "ffn": 176, "vocab": 512}
SCENARIO = {
    "name": "ext",
    "models": {"par": {"family": "parallel", **DIMS}, "dec": dict(DIMS)},
    "matrix": {
        "model": ["par"],
        "strategy": ["ddp", "fsdp2.full_shard"],
        "precision": ["bf16x"],
        "gpus": [2],
        "include": [
            {"model": "par", "strategy": "ddp", "precision": "bf16", "gpus": 2},
            {"model": "par", "strategy": "fsdp2.full_shard", "precision": "bf16", "gpus": 2, "tp": 2},
        ],
    },
    "settings": {"warmup_steps": 2, "measure_steps": 2, "seq_len": 32},
}


def _decoder_params() -> int:
    """The decoder of the same dimensions, counted by hand: embedding, head, final norm; per block q, k, v, o,
    the three SwiGLU matrices and two norms."""
    d, f, v, n = DIMS["d_model"], DIMS["ffn"], DIMS["vocab"], DIMS["n_layers"]
    return 2 * v * d + d + n * (4 * d * d + 3 * d * f + 2 * d)


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> dict:
    """A site that registers the family and the precision, and a sweep of ext.yaml run under it."""
    root = tmp_path_factory.mktemp("site")
    (root / "harness_ext_shapes.py").write_text(SHAPES)
    (root / "harness_ext_module.py").write_text(MODULE)
    (root / "sitecustomize.py").write_text(SITE)
    scenario = root / "ext.yaml"
    scenario.write_text(yaml.safe_dump(SCENARIO, sort_keys=False))
    env = {**os.environ, "PYTHONPATH": f"{root}{os.pathsep}{REPO}"}

    def harness(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, "-m", "harness.cli", *args], cwd=root, env=env, capture_output=True, text=True, timeout=600
        )

    sweep = harness("sweep", str(scenario), "--results", str(root / "results"))
    # NOTE: this process has no such family or precision: it reads the files as JSON; the harness reads them under
    # the site (test_the_read_side_takes_them)
    files = [p for p in sorted((root / "results" / "ext").glob("*.json")) if p.name != "manifest.json"]
    records = [json.loads(p.read_text()) for p in files]
    return {"harness": harness, "root": root, "scenario": scenario, "sweep": sweep, "records": records}


def test_the_family_and_the_precision_are_swept_as_any_other(site):
    sweep = site["sweep"]
    assert sweep.returncode == 0, sweep.stdout[-3000:] + sweep.stderr[-3000:]
    by = {(r["spec"]["strategy"], r["spec"]["precision"], r["spec"]["tp"]): r for r in site["records"]}
    assert sorted(by) == [("ddp", "bf16", 1), ("ddp", "bf16x", 1), ("fsdp2.full_shard", "bf16", 2),
                          ("fsdp2.full_shard", "bf16x", 1)]  # fmt: skip
    expected = _decoder_params() - DIMS["n_layers"] * DIMS["d_model"]  # one norm per block
    for key, rec in by.items():
        assert rec["spec"]["model_config"] == {**DIMS, "n_kv_heads": None, "family": "parallel"}
        if key[2] == 2:  # the layouts shard and cut the decoder's modules by name: refused before launch
            assert rec["status"] == "skipped"
            assert "the parallel model family does not compose with tensor or pipeline parallelism" in rec["reason"]
            continue
        assert rec["status"] == "ok", rec.get("reason")
        # the worker built the family's module, and the planner counted its parameters and bytes exactly
        assert rec["metrics"]["n_params"] == expected
        assert rec["comm"]["bytes_per_step"] == rec["predicted"]["comm_bytes_per_step"] > 0, key
    ddp, renamed = by[("ddp", "bf16", 1)], by[("ddp", "bf16x", 1)]
    # bf16 under another name: the worker's policy, the planner's bytes and memory are bf16's
    assert renamed["metrics"]["losses"] == ddp["metrics"]["losses"]
    assert renamed["predicted"]["memory_gib"] == ddp["predicted"]["memory_gib"]
    counted = [
        {k: (c["calls"], c["bytes"], c["dtypes"]) for k, c in r["comm"]["by_collective"].items()}
        for r in by.values()
        if r["spec"]["strategy"] == "ddp"
    ]
    assert counted[0] == counted[1]


def test_the_listing_and_the_plan_take_them(site):
    listed = site["harness"]("list", "models", str(site["scenario"]))
    assert listed.returncode == 0, listed.stderr
    par = next(line for line in listed.stdout.splitlines() if line.startswith("par "))
    dec = next(line for line in listed.stdout.splitlines() if line.startswith("dec "))
    assert f"{_decoder_params() - 128:,} params" in par and "family parallel" in par
    assert f"{_decoder_params():,} params" in dec and "family" not in dec
    plan = site["harness"]("plan", str(site["scenario"]), "--cluster", "h100", "--format", "json")
    assert plan.returncode == 0, plan.stderr
    cells = {(c["spec"]["strategy"], c["spec"]["precision"], c["spec"]["tp"]): c for c in json.loads(plan.stdout)}
    # the MFU divides by the precision's peak: bf16x's is bf16's
    assert cells[("ddp", "bf16x", 1)]["mfu"] == cells[("ddp", "bf16", 1)]["mfu"] is not None


def test_the_read_side_takes_them(site, tmp_path):
    report = site["harness"]("report", str(site["root"] / "results"), "-o", str(tmp_path / "report"))
    assert report.returncode == 0 and "warning" not in report.stderr, report.stderr
    with open(tmp_path / "report" / "table.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert sorted((r["model"], r["strategy"], r["precision"], r["status"]) for r in rows) == [
        ("par", "ddp", "bf16", "ok"),
        ("par", "ddp", "bf16x", "ok"),
        ("par", "fsdp2.full_shard", "bf16x", "ok"),
        ("par", "fsdp2.full_shard × tp2", "bf16", "skipped"),
    ]
    same = site["harness"]("compare", str(site["root"] / "results"), str(site["root"] / "results"), "--metric", "exact")
    assert same.returncode == 0 and "4 matched, 0 added, 0 missing" in same.stdout, same.stdout + same.stderr


def test_a_model_of_an_unknown_family_is_refused_with_the_known_ones(site, tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text(
        textwrap.dedent(
            """
            name: bad
            models: {m: {family: moe, d_model: 64, n_layers: 2, n_heads: 4, ffn: 176, vocab: 512}}
            matrix: {model: [m], strategy: [ddp], precision: [bf16x], gpus: [2]}
            """
        )
    )
    out = site["harness"]("plan", str(bad))
    assert out.returncode == 2
    assert "models.m.family: 'moe' is not one of decoder, parallel" in out.stderr
