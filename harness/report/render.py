"""The report's tables as text: one self-contained HTML page and one GitHub-flavoured Markdown page.

Numbers are formatted here and only here; a null is "n/a" (the record has no value), "—" means the cell is
not in the results at all. Units: tokens/s per GPU, MFU in % of dense peak FLOPS, step times in ms, memory in
GiB (2**30 bytes), collective bytes per step in binary units (KiB/MiB/GiB).
"""

from __future__ import annotations

import base64
import html
import math
from collections.abc import Callable, Collection
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from harness.core import markdown as md
from harness.report.figures import Figure
from harness.report.frame import MEMORY_RSS, PREDICTION_BAND
from harness.report.trends import TREND_HEADER, trend_rows
from harness.report.tune import metric_unit, predicted_value, ranked_candidates, trial_counts, tune_summary

NA = "n/a"
ABSENT = "—"
MAX_MD_FAILED_ROWS = 200
MAX_MD_WARNINGS = 50
MAX_REASON_MD = 300
MAX_MD_BYTES = 900 * 2**10
"""report.md larger than this drops its per-model tables ($GITHUB_STEP_SUMMARY takes at most 1 MiB)"""
MAX_REASON_HTML = 2000


def _null(v: Any) -> bool:
    return v is None or (isinstance(v, float) and math.isnan(v))


def fmt_tokens(v: Any) -> str:
    return NA if _null(v) else (f"{v:,.0f}" if abs(v) >= 100 else f"{v:.3g}")


def fmt_pct(v: Any) -> str:
    return NA if _null(v) else f"{100.0 * v:.1f}%"


def fmt_signed_pct(v: Any) -> str:
    return NA if _null(v) else f"{100.0 * v:+.1f}%"


def fmt_ms(v: Any) -> str:
    if _null(v):
        return NA
    ms = 1e3 * v
    return f"{ms:,.0f}" if ms >= 100 else (f"{ms:.1f}" if ms >= 10 else f"{ms:.2f}")


def fmt_gib(v: Any) -> str:
    if _null(v):
        return NA
    return f"{v:.1f}" if v >= 10 else (f"{v:.2f}" if v >= 1 else f"{v:.3g}")


def fmt_bytes(v: Any) -> str:
    if _null(v):
        return NA
    for div, unit in ((2**30, "GiB"), (2**20, "MiB"), (2**10, "KiB")):
        if v >= div:
            return f"{v / div:.3g} {unit}"
    return f"{v:.0f} B"


def fmt_text(v: Any) -> str:
    return NA if _null(v) else str(v)


def fmt_int(v: Any) -> str:
    return NA if _null(v) else f"{v:.0f}"


@dataclass(frozen=True)
class Column:
    key: str
    label: str
    fmt: Callable[[Any], str]


CELL_METRICS: tuple[Column, ...] = (
    Column("tokens_per_s_per_gpu", "tok/s/GPU", fmt_tokens),
    Column("mfu", "MFU", fmt_pct),
    Column("step_time_median_s", "step median (ms)", fmt_ms),
    Column("step_time_p90_s", "step p90 (ms)", fmt_ms),
    Column("predicted_step_time_s", "step predicted (ms)", fmt_ms),
    Column("step_time_deviation", "measured vs predicted", fmt_signed_pct),
    Column("peak_memory_allocated_gib", "mem alloc (GiB)", fmt_gib),
    Column("peak_memory_reserved_gib", "mem reserved (GiB)", fmt_gib),
    Column("predicted_memory_gib", "mem predicted (GiB)", fmt_gib),
    Column("device_memory_gib", "capacity (GiB)", fmt_gib),
    Column("comm_bytes_per_step", "collective bytes/step", fmt_bytes),
    Column("status", "status", fmt_text),
)
"""the model tables' columns for cells measured on a device (CUDA)"""
RSS_COLUMN = Column("peak_rss_gib", "peak RSS, CPU process (GiB)", fmt_gib)
"""replaces the four device-memory columns for cells that ran on CPU: their peak_memory_allocated_gib is the
process's peak RSS, not tensor memory, so it is neither "mem alloc" nor comparable with the planner's
"mem predicted"."""
_DEVICE_MEMORY_KEYS = (
    "peak_memory_allocated_gib",
    "peak_memory_reserved_gib",
    "predicted_memory_gib",
    "device_memory_gib",
)


_PREDICTED_TIME_KEYS = ("predicted_step_time_s", "step_time_deviation")


def cell_columns(rss: list[bool], *, predicted: bool = False) -> tuple[Column, ...]:
    """CELL_METRICS for cells whose memory is (True) or is not a CPU process's RSS: the device-memory columns
    only when some cell was measured on a device, and the RSS column (after them) only when some cell ran on
    CPU; the predicted step time and its deviation only when some cell has a `predicted`."""
    has_device, has_rss = not all(rss), any(rss)
    out = []
    for c in CELL_METRICS:
        if (c.key in _DEVICE_MEMORY_KEYS and not has_device) or (c.key in _PREDICTED_TIME_KEYS and not predicted):
            continue
        out.append(c)
        if c.key == "device_memory_gib" or (c.key == "step_time_p90_s" and not has_device):
            if has_rss:
                out.append(RSS_COLUMN)
    return tuple(out)


