"""The manifest's state machine (harness.launch.core.manifest.TRANSITIONS): every (from, to) pair of a run's states,
walked through the writers' operations on a real manifest file. A legal move is written; an illegal one raises,
naming both states, and leaves the file as it was.

The table below is written out by hand, from what the writers do (not from TRANSITIONS), so that a change to the
machine fails here until the table is changed too:
- from any state a sweep may find a run in (re-runs): done (its ok record is there, or it ended ok), skipped,
  running (launched locally; --force re-runs a done run), submitted (on SLURM), failed (it failed, or sbatch
  refused its job, with no launch state before);
- submitted ↔ running, and each to itself: SLURM's polls (requeues, a packed cell waiting for its turn);
- cancelled only from submitted or running: a stop ends a launch under way;
- nothing back to pending: only Manifest.open writes it, for a run without an entry;
- a run without a state (none: its entry was lost with an unreadable file) may become anything but pending.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from pathlib import Path

import pytest

from harness.launch.core.manifest import (
    STATES,
    TRANSITIONS,
    CellEntry,
    Manifest,
    RunEntry,
    SweepHeader,
    SweepManifest,
)
from harness.results.record import Record
from harness.results.store import atomic_write_json, new_record
from tests.conftest import make_spec

TABLE = """
from \\ to   pending  submitted  running  done  failed  skipped  cancelled
pending        -         +         +       +      +       +         -
submitted      -         +         +       +      +       +         +
running        -         +         +       +      +       +         +
done           -         +         +       +      +       +         -
failed         -         +         +       +      +       +         -
skipped        -         +         +       +      +       +         -
cancelled      -         +         +       +      +       +         -
none           -         +         +       +      +       +         +
"""


def legal_moves() -> dict[str | None, set[str]]:
    header, *rows = TABLE.strip().splitlines()
    columns = header.split()[3:]
    assert columns == list(STATES)
    table: dict[str | None, set[str]] = {}
    for row in rows:
        name, *marks = row.split()
        assert len(marks) == len(columns) and set(marks) <= {"+", "-"}, row
        table[None if name == "none" else name] = {to for to, mark in zip(columns, marks) if mark == "+"}
    return table


LEGAL = legal_moves()
FROM = [*STATES, None]


def record(status: str) -> Record:
    return new_record(
        spec=make_spec(strategy="ddp"), run_id="a", sweep="s", cluster="local", status=status, reason="why"
    )


# the operation that writes each state (pending has none: `polled` is the only one taking a state as given)
WRITE: dict[str, Callable[[Manifest], None]] = {
    "pending": lambda m: m.polled("a", slurm_state="PENDING", nodes="", state="pending"),
    "submitted": lambda m: m.submitted("a", attempt="x2", job_id="7_0"),
    "running": lambda m: m.running("a", attempt="x2"),
    "done": lambda m: m.ended("a", record("ok")),
    "failed": lambda m: m.ended("a", record("oom")),
    "skipped": lambda m: m.skipped("a"),
    "cancelled": lambda m: m.ended("a", record("cancelled")),
}


def manifest_with(results: Path, state: str | None, *, repeat: int) -> Manifest:
    """A manifest whose cell `a` has its run `repeat` in `state` (None: an entry without a state), as an earlier
    sweep left it; the handle of a sweep that opened it again."""
    run = RunEntry(state=state, updated_at="2026-01-01T00:00:00Z", attempt="x1", job_id="1")
    cell = CellEntry(repeats={2: run}) if repeat == 2 else CellEntry(**run.as_dict())
    data = SweepManifest(header=SweepHeader(sweep="s", scenario="s.yaml", cluster="local"), cells={"a": cell})
    atomic_write_json(results / "s" / "manifest.json", data.as_dict())
    m = Manifest.open(results, "s", scenario="s.yaml", cluster="local", run_ids=["a"], repeats=(1, repeat))
    assert m.for_repeat(repeat).data.cells["a"].state == state  # opening again leaves every state as it was
    return m.for_repeat(repeat)


def test_the_hand_table_is_the_machine():
    assert set(LEGAL) == set(TRANSITIONS) == set(FROM)
    assert {before: set(TRANSITIONS[before]) for before in FROM} == LEGAL


@pytest.mark.parametrize("repeat", [1, 2])
@pytest.mark.parametrize(("before", "after"), list(itertools.product(FROM, STATES)))
def test_every_move_is_written_or_refused(tmp_path, before, after, repeat):
    m = manifest_with(tmp_path, before, repeat=repeat)
    on_file = m.path.read_bytes()
    if after in LEGAL[before]:
        WRITE[after](m)
        run = m.data.cells["a"]
        assert run.state == after
        assert run.updated_at != "2026-01-01T00:00:00Z"
    else:
        with pytest.raises(RuntimeError, match=f"cannot go from {before or 'no state'} to {after} "):
            WRITE[after](m)
        assert m.path.read_bytes() == on_file


def test_what_each_operation_writes_besides_the_state(tmp_path):
    """The fields each move carries: a launch clears the last status; its end sets the record's."""
    m = manifest_with(tmp_path, "failed", repeat=1)
    m.running("a", attempt="x2")
    m.job("a", job_id="41")
    cell = m.data.cells["a"]
    assert (cell.state, cell.status, cell.attempt, cell.job_id) == ("running", None, "x2", "41")
    m.ended("a", record("timeout"))
    cell = m.data.cells["a"]
    assert (cell.state, cell.status, cell.attempt) == ("failed", "timeout", "x2")
    m.submitted("a", attempt="x3", job_id="8_1")
    cell = m.data.cells["a"]
    assert (cell.state, cell.status, cell.attempt, cell.job_id, cell.slurm_state, cell.nodes) == (
        "submitted",
        None,
        "x3",
        "8_1",
        "PENDING",
        "",
    )
    # a poll of a job that ended changes SLURM's fields, not the state: that comes with the record
    m.polled("a", slurm_state="COMPLETED", nodes="node1", state=None)
    cell = m.data.cells["a"]
    assert (cell.state, cell.slurm_state, cell.nodes) == ("submitted", "COMPLETED", "node1")
    m.ended("a", record("ok"), attempt="x3")
    cell = m.data.cells["a"]
    assert (cell.state, cell.status, cell.attempt) == ("done", "ok", "x3")
    m.skipped("a")
    assert (m.data.cells["a"].state, m.data.cells["a"].status) == ("skipped", "skipped")
