"""`harness calibrate`'s orchestration: the processes that measure a cluster's rates, and the merged file.

One `compute` process (harness.calibrate.process) measures the device and the one-rank collectives and framework
overheads; then, for each group size, that many `collectives` processes (one per rank, rendezvous on localhost)
measure the collectives of a group spanning ranks of this host — the local profile's simulated nodes share it, so
its hybrids' cross-"node" groups use these curves too. Every process gets the profile's `env` (locally
OMP_NUM_THREADS=1), as the ranks of a sweep do. The parts are read back through their typed models and merged into
the file's (harness.plan.calibration.file.Calibration), written atomically with the date and the duration to
`harness.plan.calibration.find.write_path(cluster)`.

On a SLURM profile the same processes run as jobs, one after another so that no part disturbs another: the
device part on one node (one task), the collectives of groups inside one node (a job of that many tasks on one
node, link "intra"), then across nodes (two nodes with one task each, and two full nodes: link "inter", the curves
the step-time model prices a hybrid's cross-node groups with). Ranks and rendezvous come from submitit's job
environment, as a sweep's cells do. The parts write into a folder next to the calibration file (a cluster's
profiles folder is on the shared file system that the nodes see); it is removed when the file is written.

On a terminal, a status line (harness.core.progress) counts the parts done, with an ETA from their mean time so far;
the local processes' output is then relayed through this process, line by line, so that it prints above the status
line instead of through it. Not on a terminal, the processes write to this one's stdout directly, as they always did.
"""

from __future__ import annotations

import contextlib
import datetime
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, Any

from harness.core.errors import InputError, Problem
from harness.core.ports import derived_port, free_port
from harness.core.progress import Progress
from harness.plan.calibration.file import (
    Calibration,
    CollectivesPart,
    read_calibration,
    read_collectives_part,
    write_calibration,
)
from harness.plan.calibration.find import write_path
from harness.scenario.cluster import Cluster

WORLDS = (2, 4)
"""group sizes whose collectives are measured besides the one-rank group"""
PROCESS = "harness.calibrate.process"
"""the measuring processes' module (`python -m`; a SLURM task calls its `main`)"""
Measured = tuple[Calibration, list[CollectivesPart]]
"""what the processes wrote: the device's part (the file without the groups) and each group's part"""


def _env(cluster: Cluster) -> dict[str, str]:
    env = dict(os.environ)
    for k, v in cluster.env.items():
        env.setdefault(k, v)
    env.setdefault("PYTHONUNBUFFERED", "1")
    return env


class CalibrationFailed(RuntimeError):
    """A measuring process or job failed; its output (or SLURM log) says why."""


Say = Callable[[str], None]
"""prints one line of the command's progress (above the status line, on a terminal)"""


def _say(line: str) -> None:
    print(line, flush=True)


def _relay(stream: IO[str] | None, say: Say | None) -> None:
    """A process's output, line by line, through `say` (when it was piped: `say` given)."""
    if stream is None or say is None:
        return
    for line in stream:
        say(line.rstrip("\n"))


def _run(cmd: list[str], env: dict[str, str], what: str, *, relay: Say | None = None) -> None:
    """Run one measuring process; its output to this one's stdout, or through `relay` line by line. Killed when this
    one is stopped (as subprocess.run does)."""
    with subprocess.Popen(cmd, env=env, stdout=None if relay is None else subprocess.PIPE, text=True) as proc:
        try:
            _relay(proc.stdout, relay)
            rc = proc.wait()
        except BaseException:
            proc.kill()
            raise
    if rc != 0:
        raise CalibrationFailed(f"calibration {what} failed (exit {rc}); its output is above")


def _collectives(
    cluster: Cluster, world: int, out: Path, *, quick: bool, env: dict[str, str], relay: Say | None = None
) -> None:
    port = str(free_port())
    procs = []
    for rank in range(world):
        e = dict(env, MASTER_ADDR="127.0.0.1", MASTER_PORT=port, RANK=str(rank), WORLD_SIZE=str(world))
        e["LOCAL_RANK"] = str(rank)
        cmd = [sys.executable, "-m", PROCESS, "collectives", "--cluster", cluster.path]
        cmd += ["--out", str(out), "--link", "intra"] + (["--quick"] if quick else [])
        shown = None if relay is None else subprocess.PIPE
        procs.append(subprocess.Popen(cmd, env=e, stdout=shown if rank == 0 else subprocess.DEVNULL, text=True))
    _relay(procs[0].stdout, relay)
    codes = [p.wait() for p in procs]
    if any(codes):
        raise CalibrationFailed(f"calibration of collectives on {world} ranks failed (exit codes {codes})")


