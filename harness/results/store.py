"""The one reader and writer of records: paths, atomic writes, and every record file read back as a typed
`Record` (harness.results.record), with the same checks and the same warnings for every command.

Record contract v1 (later versions add fields, never rename these): harness.results.record.Record, with every
field's type and unit; the README's "Record contract" table documents the same fields (a test holds them equal).

Reading keeps results: a file that is not a readable v1 record (not JSON, another schema version, no run_id,
status or spec) is a warning naming the file and why; a field of the wrong type inside a readable record (a
hand-edited `"mfu": "high"`) is read as null with a warning naming the file, the key path and the value, and the
record is kept. The walk over result trees uses os.scandir (no pathlib object per file until one is kept) and
parses each file once; records are yielded one at a time, so a caller that keeps a few fields never holds them all.
"""

from __future__ import annotations

import datetime as _dt
import errno
import json
import locale
import os
import secrets
import tempfile
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from harness.core.errors import InputError, Problem
from harness.core.typed import data_location, dotted, expected
from harness.results.record import SCHEMA_VERSION, STATUSES, Beat, Fragment, Record, Status
from harness.scenario.spec import RunSpec

__all__ = ["SCHEMA_VERSION", "STATUSES", "GIB"]  # re-exported: the contract's version and statuses
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


class WriteFailed(OSError):
    """A file the harness writes could not be written (a full disk, a quota, a file system remounted read-only, a
    folder that went away): the file is as it was, never half-written. `str()` is one line, `PATH: cannot write:
    WHY`; errno, strerror and filename are the OSError's."""

    def __str__(self) -> str:
        return f"{self.filename}: cannot write: {self.strerror}"


def create_new_file(folder: str | Path, *, prefix: str, suffix: str = "") -> tuple[int, Path]:
    """(fd, path) of a new, empty file in `folder` with a name no other file has, opened for writing.

    Made with mode 0o666, which the umask then narrows (a folder with a default ACL applies that instead), as
    `open(path, "w")` does: tempfile.mkstemp makes 0600 files, and a record or manifest renamed from one was
    readable by its owner only, whatever the umask of a team sharing a results file system."""
    folder = Path(folder)
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0)
    for _ in range(100):
        path = folder / f"{prefix}{secrets.token_hex(6)}{suffix}"
        try:
            return os.open(path, flags, 0o666), path
        except FileExistsError:
            continue
    raise FileExistsError(errno.EEXIST, "no unused temporary name", str(folder))


def create_new_dir(parent: str | Path, *, prefix: str) -> Path:
    """A new, empty folder in `parent` with a name no other entry has, made with mode 0o777 narrowed by the umask
    (tempfile.mkdtemp makes 0700 ones: a folder swapped in from one is closed to everyone else)."""
    for _ in range(100):
        path = Path(parent) / f"{prefix}{secrets.token_hex(6)}"
        try:
            path.mkdir(0o777)
            return path
        except FileExistsError:
            continue
    raise FileExistsError(errno.EEXIST, "no unused folder name", str(parent))


def atomic_write_text(path: str | Path, text: str) -> None:
    """`atomic_write_bytes` of `text` in UTF-8."""
    atomic_write_bytes(path, text.encode("utf-8"))


def atomic_write_bytes(path: str | Path, data: bytes) -> None:
    """Write a file so readers see the old one or the whole new one, never a torn one (temp + fsync + rename,
    then fsync of the directory so the rename survives a crash). The file gets the permissions the umask leaves
    of 0o666, as any file a program creates (create_new_file).

    WriteFailed when it cannot be written (a full disk: ENOSPC, a quota, a read-only file system, …): the file at
    `path` is then as it was, and the temp file is gone. An interrupt (KeyboardInterrupt) leaves it the same way."""
    path = Path(path)
    tmp: Path | None = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = create_new_file(path.parent, prefix=f".{path.name}.", suffix=".tmp")
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        tmp = None
        dfd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)
    except BaseException as e:
        if tmp is not None:
            tmp.unlink(missing_ok=True)
        if isinstance(e, OSError) and not isinstance(e, WriteFailed):
            raise WriteFailed(e.errno, e.strerror or str(e), str(path)) from e
        raise


def atomic_write_json(path: str | Path, obj: Any) -> None:
    """`atomic_write_text` of indented JSON (NaN refused: JSON has none)."""
    atomic_write_text(path, json.dumps(obj, indent=2, allow_nan=False) + "\n")


