"""The four faces of a `Comparison`: a plain-text table for the terminal, GitHub-flavoured Markdown for
$GITHUB_STEP_SUMMARY and PR comments, compare.json, and github-action-benchmark entries (one file per direction).

Numbers are formatted here and only here, with enough digits that two different values never print the same.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from json.encoder import encode_basestring_ascii as _encode_str
from typing import Any

from harness.compare.comparison import (
    ADDED,
    BOTH_OK,
    IMPROVEMENT,
    INFO,
    NA,
    NOT_JUDGED,
    NOT_SIGNIFICANT,
    REGRESSION,
    UNCHANGED,
    VERDICTS,
    CellComparison,
    Comparison,
    MetricComparison,
)
from harness.compare.metrics import (
    DEVIATION,
    EXACT,
    METRICS_BY_NAME,
    SAMPLED,
    WATCHED,
    metric_samples,
    metric_value,
    step_samples,
)
from harness.compare.stats import half_spread
from harness.core import markdown as md
from harness.core.errors import InputError, Problem

# github-action-benchmark: measured metrics only (predicted ones are model arithmetic, not measurements)
BENCHMARK_METRICS = {
    "smaller": ("step_time_s", "peak_memory_allocated_gib", "peak_memory_reserved_gib", "comm.bytes_per_step"),
    "bigger": ("tokens_per_s", "tokens_per_s_per_gpu", "mfu"),
}
BENCHMARK_FILES = {"smaller": "benchmark-smaller.json", "bigger": "benchmark-bigger.json"}
FORMAT_FILES = {"table": "compare.txt", "md": "compare.md", "json": "compare.json"}


def fmt_value(unit: str, v: float | None, digits: int = 4) -> str:
    """A metric value in its unit, for people (compare's and the history's renderers)."""
    if v is None:
        return "null"
    if unit == "s":
        return f"{v * 1e3:.{digits}g} ms" if abs(v) < 1 else f"{v:.{digits}g} s"
    if unit == "bytes":
        return f"{int(v):,} B" if float(v).is_integer() else f"{v:.{digits}g} B"
    if unit == "fraction":
        return f"{v * 100:.{max(digits - 2, 1)}f}%"
    if unit.startswith("tokens"):
        return f"{v:,.0f}" if abs(v) >= 1000 and digits <= 6 else f"{v:.{digits}g}"
    return f"{v:.{digits}g} {unit}"


def _fmt_pair(row: MetricComparison) -> tuple[str, str]:
    """Baseline and candidate formatted with enough digits that different values never print the same."""
    for digits in (4, 6, 9, 12, 17):
        b, c = fmt_value(row.unit, row.baseline, digits), fmt_value(row.unit, row.candidate, digits)
        if b != c or row.baseline == row.candidate:
            return b, c
    return b, c


def _fmt_change(row: MetricComparison) -> tuple[str, str]:
    """(ratio, change): exact metrics show the delta in their unit, others the relative change."""
    if row.baseline is None or row.candidate is None:
        return "-", "-"
    if row.kind == WATCHED:  # a deviation is already relative: its change is in percentage points
        return "-", f"{(row.candidate - row.baseline) * 100:+.1f} pt"
    ratio = "-" if row.ratio is None else f"{row.ratio:.3f}x"
    if row.kind == EXACT:
        delta = row.candidate - row.baseline
        if row.unit == "bytes" and float(delta).is_integer():
            return ratio, f"{int(delta):+,} B"
        return ratio, f"{delta:+.6g} {row.unit}"
    return ratio, "-" if row.change is None else f"{row.change * 100:+.1f}%"


def _fmt_p(row: MetricComparison) -> str:
    return "-" if row.p_value is None else f"{row.p_value:.2g}"


def _fmt_threshold(limits: Mapping[str, float]) -> str:
    text = f"{limits['default'] * 100:g}%"
    extra = [f"{k} {v * 100:g}%" for k, v in limits.items() if k != "default"]
    return text + (f" ({', '.join(extra)})" if extra else "")


NOTABLE = (REGRESSION, IMPROVEMENT, NOT_JUDGED, NOT_SIGNIFICANT)
_ORDER = {v: i for i, v in enumerate(VERDICTS)}  # the worst first
CELL_VERDICTS = {
    REGRESSION: "regressed",
    NOT_JUDGED: "reported, not judged",
    NOT_SIGNIFICANT: "not significant",
    IMPROVEMENT: "improved",
    UNCHANGED: "unchanged",
    INFO: "info",
    NA: "n/a",
}
"""how a cell's headline words each verdict of its metrics: `regressed (4 metrics), improved (1 metric)`"""


