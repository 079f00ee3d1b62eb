"""The step-time figure: the distribution of each cell's measured step times, as box plots per (model, GPU count)
panel."""

from __future__ import annotations

import numpy as np
import pandas as pd

from harness.report.figures.base import (
    Figure,
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
from harness.report.frame import SAMPLES_COLUMN


def _boxes(ax, series: list[np.ndarray], colors: list[str]) -> None:
    """Tukey box plots drawn as a handful of collections (ax.boxplot makes ~7 artists per box, which is slow
    for hundreds of boxes): box p25–p75, median line, whiskers to the last sample within 1.5 × IQR, outliers."""
    x = np.arange(len(series), dtype=float)
    q1, med, q3 = np.array([np.percentile(s, [25, 50, 75]) for s in series]).T
    iqr = q3 - q1
    lo = np.array([s[s >= a].min() for s, a in zip(series, q1 - 1.5 * iqr)])
    hi = np.array([s[s <= b].max() for s, b in zip(series, q3 + 1.5 * iqr)])
    bars(ax, x, q3 - q1, bottom=q1, width=0.6, color=colors, edgecolor="black", linewidth=0.6)
    # the median as a white line with a black rim: visible on every strategy colour, black included
    ax.hlines(med, x - 0.3, x + 0.3, color="black", linewidth=3.0, zorder=3)
    ax.hlines(med, x - 0.28, x + 0.28, color="white", linewidth=1.4, zorder=4)
    ax.vlines(np.concatenate([x, x]), np.concatenate([lo, q3]), np.concatenate([q1, hi]), color="black", linewidth=0.8)
    ax.hlines(
        np.concatenate([lo, hi]),
        np.concatenate([x, x]) - 0.15,
        np.concatenate([x, x]) + 0.15,
        color="black",
        linewidth=0.8,
    )
    fx = np.concatenate([np.full(((s < a) | (s > b)).sum(), xi) for s, a, b, xi in zip(series, lo, hi, x)])
    fy = np.concatenate([s[(s < a) | (s > b)] for s, a, b in zip(series, lo, hi)])
    ax.plot(fx, fy, linestyle="none", marker="o", markersize=3, markerfacecolor="none", markeredgecolor="#555555")


@register("step_time", order=50, cost=1.15)
def step_time_figure(fc: pd.DataFrame) -> Figure:
    title = "Step-time distributions"
    caption = (
        "Distribution of the measured step times (after warm-up) per strategy · precision: box = "
        "p25–p75, white line = median, whiskers = last sample within 1.5 × IQR, circles = outliers."
    )
    data = fc[fc[SAMPLES_COLUMN].map(len) > 0]
    if data.empty:
        return no_data("step_time", title, caption, "no record has step-time samples")
    panels, note = select_panels(data)
    n_bars = max(((data["model"] == m) & (data["gpus"] == g)).sum() for m, g in panels)
    fig, axes, corner = new_panel_figure(len(panels), n_bars, "Step-time distributions (measured steps)")
    reaches = []
    for ax, (model, gpus) in zip(axes, panels):
        mask = ((data["model"] == model) & (data["gpus"] == gpus)).to_numpy()
        p = data[mask]
        series = [np.asarray(s) * 1e3 for s in p[SAMPLES_COLUMN]]
        _boxes(ax, series, [style(s)[0] for s in p["strategy"]])
        lo = min(float(np.min(s)) for s in series)
        hi = max(float(np.max(s)) for s in series)
        if lo > 0 and hi / lo > 30:
            ax.set_yscale("log")
        reaches.append(categorical_xticks(ax, [row_label(s, q) for s, q in zip(p["strategy"], p["precision"])]))
        ax.set_title(f"{model_title(fc, model)} · {gpus_label(gpus)}", y=TITLE_Y)
        ax.set_ylabel("step time (ms)")
        ax.grid(True, axis="y", color="#DDDDDD", linewidth=0.6)
        ax.set_axisbelow(True)
    handles = strategy_handles(data.loc[data["model"].isin({m for m, _ in panels}), "strategy"])
    layout_panels(fig, axes, axes.index(corner) + 1, panel_legend(corner, handles, "strategy"), reaches)
    return Figure("step_time", title, caption, png_bytes(fig), note)
