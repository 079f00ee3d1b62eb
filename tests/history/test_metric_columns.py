"""A metric is added in one place: appended to harness.history.keys.HISTORY_METRICS (here by monkeypatch, nothing
else changed), `history add` stores it — a new database with its column, an existing one gaining the column in
the add's transaction — and `history show` and `history check` show and judge it. Both back ends."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from harness.cli import main
from harness.compare.metrics import THRESHOLDED, Metric
from harness.history import keys
from harness.history.rows import MACHINE_COLUMNS, RUN_COLUMNS, SOFTWARE_COLUMNS, registry_columns
from harness.history.store import SCHEMA_VERSION, open_store
from tests.history.conftest import make_record, write_night

JOULES = Metric("joules_per_step", ("metrics", "joules_per_step"), "J", True, THRESHOLDED)
"""energy per step: a record field no harness writes yet"""
LABEL = "tiny ddp fp32 g2"


def night(tmp_path: Path, n: int, *, joules: float | None) -> Path:
    rec = make_record(night=n, step_s=0.02)
    if joules is not None:
        rec["metrics"]["joules_per_step"] = joules
    return write_night(tmp_path / f"night{n:02d}", [rec])


def cli(argv: list[str], capsys) -> tuple[int, str]:
    code = main(argv)
    return code, capsys.readouterr().out


def test_a_metric_appended_to_the_registry_is_stored_shown_and_judged(db_url, tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(keys, "HISTORY_METRICS", (*keys.HISTORY_METRICS, JOULES))
    for n in range(6):
        assert cli(["history", "add", "--db", db_url, str(night(tmp_path, n, joules=40.0 + n % 2))], capsys)[0] == 0
    with open_store(db_url) as store:
        assert store.columns["joules_per_step"] == "joules_per_step"
        (cell,) = store.cells()
        assert [r.values["joules_per_step"] for r in store.runs_of(cell.id)] == [40.0, 41.0] * 3

    code, out = cli(["history", "show", "--db", db_url, "--format", "json"], capsys)
    assert code == 0
    (series,) = json.loads(out)["series"]
    assert [r["values"]["joules_per_step"] for r in series["runs"]] == [40.0, 41.0] * 3

    code, out = cli(
        ["history", "check", "--db", db_url, str(night(tmp_path, 6, joules=60.0)), "--format", "json"], capsys
    )
    assert code == 1  # 60 J against 40-41 J: beyond the 5% threshold and the noise band
    (cell_json,) = json.loads(out)["cells"]
    row = next(m for m in cell_json["metrics"] if m["metric"] == "joules_per_step")
    assert (row["verdict"], row["cause"], row["unit"], row["value"], row["n_history"]) == (
        "regression",
        "out of band",
        "J",
        60.0,
        6,
    )
    code, out = cli(["history", "check", "--db", db_url, str(night(tmp_path, 6, joules=60.0))], capsys)
    assert code == 1 and f"{LABEL} joules_per_step: 60 J vs history median 40.5 J (+48.2%)" in out


def test_an_existing_history_gains_the_column_when_added_to(db_url, tmp_path, capsys, monkeypatch):
    for n in range(3):
        assert cli(["history", "add", "--db", db_url, str(night(tmp_path, n, joules=40.0))], capsys)[0] == 0
    with open_store(db_url) as store:
        before = store.counts()
        assert "joules_per_step" not in store.runs_columns()

    monkeypatch.setattr(keys, "HISTORY_METRICS", (*keys.HISTORY_METRICS, JOULES))
    with open_store(db_url) as store:  # read, not written: the metric reads null, no column is added
        assert "joules_per_step" not in store.columns and "joules_per_step" not in store.runs_columns()
        (cell,) = store.cells()
        assert all("joules_per_step" not in r.values for r in store.runs_of(cell.id))
    code, out = cli(
        ["history", "check", "--db", db_url, str(night(tmp_path, 3, joules=40.0)), "--format", "json"], capsys
    )
    assert code == 0
    row = next(m for m in json.loads(out)["cells"][0]["metrics"] if m["metric"] == "joules_per_step")
    assert (row["verdict"], row["n_history"]) == ("insufficient history", 0)

    assert cli(["history", "add", "--db", db_url, str(night(tmp_path, 3, joules=42.0))], capsys)[0] == 0
    with open_store(db_url) as store:
        after = store.counts()
        assert store.version == SCHEMA_VERSION
        assert [m.name for m in store.metrics()][-1] == "joules_per_step"
        (cell,) = store.cells()
        assert [r.values.get("joules_per_step") for r in store.runs_of(cell.id)] == [None, None, None, 42.0]
    per_run = before["values"] // 3
    assert after["values"] == before["values"] + per_run + 1  # the old runs' values as they were, tonight's + 1


def test_the_tables_are_the_row_types(db_url):
    """Each table's columns are its row type's fields (harness.history.rows), the metric columns the registry's."""
    with open_store(db_url, create=True) as store:
        assert sorted(store.runs_columns()) == sorted({"id", *RUN_COLUMNS, *registry_columns().values()})
        for table, columns in (("machines", MACHINE_COLUMNS), ("software", SOFTWARE_COLUMNS)):
            got = store.execute(f"SELECT * FROM {table}").description
            assert [d[0] for d in got] == ["id", "key", *columns]
        assert [m.name for m in store.metrics()] == [m.name for m in keys.HISTORY_METRICS]
    assert MACHINE_COLUMNS == keys.MACHINE_FIELDS and SOFTWARE_COLUMNS == keys.SOFTWARE_FIELDS


def test_a_metric_whose_name_makes_no_column_is_a_harness_bug(monkeypatch, tmp_path):
    monkeypatch.setattr(
        keys, "HISTORY_METRICS", (*keys.HISTORY_METRICS, Metric("bad name", ("x",), "", True, "sampled"))
    )
    with pytest.raises(RuntimeError, match="'bad name'"):
        open_store(str(tmp_path / "h.db"), create=True)
