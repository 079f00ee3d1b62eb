"""Each test run has a localhost SLURM cluster of its own: state dir, daemon ports, job ids (issue 15).

Before, every run used /tmp/harness-slurm and ports 16817-16820: a run found another clone's cluster up, used it,
and that clone's teardown took it down under it. The configuration tests are pure (no root, no cluster); the last
one starts a second real cluster beside this run's, as a concurrent run would, and takes it down again.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
from pathlib import Path

import pytest

from tests.slurm.conftest import PORTS_PER_CLUSTER, cluster_config, run_script

UNIX_PATH_MAX = 108
"""sizeof(sockaddr_un.sun_path) on Linux, the terminating NUL included"""


@pytest.fixture
def two_configs(monkeypatch):
    """Two runs' configurations, as two clones' `make test` would derive them (no HARNESS_SLURM_DIR given)."""
    monkeypatch.delenv("HARNESS_SLURM_DIR", raising=False)
    monkeypatch.delenv("HARNESS_SLURM_PORT_BASE", raising=False)
    a, b = cluster_config(), cluster_config()
    yield a, b
    for c in (a, b):
        shutil.rmtree(c.state_dir, ignore_errors=True)


def test_two_runs_get_distinct_state_dirs_ports_and_job_ids(two_configs):
    a, b = two_configs
    assert a.owned and b.owned
    assert a.state_dir != b.state_dir and a.state_dir.is_dir() and b.state_dir.is_dir()
    assert Path("/tmp/harness-slurm") not in (a.state_dir, b.state_dir)
    assert len(a.ports) == len(b.ports) == PORTS_PER_CLUSTER
    assert not set(a.ports) & set(b.ports)
    # submitit and the harness derive a job's rendezvous port from its job id: the two clusters' ids differ
    assert a.first_job_id != b.first_job_id
    assert a.env()["HARNESS_SLURM_DIR"] == str(a.state_dir)
    assert a.env()["HARNESS_SLURM_PORT_BASE"] == str(a.ports[0])
    assert a.env()["HARNESS_SLURM_FIRST_JOB_ID"] == str(a.first_job_id)


def test_a_runs_ports_are_free_and_its_sockets_fit_a_unix_path(two_configs):
    for c in two_configs:
        for port in c.ports:
            with socket.socket() as s:
                s.bind(("", port))  # raises when taken
        # munged's and MariaDB's sockets, and slurmstepd's under the node spool (<host>_<job>.<step>)
        longest = c.state_dir / "spool" / "node2" / f"{socket.gethostname()}_{c.first_job_id + 99_999}.4294967294"
        for path in (c.state_dir / "munge" / "munge.socket", c.state_dir / "mysql" / "mysqld.sock", longest):
            assert len(str(path)) < UNIX_PATH_MAX, path
        # the munge and mysql users traverse it to their own folders
        assert c.state_dir.stat().st_mode & 0o005 == 0o005


def test_a_given_state_dir_is_used_as_is_and_never_removed(monkeypatch, tmp_path):
    """HARNESS_SLURM_DIR names a cluster someone keeps (e.g. `make slurm-up`): the run uses it, on its ports."""
    monkeypatch.setenv("HARNESS_SLURM_DIR", str(tmp_path / "kept"))
    monkeypatch.setenv("HARNESS_SLURM_PORT_BASE", "17001")
    c = cluster_config()
    assert (c.state_dir, c.ports[0], c.owned) == (tmp_path / "kept", 17001, False)


def _pid(path: Path) -> int:
    return int(path.read_text().strip())


@pytest.mark.slurm
def test_a_second_cluster_comes_and_goes_beside_this_runs(slurm_cluster, two_configs):
    """Another run's cluster (b) starts on its own ports beside this run's, runs a job, and its `down` leaves this
    run's daemons running and its cluster answering."""
    b = two_configs[1]
    mine = {p: _pid(p) for p in (slurm_cluster.state_dir / "run").glob("*.pid")}
    assert len(mine) == 4  # slurmctld, slurmdbd, slurmd x2
    env_b = {**os.environ, **b.env(), "SLURM_CONF": str(b.state_dir / "etc" / "slurm.conf")}
    try:
        up = run_script("up", env=b.env(), timeout_s=300)
        assert up.returncode == 0, up.stdout + up.stderr
        job = subprocess.run(
            ["sbatch", "--parsable", "--wait", "-o", "/dev/null", "--wrap", "true"],
            env=env_b,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert job.returncode == 0, job.stderr
        assert int(job.stdout.strip().split(";")[0]) == b.first_job_id
    finally:
        down = run_script("down", env=b.env(), timeout_s=120)
    assert down.returncode == 0, down.stdout + down.stderr
    assert run_script("status", env=b.env(), timeout_s=60).returncode == 3
    for path, pid in mine.items():
        assert _pid(path) == pid and Path(f"/proc/{pid}").exists(), path.name
    assert run_script("status", env=slurm_cluster.env, timeout_s=60).returncode == 0
    sinfo = subprocess.run(["sinfo", "-h", "-N", "-o", "%N %t"], capture_output=True, text=True, timeout=30)
    assert sinfo.returncode == 0 and "node1" in sinfo.stdout, sinfo.stderr
