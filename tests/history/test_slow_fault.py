"""The `slow` fault (`inject: {fault: slow, factor: F, rank: N, step: K}`): a real, known slowdown for testing
regression detection on real runs. Checked without a stopwatch: the fault's own accounting of each slowed step
(its time, the extra work asked for, the work done) is exact, the schema refuses what it cannot run, and a real
cell with it injected ends ok and meets the unslowed cell's history."""

from __future__ import annotations

import pytest
import torch

from harness.core.errors import InputError
from harness.history.keys import cell_key
from harness.scenario.schema import parse_scenario
from harness.worker.faults import FaultInjector
from harness.worker.runner import _step_fn
from tests.conftest import make_spec, run_cell

CPU = torch.device("cpu")


def scenario(inject) -> dict:
    return {
        "name": "s",
        "matrix": {"model": ["tiny"], "strategy": ["ddp"], "precision": ["fp32"], "gpus": [2]},
        "settings": {"inject": inject},
    }


@pytest.mark.parametrize(
    "inject",
    [{"fault": "slow", "factor": 1.3}, {"fault": "slow", "factor": 2, "rank": 1, "step": 3}],
)
def test_the_schema_takes_a_slowdown(inject):
    (spec,) = parse_scenario(scenario(inject), "s.yaml").expand(gpus_per_node=2)
    assert spec.settings.inject == inject
    assert spec.unsupported_reason("cpu") is None


@pytest.mark.parametrize(
    ("inject", "message"),
    [
        ({"fault": "slow"}, "settings.inject.factor: missing; the slowdown"),
        ({"fault": "slow", "factor": 1.0}, "settings.inject.factor: 1.0 is not a number in (1, 100]"),
        ({"fault": "slow", "factor": 0.5}, "is not a number in (1, 100]"),
        ({"fault": "slow", "factor": "fast"}, "'fast' is not a number in (1, 100]"),
        ({"fault": "slow", "factor": 1000}, "1000 is not a number in (1, 100]"),
        ({"fault": "exception", "factor": 1.3}, "settings.inject.factor: only `fault: slow` takes a factor"),
        ({"fault": "slowly", "factor": 1.3}, "(did you mean 'slow'?)"),
    ],
)
def test_the_schema_refuses_what_it_cannot_run(inject, message):
    with pytest.raises(InputError) as e:
        parse_scenario(scenario(inject), "s.yaml")
    assert message in str(e.value)


def work(n: int = 20) -> None:
    """A fixed amount of real work: the 'step' being slowed."""
    a = torch.full((96, 96), 1 / 96)
    for _ in range(n):
        a = a @ a


def test_each_slowed_step_gets_factor_minus_1_times_its_own_time():
    inj = FaultInjector({"fault": "slow", "factor": 1.5, "step": 3}, rank=0, device=CPU)
    model = torch.nn.Linear(2, 2)
    for step in range(1, 7):
        inj.before_step(step, model)
        work()
        inj.after_step(step)
    assert [s.step for s in inj.slowdowns] == [3, 4, 5, 6]  # from step 3 on, every step
    for s in inj.slowdowns:
        assert s.step_s > 0
        assert s.target_s == (1.5 - 1) * s.step_s  # exactly: the hook's own accounting
        assert s.extra_s >= s.target_s  # the work ran at least as long as asked
        assert s.step_s + s.extra_s >= 1.5 * s.step_s


@pytest.mark.parametrize(("rank", "armed"), [(None, [True, True, True]), (1, [False, True, False])])
def test_one_rank_or_every_rank(rank, armed):
    inject = {"fault": "slow", "factor": 1.2} | ({} if rank is None else {"rank": rank})
    injectors = [FaultInjector(inject, rank=r, device=CPU) for r in range(3)]
    for inj in injectors:
        inj.before_step(1, torch.nn.Linear(2, 2))
        work(2)
        inj.after_step(1)
    assert [len(inj.slowdowns) == 1 for inj in injectors] == armed


def test_the_worker_step_runs_the_extra_work_inside_the_timed_step():
    """runner._step_fn (the callable the worker times) wraps the trainer's step: before_step, the step,
    after_step — so the extra work lands inside each timed step, after the step's own work."""
    order: list[str] = []

    class Trainer:
        model = torch.nn.Linear(2, 2)

        def step(self, batches):
            order.append("step")
            work(5)
            return torch.tensor(0.0)

    inj = FaultInjector({"fault": "slow", "factor": 3.0}, rank=0, device=CPU)
    original = inj._busy

    def busy(seconds: float) -> float:
        order.append("extra")
        return original(seconds)

    inj._busy = busy  # type: ignore[method-assign]
    step = _step_fn(Trainer(), [], inj)
    for _ in range(3):
        step()
    assert order == ["step", "extra"] * 3
    assert [s.step for s in inj.slowdowns] == [1, 2, 3]
    assert all(s.extra_s >= 2.0 * s.step_s for s in inj.slowdowns)


@pytest.mark.dist
def test_a_real_cell_slowed_on_one_rank_ends_ok_and_is_its_cell(tmp_path):
    spec = make_spec(strategy="ddp", inject={"fault": "slow", "factor": 1.5, "rank": 1}, measure_steps=3)
    rec = run_cell(spec, tmp_path / "results")
    assert rec["status"] == "ok", rec.get("reason")
    assert rec["spec"]["inject"] == {"fault": "slow", "factor": 1.5, "rank": 1}
    plain = make_spec(strategy="ddp", measure_steps=3)
    assert cell_key(rec["spec"]) == cell_key(plain.to_dict())  # judged against the unslowed cell's history
    assert rec["run_id"] != plain.run_id  # …though it is its own run
