"""Loading one side of a comparison (baseline or candidate) from result dirs, with what `harness compare` must
refuse rather than silently drop: a path that does not exist, records of a schema version this harness does not
read, and a side with no readable record at all. Other unreadable files become warnings.

Records are read one at a time (`iter_side`), so a side of many reruns can be indexed by spec as it loads without
holding every record. The files are harness.results.store's (`iter_record_files`' files and order, listed by
fastload.record_files), each parsed once; a file that is not a readable record gets the reason store.read_record
gives, the reader every command shares.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from harness.core.errors import Problem
from harness.results.fastload import record_files
from harness.results.store import SCHEMA_VERSION, check_record, read_record


def _existing(paths: Sequence[Path], side: str, problems: list[Problem]) -> list[Path]:
    ok = []
    for p in paths:
        if not p.exists():
            problems.append(Problem(str(p), "", f"{side}: no such file or directory"))
        else:
            ok.append(p)
    return ok


def _parse(path: str) -> tuple[dict[str, Any] | None, Any]:
    """(record, document): the record when the file is one store.read_record accepts (the same checks), else
    None and the parsed document (None when it is not JSON)."""
    try:
        with open(path) as f:  # NOTE: as Path.read_text: the locale's encoding, like store.read_record
            doc = json.loads(f.read())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return None, None
    try:
        return dict(check_record(doc)), doc
    except ValueError:
        return None, doc


def _unknown_schema(doc: Any) -> Any:
    """The schema_version of a parsed record whose version this harness does not read, else None."""
    if isinstance(doc, dict) and doc.get("schema_version") != SCHEMA_VERSION:
        return doc.get("schema_version", "<absent>")
    return None


def iter_side(
    paths: Sequence[Path], *, side: str, problems: list[Problem], notes: list[str]
) -> Iterator[dict[str, Any]]:
    """The records under `paths`, one at a time, each with `_path` (its file). Unknown schema versions are
    problems (comparing around them would silently drop cells); other unreadable files are warnings unless
    nothing is left. `problems` and `notes` are complete once the iterator is exhausted."""
    skipped: list[tuple[str, str]] = []
    existing = _existing(paths, side, problems)
    count = 0
    for p in existing:
        for f in record_files(p):  # NOTE: iter_record_files' files and order, listed without a Path per file
            rec, doc = _parse(f)
            if rec is None:
                try:
                    rec = dict(read_record(f))  # the reason, as every command words it
                except ValueError as e:
                    version = _unknown_schema(doc)
                    if version is not None:
                        problems.append(
                            Problem(
                                str(f),
                                "schema_version",
                                f"{side}: unknown schema_version {version!r}; this harness reads "
                                f"version {SCHEMA_VERSION} (compare with the harness version that "
                                "wrote it)",
                            )
                        )
                    else:
                        skipped.append((str(f), str(e)))
                    continue
            rec.setdefault("_path", str(f))
            count += 1
            yield rec
    if existing and not count:
        where = ", ".join(str(p) for p in existing)
        detail = f"; {len(skipped)} unreadable file(s) skipped" if skipped else " (no *.json record files found)"
        problems.append(Problem(where, "", f"{side}: no readable records{detail}"))
        problems.extend(Problem(f, "", f"{side}: {why}") for f, why in skipped)
    else:
        notes.extend(f"{side}: skipped {f}: {why}" for f, why in skipped)


def load_side(paths: Sequence[Path], *, side: str, problems: list[Problem], notes: list[str]) -> list[dict[str, Any]]:
    """Every record of `iter_side`, as a list."""
    return list(iter_side(paths, side=side, problems=problems, notes=notes))
