"""How the bar and box figures are drawn and placed: panels on a grid, one rotated label under each bar, the
panels placed once from the few texts that set the margins (where a constrained layout measured every text and
tick twice), bars as one collection per series, and a log2 GPU-count axis. Sizes in inches unless named.
"""

from __future__ import annotations

import functools
import math
from typing import Any, NamedTuple

import matplotlib
import matplotlib.pyplot as plt
import numpy as np
from matplotlib.backends.backend_agg import RendererAgg
from matplotlib.collections import PolyCollection
from matplotlib.font_manager import FontProperties
from matplotlib.markers import TICKDOWN
from matplotlib.ticker import NullLocator, ScalarFormatter
from matplotlib.transforms import ScaledTranslation, blended_transform_factory

from harness.report.figures.base import DPI

LAYOUT_LEFT_LABELS = 6
"""rotated bar labels from the left of a panel that the layout measures (see categorical_xticks)"""
TITLE_Y = 1.0
"""a panel title's y (axes fraction), given: where matplotlib would put it (no x tick labels on top), but a
title without a y is re-placed at every draw by measuring the y axis's ticks again"""
_BAR_LABEL_ANGLE = 55.0
_BAR_LABEL_SIZE = 7.5
PAD_IN = 0.06
"""space (in) between the figure's edge and the outermost text, and between a panel's texts and the next panel"""


class LabelReach(NamedTuple):
    """How far a panel's bar labels reach beyond its axes (categorical_xticks measures, layout_panels reads)."""

    down_in: float
    """below the axes, tick marks included"""
    left: list[tuple[float, float]]
    """(bar x, how far that label reaches left of the bar, in) for the labels that can set the left margin"""


