"""The planner's caches cannot go stale (issue 29): every cache is functools.cache on frozen, hashable inputs (the
RunSpec, the ModelConfig, the rates, what is read of the cluster), so a prediction made with warm caches equals one
made from cold caches, whatever changed since.

Property test (hypothesis, bounded budget): draw a cell, a cluster and rates; plan the cell (warm caches); then
change each field of the spec (every Settings field, every model dimension, strategy, precision, gpus, nodes, gpus
per node, the model's name) and each figure of the rates (calibrated: a GEMM, attention, elementwise, per-op,
optimizer, framework, collective, sharing and wait figure, the device's name and cores, the file's date; profile: each
`performance:` figure and source), one at a time: the warm prediction of the changed input equals a cold one (every
cache cleared), and the unchanged input's prediction stays what it was.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import math
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from harness.core.catalogue import CATALOGUE, STRATEGIES
from harness.core.layout import PP_SCHEDULES, layout_problems
from harness.core.zoo import ModelConfig
from harness.plan import calibration as cal
from harness.plan import comm as cm
from harness.plan import predict as planner
from harness.plan.placement import Capacity
from harness.scenario.cluster import load_cluster
from harness.scenario.performance import LinkFigures
from harness.scenario.spec import RunSpec, Settings

NO_LIMIT = Capacity(None, "not checked here")

# alternatives each field may change to (one is drawn per example, different from the current value)
MODEL_DIMS: dict[str, tuple[Any, ...]] = {
    "d_model": (32, 64, 128),
    "n_layers": (1, 2, 3, 4),
    "n_heads": (2, 4),
    "ffn": (48, 96, 176),
    "vocab": (64, 256, 512),
    "n_kv_heads": (None, 1, 2),
}
SETTINGS: dict[str, tuple[Any, ...]] = {
    "micro_batch": (1, 2, 4),
    "seq_len": (16, 64, 128),
    "grad_accum": (1, 2, 3),
    "warmup_steps": (2, 3),
    "measure_steps": (1, 5),
    "activation_checkpointing": ("none", "full", "selective"),
    "compile": (False, True),
    "offload": ("none", "optimizer", "optimizer+params", "nvme"),
    "seed": (0, 7),
    "lr": (1e-3, 3e-4),
    "time_limit_s": (900.0, 60.0),
    "inject": (None, {"fault": "slow", "factor": 1.5}, {"fault": "crash", "rank": 1, "step": 2}),
    "tp": (1, 2),
    "pp": (1, 2),
    "pp_schedule": PP_SCHEDULES,
    "microbatches": (0, 1, 2),
    "sequence_parallel": (False, True),
    "deepspeed_config": (
        None,
        {"zero_optimization": {"reduce_bucket_size": 1000}},
        {"zero_optimization": {"stage3_prefetch_bucket_size": 0, "stage3_param_persistence_threshold": 10}},
    ),
    "nvme_path": ("", "/tmp/nvme"),
    "wrap_blocks": (0, 1, 2),
    "reshard_after_forward": (True, False),
    "prefetch_units": (1, 2),
    "forward_prefetch": (False, True),
    "backward_prefetch": ("backward_pre", "backward_post", "none"),
    "limit_all_gathers": (True, False),
    "bucket_cap_mb": (25.0, 0.01, 1.0),
}
SPEC: dict[str, tuple[Any, ...]] = {
    "model": ("m", "other-name"),
    "strategy": STRATEGIES,
    "precision": ("fp32", "bf16", "fp16"),
    "gpus": (1, 2, 4, 8),
    "gpus_per_node": (1, 2, 4),
    "nodes": (1, 2, 4),
}


def buildable(spec: RunSpec) -> bool:
    """Whether scenario validation would accept the cell's layout and model (a cell the planner is asked about)."""
    cfg, s = spec.model_config, spec.settings
    if cfg.d_model % cfg.n_heads or cfg.n_heads % cfg.kv_heads or cfg.head_size % 2:
        return False
    problems = layout_problems(
        gpus=spec.gpus,
        degrees=dict(s.degrees),
        cfg=cfg,
        schedule=s.pp_schedule,
        microbatches=s.microbatches,
        micro_batch=s.micro_batch,
        grad_accum=s.grad_accum,
    )
    return not problems


