"""The smoke sweep end to end, as `make sweep` runs it: every cell ok, records complete, the report builds,
and the deterministic metrics (collective bytes, predicted memory and bytes) equal the committed baseline
— so a change that alters a strategy's communication volume or memory plan fails CI.

To accept an intended change: `make baseline` (re-sweeps and promotes results into baselines/smoke-local)."""

from __future__ import annotations

import re

import pytest

from harness.cli import main
from harness.scenario.schema import load_scenario
from tests.conftest import REPO

pytestmark = pytest.mark.dist
BASELINE = REPO / "baselines" / "smoke-local"


def test_every_smoke_cell_is_ok(smoke_sweep):
    specs = load_scenario(REPO / "scenarios" / "smoke.yaml").expand(gpus_per_node=2)
    assert smoke_sweep["code"] == 0 and not smoke_sweep["warnings"]
    assert set(smoke_sweep["records"]) == {s.run_id for s in specs}
    for rec in smoke_sweep["records"].values():
        assert rec["status"] == "ok", (rec["run_id"], rec["reason"])
        m = rec["metrics"]
        assert len(m["step_time_s"]["samples"]) == rec["spec"]["measure_steps"]
        assert m["tokens_per_s"] == pytest.approx(m["tokens_per_s_per_gpu"] * rec["spec"]["gpus"])
        assert m["mfu"] is None and "no dense peak" in m["null_reasons"]["mfu"]  # CPU: no invented MFU
        assert m["peak_memory_allocated_gib"] > 0
        assert rec["comm"]["bytes_per_step"] > 0 and rec["predicted"]["memory_gib"]["total"] > 0


def test_every_cells_measured_tensor_memory_is_its_prediction(smoke_sweep):
    """Issue 54: in every smoke cell, the tensor-memory meter's peak (the largest rank's) within 5% of the record's
    own prediction, and each category of at least 1 MiB within 5% where the plan's peak moment is clear (leads the
    next by more than 1%; tests/dist/test_tensor_memory.py says why)."""
    from harness.plan.memory import memory
    from harness.results.spec import spec_from_json

    categories = ("params", "grads", "optimizer", "activations", "buffers")
    for rec in smoke_sweep["records"].values():
        got, want = rec["metrics"]["memory_gib"], rec["predicted"]["memory_gib"]
        why = f"{rec['run_id']}: measured {got}, predicted {want} at the {rec['predicted']['peak_at']}"
        assert got["total"] == pytest.approx(want["total"], rel=0.05), why
        plan = memory(spec_from_json(rec["spec"]), device="cpu")
        assert plan.gib()["total"] == pytest.approx(want["total"], abs=1e-6)  # the record's prediction is this plan
        first, second = sorted(plan.window_totals.values(), reverse=True)[:2]
        for c in categories:
            if first > 1.01 * second and max(got[c], want[c]) >= 1 / 1024:
                assert got[c] == pytest.approx(want[c], rel=0.05), f"{c} {why}"
        assert rec["metrics"]["memory_fragmentation_gib"] is None  # CPU: no caching allocator


def test_every_line_that_names_a_cell_shows_its_layout(smoke_sweep):
    """The layout cells share the rest of their run_id with the plain ones (issue 31): each line says which it is,
    and the libraries' import chatter (DeepSpeed's "Setting accelerator to CPU") is in the zygote's log, not here."""
    lines = [x for x in smoke_sweep["output"].splitlines() if x.startswith("[")]
    assert len(lines) == 25
    tags = sorted(m.group(1) for x in lines if (m := re.match(r"\[\d+/25\] \S+ \[([^\]]+)\]  ", x)))
    assert tags == ["pp2 (1f1b)", "tp2", "tp2"], lines
    assert "Setting accelerator" not in smoke_sweep["output"]
    log = smoke_sweep["results"] / "smoke" / ".submitit" / "prefork.log"
    assert "Setting accelerator to CPU" in log.read_text()


def test_deepspeed_cells_compile_nothing(smoke_sweep):
    """DeepSpeed's CPU comm layer would JIT-compile its shared-memory all_reduce (deepspeed_shm_comm, used only by
    inference_all_reduce) in every rank's startup: 30-65 s of g++ on a fresh machine. The zero cells skip it."""
    zero = [r for r in smoke_sweep["records"].values() if r["spec"]["strategy"].startswith("zero")]
    assert len(zero) == 6 and all(r["status"] == "ok" for r in zero)
    assert smoke_sweep["extensions"] == []


def test_deterministic_metrics_equal_the_committed_baseline(smoke_sweep, capsys):
    code = main(["compare", str(BASELINE), str(smoke_sweep["results"]), "--metric", "exact", "--fail-on-missing"])
    out = capsys.readouterr().out
    assert code == 0, out


def test_report_builds_from_the_sweep(smoke_sweep, tmp_path):
    out = tmp_path / "report"
    assert main(["report", str(smoke_sweep["results"]), "-o", str(out)]) == 0
    html = (out / "index.html").read_text()
    assert html.count("data:image/png;base64,") >= 5
    assert "tiny" in (out / "report.md").read_text()
