"""Predictions that follow the calibration (issue 31): a report says which rates its records' predictions came
from; after `harness calibrate` it warns that they predate the cluster's current rates, and `--repredict` prices
every cell again with them (labelled), recomputing the deviation from the measured median. The record files are
never changed. Records: baselines/smoke-local (a real CPU sweep) with a known prediction source."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from harness.cli import main
from harness.plan import calibration as cal
from harness.plan.predict import clear_caches, predict
from harness.report import build_report
from harness.report.repredict import REPREDICTED
from harness.results.spec import spec_from_json
from harness.scenario.cluster import load_cluster

ROOT = Path(__file__).resolve().parents[2]
SMOKE = ROOT / "baselines" / "smoke-local"
OLD = "uncalibrated: profile figures (none given)"


@pytest.fixture
def records(tmp_path, monkeypatch) -> Path:
    """Six smoke records whose prediction says it came from the local profile's (absent) figures, and a
    calibration of the local cluster made since (harness.plan.calibration.example_calibration)."""
    src = tmp_path / "records"
    src.mkdir()
    for f in sorted(SMOKE.rglob("tiny-*.json"))[:6]:
        rec = json.loads(f.read_text())
        rec.setdefault("predicted", {})["calibration"] = OLD
        (src / f.name).write_text(json.dumps(rec))
    monkeypatch.setenv(cal.CALIBRATION_DIR_ENV, str(tmp_path / "cal"))
    (tmp_path / "cal").mkdir()
    (tmp_path / "cal" / f"local{cal.SUFFIX}").write_text(json.dumps(cal.example_calibration("local")))
    clear_caches()
    return src


def test_a_report_says_its_predictions_predate_the_calibration(records, tmp_path):
    now = cal.rates_for(load_cluster("local")).source
    assert now.startswith("calibrated ")
    result = build_report([records], out=tmp_path / "plain")
    (warning,) = [w for w in result["warnings"] if "--repredict" in w]
    assert warning == (
        f"6 record(s) of cluster 'local' were predicted with {OLD}; its cells are priced with {now} now (a "
        "calibration made or removed since): `harness report --repredict` predicts them again with it"
    )
    md = result["paths"]["markdown"].read_text()
    assert f"{OLD} (6)" in md  # the summary names the rates the predictions came from


def test_repredict_prices_every_cell_again_and_leaves_the_files(records, tmp_path):
    before = {f.name: f.read_bytes() for f in records.iterdir()}
    assert main(["report", str(records), "-o", str(tmp_path / "again"), "--repredict"]) == 0
    result = build_report([records], out=tmp_path / "again2", repredict=True)
    assert not [w for w in result["warnings"] if "--repredict" in w]
    df = result["frame"]
    now = cal.rates_for(load_cluster("local")).source
    assert set(df["prediction_source"]) == {REPREDICTED + now}
    for row in df.to_dict("records"):
        spec = json.loads((records / Path(row["path"]).name).read_text())["spec"]
        pred = predict(spec_from_json(spec), load_cluster("local"))
        assert row["predicted_step_time_s"] == pytest.approx(pred.step_time_s, rel=1e-12)
        assert row["step_time_deviation"] == pytest.approx(row["step_time_median_s"] / pred.step_time_s - 1, rel=1e-9)
    assert {f.name: f.read_bytes() for f in records.iterdir()} == before
    shutil.rmtree(tmp_path / "again")
