"""`harness status`: the lines that show each run of the sweeps under a results dir, from each sweep's manifest and
records; a SLURM sweep's runs still in flight with SLURM's live state (one sacct call per sweep).

The lines come one sweep at a time, as each is read, so the command prints a sweep before it asks SLURM about the
next one.
"""

from __future__ import annotations

import shlex
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from harness.core.errors import InputError, Problem

if TYPE_CHECKING:
    from harness.launch.core.manifest import RunEntry, SweepManifest


def status_lines(results_dir: str) -> Iterator[str]:
    """Every line of `harness status RESULTS_DIR`: of its own sweep when the folder is one, else of each sweep
    folder in it. InputError (before any line) when there is no sweep manifest."""
    from harness.launch.core.manifest import read_manifest

    root = Path(results_dir)
    manifests = [root / "manifest.json"] if (root / "manifest.json").exists() else sorted(root.glob("*/manifest.json"))
    if not manifests:
        raise InputError([Problem(results_dir, "", "no sweep manifest found (is this a results dir?)")])
    for mpath in manifests:
        yield from sweep_status_lines(mpath, read_manifest(mpath))


def sweep_status_lines(mpath: Path, manifest: SweepManifest) -> Iterator[str]:
    """One sweep's lines of `harness status`: a header, a line per run (a failed or cancelled run's reason after it,
    as the manifest keeps it), the counts."""
    live, unavailable = _live_slurm_states(manifest)
    counts: dict[str, int] = {}
    runs = {run_id: c.runs() for run_id, c in manifest.cells.items()}
    n_runs = sum(len(r) for r in runs.values())
    repeated = n_runs > len(runs)
    yield (
        f"sweep {manifest.sweep!r} on {manifest.cluster!r}: {len(runs)} cells"
        + set_note(manifest.header.overrides)
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
            why = f"  ({c.reason})" if c.reason and c.state in ("failed", "cancelled") else ""
            yield f"  {state:9s} {c.status or '-':9s} {name}{which}  job {job}{pack}{note}{why}"
    yield "  " + ", ".join(f"{v} {k}" for k, v in sorted(counts.items()))


def set_note(overrides: Sequence[str]) -> str:
    """`--set` overrides as a sweep's first line names them (` (--set micro_batch=2)`), runnable as printed; ''
    without any."""
    return f" ({' '.join(f'--set {shlex.quote(o)}' for o in overrides)})" if overrides else ""


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
    from harness.launch.slurm.sacct import SlurmUnavailable, live_states

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
    from harness.launch.slurm.pack import read_marker
    from harness.launch.slurm.sacct import flight_state
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
