"""What the report's pages show, but the figures: the summary, the warnings, every table (harness.report.table),
the definitions — built once from the report's data (`ReportData`) into one `Page`, which the templates write as
index.html and as report.md (harness.report.render).

The model tables differ by page on purpose: index.html has one table per model with a column group per GPU
count (the prediction as a second line under the step median), report.md one table per model and GPU count
(a column group per GPU count is too wide for Markdown; the prediction in its own columns).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from harness.plan.recommend import RECOMMENDED, RUNNER_UP, TIE, recommended_words, slower_words
from harness.report.formats import (
    ABSENT,
    NA,
    fmt_bytes,
    fmt_gib,
    fmt_int,
    fmt_ms,
    fmt_pct,
    fmt_signed_pct,
    fmt_text,
    fmt_tokens,
    gpus_label,
    is_null,
)
from harness.report.frame import MEMORY_RSS, PREDICTION_BAND, TRACES_SEP, in_timed_band
from harness.report.repredict import sources_text
from harness.report.search import SearchSection, search_sections
from harness.report.table import Cell, Column, Group, Table, text_cells
from harness.report.trends import TREND_HEADER, trend_rows
from harness.tune.log import TuneLog


@dataclass(frozen=True)
class ReportData:
    """What the pages are made from (harness.report.build)."""

    name: str
    dirs: tuple[Path, ...]
    frame: pd.DataFrame
    """one row per record"""
    cells: pd.DataFrame
    """one row per cell shown"""
    best: pd.DataFrame
    """frame.best_per_model_gpus"""
    warnings: tuple[str, ...]
    n_unreadable: int
    """how many of the warnings are on files that are not readable records"""
    trends: dict[str, Any] | None
    """harness.history.trends.trend_series' data (`harness report --history`), or None"""
    tune: tuple[tuple[TuneLog, str], ...]
    """(tune log, the name of its figure) per `harness tune` log (harness.report.tune)"""
    prediction_accuracy: dict[str, Any]
    """frame.prediction_accuracy of the cells shown"""
    generated_at: str
    out: Path | None = None
    """where the report is written: links to files beside the records are made relative to it"""


@dataclass(frozen=True)
class Trends:
    title: str
    table: Table | None
    """None: the history has no run of these cells"""


@dataclass(frozen=True)
class Page:
    """Everything index.html and report.md show but the figures."""

    name: str
    summary: tuple[tuple[str, str], ...]
    warnings: tuple[str, ...]
    best: Table
    html_models: tuple[tuple[str, Table], ...]
    """(model, its table: rows strategy · precision (· configuration), a column group per GPU count)"""
    markdown_models: tuple[tuple[str, tuple[tuple[str, Table], ...]], ...]
    """(model, (GPU count label, its table) per GPU count)"""
    failed: Table
    noted: Table
    """ok cells whose record carries a note; no rows: no section"""
    breakdown: Table
    """the traced cells' measured step-time parts beside the predicted ones, with links to their traces; no rows: no
    section"""
    breakdown_note: str
    trends: Trends | None
    search: tuple[SearchSection, ...]
    definitions: tuple[str, ...]


@dataclass(frozen=True)
class Metric:
    """A column of the model tables: the cell table's column `key`, its header, how its values are written."""

    key: str
    label: str
    fmt: Callable[[Any], str]


CELL_METRICS: tuple[Metric, ...] = (
    Metric("tokens_per_s_per_gpu", "tok/s/GPU", fmt_tokens),
    Metric("mfu", "MFU", fmt_pct),
    Metric("step_time_median_s", "step median (ms)", fmt_ms),
    Metric("step_time_p90_s", "step p90 (ms)", fmt_ms),
    Metric("predicted_step_time_s", "step predicted (ms)", fmt_ms),
    Metric("step_time_deviation", "measured vs predicted", fmt_signed_pct),
    Metric("peak_memory_allocated_gib", "mem alloc (GiB)", fmt_gib),
    Metric("peak_memory_reserved_gib", "mem reserved (GiB)", fmt_gib),
    Metric("predicted_memory_gib", "mem predicted (GiB)", fmt_gib),
    Metric("device_memory_gib", "capacity (GiB)", fmt_gib),
    Metric("comm_bytes_per_step", "collective bytes/step", fmt_bytes),
    Metric("status", "status", fmt_text),
)
"""the model tables' columns for cells measured on a device (CUDA)"""
RSS_METRIC = Metric("peak_rss_gib", "peak RSS, CPU process (GiB)", fmt_gib)
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


