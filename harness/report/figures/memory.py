"""The peak-memory figure: per (model, GPU count) panel, each strategy · precision's memory per rank beside the
planner's prediction and the device capacity.

A record that measured its tensor memory (metrics.memory_gib) draws two stacked bars: the predicted breakdown
(predicted.memory_gib) and the measured one, split into the same categories in the same colours, with the CUDA
allocator's peak allocated and reserved marked over the measured bar. An older record, without the measurement,
draws as before: peak allocated and reserved bars with the predicted total (◆), and a CPU run's peak RSS apart
(hatched, no prediction).
"""

from __future__ import annotations

from typing import Any

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
    stacked_bars,
)
from harness.report.figures.registry import register
from harness.report.frame import MEMORY_RSS
from harness.results.metrics import MEMORY_CATEGORIES

_MEMORY_COLUMNS = ["peak_memory_allocated_gib", "peak_memory_reserved_gib", "predicted_memory_gib", "memory_total_gib"]
MEASURED_PARTS = [f"memory_{c}_gib" for c in MEMORY_CATEGORIES]
PREDICTED_PARTS = [f"predicted_memory_{c}_gib" for c in MEMORY_CATEGORIES]
CATEGORY_STYLE: dict[str, tuple[str, str]] = {
    "params": ("#4C72B0", "parameters"),
    "grads": ("#DD8452", "gradients"),
    "optimizer": ("#55A868", "optimizer state"),
    "activations": ("#C44E52", "activations"),
    "buffers": ("#8C8C8C", "buffers"),
}
"""memory category → (colour, legend label), the same on the predicted and the measured bar"""
MEASURED_HATCH = "////"
"""the measured breakdown's hatching (its categories keep the predicted bar's colours)"""
PAIR_WIDTH, PAIR_OFFSET, SINGLE_WIDTH = 0.38, 0.2, 0.75
"""a predicted and a measured bar side by side (width each, offset from the cell's x), or one bar alone"""
ALLOCATED_LINE: dict[str, Any] = dict(color="black", linestyle="-", linewidth=1.8)
RESERVED_LINE: dict[str, Any] = dict(color="black", linestyle=":", linewidth=1.8)
"""the CUDA allocator's peaks, drawn across the measured breakdown"""


def _old_bars(ax, p: pd.DataFrame, x: np.ndarray) -> None:
    """The bars of cells without a measured breakdown: reserved (pale), allocated (solid) or a CPU process's RSS
    (hatched), and the predicted total (◆; the caller blanks it beside an RSS)."""
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
    _predicted_marks(ax, x, p["predicted_memory_gib"].to_numpy(dtype=float))


def _predicted_marks(ax, x: np.ndarray, predicted: np.ndarray) -> None:
    ax.plot(x, predicted, linestyle="none", marker="D", color="black", markersize=5, zorder=3)


def _breakdown_bars(ax, p: pd.DataFrame, x: np.ndarray) -> np.ndarray:
    """The bars of cells with a measured breakdown (metrics.memory_gib): the predicted breakdown on the left and
    the measured one (hatched) on the right, or the measured one alone (with the predicted total as ◆ when the
    prediction has no categories); on CUDA, the allocator's peak allocated and reserved as lines across the
    measured bar. Returns every height drawn (GiB), for the panel's top."""
    colours = [CATEGORY_STYLE[c][0] for c in MEMORY_CATEGORIES]
    predicted = p[PREDICTED_PARTS].to_numpy(dtype=float)
    has_pred = ~np.isnan(predicted).all(axis=1)
    width = np.where(has_pred, PAIR_WIDTH, SINGLE_WIDTH)
    xm = np.where(has_pred, x + PAIR_OFFSET, x)
    tops = [stacked_bars(ax, x - PAIR_OFFSET, predicted, colours, width=width, hatch=None)]
    # NOTE: a measured breakdown always has its five categories (TensorMemory requires them); NaN only if unreadable
    measured = np.nan_to_num(p[MEASURED_PARTS].to_numpy(dtype=float))
    tops.append(stacked_bars(ax, xm, measured, colours, width=width, hatch=MEASURED_HATCH))
    total_only = p["predicted_memory_gib"].to_numpy(dtype=float)[~has_pred]
    _predicted_marks(ax, x[~has_pred], total_only)
    device = (p["memory_measure"] != MEMORY_RSS).to_numpy()
    for col, line in (("peak_memory_allocated_gib", ALLOCATED_LINE), ("peak_memory_reserved_gib", RESERVED_LINE)):
        y = p[col].to_numpy(dtype=float)
        at = device & ~np.isnan(y)
        if at.any():
            ax.hlines(y[at], xm[at] - width[at] / 2, xm[at] + width[at] / 2, zorder=3, **line)
            tops.append(y[at])
    return np.concatenate([*tops, total_only])


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


