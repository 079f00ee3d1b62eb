"""Packed SLURM jobs (`harness sweep --pack`): cells asking for the same job shape run back to back inside one
allocation, so a sweep waits in the queue once per pack instead of once per cell.

`run_pack` is what every task of a packed job runs. For each cell, in order, each task starts one fresh
`python -m harness.launch.entry` child (its rank of the cell) in its own process group, with the cell's own
rendezvous (MASTER_ADDR = the job's first node, a port per cell) and wall limit (`settings.time_limit_s`,
enforced here: on expiry the child's process group is killed, as the local launcher does). A crashed, hung or
OOM cell therefore cannot take the pack down, and no process-group state leaks from one cell to the next. After
the cell every task writes an end marker and waits for everyone's (a file barrier); then task 0 makes the cell's
record exactly as the local launcher does (launch/core's `finalize`: rank 0's record when it wrote one, else one
composed from the ranks' fragments, exit codes and elapsed time) and adds `env.slurm_pack`.

Files, per cell, in `<results>/<sweep>/.packs/<run_id>/` (a file system every node shares):
  rank<k>.json  task k's run of the cell: attempt, job id, SLURM restart count, start, end, exit code, elapsed (s),
                why the child was killed; task 0's also `recorded` once the cell's record is final
  rank<k>.log   the child's stdout and stderr
and `.packs/job-<job id>.<restart>.<attempt>.stop`, written by a task that stops on an exception (submitit's USR2
handler at the job's time limit, or after it requeued a preempted job), on which the other tasks stop too.
The driver (harness.launch.slurm.jobs.SlurmSweep) and `harness status` read them to follow a pack cell by cell.

Requeue (preemption, `scontrol requeue`): the job runs again with the same cells, and the tasks skip every cell
that already has a record of its attempt; markers carry the restart count, so an interrupted run's are ignored.

Why a module of its own: this side runs inside the allocation (jobs.py is the submitting driver's side), and it is
a launcher of its own (fresh processes, limits, kills) that ends each cell with launch/core, as the local one does.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Annotated

from harness.core.ports import derived_port
from harness.core.typed import SOMETIMES, Typed
from harness.launch.core.outcome import (
    SHARED_FS_STALE_S,
    beats_of,
    finalize,
    fragments_of,
    fresh_record,
    stopped_ranks,
)
from harness.results.payload import Payload
from harness.results.record import Fragment, Record
from harness.results.store import atomic_write_json, fragment_dir, sweep_dir, write_record

STUCK_GRACE_S = 15.0
"""a rank of the cell failed (left a fragment) and this task's child still runs this long after: it is stuck in a
collective that will never complete, and is killed (as launch.local's FailureWatch does locally) (s)"""
CHILD_EXIT_GRACE_S = 30.0
"""how long this task's child (its rank of the cell) may go on running after the cell's record exists before it is
killed: it hangs on its way out (s)"""
BARRIER_GRACE_S = 60.0
"""how long past its own cell's deadline a task waits for the other tasks' end markers (s)"""
TICK_S = 0.2


def pack_dir(results: str | Path, sweep: str, run_id: str) -> Path:
    return sweep_dir(results, sweep) / ".packs" / run_id


class Marker(Typed):
    """A pack task's marker for its rank of one cell (`.packs/<run_id>/rank<k>.json`): written when the rank starts
    and again when it ends; task 0's says when the cell's record is final."""

    attempt: str | None
    """the launch of the cell it belongs to"""
    job_id: str
    """the pack's SLURM job"""
    restart: int
    """which run of the job (SLURM_RESTART_COUNT)"""
    rank: int
    """the task, = the cell's rank it ran"""
    position: int
    """1-based position of the cell in its pack"""
    of: int
    """cells in the pack (count)"""
    started_at: int | float
    """when the rank started (s since the epoch)"""
    ended_at: int | float | None
    """when it ended (s since the epoch); null while it runs"""
    exit_code: Annotated[int | None, SOMETIMES] = None
    """the rank's exit code (negative: the signal that ended it)"""
    elapsed_s: Annotated[int | float | None, SOMETIMES] = None
    """how long it ran (s)"""
    killed: Annotated[str | None, SOMETIMES] = None
    """why this task killed it (time_limit, stuck, exit_hang), else null"""
    recorded: Annotated[bool | None, SOMETIMES] = None
    """task 0: the cell's record is final"""


def _marker_path(payload: Payload, rank: int) -> Path:
    return pack_dir(payload.results, payload.sweep, payload.run_id) / f"rank{rank}.json"


def read_marker(sweep: Path, run_id: str, rank: int, *, attempt: str | None) -> Marker | None:
    """Task `rank`'s marker for this attempt of the cell, or None."""
    try:
        marker = Marker.model_validate_json((sweep / ".packs" / run_id / f"rank{rank}.json").read_bytes())
    except (OSError, ValueError):
        return None
    return marker if marker.attempt == attempt else None


def _write_marker(path: Path, marker: Marker) -> None:
    atomic_write_json(path, marker.to_dict())


def cell_started(payload: Payload) -> bool:
    """Task 0 has started this attempt of the cell (in some run of its pack's job)."""
    marker = read_marker(sweep_dir(payload.results, payload.sweep), payload.run_id, 0, attempt=payload.attempt)
    return marker is not None


def cell_recorded(payload: Payload) -> Record | None:
    """The cell's final record once task 0 says it is final (marker `recorded`), else None."""
    marker = read_marker(sweep_dir(payload.results, payload.sweep), payload.run_id, 0, attempt=payload.attempt)
    return fresh_record(payload) if marker and marker.recorded else None


def cell_port(job_id: str, restart: int, position: int) -> int:
    """The cell's rendezvous port: the same on every task of the job, different per cell and per run."""
    return derived_port(f"{job_id}/{restart}/{position}")


def log_tail(payload: Payload, world: int) -> str:
    """The end of each rank's child output (for records composed without rank 0's)."""
    tails = []
    for k in range(world):
        path = _marker_path(payload, k).with_suffix(".log")
        try:
            text = path.read_text(errors="replace")
        except OSError:
            continue
        if text.strip():
            tails.append(f"--- rank {k} ---\n{text[-1500:]}")
    return "\n".join(tails)


def _ignore_usr2() -> None:
    # NOTE: SLURM signals every process of a job step, children included (verified on the localhost cluster, new
    # sessions too): submitit's USR2 warning is the pack task's to handle, and would otherwise kill the cell
    signal.signal(signal.SIGUSR2, signal.SIG_IGN)


def _end(proc: subprocess.Popen, *, grace_s: float = 3.0) -> None:
    """A child still running: SIGTERM its process group, SIGKILL whatever of the group is left `grace_s` later (or
    at once when the child is gone), reap the child."""
    if proc.poll() is not None:
        return
    _signal_group(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        pass
    _signal_group(proc.pid, signal.SIGKILL)
    proc.wait()


def _signal_group(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:
        pass


class PackRun:
    """One task's run of a pack's cells."""

    def __init__(self, cells: list[Payload]):
        import submitit

        env = submitit.JobEnvironment()
        self.cells = cells
        self.job_id = env.job_id
        self.rank, self.world, self.local_rank = env.global_rank, env.num_tasks, env.local_rank
        self.master = env.hostnames[0]
        self.restart = int(os.environ.get("SLURM_RESTART_COUNT", "0"))
        self.started = time.time()
        self._result_pickle = env.paths.result_pickle
        self._sigterm = False
        self._stop_file = (
            sweep_dir(cells[0].results, cells[0].sweep)
            / ".packs"
            / f"job-{self.job_id}.{self.restart}.{cells[0].attempt}.stop"
        )

    def _on_sigterm(self, signum, frame) -> None:  # noqa: ARG002 - signal handler
        # the job is being cancelled, requeued or killed at its limit; SLURM signals the children too
        self._sigterm = True

    @property
    def stopping(self) -> bool:
        """This run of the job is ending: SIGTERM, or another task stopped (its stop file)."""
        return self._sigterm or self._stop_file.exists()

    def run(self) -> None:
        if self.restart:  # an interrupted run's result file must not say this run is over
            self._result_pickle.unlink(missing_ok=True)
        signal.signal(signal.SIGTERM, self._on_sigterm)
        try:
            self._run_cells()
        except BaseException as e:
            # NOTE: submitit's USR2 handler raises here at the job's time limit (rank 0), or exits after requeueing
            # a preempted job: the other tasks stop too instead of waiting for this one at every cell
            atomic_write_json(self._stop_file, {"rank": self.rank, "why": f"{type(e).__name__}: {e}"[:500]})
            self._say(f"stopping the pack: {type(e).__name__}: {e}")
            raise
        if self.stopping:
            why = "SIGTERM" if self._sigterm else "another task stopped"
            self._say(f"stopped ({why}: cancel, requeue or time limit); the driver records the cells left")

    def _run_cells(self) -> None:
        # NOTE: decided once, before any cell of this run starts: every task skips the same cells (a record of this
        # run can only appear after every task has started that cell)
        done = {p.run_id for p in self.cells if fresh_record(p) is not None}
        n = len(self.cells)
        self._say(f"{n} cells, {len(done)} already recorded (restart {self.restart})")
        with tempfile.TemporaryDirectory(prefix="harness-pack-") as tmp:
            for position, payload in enumerate(self.cells):
                if self.stopping:
                    break
                if payload.run_id in done:
                    continue
                payload = payload.model_copy(update={"job_id": self.job_id})
                marker = self._run_cell(payload, position=position, tmp=Path(tmp))
                if marker is None:  # stopped mid-cell: the driver records it from the job's end
                    break
                markers = self._barrier(payload, deadline=marker.started_at + _time_limit(payload))
                if markers is None:
                    break
                if self.rank == 0 and not self.stopping:
                    self._record(payload, markers, marker, position=position)

    # ---- one cell, this task's rank of it

    def _run_cell(self, payload: Payload, *, position: int, tmp: Path) -> Marker | None:
        """Run this task's rank of the cell to its end; its end marker, or None when the job is stopping."""
        folder = fragment_dir(payload.results, payload.sweep, payload.run_id)
        for name in (f"rank{self.rank}.json", f"beat{self.rank}.json"):  # an interrupted run's fragment and heartbeat
            (folder / name).unlink(missing_ok=True)
        ppath = tmp / f"{payload.run_id}.json"
        atomic_write_json(ppath, payload.to_dict())
        env = dict(os.environ)
        # NOTE: a local sweep's warm interpreter (HARNESS_PREFORK, copied by sbatch from the submitter) lives on the
        # submitting host: a pack's ranks start cold, in the allocation
        env.pop("HARNESS_PREFORK", None)
        env.update({k: str(v) for k, v in payload.cluster.env.items()})
        env.update(
            MASTER_ADDR=self.master,
            MASTER_PORT=str(cell_port(self.job_id, self.restart, position)),
            RANK=str(self.rank),
            WORLD_SIZE=str(self.world),
            LOCAL_RANK=str(self.local_rank),
            PYTHONUNBUFFERED="1",
        )
        mpath = _marker_path(payload, self.rank)
        marker = Marker(
            attempt=payload.attempt,
            job_id=self.job_id,
            restart=self.restart,
            rank=self.rank,
            position=position + 1,
            of=len(self.cells),
            started_at=time.time(),
            ended_at=None,
        )
        _write_marker(mpath, marker)
        t0 = marker.started_at
        deadline = t0 + _time_limit(payload)
        with mpath.with_suffix(".log").open("w") as log:
            proc = subprocess.Popen(
                [sys.executable, "-m", "harness.launch.entry", str(ppath)],
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                process_group=0,
                preexec_fn=_ignore_usr2,
            )
            killed = None
            failed_at = recorded_at = None
            next_check = 0.0
            try:
                while proc.poll() is None:
                    now = time.time()
                    if self.stopping:
                        killed = "stopped"
                        break
                    if now >= deadline:
                        killed = "time_limit"
                        break
                    if now >= next_check:
                        next_check = now + 1.0
                        if failed_at is None and (self._fresh_fragments(payload) or self._stopped_beats(payload, now)):
                            failed_at = now
                        if recorded_at is None and fresh_record(payload) is not None:
                            recorded_at = now
                    if failed_at is not None and now - failed_at > STUCK_GRACE_S:
                        killed = "stuck"
                        break
                    if recorded_at is not None and now - recorded_at > CHILD_EXIT_GRACE_S:
                        killed = "exit_hang"
                        break
                    time.sleep(TICK_S)
            finally:
                # NOTE: also when submitit's USR2 handler raises here (the job's time limit) or exits (preemption)
                _end(proc)
        if killed is None and proc.returncode == -signal.SIGTERM:
            # SLURM's SIGTERM reaches the child and this task at about the same time: a cancel, not the cell's end
            until = time.time() + 1.0
            while not self.stopping and time.time() < until:
                time.sleep(0.05)
        if killed == "stopped" or self.stopping:
            return None
        elapsed = time.time() - t0
        marker = marker.model_copy(
            update=dict(ended_at=time.time(), exit_code=proc.returncode, elapsed_s=elapsed, killed=killed)
        )
        _write_marker(mpath, marker)
        self._say(
            f"cell {position + 1}/{len(self.cells)} {payload.run_id}: exit {proc.returncode} after "
            f"{elapsed:.1f} s" + (f" (killed: {killed})" if killed else "")
        )
        return marker

    def _stopped_beats(self, payload: Payload, now: float) -> list[int]:
        """Ranks of this cell whose heartbeat, written in this run of the job, stopped (they died or froze without
        an exception: harness.worker.heartbeat); the shared file system's caching allowed for (SHARED_FS_STALE_S)."""
        beats = [b for b in beats_of(payload) if float(b.time) >= self.started]
        return stopped_ranks(beats, now=now, stale_s=SHARED_FS_STALE_S)

    def _fresh_fragments(self, payload: Payload) -> list[Fragment]:
        """Fragments of this attempt written in this run of the job (an interrupted run's are older than it)."""
        return [f for f in fragments_of(payload) if (f.time or 0) >= self.started]

    def _barrier(self, payload: Payload, *, deadline: float) -> list[Marker | None] | None:
        """Every task's end marker of this cell in this run (None for a task that wrote none in time), or None when
        the job is being stopped."""
        sweep = sweep_dir(payload.results, payload.sweep)
        until = max(deadline, time.time()) + BARRIER_GRACE_S
        while True:
            found = [read_marker(sweep, payload.run_id, k, attempt=payload.attempt) for k in range(self.world)]
            markers = [
                m if m and m.restart == self.restart and m.job_id == self.job_id and m.ended_at is not None else None
                for m in found
            ]
            if self.stopping:
                return None
            if all(markers) or time.time() > until:
                return markers
            time.sleep(0.5)

    def _record(self, payload: Payload, markers: list[Marker | None], marker: Marker, *, position: int) -> None:
        """Task 0: the cell's one record, exactly as the local launcher makes it, plus `env.slurm_pack`."""
        ended = [m for m in markers if m]
        rec = finalize(
            payload,
            elapsed_s=max(float(m.elapsed_s or 0.0) for m in ended),
            time_limit_s=_time_limit(payload),
            exit_codes=[m.exit_code if m else None for m in markers],
            log_tail=log_tail(payload, self.world),
        )
        rec = rec.in_pack(job_id=self.job_id, position=position + 1, of=len(self.cells))
        write_record(payload.results, rec)
        _write_marker(_marker_path(payload, 0), marker.model_copy(update={"recorded": True}))
        self._say(f"cell {position + 1}/{len(self.cells)} {payload.run_id}: recorded {rec.status}")

    def _say(self, line: str) -> None:
        print(f"pack {self.job_id} task {self.rank}: {line}", flush=True)


def _time_limit(payload: Payload) -> float:
    return float(payload.spec.settings.time_limit_s)


def run_pack(cells: list[Payload]) -> None:
    """Entry point of every task of a packed job: its rank of each cell, in order (see the module's docstring)."""
    PackRun(cells).run()