def panel_grid(n_panels: int, n_bars: int) -> tuple[int, int, float, float]:
    """(nrows, ncols, panel width, panel height) in inches for bar/box panels with rotated labels."""
    panel_w = max(3.4, 1.0 + 0.34 * n_bars)
    ncols = max(1, min(n_panels, int(14 // panel_w)))
    nrows = math.ceil(n_panels / ncols)
    return nrows, ncols, panel_w, 3.9


def new_panel_figure(n_panels: int, n_bars: int, title: str):
    """(figure, the axes of its `n_panels` panels in reading order, the top-right panel, beside which the legend
    goes) for panels of at most `n_bars` bars each; the grid's spare axes are hidden."""
    nrows, ncols, pw, ph = panel_grid(n_panels, n_bars)
    # NOTE: no layout engine: layout_panels places the panels once every artist is in (a constrained layout
    # measured every text and tick twice, a third of a panel figure's time)
    fig, axes = plt.subplots(nrows, ncols, figsize=(pw * ncols + 2.4, ph * nrows + 0.6), squeeze=False)
    fig.suptitle(title, y=1.0 - PAD_IN / (ph * nrows + 0.6), va="top")
    flat = list(axes.flat)
    for ax in flat[n_panels:]:
        ax.set_visible(False)
    return fig, flat[:n_panels], flat[min(ncols, n_panels) - 1]


def panel_legend(anchor: plt.Axes, handles: list, title: str | None = None):
    """The figure's legend to the right of `anchor` (the top-right panel), top-aligned with it. An axes legend,
    not a figure legend, so the layout makes room for it and it never covers the title."""
    return anchor.legend(
        handles=handles,
        loc="upper left",
        bbox_to_anchor=(1.02, 1.0),
        borderaxespad=0.0,
        frameon=False,
        title=title,
        alignment="left",
    )


def categorical_xticks(ax, labels: list[str]) -> LabelReach:
    """One rotated label under each bar, with its tick mark: drawn as one text per label and one line of tick
    marks, where set_xticklabels builds a Tick (two lines, a grid line and two texts, each updated on every
    layout pass) per label, most of a panel figure's time at 8 panels of 33 bars. The pixels are those of
    ticks: the marks and the labels sit where rcParams put tick marks and their labels (length + pad below).
    Returns how far the labels reach, for layout_panels."""
    rc = matplotlib.rcParams
    size, pad = rc["xtick.major.size"], rc["xtick.major.pad"]
    colour = rc["xtick.color"] if rc["xtick.labelcolor"] == "inherit" else rc["xtick.labelcolor"]
    x = np.arange(len(labels))
    ax.set_xticks([])
    under = blended_transform_factory(ax.transData, ax.transAxes)  # x in data, y in axes (0 = the bottom)
    ax.plot(
        x,
        np.zeros(len(x)),
        linestyle="none",
        marker=TICKDOWN,
        markersize=size,
        markeredgewidth=rc["xtick.major.width"],
        color=rc["xtick.color"],
        transform=under,
        clip_on=False,
    )
    below = under + ScaledTranslation(0, -(size + pad) / 72, ax.get_figure().dpi_scale_trans)
    # NOTE: only the labels that can set a margin are measured (for layout_panels): the longest ones (the
    # bottom) and the first ones (the left: a label reaches left by at most its length × cos 55°, fewer bars than
    # LAYOUT_LEFT_LABELS away)
    longest = max(len(label) for label in labels) if labels else 0
    sin, cos = math.sin(math.radians(_BAR_LABEL_ANGLE)), math.cos(math.radians(_BAR_LABEL_ANGLE))
    down, left = 0.0, []
    for i, (xi, label) in enumerate(zip(x, labels)):
        if i < LAYOUT_LEFT_LABELS or len(label) >= longest - 2:
            w, h = _bar_label_size_in(label)
            # ha right, va top, rotated about that corner: the text's box reaches w·sin + h·cos down and its top
            # left corner w·cos to the left
            down = max(down, w * sin + h * cos)
            left.append((float(xi), w * cos))
        ax.text(
            xi,
            0,
            label,
            transform=below,
            rotation=_BAR_LABEL_ANGLE,
            ha="right",
            va="top",
            rotation_mode="anchor",
            fontsize=_BAR_LABEL_SIZE,
            color=colour,
        )
    ax.set_xlim(-0.7, len(labels) - 0.3)
    return LabelReach(down + (size + pad) / 72, left)


@functools.lru_cache(maxsize=4096)
def _bar_label_size_in(label: str) -> tuple[float, float]:
    """(width, height) in inches of a bar label, unrotated; cached: the same labels recur in every panel"""
    w, h, _ = _MEASURE.get_text_width_height_descent(label, FontProperties(size=_BAR_LABEL_SIZE), ismath=False)
    return w / _MEASURE.dpi, h / _MEASURE.dpi


_MEASURE = RendererAgg(1, 1, DPI)
"""a renderer that only measures text (the Agg text metrics at DPI; sizes in inches do not depend on it)"""


def _line_in(size: float) -> float:
    """height (in) of one line of text of `size` points"""
    return 1.25 * size / 72


def _text_width_in(fig, texts: list[str], size: float) -> float:
    """the widest of `texts` at `size` points, in inches (mathtext for '$…$' tick labels)"""
    renderer = fig.canvas.get_renderer()
    prop = FontProperties(size=size)
    widths = [renderer.get_text_width_height_descent(t, prop, ismath="$" in t)[0] for t in texts if t]
    return max(widths, default=0.0) / renderer.dpi


def _ytick_labels(ax) -> list[str]:
    """the y axis's major tick labels as drawn (the locator's ticks within the view)"""
    lo, hi = sorted(ax.get_ylim())
    locs = [v for v in ax.yaxis.get_major_locator()() if lo - 1e-9 * abs(hi - lo) <= v <= hi + 1e-9 * abs(hi - lo)]
    return list(ax.yaxis.get_major_formatter().format_ticks(locs))


def layout_panels(fig, axes: list, ncols: int, legend, reaches: list[LabelReach]) -> None:
    """Place the panels of a bar/box figure on its grid: margins from the texts that set them — the suptitle,
    each panel's title, y label and widest y tick label, the bar labels under it (`reaches`, one per panel, from
    categorical_xticks) and the
    legend beside the top-right panel. One measurement of a few texts, where a constrained layout measured
    every text and tick twice; the panels get all the space the texts leave, as with a constrained layout."""
    rc = matplotlib.rcParams
    width, height = fig.get_size_inches()
    nrows = math.ceil(len(axes) / ncols)
    rows = [axes[r * ncols : (r + 1) * ncols] for r in range(nrows)]
    tick = (rc["ytick.major.size"] + rc["ytick.major.pad"]) / 72
    ylabel = _line_in(rc["axes.labelsize"]) + rc["axes.labelpad"] / 72
    left = PAD_IN + ylabel + tick + max(_text_width_in(fig, _ytick_labels(ax), rc["ytick.labelsize"]) for ax in axes)
    title = _line_in(rc["axes.titlesize"]) + rc["axes.titlepad"] / 72
    top = PAD_IN + _line_in(rc["figure.titlesize"]) + PAD_IN
    reach_rows = [reaches[r * ncols : (r + 1) * ncols] for r in range(nrows)]
    bottoms = [max(reach.down_in for reach in row) + PAD_IN for row in reach_rows]
    renderer = fig.canvas.get_renderer()
    legend_w = legend.get_window_extent(renderer).width / renderer.dpi if legend is not None else 0.0
    for _ in range(2):  # NOTE: the bar labels' reach to the left depends on the panel width: twice is enough
        panel_w = (width - ncols * left - (ncols - 1) * PAD_IN - legend_w - 2 * PAD_IN) / (ncols + 0.02)
        reach = 0.0
        for ax, label_reach in zip(axes, reaches):
            lo, hi = ax.get_xlim()
            for x, w in label_reach.left:
                reach = max(reach, w - (x - lo) / (hi - lo) * panel_w)
        left = max(left, reach + PAD_IN)
    panel_h = (height - top - sum(bottoms) - nrows * title) / nrows
    y = height - top
    for row, bottom in zip(rows, bottoms):
        y -= title + panel_h
        for j, ax in enumerate(row):
            x = left + j * (left + panel_w + PAD_IN)
            ax.set_position([x / width, y / height, panel_w / width, panel_h / height])
        y -= bottom


def layout_scaling(fig, axes, legend) -> None:
    """Place the scaling figure's 2 × models panels (top: throughput, with the model titles; bottom: efficiency,
    with the GPU count labels, the x axes shared): as layout_panels, margins from the texts that set them."""
    rc = matplotlib.rcParams
    width, height = fig.get_size_inches()
    ncols = axes.shape[1]
    tick = (rc["ytick.major.size"] + rc["ytick.major.pad"]) / 72
    ylabel = _line_in(rc["axes.labelsize"]) + rc["axes.labelpad"] / 72
    lefts = [
        PAD_IN
        + (ylabel if j == 0 else 0.0)
        + tick
        + max(_text_width_in(fig, _ytick_labels(ax), rc["ytick.labelsize"]) for ax in axes[:, j])
        for j in range(ncols)
    ]
    renderer = fig.canvas.get_renderer()
    legend_w = legend.get_window_extent(renderer).width / renderer.dpi
    panel_w = (width - sum(lefts) - (ncols - 1) * PAD_IN - legend_w - 2 * PAD_IN) / (ncols + 0.02)
    top = PAD_IN + _line_in(rc["figure.titlesize"]) + PAD_IN + _line_in(rc["axes.titlesize"]) + rc["axes.titlepad"] / 72
    gap = rc["xtick.major.size"] / 72 + 2 * PAD_IN  # the top row has tick marks, no tick labels (shared x)
    xlabels = (rc["xtick.major.size"] + rc["xtick.major.pad"]) / 72 + _line_in(rc["xtick.labelsize"])
    bottom = xlabels + _line_in(rc["axes.labelsize"]) + rc["axes.labelpad"] / 72 + PAD_IN
    panel_h = (height - top - gap - bottom) / 2
    x = 0.0
    for j in range(ncols):
        x += lefts[j]
        axes[0, j].set_position([x / width, (bottom + panel_h + gap) / height, panel_w / width, panel_h / height])
        axes[1, j].set_position([x / width, bottom / height, panel_w / width, panel_h / height])
        x += panel_w + PAD_IN


def bars(
    ax,
    x: np.ndarray,
    height: np.ndarray,
    *,
    bottom: np.ndarray | float = 0.0,
    width: float,
    color: Any,
    edgecolor: Any,
    linewidth: float = 1.0,
    hatch: str | None = None,
    alpha: float | None = None,
) -> None:
    """Vertical bars as one PolyCollection (what ax.bar draws, one Rectangle patch each: a patch costs about a
    millisecond to add and another to draw, the largest cost of the panel figures after the text). The data
    limits grow as with ax.bar, and the y limits do not pass below 0 when a bar starts there."""
    x = np.asarray(x, dtype=float)
    height = np.asarray(height, dtype=float)
    if not len(x):
        return
    y0 = np.broadcast_to(np.asarray(bottom, dtype=float), x.shape)
    y1 = y0 + height
    left, right = x - width / 2, x + width / 2
    verts = np.stack(
        [np.column_stack(c) for c in ((left, y0), (left, y1), (right, y1), (right, y0))], axis=1
    )  # (bars, 4 corners, xy)
    coll = PolyCollection(
        list(verts),
        closed=True,
        facecolors=color,
        edgecolors=edgecolor,
        linewidths=linewidth,
        hatch=hatch,
        alpha=alpha,
        zorder=1,  # NOTE: the patches' zorder: below lines and markers, as ax.bar's bars were
    )
    ax.add_collection(coll, autolim=False)
    ax.update_datalim(np.concatenate([np.column_stack([left, y0]), np.column_stack([right, y1])]))
    if np.any(y0 == 0):
        ax.sticky_edges.y.append(0.0)  # NOTE: as ax.bar: autoscaling adds no margin below a bar at 0
    ax.autoscale_view()


def stacked_bars(
    ax, x: np.ndarray, parts: np.ndarray, colours: list[str], *, width: np.ndarray, hatch: str | None
) -> np.ndarray:
    """One stacked bar per row of `parts` (a row per bar, a column per part, drawn bottom up in `colours`; a row of
    NaN: no bar, a NaN part: 0) at `x`, each `width` wide; returns the bars' tops (the kept rows')."""
    keep = ~np.isnan(parts).all(axis=1) if len(parts) else np.zeros(0, dtype=bool)
    bottom = np.zeros(int(keep.sum()))
    for k, colour in enumerate(colours):
        h = np.nan_to_num(parts[keep, k])
        for w in np.unique(width[keep]):
            sel = width[keep] == w
            bars(
                ax,
                x[keep][sel],
                h[sel],
                bottom=bottom[sel],
                width=float(w),
                color=colour,
                edgecolor="white",
                linewidth=0.6,
                hatch=hatch,
            )
        bottom = bottom + h
    return bottom


def log2_gpus_axis(ax, gpus: list[float]) -> None:
    """A GPU-count x axis: log2 scale, a plain-number tick at each of `gpus`, a margin of 1.35× each side."""
    ax.set_xscale("log", base=2)
    ax.set_xticks(gpus)
    fmt = ScalarFormatter()
    fmt.set_scientific(False)
    ax.xaxis.set_major_formatter(fmt)
    ax.xaxis.set_minor_locator(NullLocator())
    lo, hi = min(gpus), max(gpus)
    ax.set_xlim(lo / 1.35, hi * 1.35)
