"""Ranks forked from a warm zygote (harness.launch.local.prefork, what local CPU sweeps use) measure what cold-started
ranks measure, fail the same ways, and never outlive their cell. Real zygote, real forks, real gloo groups.

(The fault suite, tests/faults, runs its sweeps through the CLI, so every injected fault there is already
recorded through forked ranks; the rest of tests/dist forks its ranks from the package's zygote
(tests/dist/conftest.py). Cold ranks stay covered by this module's cold runs and by every SLURM task.)
"""

from __future__ import annotations

import os
import time

import psutil
import pytest

from harness.launch.local import prefork
from tests.conftest import make_spec, run_cell

pytestmark = pytest.mark.dist


@pytest.fixture(scope="module")
def zygote():
    from harness.scenario.cluster import load_cluster

    with prefork.zygote(load_cluster("local").env, label="test_prefork") as where:
        pid = int(where.split(":")[1])
        yield psutil.Process(pid)


def _children_gone(proc: psutil.Process, within_s: float = 10.0) -> bool:
    deadline = time.time() + within_s
    while time.time() < deadline:
        if not proc.children():
            return True
        time.sleep(0.05)
    return False


@pytest.mark.parametrize("strategy", ["ddp", "zero3"])
def test_forked_ranks_measure_what_cold_ranks_measure(strategy, zygote, results, monkeypatch):
    spec = make_spec(strategy=strategy, warmup_steps=2, measure_steps=2)
    warm = run_cell(spec, results / "warm")
    monkeypatch.setenv(prefork.OFF_ENV, "1")
    cold = run_cell(spec, results / "cold")
    assert (warm["status"], cold["status"]) == ("ok", "ok"), (warm.get("reason"), cold.get("reason"))
    assert (warm["env"]["prefork"], cold["env"]["prefork"]) == (True, False)
    # a forked rank keeps its freed memory as a cold one does: mallopt runs in the rank, not via MALLOC_* variables
    # that only a fresh process would read (harness.worker.allocator)
    assert (
        warm["env"]["cpu_allocator"].startswith("caching (glibc ")
        and cold["env"]["cpu_allocator"] == warm["env"]["cpu_allocator"]
    )
    assert warm["metrics"]["losses"] == cold["metrics"]["losses"]  # bit for bit: same process state, same math

    def counts(rec: dict) -> dict:
        return {k: (v["calls"], v["bytes"], v["dtype"]) for k, v in rec["comm"]["by_collective"].items()}

    assert counts(warm) == counts(cold) and warm["comm"]["bytes_per_step"] > 0
    assert warm["spec"] == cold["spec"] and warm["run_id"] == cold["run_id"]
    assert _children_gone(zygote)


@pytest.mark.parametrize("fault, status", [("crash", "crashed"), ("exception", "error")])
def test_forked_rank_failures_are_classified_as_before(fault, status, zygote, results):
    spec = make_spec(strategy="ddp", warmup_steps=2, measure_steps=2, inject={"fault": fault, "rank": 1, "step": 2})
    rec = run_cell(spec, results)
    assert rec["status"] == status and rec["failed_rank"] == 1, rec.get("reason")
    assert _children_gone(zygote)


def test_a_killed_cell_takes_its_forked_ranks_with_it(zygote, results):
    """A hung cell past its time limit: the launcher kills the rank stubs; the ranks, children of the zygote,
    go too (the stubs' process group, and each rank's lifeline pipe), and the zygote reaps them."""
    spec = make_spec(
        strategy="ddp", warmup_steps=2, measure_steps=2, time_limit_s=20, inject={"fault": "hang", "rank": 0, "step": 2}
    )
    rec = run_cell(spec, results)
    assert rec["status"] == "timeout", rec.get("reason")
    assert _children_gone(zygote)
    assert zygote.is_running()  # and it still serves the next cell
    ok = run_cell(make_spec(strategy="ddp", warmup_steps=2, measure_steps=2), results / "next")
    assert ok["status"] == "ok" and ok["env"]["prefork"] is True


def test_stopping_the_zygote_ends_its_running_ranks(results, monkeypatch):
    """The end of a sweep (normal or interrupted) stops the zygote, which kills and reaps what still runs."""
    import json
    import subprocess
    import sys

    from harness.launch.core.payload import make_payload
    from harness.scenario.cluster import load_cluster

    spec = make_spec(strategy="ddp", warmup_steps=2, measure_steps=2, inject={"fault": "hang", "rank": 0, "step": 1})
    payload = make_payload(spec, sweep="t", cluster=load_cluster("local"), results=results, sha=None, predicted=None)
    monkeypatch.delenv(prefork.SOCKET_ENV, raising=False)  # a zygote of its own, not the module's
    with prefork.zygote(load_cluster("local").env) as where:
        zpid = int(where.split(":")[1])
        path = results / "payload.json"
        results.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(payload.to_dict()))
        env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(payload.master_port), WORLD_SIZE="2")
        stubs = [
            subprocess.Popen(
                [sys.executable, "-m", "harness.launch.entry", str(path)],
                env=dict(env, RANK=str(r)),
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            for r in range(2)
        ]
        z = psutil.Process(zpid)
        deadline = time.time() + 120
        while len(z.children()) < 2 and time.time() < deadline:
            time.sleep(0.1)
        ranks = z.children()
        assert len(ranks) == 2
    # the context has stopped the zygote: its ranks are gone, and so their stubs end
    assert not any(r.is_running() and r.status() != psutil.STATUS_ZOMBIE for r in ranks)
    for s in stubs:
        assert s.wait(timeout=30) != 0