def _memory_panel(ax, p: pd.DataFrame, *, title: str, ylabel: str) -> tuple[LabelReach, bool]:
    """One (model, GPU count) panel of cells `p`; returns (its bar labels' reach, whether its capacity is unknown)."""
    x = np.arange(len(p), dtype=float)
    tensor = p["memory_total_gib"].notna().to_numpy()
    old = p[~tensor]
    _old_bars(ax, old, x[~tensor])
    drawn = [
        old["peak_memory_allocated_gib"].to_numpy(dtype=float),
        old["peak_memory_reserved_gib"].to_numpy(dtype=float),
        old["predicted_memory_gib"].to_numpy(dtype=float),
    ]
    if tensor.any():
        drawn.append(_breakdown_bars(ax, p[tensor], x[tensor]))
    heights = np.concatenate([*drawn, [0.0]])
    top = float(np.nanmax(heights))
    top, capacity_unknown = _capacity(ax, x, p["device_memory_gib"].to_numpy(dtype=float), top)
    alloc = p["peak_memory_allocated_gib"].to_numpy(dtype=float)
    reserved = p["peak_memory_reserved_gib"].to_numpy(dtype=float)
    for xi, st, a, r, t in zip(x, p["status"], alloc, reserved, tensor):
        if st != "ok" and np.isnan(a) and np.isnan(r) and not t:
            ax.text(xi, top * 0.02, st, rotation=90, ha="center", va="bottom", fontsize=7.5, color="#333333")
    ax.set_ylim(0, top * 1.12 if top > 0 else 1.0)
    reach = categorical_xticks(ax, [row_label(s, q) for s, q in zip(p["strategy"], p["precision"])])
    ax.set_title(title, y=TITLE_Y)
    ax.set_ylabel(ylabel)
    ax.grid(True, axis="y", color="#DDDDDD", linewidth=0.6)
    ax.set_axisbelow(True)
    return reach, capacity_unknown


def _memory_handles(shown: pd.DataFrame) -> tuple[list, str | None]:
    """The legend and its title: the strategies of the cells drawn the old way (their bars take the strategy's
    colour), the categories and the two sides of the breakdowns, then an entry for each kind of mark some panel
    draws."""
    tensor = shown["memory_total_gib"].notna()
    old, new = shown[~tensor], shown[tensor]
    handles: list[Any] = strategy_handles(old["strategy"]) if len(old) else []
    if len(new):
        handles += [Patch(facecolor=CATEGORY_STYLE[c][0], label=CATEGORY_STYLE[c][1]) for c in MEMORY_CATEGORIES]
        if new[PREDICTED_PARTS].notna().to_numpy().any():
            handles.append(Patch(facecolor="white", edgecolor="#444444", label="predicted (left bar)"))
        handles.append(
            Patch(facecolor="white", edgecolor="#444444", hatch=MEASURED_HATCH, label="measured tensors\n(right bar)")
        )
        new_device = new[new["memory_measure"] != MEMORY_RSS]
        if new_device["peak_memory_allocated_gib"].notna().any():
            handles.append(Line2D([], [], label="allocator: peak\nallocated", **ALLOCATED_LINE))
        if new_device["peak_memory_reserved_gib"].notna().any():
            handles.append(Line2D([], [], label="allocator: peak\nreserved", **RESERVED_LINE))
    old_rss = old["memory_measure"] == MEMORY_RSS
    rss_patch = Patch(
        facecolor="white", edgecolor="#666666", hatch="////", label="peak RSS, CPU process\n(not tensor memory)"
    )
    diamond = Line2D([], [], linestyle="none", marker="D", color="black", label="predicted total")
    for drawn, handle in (
        (
            old.loc[~old_rss, "peak_memory_allocated_gib"].notna().any(),
            Patch(facecolor="#666666", label="peak allocated"),
        ),
        (old_rss.any(), rss_patch),
        (
            old["peak_memory_reserved_gib"].notna().any(),
            Patch(facecolor="#666666", alpha=0.35, edgecolor="#666666", label="peak reserved"),
        ),
        (
            old["predicted_memory_gib"].notna().any()
            or (new[PREDICTED_PARTS].isna().all(axis=1) & new["predicted_memory_gib"].notna()).any(),
            diamond,
        ),
        (
            shown["device_memory_gib"].notna().any(),
            Line2D([], [], linestyle="--", color="#444444", label="device capacity"),
        ),
    ):
        if drawn:  # no legend entry for what no panel draws
            handles.append(handle)
    return handles, ("strategy" if len(old) else None)


def _caption(*, breakdowns: bool, older: bool) -> str:
    """The caption for what the figure draws: breakdowns (records with metrics.memory_gib), older records, or both."""
    parts = ["Peak memory per rank (per GPU on CUDA). GiB = 2³⁰ bytes; dashed line = device capacity "]
    parts[0] += "(env.device_memory_gib)."
    if breakdowns:
        parts.append(
            "Where a record measured its tensor memory (metrics.memory_gib: the live tensor bytes at the peak of one "
            "untimed step, on the rank with the largest peak), a cell has two stacked bars: left the planner's "
            "prediction (predicted.memory_gib), right the measurement (hatched), each split into parameters, "
            "gradients, optimizer state, activations and buffers in the same colours, so the category where they "
            "differ is where the memory model is off (table.csv: memory_<category>_gib beside "
            "predicted_memory_<category>_gib, memory_deviation = measured / predicted total − 1). On CUDA a solid "
            "line across the measured bar marks the allocator's peak allocated and a dotted one its peak reserved "
            "(the caching allocator's reserve and fragmentation above the tensors). A CPU run's peak RSS is not "
            "drawn beside a measured breakdown (it is not tensor memory; the model tables and table.csv keep it)."
        )
    if older:
        parts.append(
            ("Records without the measurement (older ones): " if breakdowns else "")
            + "solid bar = peak allocated, pale bar = peak reserved by the caching allocator, ◆ = predicted by the "
            "planner; hatched bar = a CPU run's peak RSS of the whole process (interpreter, torch, buffers): not "
            "tensor memory, so no prediction is drawn beside it."
        )
    return " ".join(parts)