_PAGE_KEYS = (
    "model",
    "gpus",
    "strategy",
    "precision",
    "variant",
    "status",
    "reason",
    "memory_measure",
    "mfu_null_reason",
    "prediction_source",
    *dict.fromkeys(c.key for c in CELL_METRICS if c.key != "status"),
)
"""the cell table's columns that the per-model tables read"""


def _any_predicted(recs: list[dict[str, Any]]) -> bool:
    return any(not _null(r["predicted_step_time_s"]) for r in recs)


def _records_by_model(cells: pd.DataFrame) -> dict[Any, list[dict[str, Any]]]:
    """The cells as dicts (only the columns the per-model tables show), grouped by model in the order the
    models come, each group in the cells' order: as cells.groupby("model", sort=False), in one to_dict instead
    of a DataFrame and a to_dict per group (0.3 s at 4,000 cells and 60 columns)."""
    out: dict[Any, list[dict[str, Any]]] = {}
    for r in cells[list(_PAGE_KEYS)].to_dict("records"):
        out.setdefault(r["model"], []).append(r)
    return out


def cell_value(r: dict[str, Any], key: str) -> Any:
    """A model-table value: a CPU cell's memory shows under RSS_COLUMN only; its predicted memory (tensor
    bytes) is left out beside a measured RSS (table.csv has it)."""
    rss = r.get("memory_measure") == MEMORY_RSS
    if key == RSS_COLUMN.key:
        return r["peak_memory_allocated_gib"] if rss else None
    if rss and key in _DEVICE_MEMORY_KEYS:
        return None
    return r[key]


def _row_keys(cells: pd.DataFrame) -> list[str]:
    return ["strategy", "precision"] + (["variant"] if (cells["variant"] != "").any() else [])


def _short(text: Any, limit: int, *, one_line: bool = True) -> str:
    s = " ".join(fmt_text(text).split()) if one_line else fmt_text(text).strip()
    return s if len(s) <= limit else s[: limit - 1] + "…"


STAR = "★"
TIE = "≈"
"""the fastest cell's mark in the model tables: STAR when it is faster than the next strategy beyond noise (or
there is no other strategy), TIE when the two are not distinguishable (harness.report.leader)"""


def _tied(b: dict[str, Any]) -> bool:
    return b.get("distinguishable") is False or b.get("distinguishable") == 0


def _best_keys(best: pd.DataFrame) -> dict[tuple, tuple[str, str]]:
    """(model, gpus, strategy, precision, variant) of each fastest cell → (mark, hover text)."""
    marks = {}
    for b in best.dropna(subset=["strategy"]).to_dict("records"):
        key = (b["model"], b["gpus"], b["strategy"], b["precision"], b["variant"])
        if _tied(b):
            marks[key] = (
                TIE,
                f"fastest, but not distinguishable from {b['runner_up']} · {b['runner_up_precision']} ({b['verdict']})",
            )
        else:
            marks[key] = (STAR, "best strategy for this model and GPU count")
    return marks


def _best_mark(rec: Any, best_keys: dict[tuple, tuple[str, str]]) -> tuple[str, str] | None:
    return best_keys.get((rec["model"], rec["gpus"], rec["strategy"], rec["precision"], rec["variant"]))


def _gpus_label(g: float) -> str:
    return f"{g:.0f} GPU" + ("" if g == 1 else "s")


def _statuses_text(statuses: dict[str, int]) -> str:
    return ", ".join(f"{n} {s}" for s, n in sorted(statuses.items(), key=lambda kv: (-kv[1], kv[0])))


def _best_rows(best: pd.DataFrame, *, with_variant: bool) -> list[list[str]]:
    rows = []
    for b in best.to_dict("records"):
        if _null(b["strategy"]):
            rows.append(
                [b["model"], fmt_int(b["gpus"]), "none ran ok", ABSENT]
                + ([ABSENT] if with_variant else [])
                + [NA, NA, ABSENT, ABSENT, f"0 of {b['n_cells']} ({_statuses_text(b['statuses'])})"]
            )
            continue
        ru = ABSENT if _null(b["runner_up"]) else f"{b['runner_up']} · {b['runner_up_precision']}"
        margin = ABSENT if _null(b["margin"]) else f"+{100 * b['margin']:.1f}% ({b['verdict']})"
        strategy = b["strategy"]
        if _tied(b):  # NOTE: never crown noise: the leader and the runner-up share the row's first column
            strategy, margin = f"{b['strategy']} {TIE} {b['runner_up']}", f"{TIE} {margin}"
        rows.append(
            [b["model"], fmt_int(b["gpus"]), strategy, b["precision"]]
            + ([b["variant"] or ABSENT] if with_variant else [])
            + [fmt_tokens(b["tokens_per_s_per_gpu"]), fmt_pct(b["mfu"]), ru, margin, f"{b['n_ok']} of {b['n_cells']}"]
        )
    return rows


def _best_header(with_variant: bool) -> list[str]:
    return (
        ["model", "GPUs", "best strategy", "precision"]
        + (["configuration"] if with_variant else [])
        + ["tok/s/GPU", "MFU", "next-best strategy", "lead over it", "cells ok"]
    )


FAILED_COLUMNS = (
    "model",
    "strategy",
    "precision",
    "configuration",
    "GPUs",
    "status",
    "failed rank",
    "reason",
    "record",
)


_LISTED_COLUMNS = ("model", "strategy", "precision", "variant", "gpus", "status", "failed_rank", "reason", "path")
"""the columns the failed/noted cell lists show"""


