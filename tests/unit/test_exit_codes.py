"""docs/exit-codes.md is the one table of exit codes (issue 48, item 5): every command has its row, and every code a
row gives is held to a test — a case here, run through `harness.cli.main`, or a named test elsewhere that already
asserts it.

The cases here are the rows no test held, and the three the issue decided: `report` of an empty results folder
(2, was 1), a sweep or a `run` in which nothing ran because every cell was skipped (1, was 0), and a record that
cannot be read in `compare` (2, was `1 missing` and 0: tests/unit/test_compare.py). No case launches a rank: where
a command would run cells, the launcher is a stand-in that fails the test (cases that must launch nothing) or
returns the record a cell would end with (`run`'s exit code is a function of that record).
"""

from __future__ import annotations

import re
import signal
from pathlib import Path
from types import SimpleNamespace

import pytest

from harness.cli import COMMANDS, main
from harness.results.store import new_record, write_record
from harness.scenario.schema import load_scenario

REPO = Path(__file__).resolve().parents[2]
DOC = REPO / "docs" / "exit-codes.md"
CODES = (0, 1, 2)


def doc_table() -> dict[str, dict[int, str]]:
    """{command: {code: what the row says}} from docs/exit-codes.md ("—": the command never exits so)."""
    rows: dict[str, dict[int, str]] = {}
    for line in DOC.read_text().splitlines():
        m = re.match(r"\| `([a-z ]+)` \| (.*) \|$", line)
        if m:
            cells = [c.strip() for c in m.group(2).split(" | ")]
            assert len(cells) == len(CODES), line
            rows[m.group(1)] = dict(zip(CODES, cells))
    return rows


TABLE = doc_table()

COMMAND_NAMES = sorted(
    [name for name in COMMANDS if name != "history"] + ["history add", "history show", "history check"]
)

ELSEWHERE = {
    ("sweep", 1): "tests/faults/test_faults.py::test_sweep_went_on_and_flagged_failure",
    ("report", 0): "tests/unit/test_report.py::test_cli_writes_the_report_and_prints_paths_and_warnings",
    ("report", 1): "tests/unit/test_full_disk.py::test_each_commands_write_on_a_full_disk_is_one_line_and_exit_1",
    ("compare", 0): "tests/unit/test_compare.py::test_identical_sets_exit_0_and_every_metric_unchanged",
    (
        "compare",
        1,
    ): "tests/unit/test_compare.py::test_newly_failing_cell_is_a_regression_and_newly_fixed_an_improvement",
    (
        "compare",
        2,
    ): "tests/unit/test_compare.py::test_a_record_that_cannot_be_read_on_either_side_is_bad_input_not_a_missing_cell",
    ("plan", 1): "tests/unit/test_full_disk.py::test_each_commands_write_on_a_full_disk_is_one_line_and_exit_1",
    ("calibrate", 0): "tests/unit/test_calibrate_from.py::test_doubled_busbw_halves_exactly_the_communication",
    ("history add", 0): "tests/history/test_cli.py::test_add_reports_what_it_stored_and_twice_changes_nothing",
    ("history show", 0): "tests/history/test_cli.py::test_show_prints_each_series_with_its_change_point",
    ("history check", 0): "tests/history/test_cli.py::test_a_quiet_night_exits_0",
    ("history check", 1): "tests/history/test_cli.py::test_a_slow_cell_exits_1_naming_it_with_the_evidence",
    ("history check", 2): "tests/history/test_cli.py::test_bad_input_exits_2_with_one_line",
    (
        "tune",
        0,
    ): "tests/integration/test_tune.py::test_tune_prunes_survives_an_oom_confirms_and_writes_a_scenario_that_sweeps",
}
"""(command, code) → the test elsewhere that asserts it"""

SCENARIO = """\
name: one
matrix: {model: [tiny], strategy: [ddp], precision: [fp32], gpus: [GPUS]}
settings: {warmup_steps: 2, measure_steps: 2}
"""


