"""FSDP's wrap units and resharding as settings (issue 53), on real gloo ranks: FSDP1 with two blocks per unit, FSDP2
with the whole model one unit and no resharding after the forward, FSDP2 with two blocks per unit, FSDP1 without
backward prefetch, DDP with 4 MiB buckets, each beside the default cell of its strategy (DDP's default is torch's:
a 1 MiB first bucket, which the worker gets by passing no bucket_cap_mb).

What must hold, on the model of tests/dist/test_tensor_memory.py (3 blocks, so a two-block unit and a one-block unit):

- every cell trains the default cell's model: fp32 losses equal to the default's (relative 1e-4), whose own losses
  tests/dist/test_equivalence.py holds to a single process;
- the collectives the meter counted equal the plan's, to the byte and the call, per collective (fewer, larger
  all-gathers and reduce-scatters than the default, none in the backward without resharding);
- the measured tensor memory within 5% of the plan's in total, the states within 1% (as test_tensor_memory).
"""

from __future__ import annotations

import pytest

from harness.launch.local import prefork
from harness.plan.comm import predict_comm
from harness.scenario.cluster import load_cluster
from harness.scenario.schema import parse_scenario
from harness.scenario.spec import RunSpec
from tests.conftest import assert_comm_is_plans, assert_memory_is_plans, run_cell

pytestmark = pytest.mark.dist

MID = {"d_model": 256, "n_layers": 3, "n_heads": 8, "n_kv_heads": 2, "ffn": 704, "vocab": 3001}
"""test_tensor_memory's model: 3.65M parameters, three blocks"""


def cell(strategy: str, **settings) -> RunSpec:
    doc = {
        "name": "t",
        "models": {"mid": MID},
        "matrix": {"model": ["mid"], "strategy": [strategy], "precision": ["fp32"], "gpus": [2]},
        "settings": {"micro_batch": 2, "seq_len": 96, "warmup_steps": 2, "measure_steps": 2, **settings},
    }
    (spec,) = parse_scenario(doc, "test").expand(gpus_per_node=2)
    return spec


CELLS = {
    "fsdp": cell("fsdp.full_shard"),
    "fsdp-wrap2": cell("fsdp.full_shard", wrap_blocks=2),
    "fsdp2": cell("fsdp2.full_shard"),
    "fsdp2-wrap0-keep": cell("fsdp2.full_shard", wrap_blocks=0, reshard_after_forward=False),
    "fsdp2-wrap2": cell("fsdp2.full_shard", wrap_blocks=2),
    "fsdp-no-prefetch": cell("fsdp.full_shard", backward_prefetch="none"),
    "ddp": cell("ddp"),
    "ddp-cap4": cell("ddp", bucket_cap_mb=4),
}
DEFAULT = {"fsdp-wrap2": "fsdp", "fsdp2-wrap0-keep": "fsdp2", "fsdp2-wrap2": "fsdp2", "fsdp-no-prefetch": "fsdp",
           "ddp-cap4": "ddp"}  # fmt: skip
"""each cell with settings → the default cell of its strategy"""


@pytest.fixture(scope="module")
def records(tmp_path_factory) -> dict[str, dict]:
    results = tmp_path_factory.mktemp("fsdp_options") / "results"
    with prefork.zygote(load_cluster("local").env, label="test_fsdp_options"):
        return {name: run_cell(spec, results) for name, spec in CELLS.items()}


@pytest.mark.parametrize("name", list(DEFAULT))
def test_same_losses_as_the_default_cell(name, records):
    rec, default = records[name], records[DEFAULT[name]]
    assert rec["status"] == "ok", rec.get("reason")
    assert default["status"] == "ok", default.get("reason")
    assert rec["metrics"]["losses"] == pytest.approx(default["metrics"]["losses"], rel=1e-4)


@pytest.mark.parametrize("name", list(CELLS))
def test_measured_collectives_are_the_plans(name, records):
    assert_comm_is_plans(records[name], CELLS[name])


def test_the_settings_change_what_is_gathered(records):
    """The settings do what they say: fewer calls than the default; no backward all-gather without resharding."""
    calls = {name: predict_comm(spec)["by_collective"] for name, spec in CELLS.items()}  # type: ignore[index]
    # FSDP1: blocks 0-1 one unit, block 2 another, the root: 3 reduce-scatters, not 4
    assert calls["fsdp"]["reduce_scatter"]["calls"] == 4 and calls["fsdp-wrap2"]["reduce_scatter"]["calls"] == 3
    # FSDP2, whole model one unit kept from forward to backward: one all-gather and one reduce-scatter a step
    assert calls["fsdp2-wrap0-keep"]["all_gather"]["calls"] == 1
    assert calls["fsdp2-wrap0-keep"]["reduce_scatter"]["calls"] == 1
    assert calls["fsdp2-wrap2"]["all_gather"]["calls"] == 6  # (2 units + root) x forward and backward
    # DDP over 14.6 MB of gradients: torch's default closes a first bucket at 1 MiB (the head's 3.07 MB gradient
    # alone), then one of 25 MiB; 4 MiB buckets: three (before the worker passed no cap for the default, torch capped
    # the first bucket at an explicit 25 MiB too: one bucket, where the plan said two)
    assert calls["ddp"]["all_reduce"]["calls"] == 2 and calls["ddp-cap4"]["all_reduce"]["calls"] == 3


@pytest.mark.parametrize("name", list(CELLS))
def test_measured_memory_is_the_plans(name, records):
    assert_memory_is_plans(records[name], CELLS[name])
