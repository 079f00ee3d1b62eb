"""The scale-out projection drawn: `harness plan SCENARIO --project 8..4096 --format json` (harness.plan.projection)
as a figure — per model, each cell's predicted tokens/s per GPU against the GPU count — for a plan alone
(`harness plan … --project … --figure PNG`) or beside a measured sweep (`harness report DIR --projection FILE`),
where the cells measured at one of the projected GPU counts are drawn on their projected line.

The projection document is read here and checked: a file that is not one is an InputError naming the file, the key
and the value, never a traceback.
"""

from __future__ import annotations

import json
import math
from collections import Counter
from pathlib import Path
from typing import Any

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from matplotlib.lines import Line2D

from harness.core.errors import InputError, Problem
from harness.report.figures.base import (
    PRECISION_FILL,
    PRECISION_LINESTYLE,
    Figure,
    no_data,
    png_bytes,
    precision_handle,
    select_models,
    strategy_handles,
    style,
)
from harness.report.figures.layout import log2_gpus_axis

MAX_PROJECTION_MODELS = 4
"""model panels drawn at most (an evenly spread subset beyond, noted)"""
MATCH_SETTINGS = ("micro_batch", "seq_len", "grad_accum", "tp", "pp")
"""what a measured cell must share with a projected row to be drawn on its line (with model, strategy, precision)"""
_POINT_KEYS = ("gpus", "step_time_s", "tokens_per_s_per_gpu", "fits", "reason")
_ROW_KEYS = ("model", "strategy", "layout", "precision", "settings", "points")


def read_projection(path: Path) -> dict[str, Any]:
    """The projection document at `path` (`harness plan --project … --format json`); InputError naming the file,
    the key and what is wrong when it is not one."""
    where = str(path)
    try:
        doc = json.loads(Path(path).read_text())
    except OSError as e:
        raise InputError([Problem(where, "", f"cannot read it: {e.strerror or e}")]) from None
    except ValueError as e:
        raise InputError([Problem(where, "", f"not JSON: {e}")]) from None
    expected = "a `harness plan SCENARIO --project GPUS --format json` document"
    if not isinstance(doc, dict):
        raise InputError([Problem(where, "", f"is a {type(doc).__name__}, not {expected}")])
    problems = []
    for key, kind in (("cluster", str), ("gpus_per_node", int), ("gpus", list), ("rows", list), ("rates", str)):
        if not isinstance(doc.get(key), kind):
            problems.append(Problem(where, key, f"{doc.get(key)!r} is not a {kind.__name__} ({expected})"))
    if problems:
        raise InputError(problems)
    for i, row in enumerate(doc["rows"]):
        missing = [k for k in _ROW_KEYS if not isinstance(row, dict) or k not in row]
        if missing:
            raise InputError([Problem(where, f"rows[{i}]", f"lacks {', '.join(missing)} ({expected})")])
        for j, p in enumerate(row["points"]):
            if not isinstance(p, dict) or any(k not in p for k in _POINT_KEYS):
                raise InputError(
                    [Problem(where, f"rows[{i}].points[{j}]", f"needs {', '.join(_POINT_KEYS)} ({expected})")]
                )
            for k in ("gpus", "step_time_s", "tokens_per_s_per_gpu"):
                v = p[k]
                ok = v is None or (isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v))
                if not ok or (k == "gpus" and (v is None or v < 1)):
                    raise InputError([Problem(where, f"rows[{i}].points[{j}].{k}", f"{v!r} is not a number")])
    return doc


def _measured(fc: pd.DataFrame | None, row: dict[str, Any]) -> tuple[np.ndarray, np.ndarray]:
    """(GPU counts, tokens/s per GPU) of the ok cells of `fc` that are this projected row at some GPU count."""
    if fc is None or fc.empty:
        return np.array([]), np.array([])
    s = row["settings"]
    m = (
        (fc["status"] == "ok")
        & (fc["model"] == row["model"])
        & (fc["base_strategy"] == row["strategy"])
        & (fc["precision"] == row["precision"])
        & fc["tokens_per_s_per_gpu"].notna()
    )
    for k in MATCH_SETTINGS:
        if k in fc and s.get(k) is not None:
            m &= fc[k].fillna(1 if k in ("tp", "pp") else -1) == s[k]
    hit = fc[m]
    return hit["gpus"].to_numpy(dtype=float), hit["tokens_per_s_per_gpu"].to_numpy(dtype=float)


