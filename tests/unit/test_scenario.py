"""Scenario files: validation errors (each kind), GitHub-Actions include/exclude, run_id stability."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from harness.cli import main
from harness.core.errors import InputError
from harness.results.spec import spec_from_json, spec_to_json
from harness.scenario.schema import expand_matrix, load_scenario, parse_scenario

REPO = Path(__file__).resolve().parents[2]


def write(tmp_path: Path, text: str, name: str = "s.yaml") -> Path:
    p = tmp_path / name
    p.write_text(textwrap.dedent(text))
    return p


def problems_of(doc: dict, file: str = "s.yaml") -> list[str]:
    with pytest.raises(InputError) as ei:
        parse_scenario(doc, file)
    return [str(p) for p in ei.value.problems]


BASE = {"name": "t", "matrix": {"model": ["tiny"], "strategy": ["ddp"], "precision": ["fp32"], "gpus": [2]}}


def with_matrix(**kw) -> dict:
    return {**BASE, "matrix": {**BASE["matrix"], **kw}}


# ---- include / exclude: GitHub Actions semantics ----------------------------------------------------


def test_exclude_drops_partial_matches():
    cells = expand_matrix({"os": ["a", "b"], "v": [1, 2]}, include=[], exclude=[{"os": "a", "v": 2}])
    assert cells == [{"os": "a", "v": 1}, {"os": "b", "v": 1}, {"os": "b", "v": 2}]


def test_include_extends_matching_cells_and_adds_unmatched():
    # the GitHub docs example: fruit x animal with includes
    axes = {"fruit": ["apple", "pear"], "animal": ["cat", "dog"]}
    include = [
        {"color": "green"},  # added to every cell
        {"color": "pink", "animal": "cat"},  # overwrites the added color on cat cells
        {"fruit": "apple", "shape": "circle"},  # added to apple cells
        {"fruit": "banana"},  # matches no original cell → new cell
        {"fruit": "banana", "animal": "cat"},  # new cell (banana is not an original value)
    ]
    cells = expand_matrix(axes, include=include, exclude=[])
    assert cells == [
        {"fruit": "apple", "animal": "cat", "color": "pink", "shape": "circle"},
        {"fruit": "apple", "animal": "dog", "color": "green", "shape": "circle"},
        {"fruit": "pear", "animal": "cat", "color": "pink"},
        {"fruit": "pear", "animal": "dog", "color": "green"},
        {"fruit": "banana"},
        {"fruit": "banana", "animal": "cat"},
    ]


def test_exclude_runs_before_include():
    cells = expand_matrix({"a": [1, 2]}, include=[{"a": 2, "x": 1}], exclude=[{"a": 2}])
    assert cells == [{"a": 1}, {"a": 2, "x": 1}]


def test_issue_example_expands(tmp_path):
    p = write(
        tmp_path,
        """
        name: smoke
        models:
          my-7.5b: {d_model: 4096, n_layers: 36, n_heads: 32, ffn: 11008, vocab: 32000}
        matrix:
          model: [tiny]
          strategy: [ddp, fsdp.full_shard, fsdp.shard_grad_op, fsdp.hybrid_shard, zero1, zero2, zero3]
          precision: [fp32, bf16]
          gpus: [2, 4]
          exclude: [{strategy: fsdp.hybrid_shard, gpus: 2}]
          include: [{model: tiny, strategy: fsdp2.hybrid_shard, precision: bf16, gpus: 4}]
        settings: {micro_batch: 2, seq_len: 64, grad_accum: 1, warmup_steps: 2, measure_steps: 5,
                   activation_checkpointing: false, offload: none}
    """,
    )
    specs = load_scenario(p).expand(gpus_per_node=2)
    assert len(specs) == 7 * 2 * 2 - 2 + 1
    hybrid4 = [s for s in specs if s.strategy == "fsdp.hybrid_shard"]
    assert {s.gpus for s in hybrid4} == {4} and all(s.nodes == 2 for s in hybrid4)
    assert specs[-1].strategy == "fsdp2.hybrid_shard" and specs[-1].precision == "bf16"
    assert load_scenario(p).models["my-7.5b"].n_params() > 6e9


def test_settings_are_matrix_axes():
    doc = with_matrix(seq_len=[32, 64], activation_checkpointing=[False, True])
    specs = parse_scenario({**doc, "settings": {"micro_batch": 4}}, "s.yaml").expand(gpus_per_node=2)
    assert [(s.settings.seq_len, s.settings.activation_checkpointing) for s in specs] == [
        (32, "none"),
        (32, "full"),
        (64, "none"),
        (64, "full"),
    ]
    assert all(s.settings.micro_batch == 4 for s in specs)


def test_activation_checkpointing_policies_and_their_boolean_spellings():
    """none | full | selective; true/false (the only values before the policies) mean full/none, in files,
    in records read back, and in run_id: a cell spelled either way is one cell."""
    doc = with_matrix(activation_checkpointing=["none", "full", "selective", False, True])
    specs = parse_scenario(doc, "s.yaml").expand(gpus_per_node=2)
    assert [s.settings.activation_checkpointing for s in specs] == ["none", "full", "selective"]
    assert [s.settings.checkpointing for s in specs] == [False, True, True]
    none, full, _ = specs
    assert "activation_checkpointing" not in none.identity()  # the default: run_ids of earlier cells hold
    old = {**spec_to_json(full), "activation_checkpointing": True}  # a record written before the policies
    assert spec_from_json(old).run_id == full.run_id
    # ZeRO-3's gather hooks inside a compiled checkpointed block recompile on every call (measured 5 s steps
    # instead of 0.08 s): refused as unsupported (a skipped record) rather than timed
    sel = {
        **BASE,
        "settings": {"compile": True},
        "matrix": {**BASE["matrix"], "strategy": ["zero3"], "activation_checkpointing": ["none", "selective"]},
    }
    plain, ckpt = parse_scenario(sel, "s.yaml").expand(gpus_per_node=2)
    assert plain.unsupported_reason() is None and "recompile" in ckpt.unsupported_reason()
    for bad, msg in (
        ("yes", "'yes' is not one of none, full, selective"),
        ("selectve", "(did you mean 'selective'?)"),
        (1, "1 is not one of none, full, selective"),
    ):
        msgs = problems_of({**with_matrix(), "settings": {"activation_checkpointing": bad}})
        assert any(m.startswith("s.yaml: settings.activation_checkpointing: ") and msg in m for m in msgs), msgs


# ---- run_id ------------------------------------------------------------------------------------------


def test_run_id_is_stable_and_spec_sensitive():
    a = parse_scenario(BASE, "a.yaml").expand(gpus_per_node=2)[0]
    b = parse_scenario(dict(BASE, name="renamed"), "b.yaml").expand(gpus_per_node=2)[0]
    assert a.run_id == b.run_id  # the scenario's name and path are not part of the cell
    # pinned: a change here silently breaks matching records across harness versions
    assert a.run_id == "tiny-ddp-fp32-g2-" + a.run_id.rsplit("-", 1)[1]
    c = parse_scenario({**BASE, "settings": {"seq_len": 128}}, "c.yaml").expand(gpus_per_node=2)[0]
    assert c.run_id != a.run_id
    d = parse_scenario(BASE, "a.yaml").expand(gpus_per_node=8)[0]
    assert d.run_id == a.run_id  # world 2 fits in one node either way: gpus_per_node clamps to 2


def test_trace_is_an_axis_and_sweep_trace_turns_it_on_everywhere():
    """`trace` at its default keeps every run_id (the smoke baseline's among them); `trace: true` is a cell of its
    own; `harness sweep --trace` (Scenario.with_setting) sets it in every cell, over the settings and an axis."""
    doc = {**BASE, "matrix": {**BASE["matrix"], "precision": ["fp32", "bf16"]}}
    plain = parse_scenario(doc, "a.yaml").expand(gpus_per_node=2)
    off = parse_scenario({**doc, "settings": {"trace": False}}, "a.yaml").expand(gpus_per_node=2)
    assert [s.run_id for s in off] == [s.run_id for s in plain]
    axis = parse_scenario({**doc, "matrix": {**doc["matrix"], "trace": [False, True]}}, "a.yaml")
    cells = axis.expand(gpus_per_node=2)
    assert len(cells) == 4 and len({s.run_id for s in cells}) == 4
    traced = axis.with_setting("trace", True).expand(gpus_per_node=2)
    assert len(traced) == 2 and all(s.settings.trace for s in traced)
    assert {s.run_id for s in traced} == {s.run_id for s in cells if s.settings.trace}
    assert not {s.run_id for s in traced} & {s.run_id for s in plain}
    assert problems_of({**with_matrix(), "settings": {"trace": "yes"}}) == [
        "s.yaml: settings.trace: 'yes' is not a boolean"
    ]


def test_run_id_is_stable_across_processes():
    code = (
        "from harness.scenario.schema import parse_scenario;"
        f"print(parse_scenario({BASE!r}, 'x').expand(gpus_per_node=2)[0].run_id)"
    )
    out = {
        subprocess.run(
            [sys.executable, "-c", code],
            capture_output=True,
            text=True,
            check=True,
            env={"PYTHONHASHSEED": str(seed), "PATH": "/usr/bin"},
        ).stdout.strip()
        for seed in (1, 2)
    }
    assert len(out) == 1 and out == {parse_scenario(BASE, "x").expand(gpus_per_node=2)[0].run_id}


def test_a_spec_is_frozen_and_hashable_and_still_reads_and_hashes_as_before():
    """The planner's caches key on the RunSpec itself (functools.cache): an `inject` mapping is frozen too, while the
    spec's JSON form and run_id stay what the harness wrote before (pinned: computed with the code before the
    change), and a pickled spec (submitit's payloads) comes back equal."""
    import copy
    import json
    import pickle

    inject = {"fault": "slow", "factor": 1.5, "rank": 1, "step": 3}
    (spec,) = parse_scenario({**BASE, "settings": {"inject": inject}}, "s.yaml").expand(gpus_per_node=2)
    assert spec.run_id == "tiny-ddp-fp32-g2-4883092142"
    assert json.dumps(spec_to_json(spec)["inject"]) == '{"fault": "slow", "factor": 1.5, "rank": 1, "step": 3}'
    assert spec.settings.inject == inject and isinstance(spec.settings.inject, dict)
    with pytest.raises(TypeError, match="frozen"):
        spec.settings.inject["rank"] = 0
    twin = spec_from_json(json.loads(json.dumps(spec_to_json(spec))))
    assert twin == spec and hash(twin) == hash(spec) and {spec: 1}[twin] == 1
    for back in (pickle.loads(pickle.dumps(spec)), copy.deepcopy(spec)):
        assert back == spec and hash(back) == hash(spec) and back.settings.inject == inject
    # the same mapping in another key order is the same cell
    reordered = spec_from_json({**spec_to_json(spec), "inject": dict(reversed(list(inject.items())))})
    assert reordered == spec and hash(reordered) == hash(spec) and reordered.run_id == spec.run_id
    other = spec_from_json({**spec_to_json(spec), "inject": {**inject, "rank": 0}})
    assert other != spec and other.run_id != spec.run_id


def test_expansion_does_not_import_torch():
    code = (
        "import sys; from harness.scenario.schema import load_scenario; "
        "from harness.scenario.cluster import load_cluster;"
        "load_scenario('scenarios/smoke.yaml').expand(gpus_per_node=2); print('torch' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=REPO)
    assert out.stdout.strip() == "False"


def test_duplicate_cells_are_deduplicated():
    doc = with_matrix(include=[{"model": "tiny", "strategy": "ddp", "precision": "fp32", "gpus": 2}])
    assert len(parse_scenario(doc, "s.yaml").expand(gpus_per_node=2)) == 1


# ---- errors: each kind, all at once, file: dotted.key: message -------------------------------------


def test_unknown_strategy_lists_allowed_and_suggests():
    (msg,) = problems_of(with_matrix(strategy=["ddp", "zero4"]))
    assert msg.startswith("s.yaml: matrix.strategy[1]: 'zero4' is not one of ddp, fsdp.full_shard,")
    assert msg.endswith("(did you mean 'zero3'?)")


def test_unknown_keys_get_did_you_mean():
    msgs = problems_of({**BASE, "setings": {}, "settings": {"micro_bach": 2}})
    assert any(m.startswith("s.yaml: setings: unknown key") and "did you mean 'settings'" in m for m in msgs)
    assert any(
        m.startswith("s.yaml: settings.micro_bach: unknown setting") and "did you mean 'micro_batch'" in m for m in msgs
    )


def test_every_problem_is_reported_at_once():
    doc = {
        "name": "bad name!",
        "models": {
            "tiny": {"d_model": 1},
            "x": {"d_model": 30, "n_layers": 1, "n_heads": 4, "ffn": 8, "vocab": 8},
            "y": {"d_model": 8, "n_layers": 1, "n_heads": 2, "ffn": 8},
        },
        "matrix": {
            "model": ["nope"],
            "strategy": "ddp",
            "precision": ["fp8"],
            "gpus": [0, "two"],
            "exclude": ["x"],
            "include": [{"strategy": "dp"}],
        },
        "settings": {"micro_batch": 0, "offload": "disk", "activation_checkpointing": "yes", "lr": "fast"},
    }
    msgs = problems_of(doc)
    expected = [
        "s.yaml: name: 'bad name!' must match",
        "s.yaml: models.tiny: 'tiny' is a zoo model",
        "s.yaml: models.x.n_heads: d_model 30 is not divisible by n_heads 4",
        "s.yaml: models.y.vocab: missing (required)",
        "s.yaml: settings.micro_batch: 0 is below the minimum 1",
        "s.yaml: settings.offload: 'disk' is not one of none, optimizer, optimizer+params",
        "s.yaml: settings.activation_checkpointing: 'yes' is not one of none, full, selective",
        "s.yaml: settings.lr: 'fast' is not a number",
        "s.yaml: matrix.model[0]: 'nope' is not one of tiny, 125m",
        "s.yaml: matrix.strategy: must be a non-empty list, got 'ddp'",
        "s.yaml: matrix.precision[0]: 'fp8' is not one of fp32, fp16, bf16",
        "s.yaml: matrix.gpus[0]: 0 is not a positive integer",
        "s.yaml: matrix.gpus[1]: 'two' is not a positive integer",
        "s.yaml: matrix.exclude[0]: must be a non-empty mapping",
        "s.yaml: matrix.include[0].strategy: 'dp' is not one of",
    ]
    for e in expected:
        assert any(m.startswith(e) for m in msgs), (e, msgs)
    assert len(msgs) == len(expected)


def test_include_without_core_axes_is_an_error():
    doc = {"name": "t", "matrix": {"model": ["tiny"], "include": [{"strategy": "ddp", "precision": "fp32"}]}}
    msgs = problems_of(doc)
    assert msgs == [
        "s.yaml: matrix.include[0]: cell {'model': 'tiny', 'strategy': 'ddp', 'precision': 'fp32'} has no gpus (give the axis in the matrix or in the include entry)"  # noqa: E501
    ]
    doc = {"name": "t", "matrix": {"include": [{"model": "tiny", "strategy": "ddp", "precision": "fp32"}]}}
    (msg,) = problems_of(doc)
    assert msg.startswith("s.yaml: matrix.include[0]: cell") and "has no gpus" in msg


def test_everything_excluded_is_an_error():
    (msg,) = problems_of(with_matrix(exclude=[{"strategy": "ddp"}]))
    assert msg == "s.yaml: matrix: expands to no cells (everything excluded?)"


def test_yaml_object_tags_are_refused(tmp_path):
    p = write(tmp_path, "name: !!python/object/apply:os.system ['echo pwned']\nmatrix: {}\n")
    with pytest.raises(InputError) as ei:
        load_scenario(p)
    assert "is not allowed" in str(ei.value) and str(p) in str(ei.value)


def test_yaml_syntax_error_names_the_file(tmp_path):
    p = write(tmp_path, "name: t\nmatrix: [unclosed\n")
    with pytest.raises(InputError) as ei:
        load_scenario(p)
    assert str(ei.value).startswith(f"{p}: invalid YAML")


def test_cli_exit_code_2_and_nothing_written(tmp_path, capsys):
    p = write(tmp_path, "name: t\nmatrix: {model: [tiny], strategy: [zero4], precision: [fp32], gpus: [2]}\n")
    results = tmp_path / "results"
    assert main(["sweep", str(p), "--results", str(results)]) == 2
    err = capsys.readouterr().err
    assert f"error: {p}: matrix.strategy[0]: 'zero4' is not one of" in err
    assert not results.exists()


def test_cli_unknown_cluster_is_exit_2(tmp_path, capsys):
    assert main(["list", "cells", "scenarios/smoke.yaml", "--cluster", "a10"]) == 2
    assert "'a10' is not one of a100" in capsys.readouterr().err


def test_unsupported_cells_have_reasons():
    doc = with_matrix(strategy=["fsdp.hybrid_shard", "zero2"], precision=["fp16"], offload=["none", "optimizer+params"])
    specs = {(s.strategy, s.settings.offload): s for s in parse_scenario(doc, "s").expand(gpus_per_node=2)}
    assert "single node" in specs[("fsdp.hybrid_shard", "none")].unsupported_reason("cpu")
    assert "ZeRO-3" in specs[("zero2", "optimizer+params")].unsupported_reason("cuda")
    assert "fp16 is not supported on CPU" in specs[("zero2", "none")].unsupported_reason("cpu")
    assert specs[("zero2", "none")].unsupported_reason("cuda") is None


# ---- issue 48, item 4: keys YAML would drop, settings an axis would override ---------------------------------

DUPLICATES = """\
name: t
matrix: {model: [tiny], strategy: [ddp], precision: [fp32], gpus: [2]}
settings: {micro_batch: 2, micro_batch: 4}
matrix:
  model: [tiny]
  strategy: [zero2]
  precision: [fp32]
  gpus: [2]
  include:
    - {strategy: ddp, gpus: 2, gpus: 4}
"""


def test_a_key_given_twice_is_exit_2_naming_every_line_and_nothing_is_written(tmp_path, capsys):
    """Two top-level `matrix:` blocks (a plain YAML loader drops the first), a flow mapping that gives micro_batch
    twice (it took 4), a key twice inside an include entry: each is a problem at its key path with every line it is
    on (line:column where they share a line), all at once, exit 2 and nothing written."""
    p = write(tmp_path, DUPLICATES)
    results = tmp_path / "results"
    assert main(["sweep", str(p), "--results", str(results)]) == 2
    err = capsys.readouterr().err.splitlines()
    assert err == [
        f"error: {p}: matrix: given 2 times, at lines 2 and 4: YAML would keep only the last, silently; give it once",
        f"error: {p}: settings.micro_batch: given 2 times, at line:column 3:12 and 3:28: YAML would keep only the "
        "last, silently; give it once",
        f"error: {p}: matrix.include[0].gpus: given 2 times, at line:column 10:23 and 10:32: YAML would keep only "
        "the last, silently; give it once",
    ]
    assert not results.exists()


def test_a_merge_key_and_its_override_are_no_duplicate_and_an_alias_is_walked_once(tmp_path):
    from harness.scenario.schema import load_yaml

    p = write(tmp_path, "base: &b {micro_batch: 2, seq_len: 64}\nuse: {<<: *b, micro_batch: 4}\nagain: *b\n")
    assert load_yaml(p) == {
        "base": {"micro_batch": 2, "seq_len": 64},
        "use": {"micro_batch": 4, "seq_len": 64},
        "again": {"micro_batch": 2, "seq_len": 64},
    }
    # the same key written as 1 and 1.0 is one key of the loaded mapping: a duplicate
    with pytest.raises(InputError) as ei:
        load_yaml(write(tmp_path, "a:\n  1: x\n  1.0: y\n", name="n.yaml"))
    assert [str(q) for q in ei.value.problems] == [
        f"{tmp_path / 'n.yaml'}: a.1: given 2 times, at lines 2 and 3: YAML would keep only the last, silently; "
        "give it once"
    ]


def test_a_cluster_profile_with_a_key_given_twice_is_exit_2(tmp_path, capsys):
    """Cluster profiles go through the same loader."""
    prof = write(
        tmp_path,
        "name: two\nexecutor: local\ndevice: cpu\ngpus_per_node: 2\ngpus_per_node: 4\n",
        name="two.yaml",
    )
    assert main(["list", "cells", str(REPO / "scenarios" / "smoke.yaml"), "--cluster", str(prof)]) == 2
    assert capsys.readouterr().err.strip() == (
        f"error: {prof}: gpus_per_node: given 2 times, at lines 4 and 5: YAML would keep only the last, silently; "
        "give it once"
    )


def test_a_setting_given_as_an_axis_and_under_settings_is_refused_at_both(tmp_path, capsys):
    """The axis would override the setting in every cell of the matrix: refused, naming both places; an include
    entry that names the key overrides some cells on purpose and stays allowed."""
    got = problems_of({**with_matrix(micro_batch=[1, 2]), "settings": {"micro_batch": 4, "seq_len": 32}})
    assert got == [
        "s.yaml: matrix.micro_batch: also given as settings.micro_batch (4): the axis would override that setting in "
        "every cell of the matrix, silently; give micro_batch in one place (as the axis, or as the setting)"
    ]
    doc = {**with_matrix(include=[{"strategy": "ddp", "micro_batch": 1}]), "settings": {"micro_batch": 4}}
    assert [s.settings.micro_batch for s in parse_scenario(doc, "s.yaml").expand(gpus_per_node=2)] == [1]
    p = write(tmp_path, "name: t\nmatrix: {model: [tiny], strategy: [ddp], precision: [fp32], gpus: [2], "
              "seq_len: [32, 64]}\nsettings: {seq_len: 128}\n")  # fmt: skip
    assert main(["sweep", str(p), "--results", str(tmp_path / "r")]) == 2
    assert "matrix.seq_len: also given as settings.seq_len (128)" in capsys.readouterr().err
    assert not (tmp_path / "r").exists()
