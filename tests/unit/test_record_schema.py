"""harness.results.record: the record and payload models against the record's reference page (docs/reference/record.md,
its field tables generated from the models by docs/hooks/reference.py), the record writers (the worker's example
record, the launcher's composed and skipped records, the payload) and every stored record."""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import re
from pathlib import Path
from typing import get_args

import pytest
from pydantic import BaseModel

from harness.core.typed import models_in
from harness.core.zoo import OPTIONAL_FIELDS, ModelConfig
from harness.launch.core.outcome import finalize, skipped_record
from harness.launch.core.payload import make_payload, predict
from harness.results import record
from harness.results.payload import Payload
from harness.results.record import STATUSES, Record
from harness.results.spec import CORE_KEYS, spec_from_json, spec_to_json
from harness.results.store import load_records, parse_record, read_record, record_files, write_record
from harness.scenario.cluster import load_cluster
from harness.scenario.spec import SETTING_FIELDS, RunSpec

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "docs" / "record-example.json"
RECORD_PAGE = ROOT / "docs" / "reference" / "record.md"
DOCS_HOOK = ROOT / "docs" / "hooks" / "reference.py"
STORED = (
    ROOT / "baselines" / "smoke-local",
    ROOT / "tests" / "fixtures" / "smoke-legacy",
    ROOT / "tests" / "fixtures" / "records",
)
NOT_RECORDS = {"broken-truncated.json", "future-schema.json", "partial-missing-spec.json"}
"""fixture files that are broken on purpose (the report's warnings are tested on them)"""


# ---- the contract: what a record of each kind holds


def test_the_contract_check_can_fail():
    rec = parse_record(json.loads(EXAMPLE.read_text()))
    assert rec.contract_problems() == []
    bad = json.loads(EXAMPLE.read_text())
    del bad["metrics"]["loss"]
    bad["metrics"]["step_time_p50_s"] = 0.1
    bad["surprise"] = 1
    assert parse_record(bad).contract_problems() == [
        "record.surprise: not a field of Record",
        "record.metrics.step_time_p50_s: not a field of Metrics",
        "record.metrics.loss: missing",
    ]
    with pytest.raises(ValueError, match="status 'fine' is not one of ok, oom"):
        parse_record({**bad, "status": "fine"})
    warnings: list[str] = []
    read = parse_record({**bad, "comm": {**bad["comm"], "bytes_per_step": "many"}}, where="r.json", warnings=warnings)
    assert read.comm is not None and read.comm.bytes_per_step is None
    assert warnings == ["r.json: comm.bytes_per_step is 'many', not a number; read as null"]


# ---- the reference page's tables and the types


def type_paths(model: type[BaseModel], prefix: str = "") -> tuple[set[str], set[str]]:
    """(leaf fields, every field) of a model as dotted paths (the file's keys): `a.b` nested, `a[].b` in a list's
    items, `a.<>.b` in a dict's values (a placeholder for the key)."""
    leaves: set[str] = set()
    known: set[str] = set()
    for name, f in model.model_fields.items():
        path = f"{prefix}{f.alias or name}"
        known.add(path)
        inner = models_in(f.annotation)
        for sub, suffix in inner:
            if suffix == ".<>":
                known.add(path + suffix)
            inner_leaves, inner_known = type_paths(sub, f"{path}{suffix}.")
            leaves |= inner_leaves
            known |= inner_known
        if not inner:
            leaves.add(path)
    if model is Record:
        leaves.add("_path")  # not in the file: where the store read it (Record.path)
        known.add("_path")
        # the cell (harness.results.spec: a RunSpec, no pydantic model): its core keys, settings and dimensions
        spec = {f"spec.{k}" for k in (*CORE_KEYS, *SETTING_FIELDS) if k != "model_config"}
        dims = {f"spec.model_config.{f.name}" for f in dataclasses.fields(ModelConfig)}
        leaves = (leaves - {"spec"}) | spec | dims
        known |= spec | dims | {"spec.model_config"}
    return leaves, known


def _expand(span: str) -> list[str]:
    m = re.fullmatch(r"(.*?)\{([^{}]*)\}(.*)", span)
    if not m:
        return [span]
    return [x for part in m.group(2).split(",") for x in _expand(m.group(1) + part.strip() + m.group(3))]


