"""`harness compare` and the time model's deviation (issue 16): `predicted.step_time_deviation` (measured median
/ predicted − 1) is shown per cell on each side with its change in points — information, never a regression by
itself — and fails a cell only when asked: `--watch-deviation PCT` (|deviation| grew by more than PCT points).
The records are the compare tests' records with a prediction written in (edited copies)."""

from __future__ import annotations

import json

import pytest

from harness.compare.comparison import INFO, NA, REGRESSION
from harness.compare.judge import compare
from harness.core.errors import InputError
from tests.unit.test_compare import cells, row, run_pair, runs

DEV = "predicted.step_time_deviation"
CELL = "tiny ddp fp32 g2"


def with_deviation(records, deviation: dict[str, float | None], *, why: str = "") -> list[dict]:
    """The records with a prediction whose deviation is `deviation[strategy/precision]` (None: no prediction,
    with the reason `why`), as the worker writes it: predicted.step_time_s = measured median / (1 + deviation)."""
    out = []
    for rec in records.values() if isinstance(records, dict) else records:
        rec = json.loads(json.dumps(rec))
        key = f"{rec['spec']['strategy']}/{rec['spec']['precision']}"
        dev = deviation.get(key, 0.05)
        if dev is None:
            rec["predicted"]["step_time_s"] = None
            rec["predicted"]["time_null_reasons"] = {"step_time_s": why}
        else:
            rec["predicted"]["step_time_s"] = rec["metrics"]["step_time_s"]["median"] / (1 + dev)
            rec["predicted"]["step_time_deviation"] = dev
        out.append(rec)
    return out


def test_a_deviation_change_is_reported_with_its_size_and_never_fails_by_itself(tmp_path, capsys):
    base = with_deviation(cells(), {"ddp/fp32": 0.10})
    cand = with_deviation(cells(), {"ddp/fp32": 0.28})
    cmp = compare(base, cand)
    r = row(cmp, CELL, DEV)
    assert (r.verdict, r.baseline, r.candidate, r.kind) == (INFO, 0.10, 0.28, "watched")
    assert r.growth == pytest.approx(0.18, abs=1e-12) and r.ratio is None and r.threshold is None
    assert not cmp.has_regression and cmp.exit_code() == 0

    assert run_pair(tmp_path, base, cand) == 0
    out = capsys.readouterr().out
    assert "time-model deviation (measured median / predicted − 1; information; never a regression" in out
    assert f"  {CELL}: +10.0% → +28.0% (+18.0 pt; |deviation| grew by 18.0 points)\n" in out
    assert "  tiny ddp bf16 g2: +5.0% → +5.0% (+0.0 pt; |deviation| shrank by 0.0 points)\n" in out
    assert "0 cells regressed" in out and "→ exit 0" in out


def test_json_md_and_github_benchmark_carry_it(tmp_path, capsys):
    base = with_deviation(cells(), {"ddp/fp32": 0.10})
    cand = with_deviation(cells(), {"ddp/fp32": 0.28})
    assert run_pair(tmp_path, base, cand, "--format", "json") == 0
    d = json.loads(capsys.readouterr().out)
    (dev,) = [m for c in d["cells"] if c["label"] == CELL for m in c["metrics"] if m["metric"] == DEV]
    assert dev["verdict"] == "info" and dev["baseline"] == 0.10 and dev["candidate"] == 0.28
    assert dev["growth"] == pytest.approx(0.18) and dev["delta"] == pytest.approx(0.18)
    assert d["settings"]["watch_deviation"] is None and d["summary"]["deviation_regressions"] == 0
    assert d["exit_code"] == 0

    assert run_pair(tmp_path, base, cand, "--format", "md") == 0
    md = capsys.readouterr().out
    assert "### Time-model deviation (measured median / predicted − 1; information;" in md
    assert f"- {CELL}: +10.0% → +28.0% (+18.0 pt; \\|deviation\\| grew by 18.0 points)" in md

    assert run_pair(tmp_path, base, cand, "--format", "github-benchmark", "--direction", "smaller") == 0
    entries = json.loads(capsys.readouterr().out)
    step = next(e for e in entries if e["name"].endswith(" step_time_s") and e["extra"].startswith(CELL + ";"))
    assert "; time-model deviation +10.0% → +28.0% (+18.0 pt;" in step["extra"]
    assert not any(e["name"].endswith(DEV) for e in entries)  # no direction is better for it: no series of its own


