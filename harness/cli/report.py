"""`harness report DIR… [-o OUT] [--history DB] [--projection FILE]`: the command; the report itself is
harness.report.build_report, the trends section's data harness.history.trends and the cells' between-run noise
harness.history.noise (read here, so the report does not import the history), the projection a
`harness plan --project --format json` document."""

from __future__ import annotations

from pathlib import Path

import click

from harness.cli import NO_ROOM
from harness.compare.metrics import DEVIATION
from harness.history.keys import HISTORY_METRICS
from harness.plan.projection import read_projection
from harness.report import build_report, output_problem
from harness.results.store import WriteFailed, check_writable_dir

TREND_METRICS = [m.name for m in HISTORY_METRICS if m.name != DEVIATION]
"""every stored metric but the time model's deviation (a signed number: `history show` lists it)"""


@click.command("report")
@click.argument("dirs", nargs=-1, required=True, type=click.Path(path_type=Path))
@click.option(
    "-o",
    "--out",
    type=click.Path(path_type=Path),
    default=None,
    help="output folder (default: reports/<sweep name>, or reports/report for several sweeps)",
)
@click.option(
    "--history",
    "history_db",
    metavar="DB",
    default=None,
    help="Add trends from this results history "
    "(SQLite file or postgresql:// URL): each cell's series, its noise band and change points; the best-strategy "
    "table judges a lead of cells measured fewer than 3 times against their between-run noise there.",
)
@click.option(
    "--history-cell",
    metavar="FILTER",
    default=None,
    help="Trends only of cells whose label/run_id/spec contain every word (as `history show --cell`).",
)
@click.option(
    "--history-metric",
    type=click.Choice(TREND_METRICS),
    default="step_time_s",
    show_default=True,
    help="The metric the trends show.",
)
@click.option(
    "--history-last",
    type=click.IntRange(min=0),
    default=60,
    show_default=True,
    help="The last N runs of each cell (0: every run).",
)
@click.option(
    "--repredict",
    is_flag=True,
    help="Predict every record's cell again with its cluster's current calibration (or profile) instead of the "
    "prediction made before it ran (after `harness calibrate`); labelled 're-predicted at report time'. The record "
    "files are not changed.",
)
@click.option(
    "--projection",
    "projection_file",
    metavar="FILE",
    type=click.Path(path_type=Path),
    default=None,
    help="Add the projected scaling figure from FILE (`harness plan SCENARIO --project 8..4096 --format json`), "
    "with the measured cells drawn on their projected lines.",
)
def report_command(
    dirs: tuple[Path, ...],
    repredict: bool,
    out: Path | None,
    history_db: str | None,
    history_cell: str | None,
    history_metric: str,
    history_last: int,
    projection_file: Path | None,
) -> int:
    """Build an HTML + Markdown report (tables, figures, CSV/Parquet) from result DIRS (searched recursively);
    with --history, a trends section from the results history too."""
    # NOTE: build_report checks the output folder by its permission bits before any work (and says what it finds);
    # a folder they call writable may still refuse (root on /sys, a read-only mount): that is tried here, first
    target = out if out is not None else Path("reports")
    if output_problem(target) is None:
        check_writable_dir(target, option="-o" if out is not None else "the default output folder (-o sets another)")
    # bad input: first
    projection = read_projection(projection_file) if projection_file is not None else None
    trends = noise = None
    if history_db is not None:
        from harness.history.noise import cell_noise
        from harness.history.store import database_errors, open_store
        from harness.history.trends import trend_series

        with database_errors(history_db):
            with open_store(history_db) as store:
                trends = trend_series(store, cell_filter=history_cell, last=history_last or None, metric=history_metric)
                noise = cell_noise(store)
    try:
        result = build_report(dirs, out, trends=trends, projection=projection, noise=noise, repredict=repredict)
    except OSError as e:
        if e.filename is not None or e.errno not in NO_ROOM:
            raise
        # NOTE: a table or figure writer that does not say which file (pandas): the output folder is named
        raise WriteFailed(e.errno, e.strerror, str(target)) from e
    for w in result["warnings"]:
        click.echo(f"warning: {w}", err=True)
    if result["out"] is None:
        # NOTE: bad input, as `compare` says of an empty side: nothing to report on, and nothing was written
        unreadable = f"; {len(result['warnings'])} warning(s) above" if result["warnings"] else ""
        click.echo(
            f"error: {', '.join(map(str, dirs))}: no readable records (an empty results folder, or no file in it is a "
            f"record this harness reads{unreadable}); nothing was written",
            err=True,
        )
        return 2
    p = result["paths"]
    for key in ("html", "markdown", "csv", "parquet"):
        if key in p:
            click.echo(str(p[key]))
    for path in p["figures"].values():
        click.echo(str(path))
    for f in result["figures"]:
        if f.png is None:
            click.echo(f"note: figure '{f.name}' not drawn. {f.note}", err=True)
    return 0
