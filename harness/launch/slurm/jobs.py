"""SLURM dispatch through submitit: one job per cell — nodes = ceil(world / gpus_per_node), one task per rank,
rendezvous from submitit's job environment — submitted as job arrays of cells that ask for the same resources,
then followed through sacct until it ends and turned into exactly one record. With `--pack`, cells asking for
the same job shape share one job instead and run back to back in it (harness.launch.slurm.pack), each recorded as it
ends.

Owns: the executor built from a profile's `slurm:` block, the check that the cluster can take jobs, arrays,
re-attaching to the jobs of an earlier sweep (detached with --no-wait, or a driver that died), SLURM states →
cell states and record statuses, cancel. The submitit behaviour this relies on is verified on a real cluster in
tests/slurm and listed in docs/slurm.md.

Why a module of its own: everything here is SLURM's (sbatch, sacct, job arrays, requeues); what a cell's end means
for its record is launch/core's, shared with the local launchers, and the sweep's round (backend.py) only hands
cells over.
"""

from __future__ import annotations

import math
import os
import shutil
import subprocess
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import submitit
from submitit.core.utils import FailedJobError, FailedSubmissionError, pickle_load

from harness.core.errors import InputError, Problem, did_you_mean
from harness.core.progress import Progress
from harness.launch.core.manifest import IN_FLIGHT, Manifest, RunEntry
from harness.launch.core.manifest import PackPlace as ManifestPlace
from harness.launch.core.outcome import (
    SHARED_FS_STALE_S,
    beats_of,
    describe,
    finalize,
    fragments_of,
    fresh_record,
    is_secondary,
    job_log_tail,
    stopped_ranks,
    stopped_run,
)
from harness.launch.slurm.resources import SINFO_TIMEOUT_S, cpus_per_rank, node_cpus_for
from harness.launch.slurm.sacct import (
    ENDED_STATES,
    RUNNING_STATES,
    SlurmUnavailable,
    base_state,
    flight_state,
    node_list,
)
from harness.results.payload import PackPlace, Payload
from harness.results.record import Fragment, Record
from harness.results.store import atomic_write_json, write_record
from harness.scenario.cluster import CPUS_PER_TASK_AUTO, Cluster, SlurmProfile, min_job_minutes

CLIENT_COMMANDS = ("sbatch", "srun", "sacct", "scancel", "sinfo")

POLL_TICK_S = 0.5
"""how often the waiting sweep looks at result files and fragments (s); sacct is asked less often"""
SACCT_MIN_S, SACCT_MAX_S = 2.0, 30.0
"""sacct is polled every tenth of the time since the last change, within these bounds (s)"""
STUCK_GRACE_S = 15.0
"""a rank failed (left a fragment) and the job is still running this long after: its other ranks are stuck (s)"""
BEAT_STALE_S = SHARED_FS_STALE_S
"""a rank's heartbeat (harness.worker.heartbeat) silent this long while its job runs: the rank died or froze without
an exception (an NCCL watchdog's abort, a SIGKILL) and the job is cancelled; longer than locally (outcome.STALE_S)
because the beats cross a shared file system (s)"""
JOB_END_GRACE_S = 60.0
"""how long the job may go on running after every task returned (result files) before the sweep cancels it: a rank
hangs on its way out (s)"""
UNKNOWN_GRACE_S = 120.0
"""a job sacct does not know for this long (state wiped, accounting off) is taken as ended (s)"""
PREEMPTED_GRACE_S = 300.0
"""a PREEMPTED job that is not requeued within this long (PreemptMode=CANCEL) is taken as ended (s)"""
TIMED_OUT = "timed-out"
"""in submitit's "Job not requeued because: timed-out ..." (its USR2 handler at the time limit)"""


# --------------------------------------------------------------------------------------------------
# a profile → submitit parameters


