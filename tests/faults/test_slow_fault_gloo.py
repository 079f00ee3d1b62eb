"""The `slow` fault on every rank of real 2-rank gloo groups: it no longer compounds. Before the fix the extra work
was (factor − 1) × the step's own time, which includes the wait for the other rank's extra work, so skew between
the ranks was multiplied by factor − 1 every step and factor 8 on both ranks ran into the 120 s watchdog.

No stopwatch assertions: the cell ends ok, its median step time lies in a band [factor / 2, 2 · factor] × the
unslowed cell's (wide enough for a loaded 2-core machine), and the fault's own accounting is exact."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from harness.history.keys import cell_key
from harness.results.spec import spec_from_json
from harness.worker.faults import FaultInjector
from harness.worker.teardown import end_process_group
from tests.conftest import make_spec, run_cell

pytestmark = pytest.mark.dist

FACTOR = 4.0
STEPS = 8
"""steps of the accounting test's own loop"""
STEPS_TIMED = 12
"""timed steps of each real cell"""


def test_factor_4_on_every_rank_ends_ok_at_about_4x_the_unslowed_step_time(tmp_path):
    # NOTE: 12 timed steps a cell: with 5, two load spikes among an unslowed cell's steps (another job on this
    # 2-core machine) moved its median enough to take the ratio to 1.7 once. And the unslowed cell runs before and
    # after the slowed one, judged by the faster of the two: the noise here is mostly between runs, and one unslowed
    # run measured while the other pytest run of `make test` loaded the host took the ratio to 1.82 (2026-12-03)
    plain = run_cell(make_spec(strategy="ddp", measure_steps=STEPS_TIMED), tmp_path / "plain")
    slowed = run_cell(
        make_spec(strategy="ddp", measure_steps=STEPS_TIMED, inject={"fault": "slow", "factor": FACTOR}),
        tmp_path / "slow",
    )
    again = run_cell(make_spec(strategy="ddp", measure_steps=STEPS_TIMED), tmp_path / "again")
    assert plain["status"] == "ok", plain.get("reason")
    assert again["status"] == "ok", again.get("reason")
    assert slowed["status"] == "ok", slowed.get("reason")
    assert slowed["spec"]["inject"] == {"fault": "slow", "factor": FACTOR}
    # judged against the unslowed cell's history
    assert cell_key(spec_from_json(slowed["spec"])) == cell_key(spec_from_json(plain["spec"]))
    assert slowed["run_id"] != plain["run_id"]  # …though it is its own run
    unslowed = min(r["metrics"]["step_time_s"]["median"] for r in (plain, again))
    ratio = slowed["metrics"]["step_time_s"]["median"] / unslowed
    print(f"slowed / unslowed median step time: {ratio:.2f} (factor {FACTOR})")
    assert FACTOR / 2 <= ratio <= 2 * FACTOR


def _rank(rank: int, init: str, out: str) -> None:
    os.environ["OMP_NUM_THREADS"] = "1"
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=2)
    try:
        torch.manual_seed(0)
        model = torch.nn.parallel.DistributedDataParallel(
            torch.nn.Sequential(*(torch.nn.Linear(128, 128) for _ in range(4)))
        )
        opt = torch.optim.SGD(model.parameters(), lr=1e-3)
        x = torch.randn(64, 128)
        inj = FaultInjector({"fault": "slow", "factor": FACTOR}, rank=rank, device=torch.device("cpu"))
        for step in range(1, STEPS + 1):
            inj.before_step(step, model)
            opt.zero_grad()
            model(x).square().mean().backward()
            opt.step()
            inj.after_step(step)
        dist.barrier()
        rows = [vars(s) for s in inj.slowdowns]
        Path(out, f"rank{rank}.json").write_text(json.dumps(rows))
    finally:
        end_process_group()


def test_the_accounting_on_every_rank_of_a_real_gloo_group(tmp_path):
    mp.spawn(_rank, args=(f"file://{tmp_path / 'rendezvous'}", str(tmp_path)), nprocs=2, join=True)
    for rank in (0, 1):
        rows = json.loads((tmp_path / f"rank{rank}.json").read_text())
        assert [r["step"] for r in rows] == list(range(1, STEPS + 1))
        for i, r in enumerate(rows):
            assert r["reference_s"] == min(x["step_s"] for x in rows[: i + 1])  # the shortest own time so far
            assert r["target_s"] == (FACTOR - 1) * r["reference_s"]
            assert r["extra_s"] >= r["target_s"]
