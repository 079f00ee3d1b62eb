"""The MFU heatmap: MFU per strategy · precision (rows) and model @ GPU count (columns); the achieved TFLOPS per
GPU when no cell has an MFU."""

from __future__ import annotations

from dataclasses import dataclass, field

import matplotlib
import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from matplotlib.patches import Patch
from matplotlib.transforms import ScaledTranslation

from harness.report.figures.base import Figure, gpus_label, no_data, omitted_note, png_bytes, row_label, spread, style
from harness.report.figures.registry import register
from harness.report.frame import model_order

MAX_HEATMAP_COLUMNS = 24
MAX_ANNOTATED_CELLS = 400
"""heatmap cells with their value printed at most; a bigger heatmap is colour only (printing is slow)"""
MAX_HEATMAP_ROWS = 48
_GREY_NA = "#E6E6E6"
_GREY_FAILED = "#BDBDBD"


@dataclass
class _Grid:
    """The heatmap's cells: (strategy, precision) rows × (model, GPU count) columns."""

    rows: list[tuple[str, str]]
    columns: list[tuple[str, float]]
    values: np.ndarray
    """the colour value (MFU in %, or TFLOPS per GPU); NaN where grey or blank"""
    text: np.ndarray
    """what is printed in each cell: its value, "n/a", a status, or "" (not in the results)"""
    grey: np.ndarray
    """True where the cell has no value (n/a) or did not run ok"""
    reasons: dict[str, int] = field(default_factory=dict)
    """null reason → how many cells have it"""
    notes: list[str] = field(default_factory=list)
    """what was left out"""


def _heatmap_grid(fc: pd.DataFrame, *, tflops: bool) -> _Grid:
    """The cells drawn (at most MAX_HEATMAP_COLUMNS columns, whole models, and MAX_HEATMAP_ROWS rows) with their
    values, texts and null reasons."""
    notes = []
    models = model_order(fc)
    gpus_per_model = {m: sorted(fc.loc[fc["model"] == m, "gpus"].unique()) for m in models}
    shown_models = models
    while len(shown_models) > 1 and sum(len(gpus_per_model[m]) for m in shown_models) > MAX_HEATMAP_COLUMNS:
        shown_models = spread(models, len(shown_models) - 1)
    if len(shown_models) < len(models):
        notes.append(omitted_note("models", shown_models, models))
    columns = [(m, g) for m in shown_models for g in gpus_per_model[m]][:MAX_HEATMAP_COLUMNS]
    sub = fc[fc["model"].isin(shown_models)]
    rows = list(dict.fromkeys(zip(sub["strategy"], sub["precision"])))
    if len(rows) > MAX_HEATMAP_ROWS:
        notes.append(f"Showing the first {MAX_HEATMAP_ROWS} of {len(rows)} strategy · precision rows.")
        rows = rows[:MAX_HEATMAP_ROWS]
    shape = (len(rows), len(columns))
    grid = _Grid(rows, columns, np.full(shape, np.nan), np.full(shape, "", dtype=object), np.zeros(shape, bool))
    grid.notes += notes
    r_index = {r: i for i, r in enumerate(rows)}
    c_index = {c: j for j, c in enumerate(columns)}
    text, values, grey, reasons = grid.text, grid.values, grid.grey, grid.reasons
    for rec in sub.itertuples(index=False):
        i, j = r_index.get((rec.strategy, rec.precision)), c_index.get((rec.model, rec.gpus))
        if i is None or j is None:
            continue
        if rec.status != "ok":
            text[i, j], grey[i, j] = str(rec.status), True
        elif tflops:
            if pd.isna(rec.tflops_per_gpu):
                text[i, j], grey[i, j] = "n/a", True
            else:
                values[i, j] = rec.tflops_per_gpu
                text[i, j] = f"{rec.tflops_per_gpu:.3g}"
            why = rec.mfu_null_reason if isinstance(rec.mfu_null_reason, str) else "no reason recorded"
            reasons[why] = reasons.get(why, 0) + 1
        elif pd.isna(rec.mfu):
            text[i, j], grey[i, j] = "n/a", True
            why = rec.mfu_null_reason if isinstance(rec.mfu_null_reason, str) else "no reason recorded"
            reasons[why] = reasons.get(why, 0) + 1
        else:
            values[i, j] = 100.0 * rec.mfu
            text[i, j] = f"{100.0 * rec.mfu:.1f}"
    return grid


def _draw_cells(fig, ax, grid: _Grid, *, vmax: float):
    """The coloured cells on their grey/white background, with their values printed when there are few enough
    (else a note says so); returns the colour image, for the colour bar."""
    rows, columns, values, text, grey = grid.rows, grid.columns, grid.values, grid.text, grid.grey
    cmap = plt.get_cmap("cividis")
    is_na = text == "n/a"
    background = np.ones((len(rows), len(columns), 3))  # white: not in the results
    background[grey & is_na] = matplotlib.colors.to_rgb(_GREY_NA)
    background[grey & ~is_na] = matplotlib.colors.to_rgb(_GREY_FAILED)
    ax.imshow(background, aspect="auto", interpolation="nearest")
    im = ax.imshow(
        np.ma.masked_invalid(values), cmap=cmap, vmin=0.0, vmax=max(vmax, 1e-9), aspect="auto", interpolation="nearest"
    )
    annotate = len(rows) * len(columns) <= MAX_ANNOTATED_CELLS
    if annotate:
        fontsize = 8 if len(columns) <= 12 else 6.5
        for i, j in zip(*np.nonzero(text != "")):
            if grey[i, j]:
                color = "#333333"
            else:
                r, g, b, _ = cmap(values[i, j] / max(vmax, 1e-9))
                color = "white" if 0.299 * r + 0.587 * g + 0.114 * b < 0.5 else "black"
            ax.text(j, i, text[i, j], ha="center", va="center", fontsize=fontsize, color=color)
    else:
        grid.notes.append(f"{len(rows) * len(columns)} cells: values are not printed in the cells (colour only).")
    return im


