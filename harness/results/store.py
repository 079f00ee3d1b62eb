"""The record contract: one JSON record per cell, written atomically; loading records back.

Record contract v1 (later versions add fields, never rename these): harness.results.schema.Record, with every
field's type and unit; the README's "Record contract" table documents the same fields (a test holds them equal).
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import tempfile
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, Final, cast

from harness.core.errors import InputError, Problem
from harness.results.schema import Record, Spec, Status
from harness.scenario.schema import LEGACY_GPUS_KEY

SCHEMA_VERSION: Final = 1
STATUSES = ("ok", "oom", "timeout", "error", "nan", "crashed", "cancelled", "skipped")
GIB = 2**30


def utc_now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")


def sweep_dir(results: str | Path, sweep: str) -> Path:
    return Path(results) / sweep


def record_name(run_id: str, repeat: int | None = 1) -> str:
    """A record's file name: `<run_id>.json` for a cell's first run (every record written before repeats existed
    is one), `<run_id>.r<k>.json` for its k-th run (`harness sweep --repeat K`, k >= 2)."""
    k = 1 if repeat is None else int(repeat)
    return f"{run_id}.json" if k <= 1 else f"{run_id}.r{k}.json"


def record_path(results: str | Path, sweep: str, run_id: str, *, repeat: int | None = 1) -> Path:
    return sweep_dir(results, sweep) / record_name(run_id, repeat)


def repeat_of(record: Mapping[str, Any]) -> int:
    """Which run of its cell a record is: its `repeat` field, 1 when absent (a sweep without --repeat)."""
    k = record.get("repeat")
    return k if isinstance(k, int) and not isinstance(k, bool) and k >= 1 else 1


def unwritable_reason(folder: str | Path) -> str | None:
    """Why files cannot be made in `folder` (which need not exist yet), or None.

    Tried, not guessed from permission bits (os.access says yes to root on a chmod 555 folder, and to anyone on
    /sys): a probe folder is made and removed in `folder`, or where `folder` would be created, its nearest existing
    parent. Nothing is left behind."""
    folder = Path(folder)
    existing = folder
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        if existing == folder:
            return "exists and is not a directory"
        return f"cannot be created: {existing} is a file, not a directory"
    try:
        os.rmdir(tempfile.mkdtemp(prefix=".harness-probe-", dir=existing))
    except OSError as e:
        where = "" if existing == folder else ", where it would be created"
        return f"cannot write in {existing}{where}: {e.strerror or e}"
    return None


def check_writable_dir(folder: str | Path, *, option: str) -> None:
    """InputError (`error: FOLDER: OPTION: cannot write: Read-only file system`, exit 2) unless files can be made
    in `folder`: output folders are checked before any work, so a bad one costs a line, not a traceback after it."""
    why = unwritable_reason(folder)
    if why is not None:
        raise InputError([Problem(str(folder), option, why)])


def atomic_write_text(path: str | Path, text: str) -> None:
    """`atomic_write_bytes` of `text` in UTF-8."""
    atomic_write_bytes(path, text.encode("utf-8"))


def atomic_write_bytes(path: str | Path, data: bytes) -> None:
    """Write a file so readers see the old one or the whole new one, never a torn one (temp + fsync + rename,
    then fsync of the directory so the rename survives a crash)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        dfd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise


def atomic_write_json(path: str | Path, obj: Any) -> None:
    """`atomic_write_text` of indented JSON (NaN refused: JSON has none)."""
    atomic_write_text(path, json.dumps(obj, indent=2, allow_nan=False) + "\n")


def new_record(
    *,
    spec: Spec,
    run_id: str,
    sweep: str,
    cluster: str,
    status: Status,
    reason: str | None = None,
    failed_rank: int | None = None,
) -> Record:
    """A record skeleton: statuses other than ok carry a reason; metrics stay empty until measured."""
    if status not in STATUSES:
        raise ValueError(f"status {status!r} is not one of {', '.join(STATUSES)}")
    now = utc_now()
    return {
        "schema_version": SCHEMA_VERSION,
        "run_id": run_id,
        "sweep": sweep,
        "cluster": cluster,
        "status": status,
        "reason": reason,
        "failed_rank": failed_rank,
        "spec": spec,
        "metrics": {},
        "env": {},
        "started_at": now,
        "finished_at": now,
    }