def _plural(n: int, word: str) -> str:
    return word if n == 1 else f"{word}s"


def _count(n: int, word: str) -> str:
    return f"{n} {_plural(n, word)}"


def _cell_groups(cmp: Comparison, *, all_rows: bool) -> list[tuple[CellComparison, list[MetricComparison]]]:
    """Each cell with the metrics listed under it: the notable ones (worst verdict first; the cells ordered by
    their worst metric, stable), or with `all_rows` every metric of every cell, in cell and metric order."""
    if all_rows:
        return [(c, list(c.metrics)) for c in cmp.cells if c.metrics]
    groups = []
    for c in cmp.cells:
        rows = sorted((m for m in c.metrics if m.verdict in NOTABLE), key=lambda m: _ORDER[m.verdict])
        if rows:
            groups.append((c, rows))
    groups.sort(key=lambda g: _ORDER[g[1][0].verdict])
    return groups


def _cell_headline(rows: Sequence[MetricComparison]) -> str:
    """`regressed (4 metrics)`, `regressed (1 metric), improved (1 metric)`: the verdicts of a cell's rows."""
    counts = dict.fromkeys(VERDICTS, 0)
    for m in rows:
        counts[m.verdict] += 1
    return ", ".join(f"{CELL_VERDICTS[v]} ({_count(n, 'metric')})" for v, n in counts.items() if n)


def _basis(cell: CellComparison) -> str:
    """` [run-level: 3 vs 3 runs]` after a cell's headline: what its timing was judged on ('' when nothing)."""
    return f" [{cell.basis}]" if cell.basis else ""


def _row_cells(m: MetricComparison) -> list[str]:
    """A metric's row under its cell: metric, baseline, candidate, ratio, change, p, verdict (and note)."""
    b, c = _fmt_pair(m)
    ratio, change = _fmt_change(m)
    return [m.metric, b, c, ratio, change, _fmt_p(m), m.verdict + (f" ({m.note})" if m.note else "")]


HEADERS = ["cell", "metric", "baseline", "candidate", "ratio", "change", "p", "verdict"]


def _md_rows(groups: list[tuple[CellComparison, list[MetricComparison]]]) -> list[list[str]]:
    """Markdown table rows: a row naming each cell and its headline, its metrics' rows under it."""
    out = []
    for cell, rows in groups:
        out.append([f"**{cell.label}**: {_cell_headline(rows)}{_basis(cell)}"] + [""] * (len(HEADERS) - 1))
        out += [["", *_row_cells(m)] for m in rows]
    return out


def _of(metrics: int, cells: int, word: str) -> str:
    """` (5 metrics, 1 newly failing)`: what a count of cells is made of ('' when nothing)."""
    parts = ([_count(metrics, "metric")] if metrics else []) + ([f"{cells} {word}"] if cells else [])
    return f" ({', '.join(parts)})" if parts else ""


def _verdict_line(cmp: Comparison, *, fail_on_missing: bool) -> str:
    s = cmp.summary()
    code = cmp.exit_code(fail_on_missing=fail_on_missing)
    regressed = _of(s["metric_regressions"], s["newly_failing"], "newly failing")
    improved = _of(s["metric_improvements"], s["newly_fixed"], "newly fixed")
    parts = [
        f"{_count(s['regressions'], 'cell')} regressed{regressed}",
        f"{_count(s['improvements'], 'cell')} improved{improved}",
    ]
    if s["not_judged"]:
        parts.append(
            f"{_count(s['not_judged_cells'], 'cell')} with timing changes reported, not judged (fewer than "
            f"{cmp.min_runs} runs a side){_of(s['not_judged'], 0, '')}"
        )
    if s["not_significant"]:
        parts.append(
            f"{_count(s['not_significant_cells'], 'cell')} with changes not significant"
            f"{_of(s['not_significant'], 0, '')}"
        )
    if fail_on_missing and s["missing"]:
        parts.append(f"{_count(s['missing'], 'missing cell')} (--fail-on-missing)")
    return "result: " + ", ".join(parts) + f" → exit {code}"


