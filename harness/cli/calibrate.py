"""`harness calibrate [--cluster NAME] [--quick]`: measure the rates the step-time model uses on this machine;
`harness calibrate --cluster NAME --from FILE…`: build them from nccl-tests and matmul-benchmark logs instead
(harness.calibrate.logs, docs/bring-your-cluster.md).

The command only (its options and what it prints): the measurements and their processes are harness.calibrate's,
the file's format harness.plan.calibration.file's (docs/time-model.md).
"""

from __future__ import annotations

from pathlib import Path

import click

from harness.cli.options import cluster_option
from harness.plan.calibration import describe_fingerprint, read_calibration, write_calibration, write_path
from harness.scenario.cluster import Cluster, load_cluster


@click.command("calibrate")
@cluster_option
@click.option("--quick", is_flag=True, help="a smaller grid and fewer message sizes (seconds, for tests)")
@click.option(
    "--out",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="write here instead of next to the profile (or the user dir when that is read-only)",
)
@click.option(
    "--from",
    "from_logs",
    multiple=True,
    type=click.Path(dir_okay=False, path_type=Path),
    help="build the calibration from these logs instead of measuring: nccl-tests output (all_reduce_perf, "
    "all_gather_perf, reduce_scatter_perf, broadcast_perf; one node or several) and mamf-finder output; "
    "repeat for each file. The profile's figures price what no log measured",
)
def calibrate_command(cluster_name: str, quick: bool, out: Path | None, from_logs: tuple[Path, ...]) -> int:
    """Measure GEMM throughput per dtype and shape, elementwise bandwidth, attention, optimizer and per-op costs,
    each strategy family's framework overhead, and collective latency and bus bandwidth at 1, 2 and 4 ranks; write
    the cluster's calibration file with this machine's fingerprint. On a SLURM profile the parts run as jobs on
    one node and on two (the inter-node curves). With --from, read the cluster team's logs instead (nothing
    runs). `harness plan` then predicts step times."""
    cluster = load_cluster(cluster_name)
    if from_logs:
        return _from_logs(cluster, list(from_logs), out=out)
    from harness.calibrate.run import CalibrationFailed, calibrate
    from harness.launch.slurm.sacct import SlurmUnavailable

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


def _from_logs(cluster: Cluster, paths: list[Path], *, out: Path | None) -> int:
    """`--from`: the calibration built from the logs, written (only when every log reads) where `harness plan`
    finds it; one line per figure and the file it came from."""
    from harness.calibrate.logs import calibration_from_logs, summary_lines

    calibration = calibration_from_logs(
        paths, cluster=cluster.name, device=cluster.device, description=cluster.description
    )
    path = write_calibration(out or write_path(cluster), calibration)
    click.echo(
        f"wrote {path} for cluster {cluster.name} from {len(paths)} log(s); the profile's figures price the rest"
    )
    for line in summary_lines(calibration):
        click.echo(line)
    return 0
