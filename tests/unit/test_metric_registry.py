"""A metric is added in one place — harness.results.metrics — and reaches every reader: the report's table
(table.csv), `harness compare` (its judged rows and its JSON), the results history (stored by `history add`, shown
by `history show`, judged by `history check`, in their JSON). The metric here is registered before the read side
is imported, in a fresh interpreter, exactly as a site would add its own; without it, none of them has it."""

from __future__ import annotations

import csv
import json
import subprocess
import sys
from pathlib import Path

import pytest

from harness.results.metrics import COMPARED, METRICS, STORED, Metric, MetricReader, register
from harness.results.store import load_records

REPO = Path(__file__).resolve().parents[2]
BASELINE = REPO / "baselines" / "smoke-local"
NEW = "metrics.flops_per_step"
"""the metric added: a deterministic number every ok record has, judged exactly"""

RUN = f"""
import sys
from harness.results.metrics import EXACT, Metric, register
if sys.argv[1] == "with":
    register(Metric({NEW!r}, ("metrics", "flops_per_step"), "FLOP", True, EXACT, column="flops_per_step"))
from harness.cli import main
sys.exit(main(sys.argv[2:]))
"""


def harness(added: bool, *args: str | Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", RUN, "with" if added else "without", *map(str, args)],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=300,
    )


def everything(added: bool, tmp: Path) -> dict:
    """What each reader shows of the new metric: report column, compare rows, history values, check rows."""
    out = tmp / ("with" if added else "without")
    report = harness(added, "report", BASELINE, "-o", out / "report")
    assert report.returncode == 0, report.stderr
    with open(out / "report" / "table.csv", newline="") as f:
        table = list(csv.DictReader(f))
    compared = harness(added, "compare", BASELINE, BASELINE, "--format", "json")
    assert compared.returncode == 0, compared.stderr
    db = out / "history.sqlite"
    assert harness(added, "history", "add", "--db", db, BASELINE).returncode == 0
    shown = harness(added, "history", "show", "--db", db, "--format", "json")
    checked = harness(added, "history", "check", "--db", db, BASELINE, "--format", "json")
    assert shown.returncode == 0 and checked.returncode == 0, shown.stderr + checked.stderr
    series = json.loads(shown.stdout)["series"]
    return {
        "column": {row["run_id"]: row.get("flops_per_step") for row in table},
        "compare": [m for c in json.loads(compared.stdout)["cells"] for m in c["metrics"] if m["metric"] == NEW],
        "history": {s["run_id"]: r["values"].get(NEW) for s in series for r in s["runs"]},
        "check": {
            c["run_id"]: m["value"]
            for c in json.loads(checked.stdout)["cells"]
            for m in c["metrics"]
            if m["metric"] == NEW
        },
    }


@pytest.mark.slow
def test_a_metric_added_to_the_registry_reaches_report_compare_history_and_their_json(tmp_path):
    records, _ = load_records(BASELINE)
    flops = {r.run_id: r.metrics.flops_per_step for r in records}
    assert len(flops) == 25 and all(v for v in flops.values())

    added = everything(True, tmp_path)
    assert {k: float(v) for k, v in added["column"].items()} == flops  # table.csv: its column, every record's value
    assert len(added["compare"]) == 25  # compare: judged on every cell, exactly, as an exact metric is
    assert all(m["kind"] == "exact" and m["verdict"] == "unchanged" and m["unit"] == "FLOP" for m in added["compare"])
    assert added["history"] == flops  # the history stored it (a new column: the database was created with it)
    assert added["check"] == flops  # history check: judged on every cell

    plain = everything(False, tmp_path)
    assert set(plain["column"].values()) == {None} and plain["compare"] == [] and plain["check"] == {}
    assert set(plain["history"].values()) == {None}


def test_register_refuses_a_name_or_column_already_taken():
    with pytest.raises(ValueError, match="already registered"):
        register(Metric("mfu", ("metrics", "hfu"), "fraction", False, "sampled"))
    with pytest.raises(ValueError, match="already registered"):
        register(Metric("other", ("metrics", "hfu"), "fraction", False, "sampled", column="mfu"))
    assert [m.name for m in STORED] == [m.name for m in METRICS if m.judged]
    assert [m.name for m in COMPARED] == [m.name for m in STORED if m.compared]


def test_the_batched_reader_gives_every_metric_its_own_value():
    """MetricReader walks the registry's paths as one tree; on every stored record (the smoke baseline, the legacy
    smoke sweep, the report's fixtures with their nulls, traces and checkpoints) its values are each metric's own."""
    root = Path(__file__).resolve().parents[2]
    records, _ = load_records(
        root / "baselines" / "smoke-local", root / "tests" / "fixtures" / "smoke-legacy", root / "tests" / "fixtures"
    )
    assert len(records) >= 48
    reader = MetricReader(METRICS)
    seen = 0
    for rec in records:
        values = reader.values(rec)
        assert values == [m.value(rec) for m in METRICS], rec.origin
        seen += sum(v is not None for v in values)
    assert seen > 10 * len(records)  # many metrics are present: the test reads numbers, not only nulls