def check_calibratable(cluster: Cluster) -> None:
    """InputError (exit 2) for a profile this command cannot calibrate; a SLURM profile whose controller does not
    answer raises the sweep's SlurmUnavailable (also exit 2)."""
    if cluster.executor == "local":
        return
    if cluster.executor != "slurm":
        raise InputError([Problem(cluster.path, "executor", f"{cluster.executor!r} cannot be calibrated")])
    from harness.launch.slurm.jobs import preflight

    preflight(cluster)


# --------------------------------------------------------------------------------------------------
# SLURM: the parts as jobs


class CalibrationTask:
    """What every task of a calibration job runs: one role of harness.calibrate.process, with RANK, WORLD_SIZE,
    LOCAL_RANK and the rendezvous (the job's first node, a port derived from the job id) from submitit."""

    def __call__(self, argv: list[str], env: dict[str, str]) -> None:
        import submitit

        job = submitit.JobEnvironment()
        for k, v in env.items():  # the profile's env (threads per rank), as a sweep's ranks get it
            os.environ.setdefault(k, v)
        from harness.calibrate.process import main  # NOTE: after the env: torch reads OMP_NUM_THREADS on import

        os.environ.update(
            RANK=str(job.global_rank),
            WORLD_SIZE=str(job.num_tasks),
            LOCAL_RANK=str(job.local_rank),
            MASTER_ADDR=job.hostnames[0],
            MASTER_PORT=str(derived_port(job.job_id)),
        )
        main(argv)


def slurm_parts(cluster: Cluster, worlds: tuple[int, ...]) -> list[tuple[str, int, int, str]]:
    """(what, nodes, tasks per node, link) of each collectives job on a SLURM profile: every group size of
    `worlds` that fits one node, inside one node; then one and all of a node's ranks on each of two nodes."""
    per_node = cluster.gpus_per_node
    parts = [(f"collectives on {w} ranks of one node", 1, w, "intra") for w in worlds if 1 < w <= per_node]
    parts.append(("collectives on 2 nodes, one rank each", 2, 1, "inter"))
    if per_node > 1:
        parts.append((f"collectives on 2 nodes, {per_node} ranks each", 2, per_node, "inter"))
    return parts


@contextlib.contextmanager
def _work_dir(target: Path) -> Iterator[Path]:
    """A fresh folder beside the calibration file, on the file system the nodes share; removed afterwards."""
    target.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=f".{target.stem}-", dir=target.parent))
    try:
        yield work
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _run_job(
    executor: Any, *, cluster: Cluster, nodes: int, tasks: int, argv: list[str], what: str, say: Say = _say
) -> None:
    from harness.launch.slurm.jobs import executor_parameters
    from harness.launch.slurm.resources import node_cpus_for

    cap = cluster.slurm.time_limit_min
    minutes = JOB_MINUTES if cap is None else min(JOB_MINUTES, cap)
    executor.update_parameters(
        name=f"harness-calibrate-{cluster.name}",
        **executor_parameters(
            cluster, nodes=nodes, tasks_per_node=tasks, timeout_min=minutes, node_cpus=node_cpus_for(cluster)
        ),
    )
    job = executor.submit(CalibrationTask(), argv, dict(cluster.env))
    say(f"calibrate: {what}: SLURM job {job.job_id} ({nodes} node(s) x {tasks} task(s))")
    try:
        job.results()
    except Exception as e:  # noqa: BLE001 - submitit's FailedJobError / UncompletedJobError: one line, the log path
        lines = [line for line in str(e).strip().splitlines() if line.strip()]
        why = lines[-1] if lines else type(e).__name__
        raise CalibrationFailed(
            f"calibration {what} failed in SLURM job {job.job_id}: {why} (logs: {job.paths.folder})"
        ) from None


JOB_MINUTES = 30
"""the --time of each calibration job (min); the profile's time_limit_min caps it"""


