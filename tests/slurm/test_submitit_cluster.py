"""Plain submitit on the real localhost SLURM cluster: the behaviours the harness's SLURM dispatch will rely on.

No harness code: tiny functions through real sbatch/srun/sacct/scancel (scripts/slurm-local.sh). Jobs go through
submitit.AutoExecutor(cluster="slurm"), the API the dispatch is expected to use. Durations are recorded in the
session summary ("SLURM timings"), never asserted on.
"""

from __future__ import annotations

import datetime
import importlib.util
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import cloudpickle
import pytest
import submitit
from submitit.core.utils import FailedJobError, UncompletedJobError

from tests.slurm.conftest import release_requeued, scontrol_job

pytestmark = pytest.mark.slurm

# NOTE: the nodes unpickle a submitted function in a fresh interpreter whose sys.path lacks tests/slurm (pytest put
# it on this process's sys.path only; a module found that way fails remotely with ModuleNotFoundError), so this
# module's functions travel by value.
cloudpickle.register_pickle_by_value(sys.modules[__name__])

START_TIMEOUT_S = 60
"""how long a test waits for a submitted job to start running"""


# --- what runs on the nodes --------------------------------------------------------------------------------------

ENV_PREFIXES = ("SLURM_", "SUBMITIT_")
ENV_NAMES = (
    "MASTER_ADDR",
    "MASTER_PORT",
    "RANK",
    "WORLD_SIZE",
    "LOCAL_RANK",
    "LOCAL_WORLD_SIZE",
    "CUDA_VISIBLE_DEVICES",
    "OMP_NUM_THREADS",
    "PYTHONPATH",
    "VIRTUAL_ENV",
    "SLURMD_NODENAME",
)


def task_report(tag: str) -> dict:
    """What one task sees: its ranks, its node, its environment."""
    env = submitit.JobEnvironment()
    return {
        "tag": tag,
        "global_rank": env.global_rank,
        "local_rank": env.local_rank,
        "node_index": env.node,
        "num_tasks": env.num_tasks,
        "num_nodes": env.num_nodes,
        "nodename": os.environ.get("SLURMD_NODENAME"),
        "hostname": socket.gethostname(),
        "pid": os.getpid(),
        "cwd": os.getcwd(),
        "python": sys.executable,
        "harness_file": getattr(importlib.util.find_spec("harness"), "origin", None),
        "env": {k: v for k, v in sorted(os.environ.items()) if k.startswith(ENV_PREFIXES) or k in ENV_NAMES},
    }


def gloo_all_reduce_of_ranks() -> dict:
    """Join a gloo group from submitit's SLURM environment and all_reduce each task's rank."""
    import torch
    import torch.distributed as dist
    from submitit.helpers import TorchDistributedEnvironment

    from harness.worker.teardown import end_process_group

    inherited_master_addr = os.environ.get("MASTER_ADDR")
    try:
        TorchDistributedEnvironment().export(set_cuda_visible_devices=False)
        refused = None
    except RuntimeError as e:  # the submitting process's MASTER_ADDR/RANK/... travelled with sbatch's environment
        refused = str(e)
    dist_env = TorchDistributedEnvironment().export(set_cuda_visible_devices=False, overwrite=True)
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
    try:
        t = torch.tensor([float(dist.get_rank())])
        dist.all_reduce(t)
        return {
            "rank": dist.get_rank(),
            "world_size": dist.get_world_size(),
            "sum": t.item(),
            "local_rank": dist_env.local_rank,
            "local_world_size": dist_env.local_world_size,
            "master_addr": dist_env.master_addr,
            "master_port": dist_env.master_port,
            "nodename": os.environ.get("SLURMD_NODENAME"),
            "inherited_master_addr": inherited_master_addr,
            "plain_export_refused": refused,
        }
    finally:
        end_process_group()


def square(x: int) -> dict:
    return {
        "value": x * x,
        "array_job_id": os.environ.get("SLURM_ARRAY_JOB_ID"),
        "array_task_id": os.environ.get("SLURM_ARRAY_TASK_ID"),
        "job_id": submitit.JobEnvironment().job_id,
    }


def raise_on_rank(rank: int) -> int:
    me = submitit.JobEnvironment().global_rank
    if me == rank:
        raise ValueError(f"boom from rank {me}")
    return me


