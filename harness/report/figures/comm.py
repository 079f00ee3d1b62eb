"""The collective-bytes figure: bytes moved by collectives per step, stacked by collective type, per (model, GPU
count) panel, with the predicted total."""

from __future__ import annotations

import numpy as np
import pandas as pd
from matplotlib.lines import Line2D
from matplotlib.patches import Patch

from harness.report.figures.base import (
    Figure,
    byte_unit,
    gpus_label,
    model_title,
    no_data,
    png_bytes,
    row_label,
    select_panels,
    strategy_handles,
    style,
)
from harness.report.figures.layout import (
    TITLE_Y,
    bars,
    categorical_xticks,
    layout_panels,
    new_panel_figure,
    panel_legend,
)
from harness.report.figures.registry import register
from harness.report.frame import COMM_PREFIX, collective_columns

_COLLECTIVE_HATCH = ("", "///", "...", "xxx", "\\\\\\", "+++", "ooo", "---")


@register("comm", order=40, cost=1.15)
def comm_figure(fc: pd.DataFrame) -> Figure:
    title = "Collective bytes per step"
    caption = (
        "Bytes moved by collectives per training step (comm.by_collective), stacked by collective type "
        "(hatching) for each strategy · precision; the bar colour is the strategy. ◆ = predicted bytes "
        "per step (predicted.comm_bytes_per_step). Bytes not attributed to a collective type are "
        "drawn as 'not broken down'."
    )
    ccols = collective_columns(fc)
    has = fc["comm_bytes_per_step"].notna()
    if ccols:
        has |= fc[ccols].notna().any(axis=1)
    data = fc[has]
    if data.empty:
        return no_data("comm", title, caption, "no record has a comm section")
    panels, note = select_panels(data)
    lacking = int(((fc["status"] == "ok") & ~has).sum())
    if lacking:
        note = (f"{lacking} cell(s) that ran ok have no comm section and are not drawn. " + note).strip()
    names = [c[len(COMM_PREFIX) :] for c in ccols]
    parts = data[ccols].fillna(0.0).to_numpy() if ccols else np.zeros((len(data), 0))
    known = parts.sum(axis=1)
    total = data["comm_bytes_per_step"].to_numpy()
    rest = np.where(np.isnan(total), 0.0, np.maximum(total - known, 0.0))
    rest = np.where(rest > 0.005 * np.nan_to_num(total, nan=0.0), rest, 0.0)
    stacks = np.column_stack([parts, rest])
    labels = names + ["not broken down"]
    pred = data["predicted_comm_bytes_per_step"].to_numpy()
    div, unit = byte_unit(float(np.nanmax(np.concatenate([stacks.sum(axis=1), pred]))))
    used = [k for k in range(stacks.shape[1]) if stacks[:, k].any()]
    n_bars = max(((data["model"] == m) & (data["gpus"] == g)).sum() for m, g in panels)
    fig, axes, corner = new_panel_figure(len(panels), n_bars, "Collective bytes per step by collective type")
    reaches = []
    for ax, (model, gpus) in zip(axes, panels):
        mask = ((data["model"] == model) & (data["gpus"] == gpus)).to_numpy()
        p = data[mask]
        x = np.arange(len(p))
        colors = [style(s)[0] for s in p["strategy"]]
        bottom = np.zeros(len(p))
        for k in used:
            h = stacks[mask, k] / div
            bars(
                ax,
                x,
                h,
                bottom=bottom,
                width=0.75,
                color=colors,
                edgecolor="white",
                linewidth=0.6,
                hatch=_COLLECTIVE_HATCH[used.index(k) % len(_COLLECTIVE_HATCH)] or None,
            )
            bottom = bottom + h  # NOTE: a new array; bar() keeps a reference to `bottom`
        ax.plot(x, pred[mask] / div, linestyle="none", marker="D", color="black", markersize=5, zorder=3)
        for xi, st, b in zip(x, p["status"], bottom):
            if st != "ok" and b == 0:
                ax.text(xi, 0, st, rotation=90, ha="center", va="bottom", fontsize=7.5, color="#333333")
        reaches.append(categorical_xticks(ax, [row_label(s, q) for s, q in zip(p["strategy"], p["precision"])]))
        ax.set_title(f"{model_title(fc, model)} · {gpus_label(gpus)}", y=TITLE_Y)
        ax.set_ylabel(f"bytes per step ({unit})")
        top = float(np.nanmax(np.concatenate([bottom, pred[mask] / div, [0.0]])))
        ax.set_ylim(0, top * 1.1 if top > 0 else 1.0)
        ax.grid(True, axis="y", color="#DDDDDD", linewidth=0.6)
        ax.set_axisbelow(True)
    handles = (
        strategy_handles(data.loc[data["model"].isin({m for m, _ in panels}), "strategy"])
        + [
            Patch(
                facecolor="#999999",
                edgecolor="white",
                hatch=_COLLECTIVE_HATCH[i % len(_COLLECTIVE_HATCH)],
                label=labels[k],
            )
            for i, k in enumerate(used)
        ]
        + [Line2D([], [], linestyle="none", marker="D", color="black", label="predicted total")]
    )
    layout_panels(fig, axes, axes.index(corner) + 1, panel_legend(corner, handles, "strategy / collective"), reaches)
    return Figure("comm", title, caption, png_bytes(fig), note)
