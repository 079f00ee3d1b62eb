"""harness.report: the committed fixture sweep (tests/fixtures/records, see make_fixtures.py there) → report files,
checked by their numbers."""

from __future__ import annotations

import json
import math
import re
import shutil
from pathlib import Path

import matplotlib.image as mpimg
import numpy as np
import pandas as pd
import pytest

from harness.cli import main
from harness.report import build_report
from harness.report.figures import STRATEGY_STYLE
from harness.scenario.spec import STRATEGIES

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "records"
FIGURES = ("scaling", "mfu_heatmap", "memory", "comm", "step_time")
"""the figures the fixture's records draw; the time model's two (no fixture record has a predicted step time: see
test_report_prediction.py) follow them, not drawn"""
PREDICTION_FIGURES = ("prediction", "time_breakdown")
CHECKPOINT_FIGURES = ("checkpoint",)
"""the checkpoint phase's figure (issue 34): no fixture record has metrics.checkpoint, so it is last, not drawn"""
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    return build_report([FIXTURES], out=tmp_path_factory.mktemp("report"))


@pytest.fixture(scope="module")
def table(report) -> pd.DataFrame:
    return pd.read_csv(report["paths"]["csv"])


@pytest.fixture(scope="module")
def md(report) -> str:
    return report["paths"]["markdown"].read_text()


def cell(df: pd.DataFrame, model: str, strategy: str, precision: str, gpus: int) -> pd.DataFrame:
    return df[
        (df["model"] == model) & (df["strategy"] == strategy) & (df["precision"] == precision) & (df["gpus"] == gpus)
    ]


def md_section(md: str, heading: str) -> str:
    start = md.index(heading)
    nxt = md.find("\n## ", start + len(heading))
    return md[start : nxt if nxt >= 0 else len(md)]


def md_rows(section: str) -> list[list[str]]:
    """Table body rows of a Markdown section, cells split on unescaped pipes."""
    rows = []
    for line in section.splitlines():
        if line.startswith("|") and not line.startswith("|---"):
            rows.append([c.strip().replace("\\|", "|") for c in re.split(r"(?<!\\)\|", line.strip())[1:-1]])
    return rows[1::] if rows else rows


def test_every_readable_record_is_a_row_of_table_csv(table):
    # 24 records of the sweep + 1 older run in earlier/; the 3 broken files are not rows
    assert len(table) == 25
    assert sorted(table["status"].value_counts().items()) == [("error", 1), ("ok", 22), ("oom", 1), ("skipped", 1)]
    assert table["in_tables"].sum() == 24


def test_table_csv_has_the_records_numbers(table):
    row = cell(table, "1.3b", "fsdp2.full_shard", "bf16", 4)
    assert len(row) == 1
    row = row.iloc[0]
    assert row["tokens_per_s_per_gpu"] == 44300.0
    assert row["tokens_per_s"] == 177200.0
    assert row["mfu"] == pytest.approx(0.3979)
    assert row["step_time_median_s"] == pytest.approx(0.370025)
    assert row["step_time_p90_s"] == pytest.approx(0.37535)
    assert row["peak_memory_allocated_gib"] == 29.5
    assert row["predicted_memory_gib"] == 28.32
    assert row["device_memory_gib"] == 79.1
    assert row["gpus"] == 4 and row["n_params"] == 1345423360
    fsdp = cell(table, "125m", "fsdp.full_shard", "bf16", 2).iloc[0]
    assert fsdp["comm_bytes_per_step"] == 402317576
    assert fsdp["comm_bytes.all_gather"] == 268211712
    assert fsdp["comm_bytes.reduce_scatter"] == 134105856
    assert fsdp["comm_bytes.all_reduce"] == 8