def cell_metrics(rss: list[bool], *, predicted: bool = False) -> tuple[Metric, ...]:
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
                out.append(RSS_METRIC)
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
    return any(not is_null(r["predicted_step_time_s"]) for r in recs)


def _records_by_model(cells: pd.DataFrame) -> dict[Any, list[dict[str, Any]]]:
    """The cells as dicts (only the columns the per-model tables show), grouped by model in the order the
    models come, each group in the cells' order: as cells.groupby("model", sort=False), in one to_dict instead
    of a DataFrame and a to_dict per group (0.3 s at 4,000 cells and 60 columns)."""
    out: dict[Any, list[dict[str, Any]]] = {}
    for r in cells[list(_PAGE_KEYS)].to_dict("records"):
        out.setdefault(r["model"], []).append(r)
    return out


def cell_value(r: dict[str, Any], key: str) -> Any:
    """A model-table value: a CPU cell's memory shows under RSS_METRIC only; its predicted memory (tensor
    bytes) is left out beside a measured RSS (table.csv has it)."""
    rss = r.get("memory_measure") == MEMORY_RSS
    if key == RSS_METRIC.key:
        return r["peak_memory_allocated_gib"] if rss else None
    if rss and key in _DEVICE_MEMORY_KEYS:
        return None
    return r[key]


def _row_keys(cells: pd.DataFrame) -> list[str]:
    return ["strategy", "precision"] + (["variant"] if (cells["variant"] != "").any() else [])


def _row_key_label(key: str) -> str:
    return {"variant": "configuration"}.get(key, key)


STAR = "★"
"""the fastest cell's mark in the model tables: STAR when it is faster than the next strategy beyond noise (or
there is no other strategy), TIE (harness.plan.recommend's) when the two are not distinguishable; no mark when the
lead was not judged (one run of a cell and no history: harness.report.leader)"""
Marks = dict[tuple, tuple[str, str]]
"""(model, gpus, strategy, precision, variant) of each fastest cell → (mark, hover text)"""


def _tied(b: dict[str, Any]) -> bool:
    return b.get("distinguishable") is False or b.get("distinguishable") == 0


def _crowned(b: dict[str, Any]) -> bool:
    """Faster than the next strategy beyond noise, or the only strategy that ran ok (not: the only one measured
    with the most steps, beside others measured with fewer, which were not compared: the row says so)."""
    if b.get("distinguishable") is True or b.get("distinguishable") == 1:
        return True
    return is_null(b.get("runner_up")) and is_null(b.get("basis"))


def _best_marks(best: pd.DataFrame) -> Marks:
    marks = {}
    for b in best.dropna(subset=["strategy"]).to_dict("records"):
        key = (b["model"], b["gpus"], b["strategy"], b["precision"], b["variant"])
        if _tied(b):
            marks[key] = (
                TIE,
                f"fastest, but not distinguishable from {b['runner_up']} · {b['runner_up_precision']} ({b['verdict']})",
            )
        elif _crowned(b):
            marks[key] = (STAR, "best strategy for this model and GPU count")
    return marks


def _best_mark(rec: Any, marks: Marks) -> tuple[str, str] | None:
    return marks.get((rec["model"], rec["gpus"], rec["strategy"], rec["precision"], rec["variant"]))


# --- the summary and the best-strategy table ---------------------------------------------------------------


