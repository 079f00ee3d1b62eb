"""`harness sweep SCENARIO`: every cell of a scenario, one record each (K with --repeat K).

The command's options, and the sweep's steps in order: the scenario and profile the options ask for, checked
(harness.launch.run.start_sweep), the sweep (harness.launch.sweep.run_sweep), its summary (summary_lines). The
command calls run_sweep itself because nothing in launch imports the sweep. SIGTERM stops it as Ctrl-C does
(harness.cli.interrupt_on_sigterm: exit 130, the records consistent).
"""

from __future__ import annotations

import click

from harness.cli import interrupt_on_sigterm
from harness.cli.options import cluster_option, set_option
from harness.launch.run import ran_nothing, start_sweep, summary_lines


@click.command()
@click.argument("scenario", type=click.Path(dir_okay=False))
@cluster_option
@click.option(
    "--results",
    default="results",
    show_default=True,
    type=click.Path(file_okay=False),
    help="results dir; records go to RESULTS/<scenario name>/<run_id>.json",
)
@click.option("--force", is_flag=True, help="rerun cells that already have an ok record")
@click.option("--no-skip", is_flag=True, help="run cells the planner predicts will not fit")
@click.option(
    "--no-wait",
    is_flag=True,
    help="SLURM: submit and return; `harness status` follows the jobs, re-running the sweep collects them",
)
@click.option(
    "--pack",
    is_flag=True,
    help="SLURM: cells asking for the same nodes and tasks share one job and run in it one after another, "
    "each in fresh processes (one queue wait per pack instead of per cell)",
)
@click.option(
    "--repeat",
    type=int,
    default=1,
    show_default=True,
    metavar="K",
    help="run every cell K times, in rounds (run 1 of every cell, then run 2, …), each run its own record "
    "(the k-th: RESULTS/<scenario name>/<run_id>.r<k>.json); `harness compare` judges timing on the runs",
)
@click.option(
    "--trace",
    is_flag=True,
    help="every cell with `trace: true`: five more steps under torch.profiler after the timed ones (between "
    "untraced ones: the profiler's cost), each rank's Chrome trace beside the record and the measured step-time "
    "breakdown (metrics.time_s)",
)
@click.option(
    "--checkpoint",
    is_flag=True,
    help="every cell also saves and reloads its training state after the timed steps (the `checkpoint` setting; "
    "a scenario's own `checkpoint` axis still decides its cells): metrics.checkpoint",
)
@set_option
def sweep(
    scenario: str,
    cluster_name: str,
    results: str,
    force: bool,
    no_skip: bool,
    no_wait: bool,
    pack: bool,
    repeat: int,
    trace: bool,
    checkpoint: bool,
    overrides: tuple[str, ...],
) -> int:
    """Run every cell of SCENARIO; each cell ends in one JSON record (with --repeat K, K records). Exit 1 if any
    run failed, or if nothing ran because every cell was skipped.

    On a SLURM profile every cell is one job (job arrays of cells asking for the same resources), or with --pack
    one job per pack of same-shaped cells; the sweep waits for them unless --no-wait, and a re-run re-attaches
    to jobs still queued or running. With --repeat the rounds are submitted in order. A re-run runs only what has
    no ok record yet."""
    from harness.launch.slurm.sacct import SlurmUnavailable
    from harness.launch.sweep import check_repeat, run_sweep

    repeat = check_repeat(repeat)
    interrupt_on_sigterm()
    start = start_sweep(
        scenario,
        cluster_name=cluster_name,
        results=results,
        no_wait=no_wait,
        pack=pack,
        repeat=repeat,
        trace=trace,
        checkpoint=checkpoint,
        overrides=overrides,
    )
    for line in start.lines:
        click.echo(line)
    try:
        res = run_sweep(
            start.scenario,
            start.cluster,
            results=results,
            force=force,
            no_skip=no_skip,
            no_wait=no_wait,
            pack=pack,
            echo=click.echo,
            repeat=repeat,
        )
    except SlurmUnavailable as e:
        raise click.ClickException(f"{e} (nothing was submitted or written)") from None
    for line in summary_lines(res, results=results):
        click.echo(line)
    if res.failed:
        return 1
    if ran_nothing(res):
        click.echo(
            "error: nothing ran: every cell was skipped (why: the lines above, and each record's reason)",
            err=True,
        )
        return 1
    return 0
