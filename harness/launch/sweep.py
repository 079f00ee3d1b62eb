"""The sweep: every cell of a scenario, each ending in exactly one record. Local cells run one after another
(harness.launch.local); SLURM cells are all submitted at once, as job arrays or packs, then finalized as they end
(harness.launch.slurm). Around them the sweep skips cells that need no run (an ok record exists, unsupported,
predicted not to fit), keeps the manifest, and holds each cell's lock so that two sweeps never run the same cell.

**Repeats** (`repeat=K`): every cell runs K times, in rounds — run 1 of every cell, then run 2 of every cell, … —
so that the runs of one cell are spread over the sweep and sample the noise *between* runs (another job on the
node, clocks, thermal state), which is what `harness compare` then judges on. Each run is its own record
(harness.launch.core.folder: where runs are staged and filed). On SLURM the rounds are submitted in order, each
once the previous one has ended. Re-running a sweep runs only the runs without an ok record.

Why a module of its own: this is the only place that knows about every backend. It picks one per sweep from the
profile's executor (harness.launch.local.backend, harness.launch.slurm.backend) and runs every round through it;
what the backends share comes from here as launch/core's `SweepRound`, so they know nothing of each other or of
the sweep.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, replace
from pathlib import Path

from harness.core.errors import InputError, Problem
from harness.core.progress import Progress
from harness.launch.core.backend import Backend, Round, RoundEnd
from harness.launch.core.folder import SweepFolder
from harness.launch.core.manifest import Manifest, file_lock
from harness.launch.core.outcome import FAILED, describe, skipped_record
from harness.launch.core.payload import host_refusal, make_payload, predict
from harness.launch.local.backend import STOP_SIGNALS, LocalBackend
from harness.launch.local.launchers import local_gpus
from harness.launch.slurm.backend import SlurmBackend
from harness.launch.slurm.jobs import preflight
from harness.plan.placement import Capacity, capacity, host_memory_refusal, placement_refusal
from harness.results.payload import Payload
from harness.results.record import Record
from harness.results.store import check_writable_dir
from harness.scenario.cluster import Cluster
from harness.scenario.schema import Scenario
from harness.scenario.spec import RunSpec
from harness.worker.env import git_sha

__all__ = ["MAX_REPEAT", "STOP_SIGNALS", "Sweep", "SweepResult", "check_repeat", "run_sweep"]


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


def check_repeat(repeat: object, *, option: str = "--repeat") -> int:
    """`repeat` as a run count in 1..MAX_REPEAT; InputError (exit 2) naming the option otherwise."""
    if isinstance(repeat, bool) or not isinstance(repeat, int) or not 1 <= repeat <= MAX_REPEAT:
        raise InputError(
            [Problem(option, "", f"{repeat!r} is not a whole number of runs per cell from 1 to {MAX_REPEAT}")]
        )
    return repeat


@dataclass(frozen=True)
class Sweep:
    """One sweep's settings and state, shared by every cell of it whatever its backend: the folder, the locks, the
    skip decisions and the filing of records (a harness.launch.core.backend.SweepRound to the backends)."""

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
    progress: Progress | None = None
    """the sweep's status line on a terminal (harness.core.progress): the backends count each run's end on it, and
    `echo` prints above it"""

    @property
    def jobs(self) -> Path:
        """submitit's folder (job logs, pickles)."""
        return self.folder.path / ".submitit"

    @property
    def locks(self) -> Path:
        return self.folder.path / ".locks"

    def round(self, repeat: int) -> Sweep:
        return replace(self, repeat=repeat, manifest=self.manifest.for_repeat(repeat))

    def lock(self, spec: RunSpec, *, blocking: bool = False) -> AbstractContextManager[bool]:
        """The cell's lock (held while this sweep is responsible for the cell)."""
        return file_lock(self.locks / f"{spec.run_id}.lock", blocking=blocking)

    def prepare(self, spec: RunSpec, *, tag: str) -> tuple[Record | None, Payload | None]:
        """(record, None) for a run that needs no launch (an ok record exists, or the cell is skipped: unsupported,
        more than the cluster can place, predicted not to fit its devices or, on a local CPU profile, this host's
        memory), else (None, payload). A skipped cell has one record, its first run's: its runs k >= 2 are
        (None, None)."""
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
        if reason is None:
            reason = host_refusal(spec, self.cluster)
        if reason is None and fits is False and not self.no_skip:
            reason = f"predicted not to fit: {predicted.reason} (--no-skip runs it)"
        if reason is None and not self.no_skip:
            # NOTE: a local CPU cell's ranks share this machine's memory: beyond it, the host swaps or the kernel
            # kills whatever it picks (harness.plan.placement)
            host = host_memory_refusal(spec, predicted=predicted, cap=self.capacity)
            reason = None if host is None else f"predicted not to fit this host: {host} (--no-skip runs it)"
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

    def file(self, rec: Record) -> Record:
        """The run's record filed where this round's runs go (SweepFolder.file: as it is for run 1)."""
        return self.folder.file(rec, repeat=self.repeat)


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
    backend = _backend(cluster, no_wait=no_wait, pack=pack)  # NOTE: before the manifest (SLURM's preflight)
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
        overrides=scenario.overrides,
    )
    # NOTE: on a terminal only (harness.core.progress): a log gets the lines it always got
    progress = Progress(f"sweep {scenario.name}", len(specs) * len(rounds), unit="runs")
    sweep = Sweep(
        scenario=scenario,
        cluster=cluster,
        folder=folder,
        manifest=manifest,
        capacity=cap,
        sha=git_sha(),
        echo=progress.above(echo),
        force=force,
        no_skip=no_skip,
        progress=progress,
    )
    with progress:
        end = _run_rounds(sweep, specs, rounds, backend=backend)
    return SweepResult(records=end.records, results_dir=folder.path, wall_s=time.time() - t0, in_flight=end.in_flight)


def _backend(cluster: Cluster, *, no_wait: bool, pack: bool) -> Backend:
    """The profile's backend, checked before anything is written: a SLURM cluster that cannot take jobs leaves
    nothing behind (preflight); `no_wait` and `pack` are SLURM's."""
    if cluster.executor == "slurm":
        preflight(cluster)
        return SlurmBackend(no_wait=no_wait, pack=pack)
    if no_wait or pack:
        raise ValueError(
            f"{'no_wait' if no_wait else 'pack'} needs a SLURM profile: local cells run as children of the sweep"
        )
    return LocalBackend()


def _run_rounds(sweep: Sweep, specs: Sequence[RunSpec], rounds: list[int], *, backend: Backend) -> RoundEnd:
    """Every round through the backend, in order, within its session (the local warm zygote); a round that left
    cells in flight (--no-wait) ends the sweep, and a re-run goes on from there."""
    records: list[Record] = []
    repeated = len(rounds) > 1 or rounds[0] > 1
    with backend.session(sweep, specs):
        for index, k in enumerate(rounds):
            at = Round(k=k, index=index, count=len(rounds), repeated=repeated)
            end = backend.run_round(sweep.round(k), specs, at=at)
            records += end.records
            if end.in_flight:
                if k != rounds[-1]:
                    sweep.echo(
                        f"runs {k + 1}..{rounds[-1]} are submitted once run {k} has ended: re-run the sweep then"
                    )
                return RoundEnd(records, end.in_flight)
    return RoundEnd(records)
