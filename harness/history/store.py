"""The results history: a database of run-level values, one row per run of a cell, that sweeps are added to.

Two back ends, one schema: SQLite (the default: `--db PATH`, one file, no server) and PostgreSQL
(`--db postgresql://user@host:port/dbname`, for nightly jobs on many machines; needs `psycopg`, the
`history-pg` extra).

Tables (schema version 2, in `schema_version`); each row is a type in harness.history.rows, and this module
reads and writes them only through those types:

| table | one row per | columns |
|---|---|---|
| `cells` | cell | key (canonical spec JSON, unique), label, run_id (first seen), model, strategy, precision, gpus |
| `machines` | machine | cluster, device_type, device_name, device_count, driver |
| `software` | software stack | python, torch, cuda, nccl, deepspeed, harness_sha |
| `metrics` | metric | name, column_name (its column in `runs`), unit, lower_is_better |
| `batches` | `history add` that stored something | added_at, label, source, runs |
| `runs` | record | uid (unique: idempotent adds), cell, machine, software, batch, time (finished, Unix s), status |
| (`runs`) | metric | one column per metric: the run's value (median step time, tokens/s, peak memory, …; null: none) |

One row per run with a column per metric, not a row per value: a check of 1,000 cells reads 60 runs of each in
one indexed range scan apiece (a row per value made that 600,000 rows). The metric columns follow the registry
(harness.history.keys.HISTORY_METRICS) with no code per metric: opening a database to write (`history add`) adds
a nullable column, and its `metrics` row, for every registry metric the database lacks, in one transaction
(ALTER TABLE … ADD COLUMN: null for the runs stored before; every run kept); `check` and `show`, which never
write, read a database as it is, the metrics it lacks null. The schema version counts changes of the tables
themselves, not metrics: 2 is the layout since the time model's deviation (issue 16), and a version-1 database
(no deviation column) becomes version 2 when a writer adds the column.

Writers are safe together: every add is one transaction (all of its records or none); SQLite runs in WAL mode
with a busy timeout and takes the write lock when the transaction begins (`BEGIN IMMEDIATE`), so concurrent
adds queue instead of failing with "database is locked"; PostgreSQL serialises schema changes with an advisory
lock and lets concurrent adds race on the unique keys (`ON CONFLICT DO NOTHING`).

A database written by a newer harness (a higher schema version) is refused with a clear error, never half-read.
Problems the user can fix (no such file, a read-only directory, a URL that does not connect, a file that is not
a history) are InputError (exit 2).
"""

from __future__ import annotations

import contextlib
import os
import re
import sqlite3
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlsplit, urlunsplit

from harness.core.errors import InputError, Problem
from harness.history.keys import Entry
from harness.history.rows import (
    BATCH_COLUMNS,
    CELL_COLUMNS,
    MACHINE_COLUMNS,
    METRIC_COLUMNS,
    RUN_COLUMNS,
    SOFTWARE_COLUMNS,
    Batch,
    Cell,
    CellRow,
    Machine,
    MetricColumn,
    Run,
    Software,
    StoredRun,
    registry_columns,
    registry_rows,
)

SCHEMA_VERSION = 2
"""the tables' layout: 1 the first; 2 since the time model's deviation (issue 16). Metric columns come and go with
the registry and need no version"""
BUSY_TIMEOUT_S = 120.0
"""how long a SQLite writer waits for another's transaction before giving up (s)"""
_CHUNK = 500
"""values per `IN (...)` list (SQLite's variable limit is 999 in old builds), and runs per INSERT"""
_ADVISORY_LOCK = 0x68617273  # "hars": serialises schema changes on PostgreSQL

