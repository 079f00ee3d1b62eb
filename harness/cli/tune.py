"""`harness tune SCENARIO`: the fastest cell per model and GPU count, measuring a fraction of the matrix.

    harness tune SCENARIO [--cluster NAME] [--results DIR] [--budget-cells N | --budget-minutes M] [--seed S]
                          [--format table|json] [--out FILE] [--pack]

The search is harness.tune (docs/tune.md). Exit 0 with a winner for every (model, gpus) group, 1 when a group has
none (every candidate failed or none could run), 2 for bad input; 130 on Ctrl-C (re-run the same command to go on).
"""

from __future__ import annotations

import contextlib
import json
import math
import shlex
from pathlib import Path

import click

from harness.cli import interrupt_on_sigterm
from harness.cli.options import cluster_option, set_option
from harness.core.errors import InputError, Problem
from harness.scenario.cluster import load_cluster
from harness.scenario.schema import load_scenario


@click.command()
@click.argument("scenario", type=click.Path(dir_okay=False))
@cluster_option
@click.option(
    "--results",
    default="results",
    show_default=True,
    type=click.Path(file_okay=False),
    help="results dir; trials go to RESULTS/<scenario name>-tune/, with tune.json and tuned.yaml",
)
@click.option("--budget-cells", type=int, default=None, metavar="N", help="at most N trial runs in all")
@click.option(
    "--budget-minutes",
    type=float,
    default=None,
    metavar="M",
    help="start no batch of trials that would end after M minutes (estimated from the trials so far)",
)
@click.option("--seed", type=int, default=0, show_default=True, help="orders ties and unranked candidates")
@click.option("--format", "fmt", type=click.Choice(["table", "json"]), default="table", show_default=True)
@click.option("--out", type=click.Path(dir_okay=False), default=None, help="the winners' scenario file")
@click.option(
    "--pack",
    is_flag=True,
    help="SLURM: the trials of a batch asking for the same nodes and tasks share one job (harness sweep --pack)",
)
@click.option(
    "--no-calibrate",
    "no_calibrate",
    is_flag=True,
    help="on a cluster without a calibration, rank by counts (FLOPs, bytes, calls per token) instead of running "
    "a quick `harness calibrate` first",
)
@set_option
def tune_command(
    scenario: str,
    cluster_name: str,
    results: str,
    budget_cells: int | None,
    budget_minutes: float | None,
    seed: int,
    fmt: str,
    out: str | None,
    pack: bool,
    no_calibrate: bool,
    overrides: tuple[str, ...],
) -> int:
    """Find the fastest configuration of SCENARIO that fits: prune by the memory model and by dominance, rank by
    the predicted step time (a cluster without a calibration gets a quick one first, unless --no-calibrate),
    measure in rounds of successive halving, confirm the leader against the runner-up beyond noise. Every
    trial is an ordinary record in RESULTS/<scenario name>-tune/; the winners are written as a scenario file
    (tuned.yaml there, or --out) that `harness sweep` runs. A re-run goes on where the last one stopped."""
    from harness.launch.stdout import stdout_to_stderr
    from harness.results.store import check_writable_dir, sweep_dir
    from harness.tune.run import run_tune, tune_sweep_name
    from harness.tune.summary import format_tune

    problems = []
    if budget_cells is not None and budget_cells < 1:
        problems.append(Problem("--budget-cells", "", f"{budget_cells} must be a positive number of trial runs"))
    if budget_minutes is not None and not (math.isfinite(budget_minutes) and budget_minutes > 0):
        problems.append(Problem("--budget-minutes", "", f"{budget_minutes} must be a positive number of minutes"))
    if budget_cells is not None and budget_minutes is not None:
        problems.append(Problem("--budget-cells", "", "give one budget: --budget-cells or --budget-minutes"))
    if problems:
        raise InputError(problems)
    interrupt_on_sigterm()
    sc = load_scenario(scenario, overrides=overrides)
    cluster = load_cluster(cluster_name)
    if pack and cluster.executor != "slurm":
        raise InputError([Problem("--pack", "", f"needs a SLURM profile; {cluster.name!r} runs cells locally")])
    check_writable_dir(sweep_dir(results, tune_sweep_name(sc)), option="--results")
    if out is not None:
        check_writable_dir(Path(out).resolve().parent, option="--out")
    echo = (lambda s: click.echo(s, err=True)) if fmt == "json" else click.echo
    ctx = stdout_to_stderr() if fmt == "json" else contextlib.nullcontext()
    with ctx:
        res = run_tune(
            sc,
            cluster,
            results=results,
            seed=seed,
            budget_cells=budget_cells,
            budget_minutes=budget_minutes,
            echo=echo,
            tuned_file=out,
            pack=pack,
            calibrate=not no_calibrate,
        )
    if fmt == "json":
        doc = {**res.log.to_dict(), "tuned_file": str(res.tuned_file) if res.tuned_file else None}
        click.echo(json.dumps(doc, indent=1))
    else:
        click.echo(format_tune(res.log))
        if res.tuned_file is not None:
            click.echo(f"winners: {res.tuned_file}  (harness sweep {shlex.quote(str(res.tuned_file))})")
        click.echo(f"trials and tune.json: {res.folder}/  (harness report {shlex.quote(str(results))})")
    return 0 if res.log.every_group_won() else 1
