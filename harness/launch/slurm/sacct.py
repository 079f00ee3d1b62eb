"""SLURM's job states as the harness reads them: sacct's state codes by what they mean for a cell, and one sacct call
for the states of a set of jobs (`harness status` and the waiting sweep). No submission here: harness.launch.slurm.jobs
submits and follows; this is what both it and `harness status` ask sacct.
"""

from __future__ import annotations

import shutil
import subprocess

from submitit.slurm.slurm import SlurmInfoWatcher

from harness.launch.slurm.resources import SINFO_TIMEOUT_S

# sacct's job states (`man sacct`, JOB STATE CODES), by what they mean for a cell
PENDING_STATES = frozenset(
    {
        "PENDING",
        "REQUEUED",
        "REQUEUE_HOLD",
        "REQUEUE_FED",
        "RESV_DEL_HOLD",
        "SPECIAL_EXIT",
        "SUSPENDED",
        "STOPPED",
        "RESIZING",
        "PREEMPTED",
        "UNKNOWN",
    }
)
RUNNING_STATES = frozenset({"RUNNING", "COMPLETING", "CONFIGURING", "STAGE_OUT", "SIGNALING"})
ENDED_STATES = frozenset(
    {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "BOOT_FAIL", "DEADLINE", "REVOKED"}
)


class SlurmUnavailable(RuntimeError):
    """This machine cannot submit to SLURM: no client commands, or the controller does not answer."""


def base_state(state: str | None) -> str:
    """sacct's state without its detail: "CANCELLED by 0" → CANCELLED."""
    return (state or "UNKNOWN").split()[0].upper()


def flight_state(state: str | None) -> str:
    """A job's SLURM state as a cell state: submitted (queued, held, requeued), running, or ended."""
    base = base_state(state)
    if base in ENDED_STATES:
        return "ended"
    return "running" if base in RUNNING_STATES else "submitted"


def live_states(job_ids: list[str]) -> dict[str, tuple[str, str]]:
    """(sacct state, node list) of each job id (<array>_<index> for array tasks), from one sacct call.
    SlurmUnavailable when sacct cannot answer."""
    if not job_ids:
        return {}
    if shutil.which("sacct") is None:
        raise SlurmUnavailable("no sacct on this machine")
    cmd = ["sacct", "-o", "JobID,State,NodeList", "--parsable2"]
    for main_id in sorted({j.split("_")[0] for j in job_ids}):
        cmd += ["-j", main_id]
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=SINFO_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        raise SlurmUnavailable(f"sacct did not answer within {SINFO_TIMEOUT_S} s") from None
    if out.returncode != 0:
        raise SlurmUnavailable(f"sacct exit {out.returncode}: {out.stderr.strip()[-400:]}")
    info = SlurmInfoWatcher().read_info(out.stdout)  # submitit's parser: array ranges expand to their tasks
    return {j: (info.get(j, {}).get("State") or "UNKNOWN", node_list(info.get(j, {}).get("NodeList"))) for j in job_ids}


def node_list(node_list: str | None) -> str:
    return "" if not node_list or node_list.startswith("None") else node_list
