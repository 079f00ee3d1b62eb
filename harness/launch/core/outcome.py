"""How a cell ended, as exactly one record: rank 0's when it wrote one, else one composed here from the ranks'
failure fragments, the scheduler's verdict, the tasks' errors and logs (`finalize`, with `classify` choosing the
status and the root cause); skipped cells' records; and the one line a terminal shows for a record (`describe`).

Why a module of its own: every backend (the local launchers, SLURM jobs, packed SLURM jobs) ends a cell the same
way, so a failure reads the same whichever way the cell ran.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any, cast

from harness.results.schema import ComposedEnv, Failure, Predicted, Record, Spec, Status
from harness.results.store import fragment_dir, new_record, read_record, record_path, write_record
from harness.scenario.cluster import Cluster
from harness.scenario.schema import RunSpec

FAILED = ("oom", "timeout", "error", "nan", "crashed", "cancelled")
"""the statuses of a cell that ran and failed (not ok, not skipped)"""


def read_fragments(payload: dict) -> list[dict]:
    """The failure fragments the ranks of this attempt wrote."""
    d = fragment_dir(payload["results"], payload["sweep"], payload["run_id"])
    frags = []
    for p in sorted(d.glob("rank*.json")):
        try:
            frag = json.loads(p.read_text())
        except (OSError, json.JSONDecodeError):
            continue
        if frag.get("attempt") in (None, payload["attempt"]):
            frags.append(frag)
    return frags


def _fresh_record(payload: dict) -> Record | None:
    path = record_path(payload["results"], payload["sweep"], payload["run_id"])
    try:
        rec = read_record(path)
    except ValueError:
        return None
    return rec if rec.get("attempt") == payload["attempt"] else None


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
)
TIMEOUTS = ("timed out", "timeout", "watchdog")


def is_secondary(frag: dict) -> bool:
    """A rank that failed because another one did: its collective broke or timed out."""
    return any(k in frag["reason"].lower() for k in SECONDARY + TIMEOUTS)


def _exception_line(tb: str) -> str:
    lines = [line for line in tb.strip().splitlines() if line.strip() and not line.startswith(("-", " "))]
    return lines[-1][:500] if lines else tb.strip()[-500:]


def classify(
    frags: list[dict],
    *,
    world_size: int,
    elapsed_s: float,
    time_limit_s: float,
    cancelled: bool,
    exit_codes: list | None,
    pg_timeout_s: float | None,
    ended: tuple[str, str] | None = None,
    job_errors: dict[int, str] | None = None,
) -> tuple[str, str, int | None]:
    """(status, reason, failed rank) of a cell that ended without rank 0's record.

    The first rank to fail is the root cause. Ranks that left no fragment while others report a broken
    collective are the culprits: they died (the others saw their connection close) or hung (the others'
    collective hit the watchdog). `ended` is the scheduler's verdict when it explains the end (a time limit, a
    cancel, a node failure); `job_errors` are tracebacks the scheduler's tasks left when no fragment was written.
    """
    if cancelled:
        return "cancelled", "the job was cancelled before the cell finished", None
    if ended is not None:
        return ended[0], ended[1], None
    reported = {f["rank"] for f in frags}
    silent = sorted(set(range(world_size)) - reported)
    primary = [f for f in frags if not is_secondary(f)]
    if primary:
        first = min(primary, key=lambda f: f["time"])
        return first["status"], first["reason"], first["rank"]
    if frags:
        first = min(frags, key=lambda f: f["time"])
        culprit = silent[0] if silent else first["rank"]
        who = f"rank {', '.join(map(str, silent))}" if silent else f"rank {culprit}"
        if any(k in f["reason"].lower() for f in frags for k in TIMEOUTS):
            return (
                "timeout",
                f"collective timed out after the {pg_timeout_s:g} s watchdog: {who} stopped making "
                f"progress (rank {first['rank']} reported: {first['reason'][:300]})",
                culprit,
            )
        return (
            "crashed",
            f"{who} died without raising an exception; the others saw its connection close "
            f"(rank {first['rank']}: {first['reason'][:300]})",
            culprit,
        )
    if job_errors:
        rank = min(job_errors)
        return "error", f"{_exception_line(job_errors[rank])} (rank {rank}, outside the benchmark)", rank
    if elapsed_s >= time_limit_s:
        return "timeout", f"the cell exceeded its time limit of {time_limit_s:g} s", None
    codes = f" (exit codes {exit_codes})" if exit_codes else ""
    return "crashed", f"the ranks exited without a record or an exception{codes}", None


def finalize(
    payload: dict,
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
    fresh = _fresh_record(payload)
    if fresh is not None:
        return fresh
    spec = payload["spec"]
    frags = read_fragments(payload)
    status, reason, rank = classify(
        frags,
        world_size=spec["gpus"],
        elapsed_s=elapsed_s,
        time_limit_s=time_limit_s,
        cancelled=cancelled,
        exit_codes=exit_codes,
        pg_timeout_s=payload["cluster"].get("pg_timeout_s"),
        ended=ended,
        job_errors=job_errors,
    )
    rec = new_record(
        spec=cast(Spec, spec),
        run_id=payload["run_id"],
        sweep=payload["sweep"],
        cluster=payload["cluster"]["name"],
        status=cast(Status, status),
        reason=reason,
        failed_rank=rank,
    )
    rec["attempt"] = payload["attempt"]
    if payload.get("predicted") is not None:
        rec["predicted"] = payload["predicted"]
    if frags:
        rec["failures"] = [
            cast(
                Failure,
                {
                    k: f.get(k)
                    for k in (
                        "rank",
                        "status",
                        "reason",
                        "hostname",
                        "traceback",
                        "memory_allocated_gib",
                        "memory_reserved_gib",
                        "memory_rss_gib",
                    )
                },
            )
            for f in frags
        ]
    elif job_errors:
        rec["failures"] = [
            {"rank": k, "status": "error", "reason": _exception_line(tb), "traceback": tb[-8000:]}
            for k, tb in sorted(job_errors.items())
        ]
    if log_tail:
        rec["log_tail"] = log_tail[-4000:]
    rec["env"] = ComposedEnv(harness_git_sha=payload.get("git_sha"), slurm_job_id=payload.get("job_id"))
    write_record(payload["results"], rec)
    return rec


def skipped_record(
    spec: RunSpec, *, sweep: str, cluster: Cluster, results: str | Path, reason: str, predicted: dict | None
) -> Record:
    rec = new_record(
        spec=cast(Spec, spec.to_dict()),
        run_id=spec.run_id,
        sweep=sweep,
        cluster=cluster.name,
        status="skipped",
        reason=reason,
    )
    if predicted is not None:
        rec["predicted"] = cast(Predicted, predicted)
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


def describe(rec: Mapping[str, Any]) -> str:
    """One line for a terminal: status and the headline numbers."""
    if rec["status"] != "ok":
        reason = (rec.get("reason") or "").splitlines()[0][:160] if rec.get("reason") else ""
        rank = f" (rank {rec['failed_rank']})" if rec.get("failed_rank") is not None else ""
        return f"{rec['status']}{rank}: {reason}"
    m = rec["metrics"]
    parts = [
        f"ok  {m['step_time_s']['median'] * 1e3:.1f} ms/step",
        f"{m['tokens_per_s_per_gpu']:.0f} tok/s/gpu",
        f"loss {m['loss']:.4f}",
    ]
    if m.get("mfu") is not None:
        parts.append(f"MFU {m['mfu'] * 100:.1f}%")
    if m.get("peak_memory_allocated_gib") is not None:
        parts.append(f"peak {m['peak_memory_allocated_gib']:.2f} GiB")
    if rec.get("reason"):  # a caveat on these numbers (e.g. a recompilation timed as step time)
        parts.append(f"note: {rec['reason'].splitlines()[0][:160]}")
    return "  ".join(parts)
