"""The predicted step-time breakdown: per model at its largest GPU count, each strategy · precision's predicted
step time split into its parts, with the measured median."""

from __future__ import annotations

import numpy as np
import pandas as pd
from matplotlib.artist import Artist
from matplotlib.lines import Line2D
from matplotlib.patches import Patch

from harness.report.figures.base import Figure, gpus_label, model_title, no_data, png_bytes, row_label, select_models
from harness.report.figures.layout import (
    TITLE_Y,
    categorical_xticks,
    layout_panels,
    new_panel_figure,
    panel_legend,
    stacked_bars,
)
from harness.report.figures.prediction import why_no_prediction
from harness.report.figures.registry import register
from harness.report.frame import PREDICTED_PARTS

MAX_BREAKDOWN_PANELS = 4
"""(model, largest GPU count) panels of the breakdown figure at most"""
PART_STYLE: dict[str, tuple[str, str]] = {
    "compute": ("#4C72B0", "compute"),
    "recompute": ("#8172B2", "recompute (checkpointing)"),
    "optimizer": ("#55A868", "optimizer"),
    "comm_exposed": ("#C44E52", "communication, exposed"),
    "other": ("#8C8C8C", "other (host, framework)"),
}
"""predicted step-time part → (colour, legend label)"""


MEASURED_HATCH = "////"
"""the measured bar's hatching (its parts keep the predicted bar's colours)"""


def _measured_columns() -> list[str]:
    return [f"measured_{part}_s" for part in PREDICTED_PARTS]


@register("time_breakdown", order=70, cost=0.7)
def time_breakdown_figure(fc: pd.DataFrame) -> Figure:
    cols = [f"predicted_{part}_s" for part in PREDICTED_PARTS]
    mcols = _measured_columns()
    predicted = ((fc["predicted_step_time_s"] > 0) & fc[cols].notna().all(axis=1)).to_numpy()
    # NOTE: recompute may be null in a traced cell (compiled blocks: its time is in compute); the others may not
    measured = (
        (fc["measured_step_s"] > 0) & fc[[c for c in mcols if "recompute" not in c]].notna().all(axis=1)
    ).to_numpy()
    traced = bool(measured.any())
    title = "Step-time breakdown, predicted and measured" if traced else "Predicted step-time breakdown"
    caption = (
        "The predicted step time of each strategy · precision split into its parts (predicted.time_s: compute, "
        "activation checkpointing's recompute, the optimizer step, communication not hidden behind compute, host "
        "and framework overhead), for each model at its largest GPU count; ◆ = the measured median step time. "
        "Where a part dominates the bar, that is where the model says the time goes."
    )
    if traced:
        caption += (
            " Hatched bars: the same parts measured on the cell's traced step (metrics.time_s, the slowest rank's "
            "profiler trace; trace: true), beside the predicted bar; where they differ, the model is off in that part."
        )
    data = fc[predicted | measured]
    if data.empty:
        return no_data("time_breakdown", title, caption, why_no_prediction(fc))
    models, note = select_models(data, MAX_BREAKDOWN_PANELS)
    panels = [(m, float(data.loc[data["model"] == m, "gpus"].max())) for m in models]
    has_pred = predicted[predicted | measured]
    has_meas = measured[predicted | measured]
    parts = np.where(has_pred[:, None], data[cols].to_numpy(dtype=float), np.nan) * 1e3
    mparts = np.where(has_meas[:, None], np.nan_to_num(data[mcols].to_numpy(dtype=float)), np.nan) * 1e3
    meas = data["step_time_median_s"].where(data["status"] == "ok").to_numpy(dtype=float) * 1e3
    used = [
        k for k in range(len(cols)) if (np.nan_to_num(parts[:, k]) > 0).any() or (np.nan_to_num(mparts[:, k]) > 0).any()
    ]
    n_bars = max(((data["model"] == m) & (data["gpus"] == g)).sum() for m, g in panels)
    heading = (
        "Step-time breakdown (left predicted, right measured ▨; ◆ median)"
        if traced
        else ("Predicted step-time breakdown (◆ measured)")
    )
    fig, axes, corner = new_panel_figure(len(panels), n_bars, heading)
    reaches = []
    for ax, (model, gpus) in zip(axes, panels):
        mask = ((data["model"] == model) & (data["gpus"] == gpus)).to_numpy()
        p = data[mask]
        x = np.arange(len(p), dtype=float)
        both = has_pred[mask] & has_meas[mask]
        width = np.where(both, 0.38, 0.75)
        xp = np.where(both, x - 0.2, x)
        xm = np.where(both, x + 0.2, x)
        colours = [PART_STYLE[PREDICTED_PARTS[k]][0] for k in used]
        tops = [stacked_bars(ax, xp, parts[mask][:, used], colours, width=width, hatch=None)]
        tops.append(stacked_bars(ax, xm, mparts[mask][:, used], colours, width=width, hatch=MEASURED_HATCH))
        ax.plot(x, meas[mask], linestyle="none", marker="D", color="black", markersize=5, zorder=3)
        reaches.append(categorical_xticks(ax, [row_label(s, q) for s, q in zip(p["strategy"], p["precision"])]))
        ax.set_title(f"{model_title(fc, model)} · {gpus_label(gpus)}", y=TITLE_Y)
        ax.set_ylabel("step time (ms)")
        top = float(np.nanmax(np.concatenate([*tops, meas[mask], [0.0]])))
        ax.set_ylim(0, top * 1.1 if top > 0 else 1.0)
        ax.grid(True, axis="y", color="#DDDDDD", linewidth=0.6)
        ax.set_axisbelow(True)
    handles: list[Artist] = [
        Patch(facecolor=PART_STYLE[PREDICTED_PARTS[k]][0], label=PART_STYLE[PREDICTED_PARTS[k]][1]) for k in used
    ]
    if traced:
        handles.append(Patch(facecolor="white", edgecolor="#444444", hatch=MEASURED_HATCH, label="measured (traced)"))
    median = "measured median" if traced else "measured"
    handles.append(Line2D([], [], linestyle="none", marker="D", color="black", label=median))
    layout_panels(fig, axes, axes.index(corner) + 1, panel_legend(corner, handles, "part"), reaches)
    return Figure("time_breakdown", title, caption, png_bytes(fig), note)