_TABLES = """
CREATE TABLE IF NOT EXISTS schema_version (version INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS cells (
    id {pk}, key TEXT NOT NULL UNIQUE, label TEXT NOT NULL, run_id TEXT NOT NULL,
    model TEXT, strategy TEXT, precision TEXT, gpus INTEGER);
CREATE TABLE IF NOT EXISTS machines (
    id {pk}, key TEXT NOT NULL UNIQUE, cluster TEXT NOT NULL, device_type TEXT, device_name TEXT,
    device_count INTEGER, driver TEXT);
CREATE TABLE IF NOT EXISTS software (
    id {pk}, key TEXT NOT NULL UNIQUE, python TEXT, torch TEXT, cuda TEXT, nccl TEXT, deepspeed TEXT,
    harness_sha TEXT);
CREATE TABLE IF NOT EXISTS metrics (
    id {pk}, name TEXT NOT NULL UNIQUE, column_name TEXT NOT NULL UNIQUE, unit TEXT NOT NULL,
    lower_is_better INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS batches (
    id {pk}, added_at {big} NOT NULL, label TEXT, source TEXT NOT NULL, runs INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS runs (
    id {pk}, uid {big} NOT NULL UNIQUE, cell INTEGER NOT NULL REFERENCES cells (id),
    machine INTEGER NOT NULL REFERENCES machines (id), software INTEGER NOT NULL REFERENCES software (id),
    batch INTEGER NOT NULL REFERENCES batches (id), time {big} NOT NULL, status TEXT NOT NULL,
    {value_columns});
CREATE INDEX IF NOT EXISTS runs_by_cell_time ON runs (cell, time);
"""
_DIALECT_TYPES = {
    "sqlite": {"pk": "INTEGER PRIMARY KEY", "big": "INTEGER", "double": "REAL"},
    "postgresql": {
        "pk": "INTEGER GENERATED BY DEFAULT AS IDENTITY PRIMARY KEY",
        "big": "BIGINT",
        "double": "DOUBLE PRECISION",
    },
}


def _ddl(dialect: str) -> list[str]:
    types = _DIALECT_TYPES[dialect]
    columns = ", ".join(f"{col} {types['double']}" for col in registry_columns().values())
    return [s for s in _TABLES.format(**types, value_columns=columns).split(";") if s.strip()]


@dataclass(frozen=True)
class AddResult:
    """What one `add` did."""

    added: int
    """runs stored"""
    already: int
    """records already in the history (same uid), left as they were"""
    batch: int | None
    """the batch id of this add; None when nothing was stored"""
    new_cells: int = 0


