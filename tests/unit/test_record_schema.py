"""harness.results.schema: the record and payload types against the README's record table, the record writers
(the worker's example record, the launcher's composed and skipped records, the payload) and every stored record."""

from __future__ import annotations

import dataclasses
import json
import re
import types
import typing
from pathlib import Path
from typing import Any, Literal, NotRequired, Required, Union, get_args, get_origin, get_type_hints

import pytest

from harness.core.zoo import ModelConfig
from harness.results import schema
from harness.results.schema import Payload, Record
from harness.results.store import STATUSES, iter_record_files, load_records, read_record
from harness.scenario.cluster import load_cluster
from harness.scenario.schema import SETTING_FIELDS, RunSpec

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "docs" / "record-example.json"
STORED = (ROOT / "baselines" / "smoke-local", ROOT / "tests" / "fixtures" / "records")
NOT_RECORDS = {"broken-truncated.json", "future-schema.json", "partial-missing-spec.json"}
"""fixture files that are broken on purpose (the report's warnings are tested on them)"""


# ---- a structural validator over the TypedDict annotations


def _strip(tp: Any) -> Any:
    """The type inside NotRequired[...] / Required[...]."""
    while get_origin(tp) in (NotRequired, Required):
        (tp,) = get_args(tp)
    return tp


def _members(tp: Any) -> tuple[Any, ...]:
    return get_args(tp) if get_origin(tp) in (Union, types.UnionType) else (tp,)


def validate(value: Any, tp: Any, where: str = "record") -> list[str]:
    """Problems of `value` as an instance of `tp` (TypedDicts: required keys present, no unknown keys, each
    value of its type; unions: some member fits). JSON numbers: an int is a float too, a bool is neither."""
    tp = _strip(tp)
    if tp is Any:
        return []
    if typing.is_typeddict(tp):
        if not isinstance(value, dict):
            return [f"{where}: {type(value).__name__}, not an object ({tp.__name__})"]
        hints = get_type_hints(tp, include_extras=True)
        problems = [f"{where}.{k}: missing ({tp.__name__})" for k in sorted(tp.__required_keys__ - value.keys())]
        problems += [f"{where}.{k}: not a field of {tp.__name__}" for k in sorted(value.keys() - hints.keys())]
        for k in sorted(value.keys() & hints.keys()):
            problems += validate(value[k], hints[k], f"{where}.{k}")
        return problems
    origin = get_origin(tp)
    if origin in (Union, types.UnionType):
        tries = [validate(value, m, where) for m in get_args(tp)]
        return [] if any(not t for t in tries) else min(tries, key=len)
    if origin is Literal:
        return [] if value in get_args(tp) else [f"{where}: {value!r} is not one of {get_args(tp)}"]
    if origin is list:
        if not isinstance(value, list):
            return [f"{where}: {type(value).__name__}, not a list"]
        (item,) = get_args(tp)
        return [p for i, v in enumerate(value) for p in validate(v, item, f"{where}[{i}]")]
    if origin is dict:
        if not isinstance(value, dict):
            return [f"{where}: {type(value).__name__}, not an object"]
        _, item = get_args(tp)
        return [p for k, v in value.items() for p in validate(v, item, f"{where}.{k}")]
    if tp is type(None):
        return [] if value is None else [f"{where}: {value!r}, not null"]
    if tp is float:
        ok = isinstance(value, (int, float)) and not isinstance(value, bool)
    elif tp is int:
        ok = isinstance(value, int) and not isinstance(value, bool)
    else:
        ok = isinstance(value, tp)
    return [] if ok else [f"{where}: {value!r} is not {tp.__name__}"]


def test_the_validator_can_fail():
    rec = json.loads(EXAMPLE.read_text())
    assert validate(rec, Record) == []
    bad = json.loads(EXAMPLE.read_text())
    del bad["spec"]["seq_len"]
    bad["metrics"]["step_time_p50_s"] = 0.1
    bad["status"] = "fine"
    bad["comm"]["bytes_per_step"] = "many"
    bad["surprise"] = 1
    assert validate(bad, Record) == [
        "record.surprise: not a field of Record",
        "record.comm.bytes_per_step: 'many' is not float",
        "record.metrics.step_time_p50_s: not a field of Metrics",
        "record.spec.seq_len: missing (Spec)",
        "record.status: 'fine' is not one of ('ok', 'oom', 'timeout', 'error', 'nan', 'crashed', 'cancelled', "
        "'skipped')",
    ]


# ---- the README's table and the types


