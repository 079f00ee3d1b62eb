"""`harness history add|show|check`: a results history that sweeps are added to, and nightly judgement against it.

    harness history add   --db DB RESULTS_DIR [--label TEXT]
    harness history show  --db DB [--cell FILTER] [--format table|json]
    harness history check --db DB RESULTS_DIR [--format table|md|json|github-benchmark]

DB is a SQLite file (created by the first `add`) or a postgresql:// URL (harness.history.store). `check` exits 0
without a regression, 1 with one (each named with its evidence), 2 for bad input.
"""

from __future__ import annotations

import contextlib
import sqlite3
from collections.abc import Iterator, Sequence
from pathlib import Path

import click

from harness.compare.load import iter_side
from harness.compare.metrics import DEFAULT_THRESHOLD, THRESHOLD_METRICS, parse_thresholds
from harness.compare.render import BENCHMARK_FILES
from harness.core.errors import InputError, Problem
from harness.history.judge import Rules, check_entries
from harness.history.keys import Entry, entry_of
from harness.history.render import (
    render_benchmark,
    render_json,
    render_markdown,
    render_show_json,
    render_show_table,
    render_table,
)
from harness.history.show import show_series
from harness.history.store import open_store
from harness.results.store import atomic_write_text

DB_HELP = "The history: a SQLite file, or a postgresql://user@host:port/dbname URL."


@contextlib.contextmanager
def _database_errors(db: str) -> Iterator[None]:
    """A database failing mid-command (read-only file, locked past the timeout, a dropped connection) is one
    line naming the database, exit 2; never a traceback."""
    try:
        yield
    except sqlite3.DatabaseError as e:
        text = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        if "readonly" in text:
            text += " (a read-only file or directory?)"
        raise InputError([Problem(db, "", text)]) from None
    except Exception as e:
        if type(e).__module__.split(".")[0] != "psycopg":
            raise
        text = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise InputError([Problem(db, "", text)]) from None


def _entries(paths: Sequence[Path]) -> tuple[list[Entry], int, list[str]]:
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
            notes.append(f"skipped {rec.get('_path')}: {e}")
    if problems:
        raise InputError(problems)
    return entries, records, notes


@click.group("history")
def history_group() -> None:
    """A results history (SQLite or PostgreSQL): add sweeps to it, show its series, check a new sweep against it."""


@history_group.command("add")
@click.option("--db", required=True, help=DB_HELP)
@click.argument("results_dirs", nargs=-1, required=True, type=click.Path(path_type=Path), metavar="RESULTS_DIR...")
@click.option("--label", help="A label for these runs (e.g. the commit under test); shown where a series shifts.")
def add_command(db: str, results_dirs: tuple[Path, ...], label: str | None) -> int:
    """Add every record under RESULTS_DIR to the history DB (created when absent).

    One transaction: all of the records or none. Records already in the history (the same run of the same cell)
    are left as they are, so adding a sweep twice changes nothing."""
    entries, records, notes = _entries(results_dirs)
    with _database_errors(db):
        with open_store(db, create=True) as store:
            result = store.add(entries, label=label, source=", ".join(str(p) for p in results_dirs))
    for n in notes:
        click.echo(f"warning: {n}", err=True)
    cells = len({e.cell for e in entries})
    click.echo(
        f"added {result.added} run(s) of {cells} cell(s) to {db}"
        + (f" ({result.already} already there)" if result.already else "")
        + (f"; {result.new_cells} new cell(s)" if result.new_cells else "")
        + (f"; label {label!r}" if label and result.added else "")
    )
    return 0