def test_nulls_stay_null_never_zero(table, md):
    fp32 = cell(table, "125m", "ddp", "fp32", 2).iloc[0]
    assert math.isnan(fp32["mfu"]) and "no dense fp32 entry" in fp32["mfu_null_reason"]
    zero2 = cell(table, "125m", "zero2", "bf16", 4).iloc[0]  # no comm and no predicted section
    assert math.isnan(zero2["comm_bytes_per_step"]) and math.isnan(zero2["predicted_memory_gib"])
    oom = cell(table, "1.3b", "ddp", "bf16", 2).iloc[0]
    assert math.isnan(oom["tokens_per_s_per_gpu"]) and oom["predicted_memory_gib"] == 82.4
    rows = md_rows(md_section(md, "### 125m · 4 GPUs"))
    zero2_md = next(r for r in rows if r[:2] == ["zero2", "bf16"])
    # tok/s/GPU, MFU, p50, p90, alloc, reserved, predicted, capacity, comm, status
    assert zero2_md[2:] == ["133,600", "11.9%", "123", "124", "8.10", "9.50", "n/a", "79.1", "n/a", "ok"]
    ddp_fp32 = next(r for r in rows if r[:2] == ["ddp", "fp32"])
    assert ddp_fp32[3] == "n/a"  # MFU
    error = next(r for r in rows if r[:2] == ["zero3", "bf16"])
    assert error[2:] == ["n/a"] * 7 + ["79.1", "n/a", "**error**"]


def test_the_newest_record_of_a_cell_is_shown(report, table, md):
    both = cell(table, "125m", "zero2", "bf16", 2)
    assert sorted(both["tokens_per_s_per_gpu"]) == [120000.0, 139000.0]
    assert both.loc[both["in_tables"], "tokens_per_s_per_gpu"].tolist() == [139000.0]
    rows = md_rows(md_section(md, "### 125m · 2 GPUs"))
    assert next(r for r in rows if r[:2] == ["zero2", "bf16"])[2] == "139,000"
    assert any("1 older record(s) of 1 cell(s) set aside" in w for w in report["warnings"])


def test_best_strategy_per_model_and_gpu_count(report, md):
    best = {(b["model"], int(b["gpus"])): b for b in report["best"].to_dict("records")}
    assert set(best) == {("125m", 2), ("125m", 4), ("1.3b", 2), ("1.3b", 4)}
    assert (best["125m", 2]["strategy"], best["125m", 2]["tokens_per_s_per_gpu"]) == ("ddp", 152000.0)
    # 4 GPUs: zero3 errored; ddp still leads fsdp2.full_shard by 148500/143800 - 1
    b = best["125m", 4]
    assert (b["strategy"], b["precision"], b["runner_up"]) == ("ddp", "bf16", "fsdp2.full_shard")
    assert b["margin"] == pytest.approx(148500 / 143800 - 1)
    assert (b["n_ok"], b["n_cells"]) == (6, 7)
    # 1.3b: ddp did not run (oom / skipped), so the best is among the sharded strategies
    assert best["1.3b", 2]["strategy"] == "fsdp2.full_shard" and best["1.3b", 2]["tokens_per_s_per_gpu"] == 45200.0
    assert best["1.3b", 4]["strategy"] == "fsdp2.full_shard" and best["1.3b", 4]["tokens_per_s_per_gpu"] == 44300.0
    rows = md_rows(md_section(md, "## Best strategy per model and GPU count"))
    # the lead is shown with what it was judged on: one run each, so not judged
    assert [
        "1.3b",
        "4",
        "fsdp2.full_shard",
        "bf16",
        "44,300",
        "39.8%",
        "fsdp.full_shard · bf16",
        "3.5% slower (single run: lead not judged)",
        "not judged",
        "4 of 5",
    ] in rows
    # one run of each cell and no history: every lead is shown, none judged, none crowned
    assert report["best"]["basis"].tolist() == ["not judged"] * 4
    assert report["best"]["distinguishable"].isna().all() and report["best"]["p_value"].isna().all()
    assert len(rows) == 4
    # the fastest cell is not marked in its model table (neither bold nor ★)
    assert next(r for r in md_rows(md_section(md, "### 1.3b · 4 GPUs")) if r[0] == "fsdp2.full_shard")[2] == "44,300"
    assert md.count("** ★") == 0 and md.count("** ≈") == 0


