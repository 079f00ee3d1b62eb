"""`harness sweep` and `harness run` from their options: the scenario with the command's flags applied, what is
refused before anything runs, and what is printed around the sweep or the one cell run in the foreground.

The sweep itself is harness.launch.sweep.run_sweep, which the command calls between `start_sweep` and
`summary_lines`: nothing in launch imports the sweep (tests/unit/test_layers.py), so this module sits beside it.
`run_cell` is `harness run` whole: one cell in the foreground (harness.launch.local.launchers).
"""

from __future__ import annotations

import dataclasses
import json
import os
import shlex
import shutil
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from harness.core.errors import InputError, Problem, one_of
from harness.launch.status import set_note
from harness.scenario.cluster import Cluster, load_cluster
from harness.scenario.schema import Scenario, load_scenario

if TYPE_CHECKING:
    from harness.results.record import Record


@dataclass(frozen=True)
class SweepStart:
    """A sweep as `harness sweep`'s options ask for it, checked and ready for run_sweep."""

    scenario: Scenario
    """the scenario file's, with --set, --trace and --checkpoint applied"""
    cluster: Cluster
    lines: list[str]
    """what the command prints before the first cell: the cells, where they run, the matrix cells left out"""


class FinishedSweep(Protocol):
    """What `summary_lines` reads of a finished sweep: harness.launch.sweep.SweepResult, named by its shape here
    because nothing in launch imports the sweep."""

    @property
    def records(self) -> Sequence[Record]: ...
    @property
    def results_dir(self) -> Path: ...
    @property
    def wall_s(self) -> float: ...
    @property
    def in_flight(self) -> int: ...


def start_sweep(
    scenario_file: str,
    *,
    cluster_name: str,
    results: str,
    no_wait: bool,
    pack: bool,
    repeat: int,
    trace: bool,
    checkpoint: bool,
    overrides: Sequence[str] = (),
) -> SweepStart:
    """The sweep of `scenario_file` (with the `--set` `overrides` applied: the manifest records them) on the profile
    `cluster_name` into `results` (`repeat` runs a cell, checked already), with what is refused before anything runs
    or is printed: --no-wait or --pack on a profile that runs cells locally, a results folder that cannot be
    written."""
    from harness.results.store import check_writable_dir, sweep_dir

    sc = load_scenario(scenario_file, overrides=overrides)
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
    lines = [
        f"sweep {sc.name!r}: {len(specs)} cells on cluster {cluster.name!r} ({cluster.executor}, {cluster.device})"
        + set_note(sc.overrides)
        + (f", {repeat} runs each" if repeat > 1 else "")
        + (", packed" if pack else "")
    ]
    if left_out:
        more = f" (and {len(left_out) - 1} more)" if len(left_out) > 1 else ""
        lines.append(f"{len(left_out)} matrix cell(s) left out by tune.global_batch: {left_out[0][1]}{more}")
    return SweepStart(sc, cluster, lines)


def summary_lines(res: FinishedSweep, *, results: str) -> list[str]:
    """What `harness sweep` prints after its cells: the runs by status (and those still on SLURM), the wall time
    (s), where the records are, and the commands that read them, each on its own line, runnable as printed."""
    counts: dict[str, int] = {}
    for r in res.records:
        counts[r.status] = counts.get(r.status, 0) + 1
    summary = ", ".join(f"{v} {k}" for k, v in sorted(counts.items()))
    if res.in_flight:
        summary = ", ".join(filter(None, [summary, f"{res.in_flight} still on SLURM"]))
    me, folder = this_command(), shlex.quote(str(res.results_dir))
    # NOTE: each command on a line of its own, nothing else on it: a `|` between two read as a shell pipe
    return [
        f"done in {res.wall_s:.1f} s: {summary}",
        f"records: {res.results_dir}/  (read them with:)",
        f"  {me} report {shlex.quote(results)}",
        f"  {me} status {folder}",
    ]


def ran_nothing(res: FinishedSweep) -> bool:
    """Every run the sweep ended was skipped (none ok, none failed, none left on SLURM): it measured nothing, and
    `harness sweep` exits 1 (docs/exit-codes.md). A re-run whose cells all had ok records is not this."""
    return bool(res.records) and not res.in_flight and all(r.status == "skipped" for r in res.records)


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


def run_cell(
    scenario_file: str,
    *,
    cell: str,
    cluster_name: str,
    results: str,
    as_json: bool,
    echo: Callable[[str], None],
    no_skip: bool = False,
    overrides: Sequence[str] = (),
) -> int:
    """Run the cell of the scenario whose run_id is `cell` (or starts with it) in the foreground, its ranks children
    of this process (the options are `harness run`'s); its record as one line, or as JSON with `as_json`. Returns 0
    when the record is ok, else 1: a failed cell, or a skipped one, which ran nothing (as a sweep whose every cell was
    skipped; docs/exit-codes.md)."""
    from harness.launch.core.outcome import describe, skipped_record
    from harness.launch.core.payload import host_refusal, make_payload, predict
    from harness.launch.local.launchers import launch_foreground, local_gpus
    from harness.plan.placement import capacity, host_memory_refusal, placement_refusal
    from harness.results.store import check_writable_dir, sweep_dir
    from harness.worker.env import git_sha

    sc = load_scenario(scenario_file, overrides=overrides)
    cluster = load_cluster(cluster_name)
    specs = sc.expand(gpus_per_node=cluster.gpus_per_node)
    matches = [s for s in specs if s.run_id == cell] or [s for s in specs if s.run_id.startswith(cell)]
    if len(matches) != 1:
        ids = [s.run_id for s in specs]
        msg = "matches several cells: " + ", ".join(s.run_id for s in matches) if matches else one_of(cell, ids)
        raise InputError([Problem(scenario_file, "--cell", msg)])
    spec = matches[0]
    check_writable_dir(sweep_dir(results, sc.name), option="--results")
    predicted = predict(spec, cluster)
    # NOTE: a cell this machine cannot host is refused before any rank starts (harness.plan.placement); the ranks
    # are children of this process whatever the profile's executor, so the limit is always the local one
    here = dataclasses.replace(cluster, executor="local")
    cap = capacity(here, gpus=local_gpus)
    reason = spec.unsupported_reason(cluster.device) or placement_refusal(spec, here, cap) or host_refusal(spec, here)
    if reason is None and not no_skip and (host := host_memory_refusal(spec, predicted=predicted, cap=cap)):
        reason = f"predicted not to fit this host: {host} (--no-skip runs it)"
    if reason:
        rec = skipped_record(spec, sweep=sc.name, cluster=cluster, results=results, reason=reason, predicted=predicted)
    else:
        payload = make_payload(
            spec, sweep=sc.name, cluster=cluster, results=results, sha=git_sha(), predicted=predicted
        )
        rec = launch_foreground(payload, time_limit_s=spec.settings.time_limit_s)
    echo(json.dumps(rec.to_dict(), indent=2) if as_json else f"{spec.cell_name}  {describe(rec)}")
    return 0 if rec.ok else 1
