"""The report's search view (`harness tune`'s RESULTS/<sweep>/tune.json, version 1, read as harness.tune.log.TuneLog):
a synthetic log beside the fixture sweep's records → the funnel, the ranked candidates, the figure and the warnings,
checked by their numbers."""

from __future__ import annotations

import copy
import json
import re
import shutil
from pathlib import Path
from typing import Any

import pytest

from harness.core.zoo import ZOO
from harness.report import build_report
from harness.report.tune import tune_figure, tune_figure_names
from harness.results.spec import spec_to_json
from harness.scenario.spec import RunSpec, Settings
from harness.tune.log import FATES, TuneLog, check_tune_log, read_tune_logs
from harness.tune.summary import Funnel, funnel, ranked_candidates
from tests.unit.test_report import PNG_MAGIC, _has_colour, md_rows, md_section

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "records" / "fixture-h100"
SWEEP = "tune-bench-tune"
WINNER_COLOUR = "#F0E442"
"""harness.report.tune's winner star (written out: the test must not follow a change of it silently)"""


def trial(rnd: int, value: float | None, *, repeat: int = 1, steps: int = 2) -> dict[str, Any]:
    return {
        "round": rnd,
        "run_id": f"t-{rnd}-{repeat}",
        "repeat": repeat,
        "steps": steps,
        "status": "ok" if value is not None else "error",
        "value": value,
    }


