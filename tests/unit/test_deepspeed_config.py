"""A user's DeepSpeed config (`deepspeed_config:`) merged over the harness's, and `offload: nvme` (issue 53).

harness.scenario.deepspeed_config: the file read at scenario load (bad files: one line each, exit 2), the merge, the
owned keys and their conflicts (refused before launch, both values in the reason), the run_id following the content,
and the planner pricing the bucket, prefetch and persistence keys with the cell's values.
"""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import pytest

from harness.core.catalogue import CATALOGUE
from harness.core.constants import DS_REDUCE_BUCKET_ELEMS
from harness.core.zoo import parameters
from harness.plan import comm as cm
from harness.plan import memory as mb
from harness.plan.activations import BACKWARD_END, BLOCK_BACKWARD, HEAD_BACKWARD
from harness.plan.zero3 import ds_ipg_buckets
from harness.results.spec import spec_from_json, spec_to_json
from harness.scenario import deepspeed_config as dc
from harness.scenario.schema import load_scenario, parse_scenario
from harness.scenario.spec import RunSpec

REPO = Path(__file__).resolve().parents[2]


def scenario(tmp_path: Path, config: object, *, strategies=("zero2",), precision="fp32", extra: str = "") -> Path:
    """A scenario file beside a `ds.json` holding `config` (JSON text when a str, else dumped)."""
    (tmp_path / "ds.json").write_text(config if isinstance(config, str) else json.dumps(config))
    p = tmp_path / "s.yaml"
    p.write_text(
        f"name: t\nmatrix: {{model: [tiny], strategy: [{', '.join(strategies)}], precision: [{precision}], "
        f"gpus: [2]}}\nsettings: {{deepspeed_config: ds.json{extra}}}\n"
    )
    return p


def cells(path: Path) -> dict[str, RunSpec]:
    return {s.strategy: s for s in load_scenario(path).expand(gpus_per_node=2)}


# ---- the merge and the owned keys -----------------------------------------------------------------------------


def test_the_users_keys_merge_over_the_harnesss_key_by_key(tmp_path):
    user = {
        "zero_optimization": {"reduce_bucket_size": 12345, "overlap_comm": True},
        "wall_clock_breakdown": True,
        "comms_logger": {"enabled": True, "ranks": [0, 1]},
    }
    spec = cells(scenario(tmp_path, user))["zero2"]
    merged = dc.merged_config(spec)
    # the user's keys beside the harness's inside zero_optimization, not instead of them
    assert merged["zero_optimization"] == {"stage": 2, "reduce_bucket_size": 12345, "overlap_comm": True}
    assert merged["wall_clock_breakdown"] is True  # not owned: the user's value wins
    assert merged["comms_logger"] == {"enabled": True, "ranks": [0, 1]}  # lists come back as lists
    assert merged["train_micro_batch_size_per_gpu"] == 2 and merged["train_batch_size"] == 4
    assert dc.merged_config(
        dataclasses.replace(spec, settings=dataclasses.replace(spec.settings, deepspeed_config=None))
    ) == dc.harness_config(spec)


def test_every_key_the_harness_sets_is_owned_or_neutral():
    """A key the harness sets and does not own would be silently replaced by a user's value: each is owned (a user
    may only repeat it) or neutral (logging, pinning)."""
    owned = {k for k, _ in dc.OWNED_KEYS}
    found = set()
    for strategy in dc.DEEPSPEED_STRATEGIES:
        for precision in ("fp32", "bf16", "fp16"):
            for offload in CATALOGUE[strategy].offloads:
                (spec,) = parse_scenario(
                    {
                        "name": "t",
                        "matrix": {"model": ["tiny"], "strategy": [strategy], "precision": [precision], "gpus": [2]},
                        "settings": {"offload": offload},
                    },
                    "s",
                ).expand(gpus_per_node=2)
                found |= {k for k, _ in dc._leaves(dc.harness_config(spec, nvme_path="/x"))}
    unowned = {k for k in found if k not in owned and not any(k == n or k.startswith(n + ".") for n in dc.NEUTRAL_KEYS)}
    assert unowned == set()
    assert {"zero_optimization.stage", "train_batch_size", "bf16.enabled", "fp16.enabled", "optimizer"} <= owned


