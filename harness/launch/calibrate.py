"""`harness calibrate`'s orchestration: the processes that measure a cluster's rates, and the merged file.

One `compute` process (harness.worker.calibrate) measures the device and the one-rank collectives and framework
overheads; then, for each group size, that many `collectives` processes (one per rank, rendezvous on localhost)
measure the collectives of a group spanning ranks of this host — the local profile's simulated nodes share it, so
its hybrids' cross-"node" groups use these curves too. Every process gets the profile's `env` (locally
OMP_NUM_THREADS=1), as the ranks of a sweep do. The merged calibration is written atomically, with the environment
fingerprint and the date, to `harness.plan.calibration.write_path(cluster)`.

SLURM profiles would run the same processes as jobs on one and two nodes; not implemented yet: the command says so.
"""

from __future__ import annotations

import datetime
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from harness.core.errors import InputError, Problem
from harness.plan.calibration import write_path
from harness.scenario.cluster import Cluster

WORLDS = (2, 4)
"""group sizes whose collectives are measured besides the one-rank group"""


def _env(cluster: Cluster) -> dict[str, str]:
    env = dict(os.environ)
    for k, v in cluster.env.items():
        env.setdefault(k, v)
    env.setdefault("PYTHONUNBUFFERED", "1")
    return env


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _run(cmd: list[str], env: dict[str, str], what: str) -> None:
    rc = subprocess.run(cmd, env=env).returncode
    if rc != 0:
        raise RuntimeError(f"calibration {what} failed (exit {rc}); its output is above")


def _collectives(cluster: Cluster, world: int, out: Path, *, quick: bool, env: dict[str, str]) -> None:
    port = str(_free_port())
    procs = []
    for rank in range(world):
        e = dict(env, MASTER_ADDR="127.0.0.1", MASTER_PORT=port, RANK=str(rank), WORLD_SIZE=str(world))
        e["LOCAL_RANK"] = str(rank)
        cmd = [sys.executable, "-m", "harness.worker.calibrate", "collectives", "--cluster", cluster.path]
        cmd += ["--out", str(out), "--link", "intra"] + (["--quick"] if quick else [])
        procs.append(subprocess.Popen(cmd, env=e, stdout=None if rank == 0 else subprocess.DEVNULL))
    codes = [p.wait() for p in procs]
    if any(codes):
        raise RuntimeError(f"calibration of collectives on {world} ranks failed (exit codes {codes})")


def check_calibratable(cluster: Cluster) -> None:
    """InputError (exit 2) for profiles this command cannot calibrate here."""
    if cluster.executor != "local":
        raise InputError(
            [
                Problem(
                    cluster.path,
                    "executor",
                    "calibrating a SLURM profile (jobs on one and two nodes) is not implemented yet; run `harness "
                    "calibrate` with a local profile on a compute node of the cluster, or use the profile's "
                    "`performance:` figures",
                )
            ]
        )


def calibrate(
    cluster: Cluster, *, quick: bool = False, out: Path | None = None, worlds: tuple[int, ...] = WORLDS
) -> Path:
    """Measure `cluster`'s rates on this machine and write its calibration file; returns the path."""
    check_calibratable(cluster)
    env = _env(cluster)
    target = out or write_path(cluster)
    started = datetime.datetime.now(datetime.timezone.utc)
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="harness-calibrate-") as tmp:
        compute = Path(tmp) / "compute.json"
        print(f"calibrate: cluster {cluster.name}: device, one-rank collectives and framework overheads", flush=True)
        cmd = [sys.executable, "-m", "harness.worker.calibrate", "compute", "--cluster", cluster.path]
        _run(cmd + ["--out", str(compute)] + (["--quick"] if quick else []), env, "of the device")
        data = json.loads(compute.read_text())
        for world in worlds:
            print(f"calibrate: collectives on {world} ranks", flush=True)
            part = Path(tmp) / f"comm{world}.json"
            _collectives(cluster, world, part, quick=quick, env=env)
            measured = json.loads(part.read_text())
            data["comm"] += measured["comm"]
            data.setdefault("sharing", []).extend(measured.get("sharing", []))
    data["created_at"] = started.isoformat(timespec="seconds")
    data["duration_s"] = round(time.perf_counter() - t0, 1)
    data["quick"] = quick
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(dir=target.parent, suffix=".tmp")
    with os.fdopen(fd, "w") as f:
        json.dump(data, f, indent=1, allow_nan=False)
    os.replace(tmp_name, target)
    return target