def _failed_rows(cells: pd.DataFrame, *, reason_limit: int, one_line: bool = True) -> list[list[str]]:
    bad = cells[cells["status"] != "ok"]
    return [
        [
            r["model"],
            r["strategy"],
            r["precision"],
            r["variant"] or ABSENT,
            fmt_int(r["gpus"]),
            r["status"],
            fmt_int(r["failed_rank"]),
            _short(r["reason"], reason_limit, one_line=one_line),
            Path(r["path"]).name,
        ]
        for r in bad[list(_LISTED_COLUMNS)].to_dict("records")  # NOTE: only these: to_dict of 60 columns was slow
    ]


NOTED_COLUMNS = ("model", "strategy", "precision", "configuration", "GPUs", "note", "record")


def _noted_rows(cells: pd.DataFrame, *, reason_limit: int, one_line: bool = True) -> list[list[str]]:
    """ok cells whose record carries a note in `reason` (e.g. torch.compile recompiled during the measured
    steps): their numbers stand, with a caveat the reader must see."""
    noted = cells[(cells["status"] == "ok") & cells["reason"].map(lambda v: isinstance(v, str) and bool(v.strip()))]
    return [
        [
            r["model"],
            r["strategy"],
            r["precision"],
            r["variant"] or ABSENT,
            fmt_int(r["gpus"]),
            _short(r["reason"], reason_limit, one_line=one_line),
            Path(r["path"]).name,
        ]
        for r in noted[list(_LISTED_COLUMNS)].to_dict("records")
    ]


def _summary_items(ctx: dict[str, Any]) -> list[tuple[str, str]]:
    df, cells = ctx["frame"], ctx["cells"]
    statuses = df["status"].value_counts()

    def uniq(col: str) -> str:
        vals = sorted({str(v) for v in df[col].dropna().unique()})
        return ", ".join(vals[:8]) + (f" … ({len(vals)} in all)" if len(vals) > 8 else "") if vals else NA

    return [
        ("generated", ctx["generated_at"]),
        ("result dirs", ", ".join(map(str, ctx["dirs"]))),
        (
            "records",
            f"{len(df)} loaded, {ctx['n_unreadable']} file(s) not readable as records; {len(cells)} cells shown",
        ),
        ("statuses", ", ".join(f"{n} {s}" for s, n in statuses.items())),
        ("sweeps", uniq("sweep")),
        ("clusters", uniq("cluster")),
        ("devices", uniq("device_name")),
        ("harness commits", uniq("harness_git_sha")),
        *_accuracy_item(ctx),
    ]


def _accuracy_item(ctx: dict[str, Any]) -> list[tuple[str, str]]:
    """The time model's accuracy over the cells shown, when any has a prediction beside its measurement."""
    acc = ctx.get("prediction_accuracy") or {}
    if not acc.get("cells"):
        return []
    rho = "n/a" if acc["spearman"] is None else f"{acc['spearman']:.2f}"
    families = ", ".join(f"{f} {m:.1%} ({n})" for f, (n, m) in acc["by_family"].items())
    return [
        (
            "time model",
            f"MAPE {acc['mape']:.1%} over {acc['cells']} cells (Spearman ρ {rho}, {acc['within_band']:.0%} within "
            f"±{PREDICTION_BAND:.0%}); by family: {families}",
        )
    ]


DEFINITIONS = (
    "tok/s/GPU: trained tokens per second divided by the GPU count (metrics.tokens_per_s_per_gpu).",
    "MFU: model FLOPs per second per GPU as a share of the device's dense peak FLOPS for the precision; "
    "n/a when the record has no value (the reason is in the MFU figure and in table.csv, mfu_null_reason).",
    "step median/p90: median and 90th percentile of the measured step times, warm-up steps excluded.",
    "mem alloc / reserved: peak memory allocated by tensors / reserved by the caching allocator, per GPU, "
    "after warm-up; predicted: the planner's estimate; capacity: env.device_memory_gib. GiB = 2^30 bytes.",
    "peak RSS, CPU process: on CPU the record's peak memory is the worker process's peak resident set size "
    "(interpreter, torch and every buffer), not tensor memory; it is shown apart and never beside the planner's "
    "prediction, which counts tensor bytes only (table.csv has both; its memory_measure column says which).",
    "step predicted: the time model's step time for the cell, made before it ran (predicted.step_time_s, "
    "harness.plan.time; docs/time-model.md); measured vs predicted: measured median / predicted − 1 "
    "(+10% = 10% slower than predicted; in index.html the line under the step median, the prediction on "
    "hover). MAPE: mean |predicted − measured| / measured over the cells shown.",
    "collective bytes/step: bytes moved by collectives in one training step (comm.bytes_per_step), "
    "binary units (KiB = 2^10 bytes).",
    "Best strategy: highest tok/s/GPU among cells with status ok, over all precisions and configurations; "
    "the lead is over the fastest other strategy, with the p-value of a two-sided Mann–Whitney U test on the "
    "per-step tokens/s/GPU of the two cells (and on every run's tokens/s/GPU when a cell was measured more "
    "than once). p ≥ 0.05 in either test: the two are not distinguishable, shown 'a ≈ b' and marked ≈ instead "
    "of ★ in the model tables.",
    "Scaling efficiency: tok/s/GPU at N GPUs divided by tok/s/GPU at the smallest GPU count where that "
    "strategy and precision ran ok.",
    "n/a: the record has no value (null); —: the cell is not in the results.",
)