def sanitize(obj: Any) -> Any:
    """JSON-safe copy: NaN/inf become null (JSON has no NaN; a non-finite loss is status `nan`, not a number)."""
    if isinstance(obj, float):
        return obj if obj == obj and obj not in (float("inf"), float("-inf")) else None
    if isinstance(obj, dict):
        return {str(k): sanitize(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [sanitize(v) for v in obj]
    return obj


def write_record(results: str | Path, record: Mapping[str, Any]) -> Path:
    """Write a record (harness.results.schema.Record) atomically to its path under `results` (a repeat's own name
    when it has `repeat` >= 2); NaN/inf → null."""
    path = record_path(results, record["sweep"], record["run_id"], repeat=repeat_of(record))
    atomic_write_json(path, sanitize(record))
    return path


def read_record(path: str | Path) -> Record:
    """Parse one record; ValueError (with the reason) when it is not a readable v1 record. Checked here:
    schema_version, run_id, status, spec; the other fields are as the type says, not checked."""
    try:
        rec = json.loads(Path(path).read_text())
    except (OSError, UnicodeDecodeError) as e:
        raise ValueError(f"unreadable: {e}") from None
    except json.JSONDecodeError as e:
        raise ValueError(f"not valid JSON (truncated or corrupt?): {e}") from None
    return check_record(rec)


def check_record(rec: Any) -> Record:
    """A parsed document as a record (ValueError with the reason when it is not a readable v1 record), with
    the spec's pre-2026-12 `world_size` renamed `gpus` (in place), so every reader sees one vocabulary."""
    if not isinstance(rec, dict):
        raise ValueError("not a JSON object")
    version = rec.get("schema_version")
    if version != SCHEMA_VERSION:
        raise ValueError(f"unknown schema_version {version!r}; this harness reads version {SCHEMA_VERSION}")
    missing = [k for k in ("run_id", "status", "spec") if k not in rec]
    if missing:
        raise ValueError(f"missing keys: {', '.join(missing)}")
    if rec["status"] not in STATUSES:
        raise ValueError(f"status {rec['status']!r} is not one of {', '.join(STATUSES)}")
    spec = rec["spec"]
    if isinstance(spec, dict) and LEGACY_GPUS_KEY in spec and "gpus" not in spec:
        spec["gpus"] = spec.pop(LEGACY_GPUS_KEY)
    return cast(Record, rec)  # NOTE: only the keys above are checked; the rest is trusted to be as Record says


TUNE_LOG = "tune.json"
"""`harness tune`'s log in its sweep folder (harness.tune.run writes it, harness.report.tune reads it)"""
NOT_RECORDS = frozenset({"manifest.json", TUNE_LOG})
"""JSON files a sweep folder holds beside its records: the manifest, and `harness tune`'s log"""


def iter_record_files(*dirs: str | Path) -> Iterator[Path]:
    """Record files under the given dirs (recursively), skipping hidden/temp files, the sweep manifest and the
    tune log (NOT_RECORDS)."""
    for d in dirs:
        d = Path(d)
        if d.is_file():
            yield d
            continue
        for p in sorted(d.rglob("*.json")):
            if any(part.startswith(".") for part in p.relative_to(d).parts) or p.name in NOT_RECORDS:
                continue
            yield p


def load_records(*dirs: str | Path) -> tuple[list[Record], list[str]]:
    """(records, warnings): every readable record; each unreadable/partial/unknown-schema file is a warning."""
    records, warnings = [], []
    for p in iter_record_files(*dirs):
        try:
            rec = read_record(p)
        except ValueError as e:
            warnings.append(f"{p}: {e}")
            continue
        rec.setdefault("_path", str(p))
        records.append(rec)
    return records, warnings


def fragment_dir(results: str | Path, sweep: str, run_id: str) -> Path:
    """Where the ranks of a cell write their failure fragments (`rank<k>.json`): the worker writes them, the
    launchers read them to compose the record rank 0 could not write. Hidden from load_records (a dot folder)."""
    return sweep_dir(results, sweep) / ".fragments" / run_id