def _draw_axes(fig, ax, grid: _Grid, *, tflops: bool) -> None:
    """The cell borders, the legend of the greys above, the tick labels with each row's strategy swatch."""
    rows, columns = grid.rows, grid.columns
    ax.set_xticks(np.arange(len(columns) + 1) - 0.5, minor=True)
    ax.set_yticks(np.arange(len(rows) + 1) - 0.5, minor=True)
    ax.grid(which="minor", color="white", linewidth=1.0)
    ax.tick_params(which="minor", length=0)
    ax.legend(
        handles=[
            Patch(facecolor=_GREY_NA, label="n/a: no TFLOPS value" if tflops else "n/a: MFU is null"),
            Patch(facecolor=_GREY_FAILED, label="did not run ok (status)"),
            Patch(facecolor="white", edgecolor="#999999", label="not in the results"),
        ],
        loc="lower left",
        bbox_to_anchor=(0.0, 1.0),
        ncols=3 if len(columns) >= 4 else 1,  # fits above
        frameon=False,
        fontsize=7.5,
        borderaxespad=0.3,
    )
    ax.set_xticks(range(len(columns)))
    ax.set_xticklabels([f"{m}\n{gpus_label(g)}" for m, g in columns], fontsize=7.5)
    ax.set_yticks(range(len(rows)))
    ax.set_yticklabels([row_label(s, p) for s, p in rows], fontsize=7.5)
    ax.tick_params(axis="y", pad=16, length=0)
    ax.tick_params(axis="x", length=0)
    swatch = ax.get_yaxis_transform() + ScaledTranslation(-8 / 72, 0, fig.dpi_scale_trans)
    for i, (s, _) in enumerate(rows):  # strategy colour and marker next to each row label
        ax.plot(0, i, marker=style(s)[1], color=style(s)[0], markersize=6, clip_on=False, transform=swatch)
    for spine in ax.spines.values():
        spine.set_visible(False)
    ax.set_xlabel("model @ GPU count")
    ax.set_ylabel("strategy · precision")


def _null_footnotes(reasons: dict[str, int], *, tflops: bool) -> list[str]:
    """The four most common null reasons with their counts (and how many more there are)."""
    footnotes = [
        f"{'MFU ' if tflops else ''}n/a ({n} cell{'s' if n > 1 else ''}): {why}"
        for why, n in sorted(reasons.items(), key=lambda kv: -kv[1])[:4]
    ]
    if len(reasons) > 4:
        footnotes.append(f"… and {len(reasons) - 4} more reasons (table.csv, column mfu_null_reason)")
    return footnotes


@register("mfu_heatmap", order=20, cost=0.75)
def mfu_heatmap(fc: pd.DataFrame) -> Figure:
    """MFU per cell; when no cell has an MFU (CPU runs, a device without a peak-FLOPS entry) the achieved
    TFLOPS per GPU instead, so the figure is not a grid of grey "n/a", and the reason is said once, in the note."""
    title = "MFU heatmap"
    caption = (
        "Model FLOPs utilisation (% of the device's dense peak FLOPS for the precision) per strategy · "
        "precision (rows) and model @ GPU count (columns). Grey: MFU is null (n/a) or the cell did not "
        "run ok (its status is shown); blank: not in the results."
    )
    if fc.empty:
        return no_data("mfu_heatmap", title, caption, "no cells")
    ran = fc["status"] == "ok"
    tflops = not (ran & fc["mfu"].notna()).any() and (ran & fc["tflops_per_gpu"].notna()).any()
    if tflops:
        title = "Throughput heatmap (TFLOPS per GPU; no cell has an MFU)"
        caption = (
            "Achieved TFLOPS per GPU (model FLOPs per step ÷ step time, metrics.tflops_per_gpu) per "
            "strategy · precision (rows) and model @ GPU count (columns), shown in place of MFU because no "
            "cell has one. Grey: no value or the cell did not run ok (its status is shown); blank: not in "
            "the results."
        )
    grid = _heatmap_grid(fc, tflops=tflops)
    vmax = float(np.nanmax(grid.values)) if np.isfinite(grid.values).any() else 1.0
    # NOTE: the reasons are said once: in the note (beside the figure in the HTML and Markdown), not in the PNG
    footnotes = _null_footnotes(grid.reasons, tflops=tflops)
    width = min(26.0, 3.4 + 0.78 * len(grid.columns) + 1.2)
    height = 1.6 + 0.3 * len(grid.rows) + 0.5
    fig, ax = plt.subplots(figsize=(width, height), layout="constrained")
    im = _draw_cells(fig, ax, grid, vmax=vmax)
    _draw_axes(fig, ax, grid, tflops=tflops)
    fig.suptitle(
        "TFLOPS per GPU (no cell has an MFU)" if tflops else "MFU (%) per strategy · precision and model @ GPU count"
    )
    cbar = fig.colorbar(im, ax=ax, shrink=0.8, pad=0.01)
    cbar.set_label("TFLOPS per GPU (achieved)" if tflops else "MFU (% of dense peak FLOPS)")
    note = " ".join(grid.notes + (["; ".join(footnotes) + "."] if footnotes else []))
    if tflops:
        note = ("No cell has an MFU value, so the heatmap shows the achieved TFLOPS per GPU. " + note).strip()
    elif not np.isfinite(grid.values).any():
        note = ("No cell has an MFU value (all are n/a). " + note).strip()
    return Figure("mfu_heatmap", title, caption, png_bytes(fig), note)