def redact(url: str) -> str:
    """A URL without its password, for messages."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return "<unparseable URL>"
    if parts.password is None:
        return url
    netloc = parts.netloc.replace(f":{parts.password}@", ":***@")
    return urlunsplit(parts._replace(netloc=netloc))


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__


def _chunks(items: Sequence[Any]) -> Iterator[Sequence[Any]]:
    n = _CHUNK
    for i in range(0, len(items), n):
        yield items[i : i + n]


class HistoryStore:
    """A connection to one history database (SQLite file or PostgreSQL URL). Use `open_store`."""

    def __init__(self, conn: Any, *, dialect: str, where: str) -> None:
        self.conn = conn
        self.dialect = dialect
        self.where = where
        """the path or redacted URL, for messages"""
        self._machines: dict[int, Machine] | None = None
        self._software: dict[int, Software] | None = None
        self.version = SCHEMA_VERSION
        """the database's schema version (an older one read as it is, or brought up to date by a writer)"""
        self.columns: Mapping[str, str] = registry_columns()
        """metric name → its column in `runs`, for the registry's metrics this database has (set by `prepare`)"""

    # ---------------------------------------------------------------------------------------------- plumbing

    def _sql(self, sql: str) -> str:
        return sql.replace("?", "%s") if self.dialect == "postgresql" else sql

    def execute(self, sql: str, params: Sequence[Any] = ()) -> Any:
        return self.conn.execute(self._sql(sql), tuple(params))

    def executemany(self, sql: str, rows: Iterable[Sequence[Any]]) -> None:
        rows = [tuple(r) for r in rows]
        if not rows:
            return
        if self.dialect == "postgresql":
            with self.conn.cursor() as cur:
                cur.executemany(self._sql(sql), rows)
        else:
            self.conn.executemany(sql, rows)

    def insert(self, table: str, columns: Sequence[str], rows: Iterable[Sequence[Any]], *, unique: str) -> None:
        """INSERT rows (values in `columns` order); a row whose `unique` column is already there is left alone."""
        marks = ", ".join("?" * len(columns))
        self.executemany(
            f"INSERT INTO {table} ({', '.join(columns)}) VALUES ({marks}) ON CONFLICT ({unique}) DO NOTHING", rows
        )

    @contextlib.contextmanager
    def transaction(self) -> Iterator[None]:
        """One write transaction: committed when the block ends, rolled back (nothing stored) when it raises.
        SQLite takes the write lock at the start (BEGIN IMMEDIATE: a writer that must wait, waits for the busy
        timeout at the start instead of failing at its first write)."""
        if self.dialect == "postgresql":
            with self.conn.transaction():
                yield
            return
        self.conn.execute("BEGIN IMMEDIATE")
        try:
            yield
        except BaseException:
            self.conn.execute("ROLLBACK")
            raise
        self.conn.execute("COMMIT")

    @contextlib.contextmanager
    def schema_change(self) -> Iterator[None]:
        """A transaction that may change the schema: PostgreSQL writers take the advisory lock first, so that
        one of two writers opening an old or new database at once changes it and the other finds it done."""
        with self.transaction():
            if self.dialect == "postgresql":
                self.execute("SELECT pg_advisory_xact_lock(?)", (_ADVISORY_LOCK,))
            yield

    def close(self) -> None:
        self.conn.close()

    def __enter__(self) -> HistoryStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---------------------------------------------------------------------------------------------- schema

    def _has_table(self, name: str) -> bool:
        if self.dialect == "postgresql":
            return self.execute("SELECT to_regclass(?) IS NOT NULL", (name,)).fetchone()[0]
        row = self.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?", (name,)).fetchone()
        return row is not None

    def _table_count(self) -> int:
        if self.dialect == "postgresql":
            sql = "SELECT count(*) FROM information_schema.tables WHERE table_schema = current_schema()"
        else:
            sql = "SELECT count(*) FROM sqlite_master WHERE type = 'table'"
        return int(self.execute(sql).fetchone()[0])

    def runs_columns(self) -> set[str]:
        """The columns the `runs` table has in this database."""
        if self.dialect == "postgresql":
            sql = (
                "SELECT column_name FROM information_schema.columns "
                "WHERE table_schema = current_schema() AND table_name = 'runs'"
            )
            return {r[0] for r in self.execute(sql).fetchall()}
        return {r[1] for r in self.execute("PRAGMA table_info(runs)").fetchall()}

    def _version(self) -> int:
        rows = self.execute("SELECT version FROM schema_version").fetchall()
        if len(rows) != 1:
            raise InputError([Problem(self.where, "schema_version", f"{len(rows)} rows; a history has exactly 1")])
        return int(rows[0][0])

    def _check_version(self) -> int:
        """The database's schema version; InputError for a newer one (or one below 1)."""
        version = self._version()
        if version > SCHEMA_VERSION:
            raise InputError(
                [
                    Problem(
                        self.where,
                        "",
                        f"history schema version {version} is newer than this harness reads ({SCHEMA_VERSION}); "
                        "use the harness version that wrote it, or a newer one",
                    )
                ]
            )
        if version < 1:
            raise InputError([Problem(self.where, "", f"history schema version {version} is not one this reads")])
        return version

    def _present(self, columns: Mapping[str, str]) -> dict[str, str]:
        """`columns` (metric name → column) less those this database's `runs` lacks."""
        have = self.runs_columns()
        return {name: col for name, col in columns.items() if col in have}

    def metrics(self) -> list[MetricColumn]:
        """The `metrics` table: every metric this database has a column for, in the order they came."""
        rows = self.execute(f"SELECT {', '.join(METRIC_COLUMNS)} FROM metrics ORDER BY id").fetchall()
        return [MetricColumn(name, col, unit, bool(lower)) for name, col, unit, lower in rows]

    def _up_to_date(self, version: int) -> bool:
        """Whether the database has this harness' layout and every registry metric (column and `metrics` row)."""
        if version < SCHEMA_VERSION or len(self._present(registry_columns())) < len(registry_columns()):
            return False
        return {m.name for m in self.metrics()} >= set(registry_columns())

    def add_metric_columns(self) -> None:
        """Bring the database to this harness: a nullable `runs` column and a `metrics` row for every registry
        metric it lacks (no code per metric: harness.history.rows.registry_columns), and the schema version, in
        one transaction; every stored run stays as it was, null in the new columns."""
        with self.schema_change():
            version = self._check_version()  # NOTE: another writer may have done it while this one waited
            double = _DIALECT_TYPES[self.dialect]["double"]
            have = self.runs_columns()
            guard = "IF NOT EXISTS " if self.dialect == "postgresql" else ""
            for col in registry_columns().values():
                if col not in have:
                    self.execute(f"ALTER TABLE runs ADD COLUMN {guard}{col} {double}")
            self._ensure_metrics()
            if version < SCHEMA_VERSION:
                self.execute("UPDATE schema_version SET version = ?", (SCHEMA_VERSION,))

    def prepare(self, *, create: bool) -> None:
        """Check the schema and learn its metric columns: create it when `create` and absent; when `create`, add
        the registry's metrics an older database lacks (`add_metric_columns`). InputError when this is not a
        history, or a newer one."""
        if self._has_table("schema_version"):
            self.version = self._check_version()
            if create and not self._up_to_date(self.version):
                self.add_metric_columns()
                self.version = SCHEMA_VERSION
            self.columns = self._present(registry_columns())
            return
        if not create:
            what = "an empty database" if self._table_count() == 0 else "a database without a harness history"
            raise InputError(
                [Problem(self.where, "", f"{what}; `harness history add --db {self.where} RESULTS_DIR` creates one")]
            )
        with self.schema_change():
            if self._has_table("schema_version"):  # another writer created it while this one waited
                self.version = self._check_version()
            else:
                if self._table_count() and self.dialect == "sqlite":
                    raise InputError([Problem(self.where, "", "a SQLite database that is not a harness history")])
                for statement in _ddl(self.dialect):
                    self.execute(statement)
                self.execute("INSERT INTO schema_version (version) VALUES (?)", (SCHEMA_VERSION,))
                self._ensure_metrics()
                self.version = SCHEMA_VERSION
        if not self._up_to_date(self.version):  # NOTE: after the transaction: this one would nest in it
            self.add_metric_columns()
            self.version = SCHEMA_VERSION
        self.columns = self._present(registry_columns())

    def _ensure_metrics(self) -> None:
        self.insert("metrics", METRIC_COLUMNS, [m.as_row() for m in registry_rows()], unique="name")

    # ---------------------------------------------------------------------------------------------- writing

    def _ids_by_key(self, table: str, keys: Sequence[str]) -> dict[str, int]:
        out: dict[str, int] = {}
        for chunk in _chunks(list(keys)):
            marks = ",".join("?" * len(chunk))
            for id_, key in self.execute(f"SELECT id, key FROM {table} WHERE key IN ({marks})", chunk).fetchall():
                out[key] = id_
        return out

    def _ensure_identities(self, table: str, columns: Sequence[str], rows: Mapping[str, Any]) -> dict[str, int]:
        """key → id for each identity row (Cell, Machine, Software by its key), inserting the new ones."""
        self.insert(
            table,
            ["key", *columns],
            [(key, *(getattr(row, c) for c in columns)) for key, row in rows.items()],
            unique="key",
        )
        return self._ids_by_key(table, list(rows))

    def _existing_uids(self, uids: Sequence[int]) -> set[int]:
        found: set[int] = set()
        for chunk in _chunks(list(uids)):
            marks = ",".join("?" * len(chunk))
            found.update(r[0] for r in self.execute(f"SELECT uid FROM runs WHERE uid IN ({marks})", chunk).fetchall())
        return found

    def _insert_runs(self, rows: list[StoredRun]) -> None:
        names = tuple(self.columns)
        # NOTE: a run another writer stored meanwhile (PostgreSQL: two adds of one sweep at once) is skipped, not
        # an error; SQLite adds never overlap (BEGIN IMMEDIATE)
        self.insert("runs", [*RUN_COLUMNS, *self.columns.values()], [r.as_row(names) for r in rows], unique="uid")

    def add(self, entries: Sequence[Entry], *, label: str | None, source: str) -> AddResult:
        """Store every entry not stored yet, in one transaction: all of them, or (on any error) none."""
        unique: dict[int, Entry] = {}
        for e in entries:
            unique.setdefault(e.uid, e)
        with self.transaction():
            already = self._existing_uids(list(unique))
            new = [e for uid, e in unique.items() if uid not in already]
            if not new:
                return AddResult(added=0, already=len(entries), batch=None)
            batch = self._insert_batch(Batch(added_at=int(time.time()), label=label, source=source, runs=len(new)))
            cells_before = len(self._ids_by_key("cells", sorted({e.cell for e in new})))
            rows = self._stored_runs(new, batch=batch)
            for chunk in _chunks(rows):
                self._insert_runs(list(chunk))
            added = self._count_added(new, batch=batch)
            if added < len(new):  # another writer stored some of them first
                self.execute("UPDATE batches SET runs = ? WHERE id = ?", (added, batch))
                if not added:
                    self.execute("DELETE FROM batches WHERE id = ?", (batch,))
        self._machines = self._software = None
        return AddResult(
            added=added,
            already=len(entries) - added,
            batch=batch if added else None,
            new_cells=len({e.cell for e in new}) - cells_before,
        )

    def _stored_runs(self, new: Sequence[Entry], *, batch: int) -> list[StoredRun]:
        """The `runs` rows of `new`, their cell, machine and software rows stored first (the new ones)."""
        cells = self._ensure_identities("cells", CELL_COLUMNS, {e.cell: CellRow.of(e) for e in new})
        machines = {e.uid: Machine.of(e.machine) for e in new}
        software = {e.uid: Software.of(e.software) for e in new}
        machine_ids = self._ensure_identities("machines", MACHINE_COLUMNS, {m.key: m for m in machines.values()})
        software_ids = self._ensure_identities("software", SOFTWARE_COLUMNS, {s.key: s for s in software.values()})
        return [
            StoredRun(
                uid=e.uid,
                cell=cells[e.cell],
                machine=machine_ids[machines[e.uid].key],
                software=software_ids[software[e.uid].key],
                batch=batch,
                time=e.time,
                status=e.status,
                values=e.values,
            )
            for e in new
        ]

    def _count_added(self, new: Sequence[Entry], *, batch: int) -> int:
        """How many of `new` this add's batch stored (fewer when another writer stored some first)."""
        added = 0
        for chunk in _chunks([e.uid for e in new]):
            marks = ",".join("?" * len(chunk))
            sql = f"SELECT count(*) FROM runs WHERE batch = ? AND uid IN ({marks})"
            added += int(self.execute(sql, (batch, *chunk)).fetchone()[0])
        return added

    def _insert_batch(self, batch: Batch) -> int:
        marks = ", ".join("?" * len(BATCH_COLUMNS))
        sql = f"INSERT INTO batches ({', '.join(BATCH_COLUMNS)}) VALUES ({marks})"
        params = tuple(getattr(batch, c) for c in BATCH_COLUMNS)
        if self.dialect == "postgresql":
            return int(self.execute(sql + " RETURNING id", params).fetchone()[0])
        return int(self.execute(sql, params).lastrowid)

    # ---------------------------------------------------------------------------------------------- reading

    @property
    def machines(self) -> dict[int, Machine]:
        """id → machine row (read once per connection, and again after an add)."""
        if self._machines is None:
            rows = self.execute(f"SELECT id, {', '.join(MACHINE_COLUMNS)} FROM machines").fetchall()
            self._machines = {r[0]: Machine(*r[1:]) for r in rows}
        return self._machines

    @property
    def software(self) -> dict[int, Software]:
        """id → software row (read once per connection, and again after an add)."""
        if self._software is None:
            rows = self.execute(f"SELECT id, {', '.join(SOFTWARE_COLUMNS)} FROM software").fetchall()
            self._software = {r[0]: Software(*r[1:]) for r in rows}
        return self._software

    def cells(self) -> list[Cell]:
        """Every cell, by label."""
        columns = ("key", *CELL_COLUMNS, "id")
        rows = self.execute(f"SELECT {', '.join(columns)} FROM cells ORDER BY label, id").fetchall()
        return [Cell(*r) for r in rows]

    def cell_ids(self, keys: Iterable[str]) -> dict[str, int]:
        return self._ids_by_key("cells", sorted(set(keys)))

    def runs_of(
        self, cell: int, *, cluster: str | None = None, limit: int | None = None, until: int | None = None
    ) -> list[Run]:
        """The cell's runs, oldest first: the last `limit` of them (all when None), on `cluster` (any when None),
        finished at or before `until` (Unix s; any time when None)."""
        columns = self.columns
        values = "".join(f", r.{col}" for col in columns.values())
        sql = (
            f"SELECT r.id, r.uid, r.time, r.status, r.machine, r.software, b.label{values} FROM runs r "
            "JOIN batches b ON b.id = r.batch JOIN machines m ON m.id = r.machine WHERE r.cell = ?"
        )
        params: list[Any] = [cell]
        if cluster is not None:
            sql += " AND m.cluster = ?"
            params.append(cluster)
        if until is not None:
            sql += " AND r.time <= ?"
            params.append(until)
        sql += " ORDER BY r.time DESC, r.id DESC"
        if limit is not None:
            sql += " LIMIT ?"
            params.append(limit)
        rows = self.execute(sql, params).fetchall()
        machines, software, names = self.machines, self.software, tuple(columns)
        return [
            Run(
                id=r[0],
                uid=r[1],
                time=r[2],
                status=r[3],
                machine=machines[r[4]],
                software=software[r[5]],
                label=r[6],
                values={name: v for name, v in zip(names, r[7:]) if v is not None},
            )
            for r in reversed(rows)
        ]

    def counts(self) -> dict[str, int]:
        """Rows per table (tests, `history show` summary), and `values`: the non-null metric values."""
        out = {
            t: int(self.execute(f"SELECT count(*) FROM {t}").fetchone()[0])
            for t in ("cells", "machines", "software", "batches", "runs")
        }
        counted = " + ".join(f"count({col})" for col in self.columns.values()) or "0"
        out["values"] = int(self.execute(f"SELECT {counted} FROM runs").fetchone()[0])
        return out


