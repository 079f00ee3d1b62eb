"""The report's search view: what `harness tune` did, drawn and tabled from its log (harness.tune.log.TuneLog).

`harness tune` searches a scenario's matrix per (model, GPU count): it drops the cells the catalogue does not
support and those the memory model says will not fit, ranks the rest by predicted step time, measures the top
ones in rounds of successive halving, and confirms the leader against the runner-up with repeated runs. Its
trials are ordinary records (the report shows them as cells); the log says how each candidate fared. harness.tune
reads the logs (`read_tune_logs`: a log that cannot be read is a warning, as a file that is not a readable record
is) and summarises them (harness.tune.summary: the funnel, the ranking); here is what the report draws of them,
one figure per log (`tune_figure`: predicted against measured), and the metric's unit the tables share.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Any

import matplotlib.pyplot as plt
from matplotlib.lines import Line2D
from matplotlib.ticker import StrMethodFormatter
from matplotlib.transforms import blended_transform_factory

from harness.report.figures.base import Figure, no_data, ordered_strategies, png_bytes, style
from harness.tune.log import GroupLog, TuneLog, is_tune_log, read_tune_logs

__all__ = ["is_tune_log", "metric_unit", "read_tune_logs", "tune_figure", "tune_figure_names"]

MAX_TUNE_PANELS = 9
"""(model, GPU count) groups drawn per log at most; the tables have all"""

_WINNER = "#F0E442"
_RUNNER_UP = "#CC79A7"
_FAILED = "#D55E00"
_PRUNED = "#666666"
_NOT_MEASURED = "#BBBBBB"
_ROUND_CMAP = "Blues"
_STRIP_PRUNED, _STRIP_FAILED = 0.035, 0.09
"""heights (axes fraction) of the bottom strip's rows: the candidates with no measurement to draw"""


# --- what harness.report.search tables with it ----------------------------------------------------------


def metric_unit(metric: str) -> tuple[float, str]:
    """(scale, axis label) of the searched metric: step times in ms."""
    if metric == "step_time_s":
        return 1e3, "step time (ms)"
    return 1.0, "tokens/s per GPU"


# --- figure -------------------------------------------------------------------------------------------------


def tune_figure_names(logs: list[TuneLog]) -> list[str]:
    """One file stem per log: `tune` for one log, else `tune-<sweep>` (made unique, safe as a file name)."""
    if len(logs) == 1:
        return ["tune"]
    names: list[str] = []
    for i, log in enumerate(logs):
        stem = "tune-" + (re.sub(r"[^A-Za-z0-9._-]+", "_", log.sweep or "") or str(i + 1))
        name, k = stem, 2
        while name in names:
            name, k = f"{stem}-{k}", k + 1
        names.append(name)
    return names


def _verdict_text(g: GroupLog) -> str:
    p = g.p_value
    return str(g.verdict) + ("" if p is None else f", p = {p:.3g}")


def _round_colour(r: int, n_rounds: int) -> tuple[float, float, float, float]:
    """Paler for the early rounds, darker the further a candidate got."""
    cmap = plt.get_cmap(_ROUND_CMAP)
    return cmap(0.35 + 0.6 * (r / max(1, n_rounds - 1)))


@dataclass
class _Drawn:
    """What the panels drew, for the legend and the note."""

    fates: set[str] = field(default_factory=set)
    rounds: set[int] = field(default_factory=set)
    strategies: set[str] = field(default_factory=set)
    no_prediction: int = 0
    """measured candidates left out for lack of a prediction"""


def _strip_mark(ax, x: float, height: float, **kw: Any) -> None:
    """A mark at predicted value `x` on the strip at the bottom of the panel (`height`: axes fraction)."""
    strip = blended_transform_factory(ax.transData, ax.transAxes)
    ax.plot([x], [height], transform=strip, linestyle="none", markeredgewidth=1.6, clip_on=False, **kw)


