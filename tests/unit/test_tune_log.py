"""tune.json as a typed model (harness.tune.log) and what it says for people (harness.tune.summary): a search driven
with synthetic measurements (nothing launched; tests/integration/test_tune.py runs real ones) writes its log, which
reads back byte for byte; a log with wrong fields is refused naming each key path; the printed table, line by line."""

from __future__ import annotations

import json
import random
import statistics
from pathlib import Path

import pytest

from harness.plan.prediction import Prediction
from harness.results.spec import spec_to_json
from harness.scenario.cluster import load_cluster
from harness.scenario.schema import parse_scenario
from harness.tune.log import Budget, CandidateLog, GroupLog, TrialLog, TuneLog, check_tune_log
from harness.tune.run import Search
from harness.tune.search import Candidate, Group, Trial, rank_candidates
from harness.tune.summary import format_tune, funnel, ranked_candidates

SPEED = {"ddp": 1000.0, "fsdp.full_shard": 900.0, "zero2": 800.0}
"""tokens/s per GPU per sequence of micro-batch, by strategy: the synthetic measurement"""
STARTED = "2026-01-02T03:04:05Z"


def searched(tmp_path: Path) -> tuple[Search, str]:
    """A finished search of 9 cells (3 strategies x micro-batch 1, 2, 4), each predicted 10% faster than it is
    measured, where zero2 at micro-batch 4 runs out of memory; and its log as tune.json has it. Micro-batch 4
    dominates 1 and 2 of the same strategy: three candidates, then zero2 at micro-batch 2 once its dominator failed."""
    prof = tmp_path / "cpu2.yaml"
    prof.write_text('name: cpu2\nexecutor: local\ndevice: cpu\ngpus_per_node: 2\nenv: {OMP_NUM_THREADS: "1"}\n')
    doc = {
        "name": "tl",
        "matrix": {
            "model": ["tiny"],
            "strategy": list(SPEED),
            "precision": ["fp32"],
            "gpus": [2],
            "micro_batch": [1, 2, 4],
        },
        "settings": {"measure_steps": 4},
        "tune": {"global_batch": 8, "first_round": 4, "confirm_runs": 2, "max_runs": 2},
    }
    sc = parse_scenario(doc, str(tmp_path / "tl.yaml"))
    assert sc.tune is not None
    cands = []
    for spec in sc.expand(gpus_per_node=2):
        tps = 1.1 * SPEED[spec.strategy] * spec.settings.micro_batch
        plan = {
            "tokens_per_s_per_gpu": tps,
            "step_time_s": 256 / tps,
            "memory_gib": {"total": 0.25 * spec.settings.micro_batch},
        }
        cands.append(Candidate(spec=spec, plan=Prediction.model_validate(plan)))
    rank_candidates(cands, objective="throughput", predict_twin=lambda s: Prediction(), rng=random.Random(0))
    g = Group(("tiny", 2), cands, tune=sc.tune, n0=4, final_steps=4)

    def value(c: Candidate, t: Trial) -> float:
        return SPEED[c.spec.strategy] * c.spec.settings.micro_batch + t.repeat  # run k of a cell: +k

    def status(c: Candidate, t: Trial) -> str:
        return "oom" if (c.spec.strategy, c.spec.settings.micro_batch) == ("zero2", 4) else "ok"

    launched = []
    while batch := g.next_trials():
        launched += batch
        why = {"ok": "", "oom": "CPU allocator: out of memory"}
        g.absorb({(t.spec.run_id, t.repeat): (status(c, t), value(c, t), why[status(c, t)]) for c, t in batch})
    g.close()
    cluster = load_cluster(str(prof))
    search = Search(sc, cluster, [g], [], 0, Budget(cells=None, minutes=None), started_at=STARTED, started_s=0.0)
    search.trials, search.measured_s, search.batches = len(launched), 12.34567, 3
    return search, json.dumps(search.log(finished=True).to_dict(), indent=2) + "\n"


