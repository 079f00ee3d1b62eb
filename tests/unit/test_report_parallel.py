"""harness.report with and without its other processes (records read in shares, figures drawn in a pool): the same
files, byte for byte, and the same when a process dies. The fixture sweep is small, so the thresholds that turn the
processes on are lowered here; the CPU count is pinned to 2 so the parallel paths run on any machine."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pandas as pd
import pytest

import harness.report as report
from harness.report import build_report, figures
from harness.report.frame import records_frame
from harness.results.store import iter_records
from tests.unit.test_report import FIGURES, PREDICTION_FIGURES
from tests.unit.test_store import _tree

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "records"


def _serial(monkeypatch) -> None:
    monkeypatch.setattr(report, "PARALLEL_LOAD_MIN_FILES", 10**9)
    monkeypatch.setattr(figures, "PARALLEL_MIN_CELLS", 10**9)


def _parallel(monkeypatch) -> None:
    monkeypatch.setattr(report, "PARALLEL_LOAD_MIN_FILES", 1)
    monkeypatch.setattr(figures, "PARALLEL_MIN_CELLS", 1)
    monkeypatch.setattr(report, "usable_cpus", lambda: 2)
    monkeypatch.setattr(figures, "usable_cpus", lambda: 2)


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
    assert [f.name for f in result["figures"]] == [*FIGURES, *PREDICTION_FIGURES]
    assert [f.note for f in result["figures"]] == [f.note for f in serial["figures"]]
    assert result["warnings"] == serial["warnings"]


def test_a_dying_figure_process_changes_nothing(serial_report, monkeypatch, tmp_path):
    """A worker killed while drawing (out of memory, say) breaks the pool: its figures, and those not collected
    yet, are drawn in this process, with the same bytes."""
    _parallel(monkeypatch)
    parent = os.getpid()
    draw = figures.memory_figure

    def dies_in_a_worker(fc):
        if os.getpid() != parent:
            os._exit(1)
        return draw(fc)

    # NOTE: functions are pickled by name: the forked worker finds this one where memory_figure was
    dies_in_a_worker.__module__, dies_in_a_worker.__qualname__ = figures.__name__, "memory_figure"
    monkeypatch.setattr(figures, "memory_figure", dies_in_a_worker)
    monkeypatch.setattr(figures, "FIGURE_MAKERS", tuple(getattr(figures, m.__name__) for m in figures.FIGURE_MAKERS))
    monkeypatch.setattr(
        figures, "_HEAVIEST_FIRST", tuple(getattr(figures, m.__name__) for m in figures._HEAVIEST_FIRST)
    )
    build_report([FIXTURES], out=tmp_path)
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
    df, got, n_unreadable = report._load([root])
    pd.testing.assert_frame_equal(df, frame)
    assert got == warnings + more and n_unreadable == len(warnings) == 5
    assert any("dir.json: unreadable: [Errno 21] Is a directory" in w for w in got)


def test_a_dying_load_process_changes_nothing(monkeypatch, tmp_path):
    root = _tree(tmp_path / "results")
    warnings: list[str] = []
    frame, more = records_frame(iter_records(root, warnings=warnings))
    _parallel(monkeypatch)
    parent = os.getpid()
    read = report._read_share

    def dies_in_a_worker(files):
        if os.getpid() != parent:
            os._exit(1)
        return read(files)

    dies_in_a_worker.__module__, dies_in_a_worker.__qualname__ = report.__name__, "_read_share"
    monkeypatch.setattr(report, "_read_share", dies_in_a_worker)
    df, got, _ = report._load([root])
    pd.testing.assert_frame_equal(df, frame)
    assert got == warnings + more
