"""`harness calibrate [--cluster NAME] [--quick]`: measure the rates the step-time model uses on this machine.

The command only (its options and what it prints): the measurements and their processes are harness.calibrate's,
the file's format harness.plan.calibration.file's (docs/time-model.md).
"""

from __future__ import annotations

from pathlib import Path

import click

from harness.plan.calibration import describe_fingerprint, read_calibration
from harness.scenario.cluster import load_cluster


@click.command("calibrate")
@click.option(
    "--cluster",
    "cluster_name",
    default="local",
    show_default=True,
    help="cluster profile: a name (`harness list clusters`) or a path",
)
@click.option("--quick", is_flag=True, help="a smaller grid and fewer message sizes (seconds, for tests)")
@click.option(
    "--out",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="write here instead of next to the profile (or the user dir when that is read-only)",
)
def calibrate_command(cluster_name: str, quick: bool, out: Path | None) -> int:
    """Measure GEMM throughput per dtype and shape, elementwise bandwidth, attention, optimizer and per-op costs,
    each strategy family's framework overhead, and collective latency and bus bandwidth at 1, 2 and 4 ranks; write
    the cluster's calibration file with this machine's fingerprint. On a SLURM profile the parts run as jobs on
    one node and on two (the inter-node curves). `harness plan` then predicts step times."""
    from harness.calibrate.run import CalibrationFailed, calibrate
    from harness.launch.slurm.jobs import SlurmUnavailable

    cluster = load_cluster(cluster_name)
    try:
        path = calibrate(cluster, quick=quick, out=out)
    except SlurmUnavailable as e:
        raise click.ClickException(f"{e} (nothing was submitted or written)") from None
    except CalibrationFailed as e:
        click.echo(f"error: {e}; no calibration file was written", err=True)
        return 1
    written = read_calibration(path)
    click.echo(
        f"wrote {path} ({written.duration_s or 0:.0f} s) for cluster {cluster.name} on "
        f"{describe_fingerprint(written.fingerprint)}"
    )
    return 0
