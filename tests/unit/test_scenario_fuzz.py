"""Property: any scenario document either expands or fails with the clean error (InputError; exit 2 from
the CLI) — never a traceback."""

from __future__ import annotations

import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from harness.cli import main
from harness.core.errors import InputError
from harness.report.plan import planned_cell_json
from harness.scenario.schema import CORE_AXES, TOP_LEVEL_KEYS, parse_scenario
from harness.scenario.spec import PRECISIONS, SETTING_FIELDS, STRATEGIES

KEYS = (
    list(TOP_LEVEL_KEYS)
    + list(CORE_AXES)
    + list(SETTING_FIELDS)
    + ["include", "exclude", "fault", "rank", "step", "d_model", "bogus"]
)
scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-3, 70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from(
        list(STRATEGIES) + list(PRECISIONS) + ["tiny", "125m", "none", "optimizer", "zero4", "", "exception", "hang"]
    ),
    st.text(max_size=8),
)
values = st.recursive(
    scalars,
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(st.sampled_from(KEYS), inner, max_size=4)),
    max_leaves=12,
)
matrix = st.fixed_dictionaries(
    {},
    optional={
        "model": st.one_of(st.lists(st.sampled_from(["tiny", "125m", "mine", 3]), max_size=3), values),
        "strategy": st.one_of(st.lists(st.sampled_from(list(STRATEGIES) + ["zero4"]), max_size=3), values),
        "precision": st.one_of(st.lists(st.sampled_from(list(PRECISIONS) + ["fp8"]), max_size=2), values),
        "gpus": st.one_of(st.lists(st.integers(-1, 9), max_size=3), values),
        "include": st.lists(st.dictionaries(st.sampled_from(KEYS), scalars, max_size=4), max_size=3),
        "exclude": st.lists(st.dictionaries(st.sampled_from(KEYS), scalars, max_size=3), max_size=2),
        "seq_len": st.lists(scalars, max_size=2),
        "inject": st.lists(values, max_size=2),
    },
)
documents = st.one_of(
    values,
    st.fixed_dictionaries(
        {"matrix": matrix},
        optional={
            "name": scalars,
            "settings": st.dictionaries(st.sampled_from(list(SETTING_FIELDS) + ["bogus"]), values, max_size=4),
            "models": st.dictionaries(
                st.sampled_from(["mine", "tiny", "x y"]),
                st.dictionaries(
                    st.sampled_from(["d_model", "n_layers", "n_heads", "ffn", "vocab", "n_kv_heads", "bad"]),
                    st.integers(-2, 64),
                    max_size=6,
                ),
                max_size=2,
            ),
            "bogus": values,
        },
    ),
)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(documents)
def test_parse_either_expands_or_raises_input_error(doc):
    try:
        scenario = parse_scenario(doc, "fuzz.yaml")
    except InputError as e:
        assert e.problems and all(str(p).startswith("fuzz.yaml") for p in e.problems)
        return
    specs = scenario.expand(gpus_per_node=2)
    assert specs and all(s.run_id for s in specs)


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture]
)
@given(documents)
def test_cli_exits_0_or_2(tmp_path_factory, doc):
    p = tmp_path_factory.mktemp("fuzz") / "s.yaml"
    try:
        p.write_text(yaml.safe_dump(doc))
    except (yaml.YAMLError, ValueError):
        return
    assert main(["list", "cells", str(p)]) in (0, 2)


# ---- plan on what validates: no traceback, and no runnable cell the cluster cannot place ---------------------

# mostly valid documents, with GPU counts from 1 to far beyond any machine (issue 15: `gpus: [2, 100000]`)
gpu_counts = st.one_of(st.integers(1, 9), st.sampled_from([12, 16, 24, 100000]), st.integers(10, 10**6))
placeable_documents = st.fixed_dictionaries(
    {
        "name": st.just("fuzz"),
        "matrix": st.fixed_dictionaries(
            {
                "model": st.lists(st.sampled_from(["tiny", "125m", "7b"]), min_size=1, max_size=2, unique=True),
                "strategy": st.lists(st.sampled_from(list(STRATEGIES)), min_size=1, max_size=3, unique=True),
                "precision": st.lists(st.sampled_from(list(PRECISIONS)), min_size=1, max_size=2, unique=True),
                "gpus": st.lists(gpu_counts, min_size=1, max_size=3, unique=True),
            },
            optional={"include": st.lists(st.fixed_dictionaries({"gpus": gpu_counts}), max_size=1)},
        ),
    },
    optional={"settings": st.dictionaries(st.sampled_from(["micro_batch", "seq_len"]), st.integers(2, 4096))},
)
CLUSTERS = {
    "local": {"executor": "local", "device": "cpu", "gpus_per_node": 2},
    "local-capped": {"executor": "local", "device": "cpu", "gpus_per_node": 2, "max_local_ranks": 3},
    "local-gpu-capped": {"executor": "local", "device": "cuda", "gpus_per_node": 8, "max_local_ranks": 4},
    "slurm-2-nodes": {"executor": "slurm", "device": "cuda", "gpus_per_node": 8, "slurm": {"max_nodes": 2}},
    "slurm-unbounded": {"executor": "slurm", "device": "cuda", "gpus_per_node": 4, "device_memory_gib": 80},
}


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.one_of(placeable_documents, placeable_documents, documents), st.sampled_from(sorted(CLUSTERS)))
def test_plan_either_plans_placeable_cells_or_raises_input_error(doc, cluster_name):
    import json

    from harness.plan.placement import capacity
    from harness.plan.predict import plan_cells
    from harness.report.plan import format_table
    from harness.scenario.cluster import parse_cluster

    cluster = parse_cluster({"name": cluster_name, **CLUSTERS[cluster_name]}, f"{cluster_name}.yaml")
    try:
        scenario = parse_scenario(doc, "fuzz.yaml")
    except InputError:
        return
    specs = scenario.expand(gpus_per_node=cluster.gpus_per_node)
    # a fixed machine (2 cores, 4 GiB available: 8 ranks by cores, 13 by memory), so the limit is known here
    cap = capacity(cluster, gpus=lambda: None, cores=lambda: 2, mem_gib=lambda: 4.0)
    cells = plan_cells(specs, cluster, cap=cap)
    json.dumps([planned_cell_json(c) for c in cells], allow_nan=False)
    format_table(cells, cluster)
    limit = {"local": 8, "local-capped": 3, "local-gpu-capped": 4, "slurm-2-nodes": 16, "slurm-unbounded": None}
    assert cap.ranks == limit[cluster_name]
    for spec, cell in zip(specs, cells, strict=True):
        beyond = cap.ranks is not None and spec.gpus > cap.ranks
        uneven = cluster.executor == "slurm" and spec.gpus % spec.gpus_per_node != 0
        assert bool(cell.cannot_place) == (beyond or uneven), (spec.gpus, cell.cannot_place)
        if cell.unsupported is None and cell.cannot_place is None:  # what the sweep would launch
            assert not beyond and not uneven