def _cell_sections(cmp: Comparison) -> list[tuple[str, list[str]]]:
    def failing(c: CellComparison) -> str:
        return f"{c.label}: {c.baseline_status} → {c.candidate_status}" + (
            f" ({c.reason('candidate')})" if c.reason("candidate") else ""
        )

    def fixed(c: CellComparison) -> str:
        return f"{c.label}: {c.baseline_status} → ok" + (
            f" (was: {c.reason('baseline')})" if c.reason("baseline") else ""
        )

    def still(c: CellComparison) -> str:
        return f"{c.label}: {c.baseline_status} → {c.candidate_status}" + (
            f" ({c.reason('candidate')})" if c.reason("candidate") else ""
        )

    def plain(c: CellComparison) -> str:
        rec = c.baseline or c.candidate
        status = None if rec is None else rec.status
        return f"{c.label} [{status}]" + (f" — {'; '.join(c.notes)}" if c.notes else "")

    return [
        ("newly failing (regression)", [failing(c) for c in cmp.newly_failing]),
        ("newly fixed (improvement)", [fixed(c) for c in cmp.newly_fixed]),
        ("missing (only in baseline)", [plain(c) for c in cmp.missing]),
        ("added (only in candidate)", [plain(c) for c in cmp.added]),
        ("still failing", [still(c) for c in cmp.still_failing]),
        # an ok candidate's note is a caveat on the numbers compared above (e.g. a recompilation timed as step time)
        (
            "candidate ok cells with a note",
            [
                f"{c.label}: {c.reason('candidate')}"
                for c in cmp.cells
                if c.candidate is not None and c.candidate_status == "ok" and c.reason("candidate")
            ],
        ),
    ]


DEVIATION_TITLE = "time-model deviation (measured median / predicted − 1; information"
"""the title of the per-cell deviation section (the table's and Markdown's); the rule follows it"""


def _deviation_title(cmp: Comparison) -> str:
    watch = cmp.watch_deviation
    rule = (
        f"a regression when |deviation| grew by more than {watch:g} points (--watch-deviation)"
        if watch is not None
        else "never a regression: --watch-deviation PCT fails on growth"
    )
    return f"{DEVIATION_TITLE}; {rule})"


def _deviation_row(cell: CellComparison) -> MetricComparison | None:
    return next((m for m in cell.metrics if m.metric == DEVIATION), None)


def _fmt_deviation(row: MetricComparison) -> str:
    """`+12.0% → +30.0% (+18.0 pt; |deviation| grew by 18.0 points)`, or the null note."""
    if row.baseline is None or row.candidate is None:
        return f"n/a ({row.note})" if row.note else "n/a"
    text = f"{row.baseline * 100:+.1f}% → {row.candidate * 100:+.1f}% ({_fmt_change(row)[1]}; {row.note})"
    return text + (" — REGRESSION" if row.verdict == REGRESSION else "")


def _deviation_lines(cmp: Comparison) -> list[str]:
    """One line per matched ok cell that has the deviation row: `label: baseline → candidate (change)`; cells
    where both sides are null are left out (no prediction: the cluster has no calibration), and counted."""
    out, both_null = [], 0
    for cell in cmp.cells:
        row = _deviation_row(cell)
        if row is None:
            continue
        if row.baseline is None and row.candidate is None:
            both_null += 1
            continue
        out.append(f"{cell.label}: {_fmt_deviation(row)}")
    if out and both_null:
        out.append(f"({_count(both_null, 'cell')} without a prediction on either side)")
    return out


def _sources(paths: Sequence[str]) -> str:
    return ", ".join(paths) if paths else "<records>"


