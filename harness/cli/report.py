"""`harness report DIR… [-o OUT]`: the command; the report itself is harness.report.build_report."""

from __future__ import annotations

from pathlib import Path

import click

from harness.report import build_report, output_problem
from harness.results.store import check_writable_dir


@click.command("report")
@click.argument("dirs", nargs=-1, required=True, type=click.Path(path_type=Path))
@click.option(
    "-o",
    "--out",
    type=click.Path(path_type=Path),
    default=None,
    help="output folder (default: reports/<sweep name>, or reports/report for several sweeps)",
)
def report_command(dirs: tuple[Path, ...], out: Path | None) -> int:
    """Build an HTML + Markdown report (tables, figures, CSV/Parquet) from result DIRS (searched recursively)."""
    # NOTE: build_report checks the output folder by its permission bits before any work (and says what it finds);
    # a folder they call writable may still refuse (root on /sys, a read-only mount): that is tried here, first
    target = out if out is not None else Path("reports")
    if output_problem(target) is None:
        check_writable_dir(target, option="-o" if out is not None else "the default output folder (-o sets another)")
    result = build_report(dirs, out)
    for w in result["warnings"]:
        click.echo(f"warning: {w}", err=True)
    if result["out"] is None:
        click.echo(f"error: no records could be loaded from {', '.join(map(str, dirs))}", err=True)
        return 1
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