def test_the_log_reads_back_byte_for_byte_every_field_in_the_files_order(tmp_path):
    search, text = searched(tmp_path)
    back = check_tune_log(json.loads(text))
    assert json.dumps(back.to_dict(), indent=2) + "\n" == text
    doc = json.loads(text)
    assert list(doc) == list(TuneLog.model_fields)  # every field written, in the declared order
    (g,) = doc["groups"]
    assert list(g) == list(GroupLog.model_fields)
    trials = [t for c in g["candidates"] for t in c["trials"]]
    for c in g["candidates"]:
        assert list(c) == list(CandidateLog.model_fields)
    assert [list(t) == list(TrialLog.model_fields) for t in trials] == [t["status"] == "oom" for t in trials]
    assert [t["reason"] for t in trials if "reason" in t] == ["CPU allocator: out of memory"]  # only a failure's
    assert (doc["trials"], len(trials), doc["measured_s"], doc["started_at"]) == (8, 8, 12.346, STARTED)
    assert doc["tune"] == {
        "objective": "throughput",
        "global_batch": 8,
        "memory_headroom": 0.0,
        "first_round": 4,
        "confirm_runs": 2,
        "max_runs": 2,
        "alpha": 0.05,
    }
    # the winner: ddp at micro-batch 4 (4000 tokens/s per GPU + its run number), measured as its final runs' median
    win = back.groups[0].candidates[0]
    assert (win.label, win.fate, g["verdict"], g["winner"]) == (
        "ddp fp32 mb 4 ga 1 ckpt none",
        "winner",
        "ahead",
        win.run_id,
    )
    finals = [t.value for t in win.trials if t.round == win.round]
    assert finals == [4001.0, 4002.0] and win.measured == statistics.median(finals) == 4001.5
    assert (win.predicted_tokens_per_s_per_gpu, win.predicted_memory_gib, win.predicted_rank) == (4400.0, 1.0, 1)
    assert win.spec is not None and spec_to_json(win.spec) == g["candidates"][0]["spec"]
    assert search.groups[0].winner is not None and win.spec == search.groups[0].winner.to_log().spec


def test_the_funnel_and_the_ranking_follow_the_log(tmp_path):
    _, text = searched(tmp_path)
    log = check_tune_log(json.loads(text))
    (row,) = funnel(log)
    assert (row.candidates, row.failed, row.dominated, row.pruned_prediction, row.unsupported, row.pruned_memory) == (
        9,
        1,
        5,
        0,
        0,
        0,
    )
    assert row.measured_per_round == (4, 2) and row.steps == (2, 4)
    assert (row.winner, row.runner_up, row.verdict) == (
        "ddp fp32 mb 4 ga 1 ckpt none",
        "fsdp.full_shard fp32 mb 4 ga 1 ckpt none",
        "ahead",
    )
    assert [c.label.split(" ga")[0] for c in ranked_candidates(log.groups[0], better=log.better)] == [
        "ddp fp32 mb 4",
        "fsdp.full_shard fp32 mb 4",
        "zero2 fp32 mb 2",  # measured once zero2 at micro-batch 4, which dominated it, ran out of memory
        "zero2 fp32 mb 4",  # the failed last
    ]
    why = {c.label: c.reason for c in log.groups[0].candidates if c.fate == "dominated"}
    assert why == {
        "ddp fp32 mb 2 ga 2 ckpt none": "dominated by ddp fp32 mb 4 ga 1 ckpt none (the winner): the same cell "
        "with micro-batch 4 > 2",
        "ddp fp32 mb 1 ga 4 ckpt none": "dominated by ddp fp32 mb 4 ga 1 ckpt none (the winner): the same cell "
        "with micro-batch 4 > 1",
        "fsdp.full_shard fp32 mb 2 ga 2 ckpt none": "dominated by fsdp.full_shard fp32 mb 4 ga 1 ckpt none (the "
        "runner-up): the same cell with micro-batch 4 > 2",
        "fsdp.full_shard fp32 mb 1 ga 4 ckpt none": "dominated by fsdp.full_shard fp32 mb 4 ga 1 ckpt none (the "
        "runner-up): the same cell with micro-batch 4 > 1",
        "zero2 fp32 mb 1 ga 4 ckpt none": "dominated by zero2 fp32 mb 2 ga 2 ckpt none (measured): the same cell "
        "with micro-batch 2 > 1",
    }


