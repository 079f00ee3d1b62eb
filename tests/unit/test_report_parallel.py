"""harness.report with and without its other processes (records read in shares, figures drawn in a pool): the same
files, byte for byte, and the same when a process dies. The fixture sweep is small, so the thresholds that turn the
processes on are lowered here; the CPU count is pinned to 2 so the parallel paths run on any machine."""

from __future__ import annotations

import dataclasses
import os
import re
from pathlib import Path

import pandas as pd
import pytest

from harness.report import build_report, load
from harness.report.figures import memory, registry, schedule
from harness.report.frame import records_frame
from harness.results.store import iter_records
from tests.unit.test_report import CHECKPOINT_FIGURES, FIGURES, PREDICTION_FIGURES
from tests.unit.test_store import _tree

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "records"


def _serial(monkeypatch) -> None:
    monkeypatch.setattr(load, "PARALLEL_LOAD_MIN_FILES", 10**9)
    monkeypatch.setattr(schedule, "PARALLEL_MIN_CELLS", 10**9)


def _parallel(monkeypatch) -> None:
    monkeypatch.setattr(load, "PARALLEL_LOAD_MIN_FILES", 1)
    monkeypatch.setattr(schedule, "PARALLEL_MIN_CELLS", 1)
    monkeypatch.setattr(load, "usable_cpus", lambda: 2)
    monkeypatch.setattr(schedule, "usable_cpus", lambda: 2)


def _files(out: Path) -> dict[str, bytes]:
    """Every file of a report; the generation time (minutes) left out of the pages."""
    files = {p.name: p.read_bytes() for p in sorted(out.iterdir())}
    for name in ("report.md", "index.html"):
        files[name] = re.sub(rb"\d{4}-\d\d-\d\d \d\d:\d\d UTC", b"<time>", files[name])
    return files


@pytest.fixture(scope="module")
def serial_report(tmp_path_factory):
    with pytest.MonkeyPatch.context() as mp:
        _serial(mp)
        out = tmp_path_factory.mktemp("serial")
        return build_report([FIXTURES], out=out), _files(out)


def test_parallel_report_is_the_serial_one_byte_for_byte(serial_report, monkeypatch, tmp_path):
    _parallel(monkeypatch)
    result = build_report([FIXTURES], out=tmp_path)
    serial, serial_files = serial_report
    files = _files(tmp_path)
    assert sorted(files) == sorted(serial_files)
    assert sorted(p for p in files if p.endswith(".png")) == sorted(f"{name}.png" for name in FIGURES)
    for name in ("table.csv", "report.md", "index.html", *(f"{n}.png" for n in FIGURES)):
        assert files[name] == serial_files[name], name
    pd.testing.assert_frame_equal(
        pd.read_parquet(tmp_path / "table.parquet"), pd.read_parquet(serial["out"] / "table.parquet")
    )
    assert [f.name for f in result["figures"]] == [*FIGURES, *PREDICTION_FIGURES, *CHECKPOINT_FIGURES]
    assert [f.note for f in result["figures"]] == [f.note for f in serial["figures"]]
    assert result["warnings"] == serial["warnings"]


def test_a_dying_figure_process_changes_nothing(serial_report, monkeypatch, tmp_path):
    """A worker killed while drawing (out of memory, say) breaks the pool: its figures, and those not collected
    yet, are drawn in this process, with the same bytes."""
    _parallel(monkeypatch)
    parent = os.getpid()
    drawn_here = []

    def dies_in_a_worker(fc):
        if os.getpid() != parent:
            os._exit(1)
        drawn_here.append("memory")
        return memory.memory_figure(fc)

    # NOTE: the pool sends the figure's name; the forked worker draws what the registry held when it forked
    maker = registry.figure_maker("memory")
    assert maker in schedule.share_out(registry.figure_makers(), 2)[0]  # drawn by a worker, not here
    monkeypatch.setitem(registry._MAKERS, "memory", dataclasses.replace(maker, draw=dies_in_a_worker))
    build_report([FIXTURES], out=tmp_path)
    assert drawn_here == ["memory"]  # the worker died; this process drew it
    files, serial_files = _files(tmp_path), serial_report[1]
    for name in ("table.csv", "report.md", "index.html", *(f"{n}.png" for n in FIGURES)):
        assert files[name] == serial_files[name], name


