"""The sweep: every cell of a scenario, each ending in exactly one record. Local cells run one after another
(harness.launch.local); SLURM cells are all submitted at once, as job arrays or packs, then finalized as they end
(harness.launch.slurm). Around them the sweep skips cells that need no run (an ok record exists, unsupported,
predicted not to fit), keeps the manifest, and holds each cell's lock so that two sweeps never run the same cell.

Why a module of its own: this is the only place that knows about every backend; the backends share launch/core
and know nothing of each other or of the sweep.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from contextlib import ExitStack, nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness.launch.core.manifest import Manifest, file_lock
from harness.launch.core.outcome import FAILED, describe, skipped_record
from harness.launch.core.payload import make_payload, predict
from harness.launch.local import prefork
from harness.launch.local.launchers import launch_submitit, local_gpus
from harness.launch.slurm.jobs import SlurmSweep, preflight
from harness.plan.placement import Capacity, capacity, placement_refusal
from harness.results.schema import Record
from harness.results.store import check_writable_dir, read_record, record_path, sweep_dir
from harness.scenario.cluster import Cluster
from harness.scenario.schema import RunSpec, Scenario
from harness.worker.env import git_sha


@dataclass
class SweepResult:
    records: list[Record]
    results_dir: Path
    wall_s: float
    in_flight: int = 0
    """cells left running on SLURM by a detached (--no-wait) sweep"""

    @property
    def failed(self) -> list[Record]:
        return [r for r in self.records if r["status"] in FAILED]


def existing_ok(results: str | Path, sweep: str, run_id: str) -> bool:
    try:
        return read_record(record_path(results, sweep, run_id))["status"] == "ok"
    except ValueError:
        return False


def run_sweep(
    scenario: Scenario,
    cluster: Cluster,
    *,
    results: str | Path,
    force: bool = False,
    no_skip: bool = False,
    only: set[str] | None = None,
    no_wait: bool = False,
    pack: bool = False,
    echo: Callable[[str], None] = print,
) -> SweepResult:
    """Run every cell of a scenario, each ending in one record: locally one after another; on SLURM all
    submitted at once (job arrays, or with `pack` one job per job shape running its cells back to back), then
    each finalized as it ends — or left running with `no_wait`."""
    t0 = time.time()
    results = Path(results)
    specs = scenario.expand(gpus_per_node=cluster.gpus_per_node)
    if only is not None:
        specs = [s for s in specs if s.run_id in only]
    # NOTE: before anything is written or launched: an unwritable results dir is one line (InputError), not a
    # traceback from the manifest's lock
    check_writable_dir(sweep_dir(results, scenario.name), option="--results")
    # what the cluster can place (harness.plan.placement): read once, before the first cell
    cap = capacity(cluster, gpus=local_gpus)
    if cluster.executor == "slurm":
        preflight(cluster)  # NOTE: before the manifest: a cluster that cannot take jobs leaves nothing behind
    elif no_wait or pack:
        raise ValueError(
            f"{'no_wait' if no_wait else 'pack'} needs a SLURM profile: local cells run as children of the sweep"
        )
    sha = git_sha()
    manifest = Manifest.open(
        results,
        scenario.name,
        scenario=scenario.path,
        cluster=cluster.name,
        executor=cluster.executor,
        run_ids=[s.run_id for s in specs],
    )
    folder = sweep_dir(results, scenario.name) / ".submitit"
    locks = sweep_dir(results, scenario.name) / ".locks"
    sweep: dict[str, Any] = dict(
        scenario=scenario,
        cluster=cluster,
        results=results,
        force=force,
        no_skip=no_skip,
        manifest=manifest,
        sha=sha,
        echo=echo,
        capacity=cap,
    )
    if cluster.executor == "slurm":
        on_slurm, in_flight = _run_on_slurm(specs, folder=folder, locks=locks, no_wait=no_wait, pack=pack, **sweep)
        return SweepResult(
            records=on_slurm,
            results_dir=sweep_dir(results, scenario.name),
            wall_s=time.time() - t0,
            in_flight=in_flight,
        )
    records: list[Record] = []
    # ranks of local CPU cells fork from one warm interpreter instead of importing torch each
    # (harness.launch.local.prefork)
    with (
        prefork.zygote(cluster.env, label=str(sweep_dir(results, scenario.name)))
        if cluster.device == "cpu"
        else nullcontext()
    ):
        for i, spec in enumerate(specs, 1):
            tag = f"[{i}/{len(specs)}] {spec.run_id}"
            with file_lock(locks / f"{spec.run_id}.lock", blocking=False) as mine:
                if not mine:
                    rec = _record_of_other_sweep(
                        spec, tag=tag, locks=locks, results=results, sweep=scenario.name, echo=echo
                    )
                    if rec is not None:
                        records.append(rec)
                        continue
                records.append(_run_cell(spec, tag=tag, folder=folder, **sweep))
    return SweepResult(records=records, results_dir=sweep_dir(results, scenario.name), wall_s=time.time() - t0)


def _record_of_other_sweep(
    spec: RunSpec, *, tag: str, locks: Path, results: Path, sweep: str, echo: Callable[[str], None]
) -> Record | None:
    """Wait until the sweep that holds the cell's lock lets go; its record, or None when it left none."""
    echo(f"{tag}  running in another sweep; waiting for its record")
    with file_lock(locks / f"{spec.run_id}.lock"):
        pass
    try:
        rec = read_record(record_path(results, sweep, spec.run_id))
    except ValueError:
        return None
    echo(f"{tag}  {describe(rec)}  (recorded by the other sweep)")
    return rec


