"""Predicted and measured memory side by side in the report (issue 54): the table's memory columns, and the memory
figure's stacked breakdowns, on CPU and beside older records that drew (and still draw) the old way.

The worker does not write metrics.memory_gib yet, so the records here are real ones with a breakdown added: the
CPU smoke sweep as committed (tests/fixtures/smoke-legacy: gloo, 2 and 4 ranks, predicted breakdowns by the
planner) and the committed GPU fixture sweep (tests/fixtures/records/fixture-h100: predicted totals only). What the
figure draws is read from its matplotlib artists before it becomes a PNG.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import pytest
from matplotlib.collections import LineCollection, PolyCollection
from matplotlib.colors import to_rgba

from harness.report import build_report
from harness.report.figures import memory
from harness.report.frame import cell_table, figure_cells, load_frame, records_frame
from harness.results.metrics import MEMORY_CATEGORIES
from harness.results.store import as_record

ROOT = Path(__file__).resolve().parents[2]
SMOKE = ROOT / "tests" / "fixtures" / "smoke-legacy"
GPU = ROOT / "tests" / "fixtures" / "records" / "fixture-h100"
EXAMPLE = ROOT / "docs" / "record-example.json"
MEASURED_OVER_PREDICTED = {"params": 1.0, "grads": 1.5, "optimizer": 1.0, "activations": 1.25, "buffers": 2.0}
"""the measured category over the predicted one in the records made here"""
EXTRA_GIB = 0.0001
"""added to every measured category, so a category the planner predicts as 0 is drawn too (GiB)"""


def breakdown(parts: dict[str, float], *, rank: int = 0) -> dict:
    """metrics.memory_gib of the categories `parts` (GiB): their total, the rank, the phase, every rank's peak."""
    total = sum(parts.values())
    return {**parts, "total": total, "rank": rank, "phase": "backward", "per_rank_total": [total, total * 0.97]}


def measured_from_predicted(predicted: dict) -> dict[str, float]:
    return {c: predicted[c] * MEASURED_OVER_PREDICTED[c] + EXTRA_GIB for c in MEMORY_CATEGORIES}


def cpu_records(dst: Path, *, measured: bool = True, only: str | None = None) -> dict[str, dict]:
    """The CPU smoke records in `dst`, each ok one with a prediction given a measured breakdown (all of them, or only
    those whose strategy is `only`; none with measured=False); {file name: record as written}."""
    dst.mkdir(parents=True)
    out = {}
    for path in sorted(SMOKE.rglob("*.json")):
        rec = json.loads(path.read_text())
        if "spec" not in rec:  # the sweep's manifest
            (dst / path.name).write_text(json.dumps(rec))
            continue
        predicted = (rec.get("predicted") or {}).get("memory_gib")
        wanted = measured and (only is None or rec["spec"]["strategy"] == only)
        if rec["status"] == "ok" and predicted and wanted:
            rec["metrics"]["memory_gib"] = breakdown(measured_from_predicted(predicted))
        (dst / path.name).write_text(json.dumps(rec))
        out[path.name] = rec
    return out


class Drawn:
    """The memory figure of a frame as drawn: its panels' bars and lines, read before it is closed."""

    def __init__(self, fc: pd.DataFrame, monkeypatch: pytest.MonkeyPatch) -> None:
        kept = []

        def keep(fig):
            kept.append(fig)
            return b"png"

        monkeypatch.setattr(memory, "png_bytes", keep)
        self.figure = memory.memory_figure(fc)
        (self.fig,) = kept
        self.axes = [ax for ax in self.fig.axes if ax.get_visible()]

    def close(self) -> None:
        plt.close(self.fig)

    def legend(self) -> list[str]:
        """The legend's entries (beside the top-right panel)."""
        (legend,) = [ax.get_legend() for ax in self.axes if ax.get_legend() is not None]
        return [t.get_text() for t in legend.get_texts()]

    def panel(self, title_start: str):
        return next(ax for ax in self.axes if ax.get_title().startswith(title_start))


def bar_boxes(ax) -> list[tuple[float, float, float, tuple, str]]:
    """Every bar of a panel: (x centre, bottom, top, face colour RGBA, hatch or '')."""
    out = []
    for coll in ax.collections:
        if not isinstance(coll, PolyCollection):
            continue
        faces = coll.get_facecolor()
        for i, path in enumerate(coll.get_paths()):
            v = path.vertices
            face = tuple(np.round(faces[i % len(faces)], 4))
            out.append(
                (
                    float(v[:, 0].min() + v[:, 0].max()) / 2,
                    float(v[:, 1].min()),
                    float(v[:, 1].max()),
                    face,
                    coll.get_hatch() or "",
                )
            )
    return out


