"""A results or output folder that cannot be written is one line (the folder, the option, why) and exit 2, before
any work: no cell launched, no record read, nothing half-written. (Issue 15, item 2: `sweep --results RO` was an
OSError traceback from the manifest's lock; `report -o RO` and `compare -o RO` tracebacks after the work.)

A chmod 0o555 folder refuses new entries only to non-root users; as root the tests use /sys, where the kernel
refuses them to everyone. The `unwritable` fixture tries which one refuses, and says so in the test's id.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from harness.cli import main
from harness.results.store import unwritable_reason

REPO = Path(__file__).resolve().parents[2]
RECORDS = REPO / "baselines" / "smoke-local"
SCENARIO = """\
name: one
matrix: {model: [tiny], strategy: [ddp], precision: [fp32], gpus: [2]}
"""


def refuses_entries(folder: Path) -> bool:
    probe = folder / f".harness-test-probe-{os.getpid()}"
    try:
        probe.mkdir()
    except OSError:
        return True
    probe.rmdir()
    return False


@pytest.fixture(params=["chmod-555", "sys"])
def unwritable(request, tmp_path):
    """A folder in which nothing can be created: a chmod 0o555 one (skipped when we are root, who writes there
    anyway), or /sys (skipped where it accepts entries or is missing)."""
    if request.param == "sys":
        sys_dir = Path("/sys")
        if not sys_dir.is_dir() or not refuses_entries(sys_dir):
            pytest.skip("/sys is missing or accepts new entries here")
        yield sys_dir
        return
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o555)
    try:
        if not refuses_entries(ro):
            pytest.skip("a 0o555 folder accepts new entries (running as root): /sys covers it")
        yield ro
    finally:
        ro.chmod(0o755)


@pytest.fixture
def no_work(monkeypatch):
    """Launching a cell, reading records or loading a comparison fails the test: the check must come first."""

    def work(*args, **kwargs):
        raise AssertionError("work started before the output folder was checked")

    monkeypatch.setattr("harness.launch.local.backend.launch_submitit", work)
    monkeypatch.setattr("harness.launch.sweep.Manifest.open", work)
    monkeypatch.setattr("harness.launch.local.launchers.launch_foreground", work)
    monkeypatch.setattr("harness.report.load.record_files", work)
    monkeypatch.setattr("harness.compare.sides.iter_side", work)
    monkeypatch.setenv("HARNESS_NO_PREFORK", "1")


def one_error_line(capsys) -> str:
    out, err = capsys.readouterr()
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    assert "Traceback" not in out + err
    return lines[0]


def test_the_reason_is_tried_not_guessed(tmp_path, unwritable):
    assert unwritable_reason(tmp_path) is None
    assert unwritable_reason(tmp_path / "new" / "deeper") is None
    assert not (tmp_path / "new").exists()  # the probe leaves nothing
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".harness-probe")]
    why = unwritable_reason(unwritable)
    assert why is not None and why.startswith(f"cannot write in {unwritable}: ")
    assert unwritable_reason(unwritable / "results") == (
        f"cannot write in {unwritable}, where it would be created: {why.split(': ', 1)[1]}"
    )
    blocker = tmp_path / "afile"
    blocker.write_text("x")
    assert unwritable_reason(blocker) == "exists and is not a directory"
    assert unwritable_reason(blocker / "sub") == f"cannot be created: {blocker} is a file, not a directory"


@pytest.mark.parametrize("command", ["sweep", "run"])
def test_sweep_and_run_refuse_an_unwritable_results_folder(tmp_path, unwritable, no_work, capsys, command):
    scenario = tmp_path / "s.yaml"
    scenario.write_text(SCENARIO)
    results = unwritable / "results"
    argv = [command, str(scenario), "--results", str(results)] + (["--cell", "tiny-ddp"] if command == "run" else [])
    assert main(argv) == 2
    line = one_error_line(capsys)
    assert line.startswith(f"error: {results / 'one'}: --results: cannot write in {unwritable}, where it would be ")


def test_a_file_where_the_results_folder_would_be_is_one_line(tmp_path, no_work, capsys):
    scenario = tmp_path / "s.yaml"
    scenario.write_text(SCENARIO)
    blocker = tmp_path / "afile"
    blocker.write_text("x")
    assert main(["sweep", str(scenario), "--results", str(blocker / "results")]) == 2
    assert one_error_line(capsys) == (
        f"error: {blocker / 'results' / 'one'}: --results: cannot be created: {blocker} is a file, not a directory"
    )


def test_report_refuses_an_unwritable_output_folder(unwritable, no_work, capsys):
    out = unwritable / "report"
    assert main(["report", str(RECORDS), "-o", str(out)]) == 2
    assert one_error_line(capsys).startswith(f"error: {out}: ")


@pytest.mark.parametrize("option", ["-o", "--output-dir"])
def test_compare_refuses_an_unwritable_output(unwritable, no_work, capsys, option):
    target = unwritable / ("compare.txt" if option == "-o" else "compare")
    assert main(["compare", str(RECORDS), str(RECORDS), option, str(target)]) == 2
    line = one_error_line(capsys)
    assert line.startswith(f"error: {target}: {option}: cannot write in {unwritable}")