def test_records_read_in_shares_are_the_records_read_in_one(monkeypatch, tmp_path):
    """The store test tree (hidden folders, a manifest, a folder named like a record, a symlinked folder,
    a latin-1 file): the same frame and the same warnings, in the same order, from one process or from two."""
    root = _tree(tmp_path / "results")
    warnings: list[str] = []
    frame, more = records_frame(iter_records(root, warnings=warnings))
    _parallel(monkeypatch)
    df, got, n_unreadable = load.load_records([root])
    pd.testing.assert_frame_equal(df, frame)
    assert got == warnings + more and n_unreadable == len(warnings) == 5
    assert any("dir.json: unreadable: [Errno 21] Is a directory" in w for w in got)


def test_a_dying_load_process_changes_nothing(monkeypatch, tmp_path):
    root = _tree(tmp_path / "results")
    warnings: list[str] = []
    frame, more = records_frame(iter_records(root, warnings=warnings))
    _parallel(monkeypatch)
    parent = os.getpid()
    read = load.read_share

    def dies_in_a_worker(files, repredict=False):
        if os.getpid() != parent:
            os._exit(1)
        return read(files, repredict)

    # NOTE: functions are pickled by name: the forked worker finds this one where read_share was
    dies_in_a_worker.__module__, dies_in_a_worker.__qualname__ = load.__name__, "read_share"
    monkeypatch.setattr(load, "read_share", dies_in_a_worker)
    df, got, _ = load.load_records([root])
    pd.testing.assert_frame_equal(df, frame)
    assert got == warnings + more


# --- the registry and the scheduler -------------------------------------------------------------------------


def test_every_figure_is_registered_once_in_report_order(serial_report):
    makers = registry.figure_makers()
    assert (
        [m.name for m in makers]
        == [f.name for f in serial_report[0]["figures"]]
        == [*FIGURES, *PREDICTION_FIGURES, *CHECKPOINT_FIGURES]
    )
    assert [m.order for m in makers] == sorted(m.order for m in makers)
    assert all(m.cost > 0 for m in makers)
    with pytest.raises(ValueError, match="'memory'"):
        registry.register("memory", order=999, cost=1.0)(lambda fc: None)  # a name taken
    with pytest.raises(ValueError, match="'scaling'"):
        registry.register("another", order=10, cost=1.0)(lambda fc: None)  # a place taken
    assert registry.figure_makers() == makers


def _makers(*costs: float) -> tuple[registry.FigureMaker, ...]:
    return tuple(registry.FigureMaker(f"f{i}", draw=len, order=i, cost=c) for i, c in enumerate(costs))


def test_the_heaviest_go_first_and_the_report_process_takes_what_balances():
    """List scheduling onto 2 workers and the report's process, which starts CALLER_WORK_COST (1.5) late, costs
    f0 1, f1 2, f2 3, f3 1, f4 2: f2 → worker 1 (free at 0); f1 → worker 2 (0); f4 (after f1: equal costs in
    report order) → the report's process (1.5); f0 → worker 2 (2); f3 → worker 1 (3, a tie with worker 2:
    the first)."""
    assert schedule.CALLER_WORK_COST == 1.5
    pooled, here = schedule.share_out(_makers(1, 2, 3, 1, 2), 2)
    assert [m.name for m in pooled] == ["f2", "f1", "f0", "f3"]  # heaviest first, the pool's order
    assert [m.name for m in here] == ["f4"]
    pooled, here = schedule.share_out(_makers(1, 2, 3, 1, 2), 5)  # a worker for each: none left for the report
    assert here == [] and [m.name for m in pooled] == ["f2", "f1", "f4", "f0", "f3"]


def test_with_two_cpus_the_report_process_draws_the_heatmap_and_the_prediction():
    """The registered costs on the development machine's two CPUs: the two workers draw the four heavy panel
    figures and the breakdown (and the checkpoint figure, the lightest: no data outside checkpoint sweeps); the
    report's process, once its tables and text are done, the two lightest that balance it (the heatmap, and the
    prediction scatter, which has no data in a sweep without a calibration)."""
    pooled, here = schedule.share_out(registry.figure_makers(), 2)
    assert [m.name for m in pooled] == ["memory", "comm", "step_time", "scaling", "time_breakdown", "checkpoint"]
    assert [m.name for m in here] == ["mfu_heatmap", "prediction"]
    assert schedule.share_out(registry.figure_makers(), 4)[1] == []
