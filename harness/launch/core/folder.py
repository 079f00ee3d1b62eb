"""A sweep's folder of records, as the sweep sees it: where each run of each cell is filed, which runs have a
record, and where a run k >= 2 waits to be filed.

**Repeats** (`harness sweep --repeat K`): a cell's k-th run (k >= 2) is launched with a results root of its own,
`<sweep>/.repeats/r<k>/` (hidden from every reader), where the backends write its record, fragments and markers
exactly as for a first run, without knowing of repeats; the sweep then files the record as `<run_id>.r<k>.json`
with `repeat: k` beside the cell's first record (`<run_id>.json`, no field, as every record written before repeats
existed).

Why a type of its own: the sweep, `harness status` and `harness tune` ask the same questions of a sweep folder;
each question is one call here, returning typed records (harness.results.store reads them).
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness.results.record import Record
from harness.results.store import record_or_none, record_path, sweep_dir, write_record


@dataclass(frozen=True)
class SweepFolder:
    """`<results>/<sweep>/`: the records of one sweep, by run."""

    results: Path
    """the results root"""
    sweep: str
    """the sweep's (scenario's) name"""

    @property
    def path(self) -> Path:
        return sweep_dir(self.results, self.sweep)

    def staging_root(self, repeat: int) -> Path:
        """Where the backends write run `repeat` (its record, fragments, markers) before it is filed: a results root
        of its own, hidden under the sweep's folder; run 1 uses the results root itself."""
        return self.results if repeat <= 1 else self.path / ".repeats" / f"r{repeat}"

    def record_path(self, run_id: str, repeat: int = 1) -> Path:
        """Where run `repeat` of the cell is filed."""
        return record_path(self.results, self.sweep, run_id, repeat=repeat)

    def recorded(self, run_id: str, repeat: int = 1) -> Record | None:
        """The filed record of run `repeat` of the cell, or None (none yet, torn, another version)."""
        return record_or_none(self.record_path(run_id, repeat))

    def file(self, rec: Record, *, repeat: int) -> Record:
        """A run k >= 2's record, from where its backend wrote it, to its own name beside the cell's first record
        (with `repeat: k`); run 1's is returned as it is."""
        if repeat <= 1:
            return rec
        filed = rec.model_copy(update={"repeat": repeat, **self._file_artifacts(rec, repeat=repeat)})
        write_record(self.results, filed)
        record_path(self.staging_root(repeat), self.sweep, rec.run_id).unlink(missing_ok=True)
        return filed

    def _file_artifacts(self, rec: Record, *, repeat: int) -> dict[str, Any]:
        """A run k >= 2's files beside its record (`artifacts.traces`, paths relative to the record, first part the
        kind's folder, second the run_id's), moved from its staging folder to the cell's first run's side with
        `.r<k>` after the run_id's folder: `traces/<run_id>.r<k>/rank0.trace.json.gz`. The record's paths follow."""
        traces = rec.artifacts.traces if rec.artifacts is not None else None
        if not traces:
            return {}
        staged, moved = sweep_dir(self.staging_root(repeat), self.sweep), []
        for rel in traces:
            parts = Path(rel).parts
            new = Path(parts[0], f"{parts[1]}.r{repeat}", *parts[2:]) if len(parts) >= 3 else Path(rel)
            if (staged / rel).exists():
                (self.path / new).parent.mkdir(parents=True, exist_ok=True)
                os.replace(staged / rel, self.path / new)
            moved.append(new.as_posix())
        assert rec.artifacts is not None
        return {"artifacts": rec.artifacts.model_copy(update={"traces": moved})}

    def ok_run(self, run_id: str, repeat: int = 1) -> Record | None:
        """Run `repeat`'s ok record: filed, or (k >= 2) ended ok in staging but not filed yet (the sweep stopped in
        between), which is filed now. None when that run has no ok record."""
        rec = self.recorded(run_id, repeat)
        if rec is not None and rec.ok:
            return rec
        if repeat <= 1:
            return None
        staged = record_or_none(record_path(self.staging_root(repeat), self.sweep, run_id))
        return self.file(staged, repeat=repeat) if staged is not None and staged.ok else None

    def runs_recorded(self, run_ids: Iterable[str]) -> dict[str, int]:
        """Each cell's highest run index with a record file (0: none), from one listing of the folder."""
        found = {run_id: 0 for run_id in run_ids}
        if not self.path.is_dir():
            return found
        for p in self.path.iterdir():
            name = p.name
            if not name.endswith(".json"):
                continue
            stem = name[: -len(".json")]
            run_id, dot, k = stem.rpartition(".r")
            if dot and k.isdigit() and run_id in found:
                found[run_id] = max(found[run_id], int(k))
            elif stem in found:
                found[stem] = max(found[stem], 1)
        return found
