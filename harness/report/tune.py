"""The report's search view: what `harness tune` did, read from its log (RESULTS/<sweep>/tune.json, version 1).

`harness tune` searches a scenario's matrix per (model, GPU count): it drops the cells the catalogue does not
support and those the memory model says will not fit, ranks the rest by predicted step time, measures the top
ones in rounds of successive halving, and confirms the leader against the runner-up with repeated runs. Its
trials are ordinary records (the report shows them as cells); the log says how each candidate fared. Here: the
logs found under the result dirs (`read_tune_logs`), per group the funnel (`tune_summary`), the measured
candidates ranked (`ranked_candidates`), and one figure per log (`tune_figure`: predicted against measured).

A log that cannot be read, or is of another version, is a warning (as a file that is not a readable record is),
never a crash. Imports nothing of harness.tune: the log is the contract.
"""

from __future__ import annotations

import json
import math
import os
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import matplotlib.pyplot as plt
from matplotlib.lines import Line2D
from matplotlib.ticker import StrMethodFormatter
from matplotlib.transforms import blended_transform_factory

from harness.compare.metrics import finite_number
from harness.report.figures import Figure, _no_data, _ordered_strategies, _png, style
from harness.results.store import TUNE_LOG, files_named

__all__ = [
    "TUNE_LOG",
    "TUNE_VERSION",
    "is_tune_log",
    "ranked_candidates",
    "read_tune_files",
    "read_tune_logs",
    "tune_figure",
    "tune_figure_names",
    "tune_log_files",
    "tune_summary",
]

TUNE_VERSION = 1
FATES = (
    "winner",
    "runner_up",
    "eliminated",
    "pruned_memory",
    "pruned_prediction",
    "unsupported",
    "failed",
    "dropped_oom_neighbour",
    "unmeasured",
    "measured",
)
"""a candidate's fate in a version-1 log ("measured": still in the search, in a log written between batches)"""
METRICS = {"tokens_per_s_per_gpu": "predicted_tokens_per_s_per_gpu", "step_time_s": "predicted_step_time_s"}
"""the searched metric → the candidate's prediction of it"""
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


# --- reading ------------------------------------------------------------------------------------------------


def is_tune_log(path: str | Path) -> bool:
    return os.path.basename(path) == TUNE_LOG


def tune_log_files(*dirs: str | Path) -> list[str]:
    """Paths of the tune logs under `dirs` (a dir that is itself a tune.json counts), in path order: walked as the
    records are (hidden entries and symlinked folders left out)."""
    return files_named(TUNE_LOG, *dirs)


def _number(v: Any) -> bool:
    return finite_number(v) is not None


def _check(ok: bool, where: str, value: Any, what: str) -> None:
    if not ok:
        raise ValueError(f"{where}: {value!r} is not {what}")


def _check_candidate(c: Any, where: str) -> None:
    _check(isinstance(c, dict), where, type(c).__name__, "an object")
    missing = [k for k in ("run_id", "label", "fate", "round") if k not in c]
    if missing:
        raise ValueError(f"{where}: missing keys: {', '.join(missing)}")
    _check(isinstance(c["run_id"], str), f"{where}.run_id", c["run_id"], "a string")
    _check(isinstance(c["label"], str), f"{where}.label", c["label"], "a string")
    _check(c["fate"] in FATES, f"{where}.fate", c["fate"], f"one of {', '.join(FATES)}")
    _check(isinstance(c["round"], int) and not isinstance(c["round"], bool), f"{where}.round", c["round"], "an int")
    for k in ("measured", *METRICS.values(), "predicted_memory_gib", "predicted_rank"):
        v = c.get(k)
        _check(v is None or _number(v), f"{where}.{k}", v, "a number or null")
    _check(c.get("reason") is None or isinstance(c["reason"], str), f"{where}.reason", c.get("reason"), "a string")
    _check(c.get("spec") is None or isinstance(c["spec"], dict), f"{where}.spec", c.get("spec"), "an object")
    trials = c.get("trials", [])
    _check(isinstance(trials, list), f"{where}.trials", trials, "a list")
    for n, t in enumerate(trials):
        tw = f"{where}.trials[{n}]"
        _check(isinstance(t, dict), tw, type(t).__name__, "an object")
        _check(isinstance(t.get("round"), int), f"{tw}.round", t.get("round"), "an int")
        _check(t.get("value") is None or _number(t["value"]), f"{tw}.value", t.get("value"), "a number or null")


