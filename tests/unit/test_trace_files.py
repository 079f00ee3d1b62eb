"""A traced run's files beside its record: a repeat (`harness sweep --repeat K`, run k >= 2) is staged apart and then
filed beside the cell's first run; its traces move with it and the record's paths follow."""

from __future__ import annotations

import json
from pathlib import Path

from harness.launch.core.folder import SweepFolder
from harness.results.record import Artifacts
from harness.results.store import parse_record, read_record

EXAMPLE = Path(__file__).resolve().parents[2] / "docs" / "record-example.json"


def test_a_repeat_files_its_traces_beside_the_cell(tmp_path):
    rec = parse_record(json.loads(EXAMPLE.read_text()))
    folder = SweepFolder(results=tmp_path, sweep=rec.sweep or "smoke")
    traces = [f"traces/{rec.run_id}/rank{k}.trace.json.gz" for k in (0, 1)]
    rec = rec.model_copy(update={"artifacts": Artifacts(traces=traces)})
    staged = tmp_path / folder.sweep / ".repeats" / "r2" / folder.sweep
    for k, rel in enumerate(traces):
        (staged / rel).parent.mkdir(parents=True, exist_ok=True)
        (staged / rel).write_bytes(bytes([k]) * 10)
    filed = folder.file(rec, repeat=2)
    want = [f"traces/{rec.run_id}.r2/rank{k}.trace.json.gz" for k in (0, 1)]
    assert filed.artifacts is not None and filed.artifacts.traces == want
    on_disk = read_record(folder.record_path(rec.run_id, 2))
    assert on_disk.repeat == 2 and on_disk.artifacts is not None and on_disk.artifacts.traces == want
    assert [(folder.path / p).read_bytes() for p in want] == [b"\x00" * 10, b"\x01" * 10]
    assert not any((staged / "traces").rglob("*.gz"))
