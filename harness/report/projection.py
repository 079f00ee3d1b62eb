"""The scale-out projection drawn: `harness plan SCENARIO --project 8..4096 --format json` (harness.plan.projection)
as a figure — per model, each cell's predicted tokens/s per GPU against the GPU count — for a plan alone
(`harness plan … --project … --figure PNG`) or beside a measured sweep (`harness report DIR --projection FILE`),
where the cells measured at one of the projected GPU counts are drawn on their projected line.

The document is harness.plan.projection's typed `Projection` (its `read_projection` reads a file: a file that is not
one is an InputError naming the file, the key and the value, never a traceback).
"""

from __future__ import annotations

import math
from collections import Counter

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from matplotlib.lines import Line2D

from harness.plan.projection import ProjectedRow, Projection
from harness.report.figures.base import (
    PRECISION_FILL,
    PRECISION_LINESTYLE,
    Figure,
    no_data,
    png_bytes,
    precision_handle,
    select_models,
    strategy_handles,
    style,
)
from harness.report.figures.layout import log2_gpus_axis

MAX_PROJECTION_MODELS = 4
"""model panels drawn at most (an evenly spread subset beyond, noted)"""
MATCH_SETTINGS = ("micro_batch", "seq_len", "grad_accum", "tp", "pp")
"""what a measured cell must share with a projected row to be drawn on its line (with model, strategy, precision)"""


def _measured(fc: pd.DataFrame | None, row: ProjectedRow) -> tuple[np.ndarray, np.ndarray]:
    """(GPU counts, tokens/s per GPU) of the ok cells of `fc` that are this projected row at some GPU count."""
    if fc is None or fc.empty:
        return np.array([]), np.array([])
    m = (
        (fc["status"] == "ok")
        & (fc["model"] == row.model)
        & (fc["base_strategy"] == row.strategy)
        & (fc["precision"] == row.precision)
        & fc["tokens_per_s_per_gpu"].notna()
    )
    for k in MATCH_SETTINGS:
        v = getattr(row.settings, k)
        if k in fc and v is not None:
            m &= fc[k].fillna(1 if k in ("tp", "pp") else -1) == v
    hit = fc[m]
    return hit["gpus"].to_numpy(dtype=float), hit["tokens_per_s_per_gpu"].to_numpy(dtype=float)


def projection_figure(doc: Projection, fc: pd.DataFrame | None = None) -> Figure:
    """Per model (at most MAX_PROJECTION_MODELS panels), every projected row's tokens/s per GPU against the GPU
    count; with `fc` (a report's figure cells), the measured cells on their rows' lines."""
    title = "Projected scaling"
    caption = (
        f"Predicted tokens/s per GPU against GPU count (log₂ axis) on {doc.cluster} "
        f"({doc.gpus_per_node} GPUs per node), one line per strategy · layout · precision as `harness plan "
        "--project` computed it (harness.plan.projection; docs/time-model.md); colour and marker = strategy, line "
        "style = precision, × on a point = it does not fit the device memory. "
        + ("Large black-rimmed markers = measured (the report's cells at that GPU count). " if fc is not None else "")
        + f"Rates: {doc.rates}."
    )
    rows = [r for r in doc.rows if any(p.tokens_per_s_per_gpu is not None for p in r.points)]
    nulls = Counter(p.reason or "unknown" for r in doc.rows for p in r.points if p.step_time_s is None)
    null_note = "; ".join(f"{n} point(s): {why}" for why, n in nulls.most_common(4))
    if not rows:
        return no_data("projection", title, caption, "no projected point has a step time" + (f" ({null_note})"))
    names = [r.model for r in rows]
    models, note = select_models(
        pd.DataFrame({"model": names, "n_params": [math.nan] * len(names)}), MAX_PROJECTION_MODELS
    )
    if nulls:
        note = (note + " " if note else "") + f"Not drawn (null, with the model's reason): {null_note}."
    n = len(models)
    fig, axes = plt.subplots(1, n, figsize=(4.6 * n + 2.6, 4.4), squeeze=False, layout="constrained")
    labels, measured_any = [], False
    for ax, model in zip(axes[0], models):
        gpus_drawn: set[float] = set()
        for r in (r for r in rows if r.model == model):
            colour, marker = style(r.layout)
            pts = [p for p in r.points if p.tokens_per_s_per_gpu is not None]
            x = np.array([p.gpus for p in pts], dtype=float)
            y = np.array([p.tokens_per_s_per_gpu for p in pts], dtype=float)
            ax.plot(
                x,
                y,
                color=colour,
                marker=marker,
                markersize=5,
                linestyle=PRECISION_LINESTYLE.get(r.precision, "-"),
                fillstyle=PRECISION_FILL.get(r.precision, "full"),
                linewidth=1.3,
            )
            over = np.array([p.fits is False for p in pts])
            if over.any():
                ax.plot(x[over], y[over], linestyle="none", marker="x", color="black", markersize=7, zorder=4)
            mx, my = _measured(fc, r)
            if len(mx):
                measured_any = True
                ax.plot(
                    mx,
                    my,
                    linestyle="none",
                    marker=marker,
                    markersize=10,
                    markerfacecolor=colour,
                    markeredgecolor="black",
                    markeredgewidth=1.4,
                    zorder=5,
                )
                gpus_drawn.update(mx.tolist())
            gpus_drawn.update(x.tolist())
            labels.append(r.layout)
        log2_gpus_axis(ax, sorted(gpus_drawn))
        ax.set_ylim(bottom=0)
        ax.set_title(str(model))
        ax.set_xlabel("GPUs")
        ax.set_ylabel("tokens/s per GPU (predicted)")
        ax.grid(True, color="#E5E5E5", linewidth=0.6)
    handles = strategy_handles(labels) + [precision_handle(p) for p in sorted({r.precision for r in rows}, key=str)]
    handles.append(Line2D([], [], linestyle="none", marker="x", color="black", label="does not fit"))
    if measured_any:
        handles.append(
            Line2D(
                [],
                [],
                linestyle="none",
                marker="o",
                markersize=9,
                markerfacecolor="white",
                markeredgecolor="black",
                markeredgewidth=1.4,
                label="measured",
            )
        )
    axes[0][-1].legend(handles=handles, loc="upper left", bbox_to_anchor=(1.02, 1.0), frameon=False)
    fig.suptitle(f"Projected tokens/s per GPU on {doc.cluster}")
    return Figure("projection", title, caption, png_bytes(fig), note)
