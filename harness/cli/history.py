"""`harness history add|show|check`: a results history that sweeps are added to, and nightly judgement against it.

    harness history add   --db DB RESULTS_DIR [--label TEXT]
    harness history show  --db DB [--cell FILTER] [--format table|json]
    harness history check --db DB RESULTS_DIR [--format table|md|json|github-benchmark] [--confirm K]

DB is a SQLite file (created by the first `add`) or a postgresql:// URL (harness.history.store). `check` exits 0
without a regression, 1 with one (each named with its evidence), 2 for bad input. With `--confirm K` the cells it
flags are re-run K times (the sweep's scenario and cluster, from the results dir's manifest; the runs written into
that results dir) and judged again on those runs: only a regression that persists fails.

The commands' options only; what they do is harness.history.sweeps' (add, check) and harness.history.show's.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from harness.cli.options import direction_option, format_option
from harness.compare.metrics import DEFAULT_THRESHOLD, THRESHOLD_METRICS
from harness.compare.run import OptionConflict
from harness.history.show import show_history
from harness.history.sweeps import add_sweeps, check_sweeps
from harness.history.verdicts import Rules

DB_HELP = "The history: a SQLite file, or a postgresql://user@host:port/dbname URL."


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
    return add_sweeps(db, results_dirs, label=label, echo=click.echo)


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
    click.echo(show_history(db, cell_filter=cell_filter, last=last, fmt=fmt), nl=False)
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
def check_command(db: str, results_dirs: tuple[Path, ...], **options: Any) -> int:
    """Judge the sweep in RESULTS_DIR against the history DB (DB is not changed: `history add` it afterwards).

    Exit 0 without a regression; 1 with one (a value out of its cell's noise band and beyond the threshold, a
    recent change point, a changed deterministic metric, a newly failing cell, or with --watch-deviation a shift
    of the time model's deviation that grew |deviation| by more than PCT points), each named with its evidence;
    2 for bad input. A shift of the deviation without --watch-deviation is listed as information."""
    try:
        return check_sweeps(db, results_dirs, **options, echo=click.echo)
    except OptionConflict as e:  # NOTE: raised before any work, so the usage lines come first and alone
        raise click.UsageError(str(e)) from None
