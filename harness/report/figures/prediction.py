"""The time model against the measurements: each cell's predicted step time against its measured median."""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from matplotlib.lines import Line2D
from matplotlib.ticker import FormatStrFormatter, NullFormatter

from harness.report.figures.base import (
    PRECISION_FILL,
    Figure,
    no_data,
    ordered_strategies,
    png_bytes,
    strategy_handles,
    style,
)
from harness.report.figures.registry import register
from harness.report.frame import PREDICTION_BAND, predicted_cells, prediction_accuracy


def why_no_prediction(fc: pd.DataFrame) -> str:
    """Why no cell has a predicted step time: the most common recorded reason, when there is one."""
    reasons = fc["predicted_time_null_reason"].dropna()
    if len(reasons):
        top = reasons.value_counts().index[0]
        return f"no cell that ran ok has a predicted step time; the most common reason: {top}"
    return "no cell that ran ok has a predicted step time (predicted.step_time_s)"


@register("prediction", order=60, cost=0.37)
def prediction_figure(fc: pd.DataFrame) -> Figure:
    title = "Predicted vs measured step time"
    caption = (
        "Each cell's step time as the time model predicted it before the cell ran (predicted.step_time_s) against "
        "its measured median step time (the cell's last run), log axes; the diagonal is exact, the grey band "
        f"±{PREDICTION_BAND:.0%}. MAPE = mean |predicted − measured| / measured, ρ = Spearman's rank correlation, "
        "over the cells drawn. A cell without a prediction (a rate unknown: predicted.time_null_reasons) is not drawn."
    )
    data = predicted_cells(fc)
    if data.empty:
        return no_data("prediction", title, caption, why_no_prediction(fc))
    acc = prediction_accuracy(fc)
    note = ""
    uncal = data["prediction_source"].fillna("").str.startswith("uncalibrated").sum()
    if uncal:
        note = f"{uncal} of {len(data)} cell(s) were predicted from profile figures, not a calibration."
    missing = int(((fc["status"] == "ok") & fc["step_time_median_s"].gt(0)).sum()) - len(data)
    if missing:
        note = (f"{missing} cell(s) that ran ok have no prediction and are not drawn. " + note).strip()
    meas = data["step_time_median_s"].to_numpy(dtype=float) * 1e3
    pred = data["predicted_step_time_s"].to_numpy(dtype=float) * 1e3
    fig, ax = plt.subplots(figsize=(7.0, 5.0), layout="constrained")
    lo = float(min(meas.min(), pred.min())) / 1.3
    hi = float(max(meas.max(), pred.max())) * 1.3
    line = np.array([lo, hi])
    ax.fill_between(line, line * (1 - PREDICTION_BAND), line * (1 + PREDICTION_BAND), color="#EEEEEE", zorder=0)
    ax.plot(line, line, color="#777777", linewidth=0.8, zorder=1)
    strategies = data["strategy"].to_numpy()
    precisions = data["precision"].to_numpy()
    for s in ordered_strategies(data["strategy"]):
        colour, marker = style(s)
        for q in sorted(set(precisions[strategies == s]), key=str):
            m = (strategies == s) & (precisions == q)
            fill = colour if PRECISION_FILL.get(str(q), "full") == "full" else "none"
            ax.scatter(
                meas[m], pred[m], marker=marker, s=30, facecolors=fill, edgecolors=colour, linewidths=1.0, zorder=2
            )
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlim(lo, hi)
    ax.set_ylim(lo, hi)
    ax.set_aspect("equal")
    for axis in (ax.xaxis, ax.yaxis):  # NOTE: milliseconds as plain numbers, not 2 × 10²
        axis.set_major_formatter(FormatStrFormatter("%g"))
        axis.set_minor_formatter(FormatStrFormatter("%g") if hi / lo < 20 else NullFormatter())
    ax.set_xlabel("measured median step time (ms)")
    ax.set_ylabel("predicted step time (ms)")
    rho = "n/a" if acc["spearman"] is None else f"{acc['spearman']:.2f}"
    ax.set_title(
        f"{acc['cells']} cells: MAPE {acc['mape']:.1%}, ρ {rho}, {acc['within_band']:.0%} within ±{PREDICTION_BAND:.0%}"
    )
    ax.grid(True, which="both", color="#EEEEEE", linewidth=0.5)
    handles = strategy_handles(data["strategy"]) + [
        Line2D([], [], linestyle="none", marker="o", color="black", markerfacecolor="none", label="fp32 (hollow)")
    ]
    ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.02, 1.0), frameon=False, title="strategy")
    return Figure("prediction", title, caption, png_bytes(fig), note)
