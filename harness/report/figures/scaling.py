"""The throughput-scaling figure: tokens/s per GPU and scaling efficiency against the GPU count."""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from matplotlib.ticker import EngFormatter

from harness.report.figures.base import (
    PRECISION_FILL,
    PRECISION_LINESTYLE,
    Figure,
    model_title,
    no_data,
    png_bytes,
    precision_handle,
    select_models,
    strategy_handles,
    style,
)
from harness.report.figures.layout import PAD_IN, TITLE_Y, layout_scaling, log2_gpus_axis, panel_legend
from harness.report.figures.registry import register
from harness.scenario.spec import PRECISIONS


@register("scaling", order=10, cost=0.85)
def scaling_figure(fc: pd.DataFrame) -> Figure:
    title = "Throughput scaling"
    caption = (
        "Top: tokens/s per GPU against GPU count (log₂ axis), one line per strategy (colour, marker shape) "
        "and precision (line style and marker fill: bf16 filled, fp16 half, fp32 hollow); status-ok cells "
        "only. Bottom: scaling efficiency = tokens/s/GPU at N GPUs ÷ tokens/s/GPU at the smallest GPU "
        "count where that strategy and precision ran (1.0 = linear scaling), drawn only for strategy · "
        "precision series measured at two or more GPU counts."
    )
    ok = fc[(fc["status"] == "ok") & fc["tokens_per_s_per_gpu"].notna()]
    if ok.empty:
        return no_data("scaling", title, caption, "no cell ran ok with a tokens/s/GPU")
    models, note = select_models(ok)
    fig, axes = plt.subplots(
        2,
        len(models),
        figsize=(max(8.0, 4.3 * len(models) + 2.6), 7.2),
        squeeze=False,
        sharex="col",
    )  # NOTE: no layout engine: layout_scaling places the panels
    fig.suptitle(
        "Throughput scaling: tokens/s per GPU and scaling efficiency vs GPU count", y=1.0 - PAD_IN / 7.2, va="top"
    )
    all_gpus = sorted(ok["gpus"].unique())
    n_efficiency = 0
    for j, model in enumerate(models):
        top, bottom = axes[0, j], axes[1, j]
        sub = ok[ok["model"] == model]
        eff_max, drawn = 1.0, 0
        for (strategy, precision), line in sub.groupby(["strategy", "precision"], sort=False):
            line = line.sort_values("gpus")
            color, marker = style(strategy)
            kw = dict(
                color=color,
                marker=marker,
                linestyle=PRECISION_LINESTYLE.get(precision, "-."),
                markersize=5,
                linewidth=1.4,
                fillstyle=PRECISION_FILL.get(precision, "bottom"),
                markerfacecoloralt="white",
            )
            if kw["fillstyle"] == "none":
                kw["markerfacecolor"] = "white"  # NOTE: hollow, but opaque over the lines behind it
                kw["fillstyle"] = "full"
                kw["markeredgewidth"] = 1.3
            x, y = line["gpus"].to_numpy(), line["tokens_per_s_per_gpu"].to_numpy()
            top.plot(x, y, **kw)
            if len(x) >= 2:  # NOTE: one GPU count is no scaling: it would sit at 1.0 by definition
                bottom.plot(x, y / y[0], **kw)
                eff_max = max(eff_max, float(np.max(y / y[0])))
                drawn += 1
        n_efficiency += drawn
        top.set_title(model_title(fc, model), y=TITLE_Y)
        top.yaxis.set_major_formatter(EngFormatter(sep=""))
        top.set_ylim(bottom=0)
        if drawn:
            bottom.axhline(1.0, color="#777777", linewidth=0.8, linestyle=(0, (2, 2)), zorder=0)
        else:
            bottom.text(
                0.5,
                0.5,
                "no strategy · precision ran at\ntwo or more GPU counts:\nno efficiency to draw",
                transform=bottom.transAxes,
                ha="center",
                va="center",
                fontsize=8.5,
                color="#555555",
            )
        bottom.set_ylim(0, max(1.15, eff_max * 1.08))
        bottom.set_xlabel("GPU count (log₂ scale)")
        for ax in (top, bottom):
            log2_gpus_axis(ax, all_gpus)
            ax.grid(True, axis="y", color="#DDDDDD", linewidth=0.6)
    axes[0, 0].set_ylabel("throughput per GPU (tokens/s)")
    axes[1, 0].set_ylabel("scaling efficiency (ratio, 1 = linear)")
    precisions = [p for p in PRECISIONS if p in set(ok["precision"])] + sorted(set(ok["precision"]) - set(PRECISIONS))
    prec_handles = [precision_handle(p) for p in precisions]
    legend = panel_legend(axes[0, -1], strategy_handles(ok["strategy"]) + prec_handles, "strategy / precision")
    layout_scaling(fig, axes, legend)
    if not n_efficiency:
        why = (
            "only one GPU count in the results"
            if len(all_gpus) == 1
            else "no strategy · precision ran ok at two or more GPU counts"
        )
        note = (note + " " if note else "") + f"Scaling efficiency not drawn: {why}."
    return Figure("scaling", title, caption, png_bytes(fig), note)
