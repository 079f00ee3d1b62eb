"""How a cell ended, as exactly one record: rank 0's when it wrote one, else one composed here from the ranks'
failure fragments, the scheduler's verdict, the tasks' errors and logs (`finalize`, with `classify` choosing the
status and the root cause); skipped cells' records; and the one line a terminal shows for a record (`describe`).

Why a module of its own: every backend (the local launchers, SLURM jobs, packed SLURM jobs) ends a cell the same
way, so a failure reads the same whichever way the cell ran.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from harness.launch.core.manifest import Manifest
from harness.plan.prediction import Prediction
from harness.results.payload import Payload
from harness.results.record import Beat, Fragment, Record
from harness.results.store import (
    claim_end,
    new_record,
    read_beats,
    read_fragments,
    record_or_none,
    record_path,
    write_record,
)
from harness.scenario.cluster import Cluster
from harness.scenario.spec import RunSpec

FAILED = ("oom", "timeout", "error", "nan", "crashed", "cancelled")
"""the statuses of a cell that ran and failed (not ok, not skipped)"""


def fragments_of(payload: Payload) -> list[Fragment]:
    """The failure fragments the ranks of this attempt wrote."""
    return read_fragments(payload.results, payload.sweep, payload.run_id, attempt=payload.attempt)


class Interrupted(KeyboardInterrupt):
    """Ctrl-C (or SIGTERM to the sweep) while a cell ran: the cell's record as it ended — `ok` when rank 0 had
    claimed its end first (harness.results.store.claim_end), `cancelled` otherwise — for the sweep to file and
    report before it stops."""

    def __init__(self, record: Record) -> None:
        super().__init__()
        self.record = record


def cancel_cell(payload: Payload, *, kill: Callable[[], None], elapsed_s: float, time_limit_s: float) -> Record:
    """The record of a cell interrupted while it ran, one truth for record, manifest and console: claim the cell's
    end, then `kill` its processes and record it `cancelled`; when rank 0 claimed first it is writing its record:
    wait for it (at most RECORD_WAIT_S), kill what is left, and that record stands."""
    won = claim_end(payload.results, payload.sweep, payload.run_id, attempt=payload.attempt)
    if not won:
        deadline = time.monotonic() + RECORD_WAIT_S
        while fresh_record(payload) is None and time.monotonic() < deadline:
            time.sleep(0.05)
    kill()
    return finalize(payload, elapsed_s=elapsed_s, time_limit_s=time_limit_s, cancelled=True)


RECORD_WAIT_S = 30.0
"""how long a cancelling launcher waits for the record of a rank 0 that claimed the cell's end first (s): it
claims just before writing one file"""


def beats_of(payload: Payload) -> list[Beat]:
    """The last heartbeat of each rank of this attempt (harness.worker.heartbeat)."""
    return read_beats(payload.results, payload.sweep, payload.run_id, attempt=payload.attempt)


STALE_S = 10.0
"""a rank whose last beat (one a second) is older than this, and that did not say it ended, has stopped: its process
died or froze (s)"""
SHARED_FS_STALE_S = 60.0
"""STALE_S for beats read across a shared file system (SLURM), whose clients may cache a file's content for up to a
minute (s)"""
TOGETHER_S = 3.0
"""beats that stopped within this of each other stopped together: one cause, not first and second (s)"""


def stopped_ranks(beats: list[Beat], *, now: float, stale_s: float = STALE_S) -> list[int]:
    """The ranks whose heartbeat stopped without their saying they ended (died or froze), as of `now`."""
    return [b.rank for b in beats if not b.ended and now - float(b.time) > stale_s]


def beat_verdict(
    beats: list[Beat], *, world_size: int, pg_timeout_s: float | None, now: float, stale_s: float = STALE_S
) -> tuple[str, str, int | None] | None:
    """(status, reason, culprit) from the ranks' heartbeats when no rank raised, or None when they tell nothing.

    The ranks whose beats stopped first (within TOGETHER_S of the earliest) are the culprits: they died or froze
    while the others were still alive (blocked in a collective). Unless they had been in their phase for the whole
    watchdog timeout when they stopped: then the watchdog ended them (NCCL aborts the ranks whose collective timed
    out, without an exception), and the culprits are the ranks that beat on after them: they hung."""
    stopped = {b.rank: b for b in beats if b.rank in stopped_ranks(beats, now=now, stale_s=stale_s)}
    if not stopped:
        return None
    first_stop = min(float(b.time) for b in stopped.values())
    first = sorted(r for r, b in stopped.items() if float(b.time) - first_stop <= TOGETHER_S)
    later = {b.rank: b for b in beats if b.rank not in first and float(b.time) - first_stop > TOGETHER_S}
    if not later and len(first) == len(beats) == world_size and world_size > 1:
        return None  # every rank stopped at once: nothing tells them apart
    head = stopped[first[0]]
    in_phase = float(head.time) - float(head.phase_since)
    who = f"rank{'s' * (len(first) > 1)} {', '.join(map(str, first))}"
    if pg_timeout_s is not None and in_phase >= pg_timeout_s and later:
        hung = sorted(later)
        return (
            "timeout",
            f"rank{'s' * (len(hung) > 1)} {', '.join(map(str, hung))} stopped making progress: {who} waited "
            f"{in_phase:.0f} s in phase '{head.phase}' (the {pg_timeout_s:g} s watchdog) and stopped beating, while "
            f"rank {hung[0]} still beat (heartbeats; no rank raised an exception)",
            hung[0],
        )
    after = max((float(b.time) for b in later.values()), default=now) - first_stop
    return (
        "crashed",
        f"{who} stopped without an exception in phase '{head.phase}' (on {head.hostname}, pid {head.pid}): its "
        f"heartbeat ended {after:.0f} s before the other ranks' (heartbeats: died, killed or frozen)",
        first[0],
    )


def fresh_record(payload: Payload) -> Record | None:
    """Rank 0's record of this very attempt, if it wrote one (an earlier attempt's record does not count)."""
    rec = record_or_none(record_path(payload.results, payload.sweep, payload.run_id))
    return rec if rec is not None and rec.attempt == payload.attempt else None


SECONDARY = (
    "connection closed",
    "connection reset",
    "broken pipe",
    "econnreset",
    "connection refused",
    "socket closed",
    "read error",
    "nccl communicator was aborted",
    "process group was aborted",
    # NCCL's words for a peer that is gone (ncclRemoteError), and ProcessGroupNCCL's when a collective failed
    "ncclremoteerror",
    "remote process exited or there was a network error",
    "some nccl operations have failed or timed out",
    "failed to recv, got 0 bytes",
)
TIMEOUTS = ("timed out", "timeout", "watchdog")


def is_secondary(frag: Fragment) -> bool:
    """A rank that failed because another one did: its collective broke or timed out."""
    return any(k in (frag.reason or "").lower() for k in SECONDARY + TIMEOUTS)


def _exception_line(tb: str) -> str:
    lines = [line for line in tb.strip().splitlines() if line.strip() and not line.startswith(("-", " "))]
    return lines[-1][:500] if lines else tb.strip()[-500:]


def classify(
    frags: list[Fragment],
    *,
    world_size: int,
    elapsed_s: float,
    time_limit_s: float,
    cancelled: bool,
    exit_codes: list | None,
    pg_timeout_s: float | None,
    ended: tuple[str, str] | None = None,
    job_errors: dict[int, str] | None = None,
    beats: list[Beat] | None = None,
    now: float | None = None,
) -> tuple[str, str, int | None]:
    """(status, reason, failed rank) of a cell that ended without rank 0's record.

    The first rank to fail is the root cause. Ranks that left no fragment while others report a broken
    collective are the culprits: they died (the others saw their connection close) or hung (the others'
    collective hit the watchdog). `ended` is the scheduler's verdict when it explains the end (a time limit, a
    cancel, a node failure); `job_errors` are tracebacks the scheduler's tasks left when no fragment was written;
    `beats` are the ranks' heartbeats as of `now`, which attribute a failure that no rank raised (beat_verdict).
    """
    if cancelled:
        return "cancelled", "the job was cancelled before the cell finished", None
    if ended is not None:
        return ended[0], ended[1], None
    reported = {f.rank for f in frags}
    silent = sorted(set(range(world_size)) - reported)
    primary = [f for f in frags if not is_secondary(f)]
    if primary:
        first = min(primary, key=_when)
        return str(first.status), str(first.reason), first.rank
    if frags and elapsed_s >= time_limit_s and not any(k in (f.reason or "").lower() for f in frags for k in TIMEOUTS):
        # NOTE: the launcher ended the cell at its time limit; a peer that saw the killed rank's connection close
        # (a race with the kill) is the kill's consequence, not a crash
        return "timeout", f"the cell exceeded its time limit of {time_limit_s:g} s", None
    if frags:
        first = min(frags, key=_when)
        culprit = silent[0] if silent else first.rank
        who = f"rank {', '.join(map(str, silent))}" if silent else f"rank {culprit}"
        said = (first.reason or "")[:300]
        if any(k in (f.reason or "").lower() for f in frags for k in TIMEOUTS):
            return (
                "timeout",
                f"collective timed out after the {pg_timeout_s:g} s watchdog: {who} stopped making "
                f"progress (rank {first.rank} reported: {said})",
                culprit,
            )
        return (
            "crashed",
            f"{who} died without raising an exception; the others saw its connection close (rank {first.rank}: {said})",
            culprit,
        )
    by_beats = beat_verdict(
        beats or [], world_size=world_size, pg_timeout_s=pg_timeout_s, now=time.time() if now is None else now
    )
    if by_beats is not None:
        return by_beats
    if job_errors:
        rank = min(job_errors)
        return "error", f"{_exception_line(job_errors[rank])} (rank {rank}, outside the benchmark)", rank
    if elapsed_s >= time_limit_s:
        return "timeout", f"the cell exceeded its time limit of {time_limit_s:g} s", None
    codes = f" (exit codes {exit_codes})" if exit_codes else ""
    return "crashed", f"the ranks exited without a record or an exception{codes}", None


def _when(frag: Fragment) -> float:
    return float(frag.time) if frag.time is not None else float("inf")


def finalize(
    payload: Payload,
    *,
    elapsed_s: float,
    time_limit_s: float,
    cancelled: bool = False,
    log_tail: str = "",
    exit_codes: list | None = None,
    ended: tuple[str, str] | None = None,
    job_errors: dict[int, str] | None = None,
) -> Record:
    """The cell's record: rank 0's if this attempt wrote one, else one composed from what is known
    (`ended`, `job_errors`: see classify)."""
    fresh = fresh_record(payload)
    if fresh is not None:
        return fresh
    frags = fragments_of(payload)
    status, reason, rank = classify(
        frags,
        world_size=payload.spec.gpus,
        elapsed_s=elapsed_s,
        time_limit_s=time_limit_s,
        cancelled=cancelled,
        exit_codes=exit_codes,
        pg_timeout_s=payload.cluster.pg_timeout_s,
        ended=ended,
        job_errors=job_errors,
        beats=beats_of(payload),
    )
    fields: dict[str, Any] = {"attempt": payload.attempt}
    if payload.predicted is not None:
        fields["predicted"] = payload.predicted
    if frags:
        fields["failures"] = [f.failure() for f in frags]
    elif job_errors:
        fields["failures"] = [
            {"rank": k, "status": "error", "reason": _exception_line(tb), "traceback": tb[-8000:]}
            for k, tb in sorted(job_errors.items())
        ]
    if log_tail:
        fields["log_tail"] = log_tail[-4000:]
    rec = new_record(
        spec=payload.spec,
        run_id=payload.run_id,
        sweep=payload.sweep,
        cluster=payload.cluster.name,
        status=status,  # type: ignore[arg-type]  # classify returns one of STATUSES
        reason=reason,
        failed_rank=rank,
        **fields,
        env={"harness_git_sha": payload.git_sha, "slurm_job_id": payload.job_id},
    )
    write_record(payload.results, rec)
    return rec


def stop_reason(error: BaseException) -> str:
    """Why the sweep stopped at a run, in one line: the file that could not be written and why (a full disk), or
    the exception."""
    if isinstance(error, OSError):
        what = f"could not write {error.filename}: {error.strerror or error}" if error.filename else f"{error}"
        return f"{what} (the sweep stopped here; re-run it to resume)"
    return f"the sweep stopped here on {type(error).__name__}: {error}"


def stopped_run(payload: Payload, error: BaseException, *, manifest: Manifest) -> tuple[Record, bool]:
    """The run the sweep stopped at, on `error` (a full disk: harness.results.store.WriteFailed), while it ran or was
    being filed, so that it never stays `running`: its own record when this attempt's was written, else a record of
    status `error` whose reason says what could not be written and why. The manifest gets the run's end (the
    manifest's reserve holds it when the disk is full); the error record is written where it can be and where the
    run has no readable record (an earlier attempt's stays as it is: --force re-ran an ok cell). Returns (the
    record, whether the manifest took it); never raises an OSError (the sweep goes on to raise `error`)."""
    path = record_path(payload.results, payload.sweep, payload.run_id)
    on_file = record_or_none(path)
    if on_file is not None and on_file.attempt == payload.attempt:
        rec = on_file
    else:
        fields: dict[str, Any] = {"attempt": payload.attempt}
        if payload.predicted is not None:
            fields["predicted"] = payload.predicted
        rec = new_record(
            spec=payload.spec,
            run_id=payload.run_id,
            sweep=payload.sweep,
            cluster=payload.cluster.name,
            status="error",
            reason=stop_reason(error),
            **fields,
            env={"harness_git_sha": payload.git_sha, "slurm_job_id": payload.job_id},
        )
    try:
        manifest.ended(payload.run_id, rec, attempt=payload.attempt)
        noted = True
    except OSError:
        noted = False
    if on_file is None:
        try:
            write_record(payload.results, rec)
        except OSError:
            pass
    return rec, noted


def skipped_record(
    spec: RunSpec, *, sweep: str, cluster: Cluster, results: str | Path, reason: str, predicted: Prediction | None
) -> Record:
    extra: dict[str, Any] = {} if predicted is None else {"predicted": predicted}
    rec = new_record(
        spec=spec,
        run_id=spec.run_id,
        sweep=sweep,
        cluster=cluster.name,
        status="skipped",
        reason=reason,
        **extra,
    )
    write_record(results, rec)
    return rec


def job_log_tail(job, n_tasks: int) -> str:
    """The end of each task's stderr (for records of cells that died without a fragment)."""
    tails = []
    for k in range(n_tasks):
        try:
            err = (job.task(k).stderr() if n_tasks > 1 else job.stderr()) or ""
        except Exception:  # noqa: BLE001 - a log that was never written
            continue
        if err.strip():
            tails.append(f"--- rank {k} stderr ---\n{err[-1500:]}")
    return "\n".join(tails)


def _fmt(value: float | None, spec: str, scale: float = 1.0) -> str:
    return "n/a" if value is None else format(value * scale, spec)


def describe(rec: Record) -> str:
    """One line for a terminal: status and the headline numbers."""
    if rec.status != "ok":
        reason = rec.reason.splitlines()[0][:160] if rec.reason else ""
        rank = f" (rank {rec.failed_rank})" if rec.failed_rank is not None else ""
        return f"{rec.status}{rank}: {reason}"
    m = rec.metrics
    median = m.step_time_s.median if m.step_time_s is not None else None
    parts = [
        f"ok  {_fmt(median, '.1f', 1e3)} ms/step",
        f"{_fmt(m.tokens_per_s_per_gpu, '.0f')} tok/s/gpu",
        f"loss {_fmt(m.loss, '.4f')}",
    ]
    if m.mfu is not None:
        parts.append(f"MFU {m.mfu * 100:.1f}%")
    if m.peak_memory_allocated_gib is not None:
        parts.append(f"peak {m.peak_memory_allocated_gib:.2f} GiB")
    if rec.reason:  # a caveat on these numbers (e.g. a recompilation timed as step time)
        parts.append(f"note: {rec.reason.splitlines()[0][:160]}")
    return "  ".join(parts)
