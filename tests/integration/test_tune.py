"""`harness tune` for real (issue 17): real ranks on gloo, one trial that really runs out of memory, a cluster
profile whose device memory the memory model prunes against, and the winner file swept as it is.

The scenario: a tiny model, DDP / FSDP FULL_SHARD / ZeRO-2 at 2 ranks, micro-batch 1, 2 and 4 at a global batch of
8, seq 32. The profile gives 1.00390625 GiB of device memory (4 MiB usable after the 1 GiB reserve) and the
scenario asks 10% headroom: ZeRO-2 (1.86 GiB of DeepSpeed buffers) and DDP at micro-batch 4 (4.76 MiB predicted) do
not fit, DDP at micro-batch 2 (3.65 MiB) fits but not with the headroom. Four candidates are left (DDP mb 1, FSDP
mb 1, 2, 4), FSDP mb 2 dominated by mb 4; FSDP at micro-batch 1 has an OOM injected. No calibration: --no-calibrate,
ranked by counts.
"""

from __future__ import annotations

import dataclasses
import json
import statistics
from pathlib import Path

import pytest
import yaml

from harness.cli import main
from harness.compare.stats import run_level_p
from harness.plan.recommend import slower_words
from harness.report import build_report
from harness.results.store import load_records
from harness.scenario.schema import load_scenario
from harness.scenario.spec import RunSpec
from harness.tune.log import check_tune_log, read_tune_file
from harness.tune.search import COUNTS_SOURCE
from harness.tune.summary import format_tune
from tests.unit.test_report import md_rows, md_section

pytestmark = pytest.mark.dist

SCENARIO = """\
name: tn
models:
  tiny2: {d_model: 64, n_layers: 2, n_heads: 4, ffn: 176, vocab: 512}
matrix:
  model: [tiny2]
  strategy: [ddp, fsdp.full_shard, zero2]
  precision: [fp32]
  gpus: [2]
  micro_batch: [1, 2, 4]
  include:
    - {strategy: fsdp.full_shard, micro_batch: 1, inject: {fault: oom, rank: 0, step: 1}}
settings: {seq_len: 32, warmup_steps: 2, measure_steps: 3, time_limit_s: 120}
tune: {global_batch: 8, memory_headroom: 0.1, first_round: 8, confirm_runs: 3, max_runs: 3}
"""
PROFILE = """\
name: small
description: the local CPU profile with 4 MiB of usable device memory (tests/integration/test_tune.py)
executor: local
device: cpu
gpus_per_node: 2
device_memory_gib: 1.00390625
pg_timeout_s: 60
env: {OMP_NUM_THREADS: "1"}
"""


def _sans_steps(spec: RunSpec) -> RunSpec:
    return dataclasses.replace(spec, settings=dataclasses.replace(spec.settings, measure_steps=1))


