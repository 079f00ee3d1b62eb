"""The peak-memory figure: per (model, GPU count) panel, each strategy · precision's peak allocated and reserved
memory, the planner's prediction and the device capacity; a CPU run's peak RSS apart (hatched, no prediction)."""

from __future__ import annotations

import numpy as np
import pandas as pd
from matplotlib.lines import Line2D
from matplotlib.patches import Patch

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
    LabelReach,
    bars,
    categorical_xticks,
    layout_panels,
    new_panel_figure,
    panel_legend,
)
from harness.report.figures.registry import register
from harness.report.frame import MEMORY_RSS

_MEMORY_COLUMNS = ["peak_memory_allocated_gib", "peak_memory_reserved_gib", "predicted_memory_gib"]


def _memory_bars(ax, p: pd.DataFrame, x: np.ndarray) -> None:
    """One panel's bars: reserved (pale), allocated (solid) or a CPU process's RSS (hatched), and the prediction (◆)."""
    colors = [style(s)[0] for s in p["strategy"]]
    alloc = p["peak_memory_allocated_gib"].to_numpy()
    reserved = p["peak_memory_reserved_gib"].to_numpy()
    bars(ax, x, np.nan_to_num(reserved, nan=0.0), width=0.75, color=colors, alpha=0.35, edgecolor=colors, linewidth=0.8)
    rss = (p["memory_measure"] == MEMORY_RSS).to_numpy()
    if (~rss).any():
        bars(
            ax,
            x[~rss],
            np.nan_to_num(alloc[~rss], nan=0.0),
            width=0.75,
            color=[c for c, r in zip(colors, rss) if not r],
            edgecolor=[c for c, r in zip(colors, rss) if not r],
        )
    if rss.any():
        rss_colors = [c for c, r in zip(colors, rss) if r]
        bars(
            ax,
            x[rss],
            np.nan_to_num(alloc[rss], nan=0.0),
            width=0.75,
            color="white",
            edgecolor=rss_colors,
            hatch="////",
            linewidth=1.2,
        )
    ax.plot(
        x, p["predicted_memory_gib"].to_numpy(), linestyle="none", marker="D", color="black", markersize=5, zorder=3
    )


def _capacity(ax, x: np.ndarray, cap: np.ndarray, top: float) -> tuple[float, bool]:
    """The device capacity in one panel: one dashed line (or one per bar when they differ), or a note that it is
    off scale. Returns (the panel's top, GiB; whether the capacity is unknown)."""
    caps = sorted(set(cap[~np.isnan(cap)]))
    if not caps:
        return top, True
    if top >= 0.05 * max(caps):
        if len(caps) == 1:
            ax.axhline(caps[0], color="#444444", linestyle="--", linewidth=1.2)
            ax.text(
                0.99,
                caps[0],
                f"capacity {caps[0]:.3g} GiB",
                transform=ax.get_yaxis_transform(),
                ha="right",
                va="bottom",
                fontsize=7.5,
                color="#444444",
            )
            return max(top, caps[0]), False
        ax.hlines(cap, x - 0.45, x + 0.45, color="#444444", linestyle="--", linewidth=1.2)
        return max(top, max(caps)), False
    ax.text(
        0.02,
        0.97,
        f"device capacity {max(caps):.3g} GiB (off scale)",
        transform=ax.transAxes,
        fontsize=7.5,
        va="top",
        color="#444444",
    )
    return top, False


def _memory_panel(ax, p: pd.DataFrame, *, title: str, all_rss: bool) -> tuple[LabelReach, bool]:
    """One (model, GPU count) panel of cells `p`; returns (its bar labels' reach, whether its capacity is unknown)."""
    x = np.arange(len(p))
    _memory_bars(ax, p, x)
    alloc = p["peak_memory_allocated_gib"].to_numpy()
    reserved = p["peak_memory_reserved_gib"].to_numpy()
    top = float(np.nanmax(np.concatenate([alloc, reserved, p["predicted_memory_gib"].to_numpy()])))
    top, capacity_unknown = _capacity(ax, x, p["device_memory_gib"].to_numpy(), top)
    for xi, st, a, r in zip(x, p["status"], alloc, reserved):
        if st != "ok" and np.isnan(a) and np.isnan(r):
            ax.text(xi, top * 0.02, st, rotation=90, ha="center", va="bottom", fontsize=7.5, color="#333333")
    ax.set_ylim(0, top * 1.12 if top > 0 else 1.0)
    reach = categorical_xticks(ax, [row_label(s, q) for s, q in zip(p["strategy"], p["precision"])])
    ax.set_title(title, y=TITLE_Y)
    ax.set_ylabel("peak RSS per process (GiB)" if all_rss else "peak memory per GPU (GiB)")
    ax.grid(True, axis="y", color="#DDDDDD", linewidth=0.6)
    ax.set_axisbelow(True)
    return reach, capacity_unknown