def _panel(ax, g: GroupLog, *, metric: str, n_rounds: int, drawn: _Drawn) -> None:
    """One group: predicted (x) against measured (y); the candidates with no measurement on the bottom strip."""
    scale, _ = metric_unit(metric)
    xs: list[float] = []
    ys: list[float] = []
    for c in g.candidates:
        p = c.prediction(metric)
        v, fate = c.measured, c.fate
        if p is None:
            drawn.no_prediction += c.was_run() and v is not None
            continue
        x = p * scale
        if fate == "failed" or (v is None and c.was_run()):
            _strip_mark(ax, x, _STRIP_FAILED, marker="x", color=_FAILED, markersize=7, zorder=3)
            drawn.fates.add("failed")
        elif v is None and fate in ("pruned_prediction", "unmeasured", "dropped_oom_neighbour"):
            pruned = fate == "pruned_prediction"
            colour = _PRUNED if pruned else _NOT_MEASURED
            _strip_mark(ax, x, _STRIP_PRUNED, marker="|", color=colour, markersize=10, zorder=2)
            drawn.fates.add("pruned_prediction" if pruned else "not_measured")
        elif v is None:
            continue  # pruned by memory or unsupported, yet with a prediction: counted in the funnel only
        elif fate in ("winner", "runner_up"):
            win = fate == "winner"
            ax.scatter(
                [x],
                [v * scale],
                marker="*" if win else "D",
                s=260 if win else 80,
                zorder=5,
                facecolors=_WINNER if win else _RUNNER_UP,
                edgecolors="black",
                linewidths=1.0,
            )
            ax.annotate(c.label, (x, v * scale), xytext=(7, 5), textcoords="offset points", fontsize=7, zorder=6)
            drawn.fates.add(fate)
        else:
            strategy = c.spec.strategy if c.spec is not None else ""
            ax.scatter(
                [x],
                [v * scale],
                marker="o",
                s=90,
                facecolors=[_round_colour(c.round, n_rounds)],
                edgecolors=style(strategy)[0],
                linewidths=2.0,
                zorder=4,
            )
            drawn.rounds.add(c.round)
            drawn.strategies.add(strategy)
        xs.append(x)
        if v is not None and fate != "failed":
            ys.append(v * scale)
    if xs:
        lo, hi = min(xs), max(xs)
        pad = (hi - lo) * 0.08 or abs(hi) * 0.1 or 1.0
        ax.set_xlim(lo - pad, hi + pad)
    if ys:
        lo, hi = min(ys), max(ys)
        span = (hi - lo) or abs(hi) * 0.1 or 1.0
        ax.set_ylim(lo - 0.3 * span, hi + 0.15 * span)  # NOTE: room at the bottom for the strip
        a, b = ax.get_xlim()  # NOTE: measured = predicted drawn after the limits, so it never widens them
        ax.plot([a, b], [a, b], color="#999999", linestyle="--", linewidth=0.8, zorder=1)
        ax.set_xlim(a, b)
    fmt = "{x:g}" if metric == "step_time_s" else "{x:,.0f}"
    ax.xaxis.set_major_formatter(StrMethodFormatter(fmt))
    if ys:
        ax.yaxis.set_major_formatter(StrMethodFormatter(fmt))
    else:  # NOTE: an empty y axis would show a meaningless -0.04…0.04
        ax.set_yticks([])
        ax.text(0.5, 0.55, "nothing measured ok", transform=ax.transAxes, ha="center", va="center", color="#777777")
    ax.grid(True, color="#EEEEEE", linewidth=0.6)
    ax.set_axisbelow(True)


def _handle(label: str, **kw: Any) -> Line2D:
    return Line2D([], [], linestyle="none", label=label, **kw)


