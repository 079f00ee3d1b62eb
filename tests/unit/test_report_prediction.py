"""The time model in the report (issue 16): each cell's predicted step time beside its measurement, in the model
tables, the summary (MAPE, Spearman), the predicted-vs-measured figure and the breakdown figure.

Records: the committed fixture sweep (tests/fixtures/records/fixture-h100), each ok cell given a `predicted`
section whose step time misses the measured median by a known error, so every figure of the accuracy is known."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from scipy.stats import spearmanr

from harness.report import build_report
from harness.report.figures import STRATEGY_STYLE, all_figures
from harness.report.figures.time_breakdown import PART_STYLE
from harness.report.formats import fmt_ms
from harness.report.frame import PREDICTED_PARTS, figure_cells, load_frame, prediction_accuracy
from tests.unit.test_report import _has_colour, md_rows, md_section

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "records" / "fixture-h100"
ERRORS = (0.10, -0.05, 0.20, -0.12, 0.03, 0.0, -0.30, 0.08)
"""predicted / measured − 1, cycled over the ok cells in file order"""
SHARES = {"compute": 0.55, "recompute": 0.0, "optimizer": 0.1, "comm_exposed": 0.25, "other": 0.1}
"""each part's share of the predicted step time"""


def _records() -> list[tuple[str, dict]]:
    out = []
    for path in sorted(FIXTURES.glob("*.json")):
        try:
            out.append((path.name, json.loads(path.read_text())))
        except ValueError:
            continue  # the fixture's deliberately truncated record
    return out


def with_predictions(dst: Path, *, leave_out: tuple[str, ...] = ()) -> dict[str, tuple[float, float]]:
    """The fixture's records in `dst`, every ok cell (but those whose file name starts with one of `leave_out`)
    with a predicted step time; {file name: (predicted, measured)}."""
    dst.mkdir(parents=True)
    known: dict[str, tuple[float, float]] = {}
    i = 0
    for name, rec in _records():
        measured = ((rec.get("metrics") or {}).get("step_time_s") or {}).get("median")
        if rec["status"] == "ok" and measured and not name.startswith(leave_out):
            predicted = measured * (1 + ERRORS[i % len(ERRORS)])
            i += 1
            parts = {p: predicted * SHARES[p] for p in PREDICTED_PARTS}
            rec.setdefault("predicted", {}).update(
                step_time_s=predicted,
                time_s={**parts, "comm_total": predicted * 0.4},
                calibration="calibrated tests/fixture 2026-12-01",
                step_time_deviation=measured / predicted - 1,
            )
            known[name] = (predicted, measured)
        (dst / name).write_text(json.dumps(rec))
    return known


@pytest.fixture(scope="module")
def predicted_report(tmp_path_factory):
    root = tmp_path_factory.mktemp("prediction")
    known = with_predictions(root / "records")
    return build_report([root / "records"], out=root / "report"), known


def test_accuracy_is_the_mean_absolute_percentage_error_and_spearman(predicted_report):
    report, known = predicted_report
    shown = [known[Path(p).name] for p in report["cells"]["path"] if Path(p).name in known]
    assert len(shown) == 21  # of 22 ok records: one is an older record of a cell, set aside
    pred, meas = [p for p, _ in shown], [m for _, m in shown]
    acc = prediction_accuracy(report["cells"])
    assert acc["cells"] == 21
    expected = sum(abs(p - m) / m for p, m in shown) / 21
    assert acc["mape"] == pytest.approx(expected, rel=1e-12)
    assert acc["spearman"] == pytest.approx(spearmanr(pred, meas).statistic, rel=1e-12)
    assert acc["within_band"] == pytest.approx(sum(abs(p / m - 1) <= 0.15 for p, m in shown) / 21)
    assert set(acc["by_family"]) == {"ddp", "fsdp", "fsdp2", "zero"}
    assert sum(n for n, _ in acc["by_family"].values()) == 21
    md = report["paths"]["markdown"].read_text()
    assert f"MAPE {expected:.1%} over 21 cells" in md


def test_model_tables_show_the_prediction_and_the_deviation(predicted_report):
    report, known = predicted_report
    md = report["paths"]["markdown"].read_text()
    section = md_section(md, "### 125m · 2 GPUs")
    header = next(line for line in section.splitlines() if line.startswith("| strategy"))
    cols = [c.strip() for c in header.strip("|").split("|")]
    assert "step predicted (ms)" in cols and "measured vs predicted" in cols
    rows = {(r[0], r[1]): r for r in md_rows(section[: section.find("\n### ", 1)])}
    pred, meas = known["125m-ddp-bf16-g2-bca7e9c191.json"]
    row = rows[("ddp", "bf16")]
    assert row[cols.index("step predicted (ms)")] == fmt_ms(pred) == f"{pred * 1e3:,.0f}"
    assert row[cols.index("measured vs predicted")] == f"{100 * (meas / pred - 1):+.1f}%"


def test_both_figures_are_drawn_with_their_colours(predicted_report):
    report, _ = predicted_report
    figs = {f.name: f for f in report["figures"]}
    assert figs["prediction"].png is not None and figs["time_breakdown"].png is not None
    assert figs["prediction"].note == ""  # every ok cell has a prediction, all calibrated
    out = report["out"]
    assert _has_colour(out / "prediction.png", STRATEGY_STYLE["fsdp2.full_shard"][0])
    for part in ("compute", "optimizer", "comm_exposed", "other"):
        assert _has_colour(out / "time_breakdown.png", PART_STYLE[part][0]), part
    assert not _has_colour(out / "time_breakdown.png", PART_STYLE["recompute"][0])  # 0 s: not drawn
    html = report["paths"]["html"].read_text()
    assert 'data-figures="7"' in html


def test_cells_without_a_prediction_are_counted_and_a_reason_is_given(tmp_path):
    known = with_predictions(tmp_path / "records", leave_out=("125m-ddp",))
    report = build_report([tmp_path / "records"], out=tmp_path / "report")
    figs = {f.name: f for f in report["figures"]}
    assert figs["prediction"].note.startswith("4 cell(s) that ran ok have no prediction and are not drawn.")
    assert len(known) == 18 and prediction_accuracy(report["cells"])["cells"] == 17  # one set aside, as above
    # no prediction at all, with the time model's reason in the records: the figures say it, the tables have no
    # prediction columns
    src = tmp_path / "null"
    src.mkdir()
    for name, rec in _records():
        rec.setdefault("predicted", {})["time_null_reasons"] = {"step_time_s": "no calibration for cluster 'h100'"}
        (src / name).write_text(json.dumps(rec))
    report = build_report([src], out=tmp_path / "null-report")
    figs = {f.name: f for f in report["figures"]}
    for name in ("prediction", "time_breakdown"):
        assert figs[name].png is None
        assert figs[name].note == (
            "No data: no cell that ran ok has a predicted step time; the most common reason: no calibration for "
            "cluster 'h100'."
        )
    assert "| step predicted (ms) |" not in report["paths"]["markdown"].read_text()
    df, _ = load_frame(src)
    assert set(df["predicted_time_null_reason"].dropna()) == {"no calibration for cluster 'h100'"}


def test_drawn_in_parallel_processes_they_are_the_same_pngs(predicted_report):
    report, _ = predicted_report
    serial = report["figures"]  # 21 cells: drawn in this process
    parallel = all_figures(figure_cells(report["cells"]), workers=2)
    assert [f.name for f in parallel] == [f.name for f in serial]
    assert [f.png for f in parallel] == [f.png for f in serial]
