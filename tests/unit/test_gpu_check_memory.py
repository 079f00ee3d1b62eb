"""bench/gpu_check_memory.py: the device check's per-category memory table, on records with and without the measured
breakdown (records written before the worker measured `metrics.memory_gib` print `-`)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
(FIXTURE,) = (REPO / "tests" / "fixtures" / "records" / "fixture-h100").glob("1.3b-fsdp2.full_shard-bf16-g2-*.json")


def table(results: Path) -> list[str]:
    out = subprocess.run(
        [sys.executable, str(REPO / "bench" / "gpu_check_memory.py"), str(results)],
        capture_output=True, text=True, check=True, cwd=REPO, env={"PYTHONPATH": str(REPO)},
    ).stdout  # fmt: skip
    return [line for line in out.splitlines() if line.startswith("| 1.3b")]


def test_measured_beside_predicted_per_category_with_the_deviation(tmp_path):
    doc = json.loads(FIXTURE.read_text())
    parts = ("params", "grads", "optimizer", "activations", "buffers")
    predicted = dict(zip(parts, (1.5, 0.5, 3.0, 20.0, 4.0), strict=True), total=29.0)
    doc["predicted"]["memory_gib"] = predicted
    measured = {k: v / 1.1 for k, v in predicted.items()}
    doc["metrics"]["memory_gib"] = {**measured, "rank": 1, "phase": "backward", "per_rank_total": [1.0, 2.0]}
    doc["metrics"]["memory_fragmentation_gib"] = 1.25
    (tmp_path / FIXTURE.name).write_text(json.dumps(doc))
    (row,) = table(tmp_path)
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells[0] == "1.3b-fsdp2.full_shard-bf16-g2 ac=none"
    assert cells[1:7] == [f"{measured[k]:.2f} / {predicted[k]:.2f} (+10%)" for k in (*parts, "total")]
    assert cells[7].startswith("- / ")  # no host figure in this record: measured -, predicted cpu_memory_gib
    assert cells[8:] == ["rank 1 backward", doc["predicted"].get("peak_at") or "-", "1.25"]


def test_a_record_without_the_measured_breakdown_prints_dashes():
    (row, *_) = table(FIXTURE.parent)
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells[1:6] == ["- / -"] * 5 and cells[6].startswith("- / ") and cells[8] == "-" and cells[10] == "-"