def summary_items(data: ReportData) -> tuple[tuple[str, str], ...]:
    df, cells = data.frame, data.cells
    statuses = df["status"].value_counts()

    def uniq(col: str) -> str:
        vals = sorted({str(v) for v in df[col].dropna().unique()})
        return ", ".join(vals[:8]) + (f" … ({len(vals)} in all)" if len(vals) > 8 else "") if vals else NA

    return (
        ("generated", data.generated_at),
        ("result dirs", ", ".join(map(str, data.dirs))),
        ("records", f"{len(df)} loaded, {data.n_unreadable} file(s) not readable as records; {len(cells)} cells shown"),
        ("statuses", ", ".join(f"{n} {s}" for s, n in statuses.items())),
        ("sweeps", uniq("sweep")),
        ("clusters", uniq("cluster")),
        ("devices", uniq("device_name")),
        ("harness commits", uniq("harness_git_sha")),
        ("predictions", sources_text(df["prediction_source"].tolist())),
        *_accuracy_item(data.prediction_accuracy),
        *_part_accuracy_item(data.prediction_accuracy),
    )


def _accuracy_item(acc: dict[str, Any]) -> list[tuple[str, str]]:
    """The time model's accuracy over the cells shown, when any has a prediction beside its measurement."""
    if not (acc or {}).get("cells"):
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


def _part_accuracy_item(acc: dict[str, Any]) -> list[tuple[str, str]]:
    """Each predicted part's error against the traced cells' measured parts, when any cell was traced."""
    parts = (acc or {}).get("by_part") or {}
    if not parts:
        return []
    text = ", ".join(f"{p} {a:.1%} ({b:+.1%})" for p, (a, b) in parts.items())
    inside = f"{acc.get('in_band', 0)} traced inside their timed p10–p90"
    untraced = acc.get("untraced") or {}
    if untraced.get("cells"):
        inside += f"; the untraced steps beside them inside it in {untraced['in_band']} of {untraced['cells']}"
    if acc.get("profiler_cost"):
        median, lo, hi = acc["profiler_cost"]
        inside += f"; the profiler's cost, traced / untraced: median {median:.2f}×, {lo:.2f}–{hi:.2f}×"
    return [
        (
            "time model per part",
            f"over {acc['traced_cells']} traced cells ({inside}), mean |predicted − measured| as a share of the "
            f"traced step (mean predicted − measured): {text}",
        )
    ]


def _statuses_text(statuses: dict[str, int]) -> str:
    return ", ".join(f"{n} {s}" for s, n in sorted(statuses.items(), key=lambda kv: (-kv[1], kv[0])))


def _basis_text(b: dict[str, Any]) -> str:
    """What the row's lead was judged on (harness.report.leader.BASES): repeated runs, a history's between-run
    noise, or nothing (one run)."""
    basis = b.get("basis")
    if is_null(b.get("runner_up")) or is_null(basis):
        return ABSENT
    return {"runs": "repeated runs", "history": "history noise"}.get(str(basis), "not judged")


def _shorter_text(b: dict[str, Any]) -> str:
    """'; 6 with fewer than 5 steps not compared' when cells that ran ok were timed with fewer steps than the
    contest's (harness.report.leader.contenders), else ''."""
    n = b.get("n_shorter")
    if is_null(n) or not n:
        return ""
    return f"; {int(n)} with fewer than {b['measure_steps']:g} steps not compared"


