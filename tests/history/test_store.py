"""harness.history.store on SQLite and on a real PostgreSQL server: round trip, idempotent and atomic adds, the
versioned schema, and concurrent SQLite writers in separate processes."""

from __future__ import annotations

import multiprocessing
import sqlite3
from pathlib import Path

import pytest

from harness.core.errors import InputError
from harness.history import store as store_module
from harness.history.keys import entry_of
from harness.history.store import SCHEMA_VERSION, HistoryStore, open_store
from tests.history.conftest import make_record


def nights(n: int, *, cells: tuple[str, ...] = ("ddp", "zero2"), first: int = 0) -> list[dict]:
    return [make_record(strategy=s, night=first + k, step_s=0.02 + 0.001 * k) for k in range(n) for s in cells]


def test_round_trip_keeps_every_field(db_url):
    recs = nights(3) + [make_record(strategy="zero3", night=2, status="oom")]
    with open_store(db_url, create=True) as store:
        result = store.add([entry_of(r) for r in recs], label="abc123", source="results/x")
        assert (result.added, result.already, result.new_cells) == (7, 0, 3)
        cells = {c.label: c for c in store.cells()}
        assert set(cells) == {"tiny ddp fp32 g2", "tiny zero2 fp32 g2", "tiny zero3 fp32 g2"}
        runs = store.runs_of(cells["tiny ddp fp32 g2"].id)
        assert [r.values["step_time_s"] for r in runs] == [0.02, 0.021, 0.022]
        assert [r.status for r in runs] == ["ok"] * 3
        r0 = runs[0]
        rec0 = recs[0]
        assert r0.label == "abc123"
        assert r0.values["tokens_per_s"] == pytest.approx(rec0["metrics"]["tokens_per_s"], rel=1e-15)
        assert r0.values["comm.bytes_per_step"] == rec0["comm"]["bytes_per_step"]
        assert r0.values["predicted.memory_gib.total"] == rec0["predicted"]["memory_gib"]["total"]
        assert "mfu" not in r0.values  # null on CPU: not stored
        assert r0.software.as_dict() == {
            "python": rec0["env"]["python"],
            "torch": rec0["env"]["torch"],
            "cuda": None,
            "nccl": None,
            "deepspeed": rec0["env"]["deepspeed"],
            "harness_sha": "sha0000",
        }
        assert r0.machine.as_dict() == {
            "cluster": "local",
            "device_type": "cpu",
            "device_name": "cpu",
            "device_count": None,
            "driver": None,
        }
        failed = store.runs_of(cells["tiny zero3 fp32 g2"].id)
        assert [(r.status, r.values) for r in failed] == [("oom", {})]
        assert store.counts()["runs"] == 7


def test_adding_the_same_records_twice_changes_nothing(db_url):
    entries = [entry_of(r) for r in nights(4)]
    with open_store(db_url, create=True) as store:
        first = store.add(entries, label="one", source="a")
        before = store.counts()
        second = store.add(entries, label="two", source="b")
        assert (first.added, second.added, second.already, second.batch) == (8, 0, 8, None)
        assert store.counts() == before  # no new batch, run or value
        # a later night beside the old ones: only it is added
        third = store.add(entries + [entry_of(r) for r in nights(1, first=4)], label="three", source="c")
        assert (third.added, third.already) == (2, 8)


def test_a_failure_mid_add_stores_nothing(db_url, monkeypatch):
    with open_store(db_url, create=True) as store:
        store.add([entry_of(r) for r in nights(1)], label=None, source="before")
        before = store.counts()
        calls = []

        def failing_insert(self: HistoryStore, rows: list) -> None:
            calls.append(len(rows))
            if len(calls) == 3:
                raise RuntimeError("disk gone (injected)")
            original(self, rows)

        original = HistoryStore._insert_runs
        monkeypatch.setattr(HistoryStore, "_insert_runs", failing_insert)
        monkeypatch.setattr(store_module, "_CHUNK", 2)  # runs go in 2 at a time: the 3rd insert fails
        recs = nights(3, first=1, cells=("ddp", "zero2", "fsdp.full_shard"))
        with pytest.raises(RuntimeError, match="injected"):
            store.add([entry_of(r) for r in recs], label="x", source="torn")
        assert calls == [2, 2, 2]  # it failed after 4 of the 9 runs were written
        assert store.counts() == before  # …and none of them (nor the batch, the new cell) remains
    with open_store(db_url) as again:  # a fresh connection sees the same
        assert again.counts() == before


def test_a_newer_schema_is_refused_with_a_clear_error(db_url):
    with open_store(db_url, create=True) as store:
        store.execute("UPDATE schema_version SET version = ?", (SCHEMA_VERSION + 1,))
    for create in (False, True):
        with pytest.raises(
            InputError, match=rf"history schema version {SCHEMA_VERSION + 1} is newer than this harness reads"
        ):
            open_store(db_url, create=create)