def check_tune_log(doc: Any) -> dict[str, Any]:
    """A parsed document as a version-1 tune log; ValueError naming the key and what is wrong when it is not."""
    if not isinstance(doc, dict):
        raise ValueError("not a JSON object")
    version = doc.get("tune_version")
    if version != TUNE_VERSION:
        raise ValueError(f"unknown tune_version {version!r}; this harness reads version {TUNE_VERSION}")
    missing = [k for k in ("objective", "metric", "better", "groups") if k not in doc]
    if missing:
        raise ValueError(f"missing keys: {', '.join(missing)}")
    _check(doc["metric"] in METRICS, "metric", doc["metric"], f"one of {', '.join(METRICS)}")
    _check(doc["better"] in ("higher", "lower"), "better", doc["better"], "higher or lower")
    for k in ("trials", "measured_s"):
        _check(doc.get(k) is None or _number(doc[k]), k, doc.get(k), "a number or null")
    _check(isinstance(doc["groups"], list), "groups", type(doc["groups"]).__name__, "a list")
    for i, g in enumerate(doc["groups"]):
        where = f"groups[{i}]"
        _check(isinstance(g, dict), where, type(g).__name__, "an object")
        missing = [k for k in ("model", "gpus", "verdict", "candidates") if k not in g]
        if missing:
            raise ValueError(f"{where}: missing keys: {', '.join(missing)}")
        _check(_number(g["gpus"]), f"{where}.gpus", g["gpus"], "a number")
        _check(g.get("p_value") is None or _number(g["p_value"]), f"{where}.p_value", g.get("p_value"), "a number")
        steps = g.get("steps", [])
        _check(isinstance(steps, list), f"{where}.steps", steps, "a list")
        _check(isinstance(g["candidates"], list), f"{where}.candidates", type(g["candidates"]).__name__, "a list")
        for j, c in enumerate(g["candidates"]):
            _check_candidate(c, f"{where}.candidates[{j}]")
    return doc


def read_tune_file(path: str | Path) -> dict[str, Any]:
    """One tune log, checked (`check_tune_log`), with `_path` set; ValueError with the reason."""
    try:
        text = Path(path).read_text()
    except (OSError, UnicodeDecodeError) as e:
        raise ValueError(f"unreadable: {e}") from None
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as e:
        raise ValueError(f"not valid JSON (truncated or corrupt?): {e}") from None
    log = check_tune_log(doc)
    log["_path"] = str(path)
    return log


def read_tune_files(paths: Iterable[str | Path], warnings: list[str]) -> list[dict[str, Any]]:
    """The logs at `paths` that are readable version-1 tune logs; one warning line for each other."""
    logs = []
    for p in paths:
        try:
            logs.append(read_tune_file(p))
        except ValueError as e:
            warnings.append(f"{p}: not a readable harness tune log, its search is not shown: {e}")
    return logs


def read_tune_logs(dirs: Iterable[str | Path], *, warnings: list[str] | None = None) -> list[dict[str, Any]]:
    """Every readable tune log under `dirs` (each sweep folder's tune.json), in path order; a log that is not
    readable is a line appended to `warnings`."""
    return read_tune_files(tune_log_files(*dirs), [] if warnings is None else warnings)


# --- tables -------------------------------------------------------------------------------------------------


def _measured_rounds(c: dict[str, Any]) -> set[int]:
    """The rounds a candidate was measured in: its trials' rounds, or 0…round when the log lists no trials."""
    trials = c.get("trials") or []
    if trials:
        return {t["round"] for t in trials}
    return set(range(c["round"] + 1))


def _n_rounds(group: dict[str, Any]) -> int:
    seen = [r for c in group["candidates"] for r in _measured_rounds(c)]
    return max([len(group.get("steps") or []), *(r + 1 for r in seen)])


def _label_of(group: dict[str, Any], key: str) -> str | None:
    """The label of the group's `key` ("winner" or "runner_up"): the candidate its run_id names, else the one of
    that fate; None when the group has none."""
    run_id = group.get(key)
    named = [c for c in group["candidates"] if run_id and c["run_id"] == run_id]
    named += [c for c in group["candidates"] if c["fate"] == key]
    return named[0]["label"] if named else None