def best_table(best: pd.DataFrame, *, with_variant: bool) -> Table:
    """One row per (model, GPU count): the recommended strategy (the fastest measured), the runner-up (the fastest
    other strategy) and how much slower it is, with what the lead was judged on; a lead within the noise reads
    'a ≈ b' (never crown noise). The words are harness.plan.recommend's, as `harness plan` and `harness tune` say
    them."""
    v = int(with_variant)
    header = (
        ["model", "GPUs", RECOMMENDED, "precision"]
        + (["configuration"] if with_variant else [])
        + ["tok/s/GPU", "MFU", RUNNER_UP, f"{RUNNER_UP} is", "judged on", "cells ok"]
    )
    # NOTE: the gap is laid out as a number in the HTML (on one line) but left-aligned in the Markdown
    columns = tuple(
        Column(h, right=i in (1, 4 + v, 5 + v), cls="num" if i == 7 + v else "") for i, h in enumerate(header)
    )
    rows = []
    for b in best.to_dict("records"):
        if is_null(b["strategy"]):
            rows.append(
                [str(b["model"]), fmt_int(b["gpus"]), "none ran ok", ABSENT]
                + ([ABSENT] if with_variant else [])
                + [NA, NA, ABSENT, ABSENT, ABSENT, f"0 of {b['n_cells']} ({_statuses_text(b['statuses'])})"]
            )
            continue
        ru = ABSENT if is_null(b["runner_up"]) else f"{b['runner_up']} · {b['runner_up_precision']}"
        gap = ABSENT if is_null(b["margin"]) else f"{slower_words(b['margin'])} ({b['verdict']})"
        if is_null(b["runner_up"]) and not is_null(b.get("verdict")):  # others ran with fewer steps only
            gap = f"not judged ({b['verdict']})"
        tied = _tied(b)  # NOTE: never crown noise: the leader and the runner-up share the row's first column
        strategy = recommended_words(str(b["strategy"]), tied_with=str(b["runner_up"]) if tied else None)
        if tied:
            gap = f"{TIE} {gap}"
        rows.append(
            [str(b["model"]), fmt_int(b["gpus"]), strategy, str(b["precision"])]
            + ([str(b["variant"] or ABSENT)] if with_variant else [])
            + [fmt_tokens(b["tokens_per_s_per_gpu"]), fmt_pct(b["mfu"]), ru, gap, _basis_text(b)]
            + [f"{b['n_ok']} of {b['n_cells']}" + _shorter_text(b)]
        )
    return Table(columns, tuple(text_cells(r) for r in rows))


# --- the model tables --------------------------------------------------------------------------------------


def _html_step_with_prediction(text: str, r: dict[str, Any]) -> Cell:
    """The measured step median's cell, with the deviation from the prediction as a second line and the
    predicted time (and the rates' source) on hover."""
    pred, dev = fmt_ms(r["predicted_step_time_s"]), r["step_time_deviation"]
    tip = f"predicted {pred} ms, measured {fmt_signed_pct(dev)} ({r['prediction_source'] or 'rates of unknown source'})"
    line = f"pred {pred}" if is_null(dev) else f"{100.0 * dev:+.0f}% vs pred"  # NOTE: short: the table must fit
    return Cell(text, title=tip, note=line)


def _html_cells(r: dict[str, Any], metrics: tuple[Metric, ...], mark: tuple[str, str] | None) -> list[Cell]:
    """One cell's values in the HTML model table: the status's reason and a null MFU's reason on hover, the
    best mark after the throughput, the prediction under the step median."""
    out = []
    for c in metrics:
        text = c.fmt(cell_value(r, c.key))
        if c.key == "status":
            bad = r["status"] != "ok"
            out.append(Cell(text, cls="bad", title=fmt_text(r["reason"])) if bad else Cell(text))
        elif c.key == "tokens_per_s_per_gpu" and mark:
            out.append(Cell(text, mark=mark[0], cls="num best" if mark[0] == STAR else "num tie", title=mark[1]))
        elif c.key == "step_time_median_s" and not is_null(r["predicted_step_time_s"]):
            out.append(_html_step_with_prediction(text, r))
        elif c.key == "mfu" and text == NA and isinstance(r["mfu_null_reason"], str):
            out.append(Cell(text, title=r["mfu_null_reason"]))
        else:
            out.append(Cell(text))
    return out