def test_warnings_name_each_file_that_is_not_a_record(report):
    warnings = "\n".join(report["warnings"])
    assert re.search(r"broken-truncated\.json: not valid JSON", warnings)
    assert re.search(r"future-schema\.json: unknown schema_version 2", warnings)
    assert re.search(r"partial-missing-spec\.json: missing keys: spec", warnings)
    assert len(report["warnings"]) == 4


def test_failed_and_skipped_cells_are_listed_with_reasons(md):
    section = md_section(md, "## Failed and skipped cells")
    assert section.startswith("## Failed and skipped cells (3)")
    rows = {(r[0], r[1], r[4]): r for r in md_rows(section)}
    assert set(rows) == {("125m", "zero3", "4"), ("1.3b", "ddp", "2"), ("1.3b", "ddp", "4")}
    error, oom, skipped = rows["125m", "zero3", "4"], rows["1.3b", "ddp", "2"], rows["1.3b", "ddp", "4"]
    assert (error[5], error[6]) == ("error", "3")
    # multi-line reason on one line, its '|' escaped so the table keeps its columns
    assert error[7].startswith("RuntimeError: NCCL communicator was aborted on rank 3 | watchdog timeout")
    assert "Traceback (most recent call last):" in error[7] and len(error) == 9
    assert (oom[5], oom[6]) == ("oom", "0") and "CUDA out of memory" in oom[7]
    assert skipped[5:8] == [
        "skipped",
        "n/a",
        "predicted peak memory 82.4 GiB per GPU exceeds device capacity 79.1 GiB (ddp does not shard)",
    ]


def test_every_figure_is_a_png_file_and_inline_in_the_html(report):
    assert [f.name for f in report["figures"]] == [*FIGURES, *PREDICTION_FIGURES, *CHECKPOINT_FIGURES]
    for f in report["figures"][len(FIGURES) : len(FIGURES) + len(PREDICTION_FIGURES)]:
        assert (
            f.png is None
            and f.note == "No data: no cell that ran ok has a predicted step time (predicted.step_time_s)."
        )
    (ckpt,) = report["figures"][len(FIGURES) + len(PREDICTION_FIGURES) :]
    assert ckpt.png is None and ckpt.note == ("No data: no record has metrics.checkpoint (run with checkpoint: true).")
    html = report["paths"]["html"].read_text()
    for name in FIGURES:
        path = report["out"] / f"{name}.png"
        data = path.read_bytes()
        assert data[:8] == PNG_MAGIC and len(data) > 20_000
        img = mpimg.imread(path)
        assert img.shape[0] > 300 and img.shape[1] > 600
        assert report["paths"]["figures"][name] == path
    imgs = re.findall(r'<img alt="[^"]*" src="data:image/png;base64,([A-Za-z0-9+/=]+)"', html)
    assert len(imgs) == len(FIGURES)


def _has_colour(path: Path, hex_colour: str) -> bool:
    """At least 30 pixels of the colour (±3 per channel): the fixture's smallest box, fsdp2's in step_time, has 49
    under matplotlib 3.10 and 86 under 3.11 (the two draw a box's anti-aliased edge differently); no other strategy's
    colour is within 3 of it."""
    rgb = np.array([int(hex_colour[i : i + 2], 16) for i in (1, 3, 5)])
    img = np.round(mpimg.imread(path)[..., :3] * 255).astype(int)
    return bool((np.abs(img - rgb).sum(axis=-1) <= 3).sum() >= 30)


def test_one_colour_per_strategy_in_every_figure(report):
    colours = [STRATEGY_STYLE[s][0] for s in STRATEGIES]
    markers = [STRATEGY_STYLE[s][1] for s in STRATEGIES]
    assert len(set(colours)) == len(STRATEGIES) and len(set(markers)) == len(STRATEGIES)
    fsdp2 = STRATEGY_STYLE["fsdp2.full_shard"][0]
    for name in ("scaling", "memory", "comm", "step_time"):
        assert _has_colour(report["out"] / f"{name}.png", fsdp2), name
    # fsdp.shard_grad_op is not in the fixture: its colour appears nowhere
    assert not _has_colour(report["out"] / "memory.png", STRATEGY_STYLE["fsdp.shard_grad_op"][0])