def with_field(spec: RunSpec, name: str, value: Any) -> RunSpec:
    """`spec` with one field changed: a model dimension, a setting or a field of the spec itself."""
    if name in MODEL_DIMS:
        return dataclasses.replace(spec, model_config=dataclasses.replace(spec.model_config, **{name: value}))
    if name in SETTINGS:
        return dataclasses.replace(spec, settings=dataclasses.replace(spec.settings, **{name: value}))
    if name == "gpus":  # the node layout follows the GPU count, as expansion makes it
        gpn = max(1, min(spec.gpus_per_node, value))
        return dataclasses.replace(spec, gpus=value, nodes=math.ceil(value / gpn), gpus_per_node=gpn)
    return dataclasses.replace(spec, **{name: value})


@st.composite
def cells(draw: st.DrawFn) -> RunSpec:
    d_model = draw(st.sampled_from(MODEL_DIMS["d_model"]))
    n_heads = draw(st.sampled_from(MODEL_DIMS["n_heads"]))
    cfg = ModelConfig(
        d_model=d_model,
        n_layers=draw(st.sampled_from(MODEL_DIMS["n_layers"])),
        n_heads=n_heads,
        ffn=draw(st.sampled_from(MODEL_DIMS["ffn"])),
        vocab=draw(st.sampled_from(MODEL_DIMS["vocab"])),
        n_kv_heads=draw(st.sampled_from((None, 1, n_heads))),
    )
    layout = draw(st.sampled_from(((1, 1), (1, 1), (2, 1), (1, 2))))
    gpus = draw(st.sampled_from((2, 4, 8) if layout != (1, 1) else SPEC["gpus"]))
    gpn = draw(st.sampled_from((2, 4) if layout[0] > 1 else SPEC["gpus_per_node"]))
    gpn = min(gpn, gpus)
    strategy = draw(st.sampled_from(("fsdp2.full_shard", "ddp") if layout != (1, 1) else STRATEGIES))
    settings = Settings(
        micro_batch=draw(st.sampled_from((2, 4))),
        seq_len=draw(st.sampled_from(SETTINGS["seq_len"])),
        activation_checkpointing=draw(st.sampled_from(SETTINGS["activation_checkpointing"])),
        tp=layout[0],
        pp=layout[1],
        sequence_parallel=draw(st.booleans()),
    )
    spec = RunSpec(
        model="m",
        model_config=cfg,
        strategy=strategy,
        precision=draw(st.sampled_from(("fp32", "bf16"))),
        gpus=gpus,
        nodes=math.ceil(gpus / gpn),
        gpus_per_node=gpn,
        settings=settings,
    )
    return spec if buildable(spec) else dataclasses.replace(spec, settings=Settings())


def calibrated(data: dict[str, Any]) -> cal.CalibratedRates:
    return cal.CalibratedRates(cal.Found(Path("drawn.json"), data, None))