# --------------------------------------------------------------------------------------------------
# opening


_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*)://")


@contextlib.contextmanager
def database_errors(db: str) -> Iterator[None]:
    """A database failing mid-command (read-only file, locked past the timeout, a dropped connection) is one
    line naming the database, exit 2; never a traceback."""
    try:
        yield
    except sqlite3.DatabaseError as e:
        text = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        if "readonly" in text:
            text += " (a read-only file or directory?)"
        raise InputError([Problem(db, "", text)]) from None
    except Exception as e:
        if type(e).__module__.split(".")[0] != "psycopg":
            raise
        text = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise InputError([Problem(db, "", text)]) from None


def open_store(db: str, *, create: bool = False) -> HistoryStore:
    """Open the history `db` (a SQLite path, `sqlite:///path`, or a `postgresql://` URL). `create`: make the
    file and schema when absent (`history add`); otherwise a missing history is an InputError."""
    m = _SCHEME.match(db)
    if m is None:
        return _open_sqlite(Path(db), create=create)
    scheme = m.group(1).lower()
    if scheme in ("postgresql", "postgres"):
        return _open_postgres(db, create=create)
    if scheme == "sqlite":
        return _open_sqlite(Path(db[len("sqlite://") :]), create=create)
    raise InputError(
        [
            Problem(
                "--db",
                "",
                f"{redact(db)!r}: unknown scheme {scheme!r}; give a SQLite file path or a "
                "postgresql://user@host:port/dbname URL",
            )
        ]
    )