def stack_at(ax, x: float) -> list[tuple[float, tuple, str]]:
    """The bars centred at `x`, bottom up: (height, face colour, hatch)."""
    boxes = sorted((b for b in bar_boxes(ax) if math.isclose(b[0], x, abs_tol=1e-9)), key=lambda b: b[1])
    return [(top - bottom, face, hatch) for _, bottom, top, face, hatch in boxes]


def category_colours() -> list[tuple]:
    return [tuple(np.round(to_rgba(memory.CATEGORY_STYLE[c][0]), 4)) for c in MEMORY_CATEGORIES]


def panel_cells(fc: pd.DataFrame, model: str, gpus: int) -> pd.DataFrame:
    data = fc[fc[memory._MEMORY_COLUMNS].notna().any(axis=1)]
    return data[(data["model"] == model) & (data["gpus"] == gpus)]


def figure_frame(folder: Path) -> pd.DataFrame:
    df, _ = load_frame(folder)
    cells, _ = cell_table(df)
    return figure_cells(cells)


# --- the table's columns -----------------------------------------------------------------------------------


def test_the_frame_and_table_csv_hold_the_measured_and_predicted_categories(tmp_path):
    """docs/record-example.json (a CPU cell with a predicted breakdown) given a measured one: every category's
    column holds its number, the totals theirs, memory_deviation measured / predicted − 1; table.csv the same."""
    doc = json.loads(EXAMPLE.read_text())
    predicted = doc["predicted"]["memory_gib"]
    parts = {"params": 0.0003, "grads": 0.0006, "optimizer": 0.0012, "activations": 0.0021, "buffers": 0.0008}
    doc["metrics"]["memory_gib"] = breakdown(parts, rank=1)
    doc["metrics"]["memory_fragmentation_gib"] = None
    (row,) = records_frame([as_record(doc)])[0].to_dict("records")
    for c in MEMORY_CATEGORIES:
        assert row[f"memory_{c}_gib"] == parts[c], c
        assert row[f"predicted_memory_{c}_gib"] == predicted[c], c
    total = sum(parts.values())
    assert row["memory_total_gib"] == total and row["predicted_memory_gib"] == predicted["total"] == 0.002585
    assert row["memory_deviation"] == pytest.approx(total / 0.002585 - 1, rel=1e-12)
    assert math.isnan(row["memory_fragmentation_gib"])  # CPU: no caching allocator
    # an older record: no measurement, every measured column NaN (never 0), the prediction kept
    (old,) = records_frame([as_record(json.loads(EXAMPLE.read_text()))])[0].to_dict("records")
    assert all(math.isnan(old[f"memory_{c}_gib"]) for c in (*MEMORY_CATEGORIES, "total"))
    assert math.isnan(old["memory_deviation"]) and old["predicted_memory_buffers_gib"] == predicted["buffers"]
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "example.json").write_text(json.dumps(doc))
    table = pd.read_csv(build_report([tmp_path / "in"], out=tmp_path / "out")["paths"]["csv"])
    (csv_row,) = table.to_dict("records")
    assert [csv_row[f"memory_{c}_gib"] for c in MEMORY_CATEGORIES] == [parts[c] for c in MEMORY_CATEGORIES]
    assert csv_row["predicted_memory_activations_gib"] == predicted["activations"]
    assert csv_row["memory_deviation"] == pytest.approx(total / 0.002585 - 1, rel=1e-12)
    # the measured columns follow the allocator's and precede the predicted ones
    cols = list(table.columns)
    assert cols.index("peak_memory_reserved_gib") < cols.index("memory_total_gib") < cols.index("memory_params_gib")
    assert cols.index("memory_buffers_gib") < cols.index("predicted_memory_gib") < cols.index("memory_deviation")


# --- the figure ------------------------------------------------------------------------------------------------


