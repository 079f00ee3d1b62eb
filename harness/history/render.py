"""The faces of `history check` (a terminal table, Markdown, JSON, github-action-benchmark entries) and of
`history show` (series per cell, as a table or JSON).

Every regression is printed with its evidence: tonight's value, the history's level and noise, how far out it
is against the margin it had to leave, and the change point it is attributed to (when, the label it was added
with, what changed in the software or machine there).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import asdict
from typing import Any

from harness.compare.metrics import DEVIATION
from harness.compare.render import BENCHMARK_METRICS, dumps_json, fmt_value
from harness.core import markdown as md
from harness.core.errors import InputError, Problem
from harness.history.keys import HISTORY_METRICS_BY_NAME, iso
from harness.history.verdicts import (
    FAILING,
    IMPROVEMENT,
    INSUFFICIENT,
    JUDGED,
    NEW_CELL,
    NEWLY_FAILING,
    REGRESSION,
    SHIFTED,
    STILL_FAILING,
    CellVerdict,
    ChangePointInfo,
    HistoryCheck,
    MetricVerdict,
)

NOTABLE = (REGRESSION, IMPROVEMENT, SHIFTED)
_ORDER = {REGRESSION: 0, IMPROVEMENT: 1, SHIFTED: 2}


def _pct(v: float | None, *, signed: bool = False) -> str:
    if v is None:
        return "-"
    return f"{v * 100:+.1f}%" if signed else f"{v * 100:.1f}%"


def _change(m: MetricVerdict) -> str:
    """The change from the level: relative (`+28.3%`), or in points for the time model's deviation (`+18.0 pt`)."""
    if m.metric == DEVIATION and m.change is not None:
        return f"{m.change * 100:+.1f} pt"
    return _pct(m.change, signed=True)


def _fmt_rules(check: HistoryCheck) -> str:
    r = check.rules
    extra = [f"{k} {v * 100:g}%" for k, v in r.thresholds.items() if k != "default"]
    threshold = f"{r.thresholds['default'] * 100:g}%" + (f" ({', '.join(extra)})" if extra else "")
    return (
        f"noise band {r.k:g}σ and threshold {threshold}; >= {r.min_history} history values; last {r.window} runs; "
        f"change points: E-Divisive means, permutation test alpha {r.alpha:g} ({r.permutations} shuffles), "
        f"shift > max({r.shift:g}σ, threshold) within the last {r.recent} runs"
    )


def describe_change_point(cp: ChangePointInfo | None, unit: str) -> str:
    if cp is None:
        return ""
    when = "tonight" if cp.nights_ago == 0 else f"{cp.nights_ago} run(s) ago"
    text = f"{when} ({iso(cp.time)}"
    if cp.label:
        text += f", label {cp.label!r}"
    if cp.harness_sha:
        text += f", harness {cp.harness_sha}"
    text += f"): {fmt_value(unit, cp.before)} → {fmt_value(unit, cp.after)}"
    if cp.p_value is not None:
        text += f", p={cp.p_value:.3g}"
    if cp.changes:
        text += f"; changed there: {'; '.join(cp.changes)}"
    return text


def evidence(cell: CellVerdict, m: MetricVerdict) -> str:
    """One line naming the cell and metric with every number the verdict rests on."""
    if m.cause == "exact change":
        return (
            f"{cell.label} {m.metric}: {fmt_value(m.unit, m.value, 12)} (was {fmt_value(m.unit, m.reference, 12)}; "
            f"deterministic: any change counts); changed {describe_change_point(m.change_point, m.unit)}"
        )
    sig = "-" if m.sigmas is None else f"{m.sigmas:+.1f}σ"
    why = f"; {m.note}" if m.metric == DEVIATION and m.note else ""
    return (
        f"{cell.label} {m.metric}: {fmt_value(m.unit, m.value)} vs history median {fmt_value(m.unit, m.reference)} "
        f"({_change(m)}{why}); noise σ {_pct(m.noise)} over {m.n_history} runs; {sig} "
        f"against a margin of {_pct(m.margin)}; {m.cause}: {describe_change_point(m.change_point, m.unit)}"
    )


HEADERS = ["cell", "metric", "value", "history median", "noise σ", "deviation", "change", "margin", "verdict"]


def _row(cell: CellVerdict, m: MetricVerdict) -> list[str]:
    sig = "-" if m.sigmas is None else f"{m.sigmas:+.1f}σ"
    verdict = m.verdict + (f" ({m.cause})" if m.cause else "") + (f" ({m.note})" if m.note else "")
    return [
        cell.label,
        m.metric,
        fmt_value(m.unit, m.value),
        fmt_value(m.unit, m.reference),
        _pct(m.noise),
        sig,
        _change(m),
        _pct(m.margin),
        verdict,
    ]


