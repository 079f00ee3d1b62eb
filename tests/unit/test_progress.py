"""The status line of long work (harness.core.progress, issue 52 item 6): on a terminal, done/total, the elapsed time
and an ETA from the mean seconds per item so far ("ETA unknown" before the first), with the lines a command prints
above it; not on a terminal, nothing at all. The terminal is a stream whose isatty() is true, and what it shows is
worked out from what was written (`\\r` back to the row's start, `\\n` a new row), as a terminal would; the clock is
the test's own, so the numbers are exact."""

from __future__ import annotations

import io

import pytest

from harness.core.progress import Progress, duration
from harness.scenario.cluster import load_cluster
from harness.scenario.schema import parse_scenario


class Terminal(io.StringIO):
    """A stream that says it is a terminal."""

    def isatty(self) -> bool:
        return True


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def screen(raw: str) -> list[str]:
    """The rows a terminal shows after `raw` (trailing blanks dropped; the last row is where the cursor is)."""
    rows, col = [""], 0
    for ch in raw:
        if ch == "\r":
            col = 0
        elif ch == "\n":
            rows.append("")
            col = 0
        else:
            row = rows[-1].ljust(col)
            rows[-1] = row[:col] + ch + row[col + 1 :]
            col += 1
    return [r.rstrip() for r in rows]


@pytest.fixture(autouse=True)
def wide(monkeypatch):
    monkeypatch.setenv("COLUMNS", "200")


def test_a_terminal_shows_done_of_total_the_elapsed_time_and_an_eta():
    term, clock = Terminal(), Clock()
    with Progress("sweep s", 4, unit="runs", stream=term, clock=clock) as p:
        assert screen(term.getvalue()) == ["sweep s: 0/4 runs, 0s elapsed, ETA unknown"]
        p.doing("tiny ddp fp32 g2")
        clock.now += 10
        p.advance()
        assert screen(term.getvalue()) == ["sweep s: 1/4 runs, 10s elapsed, ETA 30s"]
        clock.now += 20
        p.advance()  # mean 15 s a run, 2 left
        assert screen(term.getvalue()) == ["sweep s: 2/4 runs, 30s elapsed, ETA 30s"]
        p.doing("tiny zero2 fp32 g2")
        assert screen(term.getvalue()) == ["sweep s: 2/4 runs, 30s elapsed, ETA 30s · tiny zero2 fp32 g2"]
    assert screen(term.getvalue()) == [""]  # gone when the work is


def test_eta_unknown_until_an_item_that_did_work_has_ended():
    term, clock = Terminal(), Clock()
    with Progress("sweep s", 5, unit="runs", stream=term, clock=clock) as p:
        clock.now += 2
        p.advance(2, timed=False)  # recorded already: no time of their own
        assert screen(term.getvalue())[-1] == "sweep s: 2/5 runs, 2s elapsed, ETA unknown"
        clock.now += 60
        p.advance()
        # NOTE: the skipped ones' two seconds are not a run's: 60 s a run, 2 left
        assert screen(term.getvalue())[-1] == "sweep s: 3/5 runs, 1m02s elapsed, ETA 2m00s"


def test_lines_printed_meanwhile_go_above_the_status_line():
    term, clock = Terminal(), Clock()
    with Progress("sweep s", 2, unit="runs", stream=term, clock=clock) as p:
        echo = p.above(lambda line: print(line, file=term))
        echo("sweep 's': 2 cells on cluster 'local'")
        clock.now += 4
        echo("[1/2] tiny-ddp  ok  12.5 ms/step")
        p.advance()
        assert screen(term.getvalue()) == [
            "sweep 's': 2 cells on cluster 'local'",
            "[1/2] tiny-ddp  ok  12.5 ms/step",
            "sweep s: 1/2 runs, 4s elapsed, ETA 4s",
        ]
        echo("[2/2] tiny-zero2  ok  20.1 ms/step")
        p.advance()
    assert screen(term.getvalue()) == [
        "sweep 's': 2 cells on cluster 'local'",
        "[1/2] tiny-ddp  ok  12.5 ms/step",
        "[2/2] tiny-zero2  ok  20.1 ms/step",
        "",
    ]


def test_not_a_terminal_gets_nothing_extra():
    log, clock = io.StringIO(), Clock()
    printed: list[str] = []

    def say(line: str) -> None:
        printed.append(line)

    with Progress("sweep s", 2, stream=log, clock=clock) as p:
        echo = p.above(say)
        assert echo is say  # the lines go as they always went
        echo("[1/2] tiny-ddp  ok")
        clock.now += 3
        p.doing("x")
        p.advance()
        p.draw()
    assert log.getvalue() == "" and printed == ["[1/2] tiny-ddp  ok"]


