"""The nights behind tests/fixtures/history/v2-ccc26b6.sqlite: a history written by the harness before the typed
rows and automatic metric columns (commit ccc26b6), that tests/history/test_legacy_db.py reads with today's code.

Plain JSON, no harness import: tests/fixtures/history/make_v2_ccc26b6.py runs the *old* harness on the nights
written here, and the test writes tonight's the same way, so both sides see the same bytes. Each night is five
125m cells of tests/fixtures/records/fixture-h100 on their own day, their step time (and every throughput derived
from it) moved by a fixed, evenly spread noise of σ 3%; what happens on which night:

- night 5: `ddp fp32` ends in an out-of-memory record (no measurements);
- nights 7 on: `zero3` runs 1.3x slower (a change point the history shows, and that tonight's level follows);
- nights 9 on: another harness commit;
- every night: `zero2` carries a step-time prediction (the time model's deviation is stored);
- tonight (night 10, `tonight_dir`): `ddp bf16` runs 1.4x slower (out of band) and `fsdp.full_shard bf16`
  counts one more collective byte (an exact change).
"""

from __future__ import annotations

import copy
import datetime as dt
import json
import math
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
FIXTURE = REPO / "tests" / "fixtures" / "history" / "v2-ccc26b6.sqlite"
"""the history the old harness wrote (nights 0-9, labels night-00 … night-09)"""
EXPECTED = REPO / "tests" / "fixtures" / "history" / "v2-ccc26b6"
"""the old harness' outputs of `history show` and `history check` on it (paths as <db> and <tonight>)"""
RECORDS = REPO / "tests" / "fixtures" / "records" / "fixture-h100"
CELLS = (
    "125m-ddp-bf16-g2-bca7e9c191",
    "125m-ddp-fp32-g2-ad76dcd786",
    "125m-fsdp.full_shard-bf16-g2-9d0045cd34",
    "125m-zero2-bf16-g2-ddf42619a1",
    "125m-zero3-bf16-g2-b69b9a6d3b",
)
NIGHTS = 10
TONIGHT = NIGHTS
NOISE = (0.0, 0.8, -0.9, 0.4, -0.3, 1.1, -1.2, 0.2, -0.5, 0.6, -0.7)
"""night-to-night noise in σ (σ = 3%), spread evenly: no draw makes a verdict flaky"""
DAY0 = dt.datetime(2026, 10, 1, 2, 0, tzinfo=dt.timezone.utc)
OUTPUTS = {
    "show.txt": ["history", "show", "--db", "{db}"],
    "show.json": ["history", "show", "--db", "{db}", "--format", "json"],
    "check.txt": ["history", "check", "--db", "{db}", "{tonight}", "--all"],
    "check.json": ["history", "check", "--db", "{db}", "{tonight}", "--format", "json"],
}
"""file under EXPECTED → the command whose stdout it holds, with its exit code on the first line"""


def factor(cell: int, night: int) -> float:
    """How much slower than its fixture record a cell runs on a night (a factor)."""
    f = math.exp(0.03 * NOISE[(night * 7 + cell * 3) % len(NOISE)])
    if CELLS[cell].startswith("125m-zero3") and night >= 7:
        f *= 1.3
    if night == TONIGHT and CELLS[cell].startswith("125m-ddp-bf16"):
        f *= 1.4
    return f


def night_record(cell: int, night: int) -> dict[str, Any]:
    """The record of one cell on one night."""
    rec = copy.deepcopy(json.loads((RECORDS / f"{CELLS[cell]}.json").read_text()))
    rec["sweep"] = "legacy"
    rec["attempt"] = f"night{night:02d}"
    finished = DAY0 + dt.timedelta(days=night, minutes=cell)
    rec["started_at"] = (finished - dt.timedelta(seconds=30)).isoformat(timespec="seconds")
    rec["finished_at"] = finished.isoformat(timespec="seconds")
    rec["env"]["harness_git_sha"] = "5e1c0de" if night < 9 else "7a2b3c4"
    if night == 5 and CELLS[cell].startswith("125m-ddp-fp32"):
        rec["status"] = "oom"
        rec["reason"] = "CUDA out of memory (injected)"
        rec["metrics"] = {}
        rec.pop("comm", None)
        return rec
    f = factor(cell, night)
    m = rec["metrics"]
    step = m["step_time_s"]
    for k in ("median", "p10", "p90", "mean"):
        step[k] = round(step[k] * f, 9)
    step["samples"] = [round(v * f, 9) for v in step["samples"]]
    for k in ("tokens_per_s", "tokens_per_s_per_gpu", "tflops_per_gpu", "mfu", "hfu"):
        if isinstance(m.get(k), (int, float)):
            m[k] = m[k] / f
    if night == TONIGHT and CELLS[cell].startswith("125m-fsdp.full_shard-bf16"):
        rec["comm"]["bytes_per_step"] += 1
    if CELLS[cell].startswith("125m-zero2"):
        predicted = 0.09
        rec.setdefault("predicted", {}).update(
            step_time_s=predicted, step_time_deviation=round(step["median"] / predicted - 1, 9)
        )
    return rec


def write_night(root: Path, night: int) -> Path:
    """One night's records as a results dir (`root/legacy/<run_id>.json`); returns root."""
    folder = root / "legacy"
    folder.mkdir(parents=True, exist_ok=True)
    for cell in range(len(CELLS)):
        rec = night_record(cell, night)
        (folder / f"{rec['run_id']}.json").write_text(json.dumps(rec, indent=2) + "\n")
    return root


def tonight_dir(root: Path) -> Path:
    return write_night(root / "tonight", TONIGHT)