def type_paths(tp: Any, prefix: str = "") -> tuple[set[str], set[str]]:
    """(leaf fields, every field) of a TypedDict as dotted paths: `a.b` nested, `a[].b` in a list's items,
    `a.<>.b` in a dict's values (a placeholder for the key)."""
    leaves: set[str] = set()
    known: set[str] = set()
    for key, hint in get_type_hints(tp, include_extras=True).items():
        path = f"{prefix}{key}"
        known.add(path)
        found = False
        for t in _members(_strip(hint)):
            origin, sub = get_origin(t), t
            suffix = ""
            if origin is list and typing.is_typeddict(get_args(t)[0]):
                sub, suffix = get_args(t)[0], "[]"
            elif origin is dict and typing.is_typeddict(get_args(t)[1]):
                sub, suffix = get_args(t)[1], ".<>"
                known.add(path + suffix)
            if typing.is_typeddict(sub):
                found = True
                inner_leaves, inner_known = type_paths(sub, f"{path}{suffix}.")
                leaves |= inner_leaves
                known |= inner_known
        if not found:
            leaves.add(path)
    return leaves, known


def _expand(span: str) -> list[str]:
    m = re.fullmatch(r"(.*?)\{([^{}]*)\}(.*)", span)
    if not m:
        return [span]
    return [x for part in m.group(2).split(",") for x in _expand(m.group(1) + part.strip() + m.group(3))]


def readme_paths() -> set[str]:
    """The fields the README's "Record contract" table names in its first column (`a.{b, c}` is a.b and a.c;
    `<name>` in a path is a dict's key)."""
    text = (ROOT / "README.md").read_text()
    start = text.index("## Record contract")
    section = text[start : text.find("\n## ", start + 1)]
    paths = set()
    rows = [line for line in section.splitlines() if line.startswith("| `")]
    assert len(rows) > 20, "the README's record table was not found"
    for row in rows:
        first = row.split("|")[1]
        for span in re.findall(r"`([^`]+)`", first):
            paths.update(re.sub(r"<[^>]*>", "<>", p) for p in _expand(span))
    return paths


def test_readme_documents_every_record_field_and_only_those():
    leaves, known = type_paths(Record)
    documented = readme_paths()
    assert sorted(leaves - documented) == [], "fields of harness.results.schema.Record missing from the README table"
    assert sorted(documented - known) == [], "fields in the README table that harness.results.schema.Record lacks"


def test_readme_parsing_sees_nested_and_placeholder_fields():
    documented = readme_paths()
    assert {
        "metrics.step_time_s.median",
        "comm.by_collective.<>.busbw_gbps",
        "failures[].traceback",
        "env.slurm_pack.position",
        "spec.model_config.n_kv_heads",
        "_path",
    } <= documented
    leaves, _ = type_paths(Record)
    assert {
        "metrics.step_time_s.median",
        "comm.by_collective.<>.busbw_gbps",
        "failures[].traceback",
        "env.slurm_pack.position",
        "spec.model_config.n_kv_heads",
        "metrics.null_reasons",
    } <= leaves


# ---- the types and the code that defines the same things


def test_status_and_spec_types_match_their_definitions():
    assert get_args(schema.Status) == STATUSES
    spec_fields = {f.name for f in dataclasses.fields(RunSpec)} - {"settings"} | set(SETTING_FIELDS)
    assert set(get_type_hints(schema.Spec)) == spec_fields
    assert set(get_type_hints(schema.ModelConfigDict)) == {f.name for f in dataclasses.fields(ModelConfig)}


# ---- records as written and as stored


def test_the_example_record_is_a_record():
    rec = read_record(EXAMPLE)
    assert validate(rec, Record) == []
    # a real rank 0 record: the measured metrics and env, not the {} of a composed one
    assert validate(rec["metrics"], schema.Metrics) == [] and validate(rec["env"], schema.Env) == []


def test_every_stored_record_is_a_record():
    files = [p for d in STORED for p in iter_record_files(d)]
    assert len(files) >= 48
    checked = 0
    for p in files:
        if p.name in NOT_RECORDS:
            with pytest.raises(ValueError):
                read_record(p)
            continue
        assert validate(read_record(p), Record, p.name) == []  # as read: spec.world_size renamed spec.gpus
        checked += 1
    assert checked == len(files) - len(NOT_RECORDS)
    records, _ = load_records(*STORED)  # with the `_path` load_records adds
    assert len(records) == checked and all(validate(r, Record) == [] for r in records)


