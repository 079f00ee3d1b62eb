"""Click commands for the run side of the flow: sweep, run, list, status."""

from __future__ import annotations

import dataclasses
import json
import os
import shlex
import shutil
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import click

from harness.cli import interrupt_on_sigterm
from harness.core.errors import InputError, Problem, one_of
from harness.core.zoo import ZOO, ZOO_SOURCES, ModelConfig
from harness.scenario.cluster import PEAKS, PROJECT_DIR, SHIPPED_DIR, available_clusters, load_cluster
from harness.scenario.schema import STRATEGIES, Scenario, load_scenario

if TYPE_CHECKING:
    from harness.launch.core.manifest import RunEntry, SweepManifest


def cluster_option(f):
    """`--cluster NAME`, as every command that runs or plans cells on a cluster profile takes it."""
    return click.option(
        "--cluster",
        "cluster_name",
        default="local",
        show_default=True,
        help="cluster profile: a name (`harness list clusters`) or a path",
    )(f)


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
def sweep(
    scenario: str,
    cluster_name: str,
    results: str,
    force: bool,
    no_skip: bool,
    no_wait: bool,
    pack: bool,
    repeat: int,
    trace: bool = False,
    checkpoint: bool = False,
) -> int:
    """Run every cell of SCENARIO; each cell ends in one JSON record (with --repeat K, K records). Exit 1 if any
    run failed.

    On a SLURM profile every cell is one job (job arrays of cells asking for the same resources), or with --pack
    one job per pack of same-shaped cells; the sweep waits for them unless --no-wait, and a re-run re-attaches
    to jobs still queued or running. With --repeat the rounds are submitted in order. A re-run runs only what has
    no ok record yet."""
    from harness.launch.slurm.jobs import SlurmUnavailable
    from harness.launch.sweep import check_repeat, run_sweep
    from harness.results.store import check_writable_dir, sweep_dir

    repeat = check_repeat(repeat)
    interrupt_on_sigterm()
    sc = load_scenario(scenario)
    if trace:
        sc = sc.with_setting("trace", True)
    if checkpoint:
        sc = with_checkpoint(sc)
    cluster = load_cluster(cluster_name)
    local = [flag for flag, on in (("--no-wait", no_wait), ("--pack", pack)) if on and cluster.executor != "slurm"]
    if local:
        raise InputError(
            [
                Problem(
                    flag, "", f"needs a SLURM profile; {cluster.name!r} runs cells locally, as children of the sweep"
                )
                for flag in local
            ]
        )
    check_writable_dir(sweep_dir(results, sc.name), option="--results")  # (run_sweep checks too) before any line
    specs, left_out = sc.expand_all(gpus_per_node=cluster.gpus_per_node)
    n = len(specs)
    click.echo(
        f"sweep {sc.name!r}: {n} cells on cluster {cluster.name!r} ({cluster.executor}, {cluster.device})"
        + (f", {repeat} runs each" if repeat > 1 else "")
        + (", packed" if pack else "")
    )
    if left_out:
        more = f" (and {len(left_out) - 1} more)" if len(left_out) > 1 else ""
        click.echo(f"{len(left_out)} matrix cell(s) left out by tune.global_batch: {left_out[0][1]}{more}")
    try:
        res = run_sweep(
            sc,
            cluster,
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
    counts: dict[str, int] = {}
    for r in res.records:
        counts[r.status] = counts.get(r.status, 0) + 1
    summary = ", ".join(f"{v} {k}" for k, v in sorted(counts.items()))
    if res.in_flight:
        summary = ", ".join(filter(None, [summary, f"{res.in_flight} still on SLURM"]))
    click.echo(f"done in {res.wall_s:.1f} s: {summary}")
    me, folder = this_command(), shlex.quote(str(res.results_dir))
    click.echo(f"records: {res.results_dir}/  ({me} report {shlex.quote(results)} | {me} status {folder})")
    return 1 if res.failed else 0


def with_checkpoint(sc: Scenario) -> Scenario:
    """`--checkpoint`: the scenario with `checkpoint: true` among its settings (cells that set it keep theirs)."""
    return dataclasses.replace(sc, settings={**sc.settings, "checkpoint": True})


def this_command() -> str:
    """`harness` as this process was started, runnable as printed: `harness` when PATH finds this script; else
    the script's path (`.venv/bin/harness` after `make sweep`, whose venv is not on PATH), relative to the working
    directory when inside it; `python -m harness.cli` with this interpreter for a module run (or an in-process
    call, as in tests)."""
    script = Path(sys.argv[0]) if sys.argv and sys.argv[0] else None
    if script is None or script.name == "__main__.py" or not script.is_file():
        return f"{_shown_path(sys.executable, 'python')} -m harness.cli"
    return _shown_path(script, "harness")


def _shown_path(path: str | Path, name: str) -> str:
    """`name` when PATH finds this very file under that name, else the path (relative to the working directory
    when inside it; never resolved through symlinks: a venv's python is one), quoted for a shell."""
    on_path = shutil.which(name)
    try:
        if on_path and os.path.samefile(on_path, path):
            return name
    except OSError:
        pass
    full = os.path.abspath(path)
    rel = os.path.relpath(full)
    shown = full if rel.startswith("..") else rel if os.sep in rel else f".{os.sep}{rel}"
    return shlex.quote(shown)


@click.command()
@click.argument("scenario", type=click.Path(dir_okay=False))
@click.option("--cell", "cell", required=True, help="run_id (or a unique prefix) of the cell to run")
@cluster_option
@click.option("--results", default="results", show_default=True, type=click.Path(file_okay=False))
@click.option("--json", "as_json", is_flag=True, help="print the record as JSON")
def run(scenario: str, cell: str, cluster_name: str, results: str, as_json: bool) -> int:
    """Run one cell of SCENARIO in the foreground (ranks are child processes; their output streams here)."""
    from harness.launch.core.outcome import describe, skipped_record
    from harness.launch.core.payload import make_payload, predict
    from harness.launch.local.launchers import launch_foreground, local_gpus
    from harness.plan.placement import capacity, placement_refusal
    from harness.results.store import check_writable_dir, sweep_dir
    from harness.worker.env import git_sha

    sc = load_scenario(scenario)
    cluster = load_cluster(cluster_name)
    specs = sc.expand(gpus_per_node=cluster.gpus_per_node)
    matches = [s for s in specs if s.run_id == cell] or [s for s in specs if s.run_id.startswith(cell)]
    if len(matches) != 1:
        ids = [s.run_id for s in specs]
        msg = "matches several cells: " + ", ".join(s.run_id for s in matches) if matches else one_of(cell, ids)
        raise InputError([Problem(scenario, "--cell", msg)])
    spec = matches[0]
    check_writable_dir(sweep_dir(results, sc.name), option="--results")
    predicted = predict(spec, cluster)
    # NOTE: a cell this machine cannot host is refused before any rank starts (harness.plan.placement); the ranks
    # are children of this process whatever the profile's executor, so the limit is always the local one
    here = dataclasses.replace(cluster, executor="local")
    reason = spec.unsupported_reason(cluster.device) or placement_refusal(spec, here, capacity(here, gpus=local_gpus))
    if reason:
        rec = skipped_record(spec, sweep=sc.name, cluster=cluster, results=results, reason=reason, predicted=predicted)
    else:
        payload = make_payload(
            spec, sweep=sc.name, cluster=cluster, results=results, sha=git_sha(), predicted=predicted
        )
        rec = launch_foreground(payload, time_limit_s=spec.settings.time_limit_s)
    click.echo(json.dumps(rec.to_dict(), indent=2) if as_json else f"{spec.cell_name}  {describe(rec)}")
    return 0 if rec.status in ("ok", "skipped") else 1


@click.command(name="list")
@click.argument("what", type=click.Choice(["models", "strategies", "clusters", "cells"]))
@click.argument("scenario", required=False)
@cluster_option
def list_(what: str, scenario: str | None, cluster_name: str) -> int:
    """List zoo models, strategies, cluster profiles, or the cells (run_ids) of a SCENARIO."""
    if what == "models":
        _list_models(scenario)
    elif what == "strategies":
        for s in STRATEGIES:
            click.echo(s)
    elif what == "clusters":
        for name in available_clusters():
            c = load_cluster(name)
            click.echo(f"{name:12s} {c.executor:6s} {c.device:5s} {c.gpus_per_node} per node  {c.description}")
        click.echo(f"\nprofiles: ./{PROJECT_DIR}/NAME.yaml (this project's, first), then {SHIPPED_DIR}/ (shipped)")
        click.echo("known devices for MFU: " + ", ".join(p.name for p in PEAKS))
    else:
        if not scenario:
            raise InputError([Problem("harness list cells", "SCENARIO", "missing: give a scenario file")])
        cluster = load_cluster(cluster_name)
        for spec in load_scenario(scenario).expand(gpus_per_node=cluster.gpus_per_node):
            reason = spec.unsupported_reason(cluster.device)
            click.echo(spec.run_id + (f"   (skipped: {reason})" if reason else ""))
    return 0


def _list_models(scenario: str | None) -> None:
    """One line per zoo model, then per model SCENARIO defines: the exact parameter count with thousands
    separators, a rounded figure (K/M/B = 1e3/1e6/1e9), the dimensions, and where they come from (the zoo entry's
    source, the scenario file, or the Hugging Face config.json it names)."""
    rows: list[tuple[str, ModelConfig, str]] = [(name, cfg, f"zoo: {ZOO_SOURCES[name]}") for name, cfg in ZOO.items()]
    if scenario:
        sc = load_scenario(scenario)
        rows += [(name, cfg, sc.model_sources.get(name, Path(scenario).name)) for name, cfg in sc.models.items()]
    name_w = max(len(name) for name, _, _ in rows)
    count_w = max(len(f"{cfg.n_params():,}") for _, cfg, _ in rows)
    for name, cfg, origin in rows:
        n = cfg.n_params()
        rounded = f"({_rounded_count(n)})"
        bias = " qkv_bias" if cfg.qkv_bias else ""
        click.echo(
            f"{name:{name_w}s} {n:>{count_w},} params {rounded:10s}  d_model {cfg.d_model:5d}  layers "
            f"{cfg.n_layers:3d}  heads {cfg.n_heads:3d}  kv_heads {cfg.kv_heads:3d}  ffn {cfg.ffn:6d}  "
            f"vocab {cfg.vocab:6d}{bias}  source: {origin}"
        )


def _rounded_count(n: int) -> str:
    """A count for reading at a glance: 166.2 K, 134.1 M, 6.74 B (decimal prefixes)."""
    if n >= 1e9:
        return f"{n / 1e9:.2f} B"
    if n >= 1e6:
        return f"{n / 1e6:.1f} M"
    if n >= 1e3:
        return f"{n / 1e3:.1f} K"
    return str(n)


@click.command()
@click.argument("results_dir", type=click.Path(exists=True, file_okay=False))
def status(results_dir: str) -> int:
    """Per-cell state of the sweep(s) under RESULTS_DIR (from each sweep's manifest and records). Cells still
    queued or running on SLURM show SLURM's live state (one sacct call per sweep)."""
    from harness.launch.core.manifest import read_manifest

    root = Path(results_dir)
    manifests = [root / "manifest.json"] if (root / "manifest.json").exists() else sorted(root.glob("*/manifest.json"))
    if not manifests:
        raise InputError([Problem(results_dir, "", "no sweep manifest found (is this a results dir?)")])
    for mpath in manifests:
        _echo_status(mpath, read_manifest(mpath))
    return 0


def _echo_status(mpath: Path, manifest: SweepManifest) -> None:
    """One sweep's lines of `harness status`: a header, a line per run, the counts."""
    live, unavailable = _live_slurm_states(manifest)
    counts: dict[str, int] = {}
    runs = {run_id: c.runs() for run_id, c in manifest.cells.items()}
    n_runs = sum(len(r) for r in runs.values())
    repeated = n_runs > len(runs)
    click.echo(
        f"sweep {manifest.sweep!r} on {manifest.cluster!r}: {len(runs)} cells"
        + (f", {n_runs} runs (--repeat {manifest.repeat}; counts below are of runs)" if repeated else "")
    )
    for run_id, by_repeat in runs.items():
        for k, c in by_repeat.items():
            state, note = c.state or "?", ""
            if (run_id, k) in live:
                state, note = _shown_slurm_state(mpath.parent, run_id, c, *live[(run_id, k)], repeat=k)
            elif unavailable and c.state in ("submitted", "running"):
                note = f"  (live SLURM state unavailable: {unavailable})"
            counts[state] = counts.get(state, 0) + 1
            pack = f" (pack {c.pack.position}/{c.pack.of})" if c.pack else ""
            which = f" run {k}" if repeated else ""
            job = "-" if c.job_id is None else c.job_id
            name = f"{run_id} [{manifest.cells[run_id].layout}]" if manifest.cells[run_id].layout else run_id
            click.echo(f"  {state:9s} {c.status or '-':9s} {name}{which}  job {job}{pack}{note}")
    click.echo("  " + ", ".join(f"{v} {k}" for k, v in sorted(counts.items())))


def _live_slurm_states(manifest: SweepManifest) -> tuple[dict[tuple[str, int], tuple[str, str]], str]:
    """({(run_id, repeat): (sacct state, nodes)} of a SLURM sweep's runs still in flight, why it is unavailable
    or '')."""
    if manifest.executor != "slurm":
        return {}, ""
    in_flight = {
        (run_id, k): c.job_id
        for run_id, cell in manifest.cells.items()
        for k, c in cell.runs().items()
        if c.state in ("submitted", "running") and c.job_id
    }
    if not in_flight:
        return {}, ""
    from harness.launch.slurm.jobs import SlurmUnavailable, live_states

    try:
        states = live_states(list(in_flight.values()))
    except SlurmUnavailable as e:
        return {}, str(e)
    return {key: states[job_id] for key, job_id in in_flight.items()}, ""


def _shown_slurm_state(
    sweep_dir: Path, run_id: str, cell: RunEntry, slurm_state: str, nodes: str, *, repeat: int = 1
) -> tuple[str, str]:
    """(state, note) of an in-flight SLURM cell: pending / running, or, once its job is over, done / failed when
    rank 0 wrote this attempt's record, else ended (the next sweep run composes its record). A packed cell is
    done / failed as soon as its record is made (its job goes on with the next cell), and pending until its turn."""
    from harness.launch.core.folder import SweepFolder
    from harness.launch.slurm.jobs import flight_state
    from harness.launch.slurm.pack import read_marker
    from harness.results.store import record_or_none, record_path

    state = flight_state(slurm_state)
    note = f"  SLURM {slurm_state}" + (f" on {nodes}" if nodes else "")
    packed = cell.pack is not None
    if state != "ended" and not packed:
        return ("pending" if state == "submitted" else "running"), note
    # NOTE: a run k >= 2 is written under its own root first (harness.launch.core.folder), then filed beside run 1
    folder = SweepFolder(sweep_dir.parent, sweep_dir.name)
    staged_root = folder.staging_root(repeat)
    staged = staged_root / sweep_dir.name
    rec = folder.recorded(run_id, repeat) or record_or_none(record_path(staged_root, sweep_dir.name, run_id))
    if rec is not None and rec.attempt == cell.attempt:
        return ("done" if rec.ok else "failed"), note
    if state == "submitted":
        return "pending", note
    if state == "running":
        if read_marker(staged if repeat > 1 else sweep_dir, run_id, 0, attempt=cell.attempt) is None:
            return "pending", note + "; waiting for its turn in the pack"
        return "running", note
    return "ended", note + "; re-run the sweep to collect its record"
