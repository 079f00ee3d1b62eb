"""The sweep's one line per cell (launch.core.outcome.describe): headline numbers, and an ok cell's note beside them."""

from __future__ import annotations

import json

from harness.launch.core.outcome import describe as describe_record
from harness.results.store import as_record
from tests.conftest import REPO


def describe(rec: dict) -> str:
    return describe_record(as_record(rec))


def real_record() -> dict:
    return json.loads((REPO / "docs" / "record-example.json").read_text())  # a real smoke-sweep record


def test_an_ok_line_has_the_headline_numbers_and_no_note_without_one():
    rec = real_record()
    m = rec["metrics"]
    assert rec["status"] == "ok" and rec["reason"] is None
    assert describe(rec) == (
        f"ok  {m['step_time_s']['median'] * 1e3:.1f} ms/step  "
        f"{m['tokens_per_s_per_gpu']:.0f} tok/s/gpu  loss {m['loss']:.4f}  "
        f"peak {m['peak_memory_allocated_gib']:.2f} GiB"
    )


def test_an_ok_cell_with_a_note_shows_it():
    note = "torch.compile compiled 2 frame(s) during the measured steps (recompilation): those steps' times ..."
    assert describe(dict(real_record(), reason=note)).endswith(f" GiB  note: {note}")


def test_a_failed_line_has_status_rank_and_reason():
    rec = dict(real_record(), status="oom", reason="CUDA out of memory\nTraceback ...", failed_rank=1)
    assert describe(rec) == "oom (rank 1): CUDA out of memory"
