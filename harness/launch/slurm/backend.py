"""The SLURM backend: a round's cells all submitted at once (job arrays, or with `--pack` one job per pack), each
finalized as its job ends (jobs.py's `SlurmSweep`) — or left running with `--no-wait`.

Why a module of its own: this is the round as a sweep runs it on SLURM — which cells it takes (their locks, the
jobs an earlier sweep left to re-attach to, the skip decisions), what it does with the cells another sweep holds,
and what an interrupt does — beside jobs.py, which knows SLURM (sbatch, sacct, arrays, packs) and not the sweep.
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import AbstractContextManager, ExitStack, nullcontext

from harness.launch.core.backend import Round, RoundEnd, SweepRound
from harness.launch.slurm.jobs import SlurmSweep
from harness.results.payload import Payload
from harness.results.record import Record
from harness.scenario.spec import RunSpec


class SlurmBackend:
    """A sweep's cells on SLURM (harness.launch.core.backend.Backend). `no_wait`: submit and return, leaving the
    jobs running (a re-run re-attaches); `pack`: same-shaped cells share one job (harness.launch.slurm.pack)."""

    def __init__(self, *, no_wait: bool = False, pack: bool = False):
        self.no_wait, self.pack = no_wait, pack

    def session(self, sweep: SweepRound, specs: Sequence[RunSpec]) -> AbstractContextManager[object]:  # noqa: ARG002 - the interface's
        """Nothing lives longer than a round on SLURM."""
        return nullcontext()

    def run_round(self, sweep: SweepRound, specs: Sequence[RunSpec], *, at: Round) -> RoundEnd:
        """This run of every cell, through `_take`; a cell another sweep was handling is taken from its record, or,
        when that sweep let go without one (it detached), in a second pass."""
        if at.repeated:
            sweep.echo(f"run {at.k} of each cell ({len(specs)} cells)")
        tags = {s.run_id: f"[{i}/{len(specs)}] {s.cell_name}" for i, s in enumerate(specs, 1)}
        records: dict[str, Record] = {}
        in_flight = 0
        todo = list(specs)
        for _ in range(2):
            busy, left = self._take(sweep, todo, tags=tags, records=records)
            in_flight += left
            todo = []
            for spec in busy:
                rec = sweep.record_of_other_sweep(spec, tag=tags[spec.run_id])
                if rec is None:
                    todo.append(spec)
                else:
                    records[spec.run_id] = rec
                    if sweep.progress is not None:
                        sweep.progress.advance()
            if not todo:
                break
        for spec in todo:
            sweep.echo(f"{tags[spec.run_id]}  left to another sweep (no record yet); re-run to collect it")
        return RoundEnd([records[s.run_id] for s in specs if s.run_id in records], in_flight)

    def _take(
        self, sweep: SweepRound, specs: list[RunSpec], *, tags: dict[str, str], records: dict[str, Record]
    ) -> tuple[list[RunSpec], int]:
        """Re-attach to the jobs an earlier sweep left queued or running, submit every other cell that needs a run,
        then finalize each as it ends — unless `no_wait`. Fills `records`; returns the cells another sweep holds and
        how many cells were left in flight."""
        busy: list[RunSpec] = []
        with ExitStack() as held:  # each cell's lock, for as long as this sweep is responsible for the cell
            flight = SlurmSweep(
                sweep.cluster, folder=sweep.jobs, manifest=sweep.manifest, echo=sweep.echo, progress=sweep.progress
            )
            to_submit: list[tuple[Payload, str]] = []
            for spec in specs:
                tag = tags[spec.run_id]
                if not held.enter_context(sweep.lock(spec)):
                    busy.append(spec)
                    continue
                if flight.reattach(spec.run_id, tag=tag):
                    continue
                rec, payload = sweep.prepare(spec, tag=tag)
                if rec is not None:
                    records[spec.run_id] = rec
                if payload is None and sweep.progress is not None:  # recorded already, or skipped: no time taken
                    sweep.progress.advance(timed=False)
                elif payload is not None:
                    to_submit.append((payload, tag))
            try:
                ended = flight.submit(to_submit, pack=self.pack)
                if not self.no_wait:
                    ended.update(flight.wait())
                records.update({k: sweep.file(r) for k, r in ended.items()})
            except KeyboardInterrupt:
                # NOTE: an interrupted sweep cancels its jobs and records them cancelled, as the local backend does (a
                # re-run resubmits them); detaching is what --no-wait is for
                flight.cancel_all(reason="the sweep was interrupted")
                raise
            except Exception:
                # NOTE: the sweep stops at a cell it could not file (a full disk: the cell is recorded failed, see
                # SlurmSweep._stopped); the other jobs run on, and a re-run after space is freed re-attaches to them
                flight.detach()
                raise
            return busy, flight.detach() if self.no_wait else 0
