"""harness.worker.teardown: reading gloo's worker threads' states, and a real one-rank gloo group ended by it.

The abort it prevents is a race (6 two-rank runs in 34 on the 2-core host); tests/dist/test_trace.py's overlap test
is where it showed, and that test fails on a rank's abort at exit. Here: the parsing, the bound, and
that after `end_process_group` every gloo worker thread of a real group is asleep and the process exits 0.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

from harness.core.ports import free_port
from harness.worker import teardown


def _task(root: Path, tid: int, comm: str, state: str) -> None:
    d = root / str(tid)
    d.mkdir()
    (d / "comm").write_text(comm + "\n")
    # a name in parentheses may hold spaces and parentheses: the state is the field after the last ')'
    (d / "stat").write_text(f"{tid} ({comm} (x) y) {state} 1 2 3\n")


def test_states_of_the_gloo_workers_only(tmp_path):
    _task(tmp_path, 11, "python", "R")
    _task(tmp_path, 12, teardown.GLOO_WORKER, "S")
    _task(tmp_path, 13, teardown.GLOO_WORKER, "R")
    _task(tmp_path, 14, "gloo_tcp_loop", "R")
    assert sorted(teardown.gloo_worker_states(tmp_path) or []) == ["R", "S"]
    assert teardown.gloo_worker_states(tmp_path / "absent") is None


def test_settle_is_bounded_while_a_worker_stays_runnable(tmp_path, monkeypatch):
    """A worker that never sleeps: settle gives up at max_s (and no sooner than it)."""
    monkeypatch.setattr(teardown, "gloo_worker_states", lambda *a, **k: ["S", "R"])
    slept = teardown.settle(max_s=0.05, step_s=0.005)
    assert slept >= 0.05


def test_settle_returns_after_two_quiet_looks(monkeypatch):
    looks = iter([["R"], ["S"], ["R"], ["S"], ["S"], ["R"]])
    seen: list[list[str]] = []

    def states(*a, **k):
        seen.append(next(looks))
        return seen[-1]

    monkeypatch.setattr(teardown, "gloo_worker_states", states)
    teardown.settle(max_s=10, step_s=0.0)
    assert len(seen) == 5  # the first look (is /proc there), then S R S S: the two quiet looks in a row end it


RANK = textwrap.dedent(
    """
    import json, os, sys, time
    import torch.distributed as dist
    from harness.worker import teardown
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=sys.argv[1])
    dist.init_process_group("gloo", rank=0, world_size=1)
    got = [None]
    dist.all_gather_object(got, {"rank": 0})
    # each worker thread names itself once it runs: on a loaded host the second may not have yet; wait (bounded)
    t0 = time.monotonic()
    while len(before := teardown.gloo_worker_states()) < 2 and time.monotonic() - t0 < 10:
        time.sleep(0.01)
    held = dist.distributed_c10d._get_default_group()  # as DDP holds its group: the backend outlives the destroy
    slept = teardown.end_process_group()
    print(json.dumps({"before": before, "after": teardown.gloo_worker_states(), "slept": slept,
                      "initialized": dist.is_initialized(), "held": held is not None}))
    """
)


def test_a_real_gloo_group_ends_with_its_workers_asleep_and_the_process_exits_0(tmp_path):
    out = subprocess.run(
        [sys.executable, "-c", RANK, str(free_port())], capture_output=True, text=True, timeout=120, cwd=Path.cwd()
    )
    assert out.returncode == 0, out.stderr[-2000:]
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert len(got["before"]) == 2  # ProcessGroupGloo's two worker threads (torch's default)
    assert got["after"] == ["S", "S"] and got["initialized"] is False and got["held"]
    assert 0 < got["slept"] < teardown.SETTLE_MAX_S