def _timing_rule(cmp: Comparison) -> str:
    """How timing was judged ('; '-led), or '' when no timing metric was (`--metric exact`)."""
    if not any(m.kind == SAMPLED for c in cmp.cells for m in c.metrics):
        return ""
    return (
        f"; timing judged on run-level values (each run's median): two-sided Welch t-test on their logs, "
        f"Holm-adjusted over the cells, p < {cmp.alpha:g}, >= {cmp.min_runs} runs per side (fewer: reported, not "
        "judged)"
    )


def _runs_line(cmp: Comparison) -> str:
    """How many matched ok cells had how many runs a side: `runs per cell: 6 cells 3 vs 3`."""
    counts: dict[tuple[int, int], int] = {}
    for c in cmp.cells:
        if c.runs is not None:
            counts[c.runs] = counts.get(c.runs, 0) + 1
    if not counts:
        return ""
    return "runs per cell (baseline vs candidate): " + ", ".join(
        f"{_count(n, 'cell')} {b} vs {k}" for (b, k), n in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))
    )


def render_table(cmp: Comparison, *, all_rows: bool = False, fail_on_missing: bool = False) -> str:
    """Plain-text report for a terminal."""
    s = cmp.summary()
    lines = [
        f"baseline:  {_sources(cmp.baseline_sources)} ({cmp.baseline_records} records)",
        f"candidate: {_sources(cmp.candidate_sources)} ({cmp.candidate_records} records)",
        f"threshold {_fmt_threshold(cmp.thresholds)}{_timing_rule(cmp)}; {s['matched']} matched, "
        f"{s['added']} added, {s['missing']} missing",
    ]
    runs = _runs_line(cmp)
    lines += [runs, ""] if runs else [""]
    groups = _cell_groups(cmp, all_rows=all_rows)
    if groups:
        # each cell's line, then its metrics' rows indented under it, in columns shared by every cell
        header = ["cell / metric", *HEADERS[2:]]
        rows = [["  " + r[0], *r[1:]] for _, ms in groups for r in map(_row_cells, ms)]
        widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header) - 1)]

        def line(r: list[str]) -> str:
            return "  ".join(v.ljust(w) for v, w in zip(r, widths)) + "  " + r[-1]

        lines.append(line(header))
        rows_left = iter(rows)
        for cell, ms in groups:
            lines.append(f"{cell.label}: {_cell_headline(ms)}{_basis(cell)}")
            lines += [line(next(rows_left)) for _ in ms]
    else:
        lines.append("no metric changed beyond its threshold")
    for title, items in _cell_sections(cmp):
        if items:
            lines += ["", f"{title} ({len(items)}):"] + [f"  {i}" for i in items]
    deviation = _deviation_lines(cmp)
    if deviation:
        lines += ["", f"{_deviation_title(cmp)}:"] + [f"  {i}" for i in deviation]
    notes = [(c.label, n) for c in cmp.matched for n in c.notes if c.state == BOTH_OK]
    if notes and (cmp.regressions or all_rows):
        lines += ["", "environment changes:"] + [f"  {label}: {n}" for label, n in notes]
    if cmp.warnings:
        lines += ["", "warnings:"] + [f"  {w}" for w in cmp.warnings]
    lines += ["", _verdict_line(cmp, fail_on_missing=fail_on_missing)]
    return "\n".join(lines) + "\n"