def test_mfu_null_reason_is_noted(report):
    heatmap = next(f for f in report["figures"] if f.name == "mfu_heatmap")
    assert "n/a (4 cells): peak-FLOPS table has no dense fp32 entry" in heatmap.note
    comm = next(f for f in report["figures"] if f.name == "comm")
    assert comm.note.startswith("4 cell(s) that ran ok have no comm section")  # the zero2 cells


def test_html_is_self_contained(report):
    html = report["paths"]["html"].read_text()
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:)?//""", html)
    assert "<link" not in html and not re.search(r"<script[^>]+src=", html)
    assert "@import" not in html and "url(" not in html
    assert 'data-figures="5"' in html
    assert "Failed and skipped cells (3)" in html and "broken-truncated.json" in html
    # the model tables' headers may wrap after a slash (the tables fit 1400 px: test_report_chromium.py)
    assert '<th class="m">tok/<wbr>s/<wbr>GPU</th><th class="m">MFU</th>' in html


def test_parquet_has_the_same_rows_and_the_step_samples(report, table):
    pq = pd.read_parquet(report["paths"]["parquet"])
    assert len(pq) == len(table)
    row = cell(pq, "1.3b", "fsdp2.full_shard", "bf16", 4).iloc[0]
    assert row["tokens_per_s_per_gpu"] == 44300.0
    assert len(row["step_time_samples_s"]) == 10
    assert float(np.median(row["step_time_samples_s"])) == pytest.approx(0.370025)
    assert pd.isna(cell(pq, "125m", "ddp", "fp32", 2).iloc[0]["mfu"])


def test_cli_writes_the_report_and_prints_paths_and_warnings(tmp_path, capsys):
    out = tmp_path / "out"
    assert main(["report", str(FIXTURES), "-o", str(out)]) == 0
    captured = capsys.readouterr()
    printed = captured.out.split()
    for name in ("index.html", "report.md", "table.csv", "table.parquet", *(f"{f}.png" for f in FIGURES)):
        assert str(out / name) in printed
    assert "warning:" in captured.err and "future-schema.json" in captured.err


def test_cli_bad_input_is_exit_2_and_so_is_no_records(tmp_path, capsys):
    assert main(["report", str(tmp_path / "missing"), str(tmp_path / "also-missing")]) == 2
    err = capsys.readouterr().err
    assert "missing: no such file or directory" in err and "also-missing: no such file or directory" in err
    assert main(["report"]) == 2  # DIRS is required
    only_broken = tmp_path / "broken"
    only_broken.mkdir()
    shutil.copy(FIXTURES / "fixture-h100" / "broken-truncated.json", only_broken)
    assert main(["report", str(only_broken), "-o", str(tmp_path / "r")]) == 2  # nothing to report on (issue 48)
    err = capsys.readouterr().err
    assert "broken-truncated.json" in err and f"error: {only_broken}: no readable records" in err
    assert not (tmp_path / "r").exists()
    a_file = tmp_path / "file"
    a_file.write_text("x")
    assert main(["report", str(FIXTURES), "-o", str(a_file)]) == 2