# --- Search (harness tune) ------------------------------------------------------------------------------

FUNNEL_HEADER = (
    "model",
    "GPUs",
    "candidates",
    "unsupported",
    "pruned: memory",
    "pruned: prediction",
    "dropped: OOM neighbour",
    "measured per round",
    "failed",
    "not measured",
    "winner",
    "verdict",
    "p",
)
_FUNNEL_NUM = {1, 2, 3, 4, 5, 6, 8, 9, 12}
_FATE_TEXT = {"runner_up": "runner-up", "dropped_oom_neighbour": "dropped (OOM neighbour)"}


def _search_logs(ctx: dict[str, Any]) -> list[dict[str, Any]]:
    """ctx["tune"]: one {"log": tune log, "figure": its figure's name} per log (harness.report.tune)."""
    return ctx.get("tune") or []


def _search_figure_names(ctx: dict[str, Any]) -> set[str]:
    """The figures the search sections show (in place, not in the list of figures)."""
    return {t["figure"] for t in _search_logs(ctx)}


def _search_title(log: dict[str, Any]) -> str:
    return f"Search (harness tune): {log.get('sweep') or log.get('scenario') or 'sweep'}"


def _fmt_p(v: Any) -> str:
    return ABSENT if _null(v) else f"{v:.3g}"


def _search_facts(log: dict[str, Any]) -> str:
    """One line: what was searched for, on which cluster, what it cost, how it ended."""
    budget = log.get("budget") or {}
    limits = [f"{budget[k]} {k}" for k in ("cells", "minutes") if not _null(budget.get(k))]
    if log.get("stopped"):
        end = f"stopped early ({log['stopped']})"
    else:
        end = "finished" if log.get("finished", True) else "not finished"
    measured_s = log.get("measured_s")
    return (
        f"objective {log['objective']} ({log['metric']}, {log['better']} is better); scenario "
        f"{fmt_text(log.get('scenario'))} on {fmt_text(log.get('cluster'))}; {fmt_int(log.get('trials'))} trial "
        f"runs, {NA if _null(measured_s) else f'{measured_s:,.0f} s'} measuring; {end}; budget "
        f"{', '.join(limits) or 'none'}; seed {fmt_text(log.get('seed'))}; log {log.get('_path', NA)}"
    )


def _funnel_rows(log: dict[str, Any]) -> list[list[str]]:
    return [
        [
            str(r["model"]),
            fmt_int(r["gpus"]),
            str(r["candidates"]),
            str(r["unsupported"]),
            str(r["pruned_memory"]),
            str(r["pruned_prediction"]),
            str(r["dropped_oom_neighbour"]),
            " → ".join(map(str, r["measured_per_round"])) or "none",
            str(r["failed"]),
            str(r["unmeasured"]),
            r["winner"] or ABSENT,
            str(r["verdict"]),
            _fmt_p(r["p_value"]),
        ]
        for r in tune_summary(log)
    ]


def _fmt_metric(metric: str) -> Callable[[Any], str]:
    return fmt_ms if metric == "step_time_s" else fmt_tokens


def _ranked_header(metric: str) -> list[str]:
    unit = metric_unit(metric)[1]
    return [
        "#",
        "candidate",
        "predicted rank",
        f"predicted {unit}",
        f"measured {unit}",
        "measured vs predicted",
        "round reached",
        "runs ok",
        "fate",
        "reason",
    ]


_RANKED_NUM = {0, 2, 3, 4, 5, 6, 7}


def _ranked_rows(log: dict[str, Any], group: dict[str, Any]) -> list[list[tuple[str, str]]]:
    """The group's measured candidates, best first: (text, hover title) per column of _ranked_header; the
    candidate's title is its run_id and spec."""
    metric, fmt = log["metric"], _fmt_metric(log["metric"])
    rows = []
    for i, c in enumerate(ranked_candidates(group, better=log["better"]), start=1):
        pred, meas = predicted_value(c, metric), c.get("measured")
        dev = None if pred is None or meas is None or not pred else meas / pred - 1
        ok, n = trial_counts(c)
        spec = ", ".join(f"{k}={v}" for k, v in (c.get("spec") or {}).items() if not isinstance(v, (dict, list)))
        rows.append(
            [
                (str(i), ""),
                (c["label"], f"{c['run_id']}: {spec}" if spec else c["run_id"]),
                (fmt_int(c.get("predicted_rank")), fmt_text(c.get("rank_source"))),
                (fmt(pred), ""),
                (fmt(meas), ""),
                (fmt_signed_pct(dev), ""),
                (str(c["round"]) if c["round"] >= 0 else ABSENT, "" if c["round"] >= 0 else "no run ended ok"),
                (f"{ok} of {n}", ""),
                (_FATE_TEXT.get(c["fate"], c["fate"]), ""),
                (_short(c.get("reason") or "", MAX_REASON_MD), ""),
            ]
        )
    return rows


def _group_title(group: dict[str, Any]) -> str:
    p = group.get("p_value")
    return f"{group['model']} · {_gpus_label(group['gpus'])}: {group['verdict']}" + (
        "" if _null(p) else f" (p = {p:.3g})"
    )


