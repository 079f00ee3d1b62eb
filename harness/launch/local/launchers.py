"""The local backend: a cell's ranks as processes on this machine — `launch_foreground` (child processes,
torchrun-style environment; `harness run`, the tests) and `launch_submitit` (a submitit LocalExecutor job, one
task per rank; local sweeps) — and what they share: the watch that ends a cell whose ranks are stuck after one
failed, killing a cell's whole process tree, and which GPUs a local sweep may use.

Why a module of its own: the local launchers start and kill processes and end each cell with launch/core's
`finalize`, exactly as the SLURM backend does with its jobs; the sweep only chooses between them. Every rank is
`python -m harness.launch.entry` (or submitit's task calling `harness.launch.entry.submitit_entry`), which
may have it forked from the sweep's warm interpreter (prefork.py, beside this module).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil

from harness.core.ports import free_port
from harness.launch.core.outcome import (
    STALE_S,
    Interrupted,
    beats_of,
    cancel_cell,
    finalize,
    fragments_of,
    job_log_tail,
    stopped_ranks,
)
from harness.plan.placement import parse_visible_devices
from harness.results.payload import Payload
from harness.results.record import Record
from harness.results.store import atomic_write_json
from harness.scenario.cluster import Cluster


def launch_foreground(payload: Payload, *, time_limit_s: float, stream: bool = True) -> Record:
    """Run a cell's ranks as child processes of this one (no scheduler), torchrun-style environment.

    All ranks share a new process group, killed as a whole on timeout or Ctrl-C: no rank outlives its cell.
    """
    world = payload.spec.gpus
    with tempfile.TemporaryDirectory(prefix="harness-") as tmp:
        ppath = Path(tmp) / "payload.json"
        atomic_write_json(ppath, payload.to_dict())
        procs = []
        base_env = dict(os.environ)
        base_env.update(payload.cluster.env)
        base_env.update(
            MASTER_ADDR="127.0.0.1",
            MASTER_PORT=str(payload.master_port or free_port()),
            WORLD_SIZE=str(world),
            PYTHONUNBUFFERED="1",
        )
        gpn = payload.spec.gpus_per_node
        # ranks' output is logs: to our stderr (stdout stays for results, e.g. `harness run --json`)
        out = sys.stderr if stream else subprocess.DEVNULL
        t0 = time.time()
        pgid = None
        for r in range(world):
            env = dict(base_env, RANK=str(r), LOCAL_RANK=str(r % gpn if payload.cluster.device == "cuda" else r))
            p = subprocess.Popen(
                [sys.executable, "-m", "harness.launch.entry", str(ppath)],
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
                process_group=pgid if pgid is not None else 0,
            )
            pgid = p.pid if pgid is None else pgid
            procs.append(p)
        watch = FailureWatch(payload)

        def kill() -> None:
            if any(p.poll() is None for p in procs):
                _kill_group(pgid)
                for p in procs:
                    p.wait()

        try:
            while any(p.poll() is None for p in procs):
                if time.time() - t0 > time_limit_s or watch.stuck():
                    break
                time.sleep(0.1)
        except KeyboardInterrupt:
            return cancel_cell(payload, kill=kill, elapsed_s=time.time() - t0, time_limit_s=time_limit_s)
        finally:
            kill()
        elapsed = time.time() - t0
        return finalize(
            payload,
            elapsed_s=elapsed,
            time_limit_s=time_limit_s,
            exit_codes=[p.returncode for p in procs],
        )


class FailureWatch:
    """A rank that failed leaves a fragment; ranks still alive `grace_s` later are stuck (a hung peer, a
    collective that will never complete): the launcher ends the cell instead of waiting for its time limit. A rank
    whose heartbeat stopped (harness.worker.heartbeat: it died or froze without an exception, as NCCL's ranks do)
    makes the cell stuck at once: its beat has been silent for outcome.STALE_S already."""

    def __init__(self, payload: Payload, grace_s: float = 15.0, stale_s: float = STALE_S):
        self.payload, self.grace_s, self.stale_s = payload, grace_s, stale_s
        self.first_seen: float | None = None
        self._next_check = 0.0

    def stuck(self) -> bool:
        now = time.time()
        if now < self._next_check:
            return False
        self._next_check = now + 1.0
        if stopped_ranks(beats_of(self.payload), now=now, stale_s=self.stale_s):
            return True
        if self.first_seen is None:
            if fragments_of(self.payload):
                self.first_seen = now
            return False
        return now - self.first_seen > self.grace_s


def _kill_tree(pid: int) -> None:
    """SIGTERM, then SIGKILL, a process and all its descendants (a local submitit job: controller + ranks)."""
    # NOTE: psutil is imported at the top (a declared dependency): imported here inside `except Exception: return`,
    # its absence made every stuck cell silently unkillable
    try:
        root = psutil.Process(pid)
        procs = root.children(recursive=True) + [root]
    except psutil.NoSuchProcess:  # already gone
        return
    for p in procs:
        try:
            p.terminate()
        except Exception:  # noqa: BLE001
            pass
    _, alive = psutil.wait_procs(procs, timeout=3)
    for p in alive:
        try:
            p.kill()
        except Exception:  # noqa: BLE001
            pass
    psutil.wait_procs(alive, timeout=3)


def _kill_group(pgid: int | None) -> None:
    if pgid is None:
        return
    for sig, wait in ((signal.SIGTERM, 3.0), (signal.SIGKILL, 0.0)):
        try:
            os.killpg(pgid, sig)
        except ProcessLookupError:
            return
        deadline = time.time() + wait
        while time.time() < deadline:
            try:
                os.killpg(pgid, 0)
            except ProcessLookupError:
                return
            time.sleep(0.05)


def local_gpus() -> list[int] | None:
    """The GPUs a local sweep may use, by index: CUDA_VISIBLE_DEVICES when it lists indices, else every device
    torch sees; None when CUDA_VISIBLE_DEVICES names GPUs by UUID or MIG id (then nothing is checked)."""
    env = os.environ.get("CUDA_VISIBLE_DEVICES")
    if env is not None:
        return parse_visible_devices(env)
    import torch

    return list(range(torch.cuda.device_count()))


def local_executor_parameters(world: int, *, cluster: Cluster, time_limit_s: float) -> dict[str, Any]:
    """submitit LocalExecutor parameters of a local cell: one task per rank, one node."""
    # timeout_min bounds the whole job; the Controller then kills every task
    params: dict[str, Any] = {
        "tasks_per_node": world,
        "nodes": 1,
        "timeout_min": time_limit_s / 60.0,
        "signal_delay_s": min(30, max(1, int(time_limit_s // 10))),
    }
    # NOTE: gpus_per_node also sets the tasks' CUDA_VISIBLE_DEVICES, to the first gpus_per_node of visible_gpus
    # (default 0, 1, ...: physical indices, which would ignore the user's CUDA_VISIBLE_DEVICES=2,3); 0 would hide
    # every GPU
    params["gpus_per_node"] = world if cluster.device == "cuda" else 0
    gpus = local_gpus() if cluster.device == "cuda" else None
    if gpus:
        params["visible_gpus"] = tuple(gpus)
    return params


def launch_submitit(
    payload: Payload,
    *,
    cluster: Cluster,
    folder: Path,
    time_limit_s: float,
    on_submit: Callable[[Any], None] | None = None,
) -> Record:
    """Run one cell as a local submitit job with one task per rank and wait for it (SLURM cells:
    harness.launch.slurm.jobs)."""
    import submitit

    from harness.launch.entry import submitit_entry

    world = payload.spec.gpus
    if cluster.executor != "local":
        raise ValueError(f"launch_submitit runs local cells; {cluster.name!r} is a {cluster.executor} profile")
    executor = submitit.LocalExecutor(folder=folder)
    executor.update_parameters(**local_executor_parameters(world, cluster=cluster, time_limit_s=time_limit_s))
    t0 = time.time()
    # NOTE: SIGINT is blocked while submitit starts the job's controller, which inherits the blocked signal (across
    # exec, as do the tasks it starts): a terminal's Ctrl-C goes to the whole foreground process group, and without
    # this the controller printed a KeyboardInterrupt traceback; this process kills the job's tree instead (below).
    # A Ctrl-C meanwhile is not lost: it arrives when the mask is restored, inside the try. (submitit's
    # LocalJob.cancel, a SIGINT to the controller, is not used: _kill_tree ends a job.)
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        job = executor.submit(submitit_entry, payload)
        if on_submit:
            on_submit(job)
    except BaseException:
        # NOTE: the mask must never stay blocked: every process this one starts later inherits it (a sweep after
        # this would not see Ctrl-C at all)
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)
        raise
    watch = FailureWatch(payload)
    try:
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)
        while not job.done():
            over = time.time() - t0 > time_limit_s + 15  # the controller's own kill is late or missing
            if over or watch.stuck():
                _kill_tree(int(job.job_id))
                break
            time.sleep(0.2)
    except KeyboardInterrupt:
        rec = cancel_cell(
            payload, kill=lambda: _kill_tree(int(job.job_id)), elapsed_s=time.time() - t0, time_limit_s=time_limit_s
        )
        raise Interrupted(rec) from None
    elapsed = time.time() - t0
    return finalize(payload, elapsed_s=elapsed, time_limit_s=time_limit_s, log_tail=job_log_tail(job, world))
