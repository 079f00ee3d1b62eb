"""harness.results.fastload gives exactly what harness.results.store.load_records gives: the same files in the same
order, the same records, the same warnings (the report reads through it; store stays the reference)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from harness.results.fastload import iter_records, record_files
from harness.results.store import iter_record_files, load_records

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "records"


def _tree(root: Path) -> Path:
    shutil.copytree(FIXTURES, root)
    rec = json.loads(next((root / "fixture-h100").glob("125m-ddp-bf16-g2-*.json")).read_text())
    # "a" < "a-x" by path parts but "a-x/…" < "a/…" as strings: the order must be sorted(Path)'s
    for folder in ("a", "a-x", "a/b", ".hidden", "a/.fragments/r1"):
        (root / folder).mkdir(parents=True, exist_ok=True)
        (root / folder / "r.json").write_text(json.dumps({**rec, "run_id": folder}))
    (root / "a" / "manifest.json").write_text("{}")
    (root / "a" / ".tmp.json").write_text("{}")
    (root / "a" / "notes.txt").write_text("not a record")
    (root / "a" / "dir.json").mkdir()  # a folder named like a record: unreadable, as store says
    (root / "linked").symlink_to(root / "a-x", target_is_directory=True)  # rglob does not enter it
    (root / "a" / "latin1.json").write_bytes('{"run_id": "\xe9"}'.encode("latin-1"))
    return root


def test_same_files_in_the_same_order(tmp_path):
    root = _tree(tmp_path / "results")
    assert record_files(root, FIXTURES / "earlier" / "125m-zero2-bf16-g2-ddf42619a1.json") == [
        str(p) for p in iter_record_files(root, FIXTURES / "earlier" / "125m-zero2-bf16-g2-ddf42619a1.json")
    ]
    assert len(record_files(root)) == 33


def test_same_records_and_warnings(tmp_path):
    root = _tree(tmp_path / "results")
    reference, ref_warnings = load_records(root)
    warnings: list[str] = []
    fast = list(iter_records(root, warnings=warnings))
    assert fast == reference and warnings == ref_warnings
    assert len(fast) == 28 and len(warnings) == 5  # 25 of the fixture + a, a-x, a/b
    assert any("dir.json: unreadable: [Errno 21] Is a directory" in w for w in warnings)