def _markdown_search(ctx: dict[str, Any], figures: list[Figure]) -> list[str]:
    """Per tune log: the facts, the funnel table, the figure (linked), each group's measured candidates ranked."""
    by_name = {f.name: f for f in figures}
    out: list[str] = []
    for t in _search_logs(ctx):
        log = t["log"]
        out += [f"## {md.escape(_search_title(log))}", "", md.escape(_search_facts(log)), ""]
        out += [md.table(list(FUNNEL_HEADER), _funnel_rows(log), right=_FUNNEL_NUM), ""]
        f = by_name.get(t["figure"])
        if f is not None:
            out += [_markdown_figure(f), ""]
        for g in log["groups"]:
            rows = [[text for text, _ in row] for row in _ranked_rows(log, g)]
            out += [f"### {md.escape(_group_title(g))}", ""]
            body = md.table(_ranked_header(log["metric"]), rows, right=_RANKED_NUM) if rows else "Nothing was measured."
            out += [body, ""]
    return out


def _html_titled_table(header: list[str], rows: list[list[tuple[str, str]]], *, num: Collection[int]) -> str:
    out = ['<div class="scroll"><table><thead><tr>' + "".join(f"<th>{_e(h)}</th>" for h in header) + "</tr></thead>"]
    out.append("<tbody>")
    for row in rows:
        out.append(
            "<tr>"
            + "".join(
                _td(text, cls="num" if i in num else ("reason" if i == len(row) - 1 else ""), title=title)
                for i, (text, title) in enumerate(row)
            )
            + "</tr>"
        )
    out.append("</tbody></table></div>")
    return "\n".join(out)


def _html_search(ctx: dict[str, Any], figures: list[Figure]) -> list[str]:
    """The search sections in HTML: the figure inline, the candidate's run_id and spec on hover."""
    by_name = {f.name: f for f in figures}
    out: list[str] = []
    for i, t in enumerate(_search_logs(ctx)):
        log = t["log"]
        out += [f'<h2 id="search-{i + 1}">{_e(_search_title(log))}</h2>', f"<p>{_e(_search_facts(log))}</p>"]
        out.append(_html_simple_table(list(FUNNEL_HEADER), _funnel_rows(log), num=_FUNNEL_NUM))
        f = by_name.get(t["figure"])
        if f is not None:
            out.append(_html_figure(f))
        for g in log["groups"]:
            out.append(f"<h3>{_e(_group_title(g))}</h3>")
            rows = _ranked_rows(log, g)
            out.append(
                _html_titled_table(_ranked_header(log["metric"]), rows, num=_RANKED_NUM)
                if rows
                else "<p>Nothing was measured.</p>"
            )
    return out


# --- Markdown ---------------------------------------------------------------------------------------------


def markdown(ctx: dict[str, Any]) -> str:
    """report.md; without the per-model tables when it would not fit GitHub's 1 MiB step-summary limit."""
    return prepare_markdown(ctx)(ctx["figures"])


def _trends_title(trends: dict[str, Any]) -> str:
    return f"Trends: {trends['metric']} from the results history ({len(trends['series'])} series)"


def _markdown_trends(ctx: dict[str, Any]) -> list[str]:
    """The trends table (`harness report --history`): one row per cell and machine; nothing without a history."""
    trends = ctx.get("trends")
    if trends is None:
        return []
    rows = [[text for text, _ in row] for row in trend_rows(trends)]
    body = md.table(TREND_HEADER, rows, right={2}) if rows else "The history has no run of these cells."
    return [f"## {_trends_title(trends)}", "", body, ""]


def _html_trends(ctx: dict[str, Any]) -> list[str]:
    """The trends table in HTML: each run's time and label on hover over the runs column, p-values over the
    change points."""
    trends = ctx.get("trends")
    if trends is None:
        return []
    out = [f'<h2 id="trends">{_e(_trends_title(trends))}</h2>']
    rows = trend_rows(trends)
    if not rows:
        return out + ["<p>The history has no run of these cells.</p>"]
    out.append(
        '<div class="scroll"><table><thead><tr>'
        + "".join(f"<th>{_e(h)}</th>" for h in TREND_HEADER)
        + "</tr></thead><tbody>"
    )
    for row in rows:
        out.append(
            "<tr>"
            + "".join(_td(text, cls="num" if i == 2 else "", title=title) for i, (text, title) in enumerate(row))
            + "</tr>"
        )
    out.append("</tbody></table></div>")
    return out


def prepare_markdown(ctx: dict[str, Any]) -> Callable[[list[Figure]], str]:
    """report.md in two steps, so the text is written while the figures draw: everything but the figures' list
    now (`ctx["figures"]` is not read), and the returned function adds that list and gives the page."""
    top, models = _markdown_top(ctx), _markdown_models(ctx, per_model=True)
    tail = _markdown_trends(ctx) + _markdown_tail(ctx)
    searched = _search_figure_names(ctx)

    def finish(figures: list[Figure]) -> str:
        search = _markdown_search(ctx, figures)
        shown = [f for f in figures if f.name not in searched]
        text = "\n".join(top + search + models + _markdown_figures(shown) + tail)
        if len(text.encode()) > MAX_MD_BYTES:
            text = "\n".join(top + search + _markdown_models(ctx, per_model=False) + _markdown_figures(shown) + tail)
        return text

    return finish


