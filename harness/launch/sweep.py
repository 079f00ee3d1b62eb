"""The sweep: every cell of a scenario, each ending in exactly one record. Local cells run one after another
(harness.launch.local); SLURM cells are all submitted at once, as job arrays or packs, then finalized as they end
(harness.launch.slurm). Around them the sweep skips cells that need no run (an ok record exists, unsupported,
predicted not to fit), keeps the manifest, and holds each cell's lock so that two sweeps never run the same cell.

**Repeats** (`repeat=K`): every cell runs K times, in rounds — run 1 of every cell, then run 2 of every cell, … —
so that the runs of one cell are spread over the sweep and sample the noise *between* runs (another job on the
node, clocks, thermal state), which is what `harness compare` then judges on. Each run is its own record
(harness.launch.core.folder: where runs are staged and filed). On SLURM the rounds are submitted in order, each
once the previous one has ended. Re-running a sweep runs only the runs without an ok record.

Why a module of its own: this is the only place that knows about every backend; the backends share launch/core
and know nothing of each other or of the sweep.
"""

from __future__ import annotations

import signal
import time
from collections.abc import Callable
from contextlib import ExitStack, nullcontext
from dataclasses import dataclass, replace
from pathlib import Path

from harness.core.errors import InputError, Problem
from harness.launch.core.folder import SweepFolder
from harness.launch.core.manifest import Manifest, file_lock
from harness.launch.core.outcome import FAILED, Interrupted, cancel_cell, describe, skipped_record
from harness.launch.core.payload import make_payload, predict
from harness.launch.local import prefork
from harness.launch.local.launchers import launch_submitit, local_gpus
from harness.launch.slurm.jobs import SlurmSweep, preflight
from harness.plan.placement import Capacity, capacity, placement_refusal
from harness.results.payload import Payload
from harness.results.record import Record
from harness.results.store import check_writable_dir
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
        return [r for r in self.records if r.status in FAILED]


MAX_REPEAT = 100
"""the most runs per cell `--repeat` takes (a typo such as 10**9 is refused, not started)"""


STOP_SIGNALS = {signal.SIGINT, signal.SIGTERM}
"""what stops a sweep (the cli turns SIGTERM into KeyboardInterrupt as Ctrl-C is)"""


def check_repeat(repeat: object, *, option: str = "--repeat") -> int:
    """`repeat` as a run count in 1..MAX_REPEAT; InputError (exit 2) naming the option otherwise."""
    if isinstance(repeat, bool) or not isinstance(repeat, int) or not 1 <= repeat <= MAX_REPEAT:
        raise InputError(
            [Problem(option, "", f"{repeat!r} is not a whole number of runs per cell from 1 to {MAX_REPEAT}")]
        )
    return repeat