def _ylabel(data: pd.DataFrame) -> str:
    rss = data["memory_measure"] == MEMORY_RSS
    if data["memory_total_gib"].isna().all():
        return "peak RSS per process (GiB)" if bool(rss.all()) else "peak memory per GPU (GiB)"
    return "peak memory per rank (GiB)" if bool(rss.any()) else "peak memory per GPU (GiB)"


def _heading(data: pd.DataFrame) -> str:
    if data["memory_total_gib"].notna().any():
        return "Peak memory by category: predicted (left) beside measured tensors (right, hatched)"
    if bool((data["memory_measure"] == MEMORY_RSS).all()):
        return "Peak RSS per CPU process (not device memory)"
    return "Peak memory per GPU: measured, predicted, capacity"


SPLIT_RATIO = 20.0
"""a panel whose largest cell is more than this many times its smallest is drawn as two panels (the large cells
apart), so a ZeRO cell's 1.9 GiB reduce bucket does not flatten a few-MiB cell to nothing"""


def _by_magnitude(p: pd.DataFrame) -> list[tuple[str, pd.DataFrame]]:
    """[(title suffix, cells)]: the panel's cells, or its small and large cells apart (SPLIT_RATIO)."""
    # NOTE: tensor bytes only (a CPU process's RSS, the same few hundred MiB for every cell, would hide the spread)
    size = p[["memory_total_gib", "predicted_memory_gib"]].max(axis=1)
    if size.notna().sum() < 2 or not (size > 0).any():
        return [("", p)]
    small = size.min()
    if small <= 0 or size.max() <= SPLIT_RATIO * small:
        return [("", p)]
    # the cut: the largest gap between neighbouring sizes (in ratio), so each side holds cells of one magnitude
    ordered = size.dropna().sort_values().to_numpy()
    cut = ordered[int(np.argmax(ordered[1:] / ordered[:-1]))]
    below = size <= cut
    return [(f" · cells to {cut:.3g} GiB", p[below]), (f" · cells above {cut:.3g} GiB", p[~below])]


@register("memory", order=30, cost=1.35)
def memory_figure(fc: pd.DataFrame) -> Figure:
    title = "Peak memory"
    cols = _MEMORY_COLUMNS
    # NOTE: the planner predicts tensor bytes; beside a process RSS the gap means nothing, so it is not drawn (a
    # cell that also measured its tensors is drawn against those)
    rss_only = ((fc["memory_measure"] == MEMORY_RSS) & fc["memory_total_gib"].isna()).to_numpy()
    fc = fc.assign(predicted_memory_gib=fc["predicted_memory_gib"].where(~rss_only))
    data = fc[fc[cols].notna().any(axis=1)]
    if data.empty:
        caption = _caption(breakdowns=True, older=True)
        return no_data("memory", title, caption, "no record has a measured or predicted peak memory")
    panels, note = select_panels(data)
    lacking = int(((fc["status"] == "ok") & fc[cols].isna().all(axis=1)).sum())
    if lacking:
        note = (f"{lacking} cell(s) that ran ok have no memory figures and are not drawn. " + note).strip()
    shown = data[data["model"].isin({m for m, _ in panels})]
    tensor = shown["memory_total_gib"].notna()
    caption = _caption(breakdowns=bool(tensor.any()), older=not bool(tensor.all()))
    groups = [
        (f"{model_title(fc, model)} · {gpus_label(gpus)}{suffix}", part)
        for model, gpus in panels
        for suffix, part in _by_magnitude(data[(data["model"] == model) & (data["gpus"] == gpus)])
    ]
    n_bars = max(len(part) for _, part in groups)
    fig, axes, corner = new_panel_figure(len(groups), n_bars, _heading(data))
    ylabel = _ylabel(data)
    capacity_unknown, reaches = False, []
    for ax, (title_of_panel, p) in zip(axes, groups):
        reach, unknown = _memory_panel(ax, p, title=title_of_panel, ylabel=ylabel)
        reaches.append(reach)
        capacity_unknown |= unknown
    handles, legend_title = _memory_handles(shown)
    layout_panels(fig, axes, axes.index(corner) + 1, panel_legend(corner, handles, legend_title), reaches)
    if capacity_unknown:
        note = (note + " " if note else "") + (
            "Device capacity unknown for some panels (env.device_memory_gib is null): no capacity line there."
        )
    return Figure("memory", title, caption, png_bytes(fig), note)
