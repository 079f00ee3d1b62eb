"""`--set KEY=VALUE` (issue 52, item 3): the scenario changed from the command line as if the file said so.

Shown here: `--set micro_batch=2` puts every cell at micro-batch 2 (also where the file has it as an axis, and in its
include entries); a list is the axis; a bad `--set` gets the file's own error, at the key path `--set KEY`, exit 2,
nothing printed on stdout (a property over every setting and many values: the file and `--set` agree, cell for cell
and message for message); the sweep's manifest records the overrides, `harness status` and the sweep's first line
name them, `history check --confirm` re-runs the cells they made, and tune's log keeps them."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from harness.cli import main
from harness.core.errors import InputError
from harness.history.confirm import what_to_rerun
from harness.launch.core.manifest import Manifest, read_manifest
from harness.launch.run import start_sweep
from harness.launch.status import status_lines
from harness.scenario.cluster import load_cluster
from harness.scenario.schema import load_scenario, parse_scenario
from harness.scenario.spec import PRECISIONS, SETTING_FIELDS, STRATEGIES
from harness.tune.log import Budget, check_tune_log
from harness.tune.run import Search

REPO = Path(__file__).resolve().parents[2]

AXIS_FILE = """\
name: ov
matrix:
  model: [tiny]
  strategy: [ddp, fsdp.full_shard]
  precision: [fp32]
  gpus: [2]
  micro_batch: [1, 4]
  include:
    - {strategy: ddp, micro_batch: 4, seq_len: 32}