@dataclass(frozen=True)
class Sweep:
    """One sweep's settings and state, shared by every cell of it (what each step of a cell needs)."""

    scenario: Scenario
    cluster: Cluster
    folder: SweepFolder
    manifest: Manifest
    """the view of the round being run (Manifest.for_repeat)"""
    capacity: Capacity
    """what the cluster can place (harness.plan.placement), read once"""
    sha: str | None
    echo: Callable[[str], None]
    force: bool = False
    no_skip: bool = False
    repeat: int = 1
    """the run of each cell this round is"""

    @property
    def jobs(self) -> Path:
        """submitit's folder (job logs, pickles)."""
        return self.folder.path / ".submitit"

    @property
    def locks(self) -> Path:
        return self.folder.path / ".locks"

    def round(self, repeat: int) -> Sweep:
        return replace(self, repeat=repeat, manifest=self.manifest.for_repeat(repeat))

    def lock(self, spec: RunSpec, *, blocking: bool = False):
        """The cell's lock (held while this sweep is responsible for the cell)."""
        return file_lock(self.locks / f"{spec.run_id}.lock", blocking=blocking)

    def prepare(self, spec: RunSpec, *, tag: str) -> tuple[Record | None, Payload | None]:
        """(record, None) for a run that needs no launch (an ok record exists, or the cell is skipped: unsupported,
        more than the cluster can place, predicted not to fit), else (None, payload). A skipped cell has one record,
        its first run's: its runs k >= 2 are (None, None)."""
        if not self.force:
            done = self.folder.ok_run(spec.run_id, self.repeat)
            if done is not None:
                self.echo(f"{tag}  ok (already recorded; --force reruns)")
                self.manifest.ended(spec.run_id, done)
                return done, None
        predicted = predict(spec, self.cluster)
        reason = self._refusal(spec, predicted.fits if predicted is not None else None, predicted)
        if reason is not None:
            self.manifest.skipped(spec.run_id)
            if self.repeat > 1:
                self.echo(f"{tag}  skipped (as its first run)")
                return None, None
            rec = skipped_record(
                spec,
                sweep=self.scenario.name,
                cluster=self.cluster,
                results=self.folder.results,
                reason=reason,
                predicted=predicted,
            )
            self.echo(f"{tag}  skipped: {reason}")
            return rec, None
        root = self.folder.staging_root(self.repeat)
        payload = make_payload(
            spec, sweep=self.scenario.name, cluster=self.cluster, results=root, sha=self.sha, predicted=predicted
        )
        return None, payload

    def _refusal(self, spec: RunSpec, fits: bool | None, predicted) -> str | None:
        """Why the cell is skipped rather than launched, or None."""
        reason = spec.unsupported_reason(self.cluster.device)
        if reason is None:
            reason = placement_refusal(spec, self.cluster, self.capacity)
        if reason is None and fits is False and not self.no_skip:
            reason = f"predicted not to fit: {predicted.reason} (--no-skip runs it)"
        return reason

    def record_of_other_sweep(self, spec: RunSpec, *, tag: str) -> Record | None:
        """Wait until the sweep that holds the cell's lock lets go; its record of this run, or None when it left
        none."""
        self.echo(f"{tag}  running in another sweep; waiting for its record")
        with self.lock(spec, blocking=True):
            pass
        rec = self.folder.recorded(spec.run_id, self.repeat)
        if rec is not None:
            self.echo(f"{tag}  {describe(rec)}  (recorded by the other sweep)")
        return rec

    # ---- local cells, one after another

    def run_local(self, spec: RunSpec, *, tag: str) -> Record | None:
        """One run of one local cell, under its lock: its record (None: a skipped cell's run k >= 2, which has
        none)."""
        with self.lock(spec) as mine:
            if not mine:
                rec = self.record_of_other_sweep(spec, tag=tag)
                if rec is not None:
                    return rec
            done, payload = self.prepare(spec, tag=tag)
            if done is not None or payload is None:
                return done
            return self._launch_local(spec, payload, tag=tag)

    def _launch_local(self, spec: RunSpec, payload: Payload, *, tag: str) -> Record:
        """Run the cell and file its record, with the manifest and the console saying what the record says, also
        when the sweep is interrupted (Ctrl-C, SIGTERM): the signals wait while the manifest changes, so a stop
        lands either before the cell's job started (recorded cancelled) or while it runs (cancel_cell decides)."""
        blocked = signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
        c0 = time.time()
        try:
            self.manifest.running(spec.run_id, attempt=payload.attempt)
            signal.pthread_sigmask(signal.SIG_SETMASK, blocked)  # NOTE: a stop meanwhile is raised here, in the try
            ended = launch_submitit(
                payload,
                cluster=self.cluster,
                folder=self.jobs,
                time_limit_s=spec.settings.time_limit_s,
                on_submit=lambda job: self.manifest.job(spec.run_id, job_id=str(job.job_id)),
            )
        except KeyboardInterrupt as stop:
            signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)  # a second Ctrl-C must not cut the filing short
            try:
                if isinstance(stop, Interrupted):
                    ended = stop.record
                else:  # before the cell's job existed: nothing ran
                    limit = spec.settings.time_limit_s
                    ended = cancel_cell(payload, kill=lambda: None, elapsed_s=time.time() - c0, time_limit_s=limit)
                self._file(
                    spec, ended, tag=tag, note="interrupted" + ("" if ended.ok else "; re-run the sweep to resume")
                )
            finally:
                signal.pthread_sigmask(signal.SIG_SETMASK, blocked)
            raise
        signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
        try:
            return self._file(spec, ended, tag=tag, note=f"{time.time() - c0:.1f} s")
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, blocked)

    def _file(self, spec: RunSpec, ended: Record, *, tag: str, note: str) -> Record:
        """The cell's record into the sweep folder, its state into the manifest, its line on the console: one truth."""
        rec = self.folder.file(ended, repeat=self.repeat)
        self.manifest.ended(spec.run_id, rec)
        self.echo(f"{tag}  {describe(rec)}  ({note})")
        return rec

    # ---- SLURM cells, all at once

    def run_on_slurm(self, specs: list[RunSpec], *, no_wait: bool, pack: bool) -> tuple[list[Record], int]:
        """(records, cells left in flight) of this run of every cell, through slurm_round; a cell another sweep
        was handling is taken from its record, or, when that sweep let go without one (it detached), in a second
        round."""
        tags = {s.run_id: f"[{i}/{len(specs)}] {s.cell_name}" for i, s in enumerate(specs, 1)}
        records: dict[str, Record] = {}
        in_flight = 0
        todo = specs
        for _ in range(2):
            busy, left = self.slurm_round(todo, tags=tags, records=records, no_wait=no_wait, pack=pack)
            in_flight += left
            todo = []
            for spec in busy:
                rec = self.record_of_other_sweep(spec, tag=tags[spec.run_id])
                if rec is None:
                    todo.append(spec)
                else:
                    records[spec.run_id] = rec
            if not todo:
                break
        for spec in todo:
            self.echo(f"{tags[spec.run_id]}  left to another sweep (no record yet); re-run to collect it")
        return [records[s.run_id] for s in specs if s.run_id in records], in_flight

    def slurm_round(
        self, specs: list[RunSpec], *, tags: dict[str, str], records: dict[str, Record], no_wait: bool, pack: bool
    ) -> tuple[list[RunSpec], int]:
        """Re-attach to the jobs an earlier sweep left queued or running, submit every other cell that needs a run
        (job arrays; with `pack`, one job per pack of same-shaped cells), then finalize each as it ends — unless
        `no_wait`. Fills `records`; returns the cells another sweep holds and how many cells were left in flight."""
        busy: list[RunSpec] = []
        with ExitStack() as held:  # each cell's lock, for as long as this sweep is responsible for the cell
            flight = SlurmSweep(self.cluster, folder=self.jobs, manifest=self.manifest, echo=self.echo)
            to_submit = []
            for spec in specs:
                tag = tags[spec.run_id]
                if not held.enter_context(self.lock(spec)):
                    busy.append(spec)
                    continue
                if flight.reattach(spec.run_id, tag=tag):
                    continue
                rec, payload = self.prepare(spec, tag=tag)
                if rec is not None:
                    records[spec.run_id] = rec
                elif payload is not None:
                    to_submit.append((payload, tag))
            try:
                ended = flight.submit(to_submit, pack=pack)
                if not no_wait:
                    ended.update(flight.wait())
                records.update({k: self.folder.file(r, repeat=self.repeat) for k, r in ended.items()})
            except KeyboardInterrupt:
                # NOTE: an interrupted sweep cancels its jobs and records them cancelled, as the local path does (a
                # re-run resubmits them); detaching is what --no-wait is for
                flight.cancel_all(reason="the sweep was interrupted")
                raise
            return busy, flight.detach() if no_wait else 0


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
    repeat: int = 1,
    append: bool = False,
) -> SweepResult:
    """Run every cell of a scenario, each ending in one record: locally one after another; on SLURM all
    submitted at once (job arrays, or with `pack` one job per job shape running its cells back to back), then
    each finalized as it ends — or left running with `no_wait`.

    `repeat` K: every cell K times, in rounds (see the module docstring); with `no_wait` the sweep returns after
    the first round it left running, and a re-run goes on from there. `append`: K *more* runs of each cell,
    numbered after the highest run any of them has recorded (`history check --confirm`); the records returned
    are then only the new runs'."""
    t0 = time.time()
    repeat = check_repeat(repeat)
    folder = SweepFolder(Path(results), scenario.name)
    specs = scenario.expand(gpus_per_node=cluster.gpus_per_node)
    if only is not None:
        specs = [s for s in specs if s.run_id in only]
    first = 1 + (max(folder.runs_recorded(s.run_id for s in specs).values(), default=0) if append else 0)
    rounds = list(range(first, first + repeat))
    # NOTE: before anything is written or launched: an unwritable results dir is one line (InputError), not a
    # traceback from the manifest's lock
    check_writable_dir(folder.path, option="--results")
    cap = capacity(cluster, gpus=local_gpus)
    if cluster.executor == "slurm":
        preflight(cluster)  # NOTE: before the manifest: a cluster that cannot take jobs leaves nothing behind
    elif no_wait or pack:
        raise ValueError(
            f"{'no_wait' if no_wait else 'pack'} needs a SLURM profile: local cells run as children of the sweep"
        )
    manifest = Manifest.open(
        folder.results,
        scenario.name,
        scenario=scenario.path,
        cluster=cluster.name,
        executor=cluster.executor,
        run_ids=[s.run_id for s in specs],
        layouts={s.run_id: s.layout_tag for s in specs if s.layout_tag},
        scenario_file=str(Path(scenario.path).resolve()),
        cluster_file=str(Path(cluster.path).resolve()) if cluster.path else None,
        repeats=rounds,
    )
    sweep = Sweep(
        scenario=scenario,
        cluster=cluster,
        folder=folder,
        manifest=manifest,
        capacity=cap,
        sha=git_sha(),
        echo=echo,
        force=force,
        no_skip=no_skip,
    )
    repeated = len(rounds) > 1 or rounds[0] > 1
    if cluster.executor == "slurm":
        records, in_flight = _slurm_rounds(sweep, specs, rounds, repeated=repeated, no_wait=no_wait, pack=pack)
        return SweepResult(records=records, results_dir=folder.path, wall_s=time.time() - t0, in_flight=in_flight)
    return SweepResult(
        records=_local_rounds(sweep, specs, rounds, repeated=repeated), results_dir=folder.path, wall_s=time.time() - t0
    )


