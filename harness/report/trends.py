"""The trends section of `harness report --history DB`: per cell, the stored series of one metric with the noise
band `history check` held each run to, its change points, and the runs outside their band — one figure and one
table. Input is the plain data of harness.history.trends.trend_series (the cli passes it in: the report does not
import the history), so the section draws the same from SQLite or PostgreSQL.
"""

from __future__ import annotations

import math
from typing import Any

import matplotlib.pyplot as plt
import numpy as np

from harness.report.figures.base import Figure, no_data, png_bytes

MAX_TREND_PANELS = 12
"""cells drawn at most; the ones with a change point or a run out of its band first, then the longest series"""
_OUT = "#D55E00"
_LINE = "#0072B2"
_BAND = "#56B4E9"
_CP = "#CC79A7"


def _machine(machine: dict[str, Any]) -> str:
    parts = [machine.get("cluster"), machine.get("device_name") or machine.get("device_type")]
    count = machine.get("device_count")
    text = " · ".join(str(p) for p in parts if p)
    return f"{text} ×{count}" if count else text


def _unit_scale(unit: str, values: list[float]) -> tuple[float, str]:
    """Seconds drawn as ms when every value is under 10 s; other units as they are."""
    if unit == "s" and values and max(values) < 10:
        return 1e3, "ms"
    return 1.0, unit


def shown_series(trends: dict[str, Any]) -> tuple[list[dict[str, Any]], int]:
    """The series drawn (at most MAX_TREND_PANELS, notable first) and how many there are in all."""
    series = [s for s in trends["series"] if any(r["value"] is not None for r in s["runs"])]
    ranked = sorted(
        range(len(series)),
        key=lambda i: (not (series[i]["change_points"] or series[i]["out_of_band"]), -len(series[i]["runs"]), i),
    )
    return [series[i] for i in ranked[:MAX_TREND_PANELS]], len(series)


def trends_figure(trends: dict[str, Any]) -> Figure:
    metric, unit = trends["metric"], trends["unit"]
    title = f"Trends: {metric} per run, from the results history"
    caption = (
        f"One panel per cell (and machine): {metric} of each stored run, oldest first (x: run number, the label "
        "of a run under its change point). Shaded: the noise band `history check` held that run to against the "
        "runs before it (level ± max(k·σ, threshold)); no band where fewer than min_history runs came before. "
        "Red crosses: runs outside their band. Dotted lines: change points (E-Divisive means), with the level "
        "before → after. Cells with a change point or a run out of band are drawn first; every cell is in the "
        "table below."
    )
    shown, total = shown_series(trends)
    if not shown:
        return no_data("trends", title, caption, "no cell in the history has a value of this metric")
    ncols = min(3, len(shown))
    nrows = math.ceil(len(shown) / ncols)
    fig, axes = plt.subplots(
        nrows, ncols, figsize=(4.6 * ncols, 3.0 * nrows + 0.6), squeeze=False, layout="constrained"
    )
    fig.suptitle(title)
    for ax in list(axes.flat)[len(shown) :]:
        ax.set_visible(False)
    for ax, s in zip(axes.flat, shown):
        runs = s["runs"]
        values = [r["value"] for r in runs if r["value"] is not None]
        scale, shown_unit = _unit_scale(unit, values)
        x = np.arange(1, len(runs) + 1)
        y = np.array([np.nan if r["value"] is None else r["value"] * scale for r in runs])
        lo = np.array([np.nan if r["band"] is None else r["band"]["low"] * scale for r in runs])
        hi = np.array([np.nan if r["band"] is None else r["band"]["high"] * scale for r in runs])
        level = np.array([np.nan if r["band"] is None else r["band"]["level"] * scale for r in runs])
        ax.fill_between(x, lo, hi, step="mid", color=_BAND, alpha=0.3, linewidth=0, label="noise band")
        ax.step(x, level, where="mid", color=_BAND, linewidth=0.8, linestyle="--")
        ax.plot(x, y, color=_LINE, marker="o", markersize=3, linewidth=1.0)
        out = s["out_of_band"]
        if out:
            ax.plot(x[out], y[out], linestyle="none", marker="x", color=_OUT, markersize=7, markeredgewidth=1.6)
        for cp in s["change_points"]:
            at = cp["index"] + 1
            ax.axvline(at - 0.5, color=_CP, linestyle=":", linewidth=1.2)
            text = f"{cp['before'] * scale:.3g} → {cp['after'] * scale:.3g}"
            if cp.get("label"):
                text = f"{cp['label']}\n{text}"
            ax.annotate(
                text,
                (at - 0.5, 1.0),
                xycoords=("data", "axes fraction"),
                xytext=(3, -3),
                textcoords="offset points",
                ha="left",
                va="top",
                fontsize=7,
                color=_CP,
            )
        ax.set_title(f"{s['label']}\n{_machine(s['machine'])}", fontsize=8)
        ax.set_ylabel(f"{metric} ({shown_unit})")
        ax.set_xlabel("run")
        ax.set_xlim(0.5, len(runs) + 0.5)
    note = "" if total <= len(shown) else f"{len(shown)} of {total} cells drawn (notable first); all are in the table."
    return Figure(name="trends", title=title, caption=caption, png=png_bytes(fig), note=note)


def _fmt(v: float | None, unit: str) -> str:
    if v is None:
        return "n/a"
    if unit == "s":
        return f"{v * 1e3:.4g} ms"
    return f"{v:.4g} {unit}"


TREND_HEADER = ["Cell", "Machine", "Runs", "Last value", "Its band", "Change points", "Out of band"]


def trend_rows(trends: dict[str, Any]) -> list[list[tuple[str, str]]]:
    """One row per series: (text, hover title) per column of TREND_HEADER; the title of the runs column lists
    every run's time and label, that of the change points their p-values."""
    unit = trends["unit"]
    rows = []
    for s in trends["series"]:
        runs = s["runs"]
        last = runs[-1] if runs else None
        band = last["band"] if last else None
        cps = s["change_points"]
        runs_title = "\n".join(
            f"{i + 1}: {r['time']}" + (f" [{r['label']}]" if r["label"] else "") + f" {_fmt(r['value'], unit)}"
            for i, r in enumerate(runs)
        )
        cp_text = "; ".join(
            f"run {cp['index'] + 1}"
            + (f" ({cp['label']})" if cp.get("label") else "")
            + f": {_fmt(cp['before'], unit)} → {_fmt(cp['after'], unit)}"
            for cp in cps
        )
        cp_title = "; ".join(
            f"run {cp['index'] + 1}: p = {cp['p_value']:.3g}" for cp in cps if cp.get("p_value") is not None
        )
        rows.append(
            [
                (s["label"], s["run_id"]),
                (_machine(s["machine"]), ""),
                (str(len(runs)), runs_title),
                (_fmt(last["value"] if last else None, unit), ""),
                ("none yet" if band is None else f"{_fmt(band['low'], unit)} – {_fmt(band['high'], unit)}", ""),
                (cp_text or "none", cp_title),
                (", ".join(f"run {i + 1}" for i in s["out_of_band"]) or "none", ""),
            ]
        )
    return rows
