"""Measured collectives equal the analytic model (harness.plan.comm), on real gloo groups.

Every strategy × {fp32, bf16} on the tiny model, world 2 (hybrids 4 = 2 nodes × 2) — the cells of
scenarios/smoke.yaml, swept once per session (the `smoke_sweep` fixture) — the meter's record of the
counted step (`comm`, what harness.worker.meters.comm counted over one untimed step after the timed ones) against `predict_comm(spec)`, and against the
`predicted` section the sweep wrote into the same record. The
requirement is bytes per step within 1%; the model is exact, so calls, bytes and dtypes per collective
and the intra-/inter-node split are asserted equal too.
"""

from __future__ import annotations

import pytest

from harness.plan.comm import predict_comm
from harness.scenario.spec import HYBRID_STRATEGIES, STRATEGIES, RunSpec
from harness.results.spec import spec_from_json

pytestmark = pytest.mark.dist


def _ledger(pred: dict) -> str:
    return "\n".join(f"  {i['calls']:g} x {i['bytes_per_call']} B {i['collective']} {i['dtype']} {i['group']}: {i['what']}"
                     for i in pred["items"])


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
@pytest.mark.parametrize("strategy", STRATEGIES)
def test_measured_comm_equals_prediction(strategy, precision, smoke_sweep):
    (rec,) = [r for r in smoke_sweep["records"].values()
              if (r["spec"]["strategy"], r["spec"]["precision"]) == (strategy, precision)
              and r["spec"].get("tp", 1) == r["spec"].get("pp", 1) == 1]  # layout cells: tests/dist/test_layouts.py
    assert rec["status"] == "ok", rec.get("reason")
    spec = spec_from_json(rec["spec"])
    pred = predict_comm(spec)
    assert pred is not None
    got = rec["comm"]
    # counted over one untimed step after the timed ones: the timed steps never run the meter
    assert got["measured_steps"] == 1
    assert got["counted_step"] == spec.settings.warmup_steps + spec.settings.measure_steps + 2  # after the memory step
    # the record carries the prediction beside the measurement, and they agree
    assert rec["predicted"]["comm_bytes_per_step"] == pred["comm_bytes_per_step"]
    assert rec["predicted"]["comm_deviation"] == 0.0
    why = f"\nmeasured {got['by_collective']}\npredicted ledger:\n{_ledger(pred)}"

    # the requirement: bytes per step within 1%
    assert got["bytes_per_step"] == pytest.approx(pred["comm_bytes_per_step"], rel=0.01), why
    # what the model claims: every byte and every call, per collective, dtype and group kind
    assert got["bytes_per_step"] == pred["comm_bytes_per_step"], why
    assert got["calls_per_step"] == pred["calls_per_step"], why
    assert set(got["by_collective"]) == set(pred["by_collective"]), why
    for name, m in got["by_collective"].items():
        p = pred["by_collective"][name]
        assert (m["calls"], m["bytes"], m["dtype"]) == (p["calls"], p["bytes"], p["dtype"]), f"{name}{why}"
        assert m["dtypes"] == p["dtypes"], f"{name}{why}"
    assert {k: (v["calls"], v["bytes"]) for k, v in got["by_group"].items()} == \
        {k: (v["calls"], v["bytes"]) for k, v in pred["by_group"].items()}, why
    if strategy in HYBRID_STRATEGIES:
        assert got["by_group"]["inter"]["bytes"] > 0
    # each collective of the counted step was timed on its own: algbw = bytes / time, busbw = algbw x the
    # nccl-tests factor of its group size (world 2: all_reduce 2(n-1)/n = 1, all_gather / reduce_scatter 1/2)
    assert 0 < got["time_s_per_step"] < got["counted_step_time_s"]
    for name, m in got["by_collective"].items():
        if name == "barrier" or m["bytes"] == 0:
            continue
        assert m["time_s"] > 0
        assert m["algbw_gbps"] == pytest.approx(m["bytes"] / m["time_s"] / 1e9, rel=1e-9)
        if strategy not in HYBRID_STRATEGIES:  # one group size: the factor is exact
            factor = {"all_reduce": 1.0, "all_gather": 0.5, "reduce_scatter": 0.5, "broadcast": 1.0}[name]
            assert m["busbw_gbps"] == pytest.approx(factor * m["algbw_gbps"], rel=1e-9)


MID = {"d_model": 384, "n_layers": 2, "n_heads": 6, "ffn": 1024, "vocab": 1024}
"""big enough that DeepSpeed's defaults keep no block parameter resident (the tiny model's all are)"""


