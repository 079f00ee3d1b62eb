"""harness.results.store, the one reader of record files: which files a result tree holds and in what order (as
sorted(Path.rglob) would list them, hidden folders, manifests and tune logs left out), the records and the
warnings every command gets from them, and a wrong-typed field read as null without losing the record."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from harness.results.store import NOT_RECORDS, iter_records, load_records, read_record, record_files

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "records"


def _tree(root: Path) -> Path:
    shutil.copytree(FIXTURES, root)
    rec = json.loads(next((root / "fixture-h100").glob("125m-ddp-bf16-g2-*.json")).read_text())
    # "a" < "a-x" by path parts but "a-x/…" < "a/…" as strings: the order must be sorted(Path)'s
    for folder in ("a", "a-x", "a/b", ".hidden", "a/.fragments/r1"):
        (root / folder).mkdir(parents=True, exist_ok=True)
        (root / folder / "r.json").write_text(json.dumps({**rec, "run_id": folder}))
    (root / "a" / "manifest.json").write_text("{}")
    (root / "a" / "tune.json").write_text("{}")
    (root / "a" / ".tmp.json").write_text("{}")
    (root / "a" / "notes.txt").write_text("not a record")
    (root / "a" / "dir.json").mkdir()  # a folder named like a record: unreadable
    (root / "linked").symlink_to(root / "a-x", target_is_directory=True)  # not entered
    (root / "a" / "latin1.json").write_bytes('{"run_id": "\xe9"}'.encode("latin-1"))
    return root


def _reference(*dirs: Path) -> list[str]:
    """What the walk must find: pathlib's rglob, sorted, minus hidden parts and the files that are not records."""
    out: list[str] = []
    for d in dirs:
        if d.is_file():
            out.append(str(d))
            continue
        found = [
            p
            for p in sorted(d.rglob("*.json"))
            if not any(part.startswith(".") for part in p.relative_to(d).parts) and p.name not in NOT_RECORDS
        ]
        # NOTE: rglob (before Python 3.13) does not enter symlinked folders either
        out += [str(p) for p in found]
    return out


def test_the_files_and_their_order(tmp_path):
    root = _tree(tmp_path / "results")
    single = FIXTURES / "earlier" / "125m-zero2-bf16-g2-ddf42619a1.json"
    assert record_files(root, single) == _reference(root, single)
    assert len(record_files(root)) == 33


def test_records_and_warnings(tmp_path):
    root = _tree(tmp_path / "results")
    records, warnings = load_records(root)
    streamed_warnings: list[str] = []
    assert list(iter_records(root, warnings=streamed_warnings)) == records and streamed_warnings == warnings
    assert len(records) == 28 and len(warnings) == 5  # 25 of the fixture + a, a-x, a/b
    assert any("dir.json: unreadable: [Errno 21] Is a directory" in w for w in warnings)
    assert any("broken-truncated.json: not valid JSON" in w for w in warnings)
    assert any("future-schema.json: unknown schema_version 2" in w for w in warnings)
    assert any("partial-missing-spec.json: missing keys: spec" in w for w in warnings)
    assert all(r.path is not None and Path(r.path).is_file() for r in records)


def test_a_wrong_typed_field_is_null_with_a_warning_and_the_record_is_kept(tmp_path):
    doc = json.loads(next((FIXTURES / "fixture-h100").glob("125m-ddp-bf16-g2-*.json")).read_text())
    doc["metrics"]["mfu"] = "high"
    doc["metrics"]["step_time_s"]["samples"][1] = "slow"
    doc["env"]["hostnames"] = [3]
    doc["comm"] = "n/a"
    path = tmp_path / "r.json"
    path.write_text(json.dumps(doc))
    warnings: list[str] = []
    rec = read_record(path, warnings=warnings)
    assert rec.metrics.mfu is None and rec.comm is None and rec.env.hostnames is None
    assert rec.metrics.step_time_s is not None and rec.metrics.step_time_s.samples is not None
    assert rec.metrics.step_time_s.samples[1] is None and len(rec.metrics.step_time_s.finite_samples()) == 9
    assert rec.metrics.tokens_per_s_per_gpu == doc["metrics"]["tokens_per_s_per_gpu"]  # the rest is kept
    assert warnings == [
        f"{path}: metrics.step_time_s.samples[1] is 'slow', not a number; read as null",
        f"{path}: metrics.mfu is 'high', not a number; read as null",
        f"{path}: env.hostnames[0] is 3, not a string; read as null",
        f"{path}: comm is 'n/a', not an object; read as null",
    ]
