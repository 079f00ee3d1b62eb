"""The framework options as settings (issue 53): FSDP's wrap units (`wrap_blocks`), FSDP2's `reshard_after_forward` and
`prefetch_units`, FSDP1's prefetch options, DDP's `bucket_cap_mb` — refused where they do not apply, and priced by the
planner: collective bytes and calls (harness.plan.comm), memory (harness.plan.memory), overlap (harness.plan.overlap).

The figures are worked out by hand from the tiny model's inventory (harness.core.zoo): a block is 50,304 elements
(four 64x64 projections, three 176x64 MLP matrices, two norms), the root 65,600 (embedding and head 512x64 each, the
final norm 64), 166,208 in all. At world 2 in fp32 nothing is padded (every dim 0 is even, every parameter a multiple
of FSDP1's 4-element alignment), so a unit's all-gather is 4 B x its elements and so is its reduce-scatter.
The real runs that hold these plans to the measurement are tests/dist/test_fsdp_options.py.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from harness.cli import main
from harness.core.errors import InputError
from harness.core.zoo import ZOO
from harness.plan import calibration as cal
from harness.plan import time as tm
from harness.plan import wrap
from harness.plan.activations import BLOCK_BACKWARD, FORWARD_END
from harness.plan.comm import predict_comm
from harness.plan.memory import memory
from harness.scenario.cluster import load_cluster
from harness.scenario.schema import parse_scenario
from tests.conftest import make_spec

BLOCK, ROOT, TINY = 50_304, 65_600, 166_208
FOUR = dataclasses.replace(ZOO["tiny"], n_layers=4)
"""the tiny model with four blocks (266,816 elements): two units of two blocks at wrap_blocks 2"""


def comm(strategy: str, **settings) -> tuple[float, float, dict]:
    pred = predict_comm(make_spec(strategy=strategy, **settings))
    assert pred is not None
    calls = {k: v["calls"] for k, v in pred["by_collective"].items()}
    return pred["comm_bytes_per_step"], pred["calls_per_step"], calls


def four(strategy: str, **settings):
    return dataclasses.replace(make_spec(strategy=strategy, **settings), model="four", model_config=FOUR)


def test_the_inventory_as_the_figures_assume():
    assert dict(wrap.wrap_sizes(ZOO["tiny"], 1)) == {"blocks.0": BLOCK, "blocks.1": BLOCK, "root": ROOT}
    assert dict(wrap.wrap_sizes(ZOO["tiny"], 2)) == {"blocks.0": 2 * BLOCK, "root": ROOT}
    assert dict(wrap.wrap_sizes(ZOO["tiny"], 0)) == {"root": TINY}
    # three blocks in twos: the last unit holds one, and is the first the backward runs
    three = dataclasses.replace(ZOO["tiny"], n_layers=3)
    assert dict(wrap.wrap_sizes(three, 2)) == {"blocks.0": 2 * BLOCK, "blocks.2": BLOCK, "root": ROOT}
    assert wrap.backward_units(three, 2) == (BLOCK, 2 * BLOCK)
    # wrap 0 keeps the registration order FSDP1 flattens in: the embedding first, the head last
    (name, params), = wrap.wrap_units(ZOO["tiny"], 0)  # fmt: skip
    assert name == "root" and params[0].name == "tok_emb.weight" and params[-1].name == "head.weight"


# ---- collectives: bytes and calls per step


def test_fsdp2_wrap_units_gather_the_same_bytes_in_fewer_calls():
    # each unit gathered in forward and again in backward (2 x 4 B x 166,208), its gradient reduced once (4 B x ...)
    everything = 2 * 4 * TINY + 4 * TINY
    assert everything == 1_994_496
    assert comm("fsdp2.full_shard") == (everything, 9, {"all_gather": 6, "reduce_scatter": 3})
    assert comm("fsdp2.full_shard", wrap_blocks=2) == (everything, 6, {"all_gather": 4, "reduce_scatter": 2})
    assert comm("fsdp2.full_shard", wrap_blocks=0) == (everything, 3, {"all_gather": 2, "reduce_scatter": 1})


def test_fsdp2_without_resharding_gathers_once_per_micro_step():
    once = 4 * TINY + 4 * TINY  # forward all-gather + reduce-scatter: no all-gather in backward
    assert once == 1_329_664
    assert comm("fsdp2.full_shard", reshard_after_forward=False) == (once, 6, {"all_gather": 3, "reduce_scatter": 3})
    assert comm("fsdp2.full_shard", reshard_after_forward=False, wrap_blocks=0) == (
        once, 2, {"all_gather": 1, "reduce_scatter": 1},
    )  # fmt: skip
    # every micro-step gathers again (resharded after its backward); the reduction is the last micro-step's
    assert comm("fsdp2.full_shard", reshard_after_forward=False, grad_accum=2)[:2] == (2 * 4 * TINY + 4 * TINY, 9)


def test_fsdp1_wrap_units_and_the_root_that_stays_gathered():
    # FSDP1 does not reshard the root after its forward: blocks twice, the root once, every unit reduced once
    gathers = 4 * (2 * 2 * BLOCK + ROOT)
    assert gathers + 4 * TINY == 1_732_096
    assert comm("fsdp.full_shard") == (1_732_096, 8, {"all_gather": 5, "reduce_scatter": 3})
    assert comm("fsdp.full_shard", wrap_blocks=2) == (1_732_096, 5, {"all_gather": 3, "reduce_scatter": 2})
    # the whole model one unit, the root: gathered once, reduced once
    assert comm("fsdp.full_shard", wrap_blocks=0) == (4 * TINY * 2, 2, {"all_gather": 1, "reduce_scatter": 1})


def test_fsdp1_prefetch_options_issue_the_same_collectives():
    default = comm("fsdp.full_shard")
    for settings in ({"backward_prefetch": "none"}, {"backward_prefetch": "backward_post"},
                     {"forward_prefetch": True}, {"limit_all_gathers": False}):  # fmt: skip
        assert comm("fsdp.full_shard", **settings) == default, settings


def test_ddp_buckets_follow_the_cap():
    # 664,832 bytes of fp32 gradients: one bucket under torch's default (first 1 MiB); with 0.25 MiB (262,144 B) for
    # every bucket, gradients in ready order (head 131,072, norm 256, block 1 from w2 down, …) close buckets at
    # 266,496 and 267,008 bytes, and the rest (the first block's attention norm and the embedding) is the third
    assert comm("ddp") == (4 * TINY, 1, {"all_reduce": 1})
    pred = predict_comm(make_spec(strategy="ddp", bucket_cap_mb=0.25))
    assert [i["bytes_per_call"] for i in pred["items"]] == [266_496, 267_008, 131_328]
    assert sum(i["bytes_per_call"] for i in pred["items"]) == 4 * TINY
    # an explicit 25 is torch's default cap, but torch then caps the first bucket at 25 MiB too: the setting's
    # default is torch's own default (first bucket 1 MiB), which the worker gets by passing None
    assert comm("ddp", bucket_cap_mb=1.0) == (4 * TINY, 1, {"all_reduce": 1})


# ---- memory


def test_wrap_units_gather_more_at_once():
    """Four blocks in two units of two: the block's backward holds its unit and the prefetched next one, four blocks
    instead of two (4 B x 2 x 50,304 more); the rest of that moment is the same."""
    one = memory(four("fsdp2.full_shard"), device="cpu")
    two = memory(four("fsdp2.full_shard", wrap_blocks=2), device="cpu")
    assert two.window_totals[BLOCK_BACKWARD] - one.window_totals[BLOCK_BACKWARD] == 4 * 2 * BLOCK
    fsdp1 = memory(four("fsdp.full_shard"), device="cpu")
    fsdp1_two = memory(four("fsdp.full_shard", wrap_blocks=2), device="cpu")
    assert fsdp1_two.window_totals[BLOCK_BACKWARD] - fsdp1.window_totals[BLOCK_BACKWARD] == 4 * 2 * BLOCK
    # backward_prefetch none: only the unit computing is gathered (one block less than the default)
    none = memory(four("fsdp.full_shard", backward_prefetch="none"), device="cpu")
    assert fsdp1.window_totals[BLOCK_BACKWARD] - none.window_totals[BLOCK_BACKWARD] == 4 * BLOCK
    # FSDP2 prefetching two units ahead: three blocks at once, one more than the default
    ahead = memory(four("fsdp2.full_shard", prefetch_units=2), device="cpu")
    assert ahead.window_totals[BLOCK_BACKWARD] - one.window_totals[BLOCK_BACKWARD] == 4 * BLOCK


def test_without_resharding_the_whole_model_stays_gathered_from_the_forward():
    """FSDP2 reshard_after_forward false: at the forward's end every unit (blocks and root: 266,816 elements) is still
    gathered; by default none is."""
    default = memory(four("fsdp2.full_shard"), device="cpu")
    keep = memory(four("fsdp2.full_shard", reshard_after_forward=False), device="cpu")
    assert keep.window_totals[FORWARD_END] - default.window_totals[FORWARD_END] == 4 * FOUR.n_params()
    assert keep.total > default.total


# ---- overlap


def test_the_time_model_prices_both_sides(tmp_path, monkeypatch):
    """FSDP1 without backward prefetch exposes its backward all-gathers; larger units hide less of each gather behind
    the unit before (the first unit's gather is exposed, and it is larger), but pay the framework's per-unit
    overhead fewer times."""
    monkeypatch.setenv(cal.CALIBRATION_DIR_ENV, str(tmp_path))
    cluster = load_cluster("local-gpu")
    (tmp_path / f"local-gpu{cal.SUFFIX}").write_text(json.dumps(cal.example_calibration("local-gpu", device="cuda")))
    rates = cal.rates_for(cluster)

    def parts(strategy: str, **settings) -> dict:
        spec = make_spec(strategy=strategy, model="125m", gpus=4, precision="bf16", gpus_per_node=8, seq_len=512,
                         **settings)  # fmt: skip
        return tm.predict_time(spec, cluster, rates).to_dict()["time_s"]

    def exposed(strategy: str, **settings) -> float:
        return parts(strategy, **settings)["comm_exposed"]

    assert exposed("fsdp.full_shard", backward_prefetch="none") > exposed("fsdp.full_shard")
    # the other side: FSDP's per-block framework overhead (hooks, flat parameters) is paid per unit, 3 of 12 blocks'
    other = {w: parts("fsdp2.full_shard", wrap_blocks=w)["other"] for w in (1, 4)}
    framework = cal.example_calibration("local-gpu", device="cuda")["compute"]["framework"]["fsdp2.full_shard/bf16"]
    assert other[1] - other[4] == pytest.approx((12 - 3) * framework["per_block_s"], rel=1e-9)
    assert exposed("fsdp2.full_shard", wrap_blocks=0) > exposed("fsdp2.full_shard", wrap_blocks=4)
    assert exposed("fsdp2.full_shard", wrap_blocks=4) >= exposed("fsdp2.full_shard")


# ---- where they apply


@pytest.mark.parametrize(
    "strategy, settings, words",
    [
        ("ddp", {"wrap_blocks": 2}, "ddp: wrap_blocks groups transformer blocks into FSDP units"),
        ("zero3", {"wrap_blocks": 0}, "zero3 has no wrapping units"),
        ("fsdp.full_shard", {"reshard_after_forward": False}, "fsdp.shard_grad_op"),
        ("fsdp2.full_shard", {"backward_prefetch": "none"}, "option of FSDP1's FullyShardedDataParallel"),
        ("fsdp.full_shard", {"prefetch_units": 2}, "FSDP1's is forward_prefetch and backward_prefetch"),
        ("fsdp2.full_shard", {"bucket_cap_mb": 100}, "DistributedDataParallel's gradient bucket size"),
        ("fsdp2.full_shard", {"wrap_blocks": 0, "prefetch_units": 2}, "nothing to prefetch"),
        ("fsdp2.full_shard", {"wrap_blocks": 2, "tp": 2}, "not part of the tensor- and pipeline-parallel layouts"),
    ],
)
def test_a_setting_is_refused_where_it_does_not_apply(strategy, settings, words):
    # NOTE: the cell as a matrix that mixes families makes it (a scenario whose every cell refuses is exit 2, below)
    gpus = 4 if settings.get("tp") else 2
    plain = make_spec(strategy=strategy, gpus=gpus, gpus_per_node=gpus)
    spec = dataclasses.replace(plain, settings=dataclasses.replace(plain.settings, **settings))
    why = spec.unsupported_reason("cpu")
    assert why is not None and words in why, why
    assert predict_comm(spec) is None


def test_the_settings_apply_where_they_belong():
    for strategy, settings in [
        ("fsdp.full_shard", {"wrap_blocks": 2, "backward_prefetch": "backward_post", "forward_prefetch": True}),
        ("fsdp.hybrid_shard", {"wrap_blocks": 0, "limit_all_gathers": False}),
        ("fsdp2.full_shard", {"wrap_blocks": 3, "reshard_after_forward": False, "prefetch_units": 2}),
        ("ddp", {"bucket_cap_mb": 0.5}),
        ("ddp", {"bucket_cap_mb": 0.5, "pp": 2}),  # DDP's buckets also under a pipeline
    ]:
        gpus = 4 if "hybrid" in strategy or settings.get("pp") else 2
        spec = make_spec(strategy=strategy, gpus=gpus, gpus_per_node=2, **settings)
        assert spec.unsupported_reason("cpu") is None, (strategy, settings)
        assert predict_comm(spec) is not None


def test_a_default_setting_keeps_the_run_id():
    plain = make_spec(strategy="fsdp2.full_shard")
    assert make_spec(strategy="fsdp2.full_shard", wrap_blocks=1, reshard_after_forward=True).run_id == plain.run_id
    assert make_spec(strategy="fsdp2.full_shard", wrap_blocks=2).run_id != plain.run_id


def test_a_scenario_whose_every_cell_refuses_a_setting_is_exit_2(tmp_path, capsys):
    doc = {"name": "t", "matrix": {"model": ["tiny"], "strategy": ["ddp", "zero3"], "precision": ["fp32"],
                                   "gpus": [2]}, "settings": {"wrap_blocks": 2}}  # fmt: skip
    with pytest.raises(InputError, match="settings.wrap_blocks: ddp: wrap_blocks groups transformer blocks"):
        parse_scenario(doc, "t.yaml")
    # one cell of a family that takes it: the file is fine, the others are skipped with the reason
    doc["matrix"]["strategy"] = ["ddp", "fsdp2.full_shard"]
    cells = parse_scenario(doc, "t.yaml").expand(gpus_per_node=2)
    assert [c.unsupported_reason() is None for c in cells] == [False, True]
    # through the CLI: exit 2, nothing run
    path = Path(tmp_path / "s.yaml")
    path.write_text(
        "name: t\nmatrix: {model: [tiny], strategy: [ddp], precision: [fp32], gpus: [2]}\n"
        "settings: {reshard_after_forward: false}\n"
    )
    assert main(["sweep", str(path), "--results", str(tmp_path / "results")]) == 2
    assert "settings.reshard_after_forward: ddp: reshard_after_forward is FSDP2's" in capsys.readouterr().err
    assert not (tmp_path / "results").exists()
    path.write_text(
        "name: t\nmatrix: {model: [tiny], strategy: [fsdp.full_shard], precision: [fp32], gpus: [2]}\n"
        "settings: {wrap_blocks: -1, backward_prefetch: sometimes}\n"
    )
    assert main(["plan", str(path)]) == 2
    err = capsys.readouterr().err
    assert "settings.wrap_blocks: -1 is below the minimum 0" in err
    assert "settings.backward_prefetch: 'sometimes' is not one of backward_pre, backward_post, none" in err


def test_the_plan_names_a_cell_by_its_options():
    """`harness plan` and the recommendation tell the cells of one strategy apart by the options set (issue 53)."""
    from harness.plan.recommend import option_list

    assert option_list(make_spec(strategy="fsdp2.full_shard")) == ["mb2x64"]
    wrapped = make_spec(strategy="fsdp2.full_shard", wrap_blocks=2, reshard_after_forward=False)
    assert option_list(wrapped) == ["mb2x64", "wrap_blocks=2", "reshard_after_forward=false"]
    assert option_list(make_spec(strategy="ddp", bucket_cap_mb=0.5)) == ["mb2x64", "bucket_cap_mb=0.5"]