def _prepare_cell(
    spec: RunSpec,
    *,
    tag: str,
    scenario: Scenario,
    cluster: Cluster,
    results: Path,
    force: bool,
    no_skip: bool,
    manifest: Manifest,
    sha: str | None,
    echo: Callable[[str], None],
    capacity: Capacity,
) -> tuple[Record | None, dict | None]:
    """(record, None) for a cell that needs no run (an ok record exists, or it is skipped: unsupported, more than
    the cluster can place, predicted not to fit), else (None, payload)."""
    if not force and existing_ok(results, scenario.name, spec.run_id):
        echo(f"{tag}  ok (already recorded; --force reruns)")
        manifest.set(spec.run_id, state="done", status="ok")
        return read_record(record_path(results, scenario.name, spec.run_id)), None
    predicted = predict(spec, cluster)
    reason = spec.unsupported_reason(cluster.device)
    if reason is None:
        reason = placement_refusal(spec, cluster, capacity)
    if reason is None and predicted is not None and predicted.get("fits") is False and not no_skip:
        reason = f"predicted not to fit: {predicted.get('reason')} (--no-skip runs it)"
    if reason is not None:
        rec = skipped_record(
            spec, sweep=scenario.name, cluster=cluster, results=results, reason=reason, predicted=predicted
        )
        manifest.set(spec.run_id, state="skipped", status="skipped")
        echo(f"{tag}  skipped: {reason}")
        return rec, None
    return None, make_payload(spec, sweep=scenario.name, cluster=cluster, results=results, sha=sha, predicted=predicted)


def _run_cell(
    spec: RunSpec,
    *,
    tag: str,
    scenario: Scenario,
    cluster: Cluster,
    results: Path,
    force: bool,
    no_skip: bool,
    manifest: Manifest,
    folder: Path,
    sha: str | None,
    echo: Callable[[str], None],
    capacity: Capacity,
) -> Record:
    rec, payload = _prepare_cell(
        spec,
        tag=tag,
        scenario=scenario,
        cluster=cluster,
        results=results,
        force=force,
        no_skip=no_skip,
        manifest=manifest,
        sha=sha,
        echo=echo,
        capacity=capacity,
    )
    if rec is not None:
        return rec
    assert payload is not None  # _prepare_cell returns one of the two
    manifest.set(spec.run_id, state="running", status=None, attempt=payload["attempt"])
    c0 = time.time()
    try:
        rec = launch_submitit(
            payload,
            cluster=cluster,
            folder=folder,
            time_limit_s=spec.settings.time_limit_s,
            on_submit=lambda job: manifest.set(spec.run_id, job_id=str(job.job_id)),
        )
    except KeyboardInterrupt:
        manifest.set(spec.run_id, state="cancelled", status="cancelled")
        echo(f"{tag}  cancelled (interrupted; re-run the sweep to resume)")
        raise
    manifest.set(spec.run_id, state="done" if rec["status"] == "ok" else "failed", status=rec["status"])
    echo(f"{tag}  {describe(rec)}  ({time.time() - c0:.1f} s)")
    return rec