def tune_summary(log: dict[str, Any]) -> list[dict[str, Any]]:
    """Per (model, GPU count) group, the funnel: how many candidates, how many the catalogue does not support,
    the memory model pruned, the ranking pruned, were dropped beside an out-of-memory neighbour, were measured in
    each round (`measured_per_round`, round 0 first), failed, were left unmeasured; the winner's label (None
    without one), the runner-up's, the verdict and its p-value."""
    rows = []
    for g in log["groups"]:
        cands = g["candidates"]

        def count(fate: str, cands: list[dict[str, Any]] = cands) -> int:
            return sum(c["fate"] == fate for c in cands)

        n_rounds = _n_rounds(g)
        rows.append(
            {
                "model": g["model"],
                "gpus": g["gpus"],
                "candidates": len(cands),
                "unsupported": count("unsupported"),
                "pruned_memory": count("pruned_memory"),
                "pruned_prediction": count("pruned_prediction"),
                "dropped_oom_neighbour": count("dropped_oom_neighbour"),
                "measured_per_round": [sum(r in _measured_rounds(c) for c in cands) for r in range(n_rounds)],
                "failed": count("failed"),
                "unmeasured": count("unmeasured"),
                "winner": _label_of(g, "winner"),
                "runner_up": _label_of(g, "runner_up"),
                "verdict": g["verdict"],
                "p_value": g.get("p_value"),
                "steps": list(g.get("steps") or []),
            }
        )
    return rows


_FATE_ORDER = {"winner": 0, "runner_up": 1}


def measured(c: dict[str, Any]) -> bool:
    """Whether the search ran the candidate at all (successfully or not)."""
    return c["round"] >= 0 or bool(c.get("trials"))


def predicted_value(c: dict[str, Any], metric: str) -> float | None:
    """The candidate's prediction of the searched metric (tokens/s per GPU or step time in seconds)."""
    return c.get(METRICS[metric])


def ranked_candidates(group: dict[str, Any], *, better: str) -> list[dict[str, Any]]:
    """The group's measured candidates, best first: the winner, the runner-up, then by round reached (highest
    first), by the measured metric (best first; `better` is "higher" or "lower"), the failed last."""
    sign = -1.0 if better == "higher" else 1.0

    def key(c: dict[str, Any]) -> tuple:
        v = c.get("measured")
        return (
            _FATE_ORDER.get(c["fate"], 3 if c["fate"] == "failed" else 2),
            -c["round"],
            v is None,
            0.0 if v is None else sign * v,
            c.get("predicted_rank") is None,
            c.get("predicted_rank") or 0,
            c["label"],
        )

    return sorted((c for c in group["candidates"] if measured(c)), key=key)


def trial_counts(c: dict[str, Any]) -> tuple[int, int]:
    """(trials that ran ok, trials) of a candidate."""
    trials = c.get("trials") or []
    return sum(t.get("status") == "ok" for t in trials), len(trials)


# --- figure -------------------------------------------------------------------------------------------------


def tune_figure_names(logs: list[dict[str, Any]]) -> list[str]:
    """One file stem per log: `tune` for one log, else `tune-<sweep>` (made unique, safe as a file name)."""
    if len(logs) == 1:
        return ["tune"]
    names: list[str] = []
    for i, log in enumerate(logs):
        stem = "tune-" + (re.sub(r"[^A-Za-z0-9._-]+", "_", str(log.get("sweep") or "")) or str(i + 1))
        name, k = stem, 2
        while name in names:
            name, k = f"{stem}-{k}", k + 1
        names.append(name)
    return names


def metric_unit(metric: str) -> tuple[float, str]:
    """(scale, axis label) of the searched metric: step times in ms."""
    if metric == "step_time_s":
        return 1e3, "step time (ms)"
    return 1.0, "tokens/s per GPU"


def _verdict_text(g: dict[str, Any]) -> str:
    p = g.get("p_value")
    return str(g["verdict"]) + ("" if p is None else f", p = {p:.3g}")


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