def test_a_conflicting_owned_key_is_refused_with_both_values_and_an_equal_one_accepted(tmp_path):
    user = {"zero_optimization": {"stage": 2}, "train_micro_batch_size_per_gpu": 2, "bf16": {"enabled": False}}
    specs = cells(scenario(tmp_path, user, strategies=("zero2", "zero3")))
    assert specs["zero2"].unsupported_reason("cpu") is None  # stage 2, micro_batch 2, not bf16: the cell's own values
    assert specs["zero3"].unsupported_reason("cpu") == (
        "deepspeed_config sets zero_optimization.stage to 2 but the cell's strategy zero3 sets 3"
    )
    both = cells(scenario(tmp_path, {"train_micro_batch_size_per_gpu": 8, "fp16": {"enabled": True}}))["zero2"]
    why = both.unsupported_reason("cpu")
    assert "train_micro_batch_size_per_gpu to 8 but the cell's micro_batch sets 2" in why
    assert "fp16.enabled to true but the cell's precision fp32 sets false" in why
    opt = cells(scenario(tmp_path, {"optimizer": {"type": "Adam"}}))["zero2"]
    assert 'optimizer to {"type": "Adam"} but the harness, which passes its own optimizer' in opt.unsupported_reason()


def test_a_config_on_a_strategy_deepspeed_does_not_run_is_refused(tmp_path):
    specs = cells(scenario(tmp_path, {"wall_clock_breakdown": True}, strategies=("ddp", "fsdp2.full_shard", "zero1")))
    assert specs["ddp"].unsupported_reason() == (
        "deepspeed_config is DeepSpeed's config: ddp does not run DeepSpeed (give it to zero1, zero2, zero3 cells only)"
    )
    assert "fsdp2.full_shard does not run DeepSpeed" in specs["fsdp2.full_shard"].unsupported_reason()
    assert specs["zero1"].unsupported_reason() is None


# ---- the run_id follows the content ----------------------------------------------------------------------------


def test_the_run_id_follows_the_files_content_not_its_name_or_layout(tmp_path):
    plain = load_scenario(scenario(tmp_path, {}, extra="")).expand(gpus_per_node=2)[0]
    a = cells(scenario(tmp_path, {"zero_optimization": {"reduce_bucket_size": 1000}}))["zero2"]
    (tmp_path / "other").mkdir()
    b = cells(scenario(tmp_path / "other", '{\n  "zero_optimization" : { "reduce_bucket_size" : 1000 }\n}'))["zero2"]
    c = cells(scenario(tmp_path, {"zero_optimization": {"reduce_bucket_size": 2000}}))["zero2"]
    assert a.run_id == b.run_id != c.run_id
    assert plain.run_id != a.run_id  # an empty config is still a config given
    none = parse_scenario(
        {"name": "t", "matrix": {"model": ["tiny"], "strategy": ["zero2"], "precision": ["fp32"], "gpus": [2]}}, "s"
    ).expand(gpus_per_node=2)[0]
    assert "deepspeed_config" not in none.identity() and "nvme_path" not in none.identity()  # old run_ids hold
    # the record's spec says what ran, and reads back as the same cell
    doc = json.loads(json.dumps(spec_to_json(a)))
    assert doc["deepspeed_config"] == {"zero_optimization": {"reduce_bucket_size": 1000}}
    again = spec_from_json(doc)
    assert again == a and again.run_id == a.run_id and hash(again) == hash(a)


def test_a_nested_config_with_lists_is_frozen_and_hashes():
    doc = {
        "name": "t",
        "matrix": {"model": ["tiny"], "strategy": ["zero3"], "precision": ["fp32"], "gpus": [2]},
        "settings": {
            "deepspeed_config": {"comms_logger": {"ranks": [0, 1]}, "zero_optimization": {"sub_group_size": 10}}
        },
    }
    (spec,) = parse_scenario(doc, "s").expand(gpus_per_node=2)
    assert hash(spec) == hash(dataclasses.replace(spec))
    with pytest.raises(TypeError):
        spec.settings.deepspeed_config["zero_optimization"]["sub_group_size"] = 1  # type: ignore[index]
    again = spec_from_json(json.loads(json.dumps(spec_to_json(spec))))
    assert again == spec and again.run_id == spec.run_id


# ---- bad files: one line each, exit 2, no traceback -------------------------------------------------------------


