"""The checkpoint figure (`checkpoint: true` cells, metrics.checkpoint): per (model, GPU count), the save and load
times of each strategy · precision, and the bytes written beside the planner's prediction."""

from __future__ import annotations

import matplotlib.pyplot as plt
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
    style,
)
from harness.report.figures.registry import register

PANEL_W, PANEL_H = 5.2, 3.4
"""one axes' size (inches): a row per (model, GPU count) panel, times left and bytes right"""


@register("checkpoint", order=75, cost=0.05)
def checkpoint_figure(fc: pd.DataFrame) -> Figure:
    title = "Checkpoint save, load and size"
    caption = (
        "The full training state (model, optimizer, step) saved the way each strategy is used (DCP with sharded "
        "state dicts for FSDP/FSDP2, rank 0's torch.save for DDP, DeepSpeed's save_checkpoint for ZeRO) after the "
        "timed steps and fsynced, then loaded into a fresh model and optimizer (metrics.checkpoint). Left: save "
        "(solid) and load (hatched) time, the slowest rank's, log scale; — = predicted save (predicted.checkpoint_s: "
        "the slowest node's bytes at the storage write bandwidth, where known). Right: bytes written by all ranks; "
        "◆ = predicted bytes (predicted.checkpoint_bytes: parameters and AdamW state in the precisions the strategy "
        "stores them, and for FSDP/FSDP2 DCP's framing and metadata, exact to the byte but for the folder's path)."
    )
    data = fc[fc["checkpoint_bytes"].notna() | fc["checkpoint_save_s"].notna()]
    if data.empty:
        return no_data("checkpoint", title, caption, "no record has metrics.checkpoint (run with checkpoint: true)")
    panels, note = select_panels(data)
    fig, axes = plt.subplots(len(panels), 2, figsize=(2 * PANEL_W, PANEL_H * len(panels)), squeeze=False)
    div, unit = byte_unit(float(np.nanmax(data[["checkpoint_bytes", "predicted_checkpoint_bytes"]].to_numpy())))
    for (ax_t, ax_b), (model, gpus) in zip(axes, panels):
        p = data[(data["model"] == model) & (data["gpus"] == gpus)]
        x = np.arange(len(p))
        colors = [style(s)[0] for s in p["strategy"]]
        labels = [row_label(s, q) for s, q in zip(p["strategy"], p["precision"])]
        ax_t.bar(x - 0.2, p["checkpoint_save_s"].to_numpy(dtype=float), 0.4, color=colors, edgecolor="white")
        ax_t.bar(x + 0.2, p["checkpoint_load_s"].to_numpy(dtype=float), 0.4, color=colors, edgecolor="white",
                 hatch="///", alpha=0.8)  # fmt: skip
        ax_t.plot(x - 0.2, p["predicted_checkpoint_s"].to_numpy(dtype=float), linestyle="none", marker="_",
                  markersize=14, markeredgewidth=2.5, color="black", zorder=3)  # fmt: skip
        ax_t.set_yscale("log")
        times = p[["checkpoint_save_s", "checkpoint_load_s", "predicted_checkpoint_s"]].to_numpy(dtype=float)
        if np.isfinite(times).any():  # NOTE: a decade below the smallest, so one bar's height reads against another
            ax_t.set_ylim(10 ** np.floor(np.log10(np.nanmin(times[times > 0])) - 0.3), np.nanmax(times) * 1.6)
        ax_t.set_ylabel("seconds (slowest rank)")
        ax_b.bar(x, p["checkpoint_bytes"].to_numpy(dtype=float) / div, 0.7, color=colors, edgecolor="white")
        ax_b.plot(x, p["predicted_checkpoint_bytes"].to_numpy(dtype=float) / div, linestyle="none", marker="D",
                  color="black", markersize=5, zorder=3)  # fmt: skip
        ax_b.set_ylabel(f"bytes written ({unit})")
        for ax, what in ((ax_t, "save / load"), (ax_b, "bytes")):
            ax.set_xlim(-0.6, max(len(p), 4) - 0.4)  # NOTE: a panel of one or two cells keeps narrow bars
            ax.set_xticks(x, labels, rotation=35, ha="right", fontsize=8)
            ax.set_title(f"{model_title(fc, model)} · {gpus_label(gpus)}: {what}", fontsize=9.5)
            ax.grid(True, axis="y", color="#DDDDDD", linewidth=0.6)
            ax.set_axisbelow(True)
    handles = [
        Patch(facecolor="#999999", edgecolor="white", label="save"),
        Patch(facecolor="#999999", edgecolor="white", hatch="///", label="load"),
        Line2D(
            [],
            [],
            linestyle="none",
            marker="_",
            markersize=12,
            markeredgewidth=2.5,
            color="black",
            label="predicted save (storage bandwidth)",
        ),
        Line2D([], [], linestyle="none", marker="D", color="black", label="predicted bytes"),
    ]
    fig.legend(handles=handles, fontsize=8, loc="upper center", ncol=4, frameon=False)
    fig.tight_layout(rect=(0, 0, 1, 1 - 0.3 / (PANEL_H * len(panels))))
    return Figure("checkpoint", title, caption, png_bytes(fig), note)