@pytest.fixture
def stand_in(monkeypatch):
    """Launchers that launch nothing: the list returned holds the statuses `harness run`'s cells end with (the
    records the foreground launcher returns), and a sweep's launch fails the test (its cases must launch nothing).
    The SIGTERM handler `sweep` and `tune` install is put back afterwards."""
    ends: list[str] = []

    def foreground(payload, *, time_limit_s, stream=True):
        status = ends.pop(0)
        return new_record(
            spec=payload.spec,
            run_id=payload.run_id,
            sweep=payload.sweep,
            cluster=payload.cluster.name,
            status=status,
            reason=None if status == "ok" else "the stand-in's reason",
        )

    def launched(*args, **kwargs):
        raise AssertionError("a case that must launch nothing launched a cell")

    monkeypatch.setattr("harness.launch.local.launchers.launch_foreground", foreground)
    monkeypatch.setattr("harness.launch.local.backend.launch_submitit", launched)
    monkeypatch.setenv("HARNESS_NO_PREFORK", "1")
    handler = signal.getsignal(signal.SIGTERM)
    yield ends
    signal.signal(signal.SIGTERM, handler)


def scenario(tmp_path: Path, gpus: int = 2) -> Path:
    path = tmp_path / "one.yaml"
    path.write_text(SCENARIO.replace("GPUS", str(gpus)))
    return path


def recorded_ok(tmp_path: Path) -> None:
    """Every cell of scenario(tmp_path) with an ok record, as an earlier sweep leaves it."""
    (spec,) = load_scenario(str(scenario(tmp_path))).expand(gpus_per_node=2)
    write_record(
        tmp_path / "results",
        new_record(spec=spec, run_id=spec.run_id, sweep="one", cluster="local", status="ok", attempt="earlier"),
    )


def tuned(every_group_won: bool):
    """A stand-in for harness.tune.run.run_tune: its result, with or without a winner in every group."""
    log = SimpleNamespace(to_dict=dict, every_group_won=lambda: every_group_won)
    return lambda *args, **kwargs: SimpleNamespace(log=log, tuned_file=None, folder=Path("x"))


def case(tmp_path: Path, monkeypatch, ends: list[str], command: str, code: int) -> tuple[list[str], str]:
    """(argv, a fragment of what the command prints) of the case of `command` exiting `code`."""
    t = str(tmp_path)
    results = str(tmp_path / "results")
    one = str(scenario(tmp_path))
    if (command, code) == ("sweep", 0):  # every cell recorded ok by an earlier sweep: nothing to run, nothing failed
        recorded_ok(tmp_path)
        return ["sweep", one, "--results", results], "ok (already recorded"
    if (command, code) == ("sweep", 1):  # nothing ran: every cell was skipped (more ranks than this machine hosts)
        return ["sweep", str(scenario(tmp_path, 100000)), "--results", results], "nothing ran: every cell was skipped"
    if (command, code) == ("sweep", 2):
        return ["sweep", one, "--results", results, "--pack"], "--pack: needs a SLURM profile"
    if command == "run":
        if code == 2:
            return ["run", one, "--cell", "nope", "--results", results], "--cell"
        if code == 1:  # skipped: the cell cannot run here, and nothing ran (a failed cell: the test below)
            path = str(scenario(tmp_path, 100000))
            return ["run", path, "--cell", "tiny-ddp-fp32-g100000", "--results", results], "skipped"
        ends.append("ok")
        return ["run", one, "--cell", "tiny", "--results", results], "ok"
    if command == "list":
        return (["list", "models"], "tiny") if code == 0 else (["list", "cells", one, "--cluster", "nope"], "nope")
    if command == "plan":
        return (["plan", one], "tiny") if code == 0 else (["plan", str(tmp_path / "none.yaml")], "none.yaml")
    if command == "show":
        return (["show", "cluster", "h100"], "989.4") if code == 0 else (["show", "cluster", "nope"], "nope")
    if command == "status":
        if code == 0:
            recorded_ok(tmp_path)
            main(["sweep", one, "--results", results])
            return ["status", results], "1 done"
        (tmp_path / "empty").mkdir()
        return ["status", str(tmp_path / "empty")], "no sweep manifest found"
    if (command, code) == ("report", 2):  # an empty results folder: nothing to report on, nothing written
        (tmp_path / "empty").mkdir()
        return ["report", str(tmp_path / "empty"), "-o", f"{t}/out"], "no readable records (an empty results folder"
    if command == "calibrate":
        if code == 1:

            def failed(*args, **kwargs):
                from harness.calibrate.run import CalibrationFailed

                raise CalibrationFailed("the measuring process exited 1")

            monkeypatch.setattr("harness.calibrate.run.calibrate", failed)
            return ["calibrate", "--quick", "--out", f"{t}/c.json"], "no calibration file was written"
        (tmp_path / "bad.log").write_text("not a log\n")
        return ["calibrate", "--cluster", "h100", "--from", f"{t}/bad.log", "--out", f"{t}/c.json"], "bad.log"
    if command == "history add":
        (tmp_path / "empty").mkdir()
        return ["history", "add", "--db", f"{t}/h.db", str(tmp_path / "empty")], "no readable records"
    if command == "history show":
        return ["history", "show", "--db", f"{t}/none.db"], "none.db"
    if command == "show":
        return (["show", "cluster", "h100"], "h100") if code == 0 else (["show", "cluster", "nope"], "nope")
    if command == "tune":
        if code == 1:
            monkeypatch.setattr("harness.tune.run.run_tune", tuned(every_group_won=False))
            return ["tune", one, "--results", results, "--no-calibrate", "--format", "json"], "{"
        return ["tune", one, "--results", results, "--budget-cells", "0"], "--budget-cells"
    raise AssertionError(f"no case for {command} exiting {code}")


