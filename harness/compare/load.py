"""Loading one side of a comparison (baseline or candidate) from result dirs, with what `harness compare` must
refuse rather than silently drop: a path that does not exist, records of a schema version this harness does not
read, a side with no readable record at all, and (`refuse_unreadable`, compare's way) any record file that cannot be
read: a torn or corrupt candidate record would otherwise make its cell `missing` and the comparison pass. Without
it (the history's way) an unreadable file beside readable records is a warning.

Records are read one at a time through harness.results.store (the one reader of record files), so a side of many
reruns can be indexed by spec as it loads without holding every record.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from pathlib import Path

from harness.core.errors import Problem
from harness.results.record import SCHEMA_VERSION, Record
from harness.results.store import UnknownSchema, read_record, record_files


def _existing(paths: Sequence[Path], side: str, problems: list[Problem]) -> list[Path]:
    ok = []
    for p in paths:
        if not p.exists():
            problems.append(Problem(str(p), "", f"{side}: no such file or directory"))
        else:
            ok.append(p)
    return ok


def iter_side(
    paths: Sequence[Path],
    *,
    side: str,
    problems: list[Problem],
    notes: list[str],
    refuse_unreadable: bool = False,
) -> Iterator[Record]:
    """The records under `paths`, one at a time. Unknown schema versions are problems (comparing around them would
    silently drop cells); other unreadable files are problems too with `refuse_unreadable`, else warnings unless
    nothing is left; a field of the wrong type is a warning (read as null). `problems` and `notes` are complete once
    the iterator is exhausted."""
    skipped: list[tuple[str, str]] = []
    fields: list[str] = []
    existing = _existing(paths, side, problems)
    count = 0
    for p in existing:
        for f in record_files(p):
            try:
                rec = read_record(f, warnings=fields)
            except UnknownSchema as e:
                problems.append(
                    Problem(
                        f,
                        "schema_version",
                        f"{side}: unknown schema_version {e.version!r}; this harness reads version "
                        f"{SCHEMA_VERSION} (compare with the harness version that wrote it)",
                    )
                )
                continue
            except ValueError as e:
                skipped.append((f, str(e)))
                continue
            count += 1
            yield rec
    if existing and not count:
        where = ", ".join(str(p) for p in existing)
        detail = f"; {len(skipped)} unreadable file(s) skipped" if skipped else " (no *.json record files found)"
        problems.append(Problem(where, "", f"{side}: no readable records{detail}"))
        problems.extend(Problem(f, "", f"{side}: {why}") for f, why in skipped)
    elif refuse_unreadable:
        problems.extend(
            Problem(
                f,
                "",
                f"{side}: {why}; a record that cannot be read could hide a regression (its cell would read as "
                "missing): repair the file, or move it out of the folder",
            )
            for f, why in skipped
        )
    else:
        notes.extend(f"{side}: skipped {f}: {why}" for f, why in skipped)
    notes.extend(f"{side}: {w}" for w in fields)


def load_side(
    paths: Sequence[Path], *, side: str, problems: list[Problem], notes: list[str], refuse_unreadable: bool = True
) -> list[Record]:
    """Every record of `iter_side`, as a list (compare's way: an unreadable record file is a problem)."""
    return list(iter_side(paths, side=side, problems=problems, notes=notes, refuse_unreadable=refuse_unreadable))
