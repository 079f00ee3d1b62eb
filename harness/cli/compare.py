"""`harness compare BASELINE CANDIDATE`: per-cell regressions between two result sets.

The command's options only; the flow is harness.compare.run.compare_results (exit 0 no regression, 1 regression
or a missing cell with --fail-on-missing, 2 bad input).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from harness.cli.options import direction_option, format_option
from harness.compare.metrics import DEFAULT_THRESHOLD, THRESHOLD_METRICS
from harness.compare.run import OptionConflict, compare_results
from harness.compare.stats import DEFAULT_ALPHA, DEFAULT_MIN_RUNS


@click.command("compare")
@click.argument("baseline", required=False, type=click.Path(path_type=Path))
@click.argument("candidate", required=False, type=click.Path(path_type=Path))
@click.option(
    "-B",
    "--baseline-dir",
    "more_baseline",
    multiple=True,
    type=click.Path(path_type=Path),
    help="Another baseline results dir (repeatable): a side may be several dirs.",
)
@click.option(
    "-C",
    "--candidate-dir",
    "more_candidate",
    multiple=True,
    type=click.Path(path_type=Path),
    help="Another candidate results dir (repeatable).",
)
@click.option(
    "--threshold",
    "threshold_args",
    multiple=True,
    metavar="[METRIC=]FRACTION",
    help=f"Change beyond which a metric counts (default {DEFAULT_THRESHOLD}); METRIC=FRACTION overrides "
    f"one metric ({', '.join(THRESHOLD_METRICS)}). Repeatable.",
)
@click.option(
    "--alpha",
    type=click.FloatRange(0, 1, min_open=True, max_open=True),
    default=DEFAULT_ALPHA,
    show_default=True,
    help="Significance level of the test on timing metrics (Welch t on the log run-level values, Holm-adjusted "
    "over the cells: the chance of any false alarm in the comparison).",
)
@click.option(
    "--min-runs",
    type=click.IntRange(min=2),
    default=DEFAULT_MIN_RUNS,
    show_default=True,
    help="Runs of a cell (ok records: `harness sweep --repeat K`, or several dirs per side) needed on each side "
    "before a timing change can fail; with fewer it is reported, not judged.",
)
@format_option
@direction_option
@click.option("-o", "--output", type=click.Path(path_type=Path), help="Also write the output to FILE (atomically).")
@click.option(
    "--output-dir",
    type=click.Path(path_type=Path),
    help="Also write every format: compare.txt, compare.md, compare.json, benchmark-smaller.json, "
    "benchmark-bigger.json.",
)
@click.option("--all", "all_rows", is_flag=True, help="List unchanged and n/a metrics too.")
@click.option(
    "--ignore-spec-key",
    multiple=True,
    metavar="KEY",
    help="Leave a top-level spec key out of matching (e.g. time_limit_s). Repeatable.",
)
@click.option(
    "--metric",
    "metric_names",
    multiple=True,
    metavar="NAME",
    help="Judge only these metrics (repeatable); 'exact' = the deterministic ones (collective bytes, "
    "predicted memory and bytes), for CI on machines whose timings mean nothing.",
)
@click.option(
    "--watch-deviation",
    type=float,
    metavar="PCT",
    help="Fail (exit 1) a cell whose time-model deviation (predicted.step_time_deviation: measured median / "
    "predicted − 1) grew in magnitude by more than PCT percentage points. Without it the deviation is shown, "
    "never a regression.",
)
@click.option("--fail-on-missing", is_flag=True, help="Exit 1 when a baseline cell is missing from the candidate.")
@click.option(
    "--promote", is_flag=True, help="Afterwards, replace BASELINE's records with CANDIDATE's if there is no regression."
)
@click.option(
    "--force", is_flag=True, help="With --promote: promote even with regressions, or when BASELINE does not exist yet."
)
def compare_command(**options: Any) -> int:
    """Compare CANDIDATE results against BASELINE results, cell by cell (matched by spec).

    Exit 0 without regressions, 1 with any (a metric beyond its threshold and, for timing metrics, significant
    over at least --min-runs runs a side; a changed deterministic metric; or a cell ok in BASELINE that fails in
    CANDIDATE), 2 for bad input. Several records of one cell on a side are its runs (`harness sweep --repeat K`):
    timing is judged on their values, one per run; with fewer than --min-runs a side it is reported, not judged.
    """
    try:
        return compare_results(**options, echo=click.echo)
    except OptionConflict as e:  # NOTE: raised before any work, so the usage lines come first and alone
        raise click.UsageError(str(e)) from None
