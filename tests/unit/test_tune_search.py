"""harness tune's search as a state machine, driven with synthetic measurements (nothing launched here; the real
search over real processes is tests/integration/test_tune.py)."""

from __future__ import annotations

import random
import statistics

import pytest

from harness.compare.stats import run_level_p
from harness.core.errors import InputError
from harness.plan.prediction import Prediction
from harness.scenario.cluster import load_cluster
from harness.scenario.schema import parse_scenario
from harness.scenario.tune import TuneSpec
from harness.tune.run import build_groups, least_budget
from harness.tune.search import (
    Candidate,
    Group,
    needs_more_memory,
    rank_candidates,
    search_cost,
    steps_schedule,
)

STRATEGIES = ["ddp", "fsdp.full_shard", "fsdp2.full_shard", "zero1", "zero2", "zero3"]


def scenario(**tune):
    doc = {
        "matrix": {
            "model": ["tiny"],
            "strategy": STRATEGIES,
            "precision": ["fp32"],
            "gpus": [2],
            "micro_batch": [1, 2, 4],
            "activation_checkpointing": ["none", "full"],
        },
        "settings": {"measure_steps": 8},
        "tune": {"global_batch": 8, **tune},
    }
    return parse_scenario(doc, "t.yaml")


def candidates(sc, truth=None, predicted=None):
    specs = sc.expand(gpus_per_node=2)
    out = []
    for i, s in enumerate(specs):
        plan = {"tokens_per_s_per_gpu": predicted(i, s) if predicted else None, "memory_gib": {"total": 0.01}}
        out.append(Candidate(spec=s, plan=Prediction.model_validate(plan)))
    return out


def drive(group: Group, value, *, status=lambda c, t: "ok", limit=500):
    """Run the search to its end: each trial's value from value(candidate, trial, run number)."""
    launched = []
    for _ in range(limit):
        batch = group.next_trials()
        if not batch:
            break
        launched += batch
        group.absorb({(t.spec.run_id, t.repeat): (status(c, t), value(c, t), "") for c, t in batch})
    else:
        raise AssertionError("the search did not end")
    group.close()
    return launched


def test_steps_double_up_to_the_scenarios_own_and_the_cost_counts_each_run():
    assert steps_schedule(8, 5) == [2, 2, 5]
    assert steps_schedule(8, 20) == [5, 10, 20]
    assert steps_schedule(16, 40) == [5, 10, 20, 40]
    assert steps_schedule(2, 5) == [5]
    assert steps_schedule(3, 8) == [4, 8]
    # 8 + 4 in the halving rounds, then 2 finalists x 3 runs
    assert search_cost(8, 3) == 8 + 4 + 2 * 3
    assert search_cost(2, 3) == 6
    assert least_budget(3, TuneSpec(confirm_runs=4)) == 3 * 8


def test_a_clear_best_wins_ahead_and_the_rounds_halve():
    sc = scenario(first_round=8)
    cands = candidates(sc, predicted=lambda i, s: 1000.0 + i)  # the last cells are predicted fastest
    rank_candidates(
        cands, objective="throughput", predict_twin=lambda s: Prediction(), rng=random.Random(0), dominance=False
    )
    truth = {c.spec.run_id: 1000.0 + 10 * (c.predicted_rank or 0) for c in cands}  # rank 1 predicted: slowest
    best = min(cands[:8], key=lambda c: c.predicted_rank)  # NOTE: the prediction is upside down in the first 8
    truth[best.spec.run_id] = 5000.0
    noise = random.Random(1)
    g = Group(("tiny", 2), cands, tune=TuneSpec(first_round=8), n0=8, final_steps=8)
    launched = drive(g, lambda c, t: truth[c.spec.run_id] * (1 + 0.02 * noise.random()))
    assert g.verdict == "ahead" and g.winner is best
    per_round = [sum(1 for _, t in launched if t.round == r) for r in range(3)]
    assert per_round == [8, 4, 2 * 3]  # 8 candidates, the better 4, then 2 finalists x 3 runs
    assert {t.spec.settings.measure_steps for _, t in launched if t.round == 0} == {2}
    assert {t.spec.settings.measure_steps for _, t in launched if t.round == 2} == {8}
    va, vb = g.winner.ok_values(2), g.runner_up.ok_values(2)
    assert g.p_value == pytest.approx(run_level_p(va, vb)) and g.p_value < 0.05
    assert g.winner.measured == statistics.median(va)
    # every candidate never measured is pruned by its predicted rank, and says so
    pruned = [c for c in cands if c.fate == "pruned_prediction"]
    assert len(pruned) == len(cands) - 8
    assert all(
        c.predicted_rank > 8 and f"of {len(cands)} by predicted throughput: below the first round's 8" in c.reason
        for c in pruned
    )