def _memory_handles(shown: pd.DataFrame) -> list:
    """The legend: the strategies drawn, then an entry for each kind of mark some panel draws."""
    handles = strategy_handles(shown["strategy"])
    shown_rss = shown["memory_measure"] == MEMORY_RSS
    rss_patch = Patch(
        facecolor="white", edgecolor="#666666", hatch="////", label="peak RSS, CPU process\n(not tensor memory)"
    )
    for col, handle in (
        ("peak_memory_allocated_gib", Patch(facecolor="#666666", label="peak allocated")),
        ("peak_rss", rss_patch),
        (
            "peak_memory_reserved_gib",
            Patch(facecolor="#666666", alpha=0.35, edgecolor="#666666", label="peak reserved"),
        ),
        ("predicted_memory_gib", Line2D([], [], linestyle="none", marker="D", color="black", label="predicted")),
        ("device_memory_gib", Line2D([], [], linestyle="--", color="#444444", label="device capacity")),
    ):
        if col == "peak_rss":
            drawn = bool(shown_rss.any())
        elif col == "peak_memory_allocated_gib":
            drawn = bool(shown.loc[~shown_rss, col].notna().any())
        else:
            drawn = bool(shown[col].notna().any())
        if drawn:  # no legend entry for what no panel draws
            handles.append(handle)
    return handles


@register("memory", order=30, cost=1.35)
def memory_figure(fc: pd.DataFrame) -> Figure:
    title = "Peak memory"
    caption = (
        "Peak memory per GPU: solid bar = peak allocated, pale bar = peak reserved by the caching "
        "allocator, ◆ = predicted by the planner, dashed line = device capacity (env.device_memory_gib). "
        "Hatched bar = a CPU run's peak RSS of the whole process (interpreter, torch, buffers): not tensor "
        "memory, so no prediction is drawn beside it. GiB = 2³⁰ bytes."
    )
    cols = _MEMORY_COLUMNS
    rss_rows = (fc["memory_measure"] == MEMORY_RSS).to_numpy()
    # NOTE: the planner predicts tensor bytes; beside a process RSS the gap means nothing, so it is not drawn
    fc = fc.assign(predicted_memory_gib=fc["predicted_memory_gib"].where(~rss_rows))
    data = fc[fc[cols].notna().any(axis=1)]
    if data.empty:
        return no_data("memory", title, caption, "no record has a measured or predicted peak memory")
    panels, note = select_panels(data)
    lacking = int(((fc["status"] == "ok") & fc[cols].isna().all(axis=1)).sum())
    if lacking:
        note = (f"{lacking} cell(s) that ran ok have no memory figures and are not drawn. " + note).strip()
    n_bars = max(((data["model"] == m) & (data["gpus"] == g)).sum() for m, g in panels)
    all_rss = bool((data["memory_measure"] == MEMORY_RSS).all())
    fig, axes, corner = new_panel_figure(
        len(panels),
        n_bars,
        "Peak RSS per CPU process (not device memory)"
        if all_rss
        else "Peak memory per GPU: measured, predicted, capacity",
    )
    capacity_unknown, reaches = False, []
    for ax, (model, gpus) in zip(axes, panels):
        p = data[(data["model"] == model) & (data["gpus"] == gpus)]
        title_of_panel = f"{model_title(fc, model)} · {gpus_label(gpus)}"
        reach, unknown = _memory_panel(ax, p, title=title_of_panel, all_rss=all_rss)
        reaches.append(reach)
        capacity_unknown |= unknown
    handles = _memory_handles(data[data["model"].isin({m for m, _ in panels})])
    layout_panels(fig, axes, axes.index(corner) + 1, panel_legend(corner, handles, "strategy"), reaches)
    if capacity_unknown:
        note = (note + " " if note else "") + (
            "Device capacity unknown for some panels (env.device_memory_gib is null): no capacity line there."
        )
    return Figure("memory", title, caption, png_bytes(fig), note)
