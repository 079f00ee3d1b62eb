"""`harness history add|show|check` end to end: exit codes 0/1/2, the evidence named, both back ends."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import numpy as np
import pytest
from scipy.stats import norm

from harness.cli import main
from harness.history.store import SCHEMA_VERSION
from tests.history.conftest import make_record, write_night

CELLS = ("ddp", "zero2", "fsdp.full_shard")
NOISE = 0.03
"""run-to-run σ of the synthetic nights (3%)"""
_Z = np.random.default_rng(0).permutation(norm.ppf((np.arange(40) + 0.5) / 40))
"""noise of exactly σ 1 (evenly spaced quantiles, shuffled): no extreme draw to make a test flaky"""


def step_time(cell: int, night: int) -> float:
    return 0.02 * (1 + 0.1 * cell) * float(np.exp(NOISE * _Z[(night + 7 * cell) % len(_Z)]))


def night_dir(tmp_path: Path, night: int, *, slow: dict[str, float] | None = None, **overrides) -> Path:
    """One night's results: every cell at its usual time, `slow` cells times a factor."""
    recs = []
    for i, s in enumerate(CELLS):
        kw = dict(strategy=s, night=night, step_s=step_time(i, night) * (slow or {}).get(s, 1.0))
        kw.update(overrides.get(s, {}))
        recs.append(make_record(**kw))
    return write_night(tmp_path / f"night{night:02d}", recs)


@pytest.fixture
def history(tmp_path, capsys) -> str:
    """A SQLite history of 10 quiet nights, each added with the label `commit-<night>`."""
    db = str(tmp_path / "h.db")
    for night in range(10):
        assert main(["history", "add", "--db", db, str(night_dir(tmp_path, night)), "--label", f"commit-{night}"]) == 0
    capsys.readouterr()
    return db


def test_add_reports_what_it_stored_and_twice_changes_nothing(tmp_path, capsys):
    db = str(tmp_path / "h.db")
    night = night_dir(tmp_path, 0)
    assert main(["history", "add", "--db", db, str(night), "--label", "abc"]) == 0
    assert capsys.readouterr().out == f"added 3 run(s) of 3 cell(s) to {db}; 3 new cell(s); label 'abc'\n"
    assert main(["history", "add", "--db", db, str(night)]) == 0
    assert capsys.readouterr().out == f"added 0 run(s) of 3 cell(s) to {db} (3 already there)\n"


def test_a_quiet_night_exits_0(history, tmp_path, capsys):
    code = main(["history", "check", "--db", history, str(night_dir(tmp_path, 10))])
    out = capsys.readouterr().out
    assert code == 0, out
    assert "no metric left its noise band" in out
    assert out.rstrip().endswith("→ exit 0")


def test_a_slow_cell_exits_1_naming_it_with_the_evidence(history, tmp_path, capsys):
    code = main(["history", "check", "--db", history, str(night_dir(tmp_path, 10, slow={"zero2": 1.3}))])
    out = capsys.readouterr().out
    assert code == 1, out
    evidence = [line.strip() for line in out.split("evidence:")[1].split("\n\n")[0].splitlines() if line.strip()]
    assert {e.split(":")[0] for e in evidence} == {
        f"tiny zero2 fp32 g2 {m}" for m in ("step_time_s", "tokens_per_s", "tokens_per_s_per_gpu", "tflops_per_gpu")
    }
    line = next(e for e in evidence if e.startswith("tiny zero2 fp32 g2 step_time_s"))
    assert "vs history median" in line and "noise σ" in line and "over 10 runs" in line
    assert "against a margin of" in line and "out of band: tonight" in line
    assert "ddp" not in out.split("evidence:")[1] and "fsdp" not in out.split("evidence:")[1]


