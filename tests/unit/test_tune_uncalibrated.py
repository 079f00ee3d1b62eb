"""harness tune on a fresh clone, where no calibration exists (issue 31): dominance leaves out what cannot win, a
quick calibration is made first (its time in the log) unless --no-calibrate, and without one the candidates are
ranked by the planner's counts; nothing the search did not measure is called slower than the winner.

The calibration itself is stood in for (`harness.calibrate.run.calibrate` writes harness.plan.calibration's
example file instead of measuring for 80 s): what is tested is the search's use of it. The real quick calibration
runs in tests/integration/test_calibrate.py and in bench/bench_tune.py on a fresh clone.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from harness.plan import calibration as cal
from harness.plan.prediction import Prediction
from harness.scenario.cluster import load_cluster
from harness.scenario.schema import parse_scenario
from harness.tune.run import build_groups, quick_calibration
from harness.tune.search import COUNTS_SOURCE, Candidate, Group, dominates, rank_candidates
from harness.tune.summary import format_tune

MATRIX = {
    "model": ["tiny"],
    "strategy": ["ddp", "fsdp.full_shard", "zero2", "zero3"],
    "precision": ["fp32"],
    "gpus": [2],
    "micro_batch": [1, 2, 4],
    "activation_checkpointing": ["none", "full"],
}


@pytest.fixture
def no_calibration(tmp_path, monkeypatch):
    """A calibration folder with nothing in it (the fresh clone's state), and a stand-in `calibrate` that writes the
    example file there and counts its calls."""
    folder = tmp_path / "calibrations"
    folder.mkdir()
    monkeypatch.setenv(cal.CALIBRATION_DIR_ENV, str(folder))
    calls: list[dict] = []

    def calibrate(cluster, *, quick=False, out=None, **kw):
        calls.append({"cluster": cluster.name, "quick": quick})
        path = folder / f"{cluster.name}{cal.SUFFIX}"
        path.write_text(json.dumps(cal.example_calibration(cluster.name)))
        return path

    monkeypatch.setattr("harness.calibrate.run.calibrate", calibrate)
    return folder, calls


def groups_of(matrix=MATRIX, **tune):
    sc = parse_scenario({"matrix": matrix, "tune": {"global_batch": 8, **tune}}, "t.yaml")
    return sc, load_cluster("local")


def test_dominance_is_by_construction_only():
    sc, _ = groups_of()
    by = {
        (s.strategy, s.settings.micro_batch, s.settings.activation_checkpointing): s for s in sc.expand(gpus_per_node=2)
    }
    assert dominates(by[("ddp", 4, "none")], by[("ddp", 2, "none")])  # larger micro-batch, same global batch
    assert dominates(by[("ddp", 2, "none")], by[("ddp", 2, "full")])  # no recomputation
    assert dominates(by[("ddp", 4, "none")], by[("ddp", 1, "full")])
    assert not dominates(by[("ddp", 4, "full")], by[("ddp", 2, "none")])  # bigger, but recomputes: not decided
    assert not dominates(by[("ddp", 4, "none")], by[("zero2", 1, "full")])  # another strategy is never dominated
    assert not dominates(by[("ddp", 2, "none")], by[("ddp", 2, "none")])
    # fewer sequences per optimizer step is not dominated by more: mb 4 x ga 1 against mb 2 x ga 4
    free = parse_scenario(
        {"matrix": {**MATRIX, "strategy": ["ddp"], "grad_accum": [1, 4], "activation_checkpointing": ["none"]}}, "f"
    ).expand(gpus_per_node=2)
    cell = {(s.settings.micro_batch, s.settings.grad_accum): s for s in free}
    assert not dominates(cell[(4, 1)], cell[(2, 4)]) and dominates(cell[(4, 4)], cell[(2, 4)])


def test_no_calibration_means_a_quick_one_first_then_ranked_by_prediction(no_calibration):
    folder, calls = no_calibration
    sc, cluster = groups_of()
    groups, _ = build_groups(sc, cluster, seed=0, budget_cells=None)
    (g,) = groups
    assert {c.rank_source for c in g.pool} == {COUNTS_SOURCE}  # nothing predicts step times yet
    echoed: list[str] = []
    made = quick_calibration(cluster, groups, enabled=True, echo=echoed.append)
    assert calls == [{"cluster": "local", "quick": True}]
    assert made.made_by_tune and made.path == str((folder / f"local{cal.SUFFIX}").resolve())
    assert made.seconds is not None and made.seconds >= 0
    assert any("has no calibration: running `harness calibrate --cluster local --quick`" in e for e in echoed)
    (g,), _ = build_groups(sc, cluster, seed=0, budget_cells=None)
    assert {c.rank_source for c in g.pool} == {"prediction"}
    # a second search finds the file and makes none
    again = quick_calibration(cluster, [g], enabled=True, echo=echoed.append)
    assert len(calls) == 1 and not again.made_by_tune and again.path == made.path


def test_no_calibrate_ranks_by_counts_and_dominance_leaves_one_cell_per_strategy(no_calibration):
    _, calls = no_calibration
    sc, cluster = groups_of()
    groups, _ = build_groups(sc, cluster, seed=0, budget_cells=None)
    made = quick_calibration(cluster, groups, enabled=False, echo=lambda s: None)
    assert calls == [] and made.path is None and "--no-calibrate" in (made.note or "")
    (g,) = groups
    live = [c for c in g.pool if c.fate == "unmeasured"]
    # micro-batch 4 without checkpointing fits and dominates the other five cells of its strategy
    assert sorted((c.spec.strategy, c.spec.settings.micro_batch, c.spec.settings.activation_checkpointing)
                  for c in live) == [(s, 4, "none") for s in sorted(MATRIX["strategy"])]  # fmt: skip
    assert sum(c.fate == "dominated" for c in g.candidates) == 4 * 5 and g.n0 == 4
    # counts: the same FLOPs per token, then fewer collective bytes per token first (ddp's all-reduce of the
    # gradients; FULL_SHARD and ZeRO-3 gather the parameters again for the backward)
    keys = {c.spec.strategy: c.rank_key for c in live}
    assert len({k[1] for k in keys.values()}) == 1
    assert keys["ddp"] < keys["fsdp.full_shard"] and keys["ddp"] < keys["zero3"]
    assert [c.predicted_rank for c in sorted(live, key=lambda c: c.rank_key)] == sorted(c.predicted_rank for c in live)


def test_a_dominated_cell_is_measured_when_every_cell_dominating_it_fails(no_calibration):
    sc, cluster = groups_of(matrix={**MATRIX, "strategy": ["ddp"], "activation_checkpointing": ["none"]})
    (g,), _ = build_groups(sc, cluster, seed=0, budget_cells=None)
    assert [c.fate for c in g.candidates].count("dominated") == 2 and g.n0 == 1
    launched = []
    while batch := g.next_trials():
        launched += [c.spec.settings.micro_batch for c, _ in batch]
        # micro-batch 4 runs out of memory; 2 then runs, and is the winner: alone, never "ahead" of anything
        g.absorb({(t.spec.run_id, t.repeat): ("oom" if c.spec.settings.micro_batch == 4 else "ok", 1000.0, "")
                  for c, t in batch})  # fmt: skip
    g.close()
    assert launched[0] == 4 and 2 in launched and 1 not in launched
    fate = {c.spec.settings.micro_batch: (c.fate, c.reason) for c in g.candidates}
    assert fate[4][0] == "failed" and fate[2][0] == "winner" and g.verdict == "alone"
    assert fate[1] == ("dominated", "dominated by ddp fp32 mb 2 ga 2 ckpt none (the winner): the same cell with "
                                    "micro-batch 2 > 1")  # fmt: skip


def test_the_table_never_says_ahead_of_what_was_not_measured():
    """Cells that nothing ranked and the search did not reach are counted in the winner's line: it is the best of
    those measured only."""
    sc, _ = groups_of(matrix={**MATRIX, "activation_checkpointing": ["none"], "micro_batch": [2]})
    cands = [Candidate(spec=s, plan=Prediction()) for s in sc.expand(gpus_per_node=2)]
    rank_candidates(cands, objective="throughput", predict_twin=lambda s: Prediction(), rng=random.Random(0))
    assert all(c.rank_source == "none" for c in cands)  # no counts on a bare prediction: unranked
    from harness.scenario.tune import TuneSpec

    g = Group(("tiny", 2), cands, tune=TuneSpec(first_round=2, confirm_runs=3, max_runs=3), n0=2, final_steps=4)
    speed = {"ddp": 2000.0, "fsdp.full_shard": 1000.0, "zero2": 1500.0, "zero3": 900.0}
    while batch := g.next_trials():
        g.absorb({(t.spec.run_id, t.repeat): ("ok", speed[c.spec.strategy] + t.repeat, "") for c, t in batch})
    g.close()
    assert sorted(c.fate for c in cands).count("not_reached") == 2
    assert all("no prediction and no counts" in c.reason for c in cands if c.fate == "not_reached")
    from harness.tune.log import Budget
    from harness.tune.run import Search

    search = Search(sc, load_cluster("local"), [g], [], 0, Budget(cells=None, minutes=None), "2026-01-01T00:00:00Z", 0)
    text = format_tune(search.log(finished=True))
    head = next(line for line in text.splitlines() if line.startswith("tiny on 2 GPUs"))
    assert head.endswith("the best of 2 measured; 2 neither ranked nor measured could be faster"), head
    assert "measured 2 of 4 cells; not measured: 0 dominated, 0 ranked below the first round, 2 not reached" in text


def test_a_budget_too_small_is_refused_before_any_calibration(no_calibration, tmp_path):
    from harness.cli import main

    sc = tmp_path / "u.yaml"
    sc.write_text(
        "matrix: {model: [tiny], strategy: [ddp], precision: [fp32], gpus: [2], micro_batch: [1, 2]}\n"
        "tune: {global_batch: 4}\n"
    )
    # a budget the search cannot meet is refused before the calibration: nothing is measured or written
    _, calls = no_calibration
    assert main(["tune", str(sc), "--results", str(tmp_path / "r"), "--budget-cells", "1"]) == 2
    assert calls == [] and not any(Path(no_calibration[0]).iterdir())