def test_two_equal_finalists_are_tied_after_max_runs():
    sc = scenario(first_round=4)
    cands = candidates(sc, predicted=lambda i, s: 1000.0 + i)
    rank_candidates(
        cands, objective="throughput", predict_twin=lambda s: Prediction(), rng=random.Random(0), dominance=False
    )
    noise = random.Random(2)
    tune = TuneSpec(first_round=4, confirm_runs=3, max_runs=5)
    g = Group(("tiny", 2), cands, tune=tune, n0=4, final_steps=8)
    launched = drive(g, lambda c, t: 1000.0 * (1 + 0.1 * noise.random()))
    assert g.verdict == "tied" and g.p_value is not None and g.p_value >= 0.05
    assert len(g.winner.ok_values(g.round)) == 5 and len(g.runner_up.ok_values(g.round)) == 5
    # the leader is the better median of the final runs
    assert statistics.median(g.winner.ok_values(g.round)) >= statistics.median(g.runner_up.ok_values(g.round))
    assert sum(1 for _, t in launched if t.round == g.round) == 10


def test_a_failing_trial_is_replaced_and_an_oom_drops_the_cells_that_need_more_memory():
    sc = scenario(first_round=4)

    def predicted(i, s):  # ddp mb 1 with full checkpointing first; the other ddp cells (its neighbours) last
        if s.strategy == "ddp":
            return 5000.0 if (s.settings.micro_batch, s.settings.activation_checkpointing) == (1, "full") else 10.0
        return 1000.0 + i

    cands = candidates(sc, predicted=predicted)
    rank_candidates(
        cands, objective="throughput", predict_twin=lambda s: Prediction(), rng=random.Random(0), dominance=False
    )
    first = cands[0]  # predicted best: measured first, and it runs out of memory
    assert (first.spec.strategy, first.spec.settings.micro_batch) == ("ddp", 1)
    s = first.spec.settings
    g = Group(("tiny", 2), cands, tune=TuneSpec(first_round=4), n0=4, final_steps=8)
    launched = drive(
        g,
        lambda c, t: 1000.0 + (c.predicted_rank or 0),
        status=lambda c, t: "oom" if c is first else ("hang" if c is cands[1] else "ok"),
    )
    assert first.fate == "failed" and "oom" in first.reason
    assert cands[1].fate == "failed" and "hang" in cands[1].reason
    dropped = [c for c in cands if c.fate == "dropped_oom_neighbour"]
    assert len(dropped) == 5, "every other ddp cell needs at least the OOM cell's memory"
    for c in dropped:
        assert needs_more_memory(c.spec, first.spec)
        assert c.spec.settings.micro_batch >= s.micro_batch and not any(o.spec is c.spec for o, _ in launched)
    # the failures were replaced: four candidates measured ok in round 0, and the search found a winner
    ok0 = {c.spec.run_id for c, t in launched if t.round == 0 and t.status == "ok"}
    assert len(ok0) == 4 and g.winner is not None and g.winner not in (first, cands[1])


def test_needs_more_memory_is_by_construction():
    sc = scenario()
    by = {
        (s.strategy, s.settings.micro_batch, s.settings.activation_checkpointing): s for s in sc.expand(gpus_per_node=2)
    }
    oom = by[("ddp", 2, "none")]
    assert needs_more_memory(by[("ddp", 4, "none")], oom)
    assert needs_more_memory(by[("ddp", 2, "none")], oom)
    assert not needs_more_memory(by[("ddp", 4, "full")], oom)  # checkpointing saves memory: not by construction
    assert not needs_more_memory(by[("ddp", 1, "none")], oom)
    assert not needs_more_memory(by[("zero3", 4, "none")], oom)
    assert needs_more_memory(by[("ddp", 4, "none")], by[("ddp", 2, "full")])