def test_watch_deviation_fails_the_cell_whose_deviation_grew_beyond_it(tmp_path, capsys):
    base = with_deviation(cells(), {"ddp/fp32": 0.10, "zero2/bf16": -0.30})
    cand = with_deviation(cells(), {"ddp/fp32": 0.28, "zero2/bf16": 0.10})  # zero2: shrank by 20 points
    assert run_pair(tmp_path, base, cand, "--watch-deviation", "15") == 1
    out = capsys.readouterr().out
    assert f"{CELL}: regressed (1 metric)" in out
    assert "regression (|deviation| grew by 18.0 points > --watch-deviation 15)" in out
    assert "1 cell regressed (1 metric)" in out and "→ exit 1" in out
    assert "tiny zero2 bf16 g2: -30.0% → +10.0% (+40.0 pt; |deviation| shrank by 20.0 points" in out

    assert run_pair(tmp_path, base, cand, "--watch-deviation", "15", "--format", "json") == 1
    d = json.loads(capsys.readouterr().out)
    assert [c["label"] for c in d["cells"] if c["regressed"]] == [CELL]
    assert d["summary"]["deviation_regressions"] == 1 and d["settings"]["watch_deviation"] == 15.0

    assert run_pair(tmp_path, base, cand, "--watch-deviation", "18.5") == 0  # 18 points: not more than 18.5
    capsys.readouterr()
    cmp = compare(base, cand, watch_deviation=18.5)
    assert row(cmp, CELL, DEV).verdict == INFO


def test_the_value_is_the_median_of_the_runs(tmp_path):
    base = runs()
    for i, rec in enumerate(base):  # 3 runs of each cell, in rounds: run k of every cell, then run k + 1
        rec["predicted"]["step_time_s"] = 0.1
        rec["predicted"]["step_time_deviation"] = (0.30, 0.10, 0.20)[i // len(cells())]
    cmp = compare(base, base)
    r = row(cmp, CELL, DEV)
    assert (r.baseline, r.candidate, r.n_baseline, r.verdict) == (0.20, 0.20, 3, INFO)


def test_no_prediction_is_na_with_its_reason_and_never_fails(tmp_path, capsys):
    why = "the local profile has no achievable fp32 matmul rate; run `harness calibrate --cluster local`"
    base = with_deviation(cells(), {"ddp/fp32": None}, why=why)
    cand = with_deviation(cells(), {"ddp/fp32": 0.40})
    cmp = compare(base, cand, watch_deviation=0.0)
    r = row(cmp, CELL, DEV)
    assert r.verdict == NA and r.note == f"null in baseline ({why})"
    assert not cmp.has_regression
    assert row(compare(cand, cand, watch_deviation=0.0), CELL, DEV).verdict == INFO  # unchanged: 0 points


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("--watch-deviation", "-1"), "--watch-deviation: -1.0 is not a number of percentage points >= 0"),
        (("--watch-deviation", "nan"), "--watch-deviation: nan is not a number of percentage points >= 0"),
        (("--watch-deviation", "5", "--metric", "exact"), f"leave out {DEV}: add --metric {DEV}"),
        (("--threshold", f"{DEV}=0.1"), f"{DEV} is information and takes no threshold; --watch-deviation PCT"),
    ],
)
def test_bad_watch_options_exit_2_naming_the_option(tmp_path, capsys, args, message):
    assert run_pair(tmp_path, cells(), cells(), *args) == 2
    assert message in capsys.readouterr().err


def test_the_api_refuses_a_bad_value():
    with pytest.raises(InputError, match="is not a number of percentage points"):
        compare(cells().values(), cells().values(), watch_deviation=-0.5)
    cmp = compare(with_deviation(cells(), {}), with_deviation(cells(), {"ddp/fp32": 0.5}), watch_deviation=0)
    assert row(cmp, CELL, DEV).verdict == REGRESSION  # 45 points > 0
