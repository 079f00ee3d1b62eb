"""Reading many records fast and one at a time, for the commands that scan whole result trees (report; compare
can adopt it): the same files, in the same order, with the same checks and the same warning text as
harness.results.store.load_records, but

- the tree is walked with os.scandir (no pathlib object per file until a file is kept),
- each file is read as bytes and parsed once,
- records are yielded one by one, so a caller that keeps only a few fields (the report's frame) never holds
  every parsed record at once (100,000 records stay well under 1 GiB).

`load_records` stays the reference; tests/unit/test_report_fastload.py holds the two equal.
"""

from __future__ import annotations

import json
import locale
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from harness.results.store import NOT_RECORDS, check_record

__all__ = ["record_files", "iter_records", "read_file"]


def _is_record(name: str) -> bool:
    return name.endswith(".json") and name not in NOT_RECORDS


def _walk(
    root: str, rel: tuple[str, ...], out: list[tuple[tuple[str, ...], str]], keep: Callable[[str], bool] = _is_record
) -> None:
    """Append (relative parts, path) of every entry under root whose name `keep` accepts (default: the `*.json`
    records), as Path.rglob finds them: symlinked
    folders are not entered; hidden entries (and everything under a hidden folder) are left out here rather
    than after the walk (same result: store.iter_record_files drops any path with a hidden part)."""
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


def record_files(*dirs: str | Path) -> list[str]:
    """Paths (str) of the record files under `dirs`, in harness.results.store.iter_record_files' order."""
    paths: list[str] = []
    for d in dirs:
        d = Path(d)
        if d.is_file():
            paths.append(str(d))
            continue
        found: list[tuple[tuple[str, ...], str]] = []
        _walk(str(d), (), found)
        found.sort(key=lambda t: t[0])  # NOTE: by path parts, as sorted(Path…) orders them, not by the string
        paths += [p for _, p in found]
    return paths


def files_named(name: str, *dirs: str | Path) -> list[str]:
    """Paths of the files called `name` under `dirs` (a dir that is itself such a file counts), walked and ordered
    as `record_files` walks for records: `harness tune`'s logs (tune.json), which are not records."""
    paths: list[str] = []
    for d in dirs:
        d = Path(d)
        if d.is_file():
            if d.name == name:
                paths.append(str(d))
            continue
        found: list[tuple[tuple[str, ...], str]] = []
        _walk(str(d), (), found, lambda n: n == name)
        found.sort(key=lambda t: t[0])
        paths += [p for _, p in found]
    return paths


_ENCODING = locale.getpreferredencoding(False)
"""what Path.read_text decodes with (store.read_record uses it), so a non-UTF-8 file fails the same way"""


def read_file(path: str) -> dict[str, Any]:
    """One record file (a path record_files listed) with store.read_record's checks and messages (ValueError),
    from one read of the bytes; `_path` is not set."""
    try:
        with open(path, "rb") as f:
            text = f.read().decode(_ENCODING)
    except (OSError, UnicodeDecodeError) as e:
        raise ValueError(f"unreadable: {e}") from None
    try:
        rec = json.loads(text)
    except json.JSONDecodeError as e:
        raise ValueError(f"not valid JSON (truncated or corrupt?): {e}") from None
    return dict(check_record(rec))


def iter_records(*dirs: str | Path, warnings: list[str]) -> Iterator[dict[str, Any]]:
    """Every readable record under `dirs`, one at a time, with `_path` set as load_records sets it; each
    unreadable/partial/unknown-schema file appends load_records' warning for it to `warnings`."""
    for path in record_files(*dirs):
        try:
            rec = read_file(path)
        except ValueError as e:
            warnings.append(f"{path}: {e}")
            continue
        rec.setdefault("_path", path)
        yield rec
