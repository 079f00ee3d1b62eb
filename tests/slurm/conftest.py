"""The real SLURM cluster on localhost (scripts/slurm-local.sh), for tests marked `slurm`.

`slurm_cluster` brings a cluster up once per session and takes it down at the end. Each run has its own: a fresh
state dir (/tmp/hs-XXXXXXXX, short for the unix sockets in it), four free TCP ports for slurmctld, slurmdbd and
the two slurmds, and its own first job id (submitit and the harness derive a job's rendezvous port from its id),
so two clones' `make test` on one machine never share, or stop, each other's cluster; the state dir is removed
after `down`. With HARNESS_SLURM_DIR set, the run uses that cluster instead (on HARNESS_SLURM_PORT_BASE, default
16817), and takes it down only if it was not already up. It skips (not fails) only when the machine cannot have
a cluster: not root, no apt-get, or the package install failed (the script's exit code 3). Any other failure to
come up is a test error.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import socket
import subprocess
import tempfile
import textwrap
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "slurm-local.sh"
PREREQUISITES_MISSING = 3
"""slurm-local.sh's exit code for: not root / no apt-get / install failed"""
UP_TIMEOUT_S = 600
"""a first `up` installs packages (about 15 s from the apt cache, longer from the network)"""
DEFAULT_PORT_BASE = 16817
"""slurm-local.sh's HARNESS_SLURM_PORT_BASE when none is given (a cluster someone keeps up, `make slurm-up`)"""
PORTS_PER_CLUSTER = 4
"""slurm-local.sh listens on PORT_BASE + 0..3: slurmctld, slurmdbd, node1's and node2's slurmd"""
PORT_BASES = range(10_000, 20_000, PORTS_PER_CLUSTER)
"""where a run's ports are drawn: below the rendezvous ports (20000-60000, submitit's and the harness's) and the
kernel's ephemeral range (32768-60999 by default), so no job or client connection takes one first"""

# name -> seconds, printed at the end of the session (tests never assert on wall-clock speed)
TIMINGS_S: dict[str, float] = {}


@dataclass(frozen=True)
class SlurmCluster:
    """What tests need to know about the running localhost cluster."""

    partition: str
    nodes: tuple[str, ...]
    state_dir: Path
    slurm_conf: Path
    started_here: bool
    """True when this session brought it up (and so takes it down)"""
    up_s: float
    """seconds `slurm-local.sh up` took in this session (0.0 when it was already up)"""
    env: dict[str, str]
    """HARNESS_SLURM_* for scripts/slurm-local.sh: the variables that name this cluster"""


@dataclass(frozen=True)
class ClusterConfig:
    """Where one run's cluster lives: what slurm-local.sh derives everything from."""

    state_dir: Path
    port_base: int
    """slurmctld's port; slurmdbd +1, node1 +2, node2 +3"""
    first_job_id: int
    """the cluster's first job id (FirstJobId), on a fresh state dir"""
    owned: bool
    """True when the state dir was made for this run (removed after `down`); False for a given HARNESS_SLURM_DIR"""

    @property
    def ports(self) -> tuple[int, ...]:
        return tuple(range(self.port_base, self.port_base + PORTS_PER_CLUSTER))

    def env(self) -> dict[str, str]:
        return {
            "HARNESS_SLURM_DIR": str(self.state_dir),
            "HARNESS_SLURM_PORT_BASE": str(self.port_base),
            "HARNESS_SLURM_FIRST_JOB_ID": str(self.first_job_id),
        }


def _port_free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("", port))  # NOTE: no SO_REUSEADDR: a port in TIME_WAIT or bound on 127.0.0.1 counts as taken
        except OSError:
            return False
    return True


def free_port_base(rng: random.Random | None = None) -> int:
    """A random PORT_BASE whose four ports are free now: two runs starting together draw the same one with
    probability 1/2500, and the bind check catches a cluster already listening."""
    rng = rng or random.SystemRandom()
    default = range(DEFAULT_PORT_BASE - PORTS_PER_CLUSTER + 1, DEFAULT_PORT_BASE + PORTS_PER_CLUSTER)
    for _ in range(200):
        base = rng.choice(PORT_BASES)
        if base not in default and all(_port_free(base + i) for i in range(PORTS_PER_CLUSTER)):
            return base
    raise RuntimeError(f"no {PORTS_PER_CLUSTER} consecutive free TCP ports found in {PORT_BASES}")