def projection_figure(doc: dict[str, Any], fc: pd.DataFrame | None = None) -> Figure:
    """Per model (at most MAX_PROJECTION_MODELS panels), every projected row's tokens/s per GPU against the GPU
    count; with `fc` (a report's figure cells), the measured cells on their rows' lines."""
    title = "Projected scaling"
    caption = (
        f"Predicted tokens/s per GPU against GPU count (log₂ axis) on {doc['cluster']} "
        f"({doc['gpus_per_node']} GPUs per node), one line per strategy · layout · precision as `harness plan "
        "--project` computed it (harness.plan.projection; docs/time-model.md); colour and marker = strategy, line "
        "style = precision, × on a point = it does not fit the device memory. "
        + ("Large black-rimmed markers = measured (the report's cells at that GPU count). " if fc is not None else "")
        + f"Rates: {doc['rates']}."
    )
    rows = [r for r in doc["rows"] if any(p["tokens_per_s_per_gpu"] is not None for p in r["points"])]
    nulls = Counter(p["reason"] or "unknown" for r in doc["rows"] for p in r["points"] if p["step_time_s"] is None)
    null_note = "; ".join(f"{n} point(s): {why}" for why, n in nulls.most_common(4))
    if not rows:
        return no_data("projection", title, caption, "no projected point has a step time" + (f" ({null_note})"))
    names = [r["model"] for r in rows]
    models, note = select_models(
        pd.DataFrame({"model": names, "n_params": [math.nan] * len(names)}), MAX_PROJECTION_MODELS
    )
    if nulls:
        note = (note + " " if note else "") + f"Not drawn (null, with the model's reason): {null_note}."
    n = len(models)
    fig, axes = plt.subplots(1, n, figsize=(4.6 * n + 2.6, 4.4), squeeze=False, layout="constrained")
    labels, measured_any = [], False
    for ax, model in zip(axes[0], models):
        gpus_drawn: set[float] = set()
        for r in (r for r in rows if r["model"] == model):
            colour, marker = style(r["layout"])
            pts = [p for p in r["points"] if p["tokens_per_s_per_gpu"] is not None]
            x = np.array([p["gpus"] for p in pts], dtype=float)
            y = np.array([p["tokens_per_s_per_gpu"] for p in pts], dtype=float)
            ax.plot(
                x,
                y,
                color=colour,
                marker=marker,
                markersize=5,
                linestyle=PRECISION_LINESTYLE.get(r["precision"], "-"),
                fillstyle=PRECISION_FILL.get(r["precision"], "full"),
                linewidth=1.3,
            )
            over = np.array([p["fits"] is False for p in pts])
            if over.any():
                ax.plot(x[over], y[over], linestyle="none", marker="x", color="black", markersize=7, zorder=4)
            mx, my = _measured(fc, r)
            if len(mx):
                measured_any = True
                ax.plot(
                    mx,
                    my,
                    linestyle="none",
                    marker=marker,
                    markersize=10,
                    markerfacecolor=colour,
                    markeredgecolor="black",
                    markeredgewidth=1.4,
                    zorder=5,
                )
                gpus_drawn.update(mx.tolist())
            gpus_drawn.update(x.tolist())
            labels.append(r["layout"])
        log2_gpus_axis(ax, sorted(gpus_drawn))
        ax.set_ylim(bottom=0)
        ax.set_title(str(model))
        ax.set_xlabel("GPUs")
        ax.set_ylabel("tokens/s per GPU (predicted)")
        ax.grid(True, color="#E5E5E5", linewidth=0.6)
    handles = strategy_handles(labels) + [precision_handle(p) for p in sorted({r["precision"] for r in rows}, key=str)]
    handles.append(Line2D([], [], linestyle="none", marker="x", color="black", label="does not fit"))
    if measured_any:
        handles.append(
            Line2D(
                [],
                [],
                linestyle="none",
                marker="o",
                markersize=9,
                markerfacecolor="white",
                markeredgecolor="black",
                markeredgewidth=1.4,
                label="measured",
            )
        )
    axes[0][-1].legend(handles=handles, loc="upper left", bbox_to_anchor=(1.02, 1.0), frameon=False)
    fig.suptitle(f"Projected tokens/s per GPU on {doc['cluster']}")
    return Figure("projection", title, caption, png_bytes(fig), note)
