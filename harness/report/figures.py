"""The report's figures (matplotlib, Agg backend), each rendered once to PNG bytes.

One colour and one marker per strategy in every figure (`STRATEGY_STYLE`, a fixed mapping over the strategy
catalogue): the catalogue's colour (harness.core.catalogue.STRATEGY_COLOURS: the Okabe-Ito colours plus four of Paul
Tol's "muted" set, then colours that never run out), and the marker shape repeats the information. Precision is
the line style and, in the scaling figure, the marker fill. A figure whose data no record carries is not drawn;
its note says why.
"""

from __future__ import annotations

import functools
import gc
import io
import math
import multiprocessing
import os
import sys
import weakref
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import matplotlib

matplotlib.use("Agg")  # NOTE: before pyplot is imported; the report never opens a window

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
from matplotlib.backends.backend_agg import FigureCanvasAgg, RendererAgg  # noqa: E402
from matplotlib.collections import PolyCollection  # noqa: E402
from matplotlib.font_manager import FontProperties  # noqa: E402
from matplotlib.image import imsave  # noqa: E402
from matplotlib.lines import Line2D  # noqa: E402
from matplotlib.markers import TICKDOWN  # noqa: E402
from matplotlib.patches import Patch  # noqa: E402
from matplotlib.ticker import (  # noqa: E402
    EngFormatter,
    FormatStrFormatter,
    NullFormatter,
    NullLocator,
    ScalarFormatter,
)
from matplotlib.transforms import ScaledTranslation, blended_transform_factory  # noqa: E402
from PIL.PngImagePlugin import PngInfo  # noqa: E402

from harness.core.catalogue import STRATEGY_COLOURS, UNKNOWN_COLOUR  # noqa: E402
from harness.report.frame import (  # noqa: E402
    COMM_PREFIX,
    LAYOUT_SEP,
    MEMORY_RSS,
    PREDICTED_PARTS,
    PREDICTION_BAND,
    SAMPLES_COLUMN,
    base_strategy,
    collective_columns,
    model_order,
    predicted_cells,
    prediction_accuracy,
)
from harness.scenario.schema import PRECISIONS, STRATEGIES  # noqa: E402

if TYPE_CHECKING:
    from matplotlib.typing import FillStyleType, LineStyleType  # matplotlib >= 3.8; annotations only

DPI = 100
PNG_COMPRESS_LEVEL = 3
"""zlib level of the PNG files: the same pixels as PIL's default (6) in about 60 % of the encoding time, for
about 1.5 % more bytes (the five figures of bench_report at 10,000 records: 1.92 vs 1.89 MiB)"""
MAX_MODELS = 4
"""models drawn in a figure at most; more → an evenly spread subset (smallest and largest included), noted"""
MAX_PANELS = 8
"""(model, GPU count) panels per bar/box figure at most"""
MAX_HEATMAP_COLUMNS = 24
MAX_ANNOTATED_CELLS = 400
"""heatmap cells with their value printed at most; a bigger heatmap is colour only (printing is slow)"""
MAX_HEATMAP_ROWS = 48
LAYOUT_LEFT_LABELS = 6
"""rotated bar labels from the left of a panel that the layout measures (see _categorical_xticks)"""

_MARKERS = ("o", "s", "^", "v", "D", "P", "X", "*", "h", "<", ">")
_UNKNOWN_STYLE = (UNKNOWN_COLOUR, ".")
LAYOUT_MARKERS: dict[int, str] = {1: "d", 2: "p", 3: "H"}
"""marker of a strategy's layout cells (the strategy's colour): 1 tensor parallel (thin diamond), 2 pipeline
(pentagon), 3 both (hexagon); no plain strategy uses these shapes"""
STRATEGY_STYLE: dict[str, tuple[str, str]] = {
    s: (STRATEGY_COLOURS[s], _MARKERS[i % len(_MARKERS)]) for i, s in enumerate(STRATEGIES)
}
"""strategy → (colour, marker), the same in every figure; past the eleventh strategy the markers repeat (the
colours do not); a strategy not in the catalogue is grey with '.'"""
PRECISION_LINESTYLE: dict[str, LineStyleType] = {"bf16": "-", "fp16": "--", "fp32": ":"}
PRECISION_FILL: dict[str, FillStyleType] = {"bf16": "full", "fp16": "left", "fp32": "none"}
"""marker fill per precision in the scaling figure (hollow = fp32), so a strategy measured at one GPU count,
a lone marker with no line, still shows its precision"""
_COLLECTIVE_HATCH = ("", "///", "...", "xxx", "\\\\\\", "+++", "ooo", "---")
_GREY_NA = "#E6E6E6"
_GREY_FAILED = "#BDBDBD"

plt.rcParams.update(
    {
        "font.size": 9,
        "axes.titlesize": 10,
        "axes.labelsize": 9,
        "legend.fontsize": 8,
        "xtick.labelsize": 8,
        "ytick.labelsize": 8,
        "figure.titlesize": 12,
        "axes.spines.top": False,
        "axes.spines.right": False,
    }
)


@dataclass(frozen=True)
class Figure:
    """One figure of the report: `png` is None when nothing could be drawn, and `note` says why."""

    name: str
    """file stem: `<name>.png` in the report folder"""
    title: str
    caption: str
    png: bytes | None
    note: str = ""


def style(strategy: str) -> tuple[str, str]:
    """(colour, marker) of a strategy label: the family's colour; a tensor/pipeline layout of it (`fsdp2.full_shard
    × tp2`) keeps that colour and takes its layout's marker (LAYOUT_MARKERS), the label saying which degrees."""
    base = base_strategy(strategy)
    colour, marker = STRATEGY_STYLE.get(base, _UNKNOWN_STYLE)
    if base != strategy:
        layout = strategy[len(base) + len(LAYOUT_SEP) :]
        kind = ("tp" in layout.split(" ", 1)[0]) + 2 * (" pp" in f" {layout}")
        marker = LAYOUT_MARKERS.get(kind, marker)
    return colour, marker