def test_sqlite_history_is_one_wal_file(tmp_path):
    db = tmp_path / "h.db"
    with open_store(str(db), create=True) as store:
        store.add([entry_of(r) for r in nights(2)], label=None, source="x")
    conn = sqlite3.connect(db)
    assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert conn.execute("SELECT version FROM schema_version").fetchall() == [(SCHEMA_VERSION,)]


def test_what_is_not_a_history_is_refused(tmp_path):
    junk = tmp_path / "junk.db"
    junk.write_text("not a database at all\n" * 100)
    with pytest.raises(InputError, match="not a SQLite database"):
        open_store(str(junk))
    other = tmp_path / "other.db"
    sqlite3.connect(other).execute("CREATE TABLE t (x)")
    with pytest.raises(InputError, match="without a harness history"):
        open_store(str(other))
    with pytest.raises(InputError, match="not a harness history"):
        open_store(str(other), create=True)
    with pytest.raises(InputError, match="no such history database"):
        open_store(str(tmp_path / "absent.db"))
    assert not (tmp_path / "absent.db").exists()  # reading never creates
    with pytest.raises(InputError, match="unknown scheme 'mysql'"):
        open_store("mysql://u:secret@h/db")


def test_a_read_only_directory_is_an_input_error(tmp_path):
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o555)
    try:
        if (ro / "probe").exists() or _writable(ro):
            pytest.skip("this process can write a read-only directory (root without CAP_DAC_OVERRIDE dropped)")
        with pytest.raises(InputError, match="not writable"):
            open_store(str(ro / "h.db"), create=True)
    finally:
        ro.chmod(0o755)


def _writable(d: Path) -> bool:
    try:
        (d / ".probe").write_text("")
    except OSError:
        return False
    (d / ".probe").unlink()
    return True


def test_postgres_url_that_does_not_connect_is_an_input_error(postgres_server):
    bad = f"postgresql://harness:pw@127.0.0.1:{postgres_server.port}/no_such_database"
    with pytest.raises(InputError) as e:
        open_store(bad)
    text = str(e.value)
    assert "cannot connect" in text and "no_such_database" in text and "pw@" not in text  # password redacted


# --------------------------------------------------------------------------------------------------
# concurrent writers


def _writer(db: str, worker: int, adds: int, barrier: multiprocessing.synchronize.Barrier) -> None:
    """One process: open the (perhaps not yet existing) history and add `adds` nights of 5 cells, one by one."""
    cells = tuple(f"zero{worker}-{i}" for i in range(5))
    barrier.wait()
    with open_store(db, create=True) as store:
        for night in range(adds):
            store.add([entry_of(make_record(strategy=s, night=night)) for s in cells], label=f"w{worker}", source="p")


def test_concurrent_sqlite_writers_all_land(tmp_path):
    """Six processes open one new history file at the same moment and add 20 nights each, interleaved: every
    run lands, none fails with 'database is locked' (WAL, busy timeout, BEGIN IMMEDIATE, retried WAL switch)."""
    db = str(tmp_path / "shared.db")
    ctx = multiprocessing.get_context("spawn")
    workers, adds = 6, 20
    barrier = ctx.Barrier(workers)
    procs = [ctx.Process(target=_writer, args=(db, w, adds, barrier)) for w in range(workers)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=300)
    assert [p.exitcode for p in procs] == [0] * workers
    with open_store(db) as store:
        counts = store.counts()
    assert counts["runs"] == workers * adds * 5
    assert counts["batches"] == workers * adds
    assert counts["cells"] == workers * 5


def test_busy_timeout_is_what_writers_wait(monkeypatch, tmp_path):
    """A writer blocked by another's open transaction waits (and then fails as an error naming the lock only
    past the timeout): here the timeout is cut to 0.2 s and the other transaction held."""
    db = str(tmp_path / "h.db")
    with open_store(db, create=True) as holder:
        holder.conn.execute("BEGIN IMMEDIATE")
        monkeypatch.setattr(store_module, "BUSY_TIMEOUT_S", 0.2)
        with open_store(db, create=True) as other, pytest.raises(sqlite3.OperationalError, match="locked"):
            other.add([entry_of(make_record())], label=None, source="x")
        holder.conn.execute("ROLLBACK")


def test_concurrent_postgres_adds_of_one_sweep_store_it_once(pg_url):
    """Four connections add the same sweep at the same moment: it is stored once, and the adds together report
    every record added exactly once (a run another writer stored first is skipped, not an error)."""
    import threading

    entries = [entry_of(r) for r in nights(5)]
    with open_store(pg_url, create=True):
        pass
    barrier = threading.Barrier(4)
    results, errors = [], []

    def add() -> None:
        try:
            with open_store(pg_url) as store:
                barrier.wait()
                results.append(store.add(entries, label=None, source="same"))
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=add) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert errors == []
    assert sum(r.added for r in results) == len(entries)
    with open_store(pg_url) as store:
        counts = store.counts()
    assert counts["runs"] == len(entries)
    assert counts["batches"] == sum(1 for r in results if r.added)