def _markdown_top(ctx: dict[str, Any]) -> list[str]:
    """Summary, warnings and the best-strategy table."""
    cells, best = ctx["cells"], ctx["best"]
    with_variant = "variant" in _row_keys(cells)
    out = [f"# Benchmark report: {ctx['name']}", ""]
    out += [f"- **{k}**: {md.escape(v)}" for k, v in _summary_items(ctx)] + [""]
    warnings = ctx["warnings"]
    if warnings:
        out += [f"## Warnings ({len(warnings)})", ""]
        out += [f"- {md.escape(_short(w, 400))}" for w in warnings[:MAX_MD_WARNINGS]]
        if len(warnings) > MAX_MD_WARNINGS:
            out.append(f"- … {len(warnings) - MAX_MD_WARNINGS} more (all are in index.html)")
        out.append("")
    out += ["## Best strategy per model and GPU count", ""]
    out += [
        md.table(
            _best_header(with_variant),
            _best_rows(best, with_variant=with_variant),
            right={1, 4 + with_variant, 5 + with_variant},
        ),
        "",
    ]
    return out


def _markdown_models(ctx: dict[str, Any], *, per_model: bool) -> list[str]:
    """The per-model tables (or the note on their absence)."""
    cells = ctx["cells"]
    best_keys = _best_keys(ctx["best"])
    out: list[str] = []
    label_cols = _row_keys(cells)
    if not per_model:
        out += [
            "## Per-model tables",
            "",
            f"Left out here: this page would exceed {MAX_MD_BYTES // 2**10} KiB "
            "(GitHub's step-summary limit is 1 MiB). They are in index.html; every record is in table.csv.",
            "",
        ]
    for model, mrecs in _records_by_model(cells).items() if per_model else ():
        out += [f"## Model {model}", ""]
        by_gpus: dict[Any, list[dict[str, Any]]] = {}
        for r in mrecs:
            by_gpus.setdefault(r["gpus"], []).append(r)
        for gpus, g in by_gpus.items():
            out += [f"### {model} · {_gpus_label(gpus)}", ""]
            rows = []
            columns = cell_columns([r["memory_measure"] == MEMORY_RSS for r in g], predicted=_any_predicted(g))
            for r in g:
                vals = [c.fmt(cell_value(r, c.key)) for c in columns]
                mark = _best_mark(r, best_keys)
                if mark:
                    vals[0] = f"**{vals[0]}** {mark[0]}"
                if r["status"] != "ok":
                    vals[-1] = f"**{r['status']}**"
                rows.append([r[k] or ABSENT for k in label_cols] + vals)
            header = [{"variant": "configuration"}.get(k, k) for k in label_cols] + [c.label for c in columns]
            out += [md.table(header, rows, right=set(range(len(label_cols), len(header) - 1))), ""]
    return out


def _markdown_figure(f: Figure) -> str:
    """One figure's list item: a link to its PNG, or why it was not drawn."""
    if f.png is None:
        return f"- **{f.title}**: not drawn. {md.escape(f.note)}"
    note = f" {md.escape(f.note)}" if f.note else ""
    return f"- [{f.title}]({f.name}.png): {md.escape(f.caption)}{note}"


def _markdown_figures(figures: list[Figure]) -> list[str]:
    out = ["## Figures", "", "PNG files next to this report (index.html has them inline):", ""]
    out += [_markdown_figure(f) for f in figures]
    out.append("")
    return out


def _markdown_tail(ctx: dict[str, Any]) -> list[str]:
    """Failed and skipped cells, notes on ok cells, definitions."""
    cells = ctx["cells"]
    failed = _failed_rows(cells, reason_limit=MAX_REASON_MD)
    out = [f"## Failed and skipped cells ({len(failed)})", ""]
    if failed:
        out.append(md.table(list(FAILED_COLUMNS), failed[:MAX_MD_FAILED_ROWS], right={4, 6}))
        if len(failed) > MAX_MD_FAILED_ROWS:
            out.append(f"\n… {len(failed) - MAX_MD_FAILED_ROWS} more in index.html and table.csv.")
    else:
        out.append("Every cell ran ok.")
    noted = _noted_rows(cells, reason_limit=MAX_REASON_MD)
    if noted:
        out += [
            "",
            f"## Notes on ok cells ({len(noted)})",
            "",
            md.table(list(NOTED_COLUMNS), noted[:MAX_MD_FAILED_ROWS], right={4}),
        ]
        if len(noted) > MAX_MD_FAILED_ROWS:
            out.append(f"\n… {len(noted) - MAX_MD_FAILED_ROWS} more in index.html and table.csv.")
    out += ["", "## Definitions", ""] + [f"- {d}" for d in DEFINITIONS] + [""]
    return out


# --- HTML -------------------------------------------------------------------------------------------------

