"""harness.core.layout.MESH_DIMS, the parallel dimensions' registry (docs/extending.md, "A parallel dimension"):
every entry is a setting and a mesh dimension, and a new entry is taken by every place that multiplies, orders,
groups, validates, tags or refuses degrees — shown with a context-parallel stand-in added to the registry."""

from __future__ import annotations

import dataclasses

import pytest

from harness.core import layout as lay_mod
from harness.core.catalogue import CATALOGUE
from harness.core.layout import MESH_DIMS, Layout, MeshDim, layout_problems
from harness.core.precisions import DTYPE_BYTES, ENTRIES
from harness.core.zoo import ZOO
from harness.scenario.cluster import PEAKS
from harness.scenario.schema import parse_scenario
from harness.scenario.spec import SETTING_FIELDS
from tests.conftest import make_spec

CP = MeshDim("cp", before_dp=False, inside_node=False, noun="context parallelism", doc="sequence shards")


@pytest.fixture
def with_cp(monkeypatch):
    """MESH_DIMS with `cp` between data parallelism and tp, as torchtitan orders its mesh."""
    pp, tp = MESH_DIMS
    monkeypatch.setattr(lay_mod, "MESH_DIMS", (pp, CP, tp))


def test_every_dimension_is_a_setting_an_axis_and_a_mesh_dimension():
    for d in MESH_DIMS:
        f = SETTING_FIELDS[d.name]
        assert f.default == 1 and f.metadata["minimum"] == 1, d.name
        doc = {"name": "t", "matrix": {"model": ["tiny"], "strategy": ["ddp"], "precision": ["fp32"], "gpus": [2],
                                       d.name: [1]}}  # fmt: skip
        assert parse_scenario(doc, "t.yaml").expand(gpus_per_node=2)
    spec = make_spec(strategy="fsdp2.full_shard", gpus=8, gpus_per_node=4, tp=2, pp=2)
    assert dict(spec.layout.mesh_dims) == {"pp": 2, "dp": 2, "tp": 2} and spec.dp == 2
    assert spec.layout.to_dict()["mesh"] == {"pp": 2, "dp": 2, "tp": 2} and spec.layout_tag == "tp2 × pp2 (1f1b)"


def test_a_new_dimension_is_ordered_multiplied_and_grouped(with_cp):
    lay = Layout(gpus=16, degrees=(("pp", 2), ("cp", 2), ("tp", 2)), gpus_per_node=4)
    assert lay.mesh_dims == (("pp", 2), ("dp", 2), ("cp", 2), ("tp", 2))
    assert (lay.model_parallel, lay.dp, lay.inside_node) == (8, 2, 2)
    assert [d.name for d in lay.used] == ["tp", "cp", "pp"] and lay.named(lay.used) == "tp 2 x cp 2 x pp 2"
    assert lay.to_dict()["cp"] == 2 and lay.to_dict()["mesh"]["cp"] == 2
    for rank in range(16):
        assert lay.rank_of(lay.coords(rank)) == rank
    # tp innermost (consecutive ranks), cp next (a stride of tp), dp a stride of cp x tp, pp outermost
    assert lay.group(0, ("tp",)) == [0, 1] and lay.group(0, ("cp",)) == [0, 2]
    assert lay.group(0, ("dp",)) == [0, 4] and lay.group(0, ("pp",)) == [0, 8]
    hybrid = dataclasses.replace(lay, gpus=32, hybrid=True)
    assert (hybrid.dp, hybrid.dp_shard, hybrid.dp_replicate) == (4, 2, 2)  # the rest of a node beside tp


def test_a_new_dimension_is_validated_and_refused_until_a_strategy_takes_it(with_cp):
    problems = layout_problems(
        gpus=10, degrees={"pp": 2, "cp": 2, "tp": 1}, cfg=ZOO["tiny"], schedule="1f1b", microbatches=0,
        micro_batch=2, grad_accum=1,
    )  # fmt: skip
    assert (
        "cp",
        "tp 1 x cp 2 x pp 2 = 4 does not divide gpus 10 (data-parallel degree = gpus / (tp x cp x pp)); "
        "allowed tp x cp x pp: 1, 2, 5, 10",
    ) in problems
    for name, entry in CATALOGUE.items():
        assert entry.layout_refusal(["cp"]) == f"{name} does not compose with cp > 1 here"


def test_every_precision_has_its_element_size_and_a_peak_on_every_known_gpu():
    for p in ENTRIES:
        assert p.element_bytes == DTYPE_BYTES[p.dtype] and p.mixed == (p.dtype != "float32")
        for peak in PEAKS:
            assert p.peak in peak.tflops, (p.name, peak.name)