def test_bad_files_are_one_line_each_through_the_cli(tmp_path):
    (tmp_path / "bad.json").write_text('{"a": ')
    (tmp_path / "list.json").write_text("[1, 2]")
    (tmp_path / "bucket.json").write_text('{"zero_optimization": {"reduce_bucket_size": "big"}}')
    p = tmp_path / "s.yaml"
    p.write_text(
        "name: t\nmatrix:\n  model: [tiny]\n  strategy: [zero3]\n  precision: [fp32]\n  gpus: [2]\n"
        "  deepspeed_config: [bad.json, list.json, missing.json, bucket.json, {zero_optimization: 3}]\n"
    )
    out = subprocess.run(
        [sys.executable, "-m", "harness.cli", "plan", str(p)],
        capture_output=True,
        text=True,
        cwd=REPO,
        env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"},
        timeout=120,
    )
    assert out.returncode == 2, out.stderr
    assert "Traceback" not in out.stderr
    lines = out.stderr.strip().splitlines()
    where = f"error: {p}: matrix.deepspeed_config"
    assert lines == [
        f"{where}[0]: 'bad.json' is not JSON: Expecting value at line 1 column 7 ({tmp_path / 'bad.json'})",
        f"{where}[1]: 'list.json' holds a JSON array, not an object ({tmp_path / 'list.json'})",
        f"{where}[2]: 'missing.json': no such file ({tmp_path / 'missing.json'})",
        f"{where}[3]: 'bucket.json': zero_optimization.reduce_bucket_size is 'big', not a whole number >= 0 (elements)",
        f"{where}[4]: the mapping: zero_optimization is 3, not an object",
    ]


# ---- the planner prices the cell's values ----------------------------------------------------------------------


def test_zero2_reduce_bucket_size_moves_memory_and_calls_as_the_model_says(tmp_path):
    default = cells(scenario(tmp_path, {}))["zero2"]
    small = cells(scenario(tmp_path, {"zero_optimization": {"reduce_bucket_size": 5000}}))["zero2"]
    m0, m1 = mb.memory(default, device="cpu"), mb.memory(small, device="cpu")
    # the contiguous reduce bucket (fp32: 4 B an element), allocated in full, held at every moment of the backward:
    # each moment is lighter by exactly the elements it lost (the peak moves to the loss's backward then)
    assert m0.window == BLOCK_BACKWARD and m1.window != m0.window
    for window in (HEAD_BACKWARD, BLOCK_BACKWARD, BACKWARD_END):
        assert m0.window_totals[window] - m1.window_totals[window] == 4 * (DS_REDUCE_BUCKET_ELEMS - 5000), window
    c0, c1 = cm.predict_comm(default), cm.predict_comm(small)
    order = [p.numel for p in reversed(parameters(small.model_config))]  # ZeRO-2: gradient hooks, reverse order
    n_buckets = len(ds_ipg_buckets(order, cap=5000))
    assert n_buckets == 17 and len(ds_ipg_buckets(order)) == 1  # tiny: 21 parameters, the norms share
    assert c1["by_collective"]["all_reduce"]["calls"] - c0["by_collective"]["all_reduce"]["calls"] == n_buckets - 1
    assert c1["bytes_per_step"] == c0["bytes_per_step"]  # the same gradients, cut differently


def test_zero3_persistence_threshold_and_prefetch_move_bytes_and_memory(tmp_path):
    user = {"zero_optimization": {"stage3_param_persistence_threshold": 0, "stage3_prefetch_bucket_size": 0}}
    default = cells(scenario(tmp_path, {}, strategies=("zero3",)))["zero3"]
    changed = cells(scenario(tmp_path, user, strategies=("zero3",)))["zero3"]
    c0, c1 = cm.predict_comm(default), cm.predict_comm(changed)
    # every tiny parameter is persistent by default (<= 1e5 elements): gathered once after the step; with the
    # threshold 0 none is, and each is gathered in forward one module at a time (no prefetch), kept for backward
    n = len(parameters(default.model_config))
    assert c0["by_collective"]["all_gather"]["calls"] == n
    assert c1["by_collective"]["all_gather"]["calls"] == n
    assert all("persistent" in i["what"] for i in c0["items"] if i["collective"] == "all_gather")
    assert not any("persistent" in i["what"] for i in c1["items"])
    m0, m1 = mb.memory(default, device="cpu"), mb.memory(changed, device="cpu")
    persistent = sum(p.numel for p in parameters(default.model_config))
    assert m0.params - m1.params == 4 * persistent  # fp32: no parameter stays gathered between steps