def html_model_table(mrecs: list[dict[str, Any]], label_cols: list[str], marks: Marks) -> Table:
    """One model's cells (`_records_by_model`): rows strategy · precision (· configuration), a column group per
    GPU count; the label column is sticky so it stays in view when the table scrolls sideways, and the headers
    wrap so the table fits a 1400 px window with two GPU counts."""
    gpus = sorted({r["gpus"] for r in mrecs})
    # NOTE: no prediction columns here (the table must fit 1400 px): the deviation is a second line under the
    # measured step median, the predicted time its tooltip
    metrics = cell_metrics([r["memory_measure"] == MEMORY_RSS for r in mrecs])
    label = " · ".join(_row_key_label(k) for k in label_cols)
    per_gpus = [Column(c.label, right=c.key != "status", head_cls="rss" if c is RSS_METRIC else "m") for c in metrics]
    columns = (Column(label, cls="lbl", head_cls="lbl"), *per_gpus * len(gpus))
    by_cell = {(r["strategy"], r["precision"], r["variant"], r["gpus"]): r for r in mrecs}
    rows = []
    for s, p, v in dict.fromkeys((r["strategy"], r["precision"], r["variant"]) for r in mrecs):
        row = [Cell(" · ".join(x for x in [s, p, v][: len(label_cols)] if x))]
        for g in gpus:
            r = by_cell.get((s, p, v, g))
            if r is None:
                row += [Cell(ABSENT, cls="na")] * len(metrics)
            else:
                row += _html_cells(r, metrics, _best_mark(r, marks))
        rows.append(tuple(row))
    groups = tuple(Group(gpus_label(g), len(metrics)) for g in gpus)
    return Table(columns, tuple(rows), groups=groups, cls="cells")


def markdown_model_tables(
    mrecs: list[dict[str, Any]], label_cols: list[str], marks: Marks
) -> tuple[tuple[str, Table], ...]:
    """One model's cells as one table per GPU count (GPU count label, table): the best cell's throughput bold
    with its mark, a status other than ok bold; the prediction's columns when a cell of that count has one."""
    by_gpus: dict[Any, list[dict[str, Any]]] = {}
    for r in mrecs:
        by_gpus.setdefault(r["gpus"], []).append(r)
    out = []
    for gpus, g in by_gpus.items():
        metrics = cell_metrics([r["memory_measure"] == MEMORY_RSS for r in g], predicted=_any_predicted(g))
        header = [_row_key_label(k) for k in label_cols] + [c.label for c in metrics]
        columns = tuple(Column(h, right=len(label_cols) <= i < len(header) - 1) for i, h in enumerate(header))
        rows = []
        for r in g:
            vals = [Cell(c.fmt(cell_value(r, c.key))) for c in metrics]
            mark = _best_mark(r, marks)
            if mark:
                vals[0] = Cell(vals[0].text, mark=mark[0], strong=True)
            if r["status"] != "ok":
                vals[-1] = Cell(str(r["status"]), strong=True)
            rows.append((*text_cells([r[k] or ABSENT for k in label_cols]), *vals))
        out.append((gpus_label(gpus), Table(columns, tuple(rows))))
    return tuple(out)


# --- failed cells, noted cells, definitions -----------------------------------------------------------------

_LISTED_COLUMNS = ("model", "strategy", "precision", "variant", "gpus", "status", "failed_rank", "reason", "path")
"""the columns the failed/noted cell lists show"""


def failed_table(cells: pd.DataFrame) -> Table:
    """Every cell whose status is not ok, with its failed rank and reason."""
    header = ("model", "strategy", "precision", "configuration", "GPUs", "status", "failed rank", "reason", "record")
    columns = tuple(
        Column(h, right=i in (4, 6), cls="reason" if h == "reason" else "", long_text=h == "reason")
        for i, h in enumerate(header)
    )
    bad = cells[cells["status"] != "ok"]
    rows = [
        text_cells(
            [
                str(r["model"]),
                str(r["strategy"]),
                str(r["precision"]),
                r["variant"] or ABSENT,
                fmt_int(r["gpus"]),
                str(r["status"]),
                fmt_int(r["failed_rank"]),
                fmt_text(r["reason"]),
                Path(r["path"]).name,
            ]
        )
        for r in bad[list(_LISTED_COLUMNS)].to_dict("records")  # NOTE: only these: to_dict of 60 columns was slow
    ]
    return Table(columns, tuple(rows))