def _rows(check: HistoryCheck, *, all_rows: bool) -> list[tuple[CellVerdict, MetricVerdict]]:
    rows = [(c, m) for c in check.cells for m in c.metrics if all_rows or m.verdict in NOTABLE]
    if not all_rows:
        rows.sort(key=lambda cm: _ORDER.get(cm[1].verdict, 9))
    return rows


def _cell_sections(check: HistoryCheck) -> list[tuple[str, list[str]]]:
    def failing(c: CellVerdict) -> str:
        return f"{c.label}: {c.last_status} in the history → {c.status} tonight"

    def young(c: CellVerdict) -> str | None:
        short = [m for m in c.metrics if m.verdict == INSUFFICIENT and m.cause is None]
        if c.state != JUDGED or not short:
            return None
        return f"{c.label}: {max(m.n_history for m in short)} history value(s) ({', '.join(m.metric for m in short)})"

    return [
        ("newly failing (regression)", [failing(c) for c in check.cells if c.state == NEWLY_FAILING]),
        (
            "time-model deviation shifted (information; --watch-deviation PCT fails when |deviation| grew by more "
            "than PCT points)",
            [evidence(c, m) for c in check.cells for m in c.metrics if m.verdict == SHIFTED],
        ),
        ("too little history (reported, never failing)", [y for c in check.cells if (y := young(c)) is not None]),
        ("still failing", [failing(c) for c in check.cells if c.state == STILL_FAILING]),
        ("new cells (no history: judged from tomorrow)", [c.label for c in check.cells if c.state == NEW_CELL]),
        ("failing, no history", [f"{c.label}: {c.status}" for c in check.cells if c.state == FAILING]),
        ("re-run to confirm (--confirm)", [_confirmed(c) for c in check.cells if c.confirm is not None]),
        ("notes", [f"{c.label}: {n}" for c in check.cells for n in c.notes]),
    ]


def _confirmed(c: CellVerdict) -> str:
    k = c.confirm or {}
    first = ", ".join(k.get("first") or [])
    if k.get("persisted"):
        return f"{c.label}: flagged ({first}); still regressed over {k.get('runs')} re-run(s): a regression"
    return f"{c.label}: flagged ({first}); not over {k.get('runs')} re-run(s): a one-off, not failing"


def _verdict_line(check: HistoryCheck) -> str:
    s = check.summary()
    parts = [
        f"{s['regressions']} cell(s) regressed ({s['metric_regressions']} metric(s), {s['newly_failing']} newly "
        "failing)",
        f"{s['improvements']} improvement(s)",
    ]
    if s["confirmed"] or s["not_confirmed"]:
        parts.append(
            f"--confirm: {s['confirmed']} cell(s) still regressed on re-running, {s['not_confirmed']} not "
            "(one-off: not failing)"
        )
    if s["insufficient_history"]:
        parts.append(f"{s['insufficient_history']} value(s) with too little history (reported, never failing)")
    if s["deviation_shifts"]:
        parts.append(f"{s['deviation_shifts']} time-model deviation shift(s) (information)")
    return "result: " + ", ".join(parts) + f" → exit {check.exit_code()}"


def render_table(check: HistoryCheck, *, all_rows: bool = False) -> str:
    lines = [
        f"history:  {check.db}",
        f"tonight:  {', '.join(check.sources) or '<records>'} ({check.records} records, {len(check.cells)} cells)",
        _fmt_rules(check),
        "",
    ]
    rows = _rows(check, all_rows=all_rows)
    if rows:
        table = [HEADERS] + [_row(c, m) for c, m in rows]
        widths = [max(len(r[i]) for r in table) for i in range(len(HEADERS) - 1)]
        for r in table:
            lines.append("  ".join(v.ljust(w) for v, w in zip(r, widths)) + "  " + r[-1])
    else:
        lines.append("no metric left its noise band")
    if check.regressions:
        lines += ["", "evidence:"] + [f"  {evidence(c, m)}" for c, m in check.regressions]
    for title, items in _cell_sections(check):
        if items:
            lines += ["", f"{title} ({len(items)}):"] + [f"  {i}" for i in items]
    if check.warnings:
        lines += ["", "warnings:"] + [f"  {w}" for w in check.warnings]
    lines += ["", _verdict_line(check)]
    return "\n".join(lines) + "\n"