def test_nested_work_shares_one_line_and_one_echo():
    term, clock = Terminal(), Clock()
    with Progress("tune t", 6, unit="trials", approx=True, stream=term, clock=clock) as outer:
        echo = outer.above(lambda line: print(line, file=term))
        with Progress("sweep t-tune", 2, unit="runs", stream=term, clock=clock) as inner:
            assert inner.above(echo) is echo  # one clearing and redrawing, not two
            clock.now += 5
            inner.advance()
            assert screen(term.getvalue()) == [
                "tune t: 0/~6 trials, 5s elapsed, ETA unknown | sweep t-tune: 1/2 runs, 5s elapsed, ETA 5s"
            ]
            echo("tune: batch 1: 2 trial(s), round 0")
        outer.advance(2)
        assert screen(term.getvalue()) == [
            "tune: batch 1: 2 trial(s), round 0",
            "tune t: 2/~6 trials, 5s elapsed, ETA 10s",
        ]


def test_the_line_is_cut_at_the_terminals_width(monkeypatch):
    monkeypatch.setenv("COLUMNS", "30")
    term = Terminal()
    with Progress("sweep a-long-scenario-name", 120, stream=term, clock=Clock()):
        (row,) = screen(term.getvalue())
    assert row == "sweep a-long-scenario-name: …" and len(row) == 29


@pytest.mark.parametrize(("seconds", "shown"), [(0, "0s"), (59.9, "59s"), (185, "3m05s"), (7620, "2h07m")])
def test_durations_read_at_a_glance(seconds, shown):
    assert duration(seconds) == shown


def test_a_sweep_counts_its_runs_on_the_status_line(tmp_path, monkeypatch):
    """The local backend's wiring (harness.launch.sweep, harness.launch.local.backend): cells that take no time
    (skipped here: more ranks than this host can place, so nothing is launched) are counted, and the ETA stays
    unknown."""
    from harness.launch.sweep import run_sweep

    term = Terminal()
    monkeypatch.setattr("sys.stdout", term)
    doc = {
        "name": "sk",
        "matrix": {"model": ["tiny"], "strategy": ["ddp", "zero2"], "precision": ["fp32"], "gpus": [4096]},
    }
    sc = parse_scenario(doc, str(tmp_path / "sk.yaml"))
    res = run_sweep(sc, load_cluster("local"), results=tmp_path / "r", echo=lambda line: print(line, file=term))
    assert [r.status for r in res.records] == ["skipped", "skipped"]
    raw = term.getvalue()
    assert "\rsweep sk: 1/2 runs, 0s elapsed, ETA unknown" in raw
    assert "\rsweep sk: 2/2 runs, 0s elapsed, ETA unknown" in raw
    rows = screen(raw)
    assert rows[-1] == "" and all(r.startswith("[") for r in rows[:-1])  # the cells' lines, the status line gone
    assert len(rows) == 3


def test_calibrates_processes_print_above_the_status_line_on_a_terminal_and_straight_through_else(capfd):
    """harness.calibrate.run's measuring processes (a real child process here, printing two lines): on a terminal
    their lines are relayed through the status line's echo; else they write to this process's stdout themselves."""
    import os
    import sys

    from harness.calibrate.run import CalibrationFailed, _run, _say

    cmd = [sys.executable, "-c", "print('calibrate: gemm float32'); print('calibrate: attention float32')"]
    term, clock = Terminal(), Clock()
    with Progress("calibrate local", 3, unit="parts", stream=term, clock=clock) as p:
        _run(cmd, dict(os.environ), "of the device", relay=p.above(lambda line: print(line, file=term)))
        clock.now += 30
        p.advance()
    assert screen(term.getvalue()) == ["calibrate: gemm float32", "calibrate: attention float32", ""]
    assert "calibrate local: 1/3 parts, 30s elapsed, ETA 1m00s" in term.getvalue()
    assert capfd.readouterr().out == ""
    log = io.StringIO()
    with Progress("calibrate local", 3, unit="parts", stream=log, clock=clock) as p:
        _run(cmd, dict(os.environ), "of the device", relay=None if not p.live else p.above(_say))
    assert log.getvalue() == "" and capfd.readouterr().out == "calibrate: gemm float32\ncalibrate: attention float32\n"
    with pytest.raises(CalibrationFailed, match="calibration of the device failed \\(exit 3\\); its output is above"):
        _run([sys.executable, "-c", "raise SystemExit(3)"], dict(os.environ), "of the device", relay=None)