def _run_on_slurm(
    specs: list[RunSpec], *, scenario: Scenario, results: Path, locks: Path, echo: Callable[[str], None], **sweep: Any
) -> tuple[list[Record], int]:
    """(records, cells left in flight): every cell through _slurm_round; a cell another sweep was handling is
    taken from its record, or, when that sweep let go without one (it detached), in a second round."""
    tags = {s.run_id: f"[{i}/{len(specs)}] {s.run_id}" for i, s in enumerate(specs, 1)}
    records: dict[str, Record] = {}
    in_flight = 0
    todo = specs
    for _ in range(2):
        busy, left = _slurm_round(
            todo, tags=tags, records=records, scenario=scenario, results=results, locks=locks, echo=echo, **sweep
        )
        in_flight += left
        todo = []
        for spec in busy:
            rec = _record_of_other_sweep(
                spec, tag=tags[spec.run_id], locks=locks, results=results, sweep=scenario.name, echo=echo
            )
            if rec is None:
                todo.append(spec)
            else:
                records[spec.run_id] = rec
        if not todo:
            break
    for spec in todo:
        echo(f"{tags[spec.run_id]}  left to another sweep (no record yet); re-run to collect it")
    return [records[s.run_id] for s in specs if s.run_id in records], in_flight


def _slurm_round(
    specs: list[RunSpec],
    *,
    tags: dict[str, str],
    records: dict[str, Record],
    scenario: Scenario,
    cluster: Cluster,
    results: Path,
    force: bool,
    no_skip: bool,
    no_wait: bool,
    pack: bool,
    manifest: Manifest,
    folder: Path,
    locks: Path,
    sha: str | None,
    echo: Callable[[str], None],
    capacity: Capacity,
) -> tuple[list[RunSpec], int]:
    """Re-attach to the jobs an earlier sweep left queued or running, submit every other cell that needs a run
    (job arrays; with `pack`, one job per pack of same-shaped cells), then finalize each as it ends — unless
    `no_wait`. Fills `records`; returns the cells another sweep holds and how many cells were left in flight."""
    busy: list[RunSpec] = []
    with ExitStack() as held:  # each cell's lock, for as long as this sweep is responsible for the cell
        flight = SlurmSweep(cluster, folder=folder, manifest=manifest, echo=echo)
        to_submit = []
        for spec in specs:
            tag = tags[spec.run_id]
            if not held.enter_context(file_lock(locks / f"{spec.run_id}.lock", blocking=False)):
                busy.append(spec)
                continue
            if flight.reattach(spec.run_id, tag=tag):
                continue
            rec, payload = _prepare_cell(
                spec,
                tag=tag,
                scenario=scenario,
                cluster=cluster,
                results=results,
                force=force,
                no_skip=no_skip,
                manifest=manifest,
                sha=sha,
                echo=echo,
                capacity=capacity,
            )
            if rec is not None:
                records[spec.run_id] = rec
            else:
                assert payload is not None  # _prepare_cell returns one of the two
                to_submit.append((payload, tag))
        try:
            records.update(flight.submit(to_submit, pack=pack))
            if not no_wait:
                records.update(flight.wait())
        except KeyboardInterrupt:
            # NOTE: an interrupted sweep cancels its jobs and records them cancelled, as the local path does (a
            # re-run resubmits them); detaching is what --no-wait is for
            flight.cancel_all(reason="the sweep was interrupted")
            raise
        return busy, flight.detach() if no_wait else 0