def preflight(cluster: Cluster) -> None:
    """Check, before a sweep writes anything, that this machine can submit to the profile's cluster: the client
    commands exist, the controller answers, the partition exists. SlurmUnavailable for the machine; InputError
    for a profile naming a partition the cluster does not have."""
    missing = [c for c in CLIENT_COMMANDS if shutil.which(c) is None]
    if missing:
        raise SlurmUnavailable(
            f"{cluster.name!r} is a SLURM profile, but this machine has no {', '.join(missing)}: "
            "run the sweep on a SLURM login node (the localhost test cluster: make slurm-up)"
        )
    conf = os.environ.get("SLURM_CONF")
    if conf and not Path(conf).exists():  # sinfo would retry reading it for a minute
        raise SlurmUnavailable(f"SLURM_CONF={conf} does not exist (is the cluster down? make slurm-up)")
    try:
        out = subprocess.run(
            ["sinfo", "--all", "--noheader", "--format=%R"], capture_output=True, text=True, timeout=SINFO_TIMEOUT_S
        )
    except subprocess.TimeoutExpired:
        raise SlurmUnavailable(f"the SLURM controller did not answer sinfo within {SINFO_TIMEOUT_S} s") from None
    if out.returncode != 0:
        raise SlurmUnavailable(
            f"SLURM does not answer from this machine (sinfo exit {out.returncode}): {out.stderr.strip()[-800:]}"
        )
    partitions = sorted(set(out.stdout.split()))
    wanted = cluster.slurm.partition
    if wanted is not None and wanted not in partitions:
        raise InputError(
            [
                Problem(
                    cluster.path,
                    "slurm.partition",
                    f"{wanted!r} is not a partition of this SLURM cluster (sinfo lists: "
                    f"{', '.join(partitions) or 'none'}){did_you_mean(wanted, partitions)}; "
                    "edit the profile",
                )
            ]
        )


def job_minutes(time_limit_s: float, slurm: SlurmProfile) -> int:
    """--time of a cell's job (min): ceil(time_limit_s / 60), at least what signal_delay_s needs, at most the
    profile's time_limit_min. submitit's USR2 ends the cell signal_delay_s (+ up to 30 s) before that."""
    minutes = max(math.ceil(time_limit_s / 60), min_job_minutes(slurm.signal_delay_s))
    return minutes if slurm.time_limit_min is None else min(minutes, slurm.time_limit_min)


def executor_parameters(
    cluster: Cluster, *, nodes: int, tasks_per_node: int, timeout_min: int, node_cpus: int | None = None
) -> dict[str, Any]:
    """AutoExecutor parameters of one cell's job: its shape and time limit, then the profile's `slurm:` block.
    `node_cpus`: the partition's CPUs per node (node_cpus_for), which cpus_per_task "auto" divides by gpus_per_node;
    None leaves --cpus-per-task to the site then."""
    s = cluster.slurm
    params: dict[str, Any] = {
        "nodes": nodes,
        "tasks_per_node": tasks_per_node,
        "timeout_min": int(timeout_min),
        "slurm_signal_delay_s": s.signal_delay_s,
    }
    if cluster.device == "cuda":  # one GPU per task; a cpu profile's gpus_per_node counts ranks, not GPUs
        params["gpus_per_node"] = tasks_per_node
    cpus: int | str | None = s.cpus_per_task
    if cpus == CPUS_PER_TASK_AUTO:
        cpus = None if node_cpus is None else cpus_per_rank(node_cpus, cluster.gpus_per_node)
    if cpus is not None:
        params["cpus_per_task"] = cpus
    if s.mem_per_node_gib is not None:
        params["mem_gb"] = s.mem_per_node_gib  # submitit writes --mem=<n>GB, which SLURM reads as GiB
    for key in ("partition", "account", "qos", "constraint"):
        if getattr(s, key) is not None:
            params[f"slurm_{key}"] = getattr(s, key)
    if s.setup:
        params["slurm_setup"] = list(s.setup)
    # NOTE: block distribution numbers ranks node by node, as the hybrid meshes assume (the worker checks it)
    extra: dict[str, Any] = {"distribution": s.distribution} if s.distribution is not None else {}
    if s.exclusive:
        extra["exclusive"] = True
    extra.update(s.additional_parameters)
    if extra:
        params["slurm_additional_parameters"] = extra
    return params


def split_packs(minutes: list[int], cap: int | None) -> list[list[int]]:
    """Indices of cells (in order) grouped into packs whose summed job minutes fit `cap` (the profile's
    time_limit_min; None: one pack). Each cell's own minutes are already at most the cap."""
    packs: list[list[int]] = []
    total = 0
    for i, m in enumerate(minutes):
        if not packs or (cap is not None and total + m > cap):
            packs.append([])
            total = 0
        packs[-1].append(i)
        total += m
    return packs


