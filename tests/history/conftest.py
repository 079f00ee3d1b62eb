"""Fixtures for the results history: records of synthetic nights, and a real PostgreSQL server on localhost.

`postgres_server` starts PostgreSQL once per session the way tests/slurm starts SLURM: the distribution's own
server binaries (Debian: /usr/lib/postgresql/<version>/bin), a cluster made by initdb in a fresh temporary
directory, a free TCP port on 127.0.0.1, torn down (pg_ctl stop, directory removed) at the end. PostgreSQL
refuses to run as root: as root the server runs as the `postgres` system user (or `nobody`) through runuser.
It skips, with the reason, only where no server can be had: no binaries, or no psycopg to talk to one.
Each test gets its own database (`pg_url`), dropped afterwards.
"""

from __future__ import annotations

import copy
import datetime as dt
import glob
import hashlib
import json
import os
import pwd
import shutil
import subprocess
import tempfile
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from harness.core.ports import free_port
from harness.results.store import write_record

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = json.loads((REPO / "docs" / "record-example.json").read_text())
NIGHT0 = dt.datetime(2026, 1, 1, 2, 0, tzinfo=dt.timezone.utc)


def make_record(
    *,
    strategy: str = "ddp",
    precision: str = "fp32",
    night: int = 0,
    step_s: float = 0.02,
    status: str = "ok",
    cluster: str = "local",
    device_name: str = "cpu",
    comm_bytes: float | None = None,
    peak_gib: float = 1.0,
    sha: str | None = None,
    inject: dict[str, Any] | None = None,
    attempt: str | None = None,
) -> dict[str, Any]:
    """A record of the example's shape: one cell (strategy × precision of the tiny model on 2 GPUs) measured on
    `night` (days after NIGHT0) with median step time `step_s`; throughput, TFLOPS and MFU follow from it."""
    rec = copy.deepcopy(EXAMPLE)
    spec = rec["spec"]
    spec.update(strategy=strategy, precision=precision, inject=inject)
    spec.pop("world_size", None)
    spec["gpus"] = 2
    rec["run_id"] = (
        f"tiny-{strategy}-{precision}-g2-{hashlib.sha256(f'{strategy} {precision}'.encode()).hexdigest()[:10]}"
    )
    rec["cluster"] = cluster
    rec["status"] = status
    rec["attempt"] = attempt or uuid.uuid4().hex[:12]
    finished = NIGHT0 + dt.timedelta(days=night)
    rec["started_at"] = (finished - dt.timedelta(minutes=1)).isoformat(timespec="seconds")
    rec["finished_at"] = finished.isoformat(timespec="seconds")
    rec["env"]["device_name"] = device_name
    rec["env"]["harness_git_sha"] = sha or f"sha{night:04d}"
    if status != "ok":  # a record the launcher composed: no measurements, hardly any env
        rec["env"] = {"harness_git_sha": rec["env"]["harness_git_sha"], "slurm_job_id": None}
        rec["metrics"] = {}
        rec["reason"] = f"injected {status}"
        rec.pop("comm", None)
        return rec
    m = rec["metrics"]
    tokens = m["tokens_per_step"]
    m["step_time_s"] = {"median": step_s, "p10": step_s, "p90": step_s, "mean": step_s, "samples": [step_s] * 5}
    m["tokens_per_s"] = tokens / step_s
    m["tokens_per_s_per_gpu"] = tokens / step_s / 2
    m["tflops_per_gpu"] = m["flops_per_step"] / step_s / 2 / 1e12
    m["peak_memory_allocated_gib"] = peak_gib
    if comm_bytes is not None:
        rec["comm"]["bytes_per_step"] = comm_bytes
    return rec


def write_night(results: Path, records: list[dict[str, Any]]) -> Path:
    """Write records as one sweep's results dir (`results/<sweep>/<run_id>.json`)."""
    for rec in records:
        write_record(results, rec)
    return results


# --------------------------------------------------------------------------------------------------
# PostgreSQL on localhost