def _png(fig: plt.Figure) -> bytes:
    """The figure as PNG bytes, drawn once. `savefig` on a figure with a layout engine draws it twice (a layout
    pass with a null renderer, then the real one); `canvas.draw()` runs the constrained layout inside its one
    real draw, and the pixels are the same (savefig writes the PNG with imsave too)."""
    fig.set_dpi(DPI)
    fig.set_facecolor("white")
    canvas = fig.canvas if isinstance(fig.canvas, FigureCanvasAgg) else FigureCanvasAgg(fig)
    canvas.draw()
    buf = io.BytesIO()
    # NOTE: an empty pnginfo: no text chunk at all (savefig wrote the Software tag unless told None)
    pil_kwargs = {"compress_level": PNG_COMPRESS_LEVEL, "pnginfo": PngInfo()}
    imsave(buf, canvas.buffer_rgba(), format="png", origin="upper", dpi=DPI, pil_kwargs=pil_kwargs)
    plt.close(fig)
    return buf.getvalue()


def _spread(items: list, k: int) -> list:
    """At most k of items, evenly spread and including the first and the last."""
    if len(items) <= k:
        return list(items)
    idx = sorted({round(i) for i in np.linspace(0, len(items) - 1, k)})
    return [items[i] for i in idx]


def _gpus_label(g: float) -> str:
    return f"{int(g)} GPU" + ("" if int(g) == 1 else "s")


def _params_label(n: float | None) -> str:
    if n is None or not math.isfinite(n):
        return ""
    for div, unit in ((1e9, "B"), (1e6, "M"), (1e3, "k")):
        if n >= div:
            return f"{n / div:.3g}{unit} params"
    return f"{int(n)} params"


def _model_title(fc: pd.DataFrame, model: str) -> str:
    n = fc.loc[fc["model"] == model, "n_params"].max()
    label = _params_label(None if pd.isna(n) else float(n))
    return f"{model} ({label})" if label else str(model)


def _omitted_note(what: str, shown: list, total: list) -> str:
    if len(shown) == len(total):
        return ""
    return f"Showing {len(shown)} of {len(total)} {what} ({', '.join(map(str, shown))}); the tables have all."


def _select_models(fc: pd.DataFrame, k: int = MAX_MODELS) -> tuple[list[str], str]:
    models = model_order(fc)
    shown = _spread(models, k)
    return shown, _omitted_note("models", shown, models)


