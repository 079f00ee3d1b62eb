"""Issue 52, items 3 and 6, for real: `harness sweep --set micro_batch=3` runs two tiny cells at micro-batch 3 (their
records say so, the manifest records the override, `harness status` names it), on a terminal with the status line
counting the runs and, once the first has ended, an ETA; and the same sweep's output to a log has no status line."""

from __future__ import annotations

import json
import re

import pytest

from harness.cli import main
from tests.conftest import load_docs
from tests.unit.test_progress import Terminal, screen

pytestmark = pytest.mark.dist

SCENARIO = """\
name: sp
matrix:
  model: [tiny]
  strategy: [ddp, zero2]
  precision: [fp32]
  gpus: [2]
  micro_batch: [1, 2]
settings: {seq_len: 32, warmup_steps: 2, measure_steps: 3}
"""


@pytest.fixture(scope="module")
def swept(tmp_path_factory) -> dict:
    root = tmp_path_factory.mktemp("set-progress")
    scenario = root / "sp.yaml"
    scenario.write_text(SCENARIO)
    results = root / "results"
    term = Terminal()
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr("sys.stdout", term)
        mp.setenv("COLUMNS", "200")
        code = main(["sweep", str(scenario), "--results", str(results), "--set", "micro_batch=3"])
    return {"code": code, "raw": term.getvalue(), "results": results, "scenario": scenario}


def test_every_cell_ran_at_the_set_micro_batch_and_the_manifest_says_why(swept):
    assert swept["code"] == 0, swept["raw"]
    records, warnings = load_docs(swept["results"])
    assert not warnings and len(records) == 2  # the micro_batch axis is replaced: 2 cells, not 4
    assert {(r["spec"]["strategy"], r["spec"]["micro_batch"]) for r in records} == {("ddp", 3), ("zero2", 3)}
    manifest = json.loads((swept["results"] / "sp" / "manifest.json").read_text())
    assert manifest["overrides"] == ["micro_batch=3"]


def test_a_terminal_shows_the_runs_done_and_an_eta(swept):
    raw = swept["raw"]
    assert "\rsweep sp: 0/2 runs, 0s elapsed, ETA unknown" in raw
    assert re.search(r"\rsweep sp: 1/2 runs, \d+s elapsed, ETA \d+s", raw), raw
    rows = screen(raw)
    assert rows[0] == "sweep 'sp': 2 cells on cluster 'local' (local, cpu) (--set micro_batch=3)"
    assert [r.split()[0] for r in rows[1:3]] == ["[1/2]", "[2/2]"] and all("  ok  " in r for r in rows[1:3])
    assert rows[3].startswith("done in ") and rows[-1] == ""  # the status line is gone before the summary


def test_a_log_gets_the_lines_it_always_got(swept, capsys):
    assert main(["sweep", str(swept["scenario"]), "--results", str(swept["results"]), "--set", "micro_batch=3"]) == 0
    out = capsys.readouterr().out
    assert "\r" not in out and "ETA" not in out
    assert out.splitlines()[1:3] == [
        line for line in out.splitlines() if line.startswith("[")
    ]  # the re-run's cells, recorded already
    assert all("ok (already recorded; --force reruns)" in line for line in out.splitlines()[1:3])
    assert main(["status", str(swept["results"])]) == 0
    assert capsys.readouterr().out.splitlines()[0] == "sweep 'sp' on 'local': 2 cells (--set micro_batch=3)"


TUNE = """\
name: tp
matrix:
  model: [tiny]
  strategy: [ddp, zero2]
  precision: [fp32]
  gpus: [2]
settings: {seq_len: 32, warmup_steps: 2, measure_steps: 3}
tune: {first_round: 2, confirm_runs: 2, max_runs: 2}
"""


def test_tune_shows_its_trials_with_its_batches_sweeps_and_keeps_the_overrides(tmp_path):
    scenario = tmp_path / "tp.yaml"
    scenario.write_text(TUNE)
    results = tmp_path / "results"
    term = Terminal()
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr("sys.stdout", term)
        mp.setenv("COLUMNS", "200")
        args = ["tune", str(scenario), "--results", str(results), "--no-calibrate", "--set", "micro_batch=3"]
        code = main(args)
    raw = term.getvalue()
    assert code in (0, 1), raw  # a winner, or a tie: the search ran either way
    # 2 candidates x 2 confirmation runs: 4 trials expected; each batch's sweep adds its runs to the same line
    assert "\rtune tp: 0/~4 trials, 0s elapsed, ETA unknown | sweep tp-tune: 0/2 runs, 0s elapsed, ETA unknown" in raw
    assert re.search(r"\rtune tp: 2/~4 trials, \d+s elapsed, ETA \d+s", raw), raw
    rows = screen(raw)
    assert rows[-1] == "" and not [r for r in rows if "tune tp: " in r]  # drawn in place, and gone at the end
    log = json.loads((results / "tp-tune" / "tune.json").read_text())
    assert log["overrides"] == ["micro_batch=3"]
    trials = [c for g in log["groups"] for c in g["candidates"]]
    assert {c["spec"]["micro_batch"] for c in trials} == {3}
