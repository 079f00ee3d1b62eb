"""`harness calibrate` for real: the measuring processes (one device process, a 2-rank gloo group) write a
calibration file that the planner reads back and prices a held-out cell with. `--quick` grid; about a minute.

It runs on a terminal (a stream whose isatty() is true: harness.core.progress's status line, the processes' lines
relayed above it); tests/unit/test_progress.py has the relay of a process's lines, and their absence from a log."""

from __future__ import annotations

import contextlib
import json
import re

import pytest

from harness.calibrate.in_step import BOUNDS, PROBES
from harness.calibrate.run import calibrate
from harness.plan import calibration as cal
from harness.plan.calibration.rates import sharing_curves
from harness.plan.time import predict_time
from harness.scenario.cluster import load_cluster
from tests.conftest import make_spec
from tests.unit.test_progress import Terminal, screen

pytestmark = pytest.mark.dist


def test_calibrate_writes_a_file_the_planner_uses(tmp_path, monkeypatch, capfd):
    monkeypatch.setenv(cal.CALIBRATION_DIR_ENV, str(tmp_path))
    monkeypatch.setenv("COLUMNS", "200")
    term = Terminal()
    cluster = load_cluster("local")
    with contextlib.redirect_stdout(term):
        path = calibrate(cluster, quick=True, worlds=(2,))
    # on a terminal: the parts counted, an ETA once the device's part has ended; every process line above it
    raw = term.getvalue()
    assert "\rcalibrate local: 0/2 parts, 0s elapsed, ETA unknown · device" in raw
    assert re.search(r"\rcalibrate local: 1/2 parts, [0-9ms]+ elapsed, ETA [0-9ms]+ · collectives on 2 ranks", raw)
    rows = screen(raw)
    assert rows[0] == "calibrate: cluster local: device, one-rank collectives and framework overheads"
    assert "calibrate: collectives on 2 ranks" in rows and rows[-1] == ""  # the status line gone at the end
    assert any(r.startswith("calibrate: all_reduce float32 on 2 rank(s) (intra): latency ") for r in rows)
    assert [r for r in rows if "calibrate local: " in r] == []  # every status line was cleared, none was overwritten
    assert path == tmp_path / f"local{cal.SUFFIX}"
    assert json.loads(path.read_text())["format"] == cal.FORMAT
    calibration = cal.read_calibration(path)
    assert calibration.cluster == "local" and calibration.created_at and calibration.quick is True
    here = cal.host_fingerprint()
    assert all(getattr(calibration.fingerprint, k) == getattr(here, k) for k in cal.MATCH_KEYS)
    assert calibration.fingerprint.cpu_allocator == cluster.cpu_allocator
    c = calibration.compute
    assert {p.dtype for p in c.gemm} == {"float32", "bfloat16"}
    assert {p.layout for p in c.gemm} == {"nt", "nn", "tn"}
    assert all(p.s > 0 for p in c.gemm) and c.dispatch is not None and c.dispatch.forward_s > 0
    assert {"ddp/fp32", "fsdp.full_shard/bf16", "fsdp2.full_shard/fp32", "zero3/bf16"} <= set(c.framework)
    # the in-step fit: five plain steps per dtype, measured and priced, and three factors inside their bounds
    assert set(c.in_step) == {"float32", "bfloat16"}
    for fit in c.in_step.values():
        assert [p.probe for p in fit.probes] == list(PROBES)
        assert all(p.measured_s > 0 and p.kernels_s > 0 and p.elementwise_s > 0 and p.host_s > 0 for p in fit.probes)
        assert all(p.predicted_s == pytest.approx(p.kernels_s + p.elementwise_s + p.host_s) for p in fit.probes)
        assert all(BOUNDS[0] <= f <= BOUNDS[1] for f in (fit.kernels, fit.elementwise, fit.host))
    curves = {(e.link, e.collective, e.dtype, e.ranks) for e in calibration.comm}
    for coll in cal.BUS_FACTORS:
        assert ("self", coll, "float32", 1) in curves and ("intra", coll, "float32", 2) in curves
    for e in calibration.comm:  # busbw at each size is algbw × the nccl-tests factor
        assert e.busbw_at_sizes_gbps is not None and len(e.busbw_at_sizes_gbps) == len(e.sizes) == len(e.times)
        for nbytes, t, bus in zip(e.sizes, e.times, e.busbw_at_sizes_gbps):
            assert bus == pytest.approx(cal.busbw_gbps(e.collective, e.ranks, nbytes, t))
    # sharing: every probe on 2 ranks carries its slowdown against rank 0 alone, timed in the same repetitions
    assert [e.ranks for e in calibration.sharing] == [1, 2]
    two = calibration.sharing[1]
    for probe in ("gemm", "gemm_bfloat16", "elementwise", "optimizer", "step", "step_bfloat16"):
        assert two.field(f"{probe}_s") > 0 and two.field(f"{probe}_alone_s") > 0 and two.field(f"{probe}_slowdown") > 0
    # a micro-step's compute is stretched by the plain-step probe (what it is), not the GEMM's
    shared = sharing_curves(calibration.sharing)
    assert shared["compute"] == [(1, 1.0), (2, max(1.0, two.step_slowdown))]
    assert shared["compute_bfloat16"] == [(1, 1.0), (2, max(1.0, two.step_bfloat16_slowdown))]
    assert two.sync_wait_s is not None and two.sync_wait_s >= 0.0  # the wait per collective (measure_sync_wait)
    # the checkpoint folder's bandwidth: the profile has no checkpoint_dir, so the calibration file's folder
    assert calibration.storage is not None and calibration.storage.path == str(tmp_path)
    assert calibration.storage.bytes == 32 * 2**20 and calibration.storage.write_gbps > 0
    rates = cal.rates_for(cluster)
    assert rates.source.startswith(f"calibrated {path}")
    assert rates.storage_s(1e9, op="read") == pytest.approx(1.0 / calibration.storage.read_gbps)
    pred = predict_time(make_spec(strategy="fsdp.full_shard", gpus=2, model="125m", seq_len=128), cluster, rates)
    assert pred.step_time_s > 0 and pred.time_s.comm_total > 0
    # quiet (issue 31): no deprecation warning per collective call (about 80 lines before)
    printed = capfd.readouterr()
    assert "FutureWarning" not in printed.out + printed.err + raw