def _shape(payload: Payload) -> tuple[int, int]:
    """(nodes, tasks per node) the cell's job asks for."""
    return payload.spec.nodes, payload.spec.gpus_per_node


def _time_limit(payload: Payload) -> float:
    return float(payload.spec.settings.time_limit_s)


def _pack_of(payload: Payload) -> PackPlace:
    if payload.pack is None:
        raise ValueError(f"{payload.run_id}: not a packed cell")
    return payload.pack


class SlurmCell(submitit.helpers.Checkpointable):
    """What every task of a cell's job runs. Checkpointable, so that submitit requeues a preempted job (USR2 well
    before the time limit) and the cell runs again from its start: a benchmark has no state worth keeping."""

    def __call__(self, payload: Payload) -> None:
        from harness.launch.entry import submitit_entry

        submitit_entry(payload)


class SlurmPack(submitit.helpers.Checkpointable):
    """What every task of a packed job runs (--pack): its rank of each cell, back to back, each in a fresh process
    (harness.launch.slurm.pack). Checkpointable: a preempted pack is requeued and runs again the cells without a
    record."""

    def __call__(self, cells: list[Payload]) -> None:
        from harness.launch.slurm.pack import run_pack

        run_pack(cells)


def task_errors(job: Any, n_tasks: int) -> dict[int, str]:
    """Remote tracebacks from the tasks' result files (submitit writes ("error", traceback) when the function
    raised), read without submitit's wait for missing files."""
    errors: dict[int, str] = {}
    for k in range(n_tasks):
        path = job.task(k).paths.result_pickle
        if not path.exists():
            continue
        try:
            outcome, value = pickle_load(path)
        except Exception:  # noqa: BLE001 - a torn or foreign file says nothing about the cell
            continue
        if outcome == "error":
            errors[k] = str(value)
    return errors


def verdict(
    state: str, *, frags: list[Fragment], errors: dict[int, str], minutes: int, job_id: str, stopped_stuck: bool
) -> tuple[str, str] | None:
    """(status, reason) when SLURM's end of the job explains the cell's end (time limit, cancel, node failure),
    else None: the ranks' fragments and errors decide (launch.core.outcome.classify)."""
    base = base_state(state)
    hit_limit = (
        base in ("TIMEOUT", "DEADLINE")
        or any(f.status == "timeout" and TIMED_OUT in (f.reason or "") for f in frags)
        or any(TIMED_OUT in tb and "not requeued" in tb for tb in errors.values())
    )
    if hit_limit:
        if any(f.status != "timeout" and not is_secondary(f) for f in frags):
            return None  # a rank failed before the limit: that is the cause
        how = (
            "SLURM killed the ranks"
            if base == "TIMEOUT"
            else "submitit's USR2 warning ended it"
            if base != "DEADLINE"
            else "its deadline passed"
        )
        return "timeout", f"the cell exceeded its SLURM time limit of {minutes} min (job {job_id} {state}: {how})"
    if base == "CANCELLED" and not stopped_stuck:
        return "cancelled", f"SLURM job {job_id} was cancelled ({state})"
    if base in ("NODE_FAIL", "BOOT_FAIL"):
        return "crashed", f"SLURM ended job {job_id} {state}: a node failed"
    if base == "OUT_OF_MEMORY":
        return "oom", f"SLURM ended job {job_id} OUT_OF_MEMORY: host memory beyond --mem (slurm.mem_per_node_gib)"
    if base == "PREEMPTED":
        return "cancelled", f"SLURM job {job_id} was preempted and not requeued"
    if base == "UNKNOWN":
        return "crashed", f"sacct has not known SLURM job {job_id} for {UNKNOWN_GRACE_S:g} s (state wiped?)"
    return None


