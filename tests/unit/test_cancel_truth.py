"""One truth on cancel (issue 31): rank 0 and a cancelling launcher race to claim how an attempt of a cell ends
(harness.results.store.claim_end); the winner's word is the record, and the sweep files the manifest and the
console line from that record. The real Ctrl-C windows run in tests/faults/test_faults.py
(test_ctrl_c_early_in_a_cell_gives_one_truth); here the side of the race a short tiny cell rarely reaches there:
rank 0 claimed first, and the launcher waits for its record instead of calling the cell cancelled."""

from __future__ import annotations

import threading
import time

from harness.launch.core.outcome import cancel_cell
from harness.launch.core.payload import make_payload
from harness.results.store import END_CLAIM, claim_end, fragment_dir, new_record, write_record
from harness.scenario.cluster import load_cluster
from tests.conftest import make_spec


def _payload(tmp_path):
    spec = make_spec(strategy="ddp")
    return make_payload(spec, sweep="t", cluster=load_cluster("local"), results=tmp_path, sha=None, predicted=None)


def test_the_first_claim_wins_and_older_attempts_are_cleared(tmp_path):
    assert claim_end(tmp_path, "t", "cell", attempt="a1") is True
    assert claim_end(tmp_path, "t", "cell", attempt="a1") is False  # the other side of the race
    assert claim_end(tmp_path, "t", "cell", attempt="a2") is True  # a new attempt decides afresh
    assert sorted(p.name for p in fragment_dir(tmp_path, "t", "cell").iterdir()) == [f"{END_CLAIM}a2"]


def test_a_cancel_that_loses_the_race_keeps_rank_0s_ok_record(tmp_path):
    payload = _payload(tmp_path)
    assert claim_end(payload.results, payload.sweep, payload.run_id, attempt=payload.attempt)  # rank 0 got there first
    ok = new_record(
        spec=payload.spec,
        run_id=payload.run_id,
        sweep=payload.sweep,
        cluster="local",
        status="ok",
        attempt=payload.attempt,
    )
    writer = threading.Timer(0.3, lambda: write_record(payload.results, ok))  # ... and writes its record a bit later
    killed: list[float] = []
    writer.start()
    rec = cancel_cell(payload, kill=lambda: killed.append(time.monotonic()), elapsed_s=1.0, time_limit_s=60.0)
    writer.join()
    assert (rec.status, rec.attempt) == ("ok", payload.attempt) and len(killed) == 1


def test_a_cancel_that_wins_the_race_records_cancelled_and_rank_0_writes_nothing(tmp_path):
    payload = _payload(tmp_path)
    rec = cancel_cell(payload, kill=lambda: None, elapsed_s=1.0, time_limit_s=60.0)
    assert rec.status == "cancelled" and rec.reason == "the job was cancelled before the cell finished"
    # rank 0, finishing after the launcher decided, loses the claim (harness.worker.runner then writes no record)
    assert claim_end(payload.results, payload.sweep, payload.run_id, attempt=payload.attempt) is False
