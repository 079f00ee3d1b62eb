"""What every figure of the report shares: the `Figure` it gives, its PNG bytes, one look per strategy and
precision, the labels, and which models and panels a figure draws when there are too many.

One colour and one marker per strategy in every figure (`STRATEGY_STYLE`, a fixed mapping over the strategy
catalogue): the catalogue's colour (harness.core.catalogue.STRATEGY_COLOURS: the Okabe-Ito colours plus four of Paul
Tol's "muted" set, then colours that never run out), and the marker shape repeats the information. Precision is
the line style and, in the scaling figure, the marker fill. A figure whose data no record carries is not drawn;
its note says why (`no_data`).
"""

from __future__ import annotations

import io
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.lines import Line2D
from PIL import Image
from PIL.PngImagePlugin import PngInfo

from harness.core.catalogue import STRATEGY_COLOURS, UNKNOWN_COLOUR
from harness.report.frame import LAYOUT_SEP, base_strategy, model_order
from harness.scenario.spec import STRATEGIES

if TYPE_CHECKING:
    from matplotlib.typing import FillStyleType, LineStyleType  # matplotlib >= 3.8; annotations only

DPI = 100
PNG_COMPRESS_LEVEL = 1
"""zlib level of the PNG files: the same pixels as PIL's default (6) in well under half of the encoding time (a
tenth of a big report's figure CPU at 6), for a few % more bytes (the five figures of bench_report at 10,000
records: 1.74 MiB at 1, 1.69 at 3, 1.66 at 6)"""
MAX_MODELS = 4
"""models drawn in a figure at most; more → an evenly spread subset (smallest and largest included), noted"""
MAX_PANELS = 8
"""(model, GPU count) panels per bar/box figure at most"""

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


def no_data(name: str, title: str, caption: str, why: str) -> Figure:
    """The figure `name` not drawn: its note says why (`why`: what no record carries)."""
    return Figure(name=name, title=title, caption=caption, png=None, note=f"No data: {why}.")


def png_bytes(fig: plt.Figure) -> bytes:
    """The figure as PNG bytes, drawn once, and closed. `savefig` on a figure with a layout engine draws it twice
    (a layout pass with a null renderer, then the real one); `canvas.draw()` runs the constrained layout inside
    its one real draw, and the pixels are the same."""
    fig.set_dpi(DPI)
    fig.set_facecolor("white")
    canvas = fig.canvas if isinstance(fig.canvas, FigureCanvasAgg) else FigureCanvasAgg(fig)
    canvas.draw()
    buf = io.BytesIO()
    # NOTE: RGB, not RGBA: on the opaque white face every pixel's alpha is 255, so the image is the same in three
    # quarters of the bytes to filter and compress (a quarter less encoding time, 13 % smaller files); an empty
    # pnginfo: no text chunk at all (savefig wrote the Software tag unless told None)
    rgb = Image.fromarray(np.asarray(canvas.buffer_rgba())[..., :3])
    rgb.save(buf, format="png", compress_level=PNG_COMPRESS_LEVEL, pnginfo=PngInfo(), dpi=(DPI, DPI))
    plt.close(fig)
    return buf.getvalue()


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


def ordered_strategies(strategies) -> list[str]:
    """Strategy labels in the catalogue's order, each strategy's layouts after it."""
    rank = {s: i for i, s in enumerate(STRATEGIES)}
    return sorted(set(strategies), key=lambda s: (rank.get(base_strategy(s), len(rank)), base_strategy(s), s))


def strategy_handles(strategies) -> list:
    """Legend entries, one per strategy label (its colour and marker), in the catalogue's order."""
    return [
        Line2D([], [], color=style(s)[0], marker=style(s)[1], linestyle="none", markersize=7, label=s)
        for s in ordered_strategies(strategies)
    ]


def precision_handle(precision: str) -> Line2D:
    """The legend entry of a precision: its line style and marker fill, in grey."""
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


def row_label(strategy: str, precision: str) -> str:
    return f"{strategy} · {precision}"


def gpus_label(g: float) -> str:
    return f"{int(g)} GPU" + ("" if int(g) == 1 else "s")


def params_label(n: float | None) -> str:
    if n is None or not math.isfinite(n):
        return ""
    for div, unit in ((1e9, "B"), (1e6, "M"), (1e3, "k")):
        if n >= div:
            return f"{n / div:.3g}{unit} params"
    return f"{int(n)} params"


def model_title(fc: pd.DataFrame, model: str) -> str:
    """The model's name with its parameter count, as a panel title."""
    n = fc.loc[fc["model"] == model, "n_params"].max()
    label = params_label(None if pd.isna(n) else float(n))
    return f"{model} ({label})" if label else str(model)


def spread(items: list, k: int) -> list:
    """At most k of items, evenly spread and including the first and the last."""
    if len(items) <= k:
        return list(items)
    idx = sorted({round(i) for i in np.linspace(0, len(items) - 1, k)})
    return [items[i] for i in idx]


def omitted_note(what: str, shown: list, total: list) -> str:
    if len(shown) == len(total):
        return ""
    return f"Showing {len(shown)} of {len(total)} {what} ({', '.join(map(str, shown))}); the tables have all."


def select_models(fc: pd.DataFrame, k: int = MAX_MODELS) -> tuple[list[str], str]:
    """(the models drawn: at most k, smallest and largest included; a note on those left out, or "")"""
    models = model_order(fc)
    shown = spread(models, k)
    return shown, omitted_note("models", shown, models)


def select_panels(fc: pd.DataFrame) -> tuple[list[tuple[str, float]], str]:
    """(model, GPU count) panels, at most MAX_PANELS, with a note on what was left out."""
    models, note = select_models(fc)
    per_model = max(1, MAX_PANELS // max(1, len(models)))
    panels, dropped = [], False
    for m in models:
        gpus = sorted(fc.loc[fc["model"] == m, "gpus"].unique())
        shown = spread(gpus, per_model)
        dropped |= len(shown) < len(gpus)
        panels += [(m, g) for g in shown]
    if dropped:
        note = (note + " " if note else "") + (
            f"At most {per_model} GPU count(s) per model are drawn (smallest and largest first); the tables have all."
        )
    return panels, note


def byte_unit(max_bytes: float) -> tuple[float, str]:
    """(divisor, unit) to draw byte counts up to `max_bytes` in binary units (GiB = 2**30)."""
    for div, unit in ((2**30, "GiB"), (2**20, "MiB"), (2**10, "KiB")):
        if max_bytes >= div:
            return float(div), unit
    return 1.0, "bytes"