def pack_verdict(
    state: str,
    *,
    started: bool,
    frags: list[Fragment],
    errors: dict[int, str],
    minutes: int,
    job_id: str,
    position: int,
    of: int,
) -> tuple[str, str] | None:
    """(status, reason) of a packed cell left without a record when its pack's job ended, or None when a rank of
    the cell failed first (its fragments decide: launch.core.outcome.classify). `started`: the cell had begun (task 0's
    marker); `errors` are the pack tasks' own (submitit's "timed-out" at the job's limit)."""
    base = base_state(state)
    where = ("while this cell ran" if started else "before this cell ran") + f" (cell {position} of {of})"
    if started and any(f.status != "timeout" and not is_secondary(f) for f in frags):
        return None
    if base in ("TIMEOUT", "DEADLINE") or any(TIMED_OUT in tb and "not requeued" in tb for tb in errors.values()):
        return "timeout", f"the pack's SLURM job {job_id} reached its time limit of {minutes} min {where}"
    if base in ("CANCELLED", "PREEMPTED"):
        return "cancelled", f"SLURM job {job_id} was cancelled ({state}): the pack's job ended {where}"
    if base in ("NODE_FAIL", "BOOT_FAIL"):
        return "crashed", f"SLURM ended job {job_id} {state}: a node failed {where}"
    if base == "OUT_OF_MEMORY" and started:
        return "oom", f"SLURM ended job {job_id} OUT_OF_MEMORY {where}: host memory beyond --mem"
    if base == "UNKNOWN":
        return "crashed", f"sacct has not known SLURM job {job_id} for {UNKNOWN_GRACE_S:g} s (state wiped?) {where}"
    if started and frags:
        return None
    first = next(iter(errors.values()), "").strip().splitlines()
    why = f": {first[-1][:300]}" if first else ""
    return "error", f"the pack's SLURM job {job_id} ended ({state}) {where}, without the cell's record{why}"


# --------------------------------------------------------------------------------------------------
# a sweep's cells on SLURM


@dataclass
class InFlight:
    """One cell's job, followed until it ends (a packed cell: until its record, or its pack's job, ends)."""

    payload: Payload
    job: Any
    """submitit.SlurmJob (one task per rank)"""
    tag: str
    minutes: int
    """the job's --time (min)"""
    since: float
    """when this sweep started following it (time.time(), s)"""
    state: str = "UNKNOWN"
    """sacct's state at the last poll"""
    state_since: float = 0.0
    nodes: str = ""
    stuck_since: float | None = None
    returned_since: float | None = None
    stopped_stuck: bool = False
    """this sweep cancelled the job because its ranks were stuck (the record, fragments or errors say why)"""
    started: bool = False
    """a packed cell whose turn in its job has come (task 0's marker)"""

    @property
    def run_id(self) -> str:
        return self.payload.run_id

    @property
    def pack(self) -> PackPlace | None:
        """A packed cell's place in its job (position, 1-based; of; minutes), else None"""
        return self.payload.pack

    @property
    def world(self) -> int:
        return self.payload.spec.gpus

    @property
    def results_written(self) -> bool:
        return all(self.job.task(k).paths.result_pickle.exists() for k in range(self.world))