def _legend_handles(drawn: _Drawn, n_rounds: int) -> list[Line2D]:
    out = []
    if "winner" in drawn.fates:
        out.append(_handle("winner", marker="*", markersize=13, markerfacecolor=_WINNER, markeredgecolor="black"))
    if "runner_up" in drawn.fates:
        out.append(_handle("runner-up", marker="D", markersize=7, markerfacecolor=_RUNNER_UP, markeredgecolor="black"))
    for r in sorted(drawn.rounds):
        colour = _round_colour(r, n_rounds)
        out.append(
            _handle(
                f"eliminated, reached round {r}",
                marker="o",
                markersize=8,
                markerfacecolor=colour,
                markeredgecolor="#777777",
            )
        )
    for s in ordered_strategies(drawn.strategies):
        out.append(
            _handle(
                f"ring: {s}",
                marker="o",
                markersize=8,
                markerfacecolor="white",
                markeredgecolor=style(s)[0],
                markeredgewidth=2.0,
            )
        )
    if "failed" in drawn.fates:
        out.append(_handle("failed", marker="x", color=_FAILED, markeredgewidth=1.6))
    if "pruned_prediction" in drawn.fates:
        out.append(_handle("pruned by prediction", marker="|", color=_PRUNED, markersize=10, markeredgewidth=1.6))
    if "not_measured" in drawn.fates:
        out.append(
            _handle(
                "not measured (budget, OOM neighbour)",
                marker="|",
                color=_NOT_MEASURED,
                markersize=10,
                markeredgewidth=1.6,
            )
        )
    out.append(Line2D([], [], color="#999999", linestyle="--", linewidth=0.8, label="measured = predicted"))
    return out


def tune_figure(log: TuneLog, *, name: str = "tune") -> Figure:
    """Per (model, GPU count) group one panel: each candidate's predicted metric (x) against the metric measured
    at the highest round it reached (y); the winner a star, the runner-up a diamond, the eliminated circles
    coloured by the round they reached (ringed in their strategy's colour); the candidates with no measurement
    on a strip at the bottom (failed ×, pruned by prediction |)."""
    metric, unit = log.metric, metric_unit(log.metric)[1]
    title = f"Search (harness tune): {log.sweep or log.scenario or 'sweep'}"
    caption = (
        f"One panel per model and GPU count: each candidate's predicted {unit} (x) against the {unit} measured at "
        f"the highest round it reached (y, the median over its runs there; {log.better} is better). ★ = the "
        "winner, ◆ = the runner-up, circles = eliminated, darker the further they got, ringed in their strategy's "
        "colour; on the strip at the bottom, at their predicted value: × failed, | pruned by the prediction (grey) "
        "or not measured (pale). Dashed: measured = predicted. Candidates pruned by the memory model or not "
        "supported are counted in the funnel table, not drawn."
    )
    groups = [g for g in log.groups if any(c.prediction(metric) is not None for c in g.candidates)]
    if not groups:
        return no_data(name, title, caption, "no candidate of the search has a prediction to place it")
    shown = groups[:MAX_TUNE_PANELS]
    notes = []
    if len(shown) < len(log.groups):
        notes.append(f"{len(shown)} of {len(log.groups)} groups drawn; the tables have all.")
    ncols = min(3, len(shown))
    nrows = math.ceil(len(shown) / ncols)
    fig, axes = plt.subplots(
        nrows, ncols, figsize=(max(6.4, 4.8 * ncols), 3.8 * nrows + 1.6), squeeze=False, layout="constrained"
    )
    for ax in list(axes.flat)[len(shown) :]:
        ax.set_visible(False)
    drawn = _Drawn()
    n_rounds = max(g.n_rounds() for g in shown)
    for ax, g in zip(axes.flat, shown):
        _panel(ax, g, metric=metric, n_rounds=n_rounds, drawn=drawn)
        gpus = g.gpus
        ax.set_title(f"{g.model} · {gpus:g} GPU{'' if gpus == 1 else 's'}: {_verdict_text(g)}", fontsize=9)
        ax.set_xlabel(f"predicted {unit}")
        ax.set_ylabel(f"measured {unit}")
    if drawn.no_prediction:
        notes.append(f"{drawn.no_prediction} measured candidate(s) have no prediction and are not drawn.")
    measured_s, stopped = log.measured_s, log.stopped
    fig.suptitle(
        f"harness tune ({log.objective}): {'n/a' if log.trials is None else log.trials} trials, "
        + ("n/a" if measured_s is None else f"{measured_s:,.0f} s")
        + " measuring"
        + (f", stopped: {stopped}" if stopped else (", not finished" if log.finished is False else ""))
    )
    handles = _legend_handles(drawn, n_rounds)
    fig.legend(handles=handles, loc="outside lower center", ncols=min(2 * ncols, 4, len(handles)), frameon=False)
    return Figure(name, title, caption, png_bytes(fig), " ".join(notes))
