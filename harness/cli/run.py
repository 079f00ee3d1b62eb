"""`harness run`, `harness list`, `harness status`: their options, and one call each into the launch stage
(harness.launch.run.run_cell, harness.scenario.listing, harness.launch.status)."""

from __future__ import annotations

import click

from harness.cli.options import cluster_option, set_option
from harness.launch.run import run_cell
from harness.launch.status import status_lines
from harness.scenario.listing import list_lines


@click.command()
@click.argument("scenario", type=click.Path(dir_okay=False))
@click.option("--cell", "cell", required=True, help="run_id (or a unique prefix) of the cell to run")
@cluster_option
@click.option("--results", default="results", show_default=True, type=click.Path(file_okay=False))
@click.option("--json", "as_json", is_flag=True, help="print the record as JSON")
@click.option("--no-skip", is_flag=True, help="run the cell even when it is predicted not to fit this host")
@set_option
def run(
    scenario: str, cell: str, cluster_name: str, results: str, as_json: bool, no_skip: bool, overrides: tuple[str, ...]
) -> int:
    """Run one cell of SCENARIO in the foreground (ranks are child processes; their output streams here)."""
    return run_cell(
        scenario,
        cell=cell,
        cluster_name=cluster_name,
        results=results,
        as_json=as_json,
        no_skip=no_skip,
        echo=click.echo,
        overrides=overrides,
    )


@click.command(name="list")
@click.argument("what", type=click.Choice(["models", "strategies", "clusters", "cells"]))
@click.argument("scenario", required=False)
@cluster_option
def list_(what: str, scenario: str | None, cluster_name: str) -> int:
    """List zoo models, strategies, cluster profiles, or the cells (run_ids) of a SCENARIO."""
    for line in list_lines(what, scenario=scenario, cluster_name=cluster_name):
        click.echo(line)
    return 0


@click.command()
@click.argument("results_dir", type=click.Path(exists=True, file_okay=False))
def status(results_dir: str) -> int:
    """Per-cell state of the sweep(s) under RESULTS_DIR (from each sweep's manifest and records). Cells still
    queued or running on SLURM show SLURM's live state (one sacct call per sweep)."""
    for line in status_lines(results_dir):
        click.echo(line)
    return 0