def test_a_key_the_planner_does_not_model_nulls_the_collectives_with_its_name(tmp_path):
    spec = cells(scenario(tmp_path, {"zero_optimization": {"overlap_comm": True, "round_robin_gradients": True}}))[
        "zero2"
    ]
    assert cm.predict_comm(spec) is None
    assert cm.no_comm_model_reason(spec) == (
        "deepspeed_config sets zero_optimization.overlap_comm, zero_optimization.round_robin_gradients, which the "
        "collective model does not model"
    )
    assert "not modelled: zero_optimization.overlap_comm" in mb.memory(spec, device="cpu").notes["deepspeed_config"]
    # overlap_comm at its default for the stage (on for ZeRO-3), logging and pinning: modelled
    z3 = cells(
        scenario(
            tmp_path,
            {"zero_optimization": {"overlap_comm": True}, "tensorboard": {"enabled": True}},
            strategies=("zero3",),
        )
    )["zero3"]
    assert dc.unmodelled_keys(z3) == () and cm.predict_comm(z3) is not None


# ---- offload: nvme ----------------------------------------------------------------------------------------------


def test_nvme_runs_on_zero3_only_and_sets_both_swaps(tmp_path):
    assert [s.name for s in CATALOGUE.values() if "nvme" in s.offloads] == ["zero3"]
    doc = {
        "name": "t",
        "matrix": {"model": ["tiny"], "strategy": ["ddp", "zero2", "zero3"], "precision": ["fp32"], "gpus": [2]},
        "settings": {"offload": "nvme", "nvme_path": "/scratch/x"},
    }
    specs = {s.strategy: s for s in parse_scenario(doc, "s").expand(gpus_per_node=2)}
    assert specs["zero2"].unsupported_reason() == (
        "zero2: NVMe offload is DeepSpeed ZeRO-Infinity's, which swaps ZeRO-3's partitions (run it with zero3)"
    )
    assert "ddp: NVMe offload" in specs["ddp"].unsupported_reason()
    assert specs["zero3"].unsupported_reason() is None
    zero = dc.harness_config(specs["zero3"])["zero_optimization"]
    assert (
        zero["offload_optimizer"]
        == zero["offload_param"]
        == {"device": "nvme", "nvme_path": "/scratch/x", "pin_memory": True}
    )
    assert cm.no_comm_model_reason(specs["zero3"]) == cm.OFFLOAD_NOT_MODELLED["zero3"]
    mem = mb.memory(specs["zero3"], device="cpu")
    assert mem.cpu == 0 and mem.optimizer == 0 and "nvme_path" in mem.notes["cpu"]


def test_a_local_nvme_cell_is_skipped_before_launch_where_async_io_cannot_be_built(tmp_path):
    """For real: this host's DeepSpeed is asked whether its async I/O op builds (libaio); the sweep skips the cell
    with that reason and starts no rank."""
    from harness.launch.sweep import run_sweep
    from harness.scenario.cluster import load_cluster
    from harness.worker.strategies.zero import nvme_refusal

    why = nvme_refusal()
    if why is None:
        pytest.skip("this host builds DeepSpeed's async I/O op: the nvme cell runs (bench/gpu_check.sh)")
    assert "libaio" in why
    sc = parse_scenario(
        {
            "name": "nv",
            "matrix": {"model": ["tiny"], "strategy": ["zero3"], "precision": ["fp32"], "gpus": [2]},
            "settings": {"offload": "nvme"},
        },
        "s",
    )
    res = run_sweep(sc, load_cluster("local"), results=tmp_path / "results", echo=lambda line: None)
    (rec,) = res.records
    assert rec.status == "skipped" and rec.reason == why
    assert not (tmp_path / "results" / "nv" / ".scratch").exists()


def test_a_dotted_set_changes_one_key_of_the_files_config(tmp_path):
    path = scenario(tmp_path, {"zero_optimization": {"reduce_bucket_size": 1000}, "wall_clock_breakdown": True})
    (spec,) = load_scenario(path, overrides=["deepspeed_config.zero_optimization.sub_group_size=7"]).expand(
        gpus_per_node=2
    )
    assert spec.settings.deepspeed_config == {
        "zero_optimization": {"reduce_bucket_size": 1000, "sub_group_size": 7},
        "wall_clock_breakdown": True,
    }


def test_nvme_path_means_nothing_without_nvme_offload_and_keeps_the_run_id():
    doc = {
        "name": "t",
        "matrix": {
            "model": ["tiny"],
            "strategy": ["zero3"],
            "precision": ["fp32"],
            "gpus": [2],
            "offload": ["none", "nvme"],
        },
        "settings": {"nvme_path": "/scratch/x"},
    }
    plain, nvme = parse_scenario(doc, "s").expand(gpus_per_node=2)
    assert plain.settings.nvme_path == "" and nvme.settings.nvme_path == "/scratch/x"
    bare = parse_scenario({**doc, "settings": {}}, "s").expand(gpus_per_node=2)[0]
    assert plain.run_id == bare.run_id
