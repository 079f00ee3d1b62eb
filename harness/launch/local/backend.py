"""The local backend: a round's cells run one after another on this machine, each under its lock, each a local
submitit job (launchers.py) whose ranks, on CPU profiles, fork from one warm interpreter that lives as long as the
sweep (prefork.py).

Why a module of its own: this is the local counterpart of SLURM's `SlurmSweep` (harness.launch.slurm): what a
cell's run on this machine does to the manifest and the console, also when the sweep is stopped mid-cell. What
every backend shares (locks, skip decisions, filing) comes from the sweep through launch/core's `SweepRound`.
"""

from __future__ import annotations

import signal
import time
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager, nullcontext
from pathlib import Path

from harness.core.families import FAMILIES
from harness.launch.core.backend import Round, RoundEnd, SweepRound
from harness.launch.core.manifest import Manifest
from harness.launch.core.outcome import Interrupted, cancel_cell, describe, stopped_run
from harness.launch.local import prefork
from harness.launch.local.launchers import launch_submitit
from harness.results.payload import Payload
from harness.results.record import Record
from harness.scenario.cluster import Cluster
from harness.scenario.spec import RunSpec

STOP_SIGNALS = {signal.SIGINT, signal.SIGTERM}
"""what stops a sweep (the cli turns SIGTERM into KeyboardInterrupt as Ctrl-C is)"""


class LocalBackend:
    """A sweep's cells on this machine (harness.launch.core.backend.Backend)."""

    def session(self, sweep: SweepRound, specs: Sequence[RunSpec]) -> AbstractContextManager[object]:
        """The warm zygote the ranks of local CPU cells fork from instead of importing torch each
        (harness.launch.local.prefork); nothing on GPU profiles."""
        if sweep.cluster.device != "cpu":
            return nullcontext()
        log = sweep.jobs / "prefork.log"  # NOTE: third-party chatter at import (DeepSpeed's) stays out of the console
        env = dict(sweep.cluster.env)
        preload = sorted({m for s in specs for m in FAMILIES[s.model_config.family].preload})
        if preload:  # NOTE: what the cells' model families import (a transformers class's package)
            env.setdefault(prefork.PRELOAD_ENV, ",".join(preload))
        return prefork.zygote(env, label=str(sweep.folder.path), log=log)

    def run_round(self, sweep: SweepRound, specs: Sequence[RunSpec], *, at: Round) -> RoundEnd:
        """Each cell's run, one after another; tags count the runs of the whole sweep."""
        flight = LocalSweep(sweep.cluster, folder=sweep.jobs, manifest=sweep.manifest, echo=sweep.echo, file=sweep.file)
        records: list[Record] = []
        total = len(specs) * at.count
        progress = sweep.progress
        for i, spec in enumerate(specs, 1):
            tag = f"[{at.index * len(specs) + i}/{total}] {spec.cell_name}" + (f" run {at.k}" if at.repeated else "")
            if progress is not None:
                progress.doing(spec.cell_name + (f" run {at.k}" if at.repeated else ""))
            rec, ran = self._run_cell(sweep, flight, spec, tag=tag)
            if progress is not None:
                progress.advance(timed=ran)
            if rec is not None:
                records.append(rec)
        return RoundEnd(records)

    @staticmethod
    def _run_cell(sweep: SweepRound, flight: LocalSweep, spec: RunSpec, *, tag: str) -> tuple[Record | None, bool]:
        """One run of one cell, under its lock: its record (None: a skipped cell's run k >= 2, which has none), and
        whether it was run here and now (not recorded already, skipped, or another sweep's)."""
        with sweep.lock(spec) as mine:
            if not mine:
                rec = sweep.record_of_other_sweep(spec, tag=tag)
                if rec is not None:
                    return rec, True
            done, payload = sweep.prepare(spec, tag=tag)
            if done is not None or payload is None:
                return done, False
            return flight.run(spec, payload, tag=tag), True


class LocalSweep:
    """One round's cells on this machine, each run to its end as it is handed over (where SLURM's `SlurmSweep`
    submits them all and then waits): the manifest follows each, and the console says what its record says."""

    def __init__(
        self,
        cluster: Cluster,
        *,
        folder: Path,
        manifest: Manifest,
        echo: Callable[[str], None],
        file: Callable[[Record], Record],
    ):
        """`folder`: submitit's (job logs); `file`: how the sweep files a run's record (SweepRound.file)."""
        self.cluster, self.folder, self.manifest, self.echo, self.file = cluster, folder, manifest, echo, file

    def run(self, spec: RunSpec, payload: Payload, *, tag: str) -> Record:
        """Run the cell and file its record, with the manifest and the console saying what the record says, also
        when the sweep is interrupted (Ctrl-C, SIGTERM): the signals wait while the manifest changes, so a stop
        lands either before the cell's job started (recorded cancelled) or while it runs (cancel_cell decides).

        When anything else stops the sweep at this cell — a write the disk has no room for (its record, the
        manifest: harness.results.store.WriteFailed), or a bug — the cell is recorded failed with what stopped it
        (outcome.stopped_run: never left `running`), and the error goes on up: a re-run resumes at this cell."""
        blocked = signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
        try:
            return self._run(spec, payload, tag=tag, blocked=blocked)
        except Exception as e:
            signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)  # NOTE: the cell's end is filed whole
            try:
                rec, noted = stopped_run(payload, e, manifest=self.manifest)
                also = "" if noted else "; the manifest could not be updated either"
                self.echo(f"{tag}  {describe(rec)}{also}")
            finally:
                signal.pthread_sigmask(signal.SIG_SETMASK, blocked)
            raise

    def _run(self, spec: RunSpec, payload: Payload, *, tag: str, blocked: set[int | signal.Signals]) -> Record:
        """`run` with the stop signals blocked on entry (`blocked`: the mask to go back to)."""
        c0 = time.time()
        try:
            self.manifest.running(spec.run_id, attempt=payload.attempt)
            signal.pthread_sigmask(signal.SIG_SETMASK, blocked)  # NOTE: a stop meanwhile is raised here, in the try
            ended = launch_submitit(
                payload,
                cluster=self.cluster,
                folder=self.folder,
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
                note = "interrupted" + ("" if ended.ok else "; re-run the sweep to resume")
                self._file(spec, ended, tag=tag, note=note)
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
        rec = self.file(ended)
        self.manifest.ended(spec.run_id, rec)
        self.echo(f"{tag}  {describe(rec)}  ({note})")
        return rec
