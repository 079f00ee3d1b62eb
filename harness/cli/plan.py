"""`harness plan SCENARIO [--cluster NAME] [--format table|json]`: the planner's predictions for every cell.

The command only; the predictions are harness.plan.predict's. No torch import on this path.
"""

from __future__ import annotations

import json

import click

from harness.plan.calibration import rates_for
from harness.plan.predict import format_table, plan_cells
from harness.scenario.cluster import load_cluster
from harness.scenario.schema import load_scenario


@click.command("plan")
@click.argument("scenario", type=click.Path(dir_okay=False))
@click.option(
    "--cluster",
    "cluster_name",
    default="local",
    show_default=True,
    help="cluster profile name (scenarios/clusters/NAME.yaml) or path",
)
@click.option("--format", "fmt", type=click.Choice(["table", "json"]), default="table", show_default=True)
@click.option("--force-calibration", is_flag=True, help="use the cluster's calibration even if another machine made it")
def plan_command(scenario: str, cluster_name: str, fmt: str, force_calibration: bool) -> int:
    """Predict per-rank memory (params, grads, optimizer, activations, buffers), whether each cell fits,
    FLOPs and communication per step, for every cell of SCENARIO. Launches nothing."""
    cluster = load_cluster(cluster_name)
    specs = load_scenario(scenario).expand(gpus_per_node=cluster.gpus_per_node)
    rates = rates_for(cluster, force=force_calibration)  # a calibration of another machine: exit 2, with the reason
    cells = plan_cells(specs, cluster, rates=rates)
    if fmt == "json":
        click.echo(json.dumps(cells, indent=2, allow_nan=False))
    else:
        click.echo(format_table(cells, cluster))
    return 0