def test_tune_prunes_survives_an_oom_confirms_and_writes_a_scenario_that_sweeps(tmp_path, capsys):
    sc_file, prof = tmp_path / "tn.yaml", tmp_path / "small.yaml"
    sc_file.write_text(SCENARIO)
    prof.write_text(PROFILE)
    results = tmp_path / "results"
    args = ["tune", str(sc_file), "--cluster", str(prof), "--results", str(results), "--format", "json"]
    args.append("--no-calibrate")  # NOTE: ranked by counts; the quick calibration: tests/unit/test_tune_uncalibrated.py
    assert main(args) == 0
    out = check_tune_log(json.loads(capsys.readouterr().out))  # stdout is one JSON document: the log
    # ... as tune.json has it, with the winners' file beside
    on_disk = read_tune_file(results / "tn-tune" / "tune.json").to_dict()
    assert {**on_disk, "tuned_file": out.field("tuned_file")} == out.to_dict()
    (g,) = out.groups
    by_label = {c.label: c for c in g.candidates}
    fates = {label: c.fate for label, c in by_label.items()}
    assert fates["zero2 fp32 mb 1 ga 4 ckpt none"] == "pruned_memory"
    assert fates["ddp fp32 mb 4 ga 1 ckpt none"] == "pruned_memory"
    assert "GiB usable" in (by_label["ddp fp32 mb 4 ga 1 ckpt none"].reason or "")
    assert "10% headroom" in (by_label["ddp fp32 mb 2 ga 2 ckpt none"].reason or "")
    assert sum(f == "pruned_memory" for f in fates.values()) == 5
    # FSDP at micro-batch 4 fits and dominates 2 (1 carries the injected fault: another cell, not dominated); when
    # 1 runs out of memory, 2 needs at least its memory and is dropped beside it
    assert fates["fsdp.full_shard fp32 mb 2 ga 2 ckpt none"] == "dropped_oom_neighbour"
    assert out.calibration is not None and out.calibration.path is None
    assert "--no-calibrate" in str(out.calibration.note)
    assert {c.rank_source for c in g.candidates if c.fate != "pruned_memory"} == {COUNTS_SOURCE}

    records, warnings = load_records(results / "tn-tune")
    assert not warnings
    # pruning never launched a cell predicted not to fit: no record's spec is a pruned cell's at any step count
    pruned = {_sans_steps(c.spec) for c in g.candidates if c.fate == "pruned_memory" and c.spec}
    assert not [r.run_id for r in records if _sans_steps(r.spec) in pruned]

    # the injected OOM is a record with its status; the candidate failed and the search went on
    oom = by_label["fsdp.full_shard fp32 mb 1 ga 4 ckpt none"]
    assert oom.fate == "failed" and "oom" in (oom.reason or "")
    (oom_rec,) = [r for r in records if r.run_id == oom.trials[0].run_id]
    assert oom_rec.status == "oom"

    # one record per trial; the winner's value and p are the records' own figures
    assert len(records) == out.trials == sum(len(c.trials) for c in g.candidates)
    by_run = {(r.run_id, r.repeat_index): r for r in records}
    win = next(c for c in g.candidates if c.fate == "winner")
    runner = next(c for c in g.candidates if c.fate == "runner_up")
    assert win.run_id == g.winner and g.verdict in ("ahead", "tied")

    def final_values(c):
        ts = [t for t in c.trials if t.round == c.round]
        assert {t.steps for t in ts} == {3} and len(ts) == 3
        return [by_run[(t.run_id, t.repeat)].metrics.tokens_per_s_per_gpu for t in ts]

    vw, vr = final_values(win), final_values(runner)
    assert win.measured == pytest.approx(statistics.median(vw))
    assert statistics.median(vw) >= statistics.median(vr)
    assert g.p_value == pytest.approx(run_level_p(vw, vr))

    # the report over the search's folder crowns what tune crowned, on the same runs, and says what tune said of the
    # lead (issue 48, item 7: it pooled round 0's 2-step trials with the final round's runs, and ranked last runs)
    assert win.spec is not None and runner.spec is not None and win.spec.strategy != runner.spec.strategy
    report = build_report([results / "tn-tune"], out=tmp_path / "report")
    (b,) = report["best"].to_dict("records")
    assert (b["strategy"], b["precision"]) == (win.spec.strategy, "fp32")
    assert b["tokens_per_s_per_gpu"] == pytest.approx(win.measured, rel=1e-12)
    assert (b["runner_up"], b["runner_up_tokens_per_s_per_gpu"]) == (
        runner.spec.strategy,
        pytest.approx(runner.measured),
    )
    assert b["basis"] == "runs" and b["p_value"] == pytest.approx(g.p_value, rel=1e-12)
    assert b["distinguishable"] is (g.verdict == "ahead") and b["verdict"].endswith(", 3 vs 3 runs")
    # round 0's trials (2 steps) are cells of their own, counted and not compared: DDP mb 1 and FSDP mb 4 ran ok
    assert (b["measure_steps"], b["n_shorter"]) == (3, 2)
    md = report["paths"]["markdown"].read_text()
    (row,) = md_rows(md_section(md, "## Best strategy per model and GPU count"))
    shown = win.spec.strategy if g.verdict == "ahead" else f"{win.spec.strategy} ≈ {runner.spec.strategy}"
    assert row[2] == shown

    # ... in the same words (harness.plan.recommend, which `harness plan` uses too: issue 52): tune's table recommends
    # the winner with the lead the report judged, and says the runner-up is as much slower as the report's row does
    tie = "≈ " if g.verdict == "tied" else ""
    header = md_section(md, "## Best strategy per model and GPU count").splitlines()
    assert "| recommended |" in next(x for x in header if x.startswith("| model |"))
    assert row[8] == f"{tie}{slower_words(b['margin'])} ({b['verdict']})"
    printed = format_tune(out).splitlines()
    (head,) = [x for x in printed if x.startswith("tiny2 on 2 GPUs: ")]
    also = f" ≈ {runner.label}" if g.verdict == "tied" else ""
    assert head.startswith(f"tiny2 on 2 GPUs: recommended {win.label}{also} (the fastest measured; {b['verdict']})")
    assert printed[printed.index(head) + 1] == f"  runner-up {runner.label}: {slower_words(b['margin'])}"

    # the winner file is a valid scenario whose one cell is the winner, and `harness sweep` runs it
    tuned = Path(out.field("tuned_file"))
    assert tuned == results / "tn-tune" / "tuned.yaml"
    (spec,) = load_scenario(tuned).expand(gpus_per_node=2)
    assert spec.run_id == win.run_id and win.spec is not None
    assert yaml.safe_load(tuned.read_text())["matrix"]["include"][0]["grad_accum"] == win.spec.settings.grad_accum
    tie = f" with {runner.label}" if g.verdict == "tied" else ""
    assert f"{win.label} ({g.verdict}{tie}, p = {g.p_value:.3g})" in tuned.read_text()
    assert main(["sweep", str(tuned), "--cluster", str(prof), "--results", str(tmp_path / "swept")]) == 0
    (rec,) = load_records(tmp_path / "swept")[0]
    assert rec.run_id == win.run_id and rec.status == "ok"

    # a re-run replays the search over the records (the failed trial is retried, as a sweep retries a failure)
    before = {p.name for p in (results / "tn-tune").glob("*.json")}
    capsys.readouterr()
    assert main(args) == 0
    again = check_tune_log(json.loads(capsys.readouterr().out))
    after = {p.name for p in (results / "tn-tune").glob("*.json")}
    assert after == before
    assert again.groups[0].winner == g.winner and again.groups[0].p_value == pytest.approx(g.p_value)