def sleep_then_return(seconds: float, marker: str) -> str:
    with open(marker, "a") as f:
        f.write(f"started {time.time()}\n")
    time.sleep(seconds)
    return "slept"


def sleep_ignoring_usr2(seconds: float, marker: str) -> str:
    """Like a rank stuck in C code (a blocked collective): submitit's USR2 handler never gets to run."""
    signal.signal(signal.SIGUSR2, signal.SIG_IGN)
    return sleep_then_return(seconds, marker)


class CheckpointableSleep(submitit.helpers.Checkpointable):
    """Checkpointable: on USR2 submitit calls checkpoint() and requeues the job while timeouts remain."""

    def __call__(self, seconds: float, marker: str) -> str:
        return sleep_then_return(seconds, marker)


# --- helpers on the submitting side ------------------------------------------------------------------------------


def executor(folder: Path, cluster, *, max_num_timeout: int = 0, **params) -> submitit.AutoExecutor:
    ex = submitit.AutoExecutor(folder=folder, cluster="slurm", slurm_max_num_timeout=max_num_timeout)
    ex.update_parameters(**{"slurm_partition": cluster.partition, "timeout_min": 5, "cpus_per_task": 1, **params})
    return ex


def wait_for_file(path: Path, *, job, timeout_s: float = START_TIMEOUT_S) -> None:
    deadline = time.monotonic() + timeout_s
    while not path.exists():
        if time.monotonic() > deadline:
            raise AssertionError(f"job {job.job_id} did not start within {timeout_s} s (state {job.state})")
        time.sleep(0.2)


def sacct_rows(job_id: str) -> list[dict[str, str]]:
    """Every accounting row of a job (-D: requeued runs too), straight from sacct."""
    fields = "JobID,State,ExitCode,Elapsed,Start,End,NodeList"
    out = subprocess.run(
        ["sacct", "-D", "-n", "-P", "-j", job_id, "-o", fields], check=True, capture_output=True, text=True
    ).stdout
    return [dict(zip(fields.split(","), line.split("|"))) for line in out.splitlines() if line]


def elapsed_s(row: dict[str, str]) -> int:
    h, m, s = (int(x) for x in row["Elapsed"].split("-")[-1].split(":"))
    return h * 3600 + m * 60 + s


def final_state(job: submitit.Job, *, timeout_s: float = 60) -> str:
    """The job's state once Slurm has finished it. job.state right after results() can still say RUNNING: the result
    files exist before the tasks have exited and sacct caught up."""
    deadline = time.monotonic() + timeout_s
    while True:
        state = job.watcher.get_state(job.job_id, mode="force")
        if state not in ("PENDING", "RUNNING", "COMPLETING", "REQUEUED", "UNKNOWN") or time.monotonic() > deadline:
            return state
        time.sleep(0.5)


def ended(job: submitit.Job) -> submitit.Job:
    """The job, for reading the outcome of a run that SLURM has already ended (sacct says so): no waiting for a
    result file. submitit waits up to 15 s for one (SlurmJob._results_timeout_s, meant for a shared file system
    that shows new files late); this folder is local, so a job that ended without one (cancelled, killed at its
    limit) never gets one, and the wait would only add 15 s. submitit's own tests set it to 0 the same way."""
    job._results_timeout_s = 0
    return job


def wait_done(jobs: dict[str, submitit.Job], t0: float, *, requeued: dict[str, float]) -> dict[str, float]:
    """Seconds from t0 until submitit's done() says so: a result file, or sacct's end state (force_check: sacct at
    once, not through submitit's polling backoff, which sees an end without a result file up to half the time
    since the last submission late). A job that submitit requeues is released from SLURM's requeue hold
    (release_requeued: 121 s, not what is tested here); `requeued` gets the time of each release."""
    done_at: dict[str, float] = {}
    while len(done_at) < len(jobs):
        for name, job in jobs.items():
            if name in done_at:
                continue
            if job.done(force_check=True):
                done_at[name] = time.perf_counter() - t0
            elif name not in requeued and release_requeued(job.job_id, scontrol_job(job.job_id)):
                requeued[name] = time.perf_counter() - t0
        time.sleep(0.5)
    return done_at