def test_a_regression_added_to_the_history_is_attributed_to_its_night_and_label(history, tmp_path, capsys):
    """The slowdown lands on night 10 (added with its label); night 11 is judged: still a regression, attributed
    to night 10, its label and the commit that changed there."""
    slow = {"zero2": 1.3}
    assert main(["history", "add", "--db", history, str(night_dir(tmp_path, 10, slow=slow)), "--label", "bad"]) == 0
    capsys.readouterr()
    assert main(["history", "check", "--db", history, str(night_dir(tmp_path, 11, slow=slow)), "--format", "json"]) == 1
    doc = json.loads(capsys.readouterr().out)
    assert doc["exit_code"] == 1
    (cell,) = [c for c in doc["cells"] if any(m["verdict"] == "regression" for m in c["metrics"])]
    assert cell["label"] == "tiny zero2 fp32 g2"
    row = next(m for m in cell["metrics"] if m["metric"] == "step_time_s")
    cp = row["change_point"]
    # two runs after it: too few for the permutation test to be significant; the sustained-shift rule names it
    assert (row["verdict"], row["cause"]) == ("regression", "sustained shift")
    assert (cp["nights_ago"], cp["label"], cp["harness_sha"]) == (1, "bad", "sha0010")
    assert cp["changes"] == ["harness_sha: sha0009 → sha0010"]
    assert cp["after"] / cp["before"] == pytest.approx(1.3, rel=0.1)


def test_a_newly_failing_cell_exits_1(history, tmp_path, capsys):
    code = main(["history", "check", "--db", history, str(night_dir(tmp_path, 10, ddp={"status": "oom"}))])
    out = capsys.readouterr().out
    assert code == 1
    assert "newly failing (regression) (1):\n  tiny ddp fp32 g2: ok in the history → oom tonight" in out


def test_one_more_collective_byte_is_a_regression(history, tmp_path, capsys):
    base = make_record()["comm"]["bytes_per_step"]
    code = main(["history", "check", "--db", history, str(night_dir(tmp_path, 10, ddp={"comm_bytes": base + 1}))])
    out = capsys.readouterr().out
    assert code == 1
    assert f"tiny ddp fp32 g2 comm.bytes_per_step: {int(base + 1):,} B (was {int(base):,} B;" in out


def test_too_little_history_reports_but_never_fails(tmp_path, capsys):
    db = str(tmp_path / "h.db")
    for night in range(4):
        assert main(["history", "add", "--db", db, str(night_dir(tmp_path, night))]) == 0
    capsys.readouterr()
    assert main(["history", "check", "--db", db, str(night_dir(tmp_path, 4, slow={"zero2": 2.0}))]) == 0
    out = capsys.readouterr().out
    assert "too little history (reported, never failing) (3):" in out
    assert "tiny zero2 fp32 g2: 4 history value(s)" in out


def test_a_slow_injected_cell_meets_its_own_history(history, tmp_path, capsys):
    """inject: {fault: slow} is left out of the cell's identity: the slowed run is judged against the cell."""
    night = night_dir(tmp_path, 10, slow={"zero2": 1.3}, zero2={"inject": {"fault": "slow", "factor": 1.3}})
    assert main(["history", "check", "--db", history, str(night)]) == 1
    assert "tiny zero2 fp32 g2 step_time_s" in capsys.readouterr().out