@dataclass(frozen=True)
class PostgresServer:
    url: str
    """postgresql://harness@127.0.0.1:PORT/postgres (trust authentication: localhost only)"""
    port: int
    data_dir: Path
    version: str


def _pg_bindir() -> Path | None:
    for d in sorted(glob.glob("/usr/lib/postgresql/*/bin"), key=lambda p: int(Path(p).parent.name), reverse=True):
        if (Path(d) / "initdb").exists() and (Path(d) / "pg_ctl").exists():
            return Path(d)
    which = shutil.which("initdb")
    return Path(which).parent if which else None


def _server_user() -> str | None:
    """The user to run the server as when this process is root (PostgreSQL refuses root); None otherwise."""
    if os.geteuid() != 0:
        return None
    for name in ("postgres", "nobody"):
        try:
            pwd.getpwnam(name)
            return name
        except KeyError:
            continue
    return None


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[PostgresServer]:
    bindir = _pg_bindir()
    if bindir is None:
        pytest.skip("no PostgreSQL server binaries (initdb, pg_ctl): apt-get install postgresql")
    try:
        import psycopg  # noqa: F401
    except ImportError:
        pytest.skip("psycopg is not installed: pip install -e '.[test]' (or '.[history-pg]')")
    user = _server_user()
    if os.geteuid() == 0 and user is None:
        pytest.skip("running as root and there is no postgres/nobody user to run the server as")
    run_as = ["runuser", "-u", user, "--"] if user else []
    base = Path(tempfile.mkdtemp(prefix="harness-pg-"))
    data = base / "data"
    if user:
        pw = pwd.getpwnam(user)
        os.chown(base, pw.pw_uid, pw.pw_gid)
    port = free_port()
    started = False
    try:
        init = subprocess.run(
            [*run_as, str(bindir / "initdb"), "-D", str(data), "-U", "harness", "--auth=trust", "-E", "UTF8"]
            + ["--locale=C", "--no-sync"],
            capture_output=True,
            text=True,
            timeout=180,
        )
        if init.returncode != 0:
            pytest.fail(f"initdb failed (exit {init.returncode}):\n{init.stdout}\n{init.stderr}", pytrace=False)
        options = f"-p {port} -k {base} -c listen_addresses=127.0.0.1 -c fsync=off -c max_connections=50"
        start = subprocess.run(
            [*run_as, str(bindir / "pg_ctl"), "-D", str(data), "-l", str(base / "server.log"), "-w", "-t", "60"]
            + ["-o", options, "start"],
            capture_output=True,
            text=True,
            timeout=90,
        )
        log = (base / "server.log").read_text() if (base / "server.log").exists() else ""
        if start.returncode != 0:
            pytest.fail(f"pg_ctl start failed (exit {start.returncode}):\n{start.stderr}\n{log}", pytrace=False)
        started = True
        yield PostgresServer(
            url=f"postgresql://harness@127.0.0.1:{port}/postgres", port=port, data_dir=data, version=bindir.parent.name
        )
    finally:
        if started:
            subprocess.run(
                [*run_as, str(bindir / "pg_ctl"), "-D", str(data), "-m", "fast", "-w", "-t", "60", "stop"],
                capture_output=True,
                timeout=90,
            )
        shutil.rmtree(base, ignore_errors=True)


@pytest.fixture
def pg_url(postgres_server: PostgresServer) -> Iterator[str]:
    """A fresh, empty database on the session's server, dropped after the test."""
    import psycopg

    name = f"h_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(postgres_server.url, autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {name}")
    yield postgres_server.url.rsplit("/", 1)[0] + f"/{name}"
    with psycopg.connect(postgres_server.url, autocommit=True) as conn:
        conn.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


@pytest.fixture(params=["sqlite", "postgresql"])
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """The same test on both back ends: a SQLite file, and a database on the real PostgreSQL server."""
    if request.param == "sqlite":
        return str(tmp_path / "history.db")
    return str(request.getfixturevalue("pg_url"))