def _panel(ax, g: dict[str, Any], *, metric: str, n_rounds: int, drawn: _Drawn) -> None:
    """One group: predicted (x) against measured (y); the candidates with no measurement on the bottom strip."""
    scale, _ = metric_unit(metric)
    xs: list[float] = []
    ys: list[float] = []
    for c in g["candidates"]:
        p = predicted_value(c, metric)
        v, fate = c.get("measured"), c["fate"]
        if p is None:
            drawn.no_prediction += measured(c) and v is not None
            continue
        x = p * scale
        if fate == "failed" or (v is None and measured(c)):
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
            ax.annotate(c["label"], (x, v * scale), xytext=(7, 5), textcoords="offset points", fontsize=7, zorder=6)
            drawn.fates.add(fate)
        else:
            strategy = str((c.get("spec") or {}).get("strategy", ""))
            ax.scatter(
                [x],
                [v * scale],
                marker="o",
                s=90,
                facecolors=[_round_colour(c["round"], n_rounds)],
                edgecolors=style(strategy)[0],
                linewidths=2.0,
                zorder=4,
            )
            drawn.rounds.add(c["round"])
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
    for s in _ordered_strategies(drawn.strategies):
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


def tune_figure(log: dict[str, Any], *, name: str = "tune") -> Figure:
    """Per (model, GPU count) group one panel: each candidate's predicted metric (x) against the metric measured
    at the highest round it reached (y); the winner a star, the runner-up a diamond, the eliminated circles
    coloured by the round they reached (ringed in their strategy's colour); the candidates with no measurement
    on a strip at the bottom (failed ×, pruned by prediction |)."""
    metric, unit = log["metric"], metric_unit(log["metric"])[1]
    title = f"Search (harness tune): {log.get('sweep') or log.get('scenario') or 'sweep'}"
    caption = (
        f"One panel per model and GPU count: each candidate's predicted {unit} (x) against the {unit} measured at "
        f"the highest round it reached (y, the median over its runs there; {log['better']} is better). ★ = the "
        "winner, ◆ = the runner-up, circles = eliminated, darker the further they got, ringed in their strategy's "
        "colour; on the strip at the bottom, at their predicted value: × failed, | pruned by the prediction (grey) "
        "or not measured (pale). Dashed: measured = predicted. Candidates pruned by the memory model or not "
        "supported are counted in the funnel table, not drawn."
    )
    groups = [g for g in log["groups"] if any(predicted_value(c, metric) is not None for c in g["candidates"])]
    if not groups:
        return _no_data(name, title, caption, "no candidate of the search has a prediction to place it")
    shown = groups[:MAX_TUNE_PANELS]
    notes = []
    if len(shown) < len(log["groups"]):
        notes.append(f"{len(shown)} of {len(log['groups'])} groups drawn; the tables have all.")
    ncols = min(3, len(shown))
    nrows = math.ceil(len(shown) / ncols)
    fig, axes = plt.subplots(
        nrows, ncols, figsize=(max(6.4, 4.8 * ncols), 3.8 * nrows + 1.6), squeeze=False, layout="constrained"
    )
    for ax in list(axes.flat)[len(shown) :]:
        ax.set_visible(False)
    drawn = _Drawn()
    n_rounds = max(_n_rounds(g) for g in shown)
    for ax, g in zip(axes.flat, shown):
        _panel(ax, g, metric=metric, n_rounds=n_rounds, drawn=drawn)
        gpus = g["gpus"]
        ax.set_title(f"{g['model']} · {gpus:g} GPU{'' if gpus == 1 else 's'}: {_verdict_text(g)}", fontsize=9)
        ax.set_xlabel(f"predicted {unit}")
        ax.set_ylabel(f"measured {unit}")
    if drawn.no_prediction:
        notes.append(f"{drawn.no_prediction} measured candidate(s) have no prediction and are not drawn.")
    measured_s, stopped = log.get("measured_s"), log.get("stopped")
    fig.suptitle(
        f"harness tune ({log['objective']}): {log.get('trials', 'n/a')} trials, "
        + ("n/a" if measured_s is None else f"{measured_s:,.0f} s")
        + " measuring"
        + (f", stopped: {stopped}" if stopped else ("" if log.get("finished", True) else ", not finished"))
    )
    handles = _legend_handles(drawn, n_rounds)
    fig.legend(handles=handles, loc="outside lower center", ncols=min(2 * ncols, 4, len(handles)), frameon=False)
    return Figure(name, title, caption, _png(fig), " ".join(notes))