@history_group.command("show")
@click.option("--db", required=True, help=DB_HELP)
@click.option("--cell", "cell_filter", metavar="FILTER", help="Only cells whose label/run_id/spec contain every word.")
@click.option(
    "--format", "fmt", type=click.Choice(["table", "json"]), default="table", show_default=True, help="Output format."
)
@click.option(
    "--last",
    type=click.IntRange(min=0),
    default=Rules.window,
    show_default=True,
    help="The last N runs of each cell (0: every run).",
)
def show_command(db: str, cell_filter: str | None, fmt: str, last: int) -> int:
    """The stored series of each cell (per machine), oldest run first, with the change points in each metric."""
    with _database_errors(db):
        with open_store(db) as store:
            series = show_series(store, cell_filter=cell_filter, last=last or None)
    click.echo(render_show_json(series) if fmt == "json" else render_show_table(series), nl=False)
    return 0


@history_group.command("check")
@click.option("--db", required=True, help=DB_HELP)
@click.argument("results_dirs", nargs=-1, required=True, type=click.Path(path_type=Path), metavar="RESULTS_DIR...")
@click.option(
    "--format",
    "fmt",
    type=click.Choice(["table", "md", "json", "github-benchmark"]),
    default="table",
    show_default=True,
    help="What goes to stdout (and -o).",
)
@click.option(
    "--direction",
    type=click.Choice(sorted(BENCHMARK_FILES)),
    help="With --format github-benchmark: customSmallerIsBetter or customBiggerIsBetter entries.",
)
@click.option("-o", "--output", type=click.Path(path_type=Path), help="Also write the output to FILE (atomically).")
@click.option(
    "--threshold",
    "threshold_args",
    multiple=True,
    metavar="[METRIC=]FRACTION",
    help=f"Relative change a value must also exceed (default {DEFAULT_THRESHOLD}); METRIC=FRACTION for one of "
    f"{', '.join(THRESHOLD_METRICS)}. Repeatable.",
)
@click.option("--sigmas", type=float, default=Rules.k, show_default=True, help="Noise band: k·σ of between-run noise.")
@click.option(
    "--min-history", type=int, default=Rules.min_history, show_default=True, help="History values needed to judge."
)
@click.option("--window", type=int, default=Rules.window, show_default=True, help="Latest runs of each cell used.")
@click.option(
    "--recent", type=int, default=Rules.recent, show_default=True, help="Runs in which a change point still fails."
)
@click.option("--all", "all_rows", is_flag=True, help="List unchanged and n/a values too.")
def check_command(
    db: str,
    results_dirs: tuple[Path, ...],
    fmt: str,
    direction: str | None,
    output: Path | None,
    threshold_args: tuple[str, ...],
    sigmas: float,
    min_history: int,
    window: int,
    recent: int,
    all_rows: bool,
) -> int:
    """Judge the sweep in RESULTS_DIR against the history DB (DB is not changed: `history add` it afterwards).

    Exit 0 without a regression; 1 with one (a value out of its cell's noise band and beyond the threshold, a
    recent change point, a changed deterministic metric, or a newly failing cell), each named with its evidence;
    2 for bad input."""
    if fmt == "github-benchmark" and direction is None:
        raise click.UsageError("--format github-benchmark writes one tool kind: add --direction smaller|bigger")
    if direction is not None and fmt != "github-benchmark":
        raise click.UsageError("--direction only applies to --format github-benchmark")
    rules = Rules(
        k=sigmas, min_history=min_history, window=window, recent=recent, thresholds=parse_thresholds(threshold_args)
    ).checked()
    entries, records, notes = _entries(results_dirs)
    with _database_errors(db):
        with open_store(db) as store:
            check = check_entries(store, entries, rules=rules, sources=[str(p) for p in results_dirs], records=records)
    check.warnings[:0] = notes
    if direction is not None:
        text = render_benchmark(check, direction)
    else:
        text = {"table": render_table, "md": render_markdown, "json": render_json}[fmt](
            check, **({} if fmt == "json" else {"all_rows": all_rows})
        )
    click.echo(text, nl=False)
    if output is not None:
        atomic_write_text(output, text)
    for w in check.warnings:
        click.echo(f"warning: {w}", err=True)
    return check.exit_code()