def _calibrate_on_slurm(
    cluster: Cluster, *, quick: bool, worlds: tuple[int, ...], work: Path, storage: Path, progress: Progress
) -> Measured:
    import submitit

    say = progress.above(_say)
    executor = submitit.AutoExecutor(folder=work / "submitit", cluster="slurm", slurm_max_num_timeout=0)
    flags = ["--cluster", cluster.path] + (["--quick"] if quick else [])
    compute = work / "compute.json"
    _run_job(
        executor,
        cluster=cluster,
        nodes=1,
        tasks=1,
        argv=["compute", "--out", str(compute), "--storage-dir", str(storage), *flags],
        what="device, one-rank collectives and framework overheads",
        say=say,
    )
    device_part = read_calibration(compute)
    progress.advance()
    parts = []
    for i, (what, nodes, tasks, link) in enumerate(slurm_parts(cluster, worlds)):
        part = work / f"comm{i}.json"
        argv = ["collectives", "--out", str(part), "--link", link, *flags]
        progress.doing(what)
        _run_job(executor, cluster=cluster, nodes=nodes, tasks=tasks, argv=argv, what=what, say=say)
        parts.append(read_collectives_part(part))
        progress.advance()
    return device_part, parts


def _calibrate_locally(
    cluster: Cluster, *, quick: bool, worlds: tuple[int, ...], storage: Path, progress: Progress
) -> Measured:
    env = _env(cluster)
    say = progress.above(_say)
    relay = say if progress.live else None  # NOTE: the processes' lines above the status line, not through it
    with tempfile.TemporaryDirectory(prefix="harness-calibrate-") as tmp:
        compute = Path(tmp) / "compute.json"
        say(f"calibrate: cluster {cluster.name}: device, one-rank collectives and framework overheads")
        progress.doing("device")
        cmd = [sys.executable, "-m", PROCESS, "compute", "--cluster", cluster.path]
        cmd += ["--out", str(compute), "--storage-dir", str(storage)]
        _run(cmd + (["--quick"] if quick else []), env, "of the device", relay=relay)
        device_part = read_calibration(compute)
        progress.advance()
        parts = []
        for world in worlds:
            say(f"calibrate: collectives on {world} ranks")
            progress.doing(f"collectives on {world} ranks")
            part = Path(tmp) / f"comm{world}.json"
            _collectives(cluster, world, part, quick=quick, env=env, relay=relay)
            parts.append(read_collectives_part(part))
            progress.advance()
    return device_part, parts


def part_count(cluster: Cluster, worlds: tuple[int, ...]) -> int:
    """How many measuring parts a calibration of `cluster` runs: the device's, then one per group (locally: per
    size in `worlds`; on SLURM: `slurm_parts`), one after another."""
    return 1 + (len(slurm_parts(cluster, worlds)) if cluster.executor == "slurm" else len(worlds))


def calibrate(
    cluster: Cluster, *, quick: bool = False, out: Path | None = None, worlds: tuple[int, ...] = WORLDS
) -> Path:
    """Measure `cluster`'s rates (on this machine, or as jobs on a SLURM profile's nodes) and write its calibration
    file; returns the path."""
    check_calibratable(cluster)
    target = out or write_path(cluster)
    # NOTE: the checkpoint folder's bandwidth is measured where checkpoints go: the profile's checkpoint_dir, else
    # beside the calibration file (not the processes' temp folder, which may be another file system)
    storage = Path(cluster.checkpoint_dir) if cluster.checkpoint_dir else target.resolve().parent
    started = datetime.datetime.now(datetime.timezone.utc)
    t0 = time.perf_counter()
    # NOTE: a status line on a terminal only (harness.core.progress); the ETA is the parts' mean time so far
    with Progress(f"calibrate {cluster.name}", part_count(cluster, worlds), unit="parts") as progress:
        if cluster.executor == "slurm":
            with _work_dir(target) as work:
                device_part, parts = _calibrate_on_slurm(
                    cluster, quick=quick, worlds=worlds, work=work, storage=storage, progress=progress
                )
        else:
            device_part, parts = _calibrate_locally(
                cluster, quick=quick, worlds=worlds, storage=storage, progress=progress
            )
    merged = device_part.merged(
        parts,
        created_at=started.isoformat(timespec="seconds"),
        duration_s=round(time.perf_counter() - t0, 1),
        quick=quick,
    )
    for dtype in merged.compute.in_step:
        print(
            f"calibrate: {dtype} in-step factors x {merged.in_step_drift(dtype):.3f}: the plain step's median time "
            "over the calibration against the in-step probes' moment",
            flush=True,
        )
    return write_calibration(target, merged)