def test_unpredicted_cells_rank_by_their_twin_and_unranked_come_last():
    sc = parse_scenario(
        {
            "matrix": {
                "model": ["tiny"],
                "strategy": ["ddp", "zero2"],
                "precision": ["fp32"],
                "gpus": [2],
                "compile": [False, True],
            }
        },
        "t.yaml",
    )
    specs = sc.expand(gpus_per_node=2)
    speed = {("ddp", False): 100.0, ("zero2", False): 300.0}
    cands = []
    for s in specs:
        tps = None if s.settings.compile else speed[(s.strategy, False)]
        cands.append(Candidate(spec=s, plan=Prediction(tokens_per_s_per_gpu=tps)))
    # the twin of a compiled zero2 cell has a prediction; a compiled ddp cell's twin has none here
    rank_candidates(
        cands,
        objective="throughput",
        predict_twin=lambda t: Prediction(tokens_per_s_per_gpu=300.0 if t.strategy == "zero2" else None),
        rng=random.Random(0),
    )
    order = [(c.spec.strategy, c.spec.settings.compile, c.rank_source, c.predicted_rank) for c in cands]
    assert order[0][:2] in (("zero2", False), ("zero2", True))  # tied at 300: the seed orders them
    assert {o[:2] for o in order[:2]} == {("zero2", False), ("zero2", True)}
    assert order[2] == ("ddp", False, "prediction", 3)
    assert order[3] == ("ddp", True, "none", None)
    assert next(c for c in cands if c.spec.settings.compile and c.spec.strategy == "zero2").rank_source == (
        "proxy: compile off"
    )


def test_memory_pruning_with_headroom_and_a_budget_too_small_is_refused(tmp_path):
    prof = tmp_path / "small.yaml"
    prof.write_text(
        "name: small\nexecutor: local\ndevice: cpu\ngpus_per_node: 2\ndevice_memory_gib: 1.006\n"
        'env: {OMP_NUM_THREADS: "1"}\n'
    )
    cluster = load_cluster(str(prof))
    sc = parse_scenario(
        {
            "matrix": {
                "model": ["tiny"],
                "strategy": ["ddp", "fsdp.full_shard"],
                "precision": ["fp32"],
                "gpus": [2],
                "micro_batch": [1, 2, 4],
            },
            "tune": {"global_batch": 8, "memory_headroom": 0.1},
        },
        "t.yaml",
    )
    (g,), left_out = build_groups(sc, cluster, seed=0, budget_cells=None)
    assert left_out == []
    fate = {(c.spec.strategy, c.spec.settings.micro_batch): (c.fate, c.reason) for c in g.candidates}
    # ddp mb 4 is predicted at 6.8 MiB > 6.1 MiB usable (1.006 GiB - 1 GiB reserve): does not fit at all
    assert fate[("ddp", 4)][0] == "pruned_memory" and "GiB usable" in fate[("ddp", 4)][1]
    # fsdp mb 4 at 5.7 MiB fits, but not with 10% to spare
    assert fate[("fsdp.full_shard", 4)][0] == "pruned_memory" and "10% headroom" in fate[("fsdp.full_shard", 4)][1]
    assert {k for k, (f, _) in fate.items() if f == "unmeasured"} == {("ddp", 2), ("fsdp.full_shard", 2)}
    # micro-batch 2 fits and dominates 1 (same strategy, more sequences per micro-step): 1 is never measured
    assert {k for k, (f, _) in fate.items() if f == "dominated"} == {("ddp", 1), ("fsdp.full_shard", 1)}
    # pruned cells are never launched
    launched = drive(g, lambda c, t: 1000.0 + c.spec.settings.micro_batch)
    assert not any(c.fate == "pruned_memory" for c, _ in launched)
    with pytest.raises(InputError, match="least search is 2 candidates x 3 runs"):
        build_groups(sc, cluster, seed=0, budget_cells=5)