@pytest.mark.parametrize("policy, measured, calls", [
    ("none", 41696264, 30), ("full", 43269128, 31), ("selective", 43269128, 31),
])
def test_zero3_regathers_and_checkpointing_recompute_with_lowered_knobs(policy, measured, calls, results,
                                                                        monkeypatch):
    """ZeRO-3 with stage3_max_reuse_distance and the prefetch bucket lowered (through the diagnostic
    HARNESS_DS_ZERO_OVERRIDES) so that parameters are released after forward and gathered again in backward,
    and the recomputed forward of both checkpointing policies gathers once more: the coordinator simulation
    in comm_model predicts every call and byte, and selective (whose recompute skips the matmuls but still
    runs every module's gather hook) gathers exactly what full does."""
    import json

    import harness.plan.comm as cm
    from harness.scenario.schema import parse_scenario
    from harness.worker.strategies.zero import ZERO_OVERRIDES_ENV
    from tests.conftest import run_cell

    monkeypatch.setenv(ZERO_OVERRIDES_ENV, json.dumps({"stage3_max_reuse_distance": 5_000_000,
                                                       "stage3_prefetch_bucket_size": 0}))
    monkeypatch.setattr(cm, "ZERO3", cm.Zero3Config(max_reuse_distance=5_000_000, prefetch_bucket=0))
    doc = {"name": "t", "models": {"mid": MID},
           "matrix": {"model": ["mid"], "strategy": ["zero3"], "precision": ["fp32"], "gpus": [2]},
           "settings": {"activation_checkpointing": policy, "warmup_steps": 2, "measure_steps": 2}}
    (spec,) = parse_scenario(doc, "t").expand(gpus_per_node=2)
    rec = run_cell(spec, results)
    assert rec["status"] == "ok", rec.get("reason")
    assert rec["env"]["deepspeed_config"]["zero_optimization"]["stage3_max_reuse_distance"] == 5_000_000
    pred = predict_comm(spec)
    assert (pred["comm_bytes_per_step"], pred["calls_per_step"]) == (measured, calls)
    got = rec["comm"]
    why = f"\nmeasured {got['by_collective']}\npredicted ledger:\n{_ledger(pred)}"
    assert (got["bytes_per_step"], got["calls_per_step"]) == (measured, calls), why


def test_a_users_deepspeed_config_runs_merged_and_its_buckets_are_priced(tmp_path, results):
    """A scenario's `deepspeed_config` file (issue 53) on a real ZeRO-3 cell: no parameter persistent, none kept
    for its reuse nor prefetched (so every one is gathered in forward and again in backward), and reduce buckets of
    20,000 elements. The cell runs with the merged config (the record says so, the harness's keys kept), and the
    collectives it issues are the planner's for those values, to the byte: 42 gathers and 9 reduce buckets, 1.99 MB,
    where DeepSpeed's defaults give 21 gathers, 1 bucket and 1.33 MB."""
    import dataclasses
    import json

    from harness.scenario.schema import load_scenario
    from tests.conftest import run_cell

    zero = {"stage3_param_persistence_threshold": 0, "stage3_max_reuse_distance": 0,
            "stage3_prefetch_bucket_size": 0, "reduce_bucket_size": 20000}
    user = {"zero_optimization": zero, "wall_clock_breakdown": False}
    (tmp_path / "ds.json").write_text(json.dumps(user))
    (tmp_path / "s.yaml").write_text(
        "name: t\nmatrix: {model: [tiny], strategy: [zero3], precision: [fp32], gpus: [2]}\n"
        "settings: {deepspeed_config: ds.json, warmup_steps: 2, measure_steps: 1}\n")
    (spec,) = load_scenario(tmp_path / "s.yaml").expand(gpus_per_node=2)
    rec = run_cell(spec, results)
    assert rec["status"] == "ok", rec.get("reason")
    assert rec["spec"]["deepspeed_config"] == user
    ran = rec["env"]["deepspeed_config"]["zero_optimization"]
    assert ran == {"stage": 3, **zero}
    pred = predict_comm(spec)
    default = predict_comm(dataclasses.replace(spec, settings=dataclasses.replace(spec.settings, deepspeed_config=None)))
    assert (pred["comm_bytes_per_step"], pred["calls_per_step"]) == (1994504, 52)
    assert (default["comm_bytes_per_step"], default["calls_per_step"]) == (1329672, 23)
    got = rec["comm"]
    why = f"\nmeasured {got['by_collective']}\npredicted ledger:\n{_ledger(pred)}"
    assert (got["bytes_per_step"], got["calls_per_step"]) == (pred["comm_bytes_per_step"], pred["calls_per_step"]), why
    for name, m in got["by_collective"].items():
        p = pred["by_collective"][name]
        assert (m["calls"], m["bytes"], m["dtype"]) == (p["calls"], p["bytes"], p["dtype"]), f"{name}{why}"