BREAKDOWN_PARTS: tuple[tuple[str, str], ...] = (
    ("compute", "compute"),
    ("recompute", "recompute"),
    ("optimizer", "optimizer"),
    ("comm_exposed", "comm exposed"),
    ("other", "other"),
    ("comm_total", "comm total"),
)
"""(part, its header) of the breakdown table: the parts that add up to the step, then the communication in all"""
BREAKDOWN_NOTE = (
    "Each cell with trace: true ran five more steps under torch.profiler after its timed steps; the median one's "
    "parts (the slowest rank's, metrics.time_s) add up to that traced step and stand beside the time model's "
    "(predicted.time_s). "
    "Each value is measured / predicted, in ms; spread: slowest − fastest rank's traced step. How a part is read "
    "from a trace: docs/time-model.md, Measured breakdown. The traces (one per rank) open in ui.perfetto.dev. "
    "traced / timed: the traced step over the timed steps' median, and whether it lies inside their p10–p90. "
    "Three untraced steps ran just before the traced ones and three just after: untraced / timed is their median "
    "over the timed median, and traced / untraced is the profiler's own cost (the traced steps' median over "
    "theirs). A traced step outside the timed p10–p90 beside untraced steps outside it too: the host's pace moved "
    "between the timed steps and the traced ones, not the profiler; a traced / untraced well above 1: the profiler "
    "slowed the step, and the parts are those of a slower step than the timed ones. With few timed steps the band "
    "is narrow (five steps' p10–p90 leaves out most of the gap to the fastest and the slowest), so read traced / "
    "timed beside untraced / timed."
)


def breakdown_table(cells: pd.DataFrame, *, out: Path | None) -> Table:
    """The traced cells: traced step and timed median, each part measured / predicted (ms), the spread over ranks,
    and a link to each rank's trace (relative to `out`, the report's folder)."""
    header = (
        "model",
        "strategy",
        "precision",
        "configuration",
        "GPUs",
        "traced step (ms)",
        "timed median (ms)",
        "traced / timed",
        "untraced / timed",
        "traced / untraced",
        *(f"{h} (ms) meas. / pred." for _, h in BREAKDOWN_PARTS),
        "spread (ms)",
        "traces",
    )
    columns = tuple(Column(h, right=4 <= i < len(header) - 1) for i, h in enumerate(header))
    traced = cells[cells["measured_step_s"].notna()]
    rows = []
    for r in traced.to_dict("records"):
        parts = [
            Cell(f"{fmt_ms(r[f'measured_{p}_s'])} / {fmt_ms(r.get(f'predicted_{p}_s'))}") for p, _ in BREAKDOWN_PARTS
        ]
        paths = str(r["traces"]).split(TRACES_SEP) if not is_null(r["traces"]) else []
        links = tuple((f"rank{k}", _href(path, out)) for k, path in enumerate(paths))
        rows.append(
            (
                *text_cells(
                    [
                        str(r["model"]),
                        str(r["strategy"]),
                        str(r["precision"]),
                        r["variant"] or ABSENT,
                        fmt_int(r["gpus"]),
                    ]
                ),
                Cell(fmt_ms(r["measured_step_s"])),
                Cell(fmt_ms(r["step_time_median_s"])),
                Cell(traced_vs_timed(r)),
                Cell(traced_vs_timed(r, column="untraced_step_s")),
                Cell(NA if is_null(r.get("profiler_cost")) else f"{float(r['profiler_cost']):.2f}×"),
                *parts,
                Cell(fmt_ms(r["measured_spread_s"])),
                Cell("" if links else NA, links=links),
            )
        )
    return Table(columns, tuple(rows))


def traced_vs_timed(r: dict[str, Any], *, column: str = "measured_step_s") -> str:
    """'1.06× in p10–p90' or '1.62× outside p10–p90': the traced step (or another step time's `column`: the
    untraced neighbours') over the timed median, and whether it lies in the timed steps' p10–p90 (inclusive); NA
    without it, a timed median or band."""
    values = [r.get(c) for c in (column, "step_time_median_s", "step_time_p10_s", "step_time_p90_s")]
    if any(is_null(v) for v in values):
        return NA
    traced, median, p10, p90 = (float(v) for v in values if v is not None)
    if not median > 0:
        return NA
    where = "in" if in_timed_band(traced, p10, p90) else "outside"
    return f"{traced / median:.2f}× {where} p10–p90"


def _href(path: str, out: Path | None) -> str:
    """`path` (where the report's reader found the file) as a link from the report's folder."""
    if out is None:
        return Path(path).as_posix()
    return Path(os.path.relpath(Path(path).resolve(), Path(out).resolve())).as_posix()