def test_default_out_is_reports_sweep_name_or_report(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    result = build_report([FIXTURES / "fixture-h100"])
    assert result["out"] == Path("reports") / "fixture-h100" and (tmp_path / "reports/fixture-h100/index.html").exists()
    other = tmp_path / "other"
    other.mkdir()
    rec = json.loads((FIXTURES / "earlier" / "125m-zero2-bf16-g2-ddf42619a1.json").read_text())
    rec["sweep"] = "another-sweep"
    (other / "r.json").write_text(json.dumps(rec))
    assert build_report([FIXTURES / "fixture-h100", other])["out"] == Path("reports") / "report"


def _strip(rec: dict) -> dict:
    rec.pop("comm", None)
    rec.pop("predicted", None)
    rec.get("metrics", {}).pop("step_time_s", None)
    if rec.get("metrics"):
        rec["metrics"]["mfu"] = None
        rec["metrics"]["null_reasons"] = {"mfu": "no dense peak FLOPS known for device 'cpu' (bf16)"}
        rec["metrics"]["peak_memory_allocated_gib"] = None
        rec["metrics"]["peak_memory_reserved_gib"] = None
    return rec


def test_missing_sections_do_not_crash_and_say_no_data(tmp_path):
    src = tmp_path / "records"
    src.mkdir()
    for path in (FIXTURES / "fixture-h100").glob("1*.json"):
        (src / path.name).write_text(json.dumps(_strip(json.loads(path.read_text()))))
    result = build_report([src], out=tmp_path / "out")
    figs = {f.name: f for f in result["figures"]}
    for name, why in (("comm", "no record has a comm section"), ("step_time", "no record has step-time samples")):
        assert figs[name].png is None and figs[name].note == f"No data: {why}."
        assert not (tmp_path / "out" / f"{name}.png").exists()
    # a device capacity alone (env) is not a measurement: with no measured or predicted memory, nothing to draw
    assert figs["memory"].png is None
    assert figs["mfu_heatmap"].png is not None and figs["mfu_heatmap"].note.startswith("No cell has an MFU value")
    assert "no dense peak FLOPS known for device 'cpu' (bf16)" in figs["mfu_heatmap"].note
    md = result["paths"]["markdown"].read_text()
    assert "- **Collective bytes per step**: not drawn. No data: no record has a comm section." in md
    html = result["paths"]["html"].read_text()
    assert html.count("<img ") == 2 and 'data-figures="2"' in html
    rows = md_rows(md_section(md, "### 1.3b · 2 GPUs"))
    # one run of each: the lead is not judged, so neither ★ nor ≈
    assert next(r for r in rows if r[0] == "fsdp2.full_shard")[2:4] == ["45,200", "n/a"]


def test_configurations_that_vary_become_row_labels(tmp_path):
    src = tmp_path / "records"
    src.mkdir()
    for mb, tps in ((8, 45200.0), (16, 47000.0)):
        rec = json.loads(next((FIXTURES / "fixture-h100").glob("1.3b-fsdp2.full_shard-bf16-g2-*.json")).read_text())
        rec["spec"]["micro_batch"] = mb
        rec["run_id"] += f"-mb{mb}"
        rec["metrics"]["tokens_per_s_per_gpu"] = tps
        (src / f"{rec['run_id']}.json").write_text(json.dumps(rec))
    result = build_report([src], out=tmp_path / "out")
    assert sorted(result["cells"]["variant"]) == ["mb=16", "mb=8"]
    assert not any("set aside" in w for w in result["warnings"])  # two configurations, not a rerun
    b = result["best"].iloc[0]
    assert (b["variant"], b["tokens_per_s_per_gpu"]) == ("mb=16", 47000.0)
    rows = md_rows(md_section(result["paths"]["markdown"].read_text(), "### 1.3b · 2 GPUs"))
    assert [r[:4] for r in rows] == [
        ["fsdp2.full_shard", "bf16", "mb=8", "45,200"],
        ["fsdp2.full_shard", "bf16", "mb=16", "**47,000** ★"],
    ]


def test_wrong_typed_fields_are_warnings_not_crashes(tmp_path):
    src = tmp_path / "records"
    src.mkdir()
    rec = json.loads(next((FIXTURES / "fixture-h100").glob("125m-ddp-bf16-g2-*.json")).read_text())
    rec["metrics"]["tokens_per_s_per_gpu"] = "fast"
    rec["comm"] = "n/a"
    (src / "r.json").write_text(json.dumps(rec))
    result = build_report([src], out=tmp_path / "out")
    assert any("metrics.tokens_per_s_per_gpu is 'fast', not a number" in w for w in result["warnings"])
    assert math.isnan(result["frame"]["tokens_per_s_per_gpu"].iloc[0])
    assert result["best"].iloc[0]["strategy"] is None or pd.isna(result["best"].iloc[0]["strategy"])


def test_figures_drawn_in_parallel_processes_are_the_same_pngs(report):
    from harness.report.figures import all_figures
    from harness.report.frame import figure_cells

    parallel = all_figures(figure_cells(report["cells"]), workers=2)
    assert [f.name for f in parallel] == [*FIGURES, *PREDICTION_FIGURES, *CHECKPOINT_FIGURES]
    assert [f.png for f in parallel] == [f.png for f in report["figures"]]
    assert [f.note for f in parallel] == [f.note for f in report["figures"]]


def test_ok_cells_with_a_note_are_listed_under_notes(tmp_path):
    """An ok record's `reason` is a caveat on its numbers (a recompilation timed as step time): the report must
    show it, and only when there is one."""
    src = tmp_path / "records"
    src.mkdir()
    note = (
        "torch.compile compiled 3 frame(s) during the measured steps (recompilation): those steps' times "
        "include compile time; raise warmup_steps or look for the changing guard with TORCH_LOGS=recompiles"
    )
    for path in (FIXTURES / "fixture-h100").glob("1.3b-*.json"):
        rec = json.loads(path.read_text())
        if rec["status"] == "ok" and rec["spec"]["strategy"] == "fsdp2.full_shard":
            rec["reason"] = note
        (src / path.name).write_text(json.dumps(rec))
    result = build_report([src], out=tmp_path / "out")
    rows = md_rows(md_section(result["paths"]["markdown"].read_text(), "## Notes on ok cells"))
    assert sorted(r[:5] + [r[5]] for r in rows) == [
        ["1.3b", "fsdp2.full_shard", "bf16", "—", g, note] for g in ("2", "4")
    ]
    html = result["paths"]["html"].read_text()
    assert 'id="notes">Notes on ok cells (2)</h2>' in html and "TORCH_LOGS=recompiles" in html


def test_no_notes_section_without_notes(md, report):
    assert "## Notes on ok cells" not in md and 'id="notes"' not in report["paths"]["html"].read_text()


def test_record_text_is_escaped_once_on_each_page(tmp_path):
    """Record text with markup in it — the sweep's name (in the summary) and a failure reason — shows as
    written: escaped once for HTML (quotes too, in text and in attributes) and once for Markdown, its line breaks
    kept in the HTML and turned into spaces in the Markdown."""
    src = tmp_path / "records"
    src.mkdir()
    reason = "a <b> & \"c\" 'd' | e\nf\\g"
    for path in (FIXTURES / "fixture-h100").glob("*.json"):
        try:
            rec = json.loads(path.read_text())
        except ValueError:
            continue
        rec["sweep"] = "fix|<a&b>"
        if rec.get("run_id") and rec["status"] == "error":
            rec["reason"] = reason
        (src / path.name).write_text(json.dumps(rec))
    result = build_report([src], out=tmp_path / "out")
    md, html = result["paths"]["markdown"].read_text(), result["paths"]["html"].read_text()
    assert result["name"] == "fix_a_b"  # the sweep's name made safe as a folder name: the pages' title
    assert "\n- **sweeps**: fix\\|&lt;a&amp;b>\n" in md
    assert "<dt>sweeps</dt><dd>fix|&lt;a&amp;b&gt;</dd>" in html
    failed = md_rows(md_section(md, "## Failed and skipped cells"))
    error = next(r for r in failed if r[5] == "error")
    assert error[7] == "a &lt;b> &amp; \"c\" 'd' | e f\\\\g"  # md_rows unescapes the pipe only
    assert '<td class="reason">a &lt;b&gt; &amp; &quot;c&quot; &#x27;d&#x27; | e\nf\\g</td>' in html
    tip = 'title="a &lt;b&gt; &amp; &quot;c&quot; &#x27;d&#x27; | e\nf\\g">error</td>'  # the status's hover text
    assert f'<td class="bad" {tip}' in html
