"""The report's checkpoint figure and columns (issue 34): the fixture's records with a checkpoint phase added to
their ok cells draw `checkpoint.png`, and table.csv carries every checkpoint column of the metric registry."""

from __future__ import annotations

import json
import shutil

import pandas as pd
import pytest

from harness.report import build_report
from tests.unit.test_report import FIXTURES

pytestmark = pytest.mark.slow


def with_checkpoint(doc: dict, k: int) -> dict:
    """The record of an ok cell as a `checkpoint: true` cell would have it (numbers made up; `k` makes them distinct
    per cell)."""
    n = doc["metrics"]["n_params"]
    doc["spec"]["checkpoint"] = True
    doc["metrics"]["checkpoint"] = {
        "format": "dcp", "dir": "/shared/ckpt", "step": 8, "save_s": 1.0 + k, "save_s_per_rank": [1.0 + k],
        "load_s": 0.5 + k, "load_s_per_rank": [0.5 + k], "bytes": 12 * n + 1000 + k, "files": 3,
        "resume_loss_delta": 0.0, "resume_losses": [5.0, 4.9],
    }  # fmt: skip
    doc.setdefault("predicted", {}).update(checkpoint_bytes=12 * n, checkpoint_s=0.25 + k)
    return doc


def test_checkpoint_cells_draw_the_figure_and_fill_the_columns(tmp_path):
    src = FIXTURES / "fixture-h100"
    dst = tmp_path / "records" / "fixture-h100"
    shutil.copytree(src, dst)
    expected = {}
    cells = sorted({json.loads(p.read_text()).get("run_id", "") for p in dst.glob("*.json") if _readable(p)})
    for path in sorted(dst.glob("*.json")):
        try:
            doc = json.loads(path.read_text())
        except ValueError:  # the fixture's torn record, kept as it is
            continue
        if isinstance(doc, dict) and doc.get("status") == "ok" and (doc.get("metrics") or {}).get("n_params"):
            k = cells.index(doc["run_id"])  # NOTE: one cell's several records get the same numbers
            path.write_text(json.dumps(with_checkpoint(doc, k)))
            expected[doc["run_id"]] = (12 * doc["metrics"]["n_params"] + 1000 + k, 1.0 + k)
    assert len(expected) >= 5
    report = build_report([tmp_path / "records"], out=tmp_path / "report")
    (fig,) = [f for f in report["figures"] if f.name == "checkpoint"]
    assert fig.png is not None and (tmp_path / "report" / "checkpoint.png").read_bytes() == fig.png
    table = pd.read_csv(report["paths"]["csv"]).set_index("run_id")
    for run_id, (nbytes, save_s) in expected.items():
        assert table.loc[run_id, "checkpoint_bytes"] == nbytes and table.loc[run_id, "checkpoint_save_s"] == save_s
        assert table.loc[run_id, "checkpoint_files"] == 3 and table.loc[run_id, "resume_loss_delta"] == 0.0
    assert table["predicted_checkpoint_bytes"].notna().sum() == len(expected)


def _readable(path) -> bool:
    try:
        return isinstance(json.loads(path.read_text()), dict)
    except ValueError:
        return False