def record_page() -> str:
    """docs/reference/record.md as the site shows it: its `<!-- generated: … -->` markers replaced by the tables the
    docs' MkDocs hook generates from the models (the hook is loaded from its file; it needs no MkDocs)."""
    spec = importlib.util.spec_from_file_location("docs_reference_hook", DOCS_HOOK)
    assert spec is not None and spec.loader is not None
    hook = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(hook)
    return hook.expand_markers(RECORD_PAGE.read_text(), "reference/record.md")


def _section(text: str, heading: str) -> str:
    start = text.index(heading)
    end = text.find("\n## ", start + 1)
    return text[start : end if end >= 0 else len(text)]


def page_rows() -> list[list[str]]:
    """The cells of every row of the page's field tables ("## Fields"), whose first column names a field."""
    rows = [line for line in _section(record_page(), "## Fields").splitlines() if line.startswith("| `")]
    assert len(rows) > 20, "the record page's field tables were not found"
    return [[cell.strip() for cell in re.split(r"(?<!\\)\|", row)[1:-1]] for row in rows]


def page_paths() -> set[str]:
    """The fields the record page's tables name in their first column (`a.{b, c}` is a.b and a.c; `<name>` in a path
    is a dict's key)."""
    paths = set()
    for row in page_rows():
        for span in re.findall(r"`([^`]+)`", row[0]):
            paths.update(re.sub(r"<[^>]*>", "<>", p) for p in _expand(span))
    return paths


def test_the_record_page_documents_every_record_field_and_only_those():
    leaves, known = type_paths(Record)
    documented = page_paths()
    assert sorted(leaves - documented) == [], "fields of harness.results.record.Record missing from the record page"
    assert sorted(documented - known) == [], "fields on the record page that harness.results.record.Record lacks"


def test_every_field_on_the_record_page_says_what_it_is():
    """A field's meaning on the page is its docstring in the model: a field added without one is a blank row."""
    blank = [row[0] for row in page_rows() if len(row) != 4 or not row[3]]
    assert blank == [], "record fields without a docstring (their meaning on docs/reference/record.md)"


def test_the_record_pages_notes_name_only_fields_the_record_has():
    """The page's hand-written notes name fields by their paths: each must still be a field (or a key inside one)."""
    _, known = type_paths(Record)
    notes = _section(RECORD_PAGE.read_text(), "## Notes")
    named = set(re.findall(r"`((?:spec|metrics|env|comm|predicted|layout|artifacts|failures)(?:\.[a-z_]+)+)`", notes))
    assert len(named) > 10, "the record page's notes were not found"
    unknown = sorted(p for p in named if p not in known and p.rsplit(".", 1)[0] not in known)
    assert unknown == [], "the record page's notes name fields the record lacks"


def test_page_parsing_sees_nested_and_placeholder_fields():
    documented = page_paths()
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
    assert get_args(record.Status) == STATUSES
    spec_fields = {f.name for f in dataclasses.fields(RunSpec)} - {"settings", "extra"} | set(SETTING_FIELDS)
    written = spec_to_json(spec_from_json(json.loads(EXAMPLE.read_text())["spec"]))
    assert list(written)[: len(CORE_KEYS)] == list(CORE_KEYS) and set(written) == spec_fields
    assert set(written["model_config"]) | set(OPTIONAL_FIELDS) == {f.name for f in dataclasses.fields(ModelConfig)}


# ---- records as written and as stored


def test_the_example_record_is_a_record():
    rec = read_record(EXAMPLE)
    assert rec.contract_problems() == []
    # a real rank 0 record: the measured metrics and env, not the {} of a composed one
    assert rec.metrics.step_time_s is not None and rec.env.torch is not None and rec.comm is not None


def test_every_stored_record_is_a_record():
    files = [p for d in STORED for p in record_files(d)]
    assert len(files) >= 48
    checked = 0
    for p in files:
        if Path(p).name in NOT_RECORDS:
            with pytest.raises(ValueError):
                read_record(p)
            continue
        warnings: list[str] = []
        rec = read_record(p, warnings=warnings)  # as read: spec.world_size renamed spec.gpus
        assert warnings == [] and rec.contract_problems() == [], p
        checked += 1
    assert checked == len(files) - len(NOT_RECORDS)
    records, _ = load_records(*STORED)
    assert len(records) == checked and all(r.path is not None and r.contract_problems() == [] for r in records)