def test_cpu_records_with_a_breakdown_draw_predicted_beside_measured_by_category(tmp_path, monkeypatch):
    """Every CPU cell: the predicted categories stacked on the left, the measured ones hatched on the right, bar for
    bar the records' numbers in the categories' colours; no RSS bar and no allocator line (CPU)."""
    recs = cpu_records(tmp_path / "cpu")
    fc = figure_frame(tmp_path / "cpu")
    drawn = Drawn(fc, monkeypatch)
    try:
        # tiny at 2 ranks, its ZeRO cells (a 1.9 GiB reduce bucket beside few-MiB cells) apart, and at 4 ranks
        groups = [
            (gpus, suffix, part)
            for gpus in (2, 4)
            for suffix, part in memory._by_magnitude(panel_cells(fc, "tiny", gpus))
        ]
        assert len(drawn.axes) == len(groups) == 3
        assert set(groups[1][2]["strategy"]) == {"zero1", "zero2", "zero3"}
        colours = category_colours()
        checked = 0
        for ax, (gpus, suffix, cells) in zip(drawn.axes, groups):
            assert ax.get_title().endswith(f"{gpus} GPUs{suffix}")
            assert ax.get_ylabel() == "peak memory per rank (GiB)"
            assert not any(isinstance(c, LineCollection) for c in ax.collections)  # no allocator peaks on CPU
            for x, (_, cell) in enumerate(cells.iterrows()):
                rec = recs[Path(cell["path"]).name]
                predicted = [rec["predicted"]["memory_gib"][c] for c in MEMORY_CATEGORIES]
                measured = [rec["metrics"]["memory_gib"][c] for c in MEMORY_CATEGORIES]
                left, right = stack_at(ax, x - 0.2), stack_at(ax, x + 0.2)
                assert [h for h, _, _ in left] == pytest.approx(predicted, abs=1e-12)
                assert [h for h, _, _ in right] == pytest.approx(measured, abs=1e-12)
                assert [f for _, f, _ in left] == colours and [f for _, f, _ in right] == colours
                assert {h for _, _, h in left} == {""} and {h for _, _, h in right} == {memory.MEASURED_HATCH}
                assert stack_at(ax, x) == []  # no RSS bar in the middle
                checked += 1
        assert checked == len(fc) >= 10  # every cell, each with a breakdown
        assert "metrics.memory_gib" in drawn.figure.caption and "Records without" not in drawn.figure.caption
        assert "peak RSS is not drawn beside a measured breakdown" in drawn.figure.caption
        labels = drawn.legend()
        assert labels[:5] == [memory.CATEGORY_STYLE[c][1] for c in MEMORY_CATEGORIES]
        assert "predicted (left bar)" in labels and "measured tensors\n(right bar)" in labels
        assert not any("RSS" in label or "allocator" in label for label in labels)
    finally:
        drawn.close()


def test_older_cpu_records_beside_new_ones_still_draw_their_rss_bar(tmp_path, monkeypatch):
    """Only the ddp cells measured their tensors: they draw the two breakdowns; every other CPU cell draws as before
    the measurement, a hatched white bar as high as its peak RSS and no prediction beside it."""
    recs = cpu_records(tmp_path / "mixed", only="ddp")
    fc = figure_frame(tmp_path / "mixed")
    drawn = Drawn(fc, monkeypatch)
    try:
        ax = drawn.panel("tiny (")
        white = tuple(np.round(to_rgba("white"), 4))
        cells = panel_cells(fc, "tiny", 2)
        assert (cells["strategy"] == "ddp").sum() == 2 and (cells["strategy"] != "ddp").sum() > 0
        for x, (_, cell) in enumerate(cells.iterrows()):
            rec = recs[Path(cell["path"]).name]
            if cell["strategy"] == "ddp":
                right = stack_at(ax, x + 0.2)
                assert [h for h, _, _ in right] == pytest.approx(
                    [rec["metrics"]["memory_gib"][c] for c in MEMORY_CATEGORIES], abs=1e-12
                )
                assert stack_at(ax, x) == []  # none of the old drawing's bars
            else:
                heights = [(h, f, hatch) for h, f, hatch in stack_at(ax, x) if h > 0]
                assert heights == [(pytest.approx(rec["metrics"]["peak_memory_allocated_gib"]), white, "////")]
        # no ◆ beside an RSS bar: the only markers are the ticks' and none at a cell's x but a breakdown's
        diamonds = [line for line in ax.lines if line.get_marker() == "D"]
        assert all(np.isnan(np.asarray(d.get_ydata(), dtype=float)).all() for d in diamonds)
        caption = drawn.figure.caption
        assert "metrics.memory_gib" in caption and "Records without the measurement (older ones)" in caption
        assert "peak RSS of the whole process" in caption
        labels = drawn.legend()
        assert "peak RSS, CPU process\n(not tensor memory)" in labels and "parameters" in labels
    finally:
        drawn.close()


