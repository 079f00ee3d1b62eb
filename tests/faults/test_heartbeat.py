"""A rank that stops without an exception is named, on a real gloo group through the real sweep path: rank 1 of a
2-rank DDP cell is frozen (SIGSTOP) inside its measured steps, as a rank is lost on NCCL: no rank raises (rank 0
blocks in its collective, the 300 s watchdog far away), so no fragment is written. Its heartbeat stops
(harness.worker.heartbeat); the launcher's watch ends the cell STALE_S later instead of at the time limit, and the
record names rank 1. Before issue 32 this cell ran to its 240 s time limit and was recorded as a `timeout` with no
rank."""

from __future__ import annotations

import json
import os
import signal
import textwrap
import threading
import time

import pytest

from harness.cli import main
from tests.conftest import load_docs

pytestmark = pytest.mark.dist

CLUSTER = """\
name: local-long-watchdog
description: local CPU with a 300 s collective watchdog, so a blocked rank raises nothing within the test
executor: local
device: cpu
gpus_per_node: 2
pg_timeout_s: 300
env: {OMP_NUM_THREADS: "1"}
"""
SCENARIO = """\
name: frozen
matrix: {model: [tiny], strategy: [ddp], precision: [fp32], gpus: [2]}
settings: {warmup_steps: 2, measure_steps: 20000, time_limit_s: 240}
"""


def test_a_rank_frozen_inside_a_collective_is_named_from_its_heartbeat(tmp_path):
    (tmp_path / "cluster.yaml").write_text(CLUSTER)
    (tmp_path / "s.yaml").write_text(textwrap.dedent(SCENARIO))
    results = tmp_path / "results"
    frozen: list[int] = []

    def freeze_rank_1_in_its_measured_steps():
        deadline = time.time() + 120
        while not frozen and time.time() < deadline:
            for path in results.glob("frozen/.fragments/*/beat1.json"):
                beat = json.loads(path.read_text())
                if beat["phase"] == "timed":  # in the measured steps: every step is DDP all-reduces
                    os.kill(beat["pid"], signal.SIGSTOP)
                    frozen.append(beat["pid"])
            time.sleep(0.2)

    # NOTE: the sweep in the main thread (it handles signals); the freezer beside it
    freezer = threading.Thread(target=freeze_rank_1_in_its_measured_steps, daemon=True)
    freezer.start()
    try:
        code = main(["sweep", str(tmp_path / "s.yaml"), "--cluster", str(tmp_path / "cluster.yaml"), "--results",
                     str(results)])  # fmt: skip
    finally:
        freezer.join(timeout=5)
        for pid in frozen:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
    assert frozen, "rank 1 never beat in phase 'timed'"
    (rec,), warnings = load_docs(results)
    assert code == 1 and not warnings
    assert (rec["status"], rec["failed_rank"]) == ("crashed", 1), rec["reason"]
    assert rec["reason"].startswith("rank 1 stopped without an exception in phase 'timed'")
    assert rec["reason"].endswith("(heartbeats: died, killed or frozen)")
    assert "failures" not in rec  # no rank raised: the beats alone named it
