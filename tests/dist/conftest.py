"""One warm zygote for every local cell of tests/dist (harness.launch.local.prefork, what a local sweep uses).

Each rank of a cell that `run_cell` starts is then forked from an interpreter that has torch and DeepSpeed
imported already, instead of importing them itself (seconds per rank, per cell). The ranks are still new processes
with their own gloo group that run exactly `harness.worker.runner.run`; tests/dist/test_prefork.py shows that they
measure and fail as cold ones do, and keeps the cold path covered (its `cold` runs set HARNESS_NO_PREFORK). A
module's own `prefork.zygote(...)` uses this one (an outer zygote is reused, as for a sweep inside a test).

Package scope: the zygote stops after the last test of tests/dist, so no later test (faults, SLURM jobs, whose
sbatch would copy HARNESS_PREFORK) ever sees it.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Iterator
from pathlib import Path

import pytest

from harness.launch.local import prefork
from harness.core.families import FAMILIES
from harness.scenario.cluster import load_cluster


@pytest.fixture(scope="package", autouse=True)
def warm_ranks() -> Iterator[None]:
    env = dict(load_cluster("local").env)
    if importlib.util.find_spec("transformers") is not None:
        # NOTE: tests/dist/test_transformers_impl.py's ranks build transformers classes: imported once, here
        env[prefork.PRELOAD_ENV] = ",".join(FAMILIES["transformers"].preload)
    with prefork.zygote(env, label="tests/dist"):
        yield


def spawn_ranks(fn, *, nprocs: int, out: Path) -> list[dict]:
    """Run `fn(rank, port, out)` in `nprocs` spawned processes (each joins a gloo group on a free port and writes
    its findings to `{out}.rank{rank}.json`); returns every rank's findings, rank order."""
    import json
    import socket

    import torch.multiprocessing as mp

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    mp.spawn(fn, args=(port, str(out)), nprocs=nprocs)
    return [json.loads((out.parent / f"{out.name}.rank{r}.json").read_text()) for r in range(nprocs)]