class SlurmSweep:
    """One round of a sweep's cells on SLURM: submitted in arrays (or re-attached), polled through sacct, each turned
    into its record as its job ends. The manifest follows every step, so a re-run can re-attach."""

    def __init__(
        self,
        cluster: Cluster,
        *,
        folder: Path,
        manifest: Manifest,
        echo: Callable[[str], None],
        progress: Progress | None = None,
    ):
        """`progress`: the sweep's status line (harness.core.progress), which counts each cell as its record is
        made and is redrawn on the wait loop's tick."""
        self.cluster, self.folder, self.manifest, self.echo = cluster, Path(folder), manifest, echo
        self.progress = progress
        self.cells: dict[str, InFlight] = {}
        self._earlier: Mapping[str, RunEntry] = manifest.data.cells if manifest.path.exists() else {}
        self._executor: Any = None
        self._last_change = time.time()

    def payload_path(self, run_id: str) -> Path:
        return self.manifest.path.parent / ".payloads" / f"{run_id}.json"

    # ---- getting cells in flight

    def reattach(self, run_id: str, *, tag: str) -> bool:
        """Follow the job an earlier sweep submitted for this cell, when the manifest says it is still queued or
        running; False when there is none (then the cell is prepared and submitted as usual)."""
        cell = self._earlier.get(run_id)
        if cell is None or cell.state not in IN_FLIGHT or not cell.job_id:
            return False
        try:
            payload = Payload.model_validate_json(self.payload_path(run_id).read_bytes())
        except (OSError, ValueError):
            return False
        if payload.attempt != cell.attempt or payload.job_id is None or payload.job_id != cell.job_id:
            return False
        world = payload.spec.gpus
        job: Any = submitit.SlurmJob(folder=self.folder, job_id=payload.job_id, tasks=list(range(world)))
        self._follow(payload, job, tag)
        place = f", cell {payload.pack.position} of its pack" if payload.pack is not None else ""
        self.echo(
            f"{tag}  re-attached to SLURM job {payload.job_id}{place} (submitted earlier; last seen "
            f"{cell.slurm_state or cell.state})"
        )
        return True

    def submit(self, items: list[tuple[Payload, str]], *, pack: bool = False) -> dict[str, Record]:
        """Submit (payload, tag) cells, one job array per group asking for the same nodes, tasks per node and
        time limit — or with `pack`, one job per pack (submit_packs). Returns the records of the cells sbatch
        refused (error, with sbatch's message)."""
        if pack:
            return self.submit_packs(items)
        groups: dict[tuple[int, int, int], list[tuple[Payload, str]]] = {}
        for payload, tag in items:
            key = (*_shape(payload), job_minutes(_time_limit(payload), self.cluster.slurm))
            groups.setdefault(key, []).append((payload, tag))
        refused: dict[str, Record] = {}
        for (nodes, tasks, minutes), members in groups.items():
            shape = f"{nodes} node{'s' if nodes > 1 else ''} x {tasks} task{'s' if tasks > 1 else ''}, {minutes} min"
            ex = self._executor_for(nodes=nodes, tasks_per_node=tasks, timeout_min=minutes)
            try:
                with ex.batch():
                    jobs = [ex.submit(SlurmCell(), payload) for payload, _ in members]
            except (FailedJobError, FailedSubmissionError, OSError) as e:
                for payload, tag in members:
                    refused[payload.run_id] = self._record(
                        payload, tag, ended=("error", f"sbatch refused the job ({shape}): {str(e).strip()[-2000:]}")
                    )
                continue
            for i, ((payload, tag), job) in enumerate(zip(members, jobs)):
                try:
                    self._submitted(payload, job, tag, line=f"submitted: SLURM job {job.job_id} ({shape})")
                except Exception:
                    for later in jobs[i + 1 :]:  # NOTE: not followed, not in the manifest: a re-run submits them anew
                        later.cancel(check=False)
                    raise
        return refused

    def submit_packs(self, items: list[tuple[Payload, str]]) -> dict[str, Record]:
        """--pack: cells asking for the same nodes and tasks per node share one job and run in it one after another
        (SlurmPack); its --time is the sum of their job minutes, and a group whose sum exceeds the profile's
        time_limit_min is split into packs that each fit. Returns the records of the cells sbatch refused."""
        groups: dict[tuple[int, int], list[tuple[Payload, str]]] = {}
        for payload, tag in items:
            groups.setdefault(_shape(payload), []).append((payload, tag))
        refused: dict[str, Record] = {}
        for (nodes, tasks), group in groups.items():
            minutes = [job_minutes(_time_limit(p), self.cluster.slurm) for p, _ in group]
            for indices in split_packs(minutes, self.cluster.slurm.time_limit_min):
                total = sum(minutes[i] for i in indices)
                members = [
                    (p.model_copy(update={"pack": PackPlace(position=k, of=len(indices), minutes=total)}), tag)
                    for k, (p, tag) in enumerate((group[i] for i in indices), 1)
                ]
                shape = f"{nodes} node{'s' if nodes > 1 else ''} x {tasks} task{'s' if tasks > 1 else ''}, {total} min"
                ex = self._executor_for(nodes=nodes, tasks_per_node=tasks, timeout_min=total)
                try:
                    job = ex.submit(SlurmPack(), [payload for payload, _ in members])
                except (FailedJobError, FailedSubmissionError, OSError) as e:
                    for payload, tag in members:
                        refused[payload.run_id] = self._record(
                            payload,
                            tag,
                            ended=("error", f"sbatch refused the packed job ({shape}): {str(e).strip()[-2000:]}"),
                        )
                    continue
                for payload, tag in members:
                    place = _pack_of(payload)
                    line = f"submitted: SLURM job {job.job_id}, cell {place.position} of {len(members)} in one pack"
                    self._submitted(payload, job, tag, line=f"{line} ({shape})")
        return refused

    def _submitted(self, payload: Payload, job: Any, tag: str, *, line: str) -> None:
        """A cell sbatch took: its payload (with the job id) for re-attaching, its manifest entry, followed from now
        on; `line` is what the console says after its tag."""
        payload = payload.model_copy(update={"job_id": job.job_id})
        try:
            # NOTE: the payload file before the manifest entry: a re-run re-attaches only with both
            atomic_write_json(self.payload_path(payload.run_id), payload.to_dict())
            place = None if payload.pack is None else ManifestPlace(position=payload.pack.position, of=payload.pack.of)
            self.manifest.submitted(payload.run_id, attempt=payload.attempt, job_id=job.job_id, pack=place)
        except Exception as e:
            # a job no re-run could re-attach to (a full disk): cancelled, and the cell recorded failed (stopped_run)
            job.cancel(check=False)
            self._stopped(payload, tag, e)
            raise
        self._follow(payload, job, tag)
        self.echo(f"{tag}  {line}")

    def _executor_for(self, *, nodes: int, tasks_per_node: int, timeout_min: int) -> Any:
        if self._executor is None:
            # max_num_timeout=0: a cell that reaches its time limit ends there (a benchmark resumed after a
            # timeout would measure nothing new); preemption still requeues (SlurmCell is Checkpointable)
            self._executor = submitit.AutoExecutor(folder=self.folder, cluster="slurm", slurm_max_num_timeout=0)
        self._executor.update_parameters(
            name=f"harness-{self.manifest.header.sweep or 'sweep'}",
            **executor_parameters(
                self.cluster,
                nodes=nodes,
                tasks_per_node=tasks_per_node,
                timeout_min=timeout_min,
                node_cpus=node_cpus_for(self.cluster),
            ),
        )
        return self._executor

    def _follow(self, payload: Payload, job: Any, tag: str) -> None:
        now = time.time()
        minutes = (
            payload.pack.minutes if payload.pack is not None else job_minutes(_time_limit(payload), self.cluster.slurm)
        )
        self.cells[payload.run_id] = InFlight(
            payload=payload, job=job, tag=tag, minutes=minutes, since=now, state_since=now
        )
        self._last_change = now

    # ---- following them

    def wait(self) -> dict[str, Record]:
        """Follow every cell until its job ends; returns each one's record. Progress is echoed when it changes."""
        records: dict[str, Record] = {}
        t0, last_poll, shown = time.time(), float("-inf"), ""
        while self.cells:
            now = time.time()
            finished_files = any(c.results_written for c in self.cells.values() if flight_state(c.state) != "ended")
            if now - last_poll >= self._poll_interval(now) or (finished_files and now - last_poll >= 1.0):
                self.poll()
                last_poll = now
            for cell in list(self.cells.values()):
                if cell.pack and (rec := self._pack_progress(cell)) is not None:
                    records[cell.run_id] = rec
                elif self._ended(cell, now):
                    records[cell.run_id] = self._finalize(cell)
                elif why := self._stuck(cell, now):
                    cell.job.cancel(check=False)
                    cell.stopped_stuck = True
                    self._last_change = now
                    self.echo(f"{cell.tag}  {why}: cancelling SLURM job {cell.job.job_id}")
            line = self._progress(len(records))
            if line != shown:
                self.echo(f"  slurm: {line}  [{time.time() - t0:.0f} s]")
                shown = line
            if self.progress is not None:
                self.progress.draw()  # NOTE: the elapsed time moves on a terminal; nothing is written to a log
            if self.cells:
                time.sleep(POLL_TICK_S)
        return records

    def poll(self) -> None:
        """One sacct call for every followed job (submitit's shared watcher); changes go to the manifest."""
        watcher = submitit.SlurmJob.watcher
        watcher.update()
        now = time.time()
        for cell in self.cells.values():
            info = watcher.get_info(cell.job.job_id, mode="cache")
            state = info.get("State") or "UNKNOWN"
            if state != cell.state:
                cell.state, cell.state_since, cell.nodes = state, now, node_list(info.get("NodeList"))
                self._last_change = now
                # NOTE: an ended cell's state comes with its record
                in_flight = self._cell_state(cell) if flight_state(state) != "ended" else None
                self.manifest.polled(cell.run_id, slurm_state=state, nodes=cell.nodes, state=in_flight)

    @staticmethod
    def _cell_state(cell: InFlight) -> str:
        """The manifest state of a cell in flight: its job's, except that a packed cell waiting for its turn in a
        running job is still `submitted`."""
        state = flight_state(cell.state)
        return "submitted" if state == "running" and cell.pack and not cell.started else state

    def _pack_progress(self, cell: InFlight) -> Record | None:
        """A packed cell's record as soon as task 0 has made it final (before its job ends), else None; marks the
        cell running when its turn has come."""
        from harness.launch.slurm.pack import cell_recorded, cell_started

        if base_state(cell.state) not in RUNNING_STATES:  # nothing of this run to see yet; an ended job: _finalize
            return None
        if not cell.started and cell_started(cell.payload):
            cell.started = True
            self.manifest.running(cell.run_id)
        if cell_recorded(cell.payload) is None:
            return None
        cell.started = True
        return self._record(cell.payload, cell.tag, ended=None, job=cell.job, since=cell.since, log_tail="")

    def _poll_interval(self, now: float) -> float:
        return min(SACCT_MAX_S, max(SACCT_MIN_S, (now - self._last_change) / 10))

    @staticmethod
    def _ended(cell: InFlight, now: float) -> bool:
        base = base_state(cell.state)
        if base == "UNKNOWN":
            return now - cell.state_since > UNKNOWN_GRACE_S
        if base == "PREEMPTED":
            return now - cell.state_since > PREEMPTED_GRACE_S
        return base in ENDED_STATES

    @staticmethod
    def _stuck(cell: InFlight, now: float) -> str:
        """Why a running job should be cancelled rather than left to its time limit, or '': a rank failed and the
        job still runs STUCK_GRACE_S later (a hung peer, a collective that will never complete), or every task
        returned and it still runs JOB_END_GRACE_S later (a rank hangs on its way out)."""
        if cell.pack:  # the pack's tasks end a stuck cell themselves, and the job goes on to the next
            return ""
        # NOTE: only while RUNNING: the fragments and result files of a requeued job's earlier run are still there
        # while it waits; its ranks delete their fragments as they restart
        running = not cell.stopped_stuck and base_state(cell.state) in RUNNING_STATES
        failed = running and bool(fragments_of(cell.payload))
        # NOTE: only beats of this run of the job: a requeued job's earlier run left beats that stopped long ago
        beats = [b for b in beats_of(cell.payload) if float(b.time) >= cell.state_since] if running else []
        stopped = stopped_ranks(beats, now=now, stale_s=BEAT_STALE_S)
        returned = running and cell.results_written
        cell.stuck_since = (cell.stuck_since or now) if failed else None
        cell.returned_since = (cell.returned_since or now) if returned else None
        if stopped:
            return f"rank {stopped[0]}'s heartbeat stopped {BEAT_STALE_S:g} s ago and the job still runs"
        if cell.stuck_since is not None and now - cell.stuck_since > STUCK_GRACE_S:
            return f"a rank failed and the job still runs {STUCK_GRACE_S:g} s later"
        if cell.returned_since is not None and now - cell.returned_since > JOB_END_GRACE_S:
            return f"every rank returned and the job still runs {JOB_END_GRACE_S:g} s later"
        return ""

    def _progress(self, ended: int) -> str:
        running = sum(self._cell_state(c) == "running" for c in self.cells.values())
        return f"{len(self.cells) - running} pending, {running} running, {ended} ended"

    def _finalize(self, cell: InFlight) -> Record:
        if cell.pack:
            return self._finalize_packed(cell)
        frags = fragments_of(cell.payload)
        errors = task_errors(cell.job, cell.world)
        ended = verdict(
            cell.state,
            frags=frags,
            errors=errors,
            minutes=cell.minutes,
            job_id=cell.job.job_id,
            stopped_stuck=cell.stopped_stuck,
        )
        return self._record(cell.payload, cell.tag, ended=ended, errors=errors, job=cell.job, since=cell.since)

    def _finalize_packed(self, cell: InFlight) -> Record:
        """A packed cell whose job ended: its record if task 0 made it, else one from how the job ended and whether
        the cell had begun (pack_verdict)."""
        from harness.launch.slurm.pack import cell_started, log_tail

        if fresh_record(cell.payload) is not None:
            return self._record(cell.payload, cell.tag, ended=None, job=cell.job, since=cell.since, log_tail="")
        started = cell_started(cell.payload)
        frags = fragments_of(cell.payload) if started else []
        assert cell.pack is not None, "only packed cells come here"
        ended = pack_verdict(
            cell.state,
            started=started,
            frags=frags,
            errors=task_errors(cell.job, cell.world),
            minutes=cell.minutes,
            job_id=cell.job.job_id,
            position=cell.pack.position,
            of=cell.pack.of,
        )
        tail = log_tail(cell.payload, cell.world) if started else ""
        return self._record(cell.payload, cell.tag, ended=ended, job=cell.job, since=cell.since, log_tail=tail)

    def _record(
        self,
        payload: Payload,
        tag: str,
        *,
        ended: tuple[str, str] | None,
        errors: dict | None = None,
        job: Any = None,
        since: float | None = None,
        log_tail: str | None = None,
    ) -> Record:
        """The cell's one record (finalize: rank 0's when it wrote one), the manifest, a line; the cell is done.
        `log_tail`: the output to keep in a composed record (default: the job's task logs)."""
        minutes = job_minutes(_time_limit(payload), self.cluster.slurm)
        if log_tail is None:
            log_tail = job_log_tail(job, payload.spec.gpus) if job is not None else ""
        try:
            # NOTE: SLURM enforces the time limit and its verdict comes as `ended`: elapsed 0 keeps classify's own
            # wall-clock rule (for local cells) out of it
            rec = finalize(
                payload,
                elapsed_s=0.0,
                time_limit_s=minutes * 60.0,
                ended=ended,
                job_errors=errors or None,
                log_tail=log_tail,
            )
            if payload.pack is not None and payload.job_id and rec.env.slurm_pack is None:
                rec = rec.in_pack(job_id=payload.job_id, position=payload.pack.position, of=payload.pack.of)
                write_record(payload.results, rec)
            self.manifest.ended(payload.run_id, rec, attempt=payload.attempt)
        except Exception as e:
            self._stopped(payload, tag, e)
            raise
        place = f", cell {payload.pack.position}/{payload.pack.of}" if payload.pack is not None else ""
        took = (
            f"  (job {job.job_id}{place}, {time.time() - since:.1f} s)" if job is not None and since is not None else ""
        )
        self.echo(f"{tag}  {describe(rec)}{took}")
        self.cells.pop(payload.run_id, None)
        if self.progress is not None:
            self.progress.advance(timed=job is not None)  # NOTE: sbatch's refusal took no time
        return rec

    def _stopped(self, payload: Payload, tag: str, error: Exception) -> None:
        """The sweep stops at this cell on `error` (a write the disk has no room for): the cell recorded failed
        (outcome.stopped_run), no longer followed; the backend detaches from the others (a re-run re-attaches)."""
        rec, noted = stopped_run(payload, error, manifest=self.manifest)
        self.echo(f"{tag}  {describe(rec)}" + ("" if noted else "; the manifest could not be updated either"))
        self.cells.pop(payload.run_id, None)

    # ---- letting go

    def cancel_all(self, *, reason: str) -> None:
        """scancel every followed job and record its cell cancelled (rank 0's record wins if it got written)."""
        for cell in {c.job.job_id: c for c in self.cells.values()}.values():  # a pack's job once
            cell.job.cancel(check=False)
        for cell in list(self.cells.values()):
            if cell.pack:
                from harness.launch.slurm.pack import cell_started

                began = cell.started or cell_started(cell.payload)
                where = " while this cell ran" if began else " before this cell ran"
            else:
                where = ""
            self._record(
                cell.payload,
                cell.tag,
                job=cell.job,
                since=cell.since,
                ended=(
                    "cancelled",
                    f"{reason}: SLURM job {cell.job.job_id} was cancelled{where} (re-running "
                    "the sweep runs the cell again)",
                ),
            )

    def detach(self) -> int:
        """Leave the followed jobs running (--no-wait); the manifest has their job ids. Returns how many."""
        n = len(self.cells)
        if n:
            ids = ", ".join(dict.fromkeys(c.job.job_id for c in self.cells.values()))
            self.echo(
                f"detached from {n} cell{'s' if n > 1 else ''} on SLURM (jobs {ids}): `harness status "
                f"{self.manifest.path.parent}` follows them; re-running this sweep collects their records"
            )
        self.cells.clear()
        return n