_CSS = """
body { font: 14px/1.45 system-ui, -apple-system, "Segoe UI", Roboto, Helvetica, Arial, sans-serif;
       color: #1a1a1a; margin: 24px auto; max-width: 1600px; padding: 0 16px; }
h1 { font-size: 24px; margin-bottom: 4px; } h2 { font-size: 19px; margin-top: 32px; border-bottom: 1px solid #ddd; }
table { border-collapse: collapse; margin: 8px 0 16px; font-size: 12.5px; }
th, td { border: 1px solid #d0d0d0; padding: 3px 6px; vertical-align: top; }
th { background: #f1f1f1; font-weight: 600; }
td.num { text-align: right; font-variant-numeric: tabular-nums; white-space: nowrap; }
td.na { color: #888; } td.best { background: #e4f1fa; font-weight: 700; } td.tie { background: #f4f4f4; }
td.bad { color: #a33d00; font-weight: 600; } td.reason { max-width: 560px; white-space: pre-wrap;
  font-family: ui-monospace, SFMono-Regular, Menlo, monospace; font-size: 11.5px; }
th.group { text-align: center; background: #e6e6e6; } .scroll { overflow-x: auto; }
table.cells .lbl { position: sticky; left: 0; background: #fff; white-space: nowrap; z-index: 1; }
table.cells th.lbl { background: #f1f1f1; } table.cells th.m, table.cells th.rss { font-size: 11.5px;
  font-weight: 600; padding: 3px 4px; } table.cells td.num { padding: 3px 4px; }
dl.summary { display: grid; grid-template-columns: max-content auto; gap: 2px 14px; }
dl.summary dt { font-weight: 600; } dl.summary dd { margin: 0; }
figure { margin: 16px 0 28px; } figure img { max-width: 100%; height: auto; border: 1px solid #eee; }
figcaption { font-size: 13px; color: #333; max-width: 1100px; } .note { color: #7a4a00; }
span.pred { font-size: 10px; color: #555; white-space: normal; }
ul.warnings li { font-family: ui-monospace, SFMono-Regular, Menlo, monospace; font-size: 12px; }
"""

# Counts the figures the browser actually decoded and measures the widest model table (the Chromium test reads
# these from the DOM).
_SCRIPT = """
window.addEventListener("load", function () {
  var imgs = Array.prototype.slice.call(document.images);
  document.body.dataset.imagesLoaded = String(imgs.filter(function (i) {
    return i.complete && i.naturalWidth > 0; }).length);
  document.body.dataset.imagesTotal = String(imgs.length);
  var widths = Array.prototype.map.call(document.querySelectorAll("table.cells"), function (t) {
    return Math.ceil(t.getBoundingClientRect().width); });
  document.body.dataset.widestModelTable = String(widths.length ? Math.max.apply(null, widths) : 0);
  document.body.dataset.viewportWidth = String(document.documentElement.clientWidth);
  document.body.dataset.modelTablesScrolling = String(Array.prototype.filter.call(
    document.querySelectorAll("div.scroll"), function (d) {
      return d.querySelector("table.cells") && d.scrollWidth > d.clientWidth; }).length);
});
"""


def _e(s: Any) -> str:
    return html.escape(str(s), quote=True)


def _td(text: str, *, cls: str = "", title: str = "") -> str:
    if text == NA:
        cls = (cls + " na").strip()
    attrs = (f' class="{cls}"' if cls else "") + (f' title="{_e(title)}"' if title else "")
    return f"<td{attrs}>{_e(text)}</td>"


def _html_simple_table(
    header: list[str], rows: list[list[str]], *, num: Collection[int] = (), reason: Collection[int] = ()
) -> str:
    out = [
        '<div class="scroll"><table><thead><tr>' + "".join(f"<th>{_e(h)}</th>" for h in header) + "</tr></thead><tbody>"
    ]
    for row in rows:
        out.append(
            "<tr>"
            + "".join(_td(c, cls="num" if i in num else ("reason" if i in reason else "")) for i, c in enumerate(row))
            + "</tr>"
        )
    out.append("</tbody></table></div>")
    return "\n".join(out)


def _html_model_table(
    mrecs: list[dict[str, Any]], label_cols: list[str], best_keys: dict[tuple, tuple[str, str]]
) -> str:
    """One model's cells (`_records_by_model`): rows strategy · precision (· configuration), a column group per
    GPU count; the label column is sticky so it stays in view when the table scrolls sideways, and the headers
    wrap so the table fits a 1400 px window with two GPU counts."""
    gpus = sorted({r["gpus"] for r in mrecs})
    # NOTE: no prediction columns here (the table must fit 1400 px): the deviation is a second line under the
    # measured step median, the predicted time its tooltip
    columns = cell_columns([r["memory_measure"] == MEMORY_RSS for r in mrecs])
    label = " · ".join({"variant": "configuration"}.get(k, k) for k in label_cols)
    head1 = f'<th class="lbl" rowspan="2">{_e(label)}</th>' + "".join(
        f'<th class="group" colspan="{len(columns)}">{_e(_gpus_label(g))}</th>' for g in gpus
    )
    head2 = "".join(
        f'<th class="{"rss" if c is RSS_COLUMN else "m"}">{_e(c.label).replace("/", "/<wbr>")}</th>' for c in columns
    ) * len(gpus)
    out = [
        '<div class="scroll"><table class="cells"><thead>',
        f"<tr>{head1}</tr>",
        f"<tr>{head2}</tr>",
        "</thead><tbody>",
    ]
    by_cell = {(r["strategy"], r["precision"], r["variant"], r["gpus"]): r for r in mrecs}
    row_keys = list(dict.fromkeys((r["strategy"], r["precision"], r["variant"]) for r in mrecs))
    for s, p, v in row_keys:
        tds = [_td(" · ".join(x for x in [s, p, v][: len(label_cols)] if x), cls="lbl")]
        for g in gpus:
            r = by_cell.get((s, p, v, g))
            if r is None:
                tds += [_td(ABSENT, cls="na")] * len(columns)
                continue
            mark = _best_mark(r, best_keys)
            for c in columns:
                text = c.fmt(cell_value(r, c.key))
                if c.key == "status":
                    bad = r["status"] != "ok"
                    tds.append(_td(text, cls="bad" if bad else "", title=fmt_text(r["reason"]) if bad else ""))
                elif c.key == "tokens_per_s_per_gpu" and mark:
                    tds.append(
                        _td(f"{text} {mark[0]}", cls="num best" if mark[0] == STAR else "num tie", title=mark[1])
                    )
                elif c.key == "step_time_median_s" and not _null(r["predicted_step_time_s"]):
                    tds.append(_html_step_with_prediction(text, r))
                elif c.key == "mfu" and text == NA and isinstance(r["mfu_null_reason"], str):
                    tds.append(_td(text, cls="num", title=r["mfu_null_reason"]))
                else:
                    tds.append(_td(text, cls="num"))
        out.append("<tr>" + "".join(tds) + "</tr>")
    out.append("</tbody></table></div>")
    return "\n".join(out)


