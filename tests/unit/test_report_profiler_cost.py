"""The profiler's cost in the report: each traced cell's untraced neighbours (the steps run just before and after
its traced ones, without the profiler) against the timed band, and its traced / untraced ratio; the time model's
per-part summary counts both. The held-out traced fixtures predate the neighbours: three of them get neighbours
here (one inside the timed band, two outside), the rest stay without, as older records do."""

from __future__ import annotations

import csv
import json
import shutil
import statistics
from pathlib import Path

import pytest

from harness.report import build_report

TRACED = Path(__file__).resolve().parents[1] / "fixtures" / "traced"


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("cost")
    results = tmp / "results"
    shutil.copytree(TRACED, results)
    given = {}
    for k, path in enumerate(sorted(results.glob("*.json"))[:3]):
        doc = json.loads(path.read_text())
        timed, t = doc["metrics"]["step_time_s"], doc["metrics"]["time_s"]
        # neighbours at the timed median (inside the band), then 1.5x and 0.5x it (outside)
        plain = timed["median"] * (1.0, 1.5, 0.5)[k]
        steps = [plain * f for f in (0.98, 1.02, 1.0, 0.99, 1.01, 1.0)]
        t["untraced_steps"] = steps
        t["profiler_cost"] = t["step"] / statistics.median(steps)  # one traced step in these older records
        path.write_text(json.dumps(doc))
        given[doc["run_id"]] = (doc, statistics.median(steps))
    out = build_report([results], out=tmp / "report")
    return {"out": out, "given": given}


def test_table_csv_carries_the_neighbours_median_and_the_profilers_cost(report):
    rows = {r["run_id"]: r for r in csv.DictReader(report["out"]["paths"]["csv"].open())}
    assert len(rows) == 6
    for run_id, row in rows.items():
        if run_id in report["given"]:
            doc, plain = report["given"][run_id]
            assert float(row["untraced_step_s"]) == pytest.approx(plain)
            assert float(row["profiler_cost"]) == pytest.approx(doc["metrics"]["time_s"]["profiler_cost"])
        else:  # an older record: nothing was run beside its traced steps
            assert row["untraced_step_s"] == "" and row["profiler_cost"] == ""


def test_breakdown_rows_and_summary_say_where_the_neighbours_lie(report):
    md = report["out"]["paths"]["markdown"].read_text()
    section = md[md.index("## Step-time breakdown of the traced cells") :]
    header = next(line for line in section.splitlines() if line.startswith("| model"))
    assert "| untraced / timed | traced / untraced |" in header
    costs = []
    for doc, plain in report["given"].values():
        timed, t = doc["metrics"]["step_time_s"], doc["metrics"]["time_s"]
        row = next(line for line in section.splitlines() if f"| {doc['spec']['strategy']} |" in line)
        where = "in" if timed["p10"] <= plain <= timed["p90"] else "outside"
        assert f"| {plain / timed['median']:.2f}× {where} p10–p90 | {t['profiler_cost']:.2f}× |" in row, row
        costs.append(t["profiler_cost"])
    line = next(x for x in md.splitlines() if x.startswith("- **time model per part**"))
    assert "the untraced steps beside them inside it in 1 of 3" in line, line
    want = f"median {statistics.median(costs):.2f}×, {min(costs):.2f}–{max(costs):.2f}×"
    assert f"the profiler's cost, traced / untraced: {want}" in line, line