def _open_sqlite(path: Path, *, create: bool) -> HistoryStore:
    where = str(path)
    if path.is_dir():
        raise InputError([Problem(where, "", "is a directory; --db takes a database file")])
    exists = path.exists()
    if not exists and not create:
        raise InputError(
            [
                Problem(
                    where, "", f"no such history database; `harness history add --db {where} RESULTS_DIR` creates one"
                )
            ]
        )
    if not exists:
        parent = path.parent if str(path.parent) else Path(".")
        if not parent.is_dir():
            raise InputError([Problem(where, "", f"cannot create: no such directory {parent}")])
        if not os.access(parent, os.W_OK | os.X_OK):
            raise InputError([Problem(where, "", f"cannot create: directory {parent} is not writable (read-only?)")])
    elif not os.access(path, os.R_OK):
        raise InputError([Problem(where, "", "not readable (permissions)")])
    try:
        if create:
            conn = sqlite3.connect(str(path), timeout=BUSY_TIMEOUT_S, isolation_level=None)
        else:
            conn = _connect_sqlite_readonly(path)
        conn.execute(f"PRAGMA busy_timeout = {int(BUSY_TIMEOUT_S * 1000)}")
        conn.execute("PRAGMA foreign_keys = ON")
        # NOTE: a check reads the last nights of every cell: rows a night apart, interleaved with every other
        # cell's; a 64 MiB page cache (and the file mapped) keeps a year's recent pages at hand
        conn.execute("PRAGMA cache_size = -65536")
        conn.execute("PRAGMA mmap_size = 268435456")
        if create:
            _set_wal(conn)
        store = HistoryStore(conn, dialect="sqlite", where=where)
        store.prepare(create=create)
        return store
    except sqlite3.DatabaseError as e:
        message = _first_line(e)
        if "not a database" in message:
            message = "not a SQLite database (nor a harness history)"
        elif "unable to open" in message:
            message = f"cannot open or create the file ({message}): a read-only or missing directory?"
        elif "readonly" in message or "read-only" in message:
            message = f"cannot write: {message} (a read-only file or directory?)"
        raise InputError([Problem(where, "", message)]) from None


