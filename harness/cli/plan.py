"""`harness plan SCENARIO [--cluster NAME] [--format table|json] [--wide] [--headroom GIB] [--tokens N]
[--project GPUS [--figure PNG]]`: the planner's predictions for every cell and, per (model, GPU count), the cell it
recommends (the fastest predicted that fits with the headroom; harness.plan.recommend), with `--tokens` the days,
GPU-hours and cost of training N tokens on each, or with `--project`, every cell's step time projected at other GPU
counts (and drawn with `--figure`, by harness.report.projection).

The command only; the predictions are harness.plan.predict's and harness.plan.projection's, the recommendation
harness.plan.recommend's, the table harness.report.plan's. No torch import on this path.
"""

from __future__ import annotations

import atexit
import gc
import json
import shutil
import sys
from pathlib import Path

import click

from harness.cli.options import set_option
from harness.plan import projection as pj
from harness.plan.calibration import rates_for
from harness.plan.predict import bf16_peak_tflops, plan_cells, usable_memory_gib
from harness.plan.recommend import recommend, tune_headroom_gib
from harness.plan.training import parse_tokens, training_cost
from harness.report.plan import (
    PIPE_WIDTH,
    format_costs,
    format_projection,
    format_recommendations,
    format_table,
    planned_cell_json,
)
from harness.results.store import atomic_write_bytes, check_writable_dir
from harness.scenario.cluster import load_cluster
from harness.scenario.schema import load_scenario

_FREEZE_AT_EXIT: list = []
"""the exit handler that freezes the collector's objects, once registered"""


