"""A history written by the old harness (commit ccc26b6, before typed rows and automatic metric columns) read and
written by today's: `history show` and `history check` print what the old harness printed, byte for byte, and
`history add` takes tonight's runs — with a metric the old database has no column for, added on the way — keeping
every stored run as it was. tests/history/legacy.py says what the nights hold; tests/fixtures/history/
make_v2_ccc26b6.py wrote the database and the expected outputs with the old harness."""

from __future__ import annotations

import json
import shutil
import sqlite3
from pathlib import Path

import pytest

from harness.cli import main
from harness.compare.metrics import THRESHOLDED, Metric
from harness.history import keys
from harness.history.store import SCHEMA_VERSION, open_store
from tests.history.legacy import CELLS, EXPECTED, FIXTURE, NIGHTS, OUTPUTS, night_record, tonight_dir

JOULES = Metric("joules_per_step", ("metrics", "joules_per_step"), "J", True, THRESHOLDED)
"""a metric the old harness never stored: energy per step (a record field that does not exist yet)"""


@pytest.fixture
def old_db(tmp_path: Path) -> Path:
    """A copy of the old harness' history (the fixture itself is never opened: a writer would change it)."""
    db = tmp_path / "history.sqlite"
    shutil.copyfile(FIXTURE, db)
    return db


def run(argv: list[str], capsys) -> str:
    """`harness ARGV` in process: 'exit N' and its stdout, as the expected files hold them."""
    code = main(argv)
    return f"exit {code}\n{capsys.readouterr().out}"


def normalised(text: str, *, db: Path, tonight: Path) -> str:
    return text.replace(str(db), "<db>").replace(str(tonight), "<tonight>")


def test_the_fixture_is_what_the_old_harness_wrote():
    conn = sqlite3.connect(f"file:{FIXTURE}?mode=ro&immutable=1", uri=True)  # NOTE: no -wal/-shm beside it
    try:
        assert conn.execute("SELECT version FROM schema_version").fetchall() == [(2,)]
        assert conn.execute("SELECT count(*) FROM runs").fetchone() == (NIGHTS * len(CELLS),)
        columns = [r[1] for r in conn.execute("PRAGMA table_info(runs)")]
    finally:
        conn.close()
    assert "joules_per_step" not in columns and "predicted_step_time_deviation" in columns


@pytest.mark.parametrize("name", sorted(OUTPUTS))
def test_show_and_check_print_what_the_old_harness_printed(name, old_db, tmp_path, capsys):
    tonight = tonight_dir(tmp_path)
    argv = [a.format(db=old_db, tonight=tonight) for a in OUTPUTS[name]]
    got = normalised(run(argv, capsys), db=old_db, tonight=tonight)
    assert got == (EXPECTED / name).read_text()
    assert old_db.read_bytes() == FIXTURE.read_bytes()  # show and check never write


def test_add_takes_tonight_and_a_new_metric_keeping_every_old_run(old_db, tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(keys, "HISTORY_METRICS", (*keys.HISTORY_METRICS, JOULES))
    tonight = tonight_dir(tmp_path)
    for path in sorted((tonight / "legacy").glob("*.json")):
        rec = json.loads(path.read_text())
        if rec["status"] == "ok":
            rec["metrics"]["joules_per_step"] = 41.5
            path.write_text(json.dumps(rec))
    with open_store(str(old_db)) as store:
        before = store.counts()
        assert "joules_per_step" not in store.columns  # read as it is: the metric reads null

    assert run(["history", "add", "--db", str(old_db), str(tonight), "--label", "tonight"], capsys) == (
        f"exit 0\nadded {len(CELLS)} run(s) of {len(CELLS)} cell(s) to {old_db}; label 'tonight'\n"
    )
    with open_store(str(old_db)) as store:
        after = store.counts()
        assert store.version == SCHEMA_VERSION
        assert store.columns["joules_per_step"] == "joules_per_step"
        assert [m.name for m in store.metrics()][-1] == "joules_per_step"
    assert after["runs"] == before["runs"] + len(CELLS) and after["cells"] == before["cells"]
    assert after["values"] == before["values"] + sum(
        1 + sum(v is not None for v in _values(night_record(c, NIGHTS))) for c in range(len(CELLS))
    )

    # every old run reads as the old harness showed it, null in the new column; tonight's carry the metric
    shown = json.loads(run(["history", "show", "--db", str(old_db), "--format", "json"], capsys).split("\n", 1)[1])
    expected = json.loads((EXPECTED / "show.json").read_text().split("\n", 1)[1])
    for series, old in zip(shown["series"], expected["series"], strict=True):
        assert series["runs"][:NIGHTS] == old["runs"]
        assert series["runs"][NIGHTS]["values"]["joules_per_step"] == 41.5
        assert series["runs"][NIGHTS]["label"] == "tonight"


def _values(rec: dict) -> list[float | None]:
    """The values today's harness stores of a record (before the new metric), for counting."""
    return list(keys.run_values(rec).values()) if rec["status"] == "ok" else []