def render_markdown(cmp: Comparison, *, all_rows: bool = False, fail_on_missing: bool = False) -> str:
    """GitHub-flavoured Markdown for $GITHUB_STEP_SUMMARY and PR comments."""
    s = cmp.summary()
    code = cmp.exit_code(fail_on_missing=fail_on_missing)
    head = (
        f"🔴 {_count(s['regressions'], 'cell')} regressed"
        if cmp.has_regression
        else "🟠 missing cells"
        if code
        else "🟢 no regressions"
    )
    lines = [
        f"## Benchmark comparison: {head}",
        "",
        f"Baseline `{_sources(cmp.baseline_sources)}` ({cmp.baseline_records} records) vs candidate "
        f"`{_sources(cmp.candidate_sources)}` ({cmp.candidate_records} records). "
        f"Threshold {_fmt_threshold(cmp.thresholds)}{_timing_rule(cmp)}; deterministic metrics compare "
        "exactly." + (f" {_runs_line(cmp)}." if _runs_line(cmp) else ""),
        "",
        f"**{s['matched']}** matched · **{s['added']}** added · **{s['missing']}** missing · "
        f"**{s['regressions']}** {_plural(s['regressions'], 'cell')} regressed"
        f"{_of(s['metric_regressions'], s['newly_failing'], 'newly failing')} · "
        f"**{s['improvements']}** improved{_of(s['metric_improvements'], s['newly_fixed'], 'newly fixed')} · "
        f"**{s['not_judged_cells']}** reported, not judged{_of(s['not_judged'], 0, '')} · "
        f"**{s['not_significant_cells']}** not significant{_of(s['not_significant'], 0, '')}",
        "",
    ]
    notable = _cell_groups(cmp, all_rows=False)
    if notable:
        lines += ["### Changes", "", md.table(HEADERS, _md_rows(notable)), ""]
    else:
        lines += ["No metric changed beyond its threshold.", ""]
    for title, items in _cell_sections(cmp):
        if items:
            lines += [f"### {title[0].upper()}{title[1:]} ({len(items)})", ""]
            lines += [f"- {md.escape(i)}" for i in items] + [""]
    deviation = _deviation_lines(cmp)
    if deviation:
        title = _deviation_title(cmp)
        lines += [f"### {title[0].upper()}{md.escape(title[1:])}", ""]
        lines += [f"- {md.escape(i)}" for i in deviation] + [""]
    if cmp.warnings:
        lines += ["### Warnings", ""] + [f"- {md.escape(w)}" for w in cmp.warnings] + [""]
    every = _cell_groups(cmp, all_rows=True)
    if every:
        table = md.table(HEADERS, _md_rows(every))
        if all_rows:
            lines += ["### All comparisons", "", table, ""]
        else:
            n = sum(len(ms) for _, ms in every)
            lines += [f"<details><summary>All {n} metric comparisons</summary>", "", table]
            lines += ["", "</details>", ""]
    lines.append(f"_{_verdict_line(cmp, fail_on_missing=fail_on_missing)}_")
    return "\n".join(lines) + "\n"


def _json_float(v: float) -> str:
    if math.isfinite(v):
        return float.__repr__(v)
    raise ValueError("Out of range float values are not JSON compliant: " + repr(v))


def _json_key(key: Any) -> str:
    if isinstance(key, str):
        return key
    if isinstance(key, float):
        return _json_float(key)
    if key is True or key is False or key is None:
        return {True: "true", False: "false", None: "null"}[key]
    if isinstance(key, int):
        return int.__repr__(key)
    raise TypeError(f"keys must be str, int, float, bool or None, not {key.__class__.__name__}")


def _json_scalar(o: Any) -> str | None:
    """The JSON of a plain str, float, int, bool or None (exact types: the common case); None for others."""
    t = type(o)
    if t is str:
        return _encode_str(o)
    if t is float:
        return _json_float(o)
    if o is None:
        return "null"
    if t is int:
        return int.__repr__(o)
    if t is bool:
        return "true" if o else "false"
    return None


