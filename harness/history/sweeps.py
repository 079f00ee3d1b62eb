"""Sweeps' results dirs and the history: their records as entries (`read_entries`), added to the history
(`add_sweeps`, `harness history add`) or judged against it (`check_sweeps`, `harness history check`, with
--confirm's re-runs from harness.history.confirm), and what each command prints.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from harness.compare.load import iter_side
from harness.compare.metrics import parse_thresholds
from harness.compare.outputs import Echo
from harness.compare.run import OptionConflict
from harness.core.errors import InputError, Problem
from harness.history.confirm import confirm as confirm_regressions
from harness.history.judge import check_entries
from harness.history.keys import Entry, entry_of
from harness.history.render import render_benchmark, render_json, render_markdown, render_table
from harness.history.store import database_errors, open_store
from harness.history.verdicts import Rules
from harness.results.store import atomic_write_text


def read_entries(paths: Sequence[Path]) -> tuple[list[Entry], int, list[str]]:
    """(entries, records read, warnings) of the records under `paths`; InputError when there are none."""
    problems: list[Problem] = []
    notes: list[str] = []
    entries = []
    records = 0
    for rec in iter_side(paths, side="results", problems=problems, notes=notes):
        records += 1
        try:
            entries.append(entry_of(rec))
        except ValueError as e:
            notes.append(f"skipped {rec.path}: {e}")
    if problems:
        raise InputError(problems)
    return entries, records, notes


def add_sweeps(db: str, results_dirs: Sequence[Path], *, label: str | None, echo: Echo) -> int:
    """Add every record under `results_dirs` to the history `db` (created when absent), in one transaction; the
    warnings to stderr, then one line of what was added. Returns the exit code (0)."""
    entries, records, notes = read_entries(results_dirs)
    with database_errors(db):
        with open_store(db, create=True) as store:
            result = store.add(entries, label=label, source=", ".join(str(p) for p in results_dirs))
    for n in notes:
        echo(f"warning: {n}", err=True)
    cells = len({e.cell for e in entries})
    echo(
        f"added {result.added} run(s) of {cells} cell(s) to {db}"
        + (f" ({result.already} already there)" if result.already else "")
        + (f"; {result.new_cells} new cell(s)" if result.new_cells else "")
        + (f"; label {label!r}" if label and result.added else "")
    )
    return 0


def check_sweeps(
    db: str,
    results_dirs: Sequence[Path],
    *,
    fmt: str,
    direction: str | None,
    output: Path | None,
    threshold_args: Sequence[str],
    sigmas: float,
    min_history: int,
    window: int,
    recent: int,
    all_rows: bool,
    watch_deviation: float | None,
    confirm: int,
    echo: Echo,
) -> int:
    """Judge the records under `results_dirs` against the history `db` (which is not changed); with `confirm` K,
    the flagged cells re-run K times and judged on those runs. The rendering to stdout (and `output`), then the
    warnings to stderr; returns the exit code (0, or 1 with a regression). The options are `harness history
    check`'s; OptionConflict for those that do not go together."""
    if fmt == "github-benchmark" and direction is None:
        raise OptionConflict("--format github-benchmark writes one tool kind: add --direction smaller|bigger")
    if direction is not None and fmt != "github-benchmark":
        raise OptionConflict("--direction only applies to --format github-benchmark")
    rules = Rules(
        k=sigmas,
        min_history=min_history,
        window=window,
        recent=recent,
        thresholds=parse_thresholds(threshold_args),
        watch_deviation=watch_deviation,
    ).checked()
    if confirm != 0:
        from harness.launch.sweep import check_repeat

        check_repeat(confirm, option="--confirm")
    entries, records, notes = read_entries(results_dirs)
    with database_errors(db):
        with open_store(db) as store:
            check = check_entries(store, entries, rules=rules, sources=[str(p) for p in results_dirs], records=records)
            if confirm and check.has_regression:
                check = confirm_regressions(
                    store, check, times=confirm, rules=rules, echo=lambda line: echo(line, err=True)
                )
    check.warnings[:0] = notes
    if direction is not None:
        text = render_benchmark(check, direction)
    else:
        text = {"table": render_table, "md": render_markdown, "json": render_json}[fmt](
            check, **({} if fmt == "json" else {"all_rows": all_rows})
        )
    echo(text, nl=False)
    if output is not None:
        atomic_write_text(output, text)
    for w in check.warnings:
        echo(f"warning: {w}", err=True)
    return check.exit_code()