def test_gpu_cells_mark_the_allocators_peaks_over_the_measured_bar(tmp_path, monkeypatch):
    """The GPU fixture: the 125m bf16 cells at 2 GPUs measured their tensors (those with a prediction also got its
    breakdown), the rest are older records. A cell with both draws the pair, with the allocator's peak allocated
    (solid) and reserved (dotted) across the measured bar; one without a prediction draws its measured bar alone;
    the older cells their allocated and reserved bars and the predicted ◆, as before."""
    src = tmp_path / "gpu"
    src.mkdir()
    shares = {"params": 0.2, "grads": 0.2, "optimizer": 0.4, "activations": 0.15, "buffers": 0.05}
    new: dict[str, dict] = {}
    for path in sorted(GPU.glob("*.json")):
        text = path.read_text()
        try:
            rec = json.loads(text)
        except ValueError:
            continue  # the fixture's deliberately truncated record
        s = rec.get("spec") or {}
        if (s.get("model"), s.get("precision"), s.get("world_size"), rec.get("status")) == ("125m", "bf16", 2, "ok"):
            alloc = rec["metrics"]["peak_memory_allocated_gib"]
            rec["metrics"]["memory_gib"] = breakdown({c: alloc * 0.9 * shares[c] for c in MEMORY_CATEGORIES})
            predicted = (rec.get("predicted") or {}).get("memory_gib")
            if predicted and s["strategy"] != "fsdp2.full_shard":  # fsdp2 keeps a total-only prediction: ◆
                predicted.update({c: predicted["total"] * shares[c] for c in MEMORY_CATEGORIES})
            new[path.name] = rec
        (src / path.name).write_text(json.dumps(rec))
    fc = figure_frame(src)
    drawn = Drawn(fc, monkeypatch)
    try:
        ax = drawn.panel("125m (")
        # each allocator line: (solid?, its segment x0, y0, x1, y1)
        segments = {
            (c.get_linestyle()[0][1] is None, tuple(np.round(seg, 9).ravel()))
            for c in ax.collections
            if isinstance(c, LineCollection)
            for seg in c.get_segments()
        }
        kinds = {"pair": 0, "alone": 0, "old": 0}
        for x, (_, cell) in enumerate(panel_cells(fc, "125m", 2).iterrows()):
            name = Path(cell["path"]).name
            if name not in new:
                kinds["old"] += 1
                heights = sorted(top - bottom for cx, bottom, top, _, _ in bar_boxes(ax) if math.isclose(cx, x))
                assert heights == pytest.approx(
                    sorted([cell["peak_memory_reserved_gib"], cell["peak_memory_allocated_gib"]])
                )
                continue
            rec = new[name]
            measured = [rec["metrics"]["memory_gib"][c] for c in MEMORY_CATEGORIES]
            pred = rec.get("predicted", {}).get("memory_gib") or {}
            xm, half = (x + 0.2, 0.19) if "params" in pred else (x, 0.375)
            kinds["pair" if "params" in pred else "alone"] += 1
            assert [h for h, _, _ in stack_at(ax, xm)] == pytest.approx(measured, abs=1e-12)
            if "params" in pred:
                assert [h for h, _, _ in stack_at(ax, x - 0.2)] == pytest.approx(
                    [pred[c] for c in MEMORY_CATEGORIES], abs=1e-12
                )
            for col, solid in (("peak_memory_allocated_gib", True), ("peak_memory_reserved_gib", False)):
                y = rec["metrics"][col]
                assert (solid, tuple(np.round([xm - half, y, xm + half, y], 9))) in segments, (name, col)
        assert kinds["pair"] >= 2 and kinds["alone"] >= 1 and kinds["old"] >= 2, kinds
        labels = drawn.legend()
        for label in ("allocator: peak\nallocated", "allocator: peak\nreserved", "peak allocated", "predicted total"):
            assert label in labels
        assert drawn.axes[0].get_ylabel() == "peak memory per GPU (GiB)"
    finally:
        drawn.close()
