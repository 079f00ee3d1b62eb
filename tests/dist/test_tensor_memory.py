"""Measured tensor memory (`metrics.memory_gib`, harness.worker.meters.tensors) beside the planner's prediction
(harness.plan.memory), on a model large enough that every category but gradients exceeds 1 MiB.

Real gloo ranks, two per cell, one cell per strategy family with each precision mode and checkpointing policy
somewhere. The model's shape is none of the zoo's (grouped-query heads, an odd vocabulary) so nothing here was tuned
to it. What must hold (issue 54):

- the measured peak total within 5% of the predicted, in every cell;
- each category of at least 1 MiB within 5%, where the plan's peak moment leads its next moment by more than 1%
  (a near tie: the total is the same either way, but which moment the measurement's peak falls in decides how it
  splits, see docs/planner.md);
- the states (parameters, optimizer) within 1% always: they are the strategy's, not the moment's;
- the measurement repeats to the byte (compare treats it as exact).

The smoke sweep's cells and the layouts' are checked in tests/integration/test_smoke.py and
tests/dist/test_layouts.py."""

from __future__ import annotations

import pytest

from harness.launch.local import prefork
from harness.plan.memory import memory
from harness.scenario.cluster import load_cluster
from harness.scenario.schema import parse_scenario
from harness.scenario.spec import RunSpec
from tests.conftest import assert_memory_is_plans, run_cell

pytestmark = pytest.mark.dist

MID = {"d_model": 256, "n_layers": 3, "n_heads": 8, "n_kv_heads": 2, "ffn": 704, "vocab": 3001}
"""3.65M parameters: params 7-14 MiB a rank, activations 4-17 MiB at 2 x 96 tokens"""
CATEGORIES = ("params", "grads", "optimizer", "activations", "buffers")
MIB = 2**20


def mid_spec(strategy: str, precision: str, checkpointing: str = "none") -> RunSpec:
    doc = {
        "name": "t",
        "models": {"mid": MID},
        "matrix": {"model": ["mid"], "strategy": [strategy], "precision": [precision], "gpus": [2]},
        "settings": {"micro_batch": 2, "seq_len": 96, "warmup_steps": 2, "measure_steps": 2,
                     "activation_checkpointing": checkpointing},
    }  # fmt: skip
    (spec,) = parse_scenario(doc, "test").expand(gpus_per_node=2)
    return spec


CELLS = {
    "ddp-fp32": mid_spec("ddp", "fp32"),
    "ddp-bf16-full": mid_spec("ddp", "bf16", "full"),
    "fsdp-bf16-selective": mid_spec("fsdp.full_shard", "bf16", "selective"),
    "fsdp-grad-op-fp32": mid_spec("fsdp.shard_grad_op", "fp32"),
    "fsdp2-fp32": mid_spec("fsdp2.full_shard", "fp32"),
    "fsdp2-bf16-full": mid_spec("fsdp2.full_shard", "bf16", "full"),
    "zero1-bf16": mid_spec("zero1", "bf16"),
    "zero2-fp32": mid_spec("zero2", "fp32"),
    "zero3-bf16": mid_spec("zero3", "bf16"),
    "zero3-bf16-selective": mid_spec("zero3", "bf16", "selective"),
}


@pytest.fixture(scope="module")
def records(tmp_path_factory) -> dict[str, dict]:
    """Every cell once, and the first one again (its measurement must repeat), ranks forked from one warm zygote."""
    results = tmp_path_factory.mktemp("tensor_memory") / "results"
    with prefork.zygote(load_cluster("local").env, label="test_tensor_memory"):
        out = {name: run_cell(spec, results, sweep="a") for name, spec in CELLS.items()}
        out["again"] = run_cell(CELLS["ddp-fp32"], results, sweep="b")
    return out


@pytest.mark.parametrize("name", list(CELLS))
def test_measured_memory_is_the_plans(name, records):
    got, want, plan, why = assert_memory_is_plans(records[name], CELLS[name])
    assert sum(got[c] for c in CATEGORIES) == pytest.approx(got["total"])
    first, second = sorted(plan.window_totals.values(), reverse=True)[:2]
    if first > 1.01 * second:
        for c in CATEGORIES:
            if max(got[c], want[c]) * 2**30 >= MIB:
                assert got[c] == pytest.approx(want[c], rel=0.05), f"{c}{why}"
    assert got["rank"] in (0, 1) and len(got["per_rank_total"]) == 2
    assert got["phase"] in ("forward", "backward", "optimizer")


def test_the_measurement_repeats_to_the_byte(records):
    first, again = records["ddp-fp32"]["metrics"]["memory_gib"], records["again"]["metrics"]["memory_gib"]
    first.pop("meter_s"), again.pop("meter_s")  # what the measurement took: a time, not a measurement of memory
    assert first == again


def test_no_cell_is_a_near_tie_everywhere():
    """The category check above must bite: most cells' plans have a clear peak."""
    clear = 0
    for spec in CELLS.values():
        first, second = sorted(memory(spec, device="cpu").window_totals.values(), reverse=True)[:2]
        clear += first > 1.01 * second
    assert clear >= len(CELLS) // 2