CASES = [
    (command, code)
    for command in COMMAND_NAMES
    for code in CODES
    if TABLE.get(command, {}).get(code, "—") != "—" and (command, code) not in ELSEWHERE
]


def test_every_command_has_its_row_and_the_readme_points_to_the_table():
    assert sorted(TABLE) == COMMAND_NAMES
    assert all(TABLE[c][0] != "—" for c in COMMAND_NAMES)  # every command can succeed
    readme = (REPO / "README.md").read_text()
    assert "docs/exit-codes.md" in readme


@pytest.mark.parametrize(("command", "code"), sorted(ELSEWHERE))
def test_a_code_a_row_gives_held_elsewhere_is_a_test_that_exists(command, code):
    assert TABLE[command][code] != "—", f"{command} never exits {code} by the table"
    path, name = ELSEWHERE[(command, code)].split("::")
    assert re.search(rf"^def {name}\(", (REPO / path).read_text(), re.M), ELSEWHERE[(command, code)]


@pytest.mark.parametrize(("command", "code"), CASES)
def test_each_code_a_row_gives(tmp_path, monkeypatch, capsys, stand_in, command, code):
    argv, said = case(tmp_path, monkeypatch, stand_in, command, code)
    capsys.readouterr()
    assert main(argv) == code, capsys.readouterr()
    out, err = capsys.readouterr()
    assert said in out + err and "Traceback" not in out + err
    if code == 2:
        assert err.startswith("error: ") or "Usage:" in err


def test_a_run_whose_cell_failed_exits_1(tmp_path, capsys, stand_in):
    stand_in.append("oom")
    assert main(["run", str(scenario(tmp_path)), "--cell", "tiny", "--results", str(tmp_path / "results")]) == 1
    assert "oom" in capsys.readouterr().out


def test_report_of_an_empty_results_folder_is_bad_input_and_writes_nothing(tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    out = tmp_path / "out"
    assert main(["report", str(tmp_path / "empty"), "-o", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.splitlines() == [
        f"error: {tmp_path / 'empty'}: no readable records (an empty results folder, or no file in it is a record "
        "this harness reads); nothing was written"
    ]
    assert not out.exists()


def test_a_sweep_that_ran_nothing_exits_1_and_one_whose_cells_were_all_ok_before_exits_0(tmp_path, capsys, stand_in):
    results = tmp_path / "results"
    assert main(["sweep", str(scenario(tmp_path, 100000)), "--results", str(results)]) == 1
    out, err = capsys.readouterr()
    assert "1 skipped" in out
    assert err.splitlines() == [
        "error: nothing ran: every cell was skipped (why: the lines above, and each record's reason)"
    ]
    recorded_ok(tmp_path)
    assert main(["sweep", str(scenario(tmp_path)), "--results", str(results)]) == 0
    assert "ok (already recorded; --force reruns)" in capsys.readouterr().out


def test_the_table_says_what_the_issue_decided():
    assert "empty results folder" in TABLE["report"][2]
    assert "every cell was skipped" in TABLE["sweep"][1] and "skipped" in TABLE["run"][1]
    assert "cannot be read on either side" in TABLE["compare"][2]
    assert "part-way" in TABLE["sweep"][1]