def candidate(
    n: int,
    fate: str,
    *,
    predicted: float | None,
    rank: int | None,
    trials: list[dict[str, Any]] | None = None,
    strategy: str = "ddp",
    reason: str = "",
) -> dict[str, Any]:
    """Candidate n (label `<strategy> mb <n>`) with a predicted throughput; `round` and `measured` follow from its
    trials as harness tune computes them (highest round with an ok trial, the median of its ok values there)."""
    trials = trials or []
    ok = [t for t in trials if t["status"] == "ok"]
    rnd = max((t["round"] for t in ok), default=-1)
    vals = sorted(t["value"] for t in ok if t["round"] == rnd)
    return {
        "run_id": f"c{n}-{strategy}-abc{n:07d}",
        "label": f"{strategy} mb {n}",
        "spec": spec_to_json(
            RunSpec("125m", ZOO["125m"], strategy, "bf16", gpus=2, nodes=1, gpus_per_node=2, settings=Settings(n))
        ),
        "predicted_step_time_s": None if predicted is None else 8 * 2048 / predicted,
        "predicted_tokens_per_s_per_gpu": predicted,
        "predicted_memory_gib": 10.0 + n,
        "rank_source": "prediction" if rank is not None else "none",
        "predicted_rank": rank,
        "fate": fate,
        "reason": reason,
        "round": rnd,
        "measured": vals[len(vals) // 2] if vals else None,
        "trials": trials,
    }


def tune_log() -> dict[str, Any]:
    """Group 125m · 2 GPUs: 11 candidates — 2 unsupported, 1 pruned by memory, 2 pruned by prediction, 1 left
    unmeasured; 5 measured in round 0 (one fails), 3 in round 1, 2 in round 2 (the confirmation), where c3 (ranked
    3rd by prediction) beats c1 with p = 0.012. Group 1.3b · 4 GPUs: both measured candidates fail: no winner."""
    g1 = [
        candidate(
            1,
            "runner_up",
            predicted=150_000,
            rank=1,
            trials=[trial(0, 140_000), trial(1, 141_000)]
            + [trial(2, v, repeat=k, steps=5) for k, v in enumerate((139_000, 140_500, 139_500), 1)],
        ),
        candidate(
            2,
            "eliminated",
            predicted=148_000,
            rank=2,
            strategy="fsdp2.full_shard",
            trials=[trial(0, 120_000), trial(1, 119_000)],
            reason="round 1: 3rd of 3 (kept 2)",
        ),
        candidate(
            3,
            "winner",
            predicted=145_000,
            rank=3,
            strategy="zero2",
            trials=[trial(0, 146_000), trial(1, 147_000)]
            + [trial(2, v, repeat=k, steps=5) for k, v in enumerate((148_000, 147_500, 149_000), 1)],
        ),
        candidate(
            4, "eliminated", predicted=140_000, rank=4, trials=[trial(0, 90_000)], reason="round 0: 4th of 4 (kept 3)"
        ),
        candidate(5, "failed", predicted=139_000, rank=5, trials=[trial(0, None)], reason="oom in round 0"),
        candidate(6, "pruned_prediction", predicted=100_000, rank=6, reason="ranked 6th, first round takes 5"),
        candidate(7, "pruned_prediction", predicted=90_000, rank=7, reason="ranked 7th, first round takes 5"),
        candidate(8, "unmeasured", predicted=95_000, rank=8, reason="budget"),
        candidate(9, "pruned_memory", predicted=None, rank=None, reason="predicted 90 GiB > 79 GiB usable"),
        candidate(10, "unsupported", predicted=None, rank=None, reason="zero3 does not support fp16 offload"),
        candidate(11, "unsupported", predicted=None, rank=None, reason="no tp for this model"),
    ]
    g2 = [
        candidate(1, "failed", predicted=20_000, rank=1, trials=[trial(0, None)], reason="oom"),
        candidate(2, "failed", predicted=19_000, rank=2, trials=[trial(0, None)], reason="error"),
    ]
    return {
        "tune_version": 1,
        "scenario": "tune-bench",
        "sweep": SWEEP,
        "cluster": "local",
        "objective": "throughput",
        "metric": "tokens_per_s_per_gpu",
        "better": "higher",
        "seed": 0,
        "budget": {"cells": None, "minutes": 30},
        "trials": 17,
        "measured_s": 160.2,
        "finished": True,
        "stopped": None,
        "groups": [
            {
                "model": "125m",
                "gpus": 2,
                "verdict": "ahead",
                "p_value": 0.012,
                "winner": g1[2]["run_id"],
                "runner_up": g1[0]["run_id"],
                "steps": [2, 2, 5],
                "candidates": g1,
            },
            {
                "model": "1.3b",
                "gpus": 4,
                "verdict": "no winner",
                "p_value": None,
                "winner": None,
                "runner_up": None,
                "steps": [2],
                "candidates": g2,
            },
        ],
    }


def typed(doc: dict[str, Any]) -> TuneLog:
    """The log document as harness tune's readers get it."""
    return check_tune_log(doc)


def results_with(tmp_path: Path, log: dict[str, Any] | str | None) -> Path:
    """RESULTS/ with the fixture sweep's records in RESULTS/<SWEEP>/ and `log` (a dict as JSON, a str as it is)
    as its tune.json."""
    results = tmp_path / "results"
    shutil.copytree(FIXTURES, results / SWEEP)
    if log is not None:
        (results / SWEEP / "tune.json").write_text(log if isinstance(log, str) else json.dumps(log))
    return results


def warnings_of(result: dict[str, Any]) -> list[str]:
    """The report's warnings with its temporary folder left out of the paths, so two reports compare."""
    return [w.replace(str(result["out"].parent), "") for w in result["warnings"]]


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("tune")
    return build_report([results_with(tmp, tune_log())], out=tmp / "report")


@pytest.fixture(scope="module")
def plain(tmp_path_factory):
    """The same records without a tune log."""
    tmp = tmp_path_factory.mktemp("plain")
    return build_report([results_with(tmp, None)], out=tmp / "report")


@pytest.fixture(scope="module")
def md(report) -> str:
    return report["paths"]["markdown"].read_text()


def test_the_log_is_found_and_is_not_read_as_a_record(report, plain, tmp_path):
    assert len(report["frame"]) == len(plain["frame"]) == 24
    assert warnings_of(report) == warnings_of(plain)  # no "unknown schema_version" line for tune.json
    logs = read_tune_logs([results_with(tmp_path, tune_log())])
    assert [(log.sweep, Path(log.path or "").parent.name) for log in logs] == [(SWEEP, SWEEP)]
    hidden = tmp_path / "results" / ".trash"
    hidden.mkdir()
    (hidden / "tune.json").write_text(json.dumps(tune_log()))
    assert len(read_tune_logs([tmp_path / "results"])) == 1  # a hidden folder's log is not read


def test_funnel_counts_are_the_logs():
    first, second = funnel(typed(tune_log()))
    assert first == Funnel(
        model="125m",
        gpus=2,
        candidates=11,
        unsupported=2,
        pruned_memory=1,
        pruned_prediction=2,
        dominated=0,
        not_reached=0,
        dropped_oom_neighbour=0,
        measured_per_round=(5, 3, 2),
        failed=1,
        unmeasured=1,
        winner="zero2 mb 3",
        runner_up="ddp mb 1",
        verdict="ahead",
        p_value=0.012,
        steps=(2, 2, 5),
    )
    assert (second.candidates, second.failed, second.measured_per_round) == (2, 2, (2,))
    assert (second.winner, second.runner_up, second.verdict, second.p_value) == (None, None, "no winner", None)


def test_funnel_table_in_the_markdown(md):
    section = md_section(md, f"## Search (harness tune): {SWEEP}")
    rows = md_rows(section.split("\n### ")[0])
    assert rows == [
        ["125m", "2", "11", "2", "1", "0", "2", "0", "5 → 3 → 2", "1", "1", "zero2 mb 3", "ahead", "0.012"],
        ["1.3b", "4", "2", "0", "0", "0", "0", "0", "2", "2", "0", "—", "no winner", "—"],
    ]
    assert "17 trial runs, 160 s measuring; finished; budget 30 minutes" in section


def test_the_winner_row_is_first_then_by_round_and_measurement(md):
    order = [c.label for c in ranked_candidates(typed(tune_log()).groups[0], better="higher")]
    assert order == ["zero2 mb 3", "ddp mb 1", "fsdp2.full_shard mb 2", "ddp mb 4", "ddp mb 5"]
    section = md_section(md, "### 125m · 2 GPUs: ahead of the runner-up (p = 0.012); 5 of 11 cells measured")
    rows = md_rows(section.split("\n### ")[0].split("\n| left out")[0])
    # #, candidate, predicted rank, predicted, measured, vs predicted, round, runs ok, fate, reason
    assert rows[0] == ["1", "zero2 mb 3", "3", "145,000", "148,000", "+2.1%", "2", "5 of 5", "winner", ""]
    assert rows[1][1:5] == ["ddp mb 1", "1", "150,000", "139,500"] and rows[1][8] == "runner-up"
    assert rows[-1] == ["5", "ddp mb 5", "5", "139,000", "n/a", "n/a", "—", "0 of 1", "failed", "oom in round 0"]
    assert len(rows) == 5  # the pruned, unsupported and unmeasured were never run
    # ... and are listed below it, each with why it was left out
    left = md_rows("| left out" + section.split("\n### ")[0].split("\n| left out")[1])
    assert [(r[0], r[1], r[4]) for r in left] == [
        ("ddp mb 6", "ranked below", "ranked 6th, first round takes 5"),
        ("ddp mb 7", "ranked below", "ranked 7th, first round takes 5"),
        ("ddp mb 8", "not reached", "budget"),
        ("ddp mb 10", "unsupported", "zero3 does not support fp16 offload"),
        ("ddp mb 11", "unsupported", "no tp for this model"),
        ("ddp mb 9", "predicted not to fit", "predicted 90 GiB > 79 GiB usable"),
    ]
    # the fate and the round come before the value: a runner-up measured faster (a tie the confirmation settled
    # on its runs) stays second, and one eliminated in round 0 stays below one that reached round 1
    log = tune_log()
    by_label = {c["label"]: c for c in log["groups"][0]["candidates"]}
    by_label["ddp mb 1"]["measured"], by_label["ddp mb 4"]["measured"] = 150_000, 125_000
    order = [c.label for c in ranked_candidates(typed(log).groups[0], better="higher")]
    assert order == ["zero2 mb 3", "ddp mb 1", "fsdp2.full_shard mb 2", "ddp mb 4", "ddp mb 5"]


def test_step_time_ranks_the_lowest_first():
    log = tune_log()
    group = log["groups"][0]
    for c in group["candidates"]:
        c["fate"] = {"winner": "eliminated", "runner_up": "eliminated"}.get(c["fate"], c["fate"])
        if c["measured"] is not None:
            c["measured"] = 8 * 2048 / c["measured"]  # seconds per step: the fastest has the lowest
    labels = [c.label for c in ranked_candidates(typed(log).groups[0], better="lower")]
    assert labels == ["zero2 mb 3", "ddp mb 1", "fsdp2.full_shard mb 2", "ddp mb 4", "ddp mb 5"]
    labels = [c.label for c in ranked_candidates(typed(log).groups[0], better="higher")]
    assert labels[:2] == ["ddp mb 1", "zero2 mb 3"]  # same round: the slower step time is "higher"


def test_the_figure_is_in_the_search_section_once(report, md):
    (fig,) = [f for f in report["figures"] if f.name == "tune"]
    assert fig.png is not None and fig.png.startswith(PNG_MAGIC)
    assert (report["out"] / "tune.png").read_bytes() == fig.png
    section = md_section(md, f"## Search (harness tune): {SWEEP}")
    assert "](tune.png)" in section
    assert "tune.png" not in md_section(md, "## Figures")
    html = report["paths"]["html"].read_text()
    n_drawn = int(re.search(r'<body data-figures="(\d+)"', html).group(1))
    assert n_drawn == sum(f.png is not None for f in report["figures"]) == html.count("<img ")
    search = html.index('<h2 id="search-1">')
    assert search < html.index('id="fig-tune"') < html.index('<h2 id="figures">')
    assert html.index('<h2 id="best">') < search < html.index('<h2 id="model-')


def test_the_figure_is_deterministic_and_stars_only_a_winner(tmp_path):
    log = tune_log()
    one, two = tune_figure(typed(log)), tune_figure(typed(copy.deepcopy(log)))
    assert one.png == two.png
    (tmp_path / "both.png").write_bytes(one.png)
    assert _has_colour(tmp_path / "both.png", WINNER_COLOUR)
    no_winner = tune_log()
    no_winner["groups"] = no_winner["groups"][1:]
    lone = tune_figure(typed(no_winner))
    (tmp_path / "lone.png").write_bytes(lone.png)
    assert not _has_colour(tmp_path / "lone.png", WINNER_COLOUR)
    assert one.png != lone.png


def test_a_log_without_predictions_draws_nothing_and_says_why():
    log = tune_log()
    for g in log["groups"]:
        for c in g["candidates"]:
            c["predicted_tokens_per_s_per_gpu"] = None
    fig = tune_figure(typed(log))
    assert fig.png is None and "no candidate of the search has a prediction" in fig.note


def test_several_logs_get_one_figure_each():
    a, b, c = tune_log(), tune_log(), tune_log()
    c["sweep"] = "other sweep/x"
    assert tune_figure_names([typed(a)]) == ["tune"]
    assert tune_figure_names([typed(a), typed(b), typed(c)]) == [
        f"tune-{SWEEP}",
        f"tune-{SWEEP}-2",
        "tune-other_sweep_x",
    ]


def _other_version() -> str:
    log = tune_log()
    log["tune_version"] = 2
    return json.dumps(log)


def _unknown_fate() -> str:
    log = tune_log()
    log["groups"][0]["candidates"][3]["fate"] = "vanished"
    return json.dumps(log)


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ('{"tune_version": 1, "groups": [', "not valid JSON"),
        (_other_version(), "unknown tune_version 2; this harness reads version 1"),
        ("[1, 2]", "not a JSON object"),
        (_unknown_fate(), "groups[0].candidates[3].fate: 'vanished' is not one of winner"),
    ],
)
def test_an_unreadable_log_is_a_warning_and_the_report_still_builds(tmp_path, plain, text, why):
    out = build_report([results_with(tmp_path, text)], out=tmp_path / "report")
    extra = [w for w in warnings_of(out) if w not in warnings_of(plain)]
    assert len(extra) == 1 and extra[0].startswith(f"/results/{SWEEP}/tune.json: "), extra
    assert why in extra[0]
    md = out["paths"]["markdown"].read_text()
    assert "Search (harness tune)" not in md and "tune.json" in md_section(md, "## Warnings")
    assert len(out["frame"]) == 24 and [f.name for f in out["figures"]] == [f.name for f in plain["figures"]]


def test_every_fate_of_the_contract_is_read():
    log = tune_log()
    extra = log["groups"][1]["candidates"]
    for n, fate in enumerate(FATES):
        extra.append({**extra[0], "run_id": f"x{n}", "label": f"x {n}", "fate": fate, "round": -1, "trials": []})
    (_, second) = funnel(typed(log))
    assert second.candidates == 2 + len(FATES)
    assert second.dropped_oom_neighbour == 1 and second.failed == 3