def _launch_core():
    """(make_payload, finalize, skipped_record, predict) wherever the launcher keeps them."""
    try:
        from harness.launch.core.outcome import finalize, skipped_record
        from harness.launch.core.payload import make_payload, predict
    except ImportError:
        from harness.launch.sweep import finalize, make_payload, predict, skipped_record
    return make_payload, finalize, skipped_record, predict


@pytest.fixture
def cell(tmp_path):
    make_payload, finalize, skipped_record, predict = _launch_core()
    spec = RunSpec.from_dict(json.loads(EXAMPLE.read_text())["spec"])
    cluster = load_cluster("local")
    payload = make_payload(
        spec, sweep="smoke", cluster=cluster, results=tmp_path, sha="abc123", predicted=predict(spec, cluster)
    )
    return dict(
        spec=spec, cluster=cluster, payload=payload, finalize=finalize, skipped_record=skipped_record, results=tmp_path
    )


def test_the_payload_is_a_payload(cell):
    payload = cell["payload"]
    assert validate(payload, Payload) == []
    assert set(payload) == set(get_type_hints(Payload)) - {"job_id", "pack"}  # those two: SLURM only
    assert validate(dict(payload, job_id="812345_3", pack={"position": 2, "of": 3, "minutes": 45}), Payload) == []
    assert validate(dict(payload, port=1), Payload) == ["record.port: not a field of Payload"]


def test_composed_and_skipped_records_are_records(cell):
    payload, finalize = cell["payload"], cell["finalize"]
    tb = 'Traceback (most recent call last):\n  File "x.py", line 1, in <module>\nValueError: boom\n'
    rec = finalize(payload, elapsed_s=1.0, time_limit_s=60.0, job_errors={1: tb}, log_tail="the last lines")
    assert rec["status"] == "error" and rec["metrics"] == {} and set(rec["env"]) == {"harness_git_sha", "slurm_job_id"}
    assert (
        validate(rec, Record) == []
        and validate(read_record(cell["results"] / "smoke" / f"{payload['run_id']}.json"), Record) == []
    )
    from harness.worker.runner import write_fragment

    payload = dict(payload, attempt="0123456789ab")  # a second launch: the first one's record is not its own
    write_fragment(payload, 0, "oom", "OutOfMemoryError: out of memory", {"traceback": tb, "memory_rss_gib": 1.5})
    rec = finalize(payload, elapsed_s=1.0, time_limit_s=60.0)
    assert rec["status"] == "oom" and rec["failures"][0]["memory_rss_gib"] == 1.5
    assert validate(rec, Record) == []
    rec = cell["skipped_record"](
        cell["spec"],
        sweep="smoke",
        cluster=cell["cluster"],
        results=cell["results"],
        reason="predicted not to fit",
        predicted=payload["predicted"],
    )
    assert rec["env"] == {} and validate(rec, Record) == []


def test_gpus_is_one_word_from_scenario_to_record_and_old_records_still_read(tmp_path):
    """`gpus` in scenarios, RunSpec, records and the report; a record written before the rename (spec.world_size)
    loads as spec.gpus, matches its new self in compare, and run_ids did not change (the committed smoke
    baseline's file names are the run_ids the scenario expands to today)."""
    from harness.compare.match import spec_key
    from harness.results.store import load_records
    from harness.scenario.cluster import load_cluster
    from harness.scenario.schema import RunSpec, load_scenario

    baseline = ROOT / "baselines" / "smoke-local" / "smoke"
    old = sorted(baseline.glob("*.json"))
    legacy = [p for p in old if "world_size" in json.loads(p.read_text())["spec"]]  # written before the rename
    assert len(legacy) >= 22
    cluster = load_cluster("local")
    expanded = {
        s.run_id for s in load_scenario(ROOT / "scenarios" / "smoke.yaml").expand(gpus_per_node=cluster.gpus_per_node)
    }
    assert {json.loads(p.read_text())["run_id"] for p in old} <= expanded

    records, warnings = load_records(baseline)
    assert not warnings and len(records) == len(old)
    for rec in records:
        spec = rec["spec"]
        assert "world_size" not in spec and isinstance(spec["gpus"], int)
        rebuilt = RunSpec.from_dict(dict(spec))
        assert rebuilt.run_id == rec["run_id"] and rebuilt.to_dict()["gpus"] == spec["gpus"]
        legacy = {("world_size" if k == "gpus" else k): v for k, v in spec.items()}
        assert spec_key(legacy) == spec_key(spec)
