"""The strategy catalogue (harness.core.catalogue) is the one list every stage reads: scenario validation, the
worker's family lookup, the planner's models, the prefork preload and the report's colours."""

from __future__ import annotations

import dataclasses
import importlib
import subprocess
import sys

import pytest

from harness.core import catalogue
from harness.core.catalogue import (
    CATALOGUE,
    COMM_MODELS,
    FAMILY_MODULES,
    MEMORY_MODELS,
    MESHES,
    MIXED_MODES,
    OFFLOADS,
    OVERLAPS,
    PALETTE,
    PRECISIONS,
    STRATEGIES,
    UNKNOWN_COLOUR,
    Strategy,
    palette_colour,
    strategy_colours,
)
from harness.core.errors import InputError
from harness.plan import calibration as cal
from harness.plan import comm as cm
from harness.plan import memory as mb
from harness.plan import overlap as ov
from harness.scenario import schema
from harness.scenario import spec as cell
from tests.conftest import make_spec

TODAY = (
    "ddp",
    "fsdp.full_shard",
    "fsdp.shard_grad_op",
    "fsdp.no_shard",
    "fsdp.hybrid_shard",
    "fsdp.hybrid_shard_zero2",
    "fsdp2.full_shard",
    "fsdp2.hybrid_shard",
    "zero1",
    "zero2",
    "zero3",
)
TODAY_COLOURS = (
    "#000000",
    "#0072B2",
    "#56B4E9",
    "#332288",
    "#44AA99",
    "#999933",
    "#009E73",
    "#CC79A7",
    "#E69F00",
    "#D55E00",
    "#882255",
)


def _is_grey(hex_colour: str) -> bool:
    r, g, b = (int(hex_colour[i : i + 2], 16) for i in (1, 3, 5))
    return max(r, g, b) - min(r, g, b) < 32


@pytest.mark.parametrize("name", STRATEGIES)
def test_every_entry_names_a_family_module_that_builds_it(name):
    entry = CATALOGUE[name]
    module = importlib.import_module(entry.module)
    assert module.__name__ == f"harness.worker.strategies.{entry.family}"
    assert callable(module.setup)
    from harness.worker.strategies import family, family_name

    assert family(name) is module and family_name(name) == entry.family


@pytest.mark.parametrize("name", STRATEGIES)
def test_every_entry_is_well_formed(name):
    e = CATALOGUE[name]
    assert e.name == name
    assert e.mesh in MESHES and e.mixed in MIXED_MODES
    assert e.memory_model in MEMORY_MODELS and e.memory_model in mb.MEMORY_MODELS
    assert e.comm_model in COMM_MODELS and e.comm_model in cm.COMM_MODELS
    assert e.overlap in OVERLAPS and e.overlap in ov.OVERLAP_RULES
    # the framework overhead it is priced with is a strategy that `harness calibrate` measures (its own entry names
    # itself), so a new entry cannot point at a figure no calibration holds
    assert CATALOGUE[e.framework_cost].framework_cost == e.framework_cost
    assert set(e.precisions) <= set(PRECISIONS)
    assert set(e.offload_refusals) <= set(OFFLOADS) - {"none"} and "none" in e.offloads
    assert all(d in ("cpu", "cuda") and p in PRECISIONS for d, p in e.device_refusals)


def test_the_model_key_tables_match_the_planner():
    assert set(MEMORY_MODELS) == set(mb.MEMORY_MODELS) and set(COMM_MODELS) == set(cm.COMM_MODELS)
    assert set(OVERLAPS) == set(ov.OVERLAP_RULES)


def test_the_framework_families_are_the_ones_calibrate_measures():
    """Every entry's `framework_cost` is a strategy `harness calibrate` measures at one rank, and the example
    calibration (what tests and benches price with) holds a figure for each, in every precision."""
    from harness.plan.calibration import FRAMEWORK_STRATEGIES

    families = {e.framework_cost for e in CATALOGUE.values()}
    assert families == set(FRAMEWORK_STRATEGIES)
    figures = cal.example_calibration("local")["compute"]["framework"]
    assert {f"{f}/{p}" for f in families for p in PRECISIONS} == set(figures)


def test_todays_overlap_rules_and_framework_families():
    """The step-time model's behaviour per strategy, as it was when it dispatched on names (docs/time-model.md)."""
    assert {n: e.overlap for n, e in CATALOGUE.items()} == {
        "ddp": "ddp_buckets",
        **{n: "fsdp_prefetch" for n in TODAY if n.startswith("fsdp")},
        "zero1": "none",
        "zero2": "none",
        "zero3": "zero3_prefetch",
    }
    assert {n: e.framework_cost for n, e in CATALOGUE.items()} == {
        "ddp": "ddp",
        **{n: "fsdp.full_shard" for n in TODAY if n.startswith("fsdp.")},
        **{n: "fsdp2.full_shard" for n in TODAY if n.startswith("fsdp2.")},
        "zero1": "zero1",
        "zero2": "zero2",
        "zero3": "zero3",
    }