def _connect_sqlite_readonly(path: Path) -> sqlite3.Connection:
    """A read-only connection. A WAL database in a directory this process cannot write (no -shm/-wal beside it)
    cannot be opened read-only the usual way: then it is opened immutable (nobody can be writing it there)."""
    uri = f"file:{quote(str(path.resolve()))}"
    conn = sqlite3.connect(f"{uri}?mode=ro", uri=True, timeout=BUSY_TIMEOUT_S, isolation_level=None)
    try:
        conn.execute("SELECT count(*) FROM sqlite_master").fetchone()
        return conn
    except sqlite3.OperationalError:
        conn.close()
        if os.access(path.parent, os.W_OK):
            raise
        return sqlite3.connect(f"{uri}?mode=ro&immutable=1", uri=True, isolation_level=None)


def _set_wal(conn: sqlite3.Connection) -> None:
    """WAL: readers never block the writer, and a commit is one append. Switching needs a moment alone with the
    file; several writers opening a new history at once retry instead of failing."""
    deadline = time.monotonic() + BUSY_TIMEOUT_S
    while True:
        try:
            conn.execute("PRAGMA journal_mode = WAL").fetchone()
            return
        except sqlite3.OperationalError as e:
            if "locked" not in str(e) or time.monotonic() > deadline:
                raise
            time.sleep(0.05)


def _open_postgres(url: str, *, create: bool) -> HistoryStore:
    where = redact(url)
    try:
        import psycopg
    except ImportError:
        raise InputError(
            [Problem("--db", "", f"{where}: PostgreSQL needs psycopg: pip install 'harness[history-pg]'")]
        ) from None
    try:
        conn = psycopg.connect(url, autocommit=True, connect_timeout=10)
    except psycopg.Error as e:
        raise InputError([Problem("--db", "", f"{where}: cannot connect: {_first_line(e)}")]) from None
    store = HistoryStore(conn, dialect="postgresql", where=where)
    try:
        store.prepare(create=create)
    except psycopg.Error as e:
        conn.close()
        raise InputError([Problem(where, "", _first_line(e))]) from None
    except BaseException:
        conn.close()
        raise
    return store