def submitit_parameters(cluster, *, nodes: int) -> dict:
    """A cluster profile's `slurm:` block as AutoExecutor parameters: the translation the dispatch owns
    (harness.launch.slurm.jobs.executor_parameters), for a cell of `nodes` full nodes and the default time limit."""
    from harness.launch.slurm.jobs import executor_parameters, job_minutes
    from harness.scenario.spec import Settings

    return executor_parameters(
        cluster,
        nodes=nodes,
        tasks_per_node=cluster.gpus_per_node,
        timeout_min=job_minutes(Settings().time_limit_s, cluster.slurm),
    )


# --- tests -------------------------------------------------------------------------------------------------------


@pytest.mark.timeout(180)
def test_two_tasks_on_one_node_each_return_a_result(slurm_cluster, slurm_folder):
    ex = executor(slurm_folder, slurm_cluster, nodes=1, tasks_per_node=2)
    job = ex.submit(task_report, "a")
    reports = job.results()
    print("\nrank-0 environment on the node:", reports[0])

    assert [r["global_rank"] for r in reports] == [0, 1]
    assert [r["local_rank"] for r in reports] == [0, 1]
    assert {r["num_tasks"] for r in reports} == {2}
    assert len({r["pid"] for r in reports}) == 2
    assert len({r["nodename"] for r in reports}) == 1
    assert reports[0]["nodename"] in slurm_cluster.nodes
    # both "nodes" are this machine: the node name comes from SLURMD_NODENAME, never from the hostname
    assert {r["hostname"] for r in reports} == {socket.gethostname()}
    env = reports[0]["env"]
    assert env["SLURM_JOB_ID"] == job.job_id
    assert env["SLURM_NTASKS"] == "2"
    assert env["SUBMITIT_EXECUTOR"] == "slurm"
    assert env["SLURM_CONF"] == str(slurm_cluster.slurm_conf)
    # the task runs this process's interpreter (sys.executable) in its working directory: the harness imports there
    assert reports[0]["python"] == sys.executable
    assert reports[0]["cwd"] == os.getcwd()
    assert reports[0]["harness_file"] is not None
    with pytest.raises(AssertionError, match="results"):
        job.result()  # a multi-task job has no single result
    assert final_state(job) == "COMPLETED"


@pytest.mark.timeout(180)
def test_two_nodes_two_tasks_each_form_a_gloo_group(slurm_cluster, slurm_folder, monkeypatch):
    # sbatch copies the submitting environment into the job: a stale MASTER_ADDR here reaches every task
    monkeypatch.setenv("MASTER_ADDR", "stale-from-submitter")
    ex = executor(slurm_folder, slurm_cluster, nodes=2, tasks_per_node=2)
    job = ex.submit(gloo_all_reduce_of_ranks)
    results = job.results()

    assert [r["rank"] for r in results] == [0, 1, 2, 3]
    assert {r["world_size"] for r in results} == {4}
    assert [r["sum"] for r in results] == [6.0] * 4
    assert [r["nodename"] for r in results] == ["node1", "node1", "node2", "node2"]  # block distribution
    assert [r["local_rank"] for r in results] == [0, 1, 0, 1]
    assert {r["local_world_size"] for r in results} == {2}
    assert {r["master_addr"] for r in results} == {"node1"}  # a node name: it must resolve (/etc/hosts)
    assert len({r["master_port"] for r in results}) == 1
    assert {r["inherited_master_addr"] for r in results} == {"stale-from-submitter"}
    assert all("MASTER_ADDR is already set" in r["plain_export_refused"] for r in results)
    assert final_state(job) == "COMPLETED"


@pytest.mark.timeout(180)
def test_batch_submits_one_job_array(slurm_cluster, slurm_folder):
    ex = executor(slurm_folder, slurm_cluster)
    with ex.batch():
        jobs = [ex.submit(square, x) for x in (1, 2, 3)]
    results = [j.result() for j in jobs]

    assert [r["value"] for r in results] == [1, 4, 9]
    array_id = results[0]["array_job_id"]
    assert [j.job_id for j in jobs] == [f"{array_id}_{i}" for i in range(3)]
    assert [r["array_task_id"] for r in results] == ["0", "1", "2"]
    assert [r["job_id"] for r in results] == [f"{array_id}_{i}" for i in range(3)]
    assert [final_state(j) for j in jobs] == ["COMPLETED"] * 3