settings: {seq_len: 64}
"""


def write(tmp_path: Path, text: str, name: str = "s.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def plan_json(capsys, path: Path, *sets: str) -> list[dict]:
    args = [a for s in sets for a in ("--set", s)]
    assert main(["plan", str(path), "--format", "json", *args]) == 0
    return json.loads(capsys.readouterr().out)


def refused(capsys, argv: list[str]) -> list[str]:
    """The error lines of a command that must exit 2 having printed nothing on stdout."""
    assert main(argv) == 2
    out, err = capsys.readouterr()
    assert out == "" and "Traceback" not in err
    return err.splitlines()


# ---- a scalar is every cell's value


def test_set_micro_batch_changes_every_cells_micro_batch(tmp_path, capsys):
    path = write(tmp_path, AXIS_FILE)
    before = plan_json(capsys, path)
    assert sorted(c["spec"]["micro_batch"] for c in before) == [1, 1, 4, 4]
    after = plan_json(capsys, path, "micro_batch=2")
    # NOTE: the axis is replaced (not refused as a key given both as an axis and a setting): the cells that became
    # the same are one; the include matched the file's ddp cell at 4, and its other key (seq_len 32) stays its own
    assert [(c["spec"]["strategy"], c["spec"]["micro_batch"]) for c in after] == [
        ("ddp", 2),
        ("ddp", 2),
        ("fsdp.full_shard", 2),
    ]
    assert sorted(c["spec"]["seq_len"] for c in after) == [32, 64, 64]


def test_set_reaches_the_shipped_smoke_sweeps_include_cells(capsys):
    cells = plan_json(capsys, REPO / "scenarios" / "smoke.yaml", "micro_batch=4", "precision=fp32")
    assert len(cells) == 14  # 8 strategies, 3 hybrids, 3 layouts: the bf16 cells became their fp32 twins
    assert {c["spec"]["micro_batch"] for c in cells} == {4}
    assert {c["spec"]["precision"] for c in cells} == {"fp32"}


def test_the_plan_table_shows_the_new_micro_batch_in_every_row(tmp_path, capsys):
    path = write(tmp_path, AXIS_FILE)
    assert main(["plan", str(path), "--set", "micro_batch=2"]) == 0
    rows = [line.split()[2] for line in capsys.readouterr().out.splitlines() if " fp32 mb" in line]
    assert rows == ["mb2x64", "mb2x32", "mb2x64"]  # micro-batch x sequence length: the include's seq_len 32 kept


def test_the_last_set_of_a_key_wins(tmp_path):
    path = write(tmp_path, AXIS_FILE)
    specs = load_scenario(path, overrides=["micro_batch=[1,2]", "micro_batch=3"]).expand(gpus_per_node=2)
    assert {s.settings.micro_batch for s in specs} == {3}


def test_a_core_axis_scalar_puts_every_cell_there(tmp_path):
    path = write(tmp_path, AXIS_FILE)
    specs = load_scenario(path, overrides=["strategy=zero2", "gpus=4"]).expand(gpus_per_node=2)
    assert {(s.strategy, s.gpus) for s in specs} == {("zero2", 4)}
    assert sorted(s.settings.micro_batch for s in specs) == [1, 4, 4]  # the include matched the file's ddp cell


# ---- a list is the axis


def test_a_list_sets_the_axis_and_replaces_the_setting(tmp_path):
    path = write(tmp_path, AXIS_FILE.replace("settings: {seq_len: 64}", "settings: {seq_len: 64, seed: 5}"))
    sc = load_scenario(path, overrides=["seed=[1, 2]", "gpus=[2,4]"])
    specs = sc.expand(gpus_per_node=2)
    assert {s.gpus for s in specs} == {2, 4}
    assert {s.settings.seed for s in specs} == {1, 2}
    assert len(specs) == 2 * 2 * 2 * 2  # strategies x micro-batches x seeds x GPU counts
    assert "seed" not in sc.settings  # the setting became the axis: no "given both as an axis and a setting"


def test_dotted_keys_set_one_key_of_a_mapping_setting(tmp_path):
    path = write(tmp_path, AXIS_FILE)
    sc = load_scenario(path, overrides=["inject.fault=slow", "inject.factor=2", "inject.rank=1"])
    injects = [dict(s.settings.inject or {}) for s in sc.expand(gpus_per_node=2)]
    assert len(injects) == 4 and all(i == {"fault": "slow", "factor": 2, "rank": 1} for i in injects)


# ---- a bad --set: the file's own error, at `--set KEY`

BAD = [
    ("micro_batch", "two", "settings.micro_batch"),
    ("seq_len", "1", "settings.seq_len"),
    ("activation_checkpointing", "sometimes", "settings.activation_checkpointing"),
    ("compile", "maybe", "settings.compile"),
    ("precision", "fp8", "matrix.precision[0]"),
    ("strategy", "zero4", "matrix.strategy[0]"),
    ("gpus", "0", "matrix.gpus[0]"),
    ("model", "gpt5", "matrix.model[0]"),
    ("inject", "{fault: slow}", "settings.inject"),
]


@pytest.mark.parametrize(("key", "value", "file_path"), BAD, ids=[b[0] for b in BAD])
def test_a_bad_set_gets_the_same_error_as_the_file_would(tmp_path, capsys, key, value, file_path):
    text = AXIS_FILE.replace("  micro_batch: [1, 4]\n", "").replace("micro_batch: 4, ", "")
    doc = yaml.safe_load(text)
    if file_path.startswith("settings."):
        doc["settings"][key] = yaml.safe_load(value)
    else:
        doc["matrix"][key] = [yaml.safe_load(value)]
    in_file = refused(capsys, ["plan", str(write(tmp_path, yaml.safe_dump(doc), "bad.yaml"))])
    good = write(tmp_path, text)
    by_set = refused(capsys, ["plan", str(good), "--set", f"{key}={value}"])
    assert [line.split(f"bad.yaml: {file_path}", 1)[1] for line in in_file] == [
        line.split(f"s.yaml: --set {key}", 1)[1] for line in by_set
    ]
    assert all(line.startswith(f"error: {good}: --set {key}") for line in by_set)


def test_the_message_names_the_file_the_set_and_the_value(tmp_path, capsys):
    path = write(tmp_path, AXIS_FILE)
    assert refused(capsys, ["plan", str(path), "--set", "micro_batch=two"]) == [
        f"error: {path}: --set micro_batch: 'two' is not an integer"
    ]


def test_a_bad_item_of_a_list_is_named_by_its_index(tmp_path, capsys):
    path = write(tmp_path, AXIS_FILE)
    assert refused(capsys, ["sweep", str(path), "--set", "gpus=[2, 0]", "--results", str(tmp_path / "r")]) == [
        f"error: {path}: --set gpus[1]: 0 is not a positive integer"
    ]
    assert not (tmp_path / "r").exists()  # refused before anything is written


def test_an_unknown_key_is_the_files_unknown_key_with_did_you_mean(tmp_path, capsys):
    path = write(tmp_path, AXIS_FILE)
    (line,) = refused(capsys, ["plan", str(path), "--set", "micro_bach=2"])
    assert line.startswith(f"error: {path}: --set micro_bach: unknown key; allowed: model, strategy, precision, gpus, ")
    assert line.endswith("(did you mean 'micro_batch'?)")


def test_a_set_without_equals_is_refused(tmp_path, capsys):
    path = write(tmp_path, AXIS_FILE)
    assert refused(capsys, ["tune", str(path), "--set", "micro_batch"]) == [
        "error: --set: 'micro_batch' is not KEY=VALUE (e.g. --set micro_batch=2, --set gpus=[8,64])"
    ]


def test_every_problem_at_once_and_a_value_that_is_not_yaml(tmp_path, capsys):
    path = write(tmp_path, AXIS_FILE)
    lines = refused(capsys, ["plan", str(path), "--set", "seq_len=[1", "--set", "gpus=!!python/object:os.system x"])
    assert lines == [
        f"error: {path}: --set seq_len: '[1' is not a YAML value: expected ',' or ']', but got '<stream end>' at "
        "column 3",
        f"error: {path}: --set gpus: '!!python/object:os.system x' is not a YAML value: tag "
        "'tag:yaml.org,2002:python/object:os.system' is not allowed (scenario files are plain data) at column 1",
    ]


def test_a_dotted_key_of_a_plain_setting_is_refused(tmp_path):
    with pytest.raises(InputError) as e:
        load_scenario(write(tmp_path, AXIS_FILE), overrides=["micro_batch.x=1"])
    assert [str(p) for p in e.value.problems] == [
        f"{tmp_path / 's.yaml'}: --set micro_batch.x: a dotted key sets a key of a mapping setting "
        "(inject, deepspeed_config); give micro_batch=VALUE"
    ]


def test_a_layout_the_set_makes_impossible_is_blamed_on_the_set(tmp_path):
    path = write(tmp_path, AXIS_FILE)
    with pytest.raises(InputError) as e:
        load_scenario(path, overrides=["strategy=fsdp2.full_shard", "tp=3"])
    paths = {p.path for p in e.value.problems}
    assert paths == {"--set tp"}
    with pytest.raises(InputError) as e:
        load_scenario(path, overrides=["strategy=fsdp2.full_shard", "tp=[1, 3]"])
    assert {p.path for p in e.value.problems} == {"--set tp[1]"}


def test_tune_global_batch_refuses_a_set_grad_accum(tmp_path):
    with pytest.raises(InputError) as e:
        load_scenario(REPO / "scenarios" / "tune-bench.yaml", overrides=["grad_accum=2"])
    assert [p.path for p in e.value.problems] == ["--set grad_accum"]
    assert "tune.global_batch (16) derives grad_accum" in e.value.problems[0].message


# ---- the property: the file and --set agree on every setting


BASE = {"name": "p", "matrix": {"model": ["tiny"], "strategy": ["ddp"], "precision": ["fp32"], "gpus": [2]}}
plain = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-3, 5000),
    st.floats(allow_nan=False, allow_infinity=True, width=32),
    st.sampled_from(["none", "full", "selective", "optimizer", "gpipe", "interleaved_1f1b", "slow", "", "two"]),
    st.text(alphabet=st.characters(min_codepoint=32, max_codepoint=126), max_size=6),
)
inject = st.fixed_dictionaries(
    {"fault": st.sampled_from(["oom", "slow", "hang", "bogus"])},
    optional={"rank": st.integers(-1, 3), "step": st.integers(0, 4), "factor": st.floats(0.5, 3, width=16)},
)


def as_yaml(value: object) -> str:
    """A value as the text of `--set KEY=TEXT` that YAML reads back as that value."""
    return yaml.safe_dump([value], default_flow_style=True, width=math.inf, sort_keys=False).strip()[1:-1]


def outcome(doc: dict, overrides: list[str]) -> tuple[list[str], list[str]]:
    """(run_ids, problem lines with the key path cut off)."""
    try:
        specs = parse_scenario(doc, "p.yaml", overrides=overrides).expand(gpus_per_node=2)
    except InputError as e:
        return [], [p.message for p in e.problems]
    return [s.run_id for s in specs], []


@settings(max_examples=150, deadline=None)
@given(key=st.sampled_from(sorted(SETTING_FIELDS)), value=st.one_of(plain, inject))
def test_any_setting_by_set_is_the_file_saying_it(key, value):
    in_file = outcome({**BASE, "settings": {key: value}}, [])
    by_set = outcome(BASE, [f"{key}={as_yaml(value)}"])
    assert by_set == in_file


@settings(max_examples=60, deadline=None)
@given(
    axis=st.sampled_from(["strategy", "precision", "gpus"]),
    values=st.lists(
        st.one_of(st.sampled_from([*STRATEGIES[:4], *PRECISIONS, "zero4"]), st.integers(-1, 9)), min_size=1, max_size=3
    ),
)
def test_any_axis_by_set_is_the_file_saying_it(axis, values):
    in_file = outcome({**BASE, "matrix": {**BASE["matrix"], axis: values}}, [])
    by_set = outcome(BASE, [f"{axis}={as_yaml(values)}"])
    assert by_set == in_file


# ---- recorded where the sweep is


def test_the_manifest_records_the_overrides_and_old_manifests_still_read(tmp_path):
    m = Manifest.open(tmp_path, "s", scenario="s.yaml", cluster="local", run_ids=["a"], overrides=["micro_batch=2"])
    doc = json.loads(m.path.read_text())
    assert doc["overrides"] == ["micro_batch=2"]
    assert read_manifest(m.path).header.overrides == ("micro_batch=2",)
    m.running("a", attempt="x")  # every update keeps the header's overrides
    assert read_manifest(m.path).header.overrides == ("micro_batch=2",)
    del doc["overrides"]
    m.path.write_text(json.dumps(doc))
    assert read_manifest(m.path).header.overrides == ()  # written before --set existed
    doc["overrides"] = "micro_batch=2"
    m.path.write_text(json.dumps(doc))
    with pytest.raises(InputError, match="overrides: 'micro_batch=2' is not a list of KEY=VALUE strings"):
        read_manifest(m.path)


def test_a_sweep_without_set_writes_no_overrides_key(tmp_path):
    m = Manifest.open(tmp_path, "s", scenario="s.yaml", cluster="local", run_ids=["a"])
    assert "overrides" not in json.loads(m.path.read_text())
    assert read_manifest(m.path).header.overrides == ()


def test_the_sweeps_first_line_and_status_name_the_overrides(tmp_path):
    path = write(tmp_path, AXIS_FILE)
    start = start_sweep(
        str(path),
        cluster_name="local",
        results=str(tmp_path / "r"),
        no_wait=False,
        pack=False,
        repeat=1,
        trace=False,
        checkpoint=False,
        overrides=("micro_batch=2", "inject={fault: slow, factor: 2}"),
    )
    assert start.scenario.overrides == ("micro_batch=2", "inject={fault: slow, factor: 2}")
    assert start.lines[0] == (
        "sweep 'ov': 3 cells on cluster 'local' (local, cpu) (--set micro_batch=2 --set 'inject={fault: slow, "
        "factor: 2}')"
    )
    specs = start.scenario.expand(gpus_per_node=2)
    Manifest.open(
        tmp_path / "r",
        "ov",
        scenario=str(path),
        cluster="local",
        run_ids=[s.run_id for s in specs],
        overrides=start.scenario.overrides,
    )
    assert next(iter(status_lines(str(tmp_path / "r")))) == (
        "sweep 'ov' on 'local': 3 cells (--set micro_batch=2 --set 'inject={fault: slow, factor: 2}')"
    )


def test_confirm_re_runs_the_cells_the_recorded_overrides_made(tmp_path):
    path = write(tmp_path, AXIS_FILE)
    overridden = load_scenario(path, overrides=["micro_batch=2"]).expand(gpus_per_node=2)
    plain_ids = {s.run_id for s in load_scenario(path).expand(gpus_per_node=2)}
    run_ids = {s.run_id for s in overridden}
    assert not run_ids & plain_ids  # without the overrides these cells are not the file's
    cluster = load_cluster("local")
    m = Manifest.open(
        tmp_path / "r",
        "ov",
        scenario=str(path),
        cluster="local",
        run_ids=sorted(run_ids),
        scenario_file=str(path),
        cluster_file=cluster.path,
        overrides=["micro_batch=2"],
    )
    scenario, again, root = what_to_rerun(m.path, run_ids)
    assert scenario.overrides == ("micro_batch=2",) and again.name == "local" and root == tmp_path / "r"
    assert {s.run_id for s in scenario.expand(gpus_per_node=2)} == run_ids


def test_the_tune_log_keeps_the_overrides(tmp_path):
    path = write(tmp_path, AXIS_FILE)
    sc = load_scenario(path, overrides=["micro_batch=2"])
    search = Search(sc, load_cluster("local"), [], [], 0, Budget(cells=None, minutes=None), started_at="x", started_s=0)
    log = check_tune_log(json.loads(json.dumps(search.log(finished=False).to_dict())))
    assert log.overrides == ["micro_batch=2"]
    assert check_tune_log({k: v for k, v in log.to_dict().items() if k != "overrides"}).overrides == []