def _select_panels(fc: pd.DataFrame) -> tuple[list[tuple[str, float]], str]:
    """(model, GPU count) panels, at most MAX_PANELS, with a note on what was left out."""
    models, note = _select_models(fc)
    per_model = max(1, MAX_PANELS // max(1, len(models)))
    panels, dropped = [], False
    for m in models:
        gpus = sorted(fc.loc[fc["model"] == m, "gpus"].unique())
        shown = _spread(gpus, per_model)
        dropped |= len(shown) < len(gpus)
        panels += [(m, g) for g in shown]
    if dropped:
        note = (note + " " if note else "") + (
            f"At most {per_model} GPU count(s) per model are drawn (smallest and largest first); the tables have all."
        )
    return panels, note


def _strategy_handles(strategies) -> list:
    return [
        Line2D([], [], color=style(s)[0], marker=style(s)[1], linestyle="none", markersize=7, label=s)
        for s in _ordered_strategies(strategies)
    ]


def _ordered_strategies(strategies) -> list[str]:
    """Strategy labels in the catalogue's order, each strategy's layouts after it."""
    rank = {s: i for i, s in enumerate(STRATEGIES)}
    return sorted(set(strategies), key=lambda s: (rank.get(base_strategy(s), len(rank)), base_strategy(s), s))


def _row_label(strategy: str, precision: str) -> str:
    return f"{strategy} · {precision}"


def _panel_grid(n_panels: int, n_bars: int) -> tuple[int, int, float, float]:
    """(nrows, ncols, panel width, panel height) in inches for bar/box panels with rotated labels."""
    panel_w = max(3.4, 1.0 + 0.34 * n_bars)
    ncols = max(1, min(n_panels, int(14 // panel_w)))
    nrows = math.ceil(n_panels / ncols)
    return nrows, ncols, panel_w, 3.9


def _new_panel_figure(n_panels: int, n_bars: int, title: str):
    nrows, ncols, pw, ph = _panel_grid(n_panels, n_bars)
    # NOTE: no layout engine: _layout_panels places the panels once every artist is in (a constrained layout
    # measured every text and tick twice, a third of a panel figure's time)
    fig, axes = plt.subplots(nrows, ncols, figsize=(pw * ncols + 2.4, ph * nrows + 0.6), squeeze=False)
    fig.suptitle(title, y=1.0 - _PAD_IN / (ph * nrows + 0.6), va="top")
    flat = list(axes.flat)
    for ax in flat[n_panels:]:
        ax.set_visible(False)
    return fig, flat[:n_panels], flat[min(ncols, n_panels) - 1]


def _legend(anchor: plt.Axes, handles: list, title: str | None = None):
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


def _categorical_xticks(ax, labels: list[str]) -> None:
    """One rotated label under each bar, with its tick mark: drawn as one text per label and one line of tick
    marks, where set_xticklabels builds a Tick (two lines, a grid line and two texts, each updated on every
    layout pass) per label, most of a panel figure's time at 8 panels of 33 bars. The pixels are those of
    ticks: the marks and the labels sit where rcParams put tick marks and their labels (length + pad below)."""
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
    # NOTE: only the labels that can set a margin are measured (for _layout_panels): the longest ones (the
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
    _LABEL_REACH[ax] = (down + (size + pad) / 72, left)


_TITLE_Y = 1.0
"""a panel title's y (axes fraction), given: where matplotlib would put it (no x tick labels on top), but a
title without a y is re-placed at every draw by measuring the y axis's ticks again"""
_BAR_LABEL_ANGLE = 55.0
_BAR_LABEL_SIZE = 7.5
_PAD_IN = 0.06
"""space (in) between the figure's edge and the outermost text, and between a panel's texts and the next panel"""
_LABEL_REACH: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
"""axes → (how far its bar labels reach below the axes, in; [(bar x, how far that label reaches left of the bar,
in)] for the labels that can set the left margin): _categorical_xticks measures, _layout_panels reads"""


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


def _layout_panels(fig, axes: list, ncols: int, legend) -> None:
    """Place the panels of a bar/box figure on its grid: margins from the texts that set them — the suptitle,
    each panel's title, y label and widest y tick label, the bar labels under it (_categorical_xticks) and the
    legend beside the top-right panel. One measurement of a few texts, where a constrained layout measured
    every text and tick twice; the panels get all the space the texts leave, as with a constrained layout."""
    rc = matplotlib.rcParams
    width, height = fig.get_size_inches()
    nrows = math.ceil(len(axes) / ncols)
    rows = [axes[r * ncols : (r + 1) * ncols] for r in range(nrows)]
    tick = (rc["ytick.major.size"] + rc["ytick.major.pad"]) / 72
    ylabel = _line_in(rc["axes.labelsize"]) + rc["axes.labelpad"] / 72
    left = _PAD_IN + ylabel + tick + max(_text_width_in(fig, _ytick_labels(ax), rc["ytick.labelsize"]) for ax in axes)
    title = _line_in(rc["axes.titlesize"]) + rc["axes.titlepad"] / 72
    top = _PAD_IN + _line_in(rc["figure.titlesize"]) + _PAD_IN
    bottoms = [max(_LABEL_REACH.get(ax, (0.0, []))[0] for ax in row) + _PAD_IN for row in rows]
    renderer = fig.canvas.get_renderer()
    legend_w = legend.get_window_extent(renderer).width / renderer.dpi if legend is not None else 0.0
    for _ in range(2):  # NOTE: the bar labels' reach to the left depends on the panel width: twice is enough
        panel_w = (width - ncols * left - (ncols - 1) * _PAD_IN - legend_w - 2 * _PAD_IN) / (ncols + 0.02)
        reach = 0.0
        for ax in axes:
            lo, hi = ax.get_xlim()
            for x, w in _LABEL_REACH.get(ax, (0.0, []))[1]:
                reach = max(reach, w - (x - lo) / (hi - lo) * panel_w)
        left = max(left, reach + _PAD_IN)
    panel_h = (height - top - sum(bottoms) - nrows * title) / nrows
    y = height - top
    for row, bottom in zip(rows, bottoms):
        y -= title + panel_h
        for j, ax in enumerate(row):
            x = left + j * (left + panel_w + _PAD_IN)
            ax.set_position([x / width, y / height, panel_w / width, panel_h / height])
        y -= bottom


def _layout_scaling(fig, axes, legend) -> None:
    """Place the scaling figure's 2 × models panels (top: throughput, with the model titles; bottom: efficiency,
    with the GPU count labels, the x axes shared): as _layout_panels, margins from the texts that set them."""
    rc = matplotlib.rcParams
    width, height = fig.get_size_inches()
    ncols = axes.shape[1]
    tick = (rc["ytick.major.size"] + rc["ytick.major.pad"]) / 72
    ylabel = _line_in(rc["axes.labelsize"]) + rc["axes.labelpad"] / 72
    lefts = [
        _PAD_IN
        + (ylabel if j == 0 else 0.0)
        + tick
        + max(_text_width_in(fig, _ytick_labels(ax), rc["ytick.labelsize"]) for ax in axes[:, j])
        for j in range(ncols)
    ]
    renderer = fig.canvas.get_renderer()
    legend_w = legend.get_window_extent(renderer).width / renderer.dpi
    panel_w = (width - sum(lefts) - (ncols - 1) * _PAD_IN - legend_w - 2 * _PAD_IN) / (ncols + 0.02)
    top = (
        _PAD_IN + _line_in(rc["figure.titlesize"]) + _PAD_IN + _line_in(rc["axes.titlesize"]) + rc["axes.titlepad"] / 72
    )
    gap = rc["xtick.major.size"] / 72 + 2 * _PAD_IN  # the top row has tick marks, no tick labels (shared x)
    xlabels = (rc["xtick.major.size"] + rc["xtick.major.pad"]) / 72 + _line_in(rc["xtick.labelsize"])
    bottom = xlabels + _line_in(rc["axes.labelsize"]) + rc["axes.labelpad"] / 72 + _PAD_IN
    panel_h = (height - top - gap - bottom) / 2
    x = 0.0
    for j in range(ncols):
        x += lefts[j]
        axes[0, j].set_position([x / width, (bottom + panel_h + gap) / height, panel_w / width, panel_h / height])
        axes[1, j].set_position([x / width, bottom / height, panel_w / width, panel_h / height])
        x += panel_w + _PAD_IN


def _bars(
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


def _no_data(name: str, title: str, caption: str, why: str) -> Figure:
    return Figure(name=name, title=title, caption=caption, png=None, note=f"No data: {why}.")


# --- scaling -------------------------------------------------------------------------------------------


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
        return _no_data("scaling", title, caption, "no cell ran ok with a tokens/s/GPU")
    models, note = _select_models(ok)
    fig, axes = plt.subplots(
        2,
        len(models),
        figsize=(max(8.0, 4.3 * len(models) + 2.6), 7.2),
        squeeze=False,
        sharex="col",
    )  # NOTE: no layout engine: _layout_scaling places the panels
    fig.suptitle(
        "Throughput scaling: tokens/s per GPU and scaling efficiency vs GPU count", y=1.0 - _PAD_IN / 7.2, va="top"
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
        top.set_title(_model_title(fc, model), y=_TITLE_Y)
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
            _log2_gpus_axis(ax, all_gpus)
            ax.grid(True, axis="y", color="#DDDDDD", linewidth=0.6)
    axes[0, 0].set_ylabel("throughput per GPU (tokens/s)")
    axes[1, 0].set_ylabel("scaling efficiency (ratio, 1 = linear)")
    precisions = [p for p in PRECISIONS if p in set(ok["precision"])] + sorted(set(ok["precision"]) - set(PRECISIONS))
    prec_handles = [_precision_handle(p) for p in precisions]
    legend = _legend(axes[0, -1], _strategy_handles(ok["strategy"]) + prec_handles, "strategy / precision")
    _layout_scaling(fig, axes, legend)
    if not n_efficiency:
        why = (
            "only one GPU count in the results"
            if len(all_gpus) == 1
            else "no strategy · precision ran ok at two or more GPU counts"
        )
        note = (note + " " if note else "") + f"Scaling efficiency not drawn: {why}."
    return Figure("scaling", title, caption, _png(fig), note)


def _precision_handle(precision: str) -> Line2D:
    fill = PRECISION_FILL.get(precision, "bottom")
    kw: dict[str, Any] = dict(markerfacecolor="white", fillstyle="full") if fill == "none" else dict(fillstyle=fill)
    return Line2D(
        [],
        [],
        color="#444444",
        linestyle=PRECISION_LINESTYLE.get(precision, "-."),
        marker="o",
        markersize=6,
        markerfacecoloralt="white",
        label=precision,
        **kw,
    )


def _log2_gpus_axis(ax, gpus: list[float]) -> None:
    ax.set_xscale("log", base=2)
    ax.set_xticks(gpus)
    fmt = ScalarFormatter()
    fmt.set_scientific(False)
    ax.xaxis.set_major_formatter(fmt)
    ax.xaxis.set_minor_locator(NullLocator())
    lo, hi = min(gpus), max(gpus)
    ax.set_xlim(lo / 1.35, hi * 1.35)


# --- MFU heatmap -----------------------------------------------------------------------------------------


def mfu_heatmap(fc: pd.DataFrame) -> Figure:
    """MFU per cell; when no cell has an MFU (CPU runs, a device without a peak-FLOPS entry) the achieved
    TFLOPS per GPU instead, so the figure is not a grid of grey "n/a", and the reason is said once, in the note."""
    title = "MFU heatmap"
    caption = (
        "Model FLOPs utilisation (% of the device's dense peak FLOPS for the precision) per strategy · "
        "precision (rows) and model @ GPU count (columns). Grey: MFU is null (n/a) or the cell did not "
        "run ok (its status is shown); blank: not in the results."
    )
    if fc.empty:
        return _no_data("mfu_heatmap", title, caption, "no cells")
    ran = fc["status"] == "ok"
    tflops = not (ran & fc["mfu"].notna()).any() and (ran & fc["tflops_per_gpu"].notna()).any()
    if tflops:
        title = "Throughput heatmap (TFLOPS per GPU; no cell has an MFU)"
        caption = (
            "Achieved TFLOPS per GPU (model FLOPs per step ÷ step time, metrics.tflops_per_gpu) per "
            "strategy · precision (rows) and model @ GPU count (columns), shown in place of MFU because no "
            "cell has one. Grey: no value or the cell did not run ok (its status is shown); blank: not in "
            "the results."
        )
    notes = []
    models = model_order(fc)
    gpus_per_model = {m: sorted(fc.loc[fc["model"] == m, "gpus"].unique()) for m in models}
    shown_models = models
    while len(shown_models) > 1 and sum(len(gpus_per_model[m]) for m in shown_models) > MAX_HEATMAP_COLUMNS:
        shown_models = _spread(models, len(shown_models) - 1)
    if len(shown_models) < len(models):
        notes.append(_omitted_note("models", shown_models, models))
    columns = [(m, g) for m in shown_models for g in gpus_per_model[m]][:MAX_HEATMAP_COLUMNS]
    sub = fc[fc["model"].isin(shown_models)]
    rows = list(dict.fromkeys(zip(sub["strategy"], sub["precision"])))
    if len(rows) > MAX_HEATMAP_ROWS:
        notes.append(f"Showing the first {MAX_HEATMAP_ROWS} of {len(rows)} strategy · precision rows.")
        rows = rows[:MAX_HEATMAP_ROWS]
    r_index = {r: i for i, r in enumerate(rows)}
    c_index = {c: j for j, c in enumerate(columns)}
    values = np.full((len(rows), len(columns)), np.nan)
    text = np.full((len(rows), len(columns)), "", dtype=object)
    grey = np.zeros((len(rows), len(columns)), dtype=bool)
    reasons: dict[str, int] = {}
    for rec in sub.itertuples(index=False):
        i, j = r_index.get((rec.strategy, rec.precision)), c_index.get((rec.model, rec.gpus))
        if i is None or j is None:
            continue
        if rec.status != "ok":
            text[i, j], grey[i, j] = str(rec.status), True
        elif tflops:
            if pd.isna(rec.tflops_per_gpu):
                text[i, j], grey[i, j] = "n/a", True
            else:
                values[i, j] = rec.tflops_per_gpu
                text[i, j] = f"{rec.tflops_per_gpu:.3g}"
            why = rec.mfu_null_reason if isinstance(rec.mfu_null_reason, str) else "no reason recorded"
            reasons[why] = reasons.get(why, 0) + 1
        elif pd.isna(rec.mfu):
            text[i, j], grey[i, j] = "n/a", True
            why = rec.mfu_null_reason if isinstance(rec.mfu_null_reason, str) else "no reason recorded"
            reasons[why] = reasons.get(why, 0) + 1
        else:
            values[i, j] = 100.0 * rec.mfu
            text[i, j] = f"{100.0 * rec.mfu:.1f}"
    vmax = float(np.nanmax(values)) if np.isfinite(values).any() else 1.0
    footnotes = [
        f"{'MFU ' if tflops else ''}n/a ({n} cell{'s' if n > 1 else ''}): {why}"
        for why, n in sorted(reasons.items(), key=lambda kv: -kv[1])[:4]
    ]
    if len(reasons) > 4:
        footnotes.append(f"… and {len(reasons) - 4} more reasons (table.csv, column mfu_null_reason)")
    # NOTE: the reasons are said once: in the note (beside the figure in the HTML and Markdown), not in the PNG
    width = min(26.0, 3.4 + 0.78 * len(columns) + 1.2)
    height = 1.6 + 0.3 * len(rows) + 0.5
    fig, ax = plt.subplots(figsize=(width, height), layout="constrained")
    cmap = plt.get_cmap("cividis")
    is_na = text == "n/a"
    background = np.ones((len(rows), len(columns), 3))  # white: not in the results
    background[grey & is_na] = matplotlib.colors.to_rgb(_GREY_NA)
    background[grey & ~is_na] = matplotlib.colors.to_rgb(_GREY_FAILED)
    ax.imshow(background, aspect="auto", interpolation="nearest")
    im = ax.imshow(
        np.ma.masked_invalid(values), cmap=cmap, vmin=0.0, vmax=max(vmax, 1e-9), aspect="auto", interpolation="nearest"
    )
    annotate = len(rows) * len(columns) <= MAX_ANNOTATED_CELLS
    if annotate:
        fontsize = 8 if len(columns) <= 12 else 6.5
        for i, j in zip(*np.nonzero(text != "")):
            if grey[i, j]:
                color = "#333333"
            else:
                r, g, b, _ = cmap(values[i, j] / max(vmax, 1e-9))
                color = "white" if 0.299 * r + 0.587 * g + 0.114 * b < 0.5 else "black"
            ax.text(j, i, text[i, j], ha="center", va="center", fontsize=fontsize, color=color)
    else:
        notes.append(f"{len(rows) * len(columns)} cells: values are not printed in the cells (colour only).")
    ax.set_xticks(np.arange(len(columns) + 1) - 0.5, minor=True)
    ax.set_yticks(np.arange(len(rows) + 1) - 0.5, minor=True)
    ax.grid(which="minor", color="white", linewidth=1.0)
    ax.tick_params(which="minor", length=0)
    ax.legend(
        handles=[
            Patch(facecolor=_GREY_NA, label="n/a: no TFLOPS value" if tflops else "n/a: MFU is null"),
            Patch(facecolor=_GREY_FAILED, label="did not run ok (status)"),
            Patch(facecolor="white", edgecolor="#999999", label="not in the results"),
        ],
        loc="lower left",
        bbox_to_anchor=(0.0, 1.0),
        ncols=3 if len(columns) >= 4 else 1,  # fits above
        frameon=False,
        fontsize=7.5,
        borderaxespad=0.3,
    )
    ax.set_xticks(range(len(columns)))
    ax.set_xticklabels([f"{m}\n{_gpus_label(g)}" for m, g in columns], fontsize=7.5)
    ax.set_yticks(range(len(rows)))
    ax.set_yticklabels([_row_label(s, p) for s, p in rows], fontsize=7.5)
    ax.tick_params(axis="y", pad=16, length=0)
    ax.tick_params(axis="x", length=0)
    swatch = ax.get_yaxis_transform() + ScaledTranslation(-8 / 72, 0, fig.dpi_scale_trans)
    for i, (s, _) in enumerate(rows):  # strategy colour and marker next to each row label
        ax.plot(0, i, marker=style(s)[1], color=style(s)[0], markersize=6, clip_on=False, transform=swatch)
    for spine in ax.spines.values():
        spine.set_visible(False)
    ax.set_xlabel("model @ GPU count")
    ax.set_ylabel("strategy · precision")
    fig.suptitle(
        "TFLOPS per GPU (no cell has an MFU)" if tflops else "MFU (%) per strategy · precision and model @ GPU count"
    )
    cbar = fig.colorbar(im, ax=ax, shrink=0.8, pad=0.01)
    cbar.set_label("TFLOPS per GPU (achieved)" if tflops else "MFU (% of dense peak FLOPS)")
    note = " ".join(notes + (["; ".join(footnotes) + "."] if footnotes else []))
    if tflops:
        note = ("No cell has an MFU value, so the heatmap shows the achieved TFLOPS per GPU. " + note).strip()
    elif not np.isfinite(values).any():
        note = ("No cell has an MFU value (all are n/a). " + note).strip()
    return Figure("mfu_heatmap", title, caption, _png(fig), note)


# --- peak memory -----------------------------------------------------------------------------------------


def memory_figure(fc: pd.DataFrame) -> Figure:
    title = "Peak memory"
    caption = (
        "Peak memory per GPU: solid bar = peak allocated, pale bar = peak reserved by the caching "
        "allocator, ◆ = predicted by the planner, dashed line = device capacity (env.device_memory_gib). "
        "Hatched bar = a CPU run's peak RSS of the whole process (interpreter, torch, buffers): not tensor "
        "memory, so no prediction is drawn beside it. GiB = 2³⁰ bytes."
    )
    cols = ["peak_memory_allocated_gib", "peak_memory_reserved_gib", "predicted_memory_gib"]
    rss_rows = (fc["memory_measure"] == MEMORY_RSS).to_numpy()
    # NOTE: the planner predicts tensor bytes; beside a process RSS the gap means nothing, so it is not drawn
    fc = fc.assign(predicted_memory_gib=fc["predicted_memory_gib"].where(~rss_rows))
    data = fc[fc[cols].notna().any(axis=1)]
    if data.empty:
        return _no_data("memory", title, caption, "no record has a measured or predicted peak memory")
    panels, note = _select_panels(data)
    lacking = int(((fc["status"] == "ok") & fc[cols].isna().all(axis=1)).sum())
    if lacking:
        note = (f"{lacking} cell(s) that ran ok have no memory figures and are not drawn. " + note).strip()
    n_bars = max(((data["model"] == m) & (data["gpus"] == g)).sum() for m, g in panels)
    all_rss = bool((data["memory_measure"] == MEMORY_RSS).all())
    fig, axes, corner = _new_panel_figure(
        len(panels),
        n_bars,
        "Peak RSS per CPU process (not device memory)"
        if all_rss
        else "Peak memory per GPU: measured, predicted, capacity",
    )
    capacity_unknown = False
    for ax, (model, gpus) in zip(axes, panels):
        p = data[(data["model"] == model) & (data["gpus"] == gpus)]
        x = np.arange(len(p))
        colors = [style(s)[0] for s in p["strategy"]]
        alloc = p["peak_memory_allocated_gib"].to_numpy()
        reserved = p["peak_memory_reserved_gib"].to_numpy()
        pred = p["predicted_memory_gib"].to_numpy()
        cap = p["device_memory_gib"].to_numpy()
        _bars(
            ax,
            x,
            np.nan_to_num(reserved, nan=0.0),
            width=0.75,
            color=colors,
            alpha=0.35,
            edgecolor=colors,
            linewidth=0.8,
        )
        rss = (p["memory_measure"] == MEMORY_RSS).to_numpy()
        if (~rss).any():
            _bars(
                ax,
                x[~rss],
                np.nan_to_num(alloc[~rss], nan=0.0),
                width=0.75,
                color=[c for c, r in zip(colors, rss) if not r],
                edgecolor=[c for c, r in zip(colors, rss) if not r],
            )
        if rss.any():
            rss_colors = [c for c, r in zip(colors, rss) if r]
            _bars(
                ax,
                x[rss],
                np.nan_to_num(alloc[rss], nan=0.0),
                width=0.75,
                color="white",
                edgecolor=rss_colors,
                hatch="////",
                linewidth=1.2,
            )
        ax.plot(x, pred, linestyle="none", marker="D", color="black", markersize=5, zorder=3)
        top = float(np.nanmax(np.concatenate([alloc, reserved, pred])))
        caps = sorted(set(cap[~np.isnan(cap)]))
        if not caps:
            capacity_unknown = True
        elif top >= 0.05 * max(caps):
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
                top = max(top, caps[0])
            else:
                ax.hlines(cap, x - 0.45, x + 0.45, color="#444444", linestyle="--", linewidth=1.2)
                top = max(top, max(caps))
        else:
            ax.text(
                0.02,
                0.97,
                f"device capacity {max(caps):.3g} GiB (off scale)",
                transform=ax.transAxes,
                fontsize=7.5,
                va="top",
                color="#444444",
            )
        for xi, st, a, r in zip(x, p["status"], alloc, reserved):
            if st != "ok" and np.isnan(a) and np.isnan(r):
                ax.text(xi, top * 0.02, st, rotation=90, ha="center", va="bottom", fontsize=7.5, color="#333333")
        ax.set_ylim(0, top * 1.12 if top > 0 else 1.0)
        _categorical_xticks(ax, [_row_label(s, q) for s, q in zip(p["strategy"], p["precision"])])
        ax.set_title(f"{_model_title(fc, model)} · {_gpus_label(gpus)}", y=_TITLE_Y)
        ax.set_ylabel("peak RSS per process (GiB)" if all_rss else "peak memory per GPU (GiB)")
        ax.grid(True, axis="y", color="#DDDDDD", linewidth=0.6)
        ax.set_axisbelow(True)
    shown = data[data["model"].isin({m for m, _ in panels})]
    handles = _strategy_handles(shown["strategy"])
    shown_rss = shown["memory_measure"] == MEMORY_RSS
    for col, handle in (
        ("peak_memory_allocated_gib", Patch(facecolor="#666666", label="peak allocated")),
        (
            "peak_rss",
            Patch(
                facecolor="white", edgecolor="#666666", hatch="////", label="peak RSS, CPU process\n(not tensor memory)"
            ),
        ),
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
    _layout_panels(fig, axes, axes.index(corner) + 1, _legend(corner, handles, "strategy"))
    if capacity_unknown:
        note = (note + " " if note else "") + (
            "Device capacity unknown for some panels (env.device_memory_gib is null): no capacity line there."
        )
    return Figure("memory", title, caption, _png(fig), note)


# --- collective bytes ------------------------------------------------------------------------------------


def _byte_unit(max_bytes: float) -> tuple[float, str]:
    for div, unit in ((2**30, "GiB"), (2**20, "MiB"), (2**10, "KiB")):
        if max_bytes >= div:
            return float(div), unit
    return 1.0, "bytes"


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
        return _no_data("comm", title, caption, "no record has a comm section")
    panels, note = _select_panels(data)
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
    div, unit = _byte_unit(float(np.nanmax(np.concatenate([stacks.sum(axis=1), pred]))))
    used = [k for k in range(stacks.shape[1]) if stacks[:, k].any()]
    n_bars = max(((data["model"] == m) & (data["gpus"] == g)).sum() for m, g in panels)
    fig, axes, corner = _new_panel_figure(len(panels), n_bars, "Collective bytes per step by collective type")
    for ax, (model, gpus) in zip(axes, panels):
        mask = ((data["model"] == model) & (data["gpus"] == gpus)).to_numpy()
        p = data[mask]
        x = np.arange(len(p))
        colors = [style(s)[0] for s in p["strategy"]]
        bottom = np.zeros(len(p))
        for k in used:
            h = stacks[mask, k] / div
            _bars(
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
        _categorical_xticks(ax, [_row_label(s, q) for s, q in zip(p["strategy"], p["precision"])])
        ax.set_title(f"{_model_title(fc, model)} · {_gpus_label(gpus)}", y=_TITLE_Y)
        ax.set_ylabel(f"bytes per step ({unit})")
        top = float(np.nanmax(np.concatenate([bottom, pred[mask] / div, [0.0]])))
        ax.set_ylim(0, top * 1.1 if top > 0 else 1.0)
        ax.grid(True, axis="y", color="#DDDDDD", linewidth=0.6)
        ax.set_axisbelow(True)
    handles = (
        _strategy_handles(data.loc[data["model"].isin({m for m, _ in panels}), "strategy"])
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
    _layout_panels(fig, axes, axes.index(corner) + 1, _legend(corner, handles, "strategy / collective"))
    return Figure("comm", title, caption, _png(fig), note)


# --- step-time distributions -----------------------------------------------------------------------------


def _boxes(ax, series: list[np.ndarray], colors: list[str]) -> None:
    """Tukey box plots drawn as a handful of collections (ax.boxplot makes ~7 artists per box, which is slow
    for hundreds of boxes): box p25–p75, median line, whiskers to the last sample within 1.5 × IQR, outliers."""
    x = np.arange(len(series), dtype=float)
    q1, med, q3 = np.array([np.percentile(s, [25, 50, 75]) for s in series]).T
    iqr = q3 - q1
    lo = np.array([s[s >= a].min() for s, a in zip(series, q1 - 1.5 * iqr)])
    hi = np.array([s[s <= b].max() for s, b in zip(series, q3 + 1.5 * iqr)])
    _bars(ax, x, q3 - q1, bottom=q1, width=0.6, color=colors, edgecolor="black", linewidth=0.6)
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


def step_time_figure(fc: pd.DataFrame) -> Figure:
    title = "Step-time distributions"
    caption = (
        "Distribution of the measured step times (after warm-up) per strategy · precision: box = "
        "p25–p75, white line = median, whiskers = last sample within 1.5 × IQR, circles = outliers."
    )
    data = fc[fc[SAMPLES_COLUMN].map(len) > 0]
    if data.empty:
        return _no_data("step_time", title, caption, "no record has step-time samples")
    panels, note = _select_panels(data)
    n_bars = max(((data["model"] == m) & (data["gpus"] == g)).sum() for m, g in panels)
    fig, axes, corner = _new_panel_figure(len(panels), n_bars, "Step-time distributions (measured steps)")
    for ax, (model, gpus) in zip(axes, panels):
        mask = ((data["model"] == model) & (data["gpus"] == gpus)).to_numpy()
        p = data[mask]
        series = [np.asarray(s) * 1e3 for s in p[SAMPLES_COLUMN]]
        _boxes(ax, series, [style(s)[0] for s in p["strategy"]])
        lo = min(float(np.min(s)) for s in series)
        hi = max(float(np.max(s)) for s in series)
        if lo > 0 and hi / lo > 30:
            ax.set_yscale("log")
        _categorical_xticks(ax, [_row_label(s, q) for s, q in zip(p["strategy"], p["precision"])])
        ax.set_title(f"{_model_title(fc, model)} · {_gpus_label(gpus)}", y=_TITLE_Y)
        ax.set_ylabel("step time (ms)")
        ax.grid(True, axis="y", color="#DDDDDD", linewidth=0.6)
        ax.set_axisbelow(True)
    handles = _strategy_handles(data.loc[data["model"].isin({m for m, _ in panels}), "strategy"])
    _layout_panels(fig, axes, axes.index(corner) + 1, _legend(corner, handles, "strategy"))
    return Figure("step_time", title, caption, _png(fig), note)


# --- the time model: predicted against measured ----------------------------------------------------------

MAX_BREAKDOWN_PANELS = 4
"""(model, largest GPU count) panels of the breakdown figure at most"""
_PART_STYLE: dict[str, tuple[str, str]] = {
    "compute": ("#4C72B0", "compute"),
    "recompute": ("#8172B2", "recompute (checkpointing)"),
    "optimizer": ("#55A868", "optimizer"),
    "comm_exposed": ("#C44E52", "communication, exposed"),
    "other": ("#8C8C8C", "other (host, framework)"),
}
"""predicted step-time part → (colour, legend label)"""


def _why_no_prediction(fc: pd.DataFrame) -> str:
    reasons = fc["predicted_time_null_reason"].dropna()
    if len(reasons):
        top = reasons.value_counts().index[0]
        return f"no cell that ran ok has a predicted step time; the most common reason: {top}"
    return "no cell that ran ok has a predicted step time (predicted.step_time_s)"


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
        return _no_data("prediction", title, caption, _why_no_prediction(fc))
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
    for s in _ordered_strategies(data["strategy"]):
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
    handles = _strategy_handles(data["strategy"]) + [
        Line2D([], [], linestyle="none", marker="o", color="black", markerfacecolor="none", label="fp32 (hollow)")
    ]
    ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.02, 1.0), frameon=False, title="strategy")
    return Figure("prediction", title, caption, _png(fig), note)


def time_breakdown_figure(fc: pd.DataFrame) -> Figure:
    title = "Predicted step-time breakdown"
    caption = (
        "The predicted step time of each strategy · precision split into its parts (predicted.time_s: compute, "
        "activation checkpointing's recompute, the optimizer step, communication not hidden behind compute, host "
        "and framework overhead), for each model at its largest GPU count; ◆ = the measured median step time. "
        "Where a part dominates the bar, that is where the model says the time goes."
    )
    cols = [f"predicted_{part}_s" for part in PREDICTED_PARTS]
    data = fc[(fc["predicted_step_time_s"] > 0) & fc[cols].notna().all(axis=1)]
    if data.empty:
        return _no_data("time_breakdown", title, caption, _why_no_prediction(fc))
    models, note = _select_models(data, MAX_BREAKDOWN_PANELS)
    panels = [(m, float(data.loc[data["model"] == m, "gpus"].max())) for m in models]
    parts = data[cols].to_numpy(dtype=float) * 1e3
    meas = data["step_time_median_s"].where(data["status"] == "ok").to_numpy(dtype=float) * 1e3
    used = [k for k in range(len(cols)) if (parts[:, k] > 0).any()]
    n_bars = max(((data["model"] == m) & (data["gpus"] == g)).sum() for m, g in panels)
    fig, axes, corner = _new_panel_figure(len(panels), n_bars, "Predicted step-time breakdown (◆ measured)")
    for ax, (model, gpus) in zip(axes, panels):
        mask = ((data["model"] == model) & (data["gpus"] == gpus)).to_numpy()
        p = data[mask]
        x = np.arange(len(p))
        bottom = np.zeros(len(p))
        for k in used:
            h = parts[mask, k]
            _bars(
                ax,
                x,
                h,
                bottom=bottom,
                width=0.75,
                color=_PART_STYLE[PREDICTED_PARTS[k]][0],
                edgecolor="white",
                linewidth=0.6,
            )
            bottom = bottom + h
        ax.plot(x, meas[mask], linestyle="none", marker="D", color="black", markersize=5, zorder=3)
        _categorical_xticks(ax, [_row_label(s, q) for s, q in zip(p["strategy"], p["precision"])])
        ax.set_title(f"{_model_title(fc, model)} · {_gpus_label(gpus)}", y=_TITLE_Y)
        ax.set_ylabel("step time (ms)")
        top = float(np.nanmax(np.concatenate([bottom, meas[mask], [0.0]])))
        ax.set_ylim(0, top * 1.1 if top > 0 else 1.0)
        ax.grid(True, axis="y", color="#DDDDDD", linewidth=0.6)
        ax.set_axisbelow(True)
    handles = [
        Patch(facecolor=_PART_STYLE[PREDICTED_PARTS[k]][0], label=_PART_STYLE[PREDICTED_PARTS[k]][1]) for k in used
    ] + [Line2D([], [], linestyle="none", marker="D", color="black", label="measured")]
    _layout_panels(fig, axes, axes.index(corner) + 1, _legend(corner, handles, "part"))
    return Figure("time_breakdown", title, caption, _png(fig), note)


FIGURE_MAKERS = (
    scaling_figure,
    mfu_heatmap,
    memory_figure,
    comm_figure,
    step_time_figure,
    prediction_figure,
    time_breakdown_figure,
)
_HEAVIEST_FIRST = (
    step_time_figure,
    memory_figure,
    comm_figure,
    scaling_figure,
    time_breakdown_figure,
    prediction_figure,
)
"""submission order in parallel, heaviest first (bench_report --figure-times: step time, memory and collective
bytes about 1.2–1.5 s each at 10,000 records, scaling 1.0 s): two workers end within a fraction of a second"""
DRAWN_HERE = mfu_heatmap
"""the lightest figure (about 0.9 s), drawn by the caller's process once its own work (the best-strategy table,
the CSV/Parquet tables, the page text: about 1.5 s) is done, so that the three processes finish together rather
than a worker drawing alone at the end; from DRAW_ALL_IN_WORKERS_FROM workers on, a worker draws it"""
DRAW_ALL_IN_WORKERS_FROM = 4
PARALLEL_MIN_CELLS = 300
"""with at least this many cells (and Linux, and more than one CPU) the figures render in forked processes"""


def usable_cpus() -> int:
    """CPUs this process may run on (its affinity mask, which a container or taskset narrows), else the count."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def close_pool(pool: ProcessPoolExecutor, *, broken: bool) -> None:
    """Shut a pool down; after a worker died, first SIGKILL the others. A broken pool's surviving worker may be
    blocked writing its result into a pipe nobody reads any more, and a SIGTERM does not end it when it inherited
    a Python handler for SIGTERM (a sweep run earlier in the same process installs one): waiting for it would
    hang the report forever."""
    if broken:
        for proc in list((getattr(pool, "_processes", None) or {}).values()):
            proc.kill()
    pool.shutdown(wait=not broken, cancel_futures=True)


def _draw_here(fc: pd.DataFrame) -> Callable[[], list[Figure]]:
    return lambda: [make(fc) for make in FIGURE_MAKERS]


def start_figures(fc: pd.DataFrame, *, workers: int | None = None) -> Callable[[], list[Figure]]:
    """Start drawing every figure of the report; the returned function waits and gives them in report order.

    Rendering is most of a big report's time and the figures are independent, so with many cells they are
    drawn in parallel (one process per CPU, forked: the children inherit the imported modules, no start-up)
    while the caller goes on (the best-strategy table, the CSV/Parquet tables, the HTML/Markdown text); with
    fewer than DRAW_ALL_IN_WORKERS_FROM workers the caller then draws DRAWN_HERE itself when it waits. The PNG
    bytes are the same either way, so any failure of the processes falls back to drawing here: a pool that
    cannot start (no fork, no semaphores in a sandbox) draws everything here, and a worker that dies (killed,
    out of memory) has its figures drawn here. A figure's own error is raised as in a serial run.
    """
    if workers is None:
        big = len(fc) >= PARALLEL_MIN_CELLS and sys.platform == "linux"
        workers = min(len(FIGURE_MAKERS), usable_cpus()) if big else 1
    if workers <= 1:
        return _draw_here(fc)
    pool = None
    try:
        pool = ProcessPoolExecutor(max_workers=workers, mp_context=multiprocessing.get_context("fork"))
        # NOTE: with few CPUs, DRAWN_HERE is left to collect(), which draws it in this process
        here = DRAWN_HERE if workers < DRAW_ALL_IN_WORKERS_FROM else None
        # NOTE: the workers fork at the first submit; frozen, the objects they inherit (the frame, the imported
        # modules) are left out of their garbage collections, which otherwise walk them again and again while
        # matplotlib makes and drops its artists
        gc.freeze()
        futures = {make: pool.submit(make, fc) for make in (*_HEAVIEST_FIRST, DRAWN_HERE) if make is not here}
    except (OSError, ValueError, RuntimeError, ImportError):  # NOTE: BrokenProcessPool is a RuntimeError
        if pool is not None:
            close_pool(pool, broken=True)
        return _draw_here(fc)
    finally:
        gc.unfreeze()

    def collect() -> list[Figure]:
        figures = []
        broken = False
        try:
            drawn_here = {here: here(fc)} if here is not None else {}
            for make in FIGURE_MAKERS:
                if make in drawn_here:
                    figures.append(drawn_here[make])
                    continue
                try:
                    figures.append(futures[make].result())
                except BrokenProcessPool:  # a worker died (killed, out of memory): draw it here (same bytes)
                    broken = True
                    figures.append(make(fc))
        finally:
            close_pool(pool, broken=broken)
        return figures

    return collect


def all_figures(fc: pd.DataFrame, *, workers: int | None = None) -> list[Figure]:
    """Every figure of the report, in report order, from the figure cells (frame.figure_cells)."""
    return start_figures(fc, workers=workers)()
