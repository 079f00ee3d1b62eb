"""harness.plan.projection (`harness plan --project`): cells projected to other GPU counts at the profile's network
figures. Profiles here carry round numbers written in the test; never this machine's calibration."""

from __future__ import annotations

import dataclasses
import json

import pytest

from harness.cli import main
from harness.core.errors import InputError
from harness.plan import calibration as cal
from harness.plan import comm as cm
from harness.plan import overlap as ov
from harness.plan import projection as pj
from harness.plan import time as tm
from harness.report.plan import format_projection
from harness.scenario.cluster import load_cluster
from harness.scenario.performance import LinkFigures, Performance
from tests.conftest import make_spec

LAT_INTRA, BW_INTRA = 10e-6, 400.0
LAT_INTER, BW_INTER = 20e-6, 40.0


def profile(*, inter: bool = True):
    perf = Performance(
        matmul_tflops={"bf16": 800.0},
        memory_gbps=2000.0,
        intra_node=LinkFigures(busbw_gbps=BW_INTRA, latency_us=LAT_INTRA * 1e6),
        inter_node=LinkFigures(busbw_gbps=BW_INTER, latency_us=LAT_INTER * 1e6) if inter else LinkFigures(),
        sources={"all": "round numbers for a test"},
    )
    return dataclasses.replace(load_cluster("h100"), performance=perf)


def spec(strategy: str, gpus: int = 8, **kw):
    return make_spec(strategy=strategy, precision="bf16", gpus=gpus, model="1.3b", gpus_per_node=8, micro_batch=1,
                     seq_len=1024, **kw)  # fmt: skip


def test_gpu_lists_parse_and_bad_ones_are_refused(capsys, tmp_path):
    assert pj.parse_gpus("8..4096") == [8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096]
    assert pj.parse_gpus("64, 8,16,8") == [8, 16, 64]
    for bad in ("", "8..4", "x", "0,8", "8,-16"):
        with pytest.raises(InputError, match="--project"):
            pj.parse_gpus(bad)
    scenario = tmp_path / "s.yaml"
    scenario.write_text("name: s\nmatrix: {model: [tiny], strategy: [ddp], precision: [fp32], gpus: [2]}\n")
    assert main(["plan", str(scenario), "--project", "eight"]) == 2
    err = capsys.readouterr().err
    assert "--project" in err and "'eight'" in err and "8..4096" in err and "Traceback" not in err


def test_ddp_all_reduce_follows_the_ring_factor_on_each_link():
    cluster = profile()
    rates = cal.ProfileRates(cluster)
    base = spec("ddp")
    buckets = cm.ddp_buckets([n * 4 for n in reversed(cm.param_numels(base.model_config))])
    for gpus, lat, bw in ((8, LAT_INTRA, BW_INTRA), (64, LAT_INTER, BW_INTER), (4096, LAT_INTER, BW_INTER)):
        cell = pj.at_gpus(base, gpus, cluster)
        expected = sum(lat + b * 2 * (gpus - 1) / gpus / (bw * 1e9) for b in buckets)
        pred = tm.predict_time(cell, cluster, rates).to_dict()
        assert pred["time_s"]["comm_total"] == pytest.approx(expected, rel=1e-12), gpus
        (row,) = pj.project([base], cluster, [gpus], rates=rates)
        assert row.points[0].step_time_s == pred["step_time_s"]
    # 1.3b's 5.4 GB of fp32 gradients: at 64 GPUs on 40 GB/s, 2 x 63/64 x 5.4 GB / 40 GB/s ~ 0.27 s of all_reduce
    total = sum(buckets)
    assert 2 * 63 / 64 * total / 40e9 == pytest.approx(0.266, rel=0.01)


def test_hybrid_cells_use_inter_node_rates_beyond_one_node():
    cluster = profile()
    rates = cal.ProfileRates(cluster)
    (row,) = pj.project([spec("fsdp2.hybrid_shard", gpus=16)], cluster, [8, 16, 32], rates=rates)
    one, two, four = row.points
    assert one.step_time_s is None and "single node" in (one.reason or "")
    assert two.step_time_s and four.step_time_s
    cell = pj.at_gpus(spec("fsdp2.hybrid_shard", gpus=16), 32, cluster)
    calls = ov.collective_calls(cell, cluster, rates)
    shard = [(c, n) for c, n in calls if c.ranks == 8]
    replicate = [(c, n) for c, n in calls if c.ranks == 4]
    assert shard and replicate
    for c, _ in shard:  # inside a node: the intra figures
        factor = cal.bus_factor(c.collective, 8)
        assert c.seconds == pytest.approx(LAT_INTRA + c.nbytes * factor / (BW_INTRA * 1e9), rel=1e-12)
    for c, _ in replicate:  # one rank per node: the inter figures
        factor = cal.bus_factor(c.collective, 4)
        assert c.seconds == pytest.approx(LAT_INTER + c.nbytes * factor / (BW_INTER * 1e9), rel=1e-12)


def test_without_inter_node_figures_the_points_beyond_a_node_say_so():
    cluster = profile(inter=False)
    rates = cal.ProfileRates(cluster)
    (row,) = pj.project([spec("fsdp2.full_shard")], cluster, [4, 8, 16], rates=rates)
    four, eight, sixteen = row.points
    assert four.step_time_s and eight.step_time_s
    assert sixteen.step_time_s is None and "inter_node.busbw_gbps" in (sixteen.reason or "")
    text = format_projection([row], cluster, [4, 8, 16], rates)
    assert "-[1]" in text and "[1] uncalibrated: the h100 profile has no inter_node.busbw_gbps" in text


def test_layouts_that_do_not_divide_are_null_with_the_reason():
    cluster = profile()
    rates = cal.ProfileRates(cluster)
    (row,) = pj.project([spec("fsdp2.full_shard", tp=8)], cluster, [4, 8, 16], rates=rates)
    assert row.layout == "fsdp2.full_shard × tp8"
    assert "does not divide gpus 4" in (row.points[0].reason or "")
    assert row.points[1].step_time_s and row.points[2].step_time_s


def test_plan_project_json_through_the_cli(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv(cal.CALIBRATION_DIR_ENV, str(tmp_path))
    (tmp_path / f"h100{cal.SUFFIX}").write_text(json.dumps(cal.example_calibration("h100", device="cuda", tflops=400)))
    scenario = tmp_path / "s.yaml"
    scenario.write_text(
        "name: s\nmatrix: {model: [125m], strategy: [ddp, zero3], precision: [bf16], gpus: [8, 16]}\n"
        "settings: {micro_batch: 1, seq_len: 512}\n"
    )
    assert main(["plan", str(scenario), "--cluster", "h100", "--project", "8..64", "--format", "json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["gpus"] == [8, 16, 32, 64] and doc["gpus_per_node"] == 8
    assert [r["strategy"] for r in doc["rows"]] == ["ddp", "zero3"]  # one row per cell without its GPU count
    for r in doc["rows"]:
        assert [p["gpus"] for p in r["points"]] == [8, 16, 32, 64]
        assert all(p["step_time_s"] > 0 and p["tokens_per_s_per_gpu"] > 0 for p in r["points"])
    assert main(["plan", str(scenario), "--cluster", "h100", "--project", "8,16"]) == 0
    out = capsys.readouterr().out
    assert "8 GPUs" in out and "16 GPUs" in out and "zero3" in out
