"""harness.plan.predict: predict() for the dispatcher, and `harness plan` (through harness.cli.main)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from harness.cli import main
from harness.core.zoo import ZOO
from harness.plan import memory as mb
from harness.plan import predict as planner
from harness.report.plan import planned_cell_json
from harness.scenario.cluster import load_cluster
from harness.scenario.schema import load_scenario
from harness.scenario.spec import RunSpec
from tests.conftest import run_light

REPO = Path(__file__).resolve().parents[2]
FIXTURES = REPO / "tests" / "fixtures" / "scenarios"
PLAN_7B = str(FIXTURES / "plan-7b.yaml")
PLAN_OPTIONS = str(FIXTURES / "plan-options.yaml")
PARTS = {"params", "grads", "optimizer", "activations", "buffers", "total"}


def plan_json(capsys, *args: str) -> list[dict]:
    assert main(["plan", *args, "--format", "json"]) == 0
    return json.loads(capsys.readouterr().out)


def by_name(cells: list[dict]) -> dict[tuple, dict]:
    return {
        (
            c["spec"]["model"],
            c["spec"]["strategy"],
            c["spec"]["gpus"],
            c["spec"]["offload"],
            c["spec"]["activation_checkpointing"],
        ): c
        for c in cells
    }


def test_plan_json_on_a100(capsys):
    cells = plan_json(capsys, PLAN_7B, "--cluster", "a100")
    assert len(cells) == 10  # 5 strategies x 2 GPU counts
    specs = load_scenario(PLAN_7B).expand(gpus_per_node=8)
    assert [c["run_id"] for c in cells] == [s.run_id for s in specs]
    for c in cells:
        assert set(c["memory_gib"]) == PARTS
        assert c["memory_gib"]["total"] == pytest.approx(sum(c["memory_gib"][k] for k in PARTS - {"total"}), abs=1e-3)
        assert c["device_memory_gib"] == 80
        assert c["flops_per_step"] == pytest.approx(ZOO["7b"].flops_per_token(2048) * 2048 * c["spec"]["gpus"])
        assert "comm_bytes_per_step" in c
        assert c["unsupported"] is None
    cell = by_name(cells)
    ddp1 = cell[("7b", "ddp", 1, "none", "none")]
    assert ddp1["fits"] is False and ddp1["memory_gib"]["total"] > 100
    assert ddp1["reason"].startswith("predicted ") and "> 79.0 GiB usable" in ddp1["reason"]
    assert cell[("7b", "zero3", 8, "none", "none")]["fits"] is True
    assert cell[("7b", "fsdp.full_shard", 8, "none", "none")]["fits"] is True
    for strategy in ("ddp", "zero1", "zero2", "zero3", "fsdp.full_shard"):
        assert cell[("7b", strategy, 1, "none", "none")]["fits"] is False  # 16 B/param alone is 100 GiB
    assert cell[("7b", "ddp", 8, "none", "none")]["fits"] is False  # DDP replicates: 8 GPUs do not help
    assert cell[("7b", "zero3", 8, "none", "none")]["reason"] is None


def test_plan_table_marks_cells_that_do_not_fit(capsys):
    assert main(["plan", PLAN_7B, "--cluster", "a100", "--wide"]) == 0
    out = capsys.readouterr().out
    rows = {" ".join(line.split()[:4]): line for line in out.splitlines()}
    assert " NO " in rows["7b ddp bf16 g1"]
    assert " yes " in rows["7b zero3 bf16 g8"]
    assert "6 predicted not to fit" in out
    assert "80 GiB per device, 79 GiB usable" in out


def test_plan_shows_unsupported_cells_and_cpu_memory(capsys):
    cells = plan_json(capsys, PLAN_OPTIONS, "--cluster", "h200")
    cell = by_name(cells)
    ddp = cell[("7b", "ddp", 8, "optimizer", "none")]
    assert ddp["unsupported"] == "ddp has no CPU offload" and ddp["memory_gib"] is None and ddp["fits"] is None
    z3 = cell[("7b", "zero3", 1, "optimizer+params", "none")]
    assert z3["cpu_memory_gib"] > 100 and z3["memory_gib"]["optimizer"] == 0 and z3["fits"] is True
    assert (
        cell[("1.3b", "zero3", 8, "none", "full")]["memory_gib"]["activations"]
        < cell[("1.3b", "zero3", 8, "none", "none")]["memory_gib"]["activations"]
    )
    ck = cell[("1.3b", "fsdp.full_shard", 8, "none", "full")]
    assert ck["hardware_flops_per_step"] > ck["flops_per_step"]
    assert main(["plan", PLAN_OPTIONS, "--cluster", "h200", "--wide"]) == 0
    table = capsys.readouterr().out
    assert "unsupported: ddp has no CPU offload" in table
    z3_row = next(line for line in table.splitlines() if line.startswith("7b zero3 bf16 g1"))
    assert f"{z3['cpu_memory_gib']:.1f}" in z3_row


def test_plan_on_local_cluster_cannot_say_what_fits(capsys):
    cells = plan_json(capsys, PLAN_7B)  # default cluster: local, device memory unknown
    assert all(c["fits"] is None and c["reason"] is None and c["device_memory_gib"] is None for c in cells)
    # local simulates nodes of 2 ranks: the same scenario expands with gpus_per_node 2
    assert {c["spec"]["gpus_per_node"] for c in cells} == {1, 2}


def test_plan_bad_input_exits_2(capsys, tmp_path):
    assert main(["plan", str(tmp_path / "missing.yaml")]) == 2
    assert main(["plan", PLAN_7B, "--cluster", "nope"]) == 2
    bad = tmp_path / "bad.yaml"
    bad.write_text("matrix: {model: [7b], strategy: [zero4], precision: [bf16], gpus: [1]}\n")
    assert main(["plan", str(bad)]) == 2
    assert "zero4" in capsys.readouterr().err


def test_predict_api_for_the_dispatcher():
    cluster = load_cluster("a100")
    spec = next(s for s in load_scenario(PLAN_7B).expand(gpus_per_node=8) if s.strategy == "zero1" and s.gpus == 1)
    got = planner.predict(spec, cluster).to_dict()
    assert {
        "memory_gib",
        "cpu_memory_gib",
        "device_memory_gib",
        "fits",
        "flops_per_step",
        "hardware_flops_per_step",
        "reason",
    } <= set(got)
    m = got["memory_gib"]
    assert got["fits"] is False
    parts = " + ".join(f"{k} {m[k]:.1f}" for k in ("params", "grads", "optimizer", "activations", "buffers"))
    assert got["reason"] == (
        f"predicted {m['total']:.1f} GiB per rank ({parts}) > 79.0 GiB usable "
        "(80.0 GiB device memory - 1.0 GiB CUDA context/NCCL reserve)"
    )
    assert got["grads_after_backward_gib"] == pytest.approx(2 * spec.model_config.n_params() / 2**30, abs=1e-3)
    assert got["peak_at"] in mb.WINDOWS
    json.dumps(got, allow_nan=False)


def test_fits_uses_the_reserve():
    base = load_cluster("a100")
    spec = next(s for s in load_scenario(PLAN_7B).expand(gpus_per_node=8) if s.strategy == "zero3" and s.gpus == 8)
    total = planner.predict(spec, base).to_dict()["memory_gib"]["total"]
    just_enough = type(base)(**{**base.__dict__, "device_memory_gib": total + mb.DEVICE_RESERVE_GIB + 0.01})
    too_small = type(base)(**{**base.__dict__, "device_memory_gib": total + mb.DEVICE_RESERVE_GIB / 2})
    assert planner.predict(spec, just_enough).to_dict()["fits"] is True
    assert planner.predict(spec, too_small).to_dict()["fits"] is False


def test_comm_bytes_are_the_comm_models():
    from harness.plan.comm import no_comm_model_reason, predict_comm

    cluster = load_cluster("a100")
    specs = load_scenario(PLAN_7B).expand(gpus_per_node=8)
    for spec in specs[:6]:
        got = planner.predict(spec, cluster).to_dict()["comm_bytes_per_step"]
        assert got == predict_comm(spec)["bytes_per_step"] and got > 0
    zero3 = next(s for s in specs if s.strategy == "zero3")
    offload = dataclasses.replace(zero3, settings=dataclasses.replace(zero3.settings, offload="optimizer"))
    assert no_comm_model_reason(offload) is not None  # DeepSpeed's offload paths: no collective model
    assert planner.predict(offload, cluster).to_dict()["comm_bytes_per_step"] is None


@pytest.mark.parametrize("fmt", ["json", "table"])
def test_plan_does_not_import_torch(fmt):
    """Nor pandas or matplotlib: the plan's renderer (harness.report.plan) is in a package that imports its build
    (which loads both) only when asked for it."""
    stdout = run_light(["plan", str(PLAN_7B), "--cluster", "a100", "--format", fmt])
    if fmt == "table":
        assert "\n10 cells; 6 predicted not to fit (NO)\n" in stdout
        return
    assert len(json.loads(stdout)) == 10


def test_a_plan_asks_each_cell_once_whether_it_can_run(monkeypatch):
    """plan_cells asks RunSpec.unsupported_reason() once per cell and hands the answer to the collective and step-time
    models (harness.plan.runnable), cold caches or warm; predict() on its own asks once too."""
    specs = load_scenario(PLAN_OPTIONS).expand(gpus_per_node=8)
    assert any(s.unsupported_reason() for s in specs) and any(s.unsupported_reason() is None for s in specs)
    cluster = load_cluster("h100")
    asked: list[str] = []
    original = RunSpec.unsupported_reason

    def counting(self: RunSpec, device: str | None = None) -> str | None:
        asked.append(self.run_id)
        return original(self, device)

    monkeypatch.setattr(RunSpec, "unsupported_reason", counting)
    planner.clear_caches()
    cold = [planned_cell_json(c) for c in planner.plan_cells(specs, cluster)]
    assert sorted(asked) == sorted(s.run_id for s in specs)
    asked.clear()
    assert [planned_cell_json(c) for c in planner.plan_cells(specs, cluster)] == cold
    assert sorted(asked) == sorted(s.run_id for s in specs)
    for spec in specs:
        asked.clear()
        planner.clear_caches()
        planner.predict(spec, cluster)
        assert asked == [spec.run_id]
