"""What a newcomer found in the report (issue 15): CPU memory shown as device memory, a best-strategy table that
crowned noise, a scaling figure that lost precision and drew one-count series at efficiency 1.0, an all-grey MFU
heatmap on CPU, and a read-only `-o` that ended in a traceback.

CPU records: tests/fixtures/smoke-legacy, the smoke baseline as committed before its regeneration on 2026-12-02 (real
sweeps on this CPU machine, gloo, 2 and 4 ranks, records of several vintages); GPU records:
the committed fixture sweep (tests/fixtures/records).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import statistics
from html import unescape
from pathlib import Path

import matplotlib.image as mpimg
import numpy as np
import pandas as pd
import pytest

from harness.cli import main
from harness.compare.stats import run_level_p
from harness.report import build_report, output_problem
from harness.report.figures import STRATEGY_STYLE
from harness.report.figures.base import precision_handle
from tests.unit.test_report import md_rows, md_section

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests" / "fixtures" / "records"
SMOKE = ROOT / "tests" / "fixtures" / "smoke-legacy"


@pytest.fixture(scope="module")
def cpu_report(tmp_path_factory):
    if not any(SMOKE.rglob("*.json")):
        pytest.skip("baselines/smoke-local has no records")
    return build_report([SMOKE], out=tmp_path_factory.mktemp("cpu"))


# --- 5: CPU memory is a process RSS, not device memory -----------------------------------------------------


def test_cpu_memory_is_labelled_peak_rss_and_never_paired_with_the_prediction(cpu_report):
    table = pd.read_csv(cpu_report["paths"]["csv"])
    assert set(table["memory_measure"]) == {"cpu_process_rss"}
    assert table["predicted_memory_gib"].notna().all()  # the records have a prediction: table.csv keeps it
    md = cpu_report["paths"]["markdown"].read_text()
    section = md_section(md, "### tiny · 2 GPUs")
    header = next(line for line in section.splitlines() if line.startswith("| strategy"))
    assert "peak RSS, CPU process (GiB)" in header
    for device_only in ("mem alloc", "mem reserved", "mem predicted", "capacity"):
        assert device_only not in header
    ddp = next(r for r in md_rows(section) if r[:2] == ["ddp", "bf16"])
    rec = table[(table["strategy"] == "ddp") & (table["precision"] == "bf16")].iloc[0]
    # tok/s/GPU, MFU, step median, p90, then the RSS: the record's peak_memory_allocated_gib
    assert ddp[6] == f"{rec['peak_memory_allocated_gib']:.3g}"
    html = cpu_report["paths"]["html"].read_text()
    assert "peak RSS, CPU process (GiB)" in html and "mem predicted (GiB)" not in html
    memory = next(f for f in cpu_report["figures"] if f.name == "memory")
    assert memory.png is not None and "peak RSS of the whole process" in memory.caption


def test_gpu_tables_keep_the_device_memory_columns(tmp_path):
    md = build_report([FIXTURES], out=tmp_path)["paths"]["markdown"].read_text()
    section = md_section(md, "## Model 125m")
    assert "mem predicted (GiB)" in section and "peak RSS" not in section


# --- 6: the best table says when the leader is noise ------------------------------------------------------


def test_best_table_marks_a_lead_inside_the_noise(tmp_path):
    """125m @ 2 GPUs: ddp leads fsdp2.full_shard by 4.5% in the fixture. Two earlier runs of each (3 a side:
    harness sweep --repeat) put ddp at 100,000 and 150,000 tok/s/GPU: the run-level test finds the lead to be
    noise: ≈ in the best table and in the model table. The lead shown is the runs' medians' (150,000 over
    fsdp2's 145,435: +3.1%), as the best table ranks cells (issue 48). 125m @ 4 GPUs has one run a side: not
    judged."""
    src = tmp_path / "records"
    shutil.copytree(FIXTURES / "fixture-h100", src)
    extra = {"125m-ddp-bf16-g2-bca7e9c191.json": (100000.0, 150000.0)}
    fsdp2 = next(src.glob("125m-fsdp2.full_shard-bf16-g2-*.json")).name
    extra[fsdp2] = (146000.0, 144000.0)
    for name, values in extra.items():
        for i, tps in enumerate(values):
            rec = json.loads((src / name).read_text())
            rec.update(run_id=f"{rec['run_id']}-run{i}", finished_at=f"2026-11-2{i}T02:00:00+00:00")
            rec["metrics"]["tokens_per_s_per_gpu"] = tps
            (src / f"{rec['run_id']}.json").write_text(json.dumps(rec))
    result = build_report([src], out=tmp_path / "out")
    best = {(b["model"], int(b["gpus"])): b for b in result["best"].to_dict("records")}
    b = best["125m", 2]
    assert (b["strategy"], b["runner_up"], b["basis"]) == ("ddp", "fsdp2.full_shard", "runs")
    assert b["distinguishable"] is False
    runner = json.loads((src / fsdp2).read_text())["metrics"]["tokens_per_s_per_gpu"]
    p = run_level_p([100000.0, 150000.0, 152000.0], [146000.0, 144000.0, runner])
    assert b["p_value"] == pytest.approx(p, rel=1e-12) and p > 0.05
    assert b["verdict"] == f"not distinguishable, p={p:.2g}, 3 vs 3 runs"
    assert best["125m", 4]["basis"] == "not judged" and best["125m", 4]["verdict"] == "single run: lead not judged"
    md = result["paths"]["markdown"].read_text()
    row = next(r for r in md_rows(md_section(md, "## Best strategy per model and GPU count")) if r[:2] == ["125m", "2"])
    assert b["tokens_per_s_per_gpu"] == 150000.0 and b["runner_up_tokens_per_s_per_gpu"] == statistics.median(
        [146000.0, 144000.0, runner]
    )
    assert row[2] == "ddp ≈ fsdp2.full_shard" and row[4] == "150,000"
    assert row[7].startswith(
        f"≈ {100 * (150000.0 / statistics.median([146000.0, 144000.0, runner]) - 1):.1f}% slower ("
    )
    assert row[8] == "repeated runs"
    model_row = next(r for r in md_rows(md_section(md, "### 125m · 2 GPUs")) if r[:2] == ["ddp", "bf16"])
    assert model_row[2] == "**152,000** ≈"
    html = result["paths"]["html"].read_text()
    assert 'class="num tie" title="fastest, but not distinguishable from fsdp2.full_shard · bf16' in html


def test_smoke_leaders_are_not_crowned(cpu_report):
    """The real smoke sweep: one run of each cell, leads of a few percent: shown, not judged, never crowned."""
    best = cpu_report["best"]
    assert best["basis"].tolist() == ["not judged", "not judged"] and best["distinguishable"].isna().all()
    md = cpu_report["paths"]["markdown"].read_text()
    assert md.count("** ★") == 0 and md.count("** ≈") == 0


# --- 7: scaling figure --------------------------------------------------------------------------------------


def _bottom_half_has(path: Path, hex_colour: str) -> bool:
    rgb = np.array([int(hex_colour[i : i + 2], 16) for i in (1, 3, 5)])
    img = np.round(mpimg.imread(path)[..., :3] * 255).astype(int)
    lower = img[img.shape[0] // 2 + 20 :, : int(img.shape[1] * 0.7)]  # efficiency panels, not the legend
    return bool((np.abs(lower - rgb).sum(axis=-1) <= 3).sum() > 10)


def test_a_series_at_one_gpu_count_gets_no_efficiency(tmp_path):
    src = tmp_path / "records"
    src.mkdir()
    for path in (FIXTURES / "fixture-h100").glob("*-g4-*.json"):  # every series measured at 4 GPUs only
        shutil.copy(path, src)
    result = build_report([src], out=tmp_path / "out")
    scaling = next(f for f in result["figures"] if f.name == "scaling")
    assert "Scaling efficiency not drawn: only one GPU count in the results." in scaling.note
    assert not _bottom_half_has(result["paths"]["figures"]["scaling"], STRATEGY_STYLE["fsdp2.full_shard"][0])
    # with 2 and 4 GPUs the efficiency lines are there
    full = build_report([FIXTURES / "fixture-h100"], out=tmp_path / "full")
    assert _bottom_half_has(full["paths"]["figures"]["scaling"], STRATEGY_STYLE["fsdp2.full_shard"][0])
    assert "efficiency not drawn" not in next(f for f in full["figures"] if f.name == "scaling").note


def test_precision_is_a_marker_fill_too():
    bf16, fp32 = precision_handle("bf16"), precision_handle("fp32")
    assert bf16.get_marker() == fp32.get_marker() == "o"
    assert fp32.get_markerfacecolor() == "white" and bf16.get_markerfacecolor() != "white"


# --- 8: MFU heatmap on CPU ----------------------------------------------------------------------------------


def test_no_mfu_anywhere_shows_tflops_and_says_why_once(cpu_report):
    heat = next(f for f in cpu_report["figures"] if f.name == "mfu_heatmap")
    assert heat.png is not None and "TFLOPS" in heat.title
    assert heat.note.startswith("No cell has an MFU value, so the heatmap shows the achieved TFLOPS per GPU.")
    reason = "no dense peak FLOPS known for device 'cpu'"
    # one line per distinct reason, each said once: bf16 and fp32, and fp32 again in the words of the layout
    # cells' records (written after the peak table moved to harness/scenario/cluster.py; the others name
    # harness/cluster.py)
    assert heat.note.count(reason) == 3 and heat.note.count("harness/scenario/cluster.py PEAKS") == 1
    shown = unescape(re.sub(r' title="[^"]*"', "", cpu_report["paths"]["html"].read_text()))  # hover text aside
    assert shown.count(reason + " (bf16)") == 1
    img = mpimg.imread(cpu_report["paths"]["figures"]["mfu_heatmap"])[..., :3]
    grey = (np.abs(img - np.array([0xE6, 0xE6, 0xE6]) / 255).sum(axis=-1) < 0.02).mean()
    assert grey < 0.02, f"{grey:.1%} of the heatmap is the n/a grey"


def test_fixture_heatmap_keeps_mfu(tmp_path):
    heat = next(f for f in build_report([FIXTURES], out=tmp_path)["figures"] if f.name == "mfu_heatmap")
    assert heat.title == "MFU heatmap" and "n/a (4 cells): peak-FLOPS table has no dense fp32 entry" in heat.note


# --- 2: an output folder that cannot be written -----------------------------------------------------------


def test_output_under_a_file_is_one_line_and_exit_2_before_any_work(tmp_path, capsys, monkeypatch):
    blocker = tmp_path / "afile"
    blocker.write_text("x")
    assert output_problem(blocker / "out") == (
        f"cannot create the output directory: {blocker} is a file, not a directory"
    )
    assert output_problem(blocker) == "output path exists and is not a directory"
    assert output_problem(tmp_path / "new" / "deeper") is None

    def no_work(*args, **kwargs):
        raise AssertionError("records were read before the output was checked")

    monkeypatch.setattr("harness.report.load.read_record", no_work)  # each record file is read by it
    assert main(["report", str(FIXTURES), "-o", str(blocker / "out")]) == 2
    err = capsys.readouterr().err
    assert err.strip().splitlines() == [
        f"error: {blocker / 'out'}: cannot create the output directory: {blocker} is a file, not a directory"
    ]


@pytest.mark.skipif(
    os.geteuid() == 0, reason="root writes into a 0o555 folder; the parent-is-a-file test covers the check"
)
def test_read_only_output_dir_is_exit_2(tmp_path, capsys):
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o555)
    try:
        assert main(["report", str(FIXTURES), "-o", str(ro)]) == 2
        assert "output directory is not writable" in capsys.readouterr().err
    finally:
        ro.chmod(0o755)