def test_names_match_scenario_validation():
    assert STRATEGIES == TODAY  # order matters: report rows and colours follow it
    assert cell.STRATEGIES == STRATEGIES
    assert (
        cell.HYBRID_STRATEGIES
        == {n for n, e in CATALOGUE.items() if e.mesh == catalogue.HYBRID}
        == {"fsdp.hybrid_shard", "fsdp.hybrid_shard_zero2", "fsdp2.hybrid_shard"}
    )
    assert cell.PRECISIONS == PRECISIONS and cell.OFFLOADS == OFFLOADS
    doc = {"name": "t", "matrix": {"model": ["tiny"], "strategy": list(STRATEGIES), "precision": ["fp32"], "gpus": [2]}}
    assert [c["strategy"] for c in schema.parse_scenario(doc, "s.yaml").cells] == list(STRATEGIES)
    with pytest.raises(InputError) as ei:
        schema.parse_scenario({**doc, "matrix": {**doc["matrix"], "strategy": ["zero4"]}}, "s.yaml")
    expected = f"s.yaml: matrix.strategy[0]: 'zero4' is not one of {', '.join(STRATEGIES)}"
    assert str(ei.value.problems[0]).startswith(expected)


def test_prefork_preloads_every_family_module():
    from harness.launch.local.prefork import PRELOAD

    assert set(FAMILY_MODULES) <= set(PRELOAD)
    assert FAMILY_MODULES == tuple(f"harness.worker.strategies.{f}" for f in ("ddp", "fsdp", "fsdp2", "zero"))


def test_the_catalogue_does_not_import_torch():
    code = "import sys, harness.core.catalogue, harness.core.constants; assert 'torch' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)


# --------------------------------------------------------------------------------------------------
# refusals are data


def test_refusals_read_the_entry(monkeypatch):
    """A new entry's refusals reach RunSpec.unsupported_reason without touching the scenario module."""
    fake = Strategy(
        "fake.shard",
        family="fsdp2",
        memory_model="fsdp2",
        comm_model="fsdp2",
        overlap="fsdp_prefetch",
        framework_cost="fsdp2.full_shard",
        precisions=("bf16",),
        offload_refusals={"optimizer": "{strategy}: no optimizer offload"},
        compile=False,
        device_refusals={("cpu", "bf16"): "{strategy} needs a GPU"},
    )
    monkeypatch.setitem(CATALOGUE, fake.name, fake)
    base = make_spec(strategy="fsdp2.full_shard", precision="bf16")
    spec = dataclasses.replace(base, strategy="fake.shard")
    assert spec.unsupported_reason() is None
    assert spec.unsupported_reason("cpu") == "fake.shard needs a GPU"
    assert "does not run fp32" in dataclasses.replace(spec, precision="fp32").unsupported_reason()
    with_settings = lambda **kw: dataclasses.replace(spec, settings=dataclasses.replace(spec.settings, **kw))  # noqa: E731
    assert with_settings(offload="optimizer").unsupported_reason() == "fake.shard: no optimizer offload"
    assert with_settings(offload="optimizer+params").unsupported_reason() is None
    assert with_settings(compile=True).unsupported_reason() == "fake.shard: torch.compile is not supported"
    assert mb.memory(spec).total > 0 and cm.predict_comm(spec) is not None


def test_todays_refusal_sentences():
    """The sentences `skipped` records carry (records keep them: they must not change)."""

    def reason(strategy, device=None, precision="fp32", **settings):
        return make_spec(strategy=strategy, precision=precision, **settings).unsupported_reason(device)

    assert reason("ddp", offload="optimizer") == "ddp has no CPU offload"
    assert reason("fsdp2.full_shard", offload="optimizer+params") == (
        "fsdp2.full_shard: CPU offload is not part of this harness's FSDP2 cells"
    )
    assert reason("zero2", offload="optimizer+params") == (
        "zero2: DeepSpeed offloads parameters only with ZeRO-3 (offload: optimizer)"
    )
    assert reason("fsdp.no_shard", offload="optimizer") == (
        "fsdp.no_shard: FSDP's CPUOffload moves parameters and gradients (offload: optimizer+params)"
    )
    assert reason("zero3", compile=True, activation_checkpointing="selective").startswith(
        "zero3 with compile and activation checkpointing: ZeRO-3's per-module gather hooks"
    )
    assert reason("zero1", "cpu", "fp16") == (
        "DeepSpeed fp16 is not supported on CPU ('Type fp16 is not supported on your device')"
    )
    assert reason("zero1", "cuda", "fp16") is None and reason("zero3", offload="optimizer+params") is None


# --------------------------------------------------------------------------------------------------
# colours


def test_todays_colours_are_unchanged_and_unique():
    assert PALETTE == TODAY_COLOURS
    assert tuple(catalogue.STRATEGY_COLOURS[s] for s in TODAY) == TODAY_COLOURS
    from harness.report.figures import STRATEGY_STYLE, style

    assert [STRATEGY_STYLE[s][0] for s in TODAY] == list(TODAY_COLOURS)
    assert style("not-a-strategy") == (UNKNOWN_COLOUR, ".")


def test_a_twelfth_strategy_gets_its_own_colour():
    names = list(TODAY) + ["fake.twelfth"]
    colours = strategy_colours(names)
    twelfth = colours["fake.twelfth"]
    assert twelfth not in TODAY_COLOURS and twelfth != UNKNOWN_COLOUR and not _is_grey(twelfth)
    assert strategy_colours(names) == colours  # deterministic
    assert [colours[n] for n in TODAY] == list(TODAY_COLOURS)


def test_the_palette_never_runs_out():
    many = [palette_colour(i) for i in range(200)]
    assert len(set(many)) == len(many)
    assert not any(_is_grey(c) for c in many[len(PALETTE) :])
    assert all(len(c) == 7 and c.startswith("#") for c in many)
    with pytest.raises(ValueError):
        palette_colour(-1)