def test_a_record_written_and_read_back_is_the_same_file(tmp_path):
    """Reading through the model and writing again changes nothing a reader sees: the same JSON document."""
    doc = json.loads(EXAMPLE.read_text())
    write_record(tmp_path, parse_record(doc))
    again = json.loads((tmp_path / doc["sweep"] / f"{doc['run_id']}.json").read_text())
    assert again == doc


@pytest.fixture
def cell(tmp_path):
    spec = spec_from_json(json.loads(EXAMPLE.read_text())["spec"])
    cluster = load_cluster("local")
    payload = make_payload(
        spec, sweep="smoke", cluster=cluster, results=tmp_path, sha="abc123", predicted=predict(spec, cluster)
    )
    return dict(spec=spec, cluster=cluster, payload=payload, results=tmp_path)


def test_the_payload_is_a_payload(cell):
    payload: Payload = cell["payload"]
    doc = payload.to_dict()
    assert set(doc) == set(Payload.model_fields) - {"job_id", "pack"}  # those two: SLURM only
    again = Payload.model_validate(dict(doc, job_id="812345_3", pack={"position": 2, "of": 3, "minutes": 45}))
    assert again.pack is not None and again.pack.of == 3 and again.job_id == "812345_3"
    assert Payload.model_validate(dict(doc, port=1)).model_extra == {"port": 1}  # kept, not lost
    with pytest.raises(ValueError, match="run_id"):
        Payload.model_validate({k: v for k, v in doc.items() if k != "run_id"})


def test_composed_and_skipped_records_are_records(cell):
    payload = cell["payload"]
    tb = 'Traceback (most recent call last):\n  File "x.py", line 1, in <module>\nValueError: boom\n'
    rec = finalize(payload, elapsed_s=1.0, time_limit_s=60.0, job_errors={1: tb}, log_tail="the last lines")
    assert rec.status == "error" and rec.to_dict()["metrics"] == {}
    assert set(rec.to_dict()["env"]) == {"harness_git_sha", "slurm_job_id"}
    assert rec.contract_problems() == []
    assert read_record(cell["results"] / "smoke" / f"{payload.run_id}.json").contract_problems() == []
    from harness.worker.runner import report_failure

    payload = payload.model_copy(update={"attempt": "0123456789ab"})  # a second launch: the first's record is not its
    report_failure(payload, 0, "oom", "OutOfMemoryError: out of memory", {"traceback": tb, "memory_rss_gib": 1.5})
    rec = finalize(payload, elapsed_s=1.0, time_limit_s=60.0)
    assert rec.status == "oom" and rec.failures is not None and rec.failures[0].memory_rss_gib == 1.5
    assert rec.contract_problems() == []
    rec = skipped_record(
        cell["spec"],
        sweep="smoke",
        cluster=cell["cluster"],
        results=cell["results"],
        reason="predicted not to fit",
        predicted=payload.predicted,
    )
    assert rec.to_dict()["env"] == {} and rec.contract_problems() == []


def test_gpus_is_one_word_from_scenario_to_record_and_old_records_still_read(tmp_path):
    """`gpus` in scenarios, RunSpec, records and the report; a record written before the rename (spec.world_size)
    loads as spec.gpus, matches its new self in compare, and run_ids did not change (the smoke baseline as
    committed before its regeneration, tests/fixtures/smoke-legacy: its file names are the run_ids the scenario
    expands to today)."""
    from harness.compare.match import spec_key
    from harness.results.store import load_records
    from harness.scenario.cluster import load_cluster
    from harness.scenario.schema import load_scenario

    baseline = ROOT / "tests" / "fixtures" / "smoke-legacy" / "smoke"  # the smoke baseline before 2026-12-02
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
    by_id = {json.loads(p.read_text())["run_id"]: json.loads(p.read_text())["spec"] for p in old}
    for rec in records:
        spec = spec_to_json(rec.spec)
        assert "world_size" not in spec and isinstance(spec["gpus"], int) and spec["gpus"] == rec.spec.gpus
        assert rec.spec.run_id == rec.run_id  # the cell read from an old record hashes to the old run_id
        legacy = {("world_size" if k == "gpus" else k): v for k, v in spec.items()}
        assert spec_key(spec_from_json(legacy)) == spec_key(rec.spec) == spec_key(spec_from_json(by_id[rec.run_id]))
