"""The `checkpoint` setting's pure parts (issue 34): run_id stability, what the planner predicts a checkpoint holds and
how long its save takes at the storage bandwidth, the profile's checkpoint_dir and storage figures, the calibration's
storage part, and the refusals. The phase itself runs in tests/dist/test_checkpoint.py."""

from __future__ import annotations

import dataclasses

import pytest

from harness.calibrate.storage import measure_storage
from harness.core.errors import InputError
from harness.launch.core.payload import make_payload
from harness.launch.run import with_checkpoint
from harness.plan import checkpoint as ck
from harness.plan.calibration import Found, ProfileRates, RatesSource
from harness.plan.calibration.example import example_calibration
from harness.plan.calibration.file import Calibration, parse_calibration
from harness.plan.calibration.rates import CalibratedRates
from harness.plan.predict import predict
from harness.scenario.cluster import load_cluster, parse_cluster
from harness.scenario.schema import parse_scenario
from tests.conftest import make_spec

N_125M = make_spec(strategy="ddp", model="125m").model_config.n_params()


def test_the_setting_at_its_default_keeps_every_run_id():
    plain = make_spec(strategy="zero3", precision="bf16")
    assert make_spec(strategy="zero3", precision="bf16", checkpoint=False).run_id == plain.run_id
    assert make_spec(strategy="zero3", precision="bf16", checkpoint=True).run_id != plain.run_id


def test_sweep_checkpoint_sets_it_where_the_scenario_does_not():
    doc = {"name": "s", "matrix": {"model": ["tiny"], "strategy": ["ddp"], "precision": ["fp32"], "gpus": [2],
                                   "checkpoint": [False]}}  # fmt: skip
    axis = parse_scenario(doc, "s.yaml")
    plain = parse_scenario({**doc, "matrix": {k: v for k, v in doc["matrix"].items() if k != "checkpoint"}}, "s.yaml")
    (cell,) = with_checkpoint(plain).expand(gpus_per_node=2)
    assert cell.settings.checkpoint is True
    (kept,) = with_checkpoint(axis).expand(gpus_per_node=2)  # the scenario's own axis decides its cells
    assert kept.settings.checkpoint is False and kept.run_id == plain.expand(gpus_per_node=2)[0].run_id


@pytest.mark.parametrize(
    "strategy,precision,per_param",
    [
        ("ddp", "fp32", 12),  # fp32 params + two moments (autocast keeps the params fp32: bf16 too)
        ("ddp", "bf16", 12),
        ("fsdp.full_shard", "bf16", 12),  # sharded fp32 params (mixed precision keeps them) + moments
        ("fsdp2.hybrid_shard", "bf16", 12),  # a hybrid's replicas are written once
        ("zero1", "fp32", 16),  # module state fp32 + fp32 master + moments
        ("zero2", "bf16", 14),  # module state bf16 + fp32 master + moments
        ("zero3", "bf16", 12),  # placeholders + partitions of master and moments
    ],
)
def test_predicted_bytes_are_the_state_each_format_stores(strategy, precision, per_param):
    gpus = 4 if "hybrid" in strategy else 2
    spec = make_spec(strategy=strategy, precision=precision, model="125m", gpus=gpus, checkpoint=True)
    assert ck.checkpoint_bytes(spec) == per_param * N_125M


def test_the_save_takes_the_slowest_nodes_bytes_at_the_write_bandwidth():
    ddp = make_spec(strategy="ddp", model="125m", gpus=4, checkpoint=True)  # 2 nodes of 2
    zero1 = make_spec(strategy="zero1", precision="bf16", model="125m", gpus=4, checkpoint=True)
    fsdp = make_spec(strategy="fsdp.full_shard", model="125m", gpus=4, checkpoint=True)
    assert ck.node_bytes(ddp) == 12 * N_125M  # rank 0 writes it all
    assert ck.node_bytes(zero1) == 2 * N_125M + 12 * N_125M // 2  # the module state, and the node's partitions
    assert ck.node_bytes(fsdp) == 12 * N_125M // 2
    cluster = dataclasses.replace(load_cluster("local"), performance=_storage_perf(write=2.0, read=4.0))
    rates = ProfileRates(RatesSource.of(cluster))
    out = ck.checkpoint_prediction(fsdp, rates)
    assert out == {"checkpoint_bytes": 12 * N_125M, "checkpoint_s": pytest.approx(12 * N_125M / 2 / 2e9)}
    assert rates.storage_s(4e9, op="read") == pytest.approx(1.0)


