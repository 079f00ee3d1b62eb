"""Property: any scenario document either expands or fails with the clean error (InputError; exit 2 from
the CLI) — never a traceback."""

from __future__ import annotations

import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from harness.cli import main
from harness.core.errors import InputError
from harness.scenario.schema import CORE_AXES, PRECISIONS, SETTING_FIELDS, STRATEGIES, TOP_LEVEL_KEYS, parse_scenario

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