@click.command("plan")
@click.argument("scenario", type=click.Path(dir_okay=False))
@click.option(
    "--cluster",
    "cluster_name",
    default="local",
    show_default=True,
    help="cluster profile: a name (`harness list clusters`) or a path",
)
@click.option("--format", "fmt", type=click.Choice(["table", "json"]), default="table", show_default=True)
@click.option("--force-calibration", is_flag=True, help="use the cluster's calibration even if another machine made it")
@click.option(
    "--project",
    "project_gpus",
    default=None,
    metavar="GPUS",
    help="project every cell (model, strategy, layout, settings) to these GPU counts instead: 8,16,64 or 8..4096 "
    "(powers of two); predicted ms/step and tokens/s per GPU from the cluster's rates (docs/time-model.md)",
)
@click.option(
    "--figure",
    "figure_path",
    metavar="PNG",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="with --project: also draw the projected scaling (tokens/s per GPU against GPU count, per model) to PNG",
)
@click.option(
    "--tokens",
    "tokens_text",
    default=None,
    metavar="N",
    help="also give, per cell, the days and GPU-hours to train N tokens (1T, 300B, 2.5e12) at its predicted "
    "throughput, and the cost where the profile has performance.price_per_gpu_hour",
)
@click.option(
    "--headroom",
    "headroom_gib",
    type=click.FloatRange(min=0.0),
    default=None,
    metavar="GIB",
    help="device memory (GiB) a recommended cell must leave free beyond its predicted peak; default: what the "
    "scenario's tune.memory_headroom keeps free for harness tune, else (and at least) the CUDA context/NCCL reserve "
    "the fits column keeps",
)
@click.option(
    "--wide", is_flag=True, help="every column (memory parts, the peak's moment, FLOPs, collective bytes), every cell"
)
@set_option
def plan_command(
    scenario: str,
    cluster_name: str,
    fmt: str,
    force_calibration: bool,
    project_gpus: str | None,
    figure_path: Path | None,
    tokens_text: str | None,
    headroom_gib: float | None,
    wide: bool,
    overrides: tuple[str, ...],
) -> int:
    """Predict per-rank memory (params, grads, optimizer, activations, buffers), whether each cell fits,
    FLOPs, communication and step time per step, for every cell of SCENARIO, and recommend per model and GPU count
    the fastest predicted cell that fits. Launches nothing."""
    # NOTE: a plan holds about a hundred objects per cell until it is printed and frees almost nothing before; the
    # cyclic collector's passes over them cost a quarter of a 10,000-cell plan (bench/bench_plan.py) and find nothing.
    # At exit, the interpreter's last collection would pass over all of them once more (0.3 s): an exit handler
    # freezes them first (a process that goes on after this command, a test session, is not affected until it exits)
    collecting = gc.isenabled()
    gc.disable()
    if not _FREEZE_AT_EXIT:
        _FREEZE_AT_EXIT.append(atexit.register(gc.freeze))
    try:
        gpus = pj.parse_gpus(project_gpus) if project_gpus is not None else None  # bad input: before any work
        tokens = parse_tokens(tokens_text) if tokens_text is not None else None
        if tokens is not None and gpus is not None:
            raise click.UsageError("--tokens prices the plan's cells: use it without --project")
        if figure_path is not None:
            if gpus is None:
                raise click.UsageError("--figure draws a projection: add --project GPUS")
            check_writable_dir(figure_path.parent, option="--figure")
        cluster = load_cluster(cluster_name)
        loaded = load_scenario(scenario, overrides=overrides)
        specs = loaded.expand(gpus_per_node=cluster.gpus_per_node)
        rates = rates_for(cluster, force=force_calibration)  # another machine's calibration: exit 2, with the reason
        if gpus is not None:
            rows = pj.project(specs, cluster, gpus, rates=rates)
            doc = pj.projection_document(rows, cluster, gpus, rates)
            if fmt == "json":
                click.echo(json.dumps(doc.to_dict(), indent=2, allow_nan=False))
            else:
                click.echo(format_projection(rows, cluster, gpus, rates))
            if figure_path is not None:
                _draw(doc, figure_path)
            return 0
        cells = plan_cells(specs, cluster, rates=rates)
        from_tune = (
            tune_headroom_gib(loaded.tune.memory_headroom, usable_memory_gib(cluster))
            if headroom_gib is None and loaded.tune is not None
            else None
        )
        recs = recommend(
            cells,
            cluster=cluster,
            headroom_gib=from_tune[0] if from_tune else headroom_gib,
            headroom_from=from_tune[1] if from_tune else None,
        )
        price = cluster.performance.price_per_gpu_hour
        costs = (
            [training_cost(c, tokens=tokens, price_per_gpu_hour=price, profile=cluster.name) for c in cells]
            if tokens is not None
            else None
        )
        if fmt == "json":
            docs = [planned_cell_json(c, s, headroom_gib=recs.headroom_gib) for c, s in zip(cells, recs.standings)]
            for d, t in zip(docs, costs or []):
                d["training"] = t.to_dict()
            click.echo(json.dumps(docs, indent=2, allow_nan=False))
        else:
            width = terminal_width()
            peak, where = bf16_peak_tflops(cluster, rates)
            words = f"{where.split(':')[0]}: {peak:g} TFLOPS" if peak is not None else None
            click.echo(format_table(cells, cluster, recs=recs, wide=wide, width=width, peak=words))
            if costs is not None and tokens is not None:
                click.echo("")
                click.echo(format_costs(cells, costs, tokens=tokens, recs=recs, wide=wide, width=width))
            click.echo("")
            click.echo(format_recommendations(cells, recs, costs=costs, tokens=tokens, width=width))
    finally:
        if collecting:
            gc.enable()
    return 0


def terminal_width() -> int:
    """The terminal's columns when stdout is one, else PIPE_WIDTH: a pipe, a file or a test reads the same text
    whatever window started it."""
    if not sys.stdout.isatty():
        return PIPE_WIDTH
    return shutil.get_terminal_size((PIPE_WIDTH, 24)).columns


def _draw(doc: pj.Projection, path: Path) -> None:
    """The projection figure (harness.report.projection) to `path`, written whole or not at all; its note (null
    points and their reasons) and the path on stderr, so --format json on stdout stays one document."""
    from harness.report.projection import projection_figure  # NOTE: matplotlib only when a figure is asked for

    fig = projection_figure(doc)
    if fig.png is None:
        click.echo(f"note: --figure not drawn. {fig.note}", err=True)
        return
    atomic_write_bytes(path, fig.png)
    click.echo(f"figure: {path}" + (f" ({fig.note})" if fig.note else ""), err=True)