def _slurm_rounds(
    sweep: Sweep, specs: list[RunSpec], rounds: list[int], *, repeated: bool, no_wait: bool, pack: bool
) -> tuple[list[Record], int]:
    """Every round on SLURM, each submitted once the previous one has ended (with `no_wait`: the first one left
    running ends the sweep; a re-run goes on)."""
    records: list[Record] = []
    in_flight = 0
    for k in rounds:
        if repeated:
            sweep.echo(f"run {k} of each cell ({len(specs)} cells)")
        got, in_flight = sweep.round(k).run_on_slurm(specs, no_wait=no_wait, pack=pack)
        records += got
        if in_flight:
            if k != rounds[-1]:
                sweep.echo(f"runs {k + 1}..{rounds[-1]} are submitted once run {k} has ended: re-run the sweep then")
            break
    return records, in_flight


def _local_rounds(sweep: Sweep, specs: list[RunSpec], rounds: list[int], *, repeated: bool) -> list[Record]:
    """Every round locally, cell after cell; the ranks of local CPU cells fork from one warm interpreter instead
    of importing torch each (harness.launch.local.prefork)."""
    records: list[Record] = []
    warm = sweep.cluster.device == "cpu"
    log = sweep.jobs / "prefork.log"  # NOTE: third-party chatter at import (DeepSpeed's) stays out of the console
    with prefork.zygote(sweep.cluster.env, label=str(sweep.folder.path), log=log) if warm else nullcontext():
        total = len(specs) * len(rounds)
        for r, k in enumerate(rounds):
            this = sweep.round(k)
            for i, spec in enumerate(specs, 1):
                tag = f"[{r * len(specs) + i}/{total}] {spec.cell_name}" + (f" run {k}" if repeated else "")
                rec = this.run_local(spec, tag=tag)
                if rec is not None:
                    records.append(rec)
    return records
