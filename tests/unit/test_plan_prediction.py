"""The typed prediction (harness.plan.prediction) and the typed projection document (harness.plan.projection):
every `predicted` section the harness wrote before reads back and writes out as it was, strictly typed; a
projection file that is not one is refused with the file, the key path and the value."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from pydantic import ValidationError

from harness.core.errors import InputError
from harness.plan import calibration as cal
from harness.plan import predict as planner
from harness.plan import projection as pj
from harness.plan.prediction import TIME_FIELDS, Prediction, TimePrediction
from harness.report.plan import planned_cell_json
from harness.scenario.cluster import load_cluster
from tests.conftest import make_spec

REPO = Path(__file__).resolve().parents[2]


def recorded_predictions() -> list[tuple[Path, dict]]:
    """(file, predicted section) of every record the repository keeps: the committed baseline, the report
    fixtures, the documented example."""
    files = sorted((REPO / "baselines").rglob("*.json")) + sorted((REPO / "tests" / "fixtures").rglob("*.json"))
    out = []
    for f in [*files, REPO / "docs" / "record-example.json"]:
        try:
            doc = json.loads(f.read_text())
        except ValueError:  # the fixtures of unreadable records
            continue
        if isinstance(doc, dict) and doc.get("predicted"):
            out.append((f, doc["predicted"]))
    return out


def test_every_recorded_prediction_reads_back_and_writes_out_unchanged():
    found = recorded_predictions()
    assert len(found) >= 30
    for path, predicted in found:
        p = Prediction.model_validate(predicted)
        assert p.to_dict() == predicted, path
        if "fixtures" not in path.parts:  # written by the harness (the fixtures are hand-made, in another key order)
            assert json.dumps(p.to_dict()) == json.dumps(predicted), path
    # sections from before the step-time model: no time field, and none is written back
    old = [p for _, p in found if "step_time_s" not in p]
    assert old and all(not set(Prediction.model_validate(p).to_dict()) & set(TIME_FIELDS) for p in old)


def test_a_prediction_is_strict_frozen_and_keeps_what_it_does_not_know():
    base = {"memory_gib": {"total": 1.5}, "device_memory_gib": 80, "fits": True}
    p = Prediction.model_validate({**base, "from_a_newer_harness": [1, 2]})
    assert p.to_dict() == {**base, "from_a_newer_harness": [1, 2]}
    assert isinstance(p.device_memory_gib, int)  # an int stays an int: `80` is written back as `80`, not `80.0`
    with pytest.raises(ValidationError):
        Prediction.model_validate({**base, "fits": "yes"})
    with pytest.raises(ValidationError):
        Prediction.model_validate({**base, "step_time_s": "0.1"})
    with pytest.raises(ValidationError):
        p.fits = False  # type: ignore[misc]


def test_predict_is_typed_and_its_json_is_the_plans(tmp_path, monkeypatch):
    monkeypatch.setenv(cal.CALIBRATION_DIR_ENV, str(tmp_path))
    (tmp_path / f"h100{cal.SUFFIX}").write_text(json.dumps(cal.example_calibration("h100", device="cuda", tflops=400)))
    cluster = load_cluster("h100")
    spec = make_spec(strategy="fsdp2.full_shard", model="125m", gpus=8, precision="bf16", gpus_per_node=8)
    p = planner.predict(spec, cluster)
    assert isinstance(p, Prediction) and p.step_time_s is not None and p.memory_gib is not None
    assert p.time_s is not None and p.step_time_s == pytest.approx(
        sum(getattr(p.time_s, k) for k in ("compute", "recompute", "optimizer", "comm_exposed", "other"))
    )
    assert isinstance(p.time(), TimePrediction) and p.time().step_time_s == p.step_time_s
    (cell,) = planner.plan_cells([spec], cluster)
    doc = planned_cell_json(cell)
    assert list(doc)[:4] == ["run_id", "spec", "cannot_place", "unsupported"]
    plan_own = ("run_id", "spec", "cannot_place", "unsupported", "mfu_bf16_peak")  # NOTE: the plan's, not a record's
    assert {k: v for k, v in doc.items() if k not in plan_own} == p.to_dict()
    assert doc["mfu_bf16_peak"] == pytest.approx(p.mfu)  # a bf16 cell: its own peak is bf16's
    assert Prediction.model_validate(p.to_dict()) == p


def test_a_projection_reads_back_as_written(tmp_path):
    cluster = load_cluster("h100")
    rates = cal.ProfileRates(cluster)
    specs = [make_spec(strategy="ddp", model="125m", gpus=8, gpus_per_node=8, precision="bf16")]
    rows = pj.project(specs, cluster, [8, 16], rates=rates)
    doc = pj.projection_document(rows, cluster, [8, 16], rates)
    path = tmp_path / "p.json"
    path.write_text(json.dumps(doc.to_dict(), indent=2))
    back = pj.read_projection(path)
    assert back == doc and json.dumps(back.to_dict(), indent=2) == path.read_text()


@pytest.mark.parametrize(
    ("content", "where"),
    [
        ("{not json", ": not JSON: "),
        ("[1, 2]", ": is a list, not a `harness plan SCENARIO --project GPUS --format json` document"),
        ('{"cluster": "h100", "gpus_per_node": 8, "gpus": [8], "rates": "x"}', ": lacks rows ("),
        (
            '{"cluster": "h100", "gpus_per_node": 8, "gpus": [8], "rates": "x", "rows": [{"model": "m"}]}',
            ": rows[0]: lacks strategy, layout, precision, settings, points (",
        ),
        (
            '{"cluster": "h100", "gpus_per_node": 8, "gpus": [8], "rates": "x", "rows": [{"model": "m", '
            '"strategy": "ddp", "layout": "ddp", "precision": "bf16", "settings": {}, "points": [{"gpus": 8, '
            '"tokens_per_s_per_gpu": "fast"}]}]}',
            ": rows[0].points[0].tokens_per_s_per_gpu: 'fast' is not a number (",
        ),
        (
            '{"cluster": "h100", "gpus_per_node": 8, "gpus": [8], "rates": "x", "rows": [{"model": "m", '
            '"strategy": "ddp", "layout": "ddp", "precision": "bf16", "settings": {}, "points": [{"gpus": 0}]}]}',
            ": rows[0].points[0].gpus: 0: Input should be greater than or equal to 1 (",
        ),
        ('{"cluster": "h100", "gpus_per_node": "8", "gpus": [8], "rates": "x", "rows": []}', ": gpus_per_node: '8'"),
    ],
)
def test_a_file_that_is_not_a_projection_is_refused_with_its_key(tmp_path, content, where):
    bad = tmp_path / "bad.json"
    bad.write_text(content)
    with pytest.raises(InputError) as e:
        pj.read_projection(bad)
    assert f"{bad}{where}" in str(e.value) and "Traceback" not in str(e.value)
    with pytest.raises(InputError, match="cannot read it"):
        pj.read_projection(tmp_path / "absent.json")
