"""The scale-out projection drawn (issue 16): `harness plan --project … --figure PNG` for a plan, `harness report DIR
--projection FILE` beside a measured sweep (the measured cells on their projected lines); a file that is not a
projection is exit 2 with the file, the key and the value, and nothing written."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from harness.cli import main
from harness.core.errors import InputError
from harness.plan.projection import ProjectedRow, Projection, read_projection
from harness.report import build_report
from harness.report.figures import STRATEGY_STYLE
from harness.report.frame import figure_cells, load_frame
from harness.report.projection import _measured, projection_figure
from tests.unit.test_report import PNG_MAGIC, _has_colour

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "records" / "fixture-h100"
SMOKE = Path(__file__).resolve().parents[2] / "scenarios" / "smoke.yaml"
SETTINGS = {"micro_batch": 8, "seq_len": 2048, "grad_accum": 1, "tp": 1, "pp": 1}
"""the fixture's cells' settings (its records' spec)"""


def point(gpus: int, tps: float | None, *, fits: bool | None = True, reason: str | None = None) -> dict:
    return {
        "gpus": gpus,
        "nodes": max(1, gpus // 8),
        "step_time_s": None if tps is None else 8 * 2048 / tps,
        "tokens_per_s_per_gpu": tps,
        "mfu": None,
        "fits": fits,
        "reason": reason,
    }


def projection_doc() -> dict:
    """Two models; 125m ddp and fsdp2 bf16 at 2..64 GPUs (ddp does not fit at 64, fsdp2 has a null point at 64),
    1.3b zero3 bf16."""
    return {
        "cluster": "h100",
        "gpus_per_node": 8,
        "gpus": [2, 4, 8, 16, 64],
        "rates": "uncalibrated: profile figures (test)",
        "rows": [
            {
                "model": "125m",
                "strategy": "ddp",
                "layout": "ddp",
                "precision": "bf16",
                "settings": SETTINGS,
                "points": [point(g, 150_000 - 1_000 * g, fits=g < 64) for g in (2, 4, 8, 16, 64)],
            },
            {
                "model": "125m",
                "strategy": "fsdp2.full_shard",
                "layout": "fsdp2.full_shard",
                "precision": "bf16",
                "settings": SETTINGS,
                "points": [point(g, 160_000 - 2_000 * g) for g in (2, 4, 8, 16)]
                + [point(64, None, fits=None, reason="the h100 profile has no inter_node.busbw_gbps")],
            },
            {
                "model": "1.3b",
                "strategy": "zero3",
                "layout": "zero3",
                "precision": "bf16",
                "settings": SETTINGS,
                "points": [point(g, 20_000 - 100 * g) for g in (2, 4, 8, 16, 64)],
            },
        ],
    }


def test_measured_cells_are_found_on_their_projected_line():
    df, _ = load_frame(FIXTURES)
    fc = figure_cells(df)
    row = projection_doc()["rows"][0]
    gpus, tps = _measured(fc, ProjectedRow.model_validate_json(json.dumps(row)))
    assert sorted(zip(gpus.tolist(), tps.tolist())) == [(2.0, 152000.0), (4.0, 148500.0)]  # the fixture's records
    other = ProjectedRow.model_validate_json(json.dumps({**row, "settings": {**SETTINGS, "seq_len": 1024}}))
    assert len(_measured(fc, other)[0]) == 0  # another configuration is another line


def test_figure_with_measured_cells_and_null_points(tmp_path):
    doc_path = tmp_path / "projection.json"
    doc_path.write_text(json.dumps(projection_doc()))
    report = build_report([FIXTURES], out=tmp_path / "report", projection=read_projection(doc_path))
    fig = next(f for f in report["figures"] if f.name == "projection")
    assert fig.png is not None and fig.png[:8] == PNG_MAGIC
    assert (
        fig.note
        == "Not drawn (null, with the model's reason): 1 point(s): the h100 profile has no inter_node.busbw_gbps."
    )
    assert "Large black-rimmed markers = measured" in fig.caption and "uncalibrated: profile figures" in fig.caption
    png = report["out"] / "projection.png"
    assert _has_colour(png, STRATEGY_STYLE["fsdp2.full_shard"][0]) and _has_colour(png, STRATEGY_STYLE["zero3"][0])
    assert 'data-figures="6"' in report["paths"]["html"].read_text()  # the fixture's five and this one
    # drawn for a plan alone (no measured cells): same rows, no measured marker in the caption
    alone = projection_figure(Projection.model_validate_json(json.dumps(projection_doc())))
    assert alone.png is not None and "measured" not in alone.caption


def test_a_projection_with_no_point_says_why():
    doc = projection_doc()
    for row in doc["rows"]:
        row["points"] = [point(8, None, fits=None, reason="uncalibrated: no fp32 matmul rate")]
    fig = projection_figure(Projection.model_validate_json(json.dumps(doc)))
    assert fig.png is None
    assert fig.note == "No data: no projected point has a step time (3 point(s): uncalibrated: no fp32 matmul rate)."


@pytest.mark.parametrize(
    ("content", "where"),
    [
        ("{not json", "not JSON"),
        ("[1, 2]", "is a list, not a `harness plan SCENARIO --project GPUS --format json` document"),
        ('{"cluster": "h100", "gpus_per_node": 8, "gpus": [8], "rates": "x"}', "lacks rows"),
        (
            '{"cluster": "h100", "gpus_per_node": 8, "gpus": [8], "rates": "x", "rows": [{"model": "m"}]}',
            "rows[0]: lacks strategy, layout, precision, settings, points",
        ),
    ],
)
def test_a_file_that_is_not_a_projection_is_refused_with_its_key(tmp_path, content, where):
    bad = tmp_path / "bad.json"
    bad.write_text(content)
    with pytest.raises(InputError) as e:
        read_projection(bad)
    assert str(bad) in str(e.value) and where in str(e.value)


def test_report_cli_refuses_a_bad_projection_before_writing_anything(tmp_path, capsys):
    bad = tmp_path / "bad.json"
    doc = projection_doc()
    doc["rows"][0]["points"][1]["tokens_per_s_per_gpu"] = "fast"
    bad.write_text(json.dumps(doc))
    out = tmp_path / "report"
    assert main(["report", str(FIXTURES), "-o", str(out), "--projection", str(bad)]) == 2
    err = capsys.readouterr().err
    assert f"error: {bad}: rows[0].points[1].tokens_per_s_per_gpu: 'fast' is not a number" in err
    assert "Traceback" not in err and not out.exists()


def test_plan_draws_its_projection_to_a_png(tmp_path, capsys):
    png = tmp_path / "figs" / "projection.png"
    args = ["plan", str(SMOKE), "--cluster", "h200", "--project", "1,2", "--format", "json"]
    assert main([*args, "--figure", str(png)]) == 0
    out, err = capsys.readouterr()
    assert json.loads(out)["cluster"] == "h200"  # stdout stays one JSON document; the figure's line is on stderr
    assert f"figure: {png}" in err and png.read_bytes()[:8] == PNG_MAGIC
    assert not list(png.parent.glob(".*.tmp"))  # written whole: no temporary left
    # without --project there is nothing to draw; a folder that cannot be written is refused before any work
    assert main(["plan", str(SMOKE), "--figure", str(png)]) == 2
    assert "--figure draws a projection: add --project GPUS" in capsys.readouterr().err
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    assert main([*args, "--figure", str(blocker / "p.png")]) == 2
    err = capsys.readouterr().err
    assert f"error: {blocker}: --figure:" in err and "Traceback" not in err