def new_record(
    *,
    spec: RunSpec,
    run_id: str,
    sweep: str,
    cluster: str,
    status: Status,
    reason: str | None = None,
    failed_rank: int | None = None,
    **fields: Any,
) -> Record:
    """A record: statuses other than ok carry a reason; metrics and env stay empty unless given in `fields`."""
    if status not in STATUSES:
        raise ValueError(f"status {status!r} is not one of {', '.join(STATUSES)}")
    now = utc_now()
    return Record.model_validate(
        {
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
            **fields,
        }
    )


def sanitize(obj: Any) -> Any:
    """JSON-safe copy: NaN/inf become null (JSON has no NaN; a non-finite loss is status `nan`, not a number)."""
    if isinstance(obj, float):
        return obj if obj == obj and obj not in (float("inf"), float("-inf")) else None
    if isinstance(obj, dict):
        return {str(k): sanitize(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [sanitize(v) for v in obj]
    return obj


def write_record(results: str | Path, record: Record | Mapping[str, Any]) -> Path:
    """Write a record atomically to its path under `results` (a repeat's own name when it has `repeat` >= 2); the
    Python API also takes a record's JSON document, checked as a read would check it."""
    record = as_record(sanitize(dict(record)) if not isinstance(record, Record) else record)
    path = record_path(results, record.sweep or "", record.run_id, repeat=record.repeat_index)
    atomic_write_json(path, record.to_dict())
    return path


# --------------------------------------------------------------------------------------------------
# reading


class UnknownSchema(ValueError):
    """A record of a schema version this harness does not read (a newer harness wrote it): comparing around it
    would silently drop cells, so some readers refuse instead of warning."""

    def __init__(self, version: Any) -> None:
        self.version = version
        super().__init__(f"unknown schema_version {version!r}; this harness reads version {SCHEMA_VERSION}")


def check_core(doc: Any) -> dict[str, Any]:
    """`doc` when it is a record this harness reads (a JSON object of schema_version 1 with run_id, a known status
    and a spec); ValueError with the reason every command words it in otherwise."""
    if not isinstance(doc, dict):
        raise ValueError("not a JSON object")
    version = doc.get("schema_version")
    if version != SCHEMA_VERSION:
        raise UnknownSchema(version)
    missing = [k for k in ("run_id", "status", "spec") if k not in doc]
    if missing:
        raise ValueError(f"missing keys: {', '.join(missing)}")
    if doc["status"] not in STATUSES:
        raise ValueError(f"status {doc['status']!r} is not one of {', '.join(STATUSES)}")
    if not isinstance(doc["run_id"], str):
        raise ValueError(f"run_id {doc['run_id']!r} is not a string")
    if not isinstance(doc["spec"], dict):
        raise ValueError(f"spec {doc['spec']!r} is not an object")
    return doc


_CORE = frozenset({"schema_version", "run_id", "status", "spec"})


def _set_null(doc: Any, loc: tuple[Any, ...]) -> Any:
    """A copy of `doc` with the value at `loc` null (only the containers on the way are copied)."""
    if not loc:
        return None
    head, rest = loc[0], loc[1:]
    out = dict(doc) if isinstance(doc, dict) else list(doc)
    out[head] = _set_null(out[head], rest)
    return out


def parse_record(doc: Any, *, where: str = "", warnings: list[str] | None = None) -> Record:
    """A parsed document as a typed record (ValueError with the reason when it is not a readable v1 record). A field
    of the wrong type is read as null, with the warning `WHERE: KEY.PATH is VALUE, not EXPECTED; read as null`
    appended to `warnings`: one bad number never costs the rest of a measurement."""
    doc = check_core(doc)
    nulled: set[tuple[Any, ...]] = set()
    while True:  # NOTE: each pass nulls what pydantic refused (or, when null is refused too, its container)
        try:
            return Record.model_validate(doc)
        except ValidationError as e:
            errors = e.errors()
        fixes: list[tuple[Any, ...]] = []
        for err in errors:
            loc = data_location(doc, err["loc"])
            while loc in nulled:  # null is not allowed there: the container goes
                loc = loc[:-1]
            if not loc or (loc[0] in _CORE and len(loc) == 1):
                raise ValueError(f"{dotted(err['loc'])}: {err['msg']}") from None
            if loc not in fixes:
                fixes.append(loc)
                if warnings is not None and not any(n[: len(loc)] == loc for n in nulled):
                    value = _value_at(doc, loc)
                    warnings.append(f"{where}: {dotted(loc)} is {value!r}, not {expected(err)}; read as null")
        for loc in fixes:
            doc = _set_null(doc, loc)
            nulled.add(loc)


def as_record(rec: Record | Mapping[str, Any]) -> Record:
    """A record given as a typed record or as the JSON document of one (the Python API takes both)."""
    if isinstance(rec, Record):
        return rec
    doc = dict(rec)
    path = doc.pop("_path", None)
    parsed = parse_record(doc)
    return parsed.at(str(path)) if path is not None else parsed


def _value_at(doc: Any, loc: tuple[Any, ...]) -> Any:
    for part in loc:
        doc = doc[part]
    return doc


_ENCODING = locale.getpreferredencoding(False)
"""what Path.read_text decodes with, so a non-UTF-8 file fails the same way wherever it is read"""


def read_record(path: str | Path, *, warnings: list[str] | None = None) -> Record:
    """One record file (ValueError with the reason when it is not a readable v1 record), parsed once and
    remembered as read from `path`; wrong-typed fields as in parse_record."""
    try:
        with open(path, "rb") as f:
            text = f.read().decode(_ENCODING)
    except (OSError, UnicodeDecodeError) as e:
        raise ValueError(f"unreadable: {e}") from None
    try:
        # NOTE: the common case in one pass of pydantic's own parser; anything it refuses is read again the slow way,
        # for the reasons and warnings every reader gives
        return Record.model_validate_json(text).at(str(path))
    except ValidationError:
        pass
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as e:
        raise ValueError(f"not valid JSON (truncated or corrupt?): {e}") from None
    return parse_record(doc, where=str(path), warnings=warnings).at(str(path))


def record_or_none(path: str | Path) -> Record | None:
    """The record at `path`, or None where there is none a reader could take (absent, torn, another version)."""
    try:
        return read_record(path)
    except ValueError:
        return None


TUNE_LOG = "tune.json"
"""`harness tune`'s log in its sweep folder (harness.tune.run writes it, harness.report.tune reads it)"""
NOT_RECORDS = frozenset({"manifest.json", TUNE_LOG})
"""JSON files a sweep folder holds beside its records: the manifest, and `harness tune`'s log"""


def _is_record(name: str) -> bool:
    return name.endswith(".json") and name not in NOT_RECORDS


def _walk(root: str, rel: tuple[str, ...], out: list[tuple[tuple[str, ...], str]], keep: Callable[[str], bool]) -> None:
    """Append (relative parts, path) of every entry under root whose name `keep` accepts: symlinked folders are not
    entered; hidden entries (and everything under a hidden folder: fragments, repeats in staging, temp files) are
    left out."""
    try:
        with os.scandir(root) as it:
            entries = list(it)
    except (PermissionError, FileNotFoundError, NotADirectoryError):
        return
    for e in entries:
        if e.name.startswith("."):
            continue
        if keep(e.name):
            out.append(((*rel, e.name), e.path))
        try:
            is_dir = e.is_dir() and not e.is_symlink()
        except OSError:
            is_dir = False
        if is_dir:
            _walk(e.path, (*rel, e.name), out, keep)


def _files(keep: Callable[[str], bool], dirs: tuple[str | Path, ...]) -> list[str]:
    paths: list[str] = []
    for d in dirs:
        d = Path(d)
        if d.is_file():
            if keep(d.name) or keep is _is_record:
                paths.append(str(d))
            continue
        found: list[tuple[tuple[str, ...], str]] = []
        _walk(str(d), (), found, keep)
        found.sort(key=lambda t: t[0])  # NOTE: by path parts, as sorted(Path…) orders them, not by the string
        paths += [p for _, p in found]
    return paths


def record_files(*dirs: str | Path) -> list[str]:
    """Paths of the record files under `dirs` (recursively; a path that is a file is taken as one), sorted by
    path parts within each dir: hidden files and folders, the manifest and the tune log (NOT_RECORDS) left out."""
    return _files(_is_record, dirs)


def files_named(name: str, *dirs: str | Path) -> list[str]:
    """Paths of the files called `name` under `dirs` (a dir that is itself such a file counts), walked and ordered
    as record_files walks for records: `harness tune`'s logs (tune.json), which are not records."""
    return _files(lambda n: n == name, dirs)


def iter_records(*dirs: str | Path, warnings: list[str], field_warnings: list[str] | None = None) -> Iterator[Record]:
    """Every readable record under `dirs`, one at a time; each file that is not a readable record appends
    `PATH: why` to `warnings`, each wrong-typed field a line to `field_warnings` (default: `warnings`)."""
    fields = warnings if field_warnings is None else field_warnings
    for path in record_files(*dirs):
        try:
            yield read_record(path, warnings=fields)
        except ValueError as e:
            warnings.append(f"{path}: {e}")


def load_records(*dirs: str | Path) -> tuple[list[Record], list[str]]:
    """(records, warnings): every readable record under `dirs`; each unreadable/partial/unknown-schema file and
    each wrong-typed field is a warning."""
    warnings: list[str] = []
    return list(iter_records(*dirs, warnings=warnings)), warnings


def fragment_dir(results: str | Path, sweep: str, run_id: str) -> Path:
    """Where the ranks of a cell write their failure fragments (`rank<k>.json`): the worker writes them, the
    launchers read them to compose the record rank 0 could not write. Hidden from load_records (a dot folder)."""
    return sweep_dir(results, sweep) / ".fragments" / run_id


def write_fragment(results: str | Path, sweep: str, run_id: str, fragment: Fragment) -> Path:
    """A failing rank's fragment, written atomically where the launcher looks for it."""
    path = fragment_dir(results, sweep, run_id) / f"rank{fragment.rank}.json"
    atomic_write_json(path, sanitize(fragment.to_dict()))
    return path


END_CLAIM = "end."
"""prefix of the file that decides how an attempt of a cell ends (`claim_end`), in the cell's fragment folder"""


def claim_end(results: str | Path, sweep: str, run_id: str, *, attempt: str | None) -> bool:
    """Claim the right to say how launch `attempt` of a cell ends; True for the first caller only.

    Rank 0 claims just before it writes the cell's record; a launcher that is cancelling the cell (Ctrl-C, SIGTERM
    to the sweep) claims before it kills the ranks and records the cell `cancelled`. Whoever creates the file first
    (O_CREAT | O_EXCL: atomic, also on NFS v3+) decides, so a cell is never `ok` in its record and `cancelled` in
    the manifest: a rank 0 that loses does not write its record, a launcher that loses waits for it. The claims of
    other attempts of the cell are removed by the winner (one small file per cell at most stays)."""
    folder = fragment_dir(results, sweep, run_id)
    folder.mkdir(parents=True, exist_ok=True)
    mine = f"{END_CLAIM}{attempt}"
    try:
        os.close(os.open(folder / mine, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o666))
    except FileExistsError:
        return False
    for old in folder.glob(f"{END_CLAIM}*"):
        if old.name != mine:
            old.unlink(missing_ok=True)
    return True


def read_fragments(results: str | Path, sweep: str, run_id: str, *, attempt: str | None) -> list[Fragment]:
    """The failure fragments the ranks of launch `attempt` wrote (a fragment without an attempt counts), by rank
    file name; an unreadable or torn fragment is left out (its rank then counts as silent)."""
    frags = []
    for p in sorted(fragment_dir(results, sweep, run_id).glob("rank*.json")):
        try:
            frag = Fragment.model_validate_json(p.read_bytes())
        except (OSError, ValueError):
            continue
        if frag.attempt in (None, attempt):
            frags.append(frag)
    return frags


def write_beat(results: str | Path, sweep: str, run_id: str, beat: Beat) -> Path:
    """A rank's heartbeat, rewritten atomically beside the fragments (`beat<k>.json`)."""
    path = fragment_dir(results, sweep, run_id) / f"beat{beat.rank}.json"
    atomic_write_json(path, beat.to_dict())
    return path


def read_beats(results: str | Path, sweep: str, run_id: str, *, attempt: str | None) -> list[Beat]:
    """The last heartbeat of each rank of launch `attempt`, by rank; a torn or unreadable one is left out."""
    beats = []
    for p in sorted(fragment_dir(results, sweep, run_id).glob("beat*.json")):
        try:
            beat = Beat.model_validate_json(p.read_bytes())
        except (OSError, ValueError):
            continue
        if beat.attempt in (None, attempt):
            beats.append(beat)
    return sorted(beats, key=lambda b: b.rank)