@pytest.mark.timeout(180)
def test_a_raising_function_fails_with_the_remote_traceback(slurm_cluster, slurm_folder):
    ex = executor(slurm_folder, slurm_cluster)
    single = ex.submit(raise_on_rank, 0)
    ex.update_parameters(tasks_per_node=2)
    pair = ex.submit(raise_on_rank, 1)  # only rank 1 raises

    error = single.exception()
    assert isinstance(error, FailedJobError)
    assert "ValueError: boom from rank 0" in str(error)
    assert "in raise_on_rank" in str(error)  # the remote frame, not just the message
    with pytest.raises(FailedJobError, match="boom from rank 0"):
        single.results()
    assert final_state(single) == "FAILED"

    with pytest.raises(FailedJobError, match=r"(?s)task=1.*boom from rank 1"):
        pair.results()
    assert pair.task(0).result() == 0  # the healthy rank's result is still there
    assert isinstance(pair.task(1).exception(), FailedJobError)
    assert final_state(pair) == "FAILED"


@pytest.mark.timeout(180)
def test_cancel_reaches_cancelled_and_results_raise(slurm_cluster, slurm_folder, slurm_timings):
    ex = executor(slurm_folder, slurm_cluster)
    marker = slurm_folder / "started"
    job = ex.submit(sleep_then_return, 300, str(marker))
    wait_for_file(marker, job=job)

    t0 = time.perf_counter()
    job.cancel()
    slurm_timings["cancel: scancel returned"] = time.perf_counter() - t0
    while not job.watcher.get_state(job.job_id, mode="force").startswith("CANCELLED"):
        time.sleep(0.2)
    slurm_timings["cancel: sacct says CANCELLED"] = time.perf_counter() - t0
    with pytest.raises(UncompletedJobError, match="has not produced any output") as raised:
        ended(job).results()
    slurm_timings["cancel: results() raised"] = time.perf_counter() - t0

    assert "CANCELLED" in str(raised.value)
    assert final_state(job).startswith("CANCELLED")  # sacct says "CANCELLED by 0" (the uid)
    # submitit ignores SIGTERM in the job, so the task only goes at SIGKILL, KillWait (5 s) later. Its line may
    # reach the log after sacct says CANCELLED (the task is still alive then; CI saw only srun's lines once): the
    # log is read until it has the line or the task has surely been killed (KillWait plus a margin for a loaded host)
    deadline = time.monotonic() + 30.0
    while "Bypassing signal SIGTERM" not in (job.stderr() or "") and time.monotonic() < deadline:
        time.sleep(0.5)
    assert "Bypassing signal SIGTERM" in (job.stderr() or "")