def cluster_config(environ: Mapping[str, str] | None = None) -> ClusterConfig:
    """This run's cluster: HARNESS_SLURM_DIR's (and HARNESS_SLURM_PORT_BASE's) when set, else a new state dir
    under /tmp with free ports and a first job id of its own (port base x 1000: 4000 ids apart at least)."""
    environ = os.environ if environ is None else environ
    if environ.get("HARNESS_SLURM_DIR"):
        base = int(environ.get("HARNESS_SLURM_PORT_BASE") or DEFAULT_PORT_BASE)
        first = int(environ.get("HARNESS_SLURM_FIRST_JOB_ID") or 1)
        return ClusterConfig(Path(environ["HARNESS_SLURM_DIR"]), base, first, owned=False)
    # NOTE: short on purpose: unix socket paths (munged's, MariaDB's, slurmstepd's under spool/) hold 107 bytes
    state_dir = Path(tempfile.mkdtemp(prefix="hs-", dir="/tmp"))
    state_dir.chmod(0o755)  # mkdtemp makes it 0700; the munge and mysql users must reach their folders in it
    base = free_port_base()
    return ClusterConfig(state_dir, base, base * 1000, owned=True)


def run_script(*args: str, timeout_s: float, env: Mapping[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """scripts/slurm-local.sh ARGS for the cluster that `env` (HARNESS_SLURM_*) names."""
    full = {**os.environ, **(env or {})}
    return subprocess.run([str(SCRIPT), *args], capture_output=True, text=True, timeout=timeout_s, env=full)


@pytest.fixture(scope="session")
def slurm_cluster():
    if os.geteuid() != 0:
        pytest.skip("SLURM on localhost needs root (packages, /etc/hosts, daemons); run as root or skip -m 'not slurm'")
    if shutil.which("slurmctld") is None and shutil.which("apt-get") is None:
        pytest.skip("SLURM is not installed and apt-get is not available to install it")
    config = cluster_config()
    env = config.env()
    state_dir = config.state_dir

    def _script(*args: str, timeout_s: float) -> subprocess.CompletedProcess[str]:
        return run_script(*args, timeout_s=timeout_s, env=env)

    already_up = _script("status", timeout_s=60).returncode == 0
    t0 = time.perf_counter()
    up = _script("up", timeout_s=UP_TIMEOUT_S)
    up_s = time.perf_counter() - t0
    if up.returncode == PREREQUISITES_MISSING:
        if config.owned:
            shutil.rmtree(state_dir, ignore_errors=True)
        pytest.skip(f"no SLURM cluster on this machine: {up.stderr.strip() or up.stdout.strip()}")
    if up.returncode != 0:
        if not already_up:  # NOTE: stop what came up before the failure; the state dir stays for its logs
            _script("down", timeout_s=120)
        pytest.fail(
            f"scripts/slurm-local.sh up failed (exit {up.returncode}; state {state_dir}):\n{up.stdout}\n{up.stderr}",
            pytrace=False,
        )
    if not already_up:
        TIMINGS_S["slurm-local.sh up"] = up_s
    slurm_conf = state_dir / "etc" / "slurm.conf"
    # NOTE: submitit runs sbatch/sacct/scancel from this process: they must find this cluster's config even when
    # /etc/slurm/slurm.conf belongs to someone else (then the script leaves it alone)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("SLURM_CONF", str(slurm_conf))
        for k, v in env.items():  # a script or `harness` run by a test reaches this cluster too
            mp.setenv(k, v)
        yield SlurmCluster(
            partition="debug",
            nodes=("node1", "node2"),
            state_dir=state_dir,
            slurm_conf=slurm_conf,
            started_here=not already_up,
            up_s=0.0 if already_up else up_s,
            env=env,
        )
    if not already_up:
        # NOTE: `down` with this run's env stops only the processes tagged with this run's state dir
        t0 = time.perf_counter()
        down = _script("down", timeout_s=120)
        TIMINGS_S["slurm-local.sh down"] = time.perf_counter() - t0
        if down.returncode != 0:
            raise RuntimeError(
                f"scripts/slurm-local.sh down failed (exit {down.returncode}; state {state_dir} kept):\n"
                f"{down.stdout}\n{down.stderr}"
            )
        if config.owned:
            shutil.rmtree(state_dir, ignore_errors=True)


@pytest.fixture
def slurm_folder(slurm_cluster, tmp_path) -> Path:
    """A fresh submitit folder: job ids restart at 1 when the cluster state is wiped, and submitit would return an
    old job's result from a reused folder."""
    folder = tmp_path / "submitit"
    folder.mkdir()
    return folder


@pytest.fixture(scope="session")
def slurm_timings() -> dict[str, float]:
    """Where a test records a measured duration (s) for the session's summary."""
    return TIMINGS_S


@pytest.fixture(autouse=True)
def _time_each_test(request):
    t0 = time.perf_counter()
    yield
    if request.node.get_closest_marker("slurm"):  # the cluster's tests; the pure ones take no time
        TIMINGS_S[request.node.name] = time.perf_counter() - t0


def pytest_terminal_summary(terminalreporter):
    if TIMINGS_S:
        terminalreporter.section("SLURM timings (s)")
        for name, seconds in TIMINGS_S.items():
            terminalreporter.write_line(f"{name:<58} {seconds:7.1f}")


# ---- helpers shared by the SLURM test modules -----------------------------------------------------------


def write(path: Path, text: str) -> Path:
    path.write_text(textwrap.dedent(text))
    return path


def manifest_cells(results: Path, sweep: str) -> dict[str, dict]:
    path = results / sweep / "manifest.json"
    return json.loads(path.read_text())["cells"] if path.exists() else {}


def sacct_states(job_id: str) -> list[str]:
    """The job's state per run (-D: a requeued job has one row per run), straight from sacct."""
    out = subprocess.run(
        ["sacct", "-D", "-n", "-X", "-P", "-j", job_id, "-o", "JobID,State"], check=True, capture_output=True, text=True
    ).stdout
    return [line.split("|")[1] for line in out.splitlines() if line.split("|")[0] == job_id]


def scontrol_job(job_id: str) -> dict[str, str]:
    """`scontrol show job -o` as a dict (JobId, JobState, Restarts, RunTime, ...); {} once SLURM has forgotten it.
    An array task's JobId is its own raw id (`<A>_<i>` asks for it; its tasks see SLURM_JOB_ID=<raw id>)."""
    out = subprocess.run(["scontrol", "show", "job", "-o", job_id], capture_output=True, text=True).stdout
    return dict(field.split("=", 1) for field in out.split() if "=" in field)


def release_requeued(job_id: str, info: dict[str, str]) -> bool:
    """Start a requeued job now instead of after its hold; True when it was held and is released.

    SLURM keeps a requeued job PENDING for cred_expire + 1 = 121 s (its EligibleTime) so that the old run's
    credential cannot start a task; `scontrol update StartTime=now` lifts that, as an operator could. The run that
    follows is a whole new run of the job, exactly as it would be two minutes later."""
    if info.get("JobState") != "PENDING" or info.get("Restarts", "0") == "0":
        return False
    subprocess.run(["scontrol", "update", f"JobId={job_id}", "StartTime=now"], check=True)
    return True


USR2_BIT = 1 << (signal.SIGUSR2 - 1)
"""SIGUSR2's bit in /proc/<pid>/status's SigCgt (the caught-signals mask)"""


def usr2_handler_installed(job_id: str) -> bool:
    """Task 0 of the job's current run catches SIGUSR2: submitit installed its preemption/timeout handler, which it
    does after unpickling the submitted function and just before calling it. Before that, a USR2 kills the task
    (the signal's default action) instead of being taken as a preemption.

    Found in /proc (root: every process's environment is readable): the python process running submitit's
    `_submit` whose environment has this job's SLURM_JOB_ID and SLURM_PROCID=0. srun also catches USR2 (to
    forward it), hence the command line check."""
    raw_id = scontrol_job(job_id).get("JobId")
    if not raw_id:
        return False
    want = {f"SLURM_JOB_ID={raw_id}".encode(), b"SLURM_PROCID=0"}
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            if b"submitit.core._submit" not in (proc / "cmdline").read_bytes():
                continue
            if not want <= set((proc / "environ").read_bytes().split(b"\0")):
                continue
            status = (proc / "status").read_text()
        except OSError:  # gone meanwhile
            continue
        caught = next(line.split()[1] for line in status.splitlines() if line.startswith("SigCgt:"))
        if int(caught, 16) & USR2_BIT:
            return True
    return False


def wait_for(predicate, *, timeout_s: float, what: str):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if value := predicate():
            return value
        time.sleep(0.3)
    raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")