def test_without_a_storage_bandwidth_the_save_time_is_null_with_the_reason():
    spec = make_spec(strategy="ddp", checkpoint=True)
    pred = predict(spec, load_cluster("h100"))
    assert pred.checkpoint_bytes == 12 * spec.model_config.n_params() and pred.checkpoint_s is None
    assert "storage.write_gbps" in pred.checkpoint_null_reasons["checkpoint_s"]
    assert "h100" in pred.checkpoint_null_reasons["checkpoint_s"]


def test_a_cell_without_the_setting_predicts_exactly_what_it_did():
    d = predict(make_spec(strategy="ddp"), load_cluster("local")).to_dict()
    assert not [k for k in d if k.startswith("checkpoint")]


def test_checkpoint_dir_is_an_absolute_path_and_reaches_the_ranks_only_when_set(tmp_path):
    base = {"name": "c", "executor": "local", "device": "cpu"}
    with pytest.raises(InputError, match="checkpoint_dir: 'rel/dir' is not an absolute path"):
        parse_cluster({**base, "checkpoint_dir": "rel/dir"}, "c.yaml")
    cluster = parse_cluster({**base, "checkpoint_dir": str(tmp_path)}, "c.yaml")
    spec = make_spec(strategy="ddp", checkpoint=True)
    payload = make_payload(spec, sweep="s", cluster=cluster, results=tmp_path, sha=None, predicted=None)
    assert payload.cluster.checkpoint_dir == str(tmp_path)
    plain = make_payload(spec, sweep="s", cluster=load_cluster("local"), results=tmp_path, sha=None, predicted=None)
    assert "checkpoint_dir" not in plain.cluster.to_dict()


def test_refusals_say_why():
    assert (
        "needs checkpoint: true"
        in make_spec(strategy="ddp", inject={"fault": "checkpoint_truncate"}).unsupported_reason()
    )
    assert (
        make_spec(strategy="ddp", checkpoint=True, inject={"fault": "checkpoint_truncate"}).unsupported_reason() is None
    )
    tp = make_spec(strategy="fsdp2.full_shard", tp=2, checkpoint=True)
    assert "checkpoint is not part of the tensor- and pipeline-parallel layouts" in tp.unsupported_reason()


def test_calibrate_measures_the_folder_and_the_rates_price_with_it(tmp_path):
    storage = measure_storage(tmp_path / "ckpt", quick=True)
    assert storage.bytes == 32 * 2**20 and storage.write_gbps > 0 and storage.read_gbps > 0
    assert list((tmp_path / "ckpt").iterdir()) == []  # the probe file is gone
    doc = {**example_calibration("local"), "storage": storage.to_dict()}
    cal = parse_calibration(doc, file="x.json")
    assert Calibration.model_validate(cal.to_dict()) == cal
    rates = CalibratedRates(Found(path=tmp_path / "x.json", calibration=cal, forced=None))
    assert rates.storage_s(1e9, op="write") == pytest.approx(1.0 / storage.write_gbps)
    older = CalibratedRates(Found(path=tmp_path / "x.json", calibration=parse_calibration(
        example_calibration("local"), file="x.json"), forced=None))  # fmt: skip
    with pytest.raises(Exception, match="no storage bandwidth measured in x.json"):
        older.storage_s(1e9, op="write")


def _storage_perf(*, write: float, read: float):
    from harness.scenario.performance import Performance, StorageFigures

    return Performance(storage=StorageFigures(write_gbps=write, read_gbps=read), sources={"storage": "test"})


def test_a_profile_states_storage_figures_or_null():
    for name in ("a100", "h100", "h200"):
        perf = load_cluster(name).performance
        assert perf.storage.write_gbps is None and perf.storage.read_gbps is None  # a site's file system, not the GPU's
    cluster = parse_cluster(
        {"name": "p", "performance": {"storage": {"write_gbps": 1.5, "read_gbps": None}, "sources": {"storage": "x"}}},
        "p.yaml",
    )
    assert cluster.performance.storage.write_gbps == 1.5 and cluster.performance.storage.read_gbps is None
    with pytest.raises(InputError, match="performance.storage.write_mbps"):
        parse_cluster({"name": "p", "performance": {"storage": {"write_mbps": 1}}}, "p.yaml")
