"""Tensor/pipeline layouts in the report (issue 18): a cell's layout is part of its strategy label, cells of two
layouts never merge, and the best-strategy table weighs layouts like strategies.

Records: tests/fixtures/smoke-legacy (the smoke baseline as committed before its regeneration on 2026-12-02: real
sweeps of several vintages on this CPU machine) with fsdp2.full_shard plain, tp 2 and pp 2 on 2 ranks and tp 2 on 4
ranks."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import matplotlib.image as mpimg
import numpy as np
import pytest

from harness.report import build_report
from harness.report.figures import LAYOUT_MARKERS, STRATEGY_STYLE, style
from harness.report.frame import base_strategy, layout_label, load_frame, strategy_label
from tests.unit.test_report import md_rows, md_section

SMOKE = Path(__file__).resolve().parents[2] / "tests" / "fixtures" / "smoke-legacy"
FSDP2 = "fsdp2.full_shard"


def _smoke_files() -> list[Path]:
    files = sorted(SMOKE.rglob("*.json"))
    if not files:
        pytest.skip("baselines/smoke-local has no records")
    return files


def test_layout_labels():
    assert layout_label(1, 1, None, 0, False) == ""
    assert layout_label(2, 1, None, 0, False) == "tp2"
    assert layout_label(2, 1, None, 0, True) == "tp2+sp"
    assert layout_label(1, 2, "1f1b", 0, False) == "pp2 (1f1b)"
    assert layout_label(2, 2, "1f1b", 0, False) == "tp2 × pp2 (1f1b)"
    assert layout_label(1, 4, "gpipe", 8, False) == "pp4 (gpipe, 8 microbatches)"
    assert strategy_label("ddp", "pp2 (1f1b)") == "ddp × pp2 (1f1b)"
    assert strategy_label("ddp", "") == "ddp"
    assert base_strategy("fsdp2.full_shard × tp2 × pp2 (1f1b)") == FSDP2
    # a layout keeps its strategy's colour and takes its own marker; a plain strategy keeps both
    assert style(f"{FSDP2} × tp2") == (STRATEGY_STYLE[FSDP2][0], LAYOUT_MARKERS[1])
    assert style(f"{FSDP2} × pp2 (1f1b)") == (STRATEGY_STYLE[FSDP2][0], LAYOUT_MARKERS[2])
    assert style(f"{FSDP2} × tp2 × pp2 (1f1b)") == (STRATEGY_STYLE[FSDP2][0], LAYOUT_MARKERS[3])
    assert style(FSDP2) == STRATEGY_STYLE[FSDP2]


def test_layouts_are_distinct_cells_with_their_labels(tmp_path):
    _smoke_files()
    df, _ = load_frame(SMOKE)
    fsdp2 = df[(df["base_strategy"] == FSDP2) & (df["precision"] == "fp32")]
    got = sorted(zip(fsdp2["strategy"], fsdp2["gpus"], fsdp2["tp"], fsdp2["pp"], fsdp2["layout"]))
    assert got == [
        (FSDP2, 2.0, 1.0, 1.0, ""),  # written before layouts existed: no tp/pp in its spec
        (f"{FSDP2} × pp2 (1f1b)", 2.0, 1.0, 2.0, "pp2 (1f1b)"),
        (f"{FSDP2} × tp2", 2.0, 2.0, 1.0, "tp2"),
        (f"{FSDP2} × tp2", 4.0, 2.0, 1.0, "tp2"),
    ]
    report = build_report([SMOKE], out=tmp_path / "report")
    cells = report["cells"]
    two = cells[(cells["base_strategy"] == FSDP2) & (cells["precision"] == "fp32") & (cells["gpus"] == 2)]
    assert sorted(two["strategy"]) == [FSDP2, f"{FSDP2} × pp2 (1f1b)", f"{FSDP2} × tp2"]
    assert sorted(two["tokens_per_s_per_gpu"].round(1)) == [352.2, 1003.3, 4390.1]
    assert not any("set aside" in w for w in report["warnings"])  # three layouts: three cells, none merged
    section = md_section(report["paths"]["markdown"].read_text(), "### tiny · 2 GPUs")
    rows = md_rows(section[: section.find("\n### ", 1)])  # this GPU count's table only
    shown = {(r[0], r[1]): r[2] for r in rows}
    assert shown[(f"{FSDP2} × tp2", "fp32")] == "352"
    assert shown[(f"{FSDP2} × pp2 (1f1b)", "fp32")] == "1,003"
    assert shown[(FSDP2, "fp32")] == "4,390"
    assert shown[("ddp", "bf16")] == "9,065"  # a plain strategy keeps its label
    four = cells[(cells["strategy"] == f"{FSDP2} × tp2") & (cells["gpus"] == 4)]
    assert four["tokens_per_s_per_gpu"].round(1).tolist() == [139.9]
    # the figures place their panels themselves: the longest label (a layout's) is inside the picture, nothing
    # touches its edges
    for name in ("scaling", "memory", "comm", "step_time"):
        img = mpimg.imread(report["paths"]["figures"][name])[..., :3]
        edges = np.concatenate([img[:3].reshape(-1, 3), img[-3:].reshape(-1, 3)])
        edges = np.concatenate([edges, img[:, :3].reshape(-1, 3), img[:, -3:].reshape(-1, 3)])
        assert edges.min() == 1.0, name  # white


def test_best_table_picks_a_layout_cell_when_it_is_fastest(tmp_path):
    results = tmp_path / "results"
    for f in _smoke_files():
        rec = json.loads(f.read_text())
        spec = rec.get("spec", {})  # NOTE: the manifest has none
        if spec.get("strategy") == FSDP2 and spec.get("tp") == 2 and spec.get("gpus") == 2:
            # the tp 2 cell made 20,000 tokens/s/GPU (every step 40x faster): faster than any cell on 2 ranks
            m = rec["metrics"]
            scale = 20_000.0 / m["tokens_per_s_per_gpu"]
            m["tokens_per_s_per_gpu"] = 20_000.0
            m["tokens_per_s"] *= scale
            m["step_time_s"] = {
                k: (v / scale if isinstance(v, float) else [s / scale for s in v] if isinstance(v, list) else v)
                for k, v in m["step_time_s"].items()
            }
        out = results / f.relative_to(SMOKE)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(rec))
    report = build_report([results], out=tmp_path / "report")
    best = report["best"].set_index("gpus")
    assert best.loc[2.0, "strategy"] == f"{FSDP2} × tp2"
    assert best.loc[2.0, "precision"] == "fp32"
    assert best.loc[2.0, "tokens_per_s_per_gpu"] == 20_000.0
    assert best.loc[2.0, "runner_up"] == "zero1"  # 10,146 tok/s/GPU at bf16, the fastest other strategy
    assert best.loc[2.0, "margin"] == pytest.approx(20_000.0 / 10146.070922 - 1.0, rel=1e-6)
    # one run of each: the lead is shown, not judged (a run's own steps say nothing about the next run)
    assert best.loc[2.0, "basis"] == "not judged" and best.loc[2.0, "verdict"] == "single run: lead not judged"
    assert best.loc[4.0, "strategy"] == "fsdp.hybrid_shard_zero2"  # tp 2 on 4 ranks (140) does not win there
    rows = md_rows(md_section(report["paths"]["markdown"].read_text(), "## Best strategy per model and GPU count"))
    assert rows[0][:4] == ["tiny", "2", f"{FSDP2} × tp2", "fp32"]
    shutil.rmtree(tmp_path / "report")