def noted_table(cells: pd.DataFrame) -> Table:
    """ok cells whose record carries a note in `reason` (e.g. torch.compile recompiled during the measured
    steps): their numbers stand, with a caveat the reader must see."""
    header = ("model", "strategy", "precision", "configuration", "GPUs", "note", "record")
    columns = tuple(
        Column(h, right=i == 4, cls="reason" if h == "note" else "", long_text=h == "note")
        for i, h in enumerate(header)
    )
    noted = cells[(cells["status"] == "ok") & cells["reason"].map(lambda v: isinstance(v, str) and bool(v.strip()))]
    rows = [
        text_cells(
            [
                str(r["model"]),
                str(r["strategy"]),
                str(r["precision"]),
                r["variant"] or ABSENT,
                fmt_int(r["gpus"]),
                fmt_text(r["reason"]),
                Path(r["path"]).name,
            ]
        )
        for r in noted[list(_LISTED_COLUMNS)].to_dict("records")
    ]
    return Table(columns, tuple(rows))


def trends_section(trends: dict[str, Any] | None) -> Trends | None:
    """The trends table (`harness report --history`): one row per cell and machine; each run's time and label
    on hover over the runs column, p-values over the change points."""
    if trends is None:
        return None
    title = f"Trends: {trends['metric']} from the results history ({len(trends['series'])} series)"
    rows = tuple(tuple(Cell(text, title=hover) for text, hover in row) for row in trend_rows(trends))
    columns = tuple(Column(h, right=i == 2) for i, h in enumerate(TREND_HEADER))
    return Trends(title, Table(columns, rows) if rows else None)


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
    "Best strategy: the recommended cell is the fastest measured: highest tok/s/GPU among cells with status ok, over "
    "all precisions and configurations, a cell's tok/s/GPU being the median of its runs (the model tables show its "
    "last run), and only cells timed with the most steps compared (a harness tune search's shorter rounds, a sweep's "
    "shorter cells: counted under 'cells ok', not compared); the runner-up is the fastest other strategy, 'N% "
    "slower' its time for the same tokens over the recommended one's (harness plan and harness tune use the same "
    "words); the lead is judged on runs, never on one run's steps (timing "
    "noise is mostly between runs): with 3 or more runs of each cell (harness sweep --repeat), compare's run-level "
    "test (Welch t-test on the log tokens/s/GPU of the runs); else, with harness report --history DB, the two cells' "
    "between-run noise in that history; else the lead is shown but not judged ('single run: lead not judged', "
    "no ★). p ≥ 0.05: the two are not distinguishable, shown 'a ≈ b' and marked ≈ instead of ★ in the model "
    "tables. The 'judged on' column says which basis each row used.",
    "Scaling efficiency: tok/s/GPU at N GPUs divided by tok/s/GPU at the smallest GPU count where that "
    "strategy and precision ran ok.",
    "n/a: the record has no value (null); —: the cell is not in the results.",
)
"""authored text, shown as written (also in the Markdown: `|x|` is an absolute value there, not a table)"""


def build_page(data: ReportData) -> Page:
    """The page of `data`: every section but the figures, for both index.html and report.md."""
    cells = data.cells
    label_cols = _row_keys(cells)
    marks = _best_marks(data.best)
    by_model = _records_by_model(cells)
    return Page(
        name=data.name,
        summary=summary_items(data),
        warnings=data.warnings,
        best=best_table(data.best, with_variant="variant" in label_cols),
        html_models=tuple((str(m), html_model_table(recs, label_cols, marks)) for m, recs in by_model.items()),
        markdown_models=tuple((str(m), markdown_model_tables(recs, label_cols, marks)) for m, recs in by_model.items()),
        failed=failed_table(cells),
        noted=noted_table(cells),
        breakdown=breakdown_table(cells, out=data.out),
        breakdown_note=BREAKDOWN_NOTE,
        trends=trends_section(data.trends),
        search=search_sections(data.tune),
        definitions=DEFINITIONS,
    )