def _put_json(o: Any, level: int, out: list[str], default: Callable[[Any], Any] | None) -> None:
    """Append `o` as json.dumps(o, indent=2, allow_nan=False, default=default) spells it at depth `level`."""
    text = _json_scalar(o)
    if text is not None:
        out.append(text)
    elif isinstance(o, str):
        out.append(_encode_str(o))
    elif o is None:
        out.append("null")
    elif o is True:
        out.append("true")
    elif o is False:
        out.append("false")
    elif isinstance(o, int):
        out.append(int.__repr__(o))
    elif isinstance(o, float):
        out.append(_json_float(o))
    elif isinstance(o, (list, tuple)):
        if not o:
            out.append("[]")
            return
        indent = "\n" + "  " * (level + 1)
        sep = "[" + indent
        for value in o:
            text = _json_scalar(value)
            if text is None:
                out.append(sep)
                _put_json(value, level + 1, out, default)
            else:
                out.append(sep + text)
            sep = "," + indent
        out.append("\n" + "  " * level + "]")
    elif isinstance(o, dict):
        if not o:
            out.append("{}")
            return
        indent = "\n" + "  " * (level + 1)
        sep = "{" + indent
        for key, value in o.items():
            head = sep + _encode_str(key if type(key) is str else _json_key(key)) + ": "
            text = _json_scalar(value)
            if text is None:
                out.append(head)
                _put_json(value, level + 1, out, default)
            else:
                out.append(head + text)
            sep = "," + indent
        out.append("\n" + "  " * level + "}")
    elif default is None:
        raise TypeError(f"Object of type {o.__class__.__name__} is not JSON serializable")
    else:
        _put_json(default(o), level, out, default)


def dumps_json(obj: Any, *, default: Callable[[Any], Any] | None = None) -> str:
    """json.dumps(obj, indent=2, allow_nan=False, default=default), the same text, several times faster: the
    standard library's indenting encoder is Python generators, one per value (compare.json holds ~15 values per
    metric of every cell). Cycles are not detected (compare's data has none)."""
    out: list[str] = []
    _put_json(obj, 0, out, default)
    return "".join(out)


def render_json(cmp: Comparison, *, fail_on_missing: bool = False) -> str:
    d = cmp.to_dict()
    d["exit_code"] = cmp.exit_code(fail_on_missing=fail_on_missing)
    return dumps_json(d, default=str) + "\n"


def benchmark_entries(cmp: Comparison, direction: str) -> list[dict[str, Any]]:
    """github-action-benchmark `customSmallerIsBetter` (direction smaller) or `customBiggerIsBetter` (bigger)
    entries: the candidate's measured values, one per ok cell and metric, named `<run_id> <metric>`, a cell's
    entries together; a cell with notable verdicts ends each of its entries' extra with its headline."""
    if direction not in BENCHMARK_METRICS:
        raise InputError([Problem("--direction", "", f"{direction!r} is not one of smaller, bigger")])
    entries = []
    for cell in cmp.cells:
        rec = cell.candidate
        if rec is None or not rec.ok:
            continue
        rows = {m.metric: m for m in cell.metrics}
        notable = [m for m in cell.metrics if m.verdict in NOTABLE]
        headline = (f"; cell {_cell_headline(notable)}" if notable else "") + (f"; {cell.basis}" if cell.basis else "")
        times = step_samples(rec)
        for name in BENCHMARK_METRICS[direction]:
            metric = METRICS_BY_NAME[name]
            row = rows.get(name)
            # NOTE: the median of the cell's runs where it was compared (one run: its value)
            value = row.candidate if row is not None and row.candidate is not None else metric_value(rec, metric)
            if value is None:
                continue
            entry: dict[str, Any] = {
                "name": f"{rec.run_id or cell.label} {name}",
                "unit": metric.unit,
                "value": value,
            }
            spread = half_spread(metric_samples(rec, metric, times=times)) if metric.kind == SAMPLED else None
            if spread is not None:
                entry["range"] = f"± {spread:.4g}"
            if row is not None and row.baseline is not None:
                ratio = _fmt_change(row)[0]
                extra = f"{cell.label}; baseline {row.baseline:.6g}; ratio {ratio}; {row.verdict}"
                if row.p_value is not None:
                    extra += f"; p={row.p_value:.2g}"
            else:
                extra = f"{cell.label}; " + ("new cell" if cell.state == ADDED else "no baseline value")
            deviation = _deviation_row(cell)
            if name == "step_time_s" and deviation is not None and deviation.candidate is not None:
                # NOTE: the deviation has no good direction for one tool kind: it rides on the step time's entry
                extra += f"; time-model deviation {_fmt_deviation(deviation)}"
            entry["extra"] = extra + headline
            entries.append(entry)
    return entries


def render_benchmark(cmp: Comparison, direction: str) -> str:
    return dumps_json(benchmark_entries(cmp, direction)) + "\n"