def test_the_printed_table(tmp_path):
    _, text = searched(tmp_path)
    assert format_tune(check_tune_log(json.loads(text))).splitlines() == [
        "tune tl on cpu2: objective throughput (higher tok/s/GPU is better), 8 trial runs, 12 s measuring",
        "",
        "tiny on 2 GPUs: recommended ddp fp32 mb 4 ga 1 ckpt none (the fastest measured; p=3.6e-06, 2 vs 2 runs), the "
        "best of 4 measured",
        "  runner-up fsdp.full_shard fp32 mb 4 ga 1 ckpt none: 11.1% slower",
        "  #  cell                                      predicted tok/s/GPU  measured tok/s/GPU  runs  round  fate",
        "  1  ddp fp32 mb 4 ga 1 ckpt none                            4,400               4,002     2      1  winner",
        "  2  fsdp.full_shard fp32 mb 4 ga 1 ckpt none                3,960"
        "               3,602     2      1  runner-up",
        "  3  zero2 fp32 mb 2 ga 2 ckpt none                          1,760"
        "               1,601     1      0  eliminated",
        "  4  zero2 fp32 mb 4 ga 1 ckpt none                          3,520                 n/a     0     -1  failed: "
        "round 0 run 1: oom: CPU allocator: out of memory",
        "  measured 4 of 9 cells; not measured: 5 dominated, 0 ranked below the first round, 0 not reached, 0 "
        "predicted not to fit, 0 beside an OOM, 0 unsupported; first round 3, steps [2, 4]",
    ]


def test_a_bad_log_names_each_key_path_value_and_what_is_allowed(tmp_path):
    _, text = searched(tmp_path)
    doc = json.loads(text)
    doc["better"] = "hihger"
    doc["measured_s"] = float("nan")
    del doc["groups"][0]["model"], doc["groups"][0]["gpus"]
    doc["groups"][0]["candidates"][0]["round"] = "1"
    doc["groups"][0]["candidates"][1]["trials"][0]["value"] = "fast"
    with pytest.raises(ValueError) as e:
        check_tune_log(doc)
    assert str(e.value).split("; ") == [
        "better: 'hihger' is not one of higher, lower (did you mean 'higher'?)",
        "measured_s: nan is not a finite number",
        "groups[0]: missing keys: model, gpus",
        "groups[0].candidates[0].round: '1' is not an integer",
        "groups[0].candidates[1].trials[0].value: 'fast' is not a number",
    ]


@pytest.mark.parametrize(
    ("doc", "why"),
    [
        ([1, 2], "not a JSON object"),
        ({"tune_version": 2, "groups": []}, "unknown tune_version 2; this harness reads version 1"),
        ({"tune_version": True}, "unknown tune_version True; this harness reads version 1"),
        ({"tune_version": 1}, "missing keys: objective, metric, better, groups"),
    ],
)
def test_the_version_and_the_shape_are_checked_first(doc, why):
    with pytest.raises(ValueError, match="^" + why.replace("(", r"\(") + "$"):
        check_tune_log(doc)


def test_a_newer_harnesss_fields_are_kept(tmp_path):
    _, text = searched(tmp_path)
    doc = json.loads(text)
    doc["groups"][0]["candidates"][0]["energy_j"] = 12.5
    log = check_tune_log(doc)
    assert log.groups[0].candidates[0].field("energy_j") == 12.5
    assert log.to_dict()["groups"][0]["candidates"][0]["energy_j"] == 12.5
    assert log.path is None and log.at("x/tune.json").path == "x/tune.json"