def test_show_prints_each_series_with_its_change_point(history, tmp_path, capsys):
    for night in (10, 11, 12):
        night_dir(tmp_path, night, slow={"zero2": 1.5})
        assert main(["history", "add", "--db", history, str(tmp_path / f"night{night}"), "--label", f"c{night}"]) == 0
    capsys.readouterr()
    assert main(["history", "show", "--db", history, "--cell", "zero2", "--format", "json"]) == 0
    (series,) = json.loads(capsys.readouterr().out)["series"]
    assert series["label"] == "tiny zero2 fp32 g2"
    assert [r["label"] for r in series["runs"]] == [f"commit-{n}" for n in range(10)] + ["c10", "c11", "c12"]
    (cp,) = series["change_points"]["step_time_s"]
    assert (cp["index"], cp["label"]) == (10, "c10")
    assert main(["history", "show", "--db", history, "--cell", "zero2"]) == 0
    table = capsys.readouterr().out
    assert table.count("◆ step time shifted") == 1
    assert "c10" in next(line for line in table.splitlines() if "◆" in line)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["history", "check", "--db", "{tmp}/absent.db", "{night}"], "no such history database"),
        (["history", "show", "--db", "{tmp}/absent.db"], "no such history database"),
        (["history", "add", "--db", "/proc/harness-history.db", "{night}"], "cannot open or create"),
        (["history", "add", "--db", "{tmp}/no/such/dir/h.db", "{night}"], "no such directory"),
        (["history", "add", "--db", "mysql://u:secret@host/db", "{night}"], "unknown scheme 'mysql'"),
        (["history", "add", "--db", "{tmp}/h.db", "{tmp}/no-results"], "no such file or directory"),
        (["history", "check", "--db", "{tmp}/h.db", "{night}", "--format", "github-benchmark"], "--direction"),
        (["history", "check", "--db", "{tmp}/h.db", "{night}", "--threshold", "mfu=x"], "METRIC=FRACTION"),
    ],
)
def test_bad_input_exits_2_with_one_line(tmp_path, capsys, argv, message):
    night = night_dir(tmp_path, 0)
    assert main(["history", "add", "--db", str(tmp_path / "h.db"), str(night)]) == 0
    capsys.readouterr()
    code = main([a.format(tmp=tmp_path, night=night) for a in argv])
    err = capsys.readouterr().err
    assert code == 2
    assert message in err
    assert "Traceback" not in err and "secret" not in err
    # one line saying what is wrong (a usage error has click's usage lines above it)
    assert [line for line in err.splitlines() if line.lower().startswith("error")] == [err.strip().splitlines()[-1]]


def test_a_history_from_a_newer_harness_exits_2(history, tmp_path, capsys):
    conn = sqlite3.connect(history)
    with conn:
        conn.execute("UPDATE schema_version SET version = ?", (SCHEMA_VERSION + 1,))
    conn.close()
    assert main(["history", "check", "--db", history, str(night_dir(tmp_path, 10))]) == 2
    assert f"history schema version {SCHEMA_VERSION + 1} is newer" in capsys.readouterr().err


def test_github_benchmark_entries_carry_the_noise(history, tmp_path, capsys):
    code = main(
        ["history", "check", "--db", history, str(night_dir(tmp_path, 10)), "--format", "github-benchmark"]
        + ["--direction", "smaller"]
    )
    assert code == 0
    entries = json.loads(capsys.readouterr().out)
    names = {e["name"].split(" ", 1)[1] for e in entries}
    assert names == {"step_time_s", "peak_memory_allocated_gib", "comm.bytes_per_step"}
    step = next(e for e in entries if e["name"].endswith("step_time_s") and "zero2" in e["name"])
    assert step["unit"] == "s" and step["range"].startswith("± ") and "unchanged" in step["extra"]


def test_markdown_names_the_regression(history, tmp_path, capsys):
    code = main(
        ["history", "check", "--db", history, str(night_dir(tmp_path, 10, slow={"ddp": 1.4})), "--format", "md"]
    )
    out = capsys.readouterr().out
    assert code == 1
    assert out.startswith("## Benchmark history check: 🔴 1 cell(s) regressed")  # one cell, 4 metrics
    assert "### Evidence" in out and "- tiny ddp fp32 g2 step_time_s: " in out


def test_the_same_judgement_on_postgresql(pg_url, tmp_path, capsys):
    for night in range(10):
        assert main(["history", "add", "--db", pg_url, str(night_dir(tmp_path, night))]) == 0
    assert main(["history", "check", "--db", pg_url, str(night_dir(tmp_path, 10))]) == 0
    assert main(["history", "check", "--db", pg_url, str(night_dir(tmp_path, 10, slow={"zero2": 1.3}))]) == 1
    assert "tiny zero2 fp32 g2 step_time_s" in capsys.readouterr().out