def render_markdown(check: HistoryCheck, *, all_rows: bool = False) -> str:
    s = check.summary()
    head = f"🔴 {s['regressions']} cell(s) regressed" if check.has_regression else "🟢 no regressions"
    lines = [
        f"## Benchmark history check: {head}",
        "",
        f"Tonight `{', '.join(check.sources) or '<records>'}` ({check.records} records, {len(check.cells)} cells) "
        f"against the history `{md.escape(check.db)}`. {md.escape(_fmt_rules(check))}.",
        "",
    ]
    notable = _rows(check, all_rows=False)
    if notable:
        lines += ["### Changes", "", md.table(HEADERS, [_row(c, m) for c, m in notable]), ""]
    else:
        lines += ["No metric left its noise band.", ""]
    if check.regressions:
        lines += ["### Evidence", ""] + [f"- {md.escape(evidence(c, m))}" for c, m in check.regressions] + [""]
    for title, items in _cell_sections(check):
        if items:
            lines += [f"### {title[0].upper()}{title[1:]} ({len(items)})", ""]
            lines += [f"- {md.escape(i)}" for i in items] + [""]
    if check.warnings:
        lines += ["### Warnings", ""] + [f"- {md.escape(w)}" for w in check.warnings] + [""]
    if all_rows:
        every = _rows(check, all_rows=True)
        lines += ["### All values", "", md.table(HEADERS, [_row(c, m) for c, m in every]), ""]
    lines.append(f"_{_verdict_line(check)}_")
    return "\n".join(lines) + "\n"


def render_json(check: HistoryCheck) -> str:
    return dumps_json(check.to_dict(), default=str) + "\n"


def benchmark_entries(check: HistoryCheck, direction: str) -> list[dict[str, Any]]:
    """github-action-benchmark `customSmallerIsBetter` / `customBiggerIsBetter` entries: tonight's values, one per ok
    cell and measured metric, named `<run_id> <metric>`, the range ± the history's noise."""
    if direction not in BENCHMARK_METRICS:
        raise InputError([Problem("--direction", "", f"{direction!r} is not one of smaller, bigger")])
    entries = []
    for cell in check.cells:
        rows = {m.metric: m for m in cell.metrics}
        for name in BENCHMARK_METRICS[direction]:
            m = rows.get(name)
            if m is None or m.value is None:
                continue
            entry: dict[str, Any] = {"name": f"{cell.run_id} {name}", "unit": m.unit, "value": m.value}
            if m.noise:
                entry["range"] = f"± {m.noise * m.value:.4g}"
            extra = f"{cell.label}; {m.verdict}"
            if m.reference is not None:
                extra += f"; history median {m.reference:.6g}"
            if m.verdict == REGRESSION:
                extra += f"; {m.cause}: {describe_change_point(m.change_point, m.unit)}"
            entry["extra"] = extra
            entries.append(entry)
    return entries


def render_benchmark(check: HistoryCheck, direction: str) -> str:
    return json.dumps(benchmark_entries(check, direction), indent=2, allow_nan=False) + "\n"


# --------------------------------------------------------------------------------------------------
# history show

SHOW_COLUMNS = (
    "step_time_s",
    "tokens_per_s",
    "tflops_per_gpu",
    "peak_memory_allocated_gib",
    "comm.bytes_per_step",
    DEVIATION,
)


_SHOW_HEADERS = {DEVIATION: "model deviation"}
"""column headers of `history show` that differ from the metric's name"""


def render_show_table(series: Sequence[Mapping[str, Any]]) -> str:
    if not series:
        return "no cell matches\n"
    lines: list[str] = []
    for s in series:
        machine = s["machine"]
        where = " · ".join(str(v) for v in (machine.get("cluster"), machine.get("device_name")) if v)
        lines.append(f"{s['label']}  [{where}]  {s['run_id']}  ({len(s['runs'])} runs)")
        shifts = {cp["index"]: cp for cp in s["change_points"].get("step_time_s", [])}
        drifts = {cp["index"]: cp for cp in s["change_points"].get(DEVIATION, [])}
        header = ["time", "label", "status", *(_SHOW_HEADERS.get(n, n) for n in SHOW_COLUMNS), "harness", ""]
        table = [header]
        for i, run in enumerate(s["runs"]):
            values = run["values"]
            cells = [
                fmt_value(HISTORY_METRICS_BY_NAME[name].unit, values.get(name)) if name in values else "-"
                for name in SHOW_COLUMNS
            ]
            marks = [f"◆ step time shifted (p={shifts[i]['p_value']:.3g})"] if i in shifts else []
            if i in drifts:
                d = drifts[i]
                marks.append(
                    f"◇ model deviation shifted {d['before'] * 100:+.1f}% → {d['after'] * 100:+.1f}% "
                    f"(p={d['p_value']:.3g})"
                )
            mark = "; ".join(marks)
            table.append(
                [run["time"], run["label"] or "", run["status"], *cells, run["software"].get("harness_sha") or "", mark]
            )
        widths = [max(len(r[i]) for r in table) for i in range(len(header) - 1)]
        lines += ["  " + "  ".join(v.ljust(w) for v, w in zip(r, widths)) + "  " + r[-1] for r in table]
        lines.append("")
    return "\n".join(lines)


def render_show_json(series: Sequence[Mapping[str, Any]]) -> str:
    return json.dumps({"series": list(series)}, indent=2, allow_nan=False, default=str) + "\n"


def change_points_json(cps: Sequence[Any]) -> list[dict[str, Any]]:
    return [asdict(c) for c in cps]
