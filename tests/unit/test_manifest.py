"""harness.launch.core.manifest: `manifest.json` has one type (SweepManifest) and one reader; the sweep writes it
through that type (by named operations, whose states test_manifest_states.py walks), `harness status` and the SLURM
backend read it through it, and a file that is not a manifest is one line per problem (exit 2), never a traceback."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from harness.cli import main
from harness.core.errors import InputError
from harness.launch.core.manifest import (
    CellEntry,
    Manifest,
    PackPlace,
    RunEntry,
    SweepHeader,
    SweepManifest,
    manifest_of,
    read_manifest,
)
from harness.results.record import Record
from harness.results.store import new_record
from tests.conftest import make_spec


def opened(results: Path, *, repeats: tuple[int, ...] = (1,), **kw) -> Manifest:
    return Manifest.open(
        results,
        "s",
        scenario="s.yaml",
        cluster="local",
        run_ids=["a", "b"],
        scenario_file="/abs/s.yaml",
        repeats=repeats,
        **kw,
    )


def record(status: str, run_id: str = "a") -> Record:
    return new_record(
        spec=make_spec(strategy="ddp"), run_id=run_id, sweep="s", cluster="local", status=status, reason="why"
    )


def test_what_the_sweep_writes_reads_back_typed(tmp_path):
    m = opened(tmp_path, repeats=(1, 2))
    m.running("a", attempt="x1")
    m.job("a", job_id="17")
    m.ended("a", record("ok"))
    second_run = m.for_repeat(2)
    second_run.running("a", attempt="x2")
    second_run.job("a", job_id="18")
    second_run.ended("a", record("oom"))
    m.submitted("b", attempt=None, job_id="9_1", pack=PackPlace(position=2, of=3))
    data = m.data
    assert data.header == SweepHeader(sweep="s", scenario="s.yaml", cluster="local", scenario_file="/abs/s.yaml")
    assert data.repeat == 2 and list(data.cells) == ["a", "b"]
    a, b = data.cells["a"], data.cells["b"]
    assert (a.state, a.status, a.attempt, a.job_id) == ("done", "ok", "x1", "17")
    assert a.repeats[2].status == "oom" and a.repeats[2].job_id == "18"
    assert [k for k in a.runs()] == [1, 2] and isinstance(a.runs()[1], RunEntry)
    assert (b.state, b.slurm_state, b.nodes, b.pack) == ("submitted", "PENDING", "", PackPlace(position=2, of=3))
    assert b.repeats[2].state == "pending"
    # the view of run 2 addresses the cells' second runs, as a backend that knows nothing of repeats reads them
    second = m.for_repeat(2).data.cells
    assert (second["a"].status, second["b"].state) == ("oom", "pending") and not second["a"].repeats
    # the file: the header, the cells (known fields only), the repeat count
    raw = json.loads(m.path.read_text())
    assert list(raw) == ["sweep", "scenario", "cluster", "executor", "scenario_file", "cells", "repeat"]
    assert raw["cells"]["a"]["repeats"]["2"]["status"] == "oom" and "status" not in raw["cells"]["b"]
    assert manifest_of(raw, where="x") == data  # one form: what is written reads back as the same value


def test_a_later_sweep_keeps_what_the_earlier_wrote(tmp_path):
    first = opened(tmp_path, repeats=(1, 2, 3))
    first.ended("a", record("ok"))
    again = Manifest.open(tmp_path, "s", scenario="s.yaml", cluster="local", run_ids=["a", "c"])
    data = again.data
    assert data.repeat == 3  # a sweep without --repeat does not make the repeats look missing
    assert data.cells["a"].status == "ok" and sorted(data.cells["a"].repeats) == [2, 3]
    assert data.cells["c"].state == "pending"
    assert data.header.scenario_file == "/abs/s.yaml"  # a header field not given again stays


def test_the_slurm_backend_reads_cells_and_header_typed(tmp_path):
    """launch.slurm.jobs re-attaches from `manifest.data.cells[run_id]` and names jobs by `manifest.header.sweep`."""
    m = opened(tmp_path)
    m.submitted("a", attempt="z", job_id="5_0")
    cell = m.data.cells["a"]
    assert (cell.state, cell.attempt, cell.job_id, cell.slurm_state, cell.nodes) == (
        "submitted",
        "z",
        "5_0",
        "PENDING",
        "",
    )
    assert m.data.cells["a"].as_dict() == {
        "state": "submitted",
        "updated_at": cell.updated_at,
        "attempt": "z",
        "job_id": "5_0",
        "slurm_state": "PENDING",
        "nodes": "",
    }
    assert m.header.sweep == "s" and m.header.cluster_file is None


def test_the_writers_operations_refuse_fields_a_run_does_not_have(tmp_path):
    m = opened(tmp_path)
    with pytest.raises(TypeError, match="statsu"):
        m.ended("a", record("ok"), statsu="ok")
    with pytest.raises(InputError, match=r"cells\.a\.state: 'finished' is not one of pending, submitted"):
        m.polled("a", slurm_state="RUNNING", nodes="", state="finished")


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ("not json", "not JSON"),
        ("[]", "list is not a manifest"),
        ('{"scenario": "s", "cluster": "c"}', "sweep: missing"),
        (
            '{"sweep": "s", "scenario": "s", "cluster": "c", "cells": {"a": {"state": "dne"}}}',
            "cells.a.state: 'dne' is not one of pending, submitted, running, done, failed, skipped, cancelled "
            "(did you mean 'done'?)",
        ),
        ('{"sweep": "s", "scenario": "s", "cluster": "c", "repeat": 0}', "repeat: 0 is not a whole number >= 1"),
        (
            '{"sweep": "s", "scenario": "s", "cluster": "c", "cells": {"a": {"pack": {"position": "1"}}}}',
            "cells.a.pack: {'position': '1'} is not {position, of}",
        ),
    ],
)
def test_what_is_not_a_manifest_is_one_line_each(tmp_path, capsys, raw, message):
    path = tmp_path / "s" / "manifest.json"
    path.parent.mkdir()
    path.write_text(raw)
    with pytest.raises(InputError) as e:
        read_manifest(path)
    assert any(message in str(p) for p in e.value.problems), e.value.problems
    assert main(["status", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err
    assert all(line.startswith(f"error: {path}: ") for line in err.strip().splitlines())


def test_status_prints_each_run_from_the_typed_manifest(tmp_path, capsys):
    data = SweepManifest(
        header=SweepHeader(sweep="s", scenario="s.yaml", cluster="local"),
        cells={
            "a": CellEntry(state="done", status="ok", job_id="17", repeats={2: RunEntry(state="failed", status="oom")}),
            "b": CellEntry(state="pending", pack=PackPlace(position=1, of=2)),
        },
        repeat=2,
    )
    (tmp_path / "s").mkdir()
    (tmp_path / "s" / "manifest.json").write_text(json.dumps(data.as_dict()))
    assert main(["status", str(tmp_path)]) == 0
    assert capsys.readouterr().out == (
        "sweep 's' on 'local': 2 cells, 3 runs (--repeat 2; counts below are of runs)\n"
        "  done      ok        a run 1  job 17\n"
        "  failed    oom       a run 2  job -\n"
        "  pending   -         b run 1  job - (pack 1/2)\n"
        "  1 done, 1 failed, 1 pending\n"
    )
