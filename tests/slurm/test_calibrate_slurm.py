"""`harness calibrate --cluster local-slurm` for real: the parts run as SLURM jobs on the localhost cluster's nodes
(the device part on one node, collectives across two), the file is written and a hybrid cell's cross-node groups
are priced with the inter-node curves it measured. `--quick` grid, one intra-node group size (worlds=(2,)): four
jobs, about two minutes."""

from __future__ import annotations

import os

import pytest

from harness.calibrate.run import calibrate, slurm_parts
from harness.cli import main
from harness.plan import calibration as cal
from harness.plan.time import predict_time
from harness.scenario.cluster import load_cluster
from tests.conftest import make_spec

pytestmark = pytest.mark.slurm


def _comm_total(pred) -> float | None:
    return pred.time_s.comm_total if pred.time_s is not None else None


def test_parts_of_a_slurm_profile():
    cluster = load_cluster("local-slurm")  # 2 ranks per node
    assert slurm_parts(cluster, (2, 4)) == [
        ("collectives on 2 ranks of one node", 1, 2, "intra"),
        ("collectives on 2 nodes, one rank each", 2, 1, "inter"),
        ("collectives on 2 nodes, 2 ranks each", 2, 2, "inter"),
    ]


def _scaled_inter(path, factor: float) -> None:
    """The file with its inter-node curves `factor` times slower, written back through its type."""
    calibration = cal.read_calibration(path)
    comm = [
        c.model_copy(update={"times": [t * factor for t in c.times], "latency_s": c.latency_s * factor,
                             "busbw_gbps": c.busbw_gbps / factor})
        if c.link == "inter" else c
        for c in calibration.comm
    ]  # fmt: skip
    before = path.stat().st_mtime_ns
    cal.write_calibration(path, calibration.model_copy(update={"comm": comm}))
    # NOTE: rates are cached per file mtime; a write within the clock tick of the last one would keep the old rates
    os.utime(path, ns=(path.stat().st_atime_ns, max(path.stat().st_mtime_ns, before + 10**6)))


def test_calibrate_on_slurm_measures_across_nodes(slurm_cluster, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv(cal.CALIBRATION_DIR_ENV, str(tmp_path))
    cluster = load_cluster("local-slurm")
    path = calibrate(cluster, quick=True, worlds=(2,))
    out = capsys.readouterr().out
    assert out.count("SLURM job") == 4, out
    assert path == tmp_path / f"local-slurm{cal.SUFFIX}"
    assert [p.name for p in tmp_path.iterdir()] == [path.name]  # the jobs' work folder is gone
    calibration = cal.read_calibration(path)
    assert calibration.cluster == "local-slurm" and calibration.fingerprint.hostname
    curves = {(e.link, e.collective, e.ranks) for e in calibration.comm}
    for coll in cal.BUS_FACTORS:
        assert {("self", coll, 1), ("intra", coll, 2), ("inter", coll, 2), ("inter", coll, 4)} <= curves
    for e in calibration.comm:  # busbw at each size is algbw × the nccl-tests factor
        assert e.busbw_at_sizes_gbps is not None
        for nbytes, t, bus in zip(e.sizes, e.times, e.busbw_at_sizes_gbps):
            assert bus == pytest.approx(cal.busbw_gbps(e.collective, e.ranks, nbytes, t))
    # the groups inside one node measured the host's sharing; the groups across nodes did not
    assert [e.ranks for e in calibration.sharing] == [1, 2]

    # a hybrid cell's replicate groups span the two nodes: slower inter-node curves make its comm slower; a cell
    # inside one node does not change
    hybrid = make_spec(strategy="fsdp.hybrid_shard", gpus=4, model="tiny", seq_len=64)
    inside = make_spec(strategy="ddp", gpus=2, model="tiny", seq_len=64)
    before = [_comm_total(predict_time(s, cluster, cal.rates_for(cluster))) for s in (hybrid, inside)]
    assert None not in before, predict_time(hybrid, cluster, cal.rates_for(cluster)).time_null_reasons
    _scaled_inter(path, 10.0)
    after = [_comm_total(predict_time(s, cluster, cal.rates_for(cluster))) for s in (hybrid, inside)]
    # the inter-node curves enter the hybrid's comm linearly: 1x -> 10x adds 9 parts, 10x -> 20x 10 more (every
    # multi-rank call also waits the measured wait per collective, which the curves' scale does not touch)
    inter = (after[0] - before[0]) / 9
    _scaled_inter(path, 2.0)
    twice = _comm_total(predict_time(hybrid, cluster, cal.rates_for(cluster)))
    assert inter > 0 and twice - after[0] == pytest.approx(10 * inter, rel=1e-3), (before, after, twice)
    assert after[1] == pytest.approx(before[1])


def test_calibrate_with_the_controller_down_is_one_line(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv(cal.CALIBRATION_DIR_ENV, str(tmp_path))
    monkeypatch.setenv("SLURM_CONF", str(tmp_path / "no-such-slurm.conf"))
    assert main(["calibrate", "--cluster", "local-slurm", "--quick"]) == 1
    err = capsys.readouterr().err
    assert "does not exist" in err and "nothing was submitted or written" in err and "Traceback" not in err
    assert list(tmp_path.iterdir()) == []
