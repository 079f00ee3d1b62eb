"""`harness history add|show|check`: a results history that sweeps are added to, and nightly judgement against it.

    harness history add   --db DB RESULTS_DIR [--label TEXT]
    harness history show  --db DB [--cell FILTER] [--format table|json]
    harness history check --db DB RESULTS_DIR [--format table|md|json|github-benchmark] [--confirm K]

DB is a SQLite file (created by the first `add`) or a postgresql:// URL (harness.history.store). `check` exits 0
without a regression, 1 with one (each named with its evidence), 2 for bad input. With `--confirm K` the cells it
flags are re-run K times (the sweep's scenario and cluster, from the results dir's manifest; the runs written into
that results dir) and judged again on those runs: only a regression that persists fails.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import click

from harness.cli.options import direction_option, format_option
from harness.compare.load import iter_side
from harness.compare.metrics import DEFAULT_THRESHOLD, THRESHOLD_METRICS, parse_thresholds
from harness.core.errors import InputError, Problem
from harness.history.judge import check_entries
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
from harness.history.store import HistoryStore, open_store
from harness.history.verdicts import CellVerdict, HistoryCheck, Rules
from harness.results.store import atomic_write_text, record_path

if TYPE_CHECKING:
    from harness.scenario.cluster import Cluster
    from harness.scenario.schema import Scenario

DB_HELP = "The history: a SQLite file, or a postgresql://user@host:port/dbname URL."


@contextlib.contextmanager
def database_errors(db: str) -> Iterator[None]:
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
            notes.append(f"skipped {rec.path}: {e}")
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
    with database_errors(db):
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
    with database_errors(db):
        with open_store(db) as store:
            series = show_series(store, cell_filter=cell_filter, last=last or None)
    click.echo(render_show_json(series) if fmt == "json" else render_show_table(series), nl=False)
    return 0


@history_group.command("check")
@click.option("--db", required=True, help=DB_HELP)
@click.argument("results_dirs", nargs=-1, required=True, type=click.Path(path_type=Path), metavar="RESULTS_DIR...")
@format_option
@direction_option
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
@click.option(
    "--watch-deviation",
    type=float,
    metavar="PCT",
    help="Fail (exit 1) a cell whose time-model deviation (predicted.step_time_deviation) shifted and whose "
    "|deviation| grew by more than PCT percentage points from its history's level. Without it a shift of the "
    "deviation is reported as information, never a regression.",
)
@click.option(
    "--confirm",
    type=int,
    default=0,
    show_default=True,
    metavar="K",
    help="When cells regress, re-run only those cells K times (scenario and cluster from the results dir's "
    "manifest; the runs land in that results dir, as `harness sweep --repeat` would write them) and judge again "
    "on the re-runs: only a regression that persists fails. 0: off.",
)
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
    watch_deviation: float | None,
    confirm: int,
) -> int:
    """Judge the sweep in RESULTS_DIR against the history DB (DB is not changed: `history add` it afterwards).

    Exit 0 without a regression; 1 with one (a value out of its cell's noise band and beyond the threshold, a
    recent change point, a changed deterministic metric, a newly failing cell, or with --watch-deviation a shift
    of the time model's deviation that grew |deviation| by more than PCT points), each named with its evidence;
    2 for bad input. A shift of the deviation without --watch-deviation is listed as information."""
    if fmt == "github-benchmark" and direction is None:
        raise click.UsageError("--format github-benchmark writes one tool kind: add --direction smaller|bigger")
    if direction is not None and fmt != "github-benchmark":
        raise click.UsageError("--direction only applies to --format github-benchmark")
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
    entries, records, notes = _entries(results_dirs)
    with database_errors(db):
        with open_store(db) as store:
            check = check_entries(store, entries, rules=rules, sources=[str(p) for p in results_dirs], records=records)
            if confirm and check.has_regression:
                check = _confirm(store, check, times=confirm, rules=rules)
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


# --------------------------------------------------------------------------------------------------
# --confirm K


def _sweep_of(cell: CellVerdict) -> Path:
    """The manifest of the sweep whose record flagged `cell`: beside the record, as `harness sweep` lays it out."""
    origin = Path(cell.entry.origin) if cell.entry is not None else None
    manifest = origin.parent / "manifest.json" if origin is not None else None
    if manifest is None or not manifest.is_file():
        raise InputError(
            [
                Problem(
                    str(origin or cell.label),
                    "--confirm",
                    f"no sweep manifest beside this record ({manifest}): --confirm re-runs cells of a results dir "
                    "written by `harness sweep`",
                )
            ]
        )
    return manifest


def _what_to_rerun(manifest: Path, run_ids: set[str]) -> tuple[Scenario, Cluster, Path]:
    """(scenario, cluster, results root) of the sweep whose manifest this is; InputError naming what is missing
    or no longer matches (an edited scenario file, a renamed profile)."""
    from harness.launch.core.manifest import read_manifest
    from harness.scenario.cluster import load_cluster
    from harness.scenario.schema import load_scenario

    header = read_manifest(manifest).header
    where = str(manifest)
    scenario_file = header.scenario_file or header.scenario
    cluster_ref = header.cluster_file or header.cluster
    problems = []
    if not scenario_file or not Path(scenario_file).is_file():
        problems.append(
            Problem(where, "scenario", f"the sweep's scenario file {scenario_file!r} is not there to re-run it from")
        )
    if not cluster_ref:
        problems.append(Problem(where, "cluster", "names no cluster profile to re-run on"))
    if problems:
        raise InputError(problems)
    scenario = load_scenario(scenario_file)
    cluster = load_cluster(cluster_ref)
    if scenario.name != header.sweep:
        raise InputError(
            [Problem(where, "scenario", f"{scenario_file} is now sweep {scenario.name!r}, not {header.sweep!r}")]
        )
    known = {s.run_id for s in scenario.expand(gpus_per_node=cluster.gpus_per_node)}
    gone = sorted(run_ids - known)
    if gone:
        raise InputError(
            [
                Problem(
                    where,
                    "scenario",
                    f"cell(s) {', '.join(gone)} are not in {scenario_file} any more (edited since the sweep?)",
                )
            ]
        )
    return scenario, cluster, manifest.parent.parent


@contextlib.contextmanager
def stdout_to_stderr() -> Iterator[None]:
    """Everything written to standard output in the block goes to standard error instead: Python's sys.stdout and
    file descriptor 1, which the re-runs' forked ranks inherit and libraries write to (DeepSpeed's logger prints
    "Setting accelerator to CPU" to stdout when it is first imported). stdout is the command's output, one JSON
    document with --format json, and must stay that alone."""
    sys.stdout.flush()
    saved = os.dup(1)
    try:
        os.dup2(2, 1)
        with contextlib.redirect_stdout(sys.stderr):
            yield
    finally:
        sys.stderr.flush()
        os.dup2(saved, 1)
        os.close(saved)


def _confirm(store: HistoryStore, check: HistoryCheck, *, times: int, rules: Rules) -> HistoryCheck:
    """Re-run each flagged cell `times` times and judge it again on those runs alone; a cell whose re-runs are
    not a regression any more is not failing (its first run was a one-off). The other cells are as judged."""
    from harness.launch.sweep import run_sweep

    flagged = [c for c in check.cells if c.regressed]
    by_sweep: dict[Path, list[CellVerdict]] = {}
    for c in flagged:
        by_sweep.setdefault(_sweep_of(c), []).append(c)
    plans = [(cs, _what_to_rerun(m, {c.run_id for c in cs})) for m, cs in by_sweep.items()]  # all checked first
    new: list[Entry] = []
    for cells, (scenario, cluster, root) in plans:
        click.echo(
            f"--confirm: re-running {len(cells)} flagged cell(s) {times} time(s): {', '.join(c.label for c in cells)}",
            err=True,
        )
        with stdout_to_stderr():
            result = run_sweep(
                scenario,
                cluster,
                results=root,
                only={c.run_id for c in cells},
                repeat=times,
                append=True,
                echo=lambda line: click.echo(line, err=True),
            )
        for rec in result.records:
            try:
                path = record_path(root, rec.sweep or "", rec.run_id, repeat=rec.repeat_index)
                new.append(entry_of(rec if rec.path else rec.at(str(path))))
            except ValueError as e:
                check.warnings.append(f"--confirm: a re-run's record is unusable: {e}")
    again = check_entries(store, new, rules=rules, sources=check.sources, records=len(new))
    redone = {c.key: c for c in again.cells}
    cells = []
    for c in check.cells:
        if not c.regressed:
            cells.append(c)
            continue
        r = redone.get(c.key)
        if r is None:  # NOTE: no re-run came back (skipped now?): the first verdict stands
            c.notes.append("--confirm: no re-run of this cell came back; the first run's verdict stands")
            cells.append(c)
            continue
        first = [m.metric for m in c.regressions] or ["newly failing"]
        r.confirm = {"runs": times, "first": first, "persisted": r.regressed}
        r.notes.append(f"--confirm: judged on {times} re-run(s) (their median), not on the first run")
        cells.append(r)
    check.cells = cells
    return check
