"""`harness sweep --repeat K` for real (issue 20): two tiny cells run twice each, in rounds (run 1 of both cells,
then run 2), each run its own record (run 1 at today's path, run 2 at `<run_id>.r2.json` with `repeat: 2`); a
re-run runs nothing; `harness status` counts runs; `harness compare` judges on the runs. Bad K values exit 2."""

from __future__ import annotations

import datetime as dt
import json

import pytest

from harness.cli import main
from harness.compare.judge import compare
from harness.scenario.schema import load_scenario
from tests.conftest import load_docs

pytestmark = pytest.mark.dist

SCENARIO = """\
name: rep
matrix:
  model: [tiny]
  strategy: [ddp]
  precision: [fp32, bf16]
  gpus: [2]
settings: {micro_batch: 2, seq_len: 32, warmup_steps: 2, measure_steps: 5}
"""


@pytest.fixture(scope="module")
def swept(tmp_path_factory) -> dict:
    root = tmp_path_factory.mktemp("repeat")
    scenario = root / "rep.yaml"
    scenario.write_text(SCENARIO)
    results = root / "results"
    code = main(["sweep", str(scenario), "--results", str(results), "--repeat", "2"])
    return {"code": code, "scenario": scenario, "results": results}


def test_every_cell_runs_k_times_in_rounds_each_run_its_own_record(swept):
    assert swept["code"] == 0
    first, second = (s.run_id for s in load_scenario(swept["scenario"]).expand(gpus_per_node=2))
    folder = swept["results"] / "rep"
    assert sorted(p.name for p in folder.glob("*.json")) == sorted(
        [f"{first}.json", f"{first}.r2.json", f"{second}.json", f"{second}.r2.json", "manifest.json"]
    )
    records, warnings = load_docs(swept["results"])
    assert warnings == [] and len(records) == 4
    assert all(r["status"] == "ok" for r in records)
    by_name = {r["_path"].rsplit("/", 1)[1]: r for r in records}
    assert "repeat" not in by_name[f"{first}.json"] and by_name[f"{first}.r2.json"]["repeat"] == 2
    assert {r["run_id"] for r in records} == {first, second}  # run_id stays the cell's id
    assert len({r["attempt"] for r in records}) == 4  # four launches
    # interleaved: both cells' first runs started before either cell's second run
    start = {(r["run_id"], r.get("repeat", 1)): dt.datetime.fromisoformat(r["started_at"]) for r in records}
    assert max(start[(first, 1)], start[(second, 1)]) <= min(start[(first, 2)], start[(second, 2)])
    manifest = json.loads((folder / "manifest.json").read_text())
    assert manifest["repeat"] == 2 and manifest["scenario_file"] == str(swept["scenario"].resolve())
    assert manifest["cells"][first]["state"] == "done" and manifest["cells"][first]["repeats"]["2"]["state"] == "done"


def test_a_rerun_runs_nothing_and_status_counts_runs(swept, capsys):
    before = {
        p.name: p.stat().st_mtime_ns for p in (swept["results"] / "rep").glob("*.json") if "manifest" not in p.name
    }
    assert main(["sweep", str(swept["scenario"]), "--results", str(swept["results"]), "--repeat", "2"]) == 0
    out = capsys.readouterr().out
    assert out.count("ok (already recorded; --force reruns)") == 4 and "done in" in out
    after = {
        p.name: p.stat().st_mtime_ns for p in (swept["results"] / "rep").glob("*.json") if "manifest" not in p.name
    }
    assert after == before
    assert main(["status", str(swept["results"])]) == 0
    out = capsys.readouterr().out
    assert "2 cells, 4 runs (--repeat 2; counts below are of runs)" in out
    assert out.count(" run 1  job") == 2 and out.count(" run 2  job") == 2 and "  4 done" in out


def test_compare_judges_two_runs_a_side_as_reported_not_judged(swept):
    records, _ = load_docs(swept["results"])
    cmp = compare(records, records)
    assert [c.runs for c in cmp.cells] == [(2, 2), (2, 2)]
    assert all(c.basis == "2 vs 2 runs: reported, not judged (3 per side needed)" for c in cmp.cells)
    assert cmp.exit_code() == 0


@pytest.mark.parametrize("k", ["0", "-1", str(10**9)])
def test_a_bad_repeat_count_exits_2_naming_the_option(swept, capsys, k):
    assert main(["sweep", str(swept["scenario"]), "--results", str(swept["results"]), "--repeat", k]) == 2
    err = capsys.readouterr().err
    assert f"--repeat: {k} is not a whole number of runs per cell from 1 to 100" in err and "Traceback" not in err


def test_the_report_shows_runs_as_runs_not_as_reruns(swept, tmp_path):
    """Two runs per cell: the tables show each cell's last run, the leader test counts both runs, and the warning
    says the cells were measured more than once (not that older records were set aside)."""
    from harness.report import build_report

    result = build_report([swept["results"]], out=tmp_path / "report")
    assert len(result["cells"]) == 2 and sorted(result["frame"]["repeat"].tolist()) == [1, 1, 2, 2]
    assert set(result["cells"]["repeat"].tolist()) == {2}
    assert [w for w in result["warnings"] if "set aside" in w] == []
    (runs,) = [w for w in result["warnings"] if "measured more than once" in w]
    assert runs.startswith("2 cell(s) were measured more than once") and "2 earlier run(s)" in runs
