"""How a job's end in SLURM becomes a cell state and a record status (harness.launch.slurm.jobs: verdict,
pack_verdict, flight_state); pure functions of sacct's states, the ranks' fragments and the tasks' errors, so no
cluster is needed."""

from __future__ import annotations

import pytest

from harness.launch.slurm.jobs import pack_verdict, verdict
from harness.launch.slurm.sacct import flight_state
from harness.results.record import Fragment


def frag(rank: int, status: str, reason: str) -> dict:
    return {"rank": rank, "status": status, "reason": reason, "time": float(rank)}


SUBMITIT_TIMEOUT = "UncompletedJobError: Job not requeued because: timed-out too many times."


@pytest.mark.parametrize(
    "state,frags,errors,stuck,expected",
    [
        ("COMPLETED", [], {}, False, None),
        ("FAILED", [frag(1, "error", "RuntimeError: boom")], {}, False, None),  # the fragments decide
        ("TIMEOUT", [], {}, False, "timeout"),
        (
            "FAILED",
            [frag(0, "timeout", SUBMITIT_TIMEOUT), frag(1, "error", "Connection closed by peer")],
            {},
            False,
            "timeout",
        ),
        ("FAILED", [], {0: f"Traceback ...\nsubmitit.core.utils.{SUBMITIT_TIMEOUT}"}, False, "timeout"),
        ("TIMEOUT", [frag(1, "error", "RuntimeError: boom")], {}, False, None),  # the error came first
        ("CANCELLED by 0", [], {}, False, "cancelled"),
        ("CANCELLED by 0", [frag(0, "timeout", "collective timed out")], {}, True, None),  # cancelled as stuck
        ("NODE_FAIL", [], {}, False, "crashed"),
        ("OUT_OF_MEMORY", [], {}, False, "oom"),
        ("UNKNOWN", [], {}, False, "crashed"),
    ],
)
def test_how_a_jobs_end_becomes_a_status(state, frags, errors, stuck, expected):
    frags = [Fragment.model_validate(f) for f in frags]
    v = verdict(state, frags=frags, errors=errors, minutes=1, job_id="7_1", stopped_stuck=stuck)
    assert (v and v[0]) == expected
    if v:
        assert "7_1" in v[1]


def test_slurm_states_as_cell_states():
    assert [
        flight_state(s)
        for s in (
            "PENDING",
            "REQUEUED",
            "RUNNING",
            "COMPLETING",
            "COMPLETED",
            "CANCELLED by 0",
            "TIMEOUT",
            "PREEMPTED",
            None,
        )
    ] == ["submitted", "submitted", "running", "running", "ended", "ended", "ended", "submitted", "submitted"]


@pytest.mark.parametrize(
    "state,started,frags,errors,expected,words",
    [
        ("CANCELLED by 0", True, [], {}, "cancelled", "while this cell ran"),
        ("CANCELLED by 0", False, [], {}, "cancelled", "before this cell ran"),
        ("TIMEOUT", True, [frag(1, "error", "Connection closed by peer")], {}, "timeout", "reached its time limit"),
        (
            "FAILED",
            False,
            [],
            {0: f"Traceback ...\nsubmitit.core.utils.{SUBMITIT_TIMEOUT}"},
            "timeout",
            "before this cell ran",
        ),
        ("TIMEOUT", True, [frag(1, "error", "RuntimeError: boom")], {}, None, ""),  # the cell's error came first
        ("NODE_FAIL", False, [], {}, "crashed", "a node failed before this cell ran"),
        ("OUT_OF_MEMORY", False, [], {}, "error", "ended (OUT_OF_MEMORY) before this cell ran"),  # it never ran: no oom
        ("COMPLETED", True, [], {}, "error", "without the cell's record"),
    ],
)
def test_how_a_packs_end_becomes_the_status_of_a_cell_without_a_record(state, started, frags, errors, expected, words):
    frags = [Fragment.model_validate(f) for f in frags]
    v = pack_verdict(state, started=started, frags=frags, errors=errors, minutes=6, job_id="7", position=2, of=3)
    assert (v and v[0]) == expected
    if v:
        assert "job 7" in v[1] and words in v[1] and "(cell 2 of 3)" in v[1], v[1]