@pytest.mark.timeout(420)
def test_time_limit_behaviours(slurm_cluster, slurm_folder, slurm_timings):
    """One minute limits, 200 s of sleep, four ways, run side by side (one task slot each). The requeued job is
    released from SLURM's 121 s requeue hold at once (wait_done), so its second run follows its first."""
    once = executor(
        slurm_folder / "no-requeue", slurm_cluster, max_num_timeout=0, timeout_min=1, slurm_signal_delay_s=15
    )
    twice = executor(
        slurm_folder / "one-requeue", slurm_cluster, max_num_timeout=1, timeout_min=1, slurm_signal_delay_s=15
    )
    markers = {name: slurm_folder / f"{name}.runs" for name in ("plain", "deaf", "ckpt0", "ckpt1")}
    t0 = time.perf_counter()
    jobs = {
        # USR2 (15 s + up to 30 s of Slurm's check period before the limit): submitit's handler raises in the
        # function, a result file records the error, the task exits 1
        "plain": once.submit(sleep_then_return, 200, str(markers["plain"])),
        # the handler never runs: Slurm's own limit, then SIGTERM (ignored by submitit), SIGKILL KillWait later
        "deaf": once.submit(sleep_ignoring_usr2, 200, str(markers["deaf"])),
        # checkpointable but max_num_timeout=0: checkpoint() is called, then no requeue
        "ckpt0": once.submit(CheckpointableSleep(), 200, str(markers["ckpt0"])),
        # checkpointable with one timeout allowed: requeued once, fails at the second USR2
        "ckpt1": twice.submit(CheckpointableSleep(), 200, str(markers["ckpt1"])),
    }
    released_at: dict[str, float] = {}
    done_at = wait_done(jobs, t0, requeued=released_at)
    errors = {name: ended(job).exception() for name, job in jobs.items()}
    # NOTE: done() is true as soon as a result file exists; job.state is then whatever sacct said at the last poll
    # (ckpt1 read PENDING: its last poll fell in the requeue hold)
    states = {name: final_state(job) for name, job in jobs.items()}
    rows = {name: [r for r in sacct_rows(job.job_id) if r["JobID"] == job.job_id] for name, job in jobs.items()}
    for name in jobs:
        slurm_timings[f"time limit {name}: submit -> done() ({states[name]})"] = done_at[name]
        slurm_timings[f"time limit {name}: slurm elapsed of the last run"] = elapsed_s(rows[name][-1])

    # NOTE: SLURM checks limits about every 30 s; usually USR2 arrives first and submitit's handler ends the job
    # FAILED ("timed-out too many times"), but under load the limit can pass before the signal lands and the
    # job ends TIMEOUT with no result (seen once in a full run). Either way: stopped at its limit, not ok.
    def stopped_at_limit(name: str) -> bool:
        if states[name] == "FAILED":
            return "timed-out too many times" in str(errors[name])
        return states[name] == "TIMEOUT" and isinstance(errors[name], UncompletedJobError)

    assert stopped_at_limit("plain"), (states["plain"], errors["plain"])
    if states["plain"] == "FAILED":
        assert isinstance(errors["plain"], FailedJobError)
        assert "UncompletedJobError: Job not requeued because: timed-out too many times." in str(errors["plain"])
    assert markers["plain"].read_text().count("started") == 1

    assert states["deaf"] == "TIMEOUT"
    assert isinstance(errors["deaf"], UncompletedJobError)  # no result file: killed, not raised
    assert "has not produced any output (state: TIMEOUT)" in str(errors["deaf"])
    assert elapsed_s(rows["deaf"][-1]) >= 60

    assert stopped_at_limit("ckpt0"), (states["ckpt0"], errors["ckpt0"])
    assert markers["ckpt0"].read_text().count("started") == 1

    assert stopped_at_limit("ckpt1"), (states["ckpt1"], errors["ckpt1"])
    if states["ckpt1"] == "TIMEOUT":  # the first USR2 raced the limit: no requeue happened
        return
    assert markers["ckpt1"].read_text().count("started") == 2  # ran, was requeued, ran again
    assert [r["State"] for r in rows["ckpt1"]] == ["REQUEUED", "FAILED"]
    assert set(released_at) == {"ckpt1"}  # submitit requeued it (the test only lifted the hold), and no other
    requeued, last = rows["ckpt1"]
    slurm_timings["time limit ckpt1: requeue -> restart"] = (
        datetime.datetime.fromisoformat(last["Start"]) - datetime.datetime.fromisoformat(requeued["End"])
    ).total_seconds()


@pytest.mark.timeout(180)
def test_local_slurm_profile_parameters_are_accepted(slurm_cluster, slurm_folder):
    from harness.scenario.cluster import load_cluster

    cluster = load_cluster("local-slurm")
    params = submitit_parameters(cluster, nodes=2)
    ex = submitit.AutoExecutor(folder=slurm_folder, cluster="slurm", slurm_max_num_timeout=0)
    ex.update_parameters(**params)
    job = ex.submit(task_report, "profile")
    reports = job.results()

    assert cluster.executor == "slurm" and cluster.slurm.partition == slurm_cluster.partition
    assert len(reports) == 2 * cluster.gpus_per_node
    assert sorted({r["nodename"] for r in reports}) == list(slurm_cluster.nodes)
    assert {r["env"]["SLURM_JOB_PARTITION"] for r in reports} == {"debug"}
    script = Path(job.paths.submission_file).read_text()
    assert f"#SBATCH --time={params['timeout_min']}\n" in script  # a default cell's 900 s: 15 min
    assert params["timeout_min"] == 15
    assert f"#SBATCH --signal=USR2@{cluster.slurm.signal_delay_s}" in script
    assert "--gpus-per-node" not in script
    assert final_state(job) == "COMPLETED"
