"""The history and the time model's deviation (issue 16): each run stores `predicted.step_time_deviation`
(measured median / predicted − 1; schema version 2), `history show` lists it with its change points, and
`history check` reports a shift of it as information — failing only with `--watch-deviation PCT`. A database of
schema version 1 is read as it is by `show` and `check` and migrated by `add`, keeping its runs. Both back ends.

The records are the history tests' records with a prediction written in: the step time stays put and the
prediction moves (a new calibration, say), so only the deviation shifts."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from harness.cli import main
from harness.compare.metrics import DEVIATION
from harness.history.show import show_series
from harness.history.store import SCHEMA_VERSION, open_store
from tests.history.conftest import make_record, write_night

STEP_S = 0.02
JITTER = (0.0, 0.01, -0.01, 0.005, -0.005, 0.0, 0.01, -0.01, 0.005, -0.005)
"""night-to-night wobble of the deviation (points as fractions): a noise σ of about 1 point"""
JITTER_LATER = (0.005, -0.01, 0.0, 0.01, -0.005, 0.005, 0.0, -0.01, 0.01, -0.005)
"""the same wobble in another order, for the nights after a shift (a repeat of JITTER makes permutations of the
two halves tie with the observed split)"""
LABEL = "tiny ddp fp32 g2"


def night(tmp_path: Path, n: int, deviation: float | None) -> Path:
    """One night of the ddp cell (and zero2 with no prediction): step time 20 ms, the ddp cell's deviation as
    given (None: no prediction, with its reason)."""
    recs = []
    for strategy, dev in (("ddp", deviation), ("zero2", None)):
        rec = make_record(strategy=strategy, night=n, step_s=STEP_S)
        pred = rec["predicted"]
        pred.pop("step_time_deviation", None)
        if dev is None:
            pred["step_time_s"] = None
            pred["time_null_reasons"] = {"step_time_s": "the local profile has no achievable fp32 matmul rate"}
        else:
            pred["step_time_s"] = STEP_S / (1 + dev)
            pred["step_time_deviation"] = dev
        recs.append(rec)
    return write_night(tmp_path / f"night{n:02d}", recs)


def add(db: str, path: Path, capsys) -> None:
    assert main(["history", "add", "--db", db, str(path), "--label", path.name]) == 0
    capsys.readouterr()


@pytest.fixture
def ten_nights(db_url, tmp_path, capsys) -> str:
    """10 nights of the ddp cell with the model 10% optimistic (deviation +0.10 ± 1 point)."""
    for n in range(10):
        add(db_url, night(tmp_path, n, 0.10 + JITTER[n]), capsys)
    return db_url


def dev_row(doc: dict, label: str = LABEL) -> dict:
    (cell,) = [c for c in doc["cells"] if c["label"] == label]
    return next(m for m in cell["metrics"] if m["metric"] == DEVIATION)


def test_a_shift_of_the_deviation_is_information_with_its_size(ten_nights, tmp_path, capsys):
    tonight = night(tmp_path, 10, 0.40)  # the model is now 40% optimistic: +30 points
    assert main(["history", "check", "--db", ten_nights, str(tonight), "--format", "json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    row = dev_row(doc)
    assert row["verdict"] == "shifted" and row["cause"] == "out of band"
    assert row["value"] == 0.40 and row["reference"] == pytest.approx(0.10)
    assert row["change"] == pytest.approx(0.30)  # value − level, in points (a fraction)
    assert row["note"] == "|deviation| grew by 30.0 points"
    assert doc["summary"]["deviation_shifts"] == 1 and doc["summary"]["regressions"] == 0
    step = next(m for c in doc["cells"] if c["label"] == LABEL for m in c["metrics"] if m["metric"] == "step_time_s")
    assert step["verdict"] == "unchanged"  # the machine did not change: the model did
    assert dev_row(doc, "tiny zero2 fp32 g2")["verdict"] == "n/a"  # no prediction

    assert main(["history", "check", "--db", ten_nights, str(tonight)]) == 0
    out = capsys.readouterr().out
    assert "time-model deviation shifted (information; --watch-deviation PCT fails" in out
    assert f"{LABEL} {DEVIATION}: 40.00% vs history median 10.00% (+30.0 pt; |deviation| grew by 30.0 points)" in out
    assert "1 time-model deviation shift(s) (information) → exit 0" in out


def test_watch_deviation_fails_naming_the_cell(ten_nights, tmp_path, capsys):
    tonight = night(tmp_path, 10, 0.40)
    assert main(["history", "check", "--db", ten_nights, str(tonight), "--watch-deviation", "20"]) == 1
    out = capsys.readouterr().out
    assert f"{LABEL} {DEVIATION}: 40.00% vs history median 10.00% (+30.0 pt; |deviation| grew by 30.0 points > " in out
    assert "1 cell(s) regressed (1 metric(s), 0 newly failing)" in out and "→ exit 1" in out
    assert main(["history", "check", "--db", ten_nights, str(tonight), "--watch-deviation", "35"]) == 0
    capsys.readouterr()
    # the model got better (deviation +0.10 → −0.02): a shift, |deviation| shrank — never a regression
    better = night(tmp_path, 11, -0.02)
    assert (
        main(["history", "check", "--db", ten_nights, str(better), "--watch-deviation", "0", "--format", "json"]) == 0
    )
    row = dev_row(json.loads(capsys.readouterr().out))
    assert row["verdict"] == "shifted" and row["note"] == "|deviation| shrank by 8.0 points (<= --watch-deviation 0)"


def test_a_bad_watch_value_exits_2(ten_nights, tmp_path, capsys):
    assert main(["history", "check", "--db", ten_nights, str(night(tmp_path, 10, 0.1)), "--watch-deviation", "-3"]) == 2
    assert "--watch-deviation: -3.0 is not a number of percentage points >= 0" in capsys.readouterr().err


def test_show_lists_it_and_its_change_point(ten_nights, tmp_path, capsys):
    # NOTE: 8 nights after the shift: with 10 + 10 one of the 199 seeded shuffles ties the observed split to the
    # last bit, and the smallest p the test can give (1/200) is its alpha (0.005)
    for n in range(10, 18):
        add(ten_nights, night(tmp_path, n, 0.40 + JITTER_LATER[n - 10]), capsys)
    with open_store(ten_nights) as store:
        (series,) = [s for s in show_series(store, cell_filter="ddp", last=None)]
    assert [r["values"][DEVIATION] for r in series["runs"]] == pytest.approx(
        [0.10 + j for j in JITTER] + [0.40 + j for j in JITTER_LATER[:8]]
    )
    (cp,) = series["change_points"][DEVIATION]
    assert cp["index"] == 10 and cp["label"] == "night10"
    assert cp["before"] == pytest.approx(0.10, abs=0.006) and cp["after"] == pytest.approx(0.40, abs=0.006)
    assert "step_time_s" not in series["change_points"]  # the step time never moved

    assert main(["history", "show", "--db", ten_nights, "--cell", "ddp"]) == 0
    out = capsys.readouterr().out
    assert "model deviation" in out and "40.50%" in out
    assert "◇ model deviation shifted +10.0% → +40.0%" in out


def _downgrade_to_v1(db: str) -> None:
    """The database as schema version 1 wrote it: no deviation column, no metrics row for it."""
    with open_store(db, create=True) as store:
        with store.transaction():
            store.execute("ALTER TABLE runs DROP COLUMN predicted_step_time_deviation")
            store.execute("DELETE FROM metrics WHERE name = ?", (DEVIATION,))
            store.execute("UPDATE schema_version SET version = 1")


def _version(db: str) -> int:
    with open_store(db) as store:
        return int(store.execute("SELECT version FROM schema_version").fetchone()[0])


def test_a_version_1_database_is_read_as_it_is_and_migrated_by_add(ten_nights, tmp_path, capsys):
    assert SCHEMA_VERSION == 2
    _downgrade_to_v1(ten_nights)
    assert _version(ten_nights) == 1
    with open_store(ten_nights) as store:
        before = store.counts()
    assert before["runs"] == 20  # 10 nights × 2 cells
    per_run = before["values"] // 20
    assert before["values"] == 20 * per_run == 160  # 8 non-null values a run (CPU: no MFU, no reserved memory)

    # show and check never write: they read version 1 as it is, the deviation absent
    assert main(["history", "show", "--db", ten_nights, "--cell", "ddp", "--format", "json"]) == 0
    (series,) = json.loads(capsys.readouterr().out)["series"]
    assert len(series["runs"]) == 10 and not any(DEVIATION in r["values"] for r in series["runs"])
    assert main(["history", "check", "--db", ten_nights, str(night(tmp_path, 10, 0.40)), "--format", "json"]) == 0
    row = dev_row(json.loads(capsys.readouterr().out))
    assert row["verdict"] == "insufficient history" and row["n_history"] == 0
    assert _version(ten_nights) == 1

    # add migrates, in its transaction, and keeps every run
    add(ten_nights, night(tmp_path, 10, 0.40), capsys)
    assert _version(ten_nights) == 2
    with open_store(ten_nights) as store:
        after = store.counts()
        names = [r[0] for r in store.execute("SELECT name FROM metrics ORDER BY id").fetchall()]
        (cell,) = [c for c in store.cells() if c.label == LABEL]
        runs = store.runs_of(cell.id)
    assert after["runs"] == 22 and after["cells"] == before["cells"] and after["batches"] == before["batches"] + 1
    assert after["values"] == before["values"] + 2 * per_run + 1  # as before, and tonight's deviation
    assert names[-1] == DEVIATION
    assert [DEVIATION in r.values for r in runs] == [False] * 10 + [True]
    assert [r.values["step_time_s"] for r in runs] == [STEP_S] * 11  # the old runs' values are as they were
    assert runs[-1].values[DEVIATION] == 0.40
    add(ten_nights, night(tmp_path, 11, 0.41), capsys)  # a migrated database takes adds as any other
    assert _version(ten_nights) == 2