def _html_step_with_prediction(text: str, r: dict[str, Any]) -> str:
    """The measured step median's cell, with the deviation from the prediction as a second line and the
    predicted time (and the rates' source) on hover."""
    pred, dev = fmt_ms(r["predicted_step_time_s"]), r["step_time_deviation"]
    tip = f"predicted {pred} ms, measured {fmt_signed_pct(dev)} ({r['prediction_source'] or 'rates of unknown source'})"
    line = f"pred {pred}" if _null(dev) else f"{100.0 * dev:+.0f}% vs pred"  # NOTE: short: the table must fit
    return f'<td class="num" title="{_e(tip)}">{_e(text)}<br><span class="pred">{_e(line)}</span></td>'


def _html_figure(f: Figure) -> str:
    if f.png is None:
        return (
            f'<figure id="fig-{_e(f.name)}"><figcaption><b>{_e(f.title)}</b>: not drawn. '
            f'<span class="note">{_e(f.note)}</span></figcaption></figure>'
        )
    data = base64.b64encode(f.png).decode("ascii")
    note = f' <span class="note">{_e(f.note)}</span>' if f.note else ""
    return (
        f'<figure id="fig-{_e(f.name)}"><img alt="{_e(f.title)}" src="data:image/png;base64,{data}">'
        f"<figcaption><b>{_e(f.title)}.</b> {_e(f.caption)}{note}</figcaption></figure>"
    )


def html_page(ctx: dict[str, Any]) -> str:
    return prepare_html(ctx)(ctx["figures"])


def prepare_html(ctx: dict[str, Any]) -> Callable[[list[Figure]], str]:
    """index.html in two steps, as prepare_markdown: every table now (`ctx["figures"]` is not read); the
    returned function adds the figures (the body's data-figures count and the inline PNGs) and gives the page."""
    cells, best = ctx["cells"], ctx["best"]
    label_cols = _row_keys(cells)
    with_variant = "variant" in label_cols
    best_keys = _best_keys(best)
    head = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        f"<title>Benchmark report: {_e(ctx['name'])}</title>",
        f"<style>{_CSS}</style>",
        f"<script>{_SCRIPT}</script>",
        "</head>",
    ]
    out = [
        f"<h1>Benchmark report: {_e(ctx['name'])}</h1>",
        '<dl class="summary">' + "".join(f"<dt>{_e(k)}</dt><dd>{_e(v)}</dd>" for k, v in _summary_items(ctx)) + "</dl>",
    ]
    warnings = ctx["warnings"]
    if warnings:
        out += [f'<h2 id="warnings">Warnings ({len(warnings)})</h2>', '<ul class="warnings">']
        out += [f"<li>{_e(w)}</li>" for w in warnings] + ["</ul>"]
    out += [
        '<h2 id="best">Best strategy per model and GPU count</h2>',
        _html_simple_table(
            _best_header(with_variant),
            _best_rows(best, with_variant=with_variant),
            num={1, 4 + with_variant, 5 + with_variant, 7 + with_variant},
        ),
    ]
    models = []
    for model, mrecs in _records_by_model(cells).items():
        models += [
            f'<h2 id="model-{_e(model)}">Model {_e(model)}</h2>',
            _html_model_table(mrecs, label_cols, best_keys),
        ]
    failed = _failed_rows(cells, reason_limit=MAX_REASON_HTML, one_line=False)
    tail = [*_html_trends(ctx), f'<h2 id="failed">Failed and skipped cells ({len(failed)})</h2>']
    tail.append(
        _html_simple_table(list(FAILED_COLUMNS), failed, num={4, 6}, reason={7})
        if failed
        else "<p>Every cell ran ok.</p>"
    )
    noted = _noted_rows(cells, reason_limit=MAX_REASON_HTML, one_line=False)
    if noted:
        tail.append(f'<h2 id="notes">Notes on ok cells ({len(noted)})</h2>')
        tail.append(_html_simple_table(list(NOTED_COLUMNS), noted, num={4}, reason={5}))
    tail += ['<h2 id="definitions">Definitions</h2>', "<ul>"] + [f"<li>{_e(d)}</li>" for d in DEFINITIONS]
    tail += ["</ul>", "</body></html>", ""]
    before, top, after = "\n".join(head), "\n".join(out), "\n".join(models)
    searched = _search_figure_names(ctx)

    def finish(figures: list[Figure]) -> str:
        n_drawn = sum(f.png is not None for f in figures)
        body = [f'<body data-figures="{n_drawn}">', top, *_html_search(ctx, figures), after]
        body.append('<h2 id="figures">Figures</h2>')
        shown = (_html_figure(f) for f in figures if f.name not in searched)
        return "\n".join([before, *body, *shown, *tail])

    return finish