def calibration_changes(data: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """One changed copy of the calibration per kind of figure the time model reads."""

    def changed(what: str, edit: Any) -> tuple[str, dict[str, Any]]:
        d = copy.deepcopy(data)
        edit(d)
        return what, d

    c = "compute"
    return [
        changed("a GEMM's time", lambda d: d[c]["gemm"][len(d[c]["gemm"]) // 2].update(s=1.0)),
        changed("every fp32 GEMM", lambda d: [g.update(s=g["s"] * 2) for g in d[c]["gemm"] if g["dtype"] == "float32"]),
        changed("attention", lambda d: [a.update(forward_s=a["forward_s"] * 3) for a in d[c]["attention"]]),
        changed("elementwise", lambda d: d[c]["elementwise"][0].update(gbps=1.0)),
        changed("per-op dispatch", lambda d: d[c]["dispatch"].update(backward_s=1e-3)),
        changed("optimizer", lambda d: d[c]["optimizer"].update(per_element_s=1e-6)),
        changed("framework", lambda d: [f.update(per_block_s=0.5) for f in d[c]["framework"].values()]),
        changed("a collective curve", lambda d: [e.update(times=[t * 5 for t in e["times"]]) for e in d["comm"]]),
        changed("bus bandwidth", lambda d: [e.update(busbw_gbps=0.01) for e in d["comm"]]),
        changed(
            "sharing",
            lambda d: d.update(
                sharing=[
                    {"ranks": 1, "gemm_s": 1.0, "elementwise_s": 1.0, "optimizer_s": 1.0},
                    {"ranks": 2, "gemm_s": 1.5, "elementwise_s": 2.5, "optimizer_s": 1.5, "sync_wait_s": 0.002},
                ]
            ),
        ),  # fmt: skip
        changed(
            "the device",
            lambda d: d["fingerprint"].update(device="cuda" if d["fingerprint"]["device"] == "cpu" else "cpu"),
        ),  # fmt: skip
        changed("the GPU's name", lambda d: d["fingerprint"].update(device_name="NVIDIA A100-SXM4-80GB")),
        changed("the host's cores", lambda d: d["fingerprint"].update(cpu_count=1)),
        changed("the date", lambda d: d.update(created_at="2030-01-01T00:00:00+00:00")),
    ]


def profile_changes(cluster: Any) -> list[tuple[str, Any]]:
    """One changed profile per `performance:` figure and its sources."""
    perf = cluster.performance

    def with_perf(**kw: Any) -> Any:
        return dataclasses.replace(cluster, performance=dataclasses.replace(perf, **kw))

    return [
        ("bf16 matmul", with_perf(matmul_tflops={**perf.matmul_tflops, "bf16": 123.0})),
        ("fp32 matmul", with_perf(matmul_tflops={**perf.matmul_tflops, "fp32": 7.0})),
        ("memory bandwidth", with_perf(memory_gbps=1234.0)),
        ("intra-node busbw", with_perf(intra_node=dataclasses.replace(perf.intra_node, busbw_gbps=9.0))),
        ("intra-node latency", with_perf(intra_node=dataclasses.replace(perf.intra_node, latency_us=99.0))),
        ("inter-node figures", with_perf(inter_node=LinkFigures(busbw_gbps=3.0, latency_us=30.0))),
        ("sources", with_perf(sources={**perf.sources, "memory_gbps": "a new source"})),
        ("hop latency", with_perf(intra_node=dataclasses.replace(perf.intra_node, hop_latency_us=0.9))),
        ("collective model", with_perf(collectives="nccl-ring" if perf.collectives == "flat" else "flat")),
        ("kernel efficiency", with_perf(efficiency=(("attention", 0.3),))),
        ("price", with_perf(price_per_gpu_hour=2.5)),
    ]


def plan(spec: RunSpec, cluster: Any, rates: cal.Rates) -> tuple[Any, ...]:
    """Everything the planner says about a cell: the plan's JSON form and the collective summary (or the error)."""
    try:
        (cell,) = planner.plan_cells([spec], cluster, cap=NO_LIMIT, rates=rates)
        return ("ok", json.dumps(cell.to_dict()), json.dumps(cm.predict_comm(spec)))
    except Exception as e:  # noqa: BLE001 - a cell the model refuses must refuse alike warm and cold
        return ("raised", type(e).__name__, str(e))


def cold(spec: RunSpec, cluster: Any, rates: cal.Rates) -> tuple[Any, ...]:
    planner.clear_caches()
    return plan(spec, cluster, rates)


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(spec=cells(), data=st.data())
def test_a_warm_prediction_equals_a_cold_one_whatever_changed(spec, data):
    gpu = data.draw(st.booleans(), label="gpu cluster")
    cluster = load_cluster("h100") if gpu else load_cluster("local")
    calib = cal.example_calibration(cluster.name, device=cluster.device, tflops=400 if gpu else 0.05)
    rates: cal.Rates = calibrated(calib) if data.draw(st.booleans(), label="calibrated") else cal.ProfileRates(cluster)
    planner.clear_caches()
    first = plan(spec, cluster, rates)

    changed_specs = []
    for name, values in {**MODEL_DIMS, **SETTINGS, **SPEC}.items():
        current = getattr(spec.model_config, name, None) if name in MODEL_DIMS else None
        current = getattr(spec.settings, name) if name in SETTINGS else current
        current = getattr(spec, name) if name in SPEC else current
        others = [v for v in values if v != current]
        other = with_field(spec, name, data.draw(st.sampled_from(others), label=name))
        if buildable(other) or name in SETTINGS:
            changed_specs.append((name, other))
    for name, other in changed_specs:
        warm = plan(other, cluster, rates)
        assert warm == cold(other, cluster, rates), f"stale after changing {name}"
        assert plan(spec, cluster, rates) == first, f"the unchanged cell moved after {name}"

    if isinstance(rates, cal.CalibratedRates):
        changed_rates: list[tuple[str, cal.Rates, Any]] = [
            (what, calibrated(d), cluster) for what, d in calibration_changes(calib)
        ]
    else:
        changed_rates = [(what, cal.ProfileRates(c), c) for what, c in profile_changes(cluster)]
    moved = 0
    for what, other_rates, other_cluster in changed_rates:
        assert other_rates != rates and hash(other_rates) != hash(rates), what
        warm = plan(spec, other_cluster, other_rates)
        assert warm == cold(spec, other_cluster, other_rates), f"stale after changing the rates' {what}"
        moved += warm != first
        assert plan(spec, cluster, rates) == first, f"the unchanged cell moved after the rates' {what}"
    # the figures are read: some change moves the prediction of a cell the model prices (the property is not vacuous)
    if first[0] == "ok" and json.loads(first[1])["step_time_s"] is not None:
        assert moved > 0


def test_equal_rates_are_one_cache_key_and_rates_are_frozen():
    data = cal.example_calibration("local")
    a, b = calibrated(data), calibrated(copy.deepcopy(data))
    assert a == b and hash(a) == hash(b) and a is not b
    other = copy.deepcopy(data)
    other["compute"]["dispatch"]["forward_s"] = 2e-5
    assert calibrated(other) != a
    moved = cal.CalibratedRates(cal.Found(Path("elsewhere.json"), data, None))
    assert moved != a  # another file is another source (the prediction names it)
    with pytest.raises(AttributeError, match="frozen"):
        a.device = "cuda"
    cluster = load_cluster("h100")
    assert cal.ProfileRates(cluster) == cal.ProfileRates(cluster)
    faster = dataclasses.replace(
        cluster, performance=dataclasses.replace(cluster.performance, memory_gbps=1.0)
    )  # fmt: skip
    assert cal.ProfileRates(faster) != cal.ProfileRates(cluster)


def test_rates_for_a_profile_edited_in_process_are_its_own(tmp_path, monkeypatch):
    """rates_for is cached on what it reads of the profile: before, its key left out the performance figures, so a
    profile changed in-process (same name, same file) kept the old figures."""
    monkeypatch.setenv(cal.CALIBRATION_DIR_ENV, str(tmp_path))
    cluster = load_cluster("h100")
    faster = dataclasses.replace(cluster, performance=dataclasses.replace(cluster.performance, memory_gbps=1.0))
    assert cal.rates_for(cluster).perf.memory_gbps == cluster.performance.memory_gbps
    assert cal.rates_for(faster).perf.memory_gbps == 1.0


def test_every_collective_model_reads_only_fields_of_the_comm_cell():
    """A collective model's ledger is cached on the CommCell fields its signature names: each must be one."""
    fields = {f.name for f in dataclasses.fields(cm.CommCell)}
    for name in cm.COMM_MODELS:
        assert set(cm.model_reads(name)) <= fields, name
    # DDP's ledger does not depend on the precision or the accumulation: one ledger for all of them
    assert cm.model_reads("ddp") == ("model_config", "bucket_cap_mb")
    assert "checkpointing" in cm.model_reads("zero3") and "zero3" in cm.model_reads("zero3")
    assert all(CATALOGUE[s].comm_model in cm.COMM_MODELS for s in STRATEGIES)
