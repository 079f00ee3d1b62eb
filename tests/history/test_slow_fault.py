"""The `slow` fault (`inject: {fault: slow, factor: F, rank: N, step: K}`): a real, known slowdown for testing
regression detection on real runs. Checked without a stopwatch: the fault's own accounting of each slowed step
(its time, the reference it is a multiple of, the extra work asked for, the work done) is exact, and the schema
refuses what it cannot run. Real cells with it injected: tests/faults/test_slow_fault_gloo.py."""

from __future__ import annotations

import pytest
import torch

from harness.core.errors import InputError
from harness.scenario.schema import parse_scenario
from harness.worker.faults import FaultInjector
from harness.worker.runner import _step_fn

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


def test_each_slowed_step_gets_factor_minus_1_times_the_unslowed_median():
    inj = FaultInjector({"fault": "slow", "factor": 1.5, "step": 4}, rank=0, device=CPU)
    model = torch.nn.Linear(2, 2)
    for step in range(1, 8):
        inj.before_step(step, model)
        work()
        inj.after_step(step)
    assert [s.step for s in inj.slowdowns] == [4, 5, 6, 7]  # from step 4 on, every step
    unslowed = sorted(inj._unslowed_s)
    assert len(unslowed) == 3  # steps 1-3, timed and not slowed
    for s in inj.slowdowns:
        assert s.step_s > 0
        assert s.reference_s == unslowed[1]  # the median of steps 1-3, fixed: not the slowed step's own time
        assert s.target_s == (1.5 - 1) * s.reference_s  # exactly: the hook's own accounting
        assert s.extra_s >= s.target_s  # the work ran at least as long as asked


def test_from_step_1_the_reference_is_the_shortest_own_time_so_far():
    """No unslowed step: the reference is the running minimum of the own times, so it never grows with the
    waits a slowed rank's step includes (what made factor 8 on every rank compound until the watchdog)."""
    inj = FaultInjector({"fault": "slow", "factor": 3.0}, rank=0, device=CPU)
    model = torch.nn.Linear(2, 2)
    for step, n in enumerate([40, 10, 30, 5, 20], start=1):  # own work of different sizes
        inj.before_step(step, model)
        work(n)
        inj.after_step(step)
    steps = inj.slowdowns
    assert [s.step for s in steps] == [1, 2, 3, 4, 5]
    for i, s in enumerate(steps):
        assert s.reference_s == min(t.step_s for t in steps[: i + 1])
        assert s.target_s == 2.0 * s.reference_s
        assert s.extra_s >= s.target_s
    assert [s.reference_s for s in steps] == sorted((s.reference_s for s in steps), reverse=True)  # never grows


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
    assert all(s.extra_s >= s.target_s == 2.0 * s.reference_s for s in inj.slowdowns)


# NOTE: a real slowed cell (factor 4 on every rank, beside the unslowed cell: it ends ok, is the unslowed cell's
# cell in the history and its own run) is tests/faults/test_slow_fault_gloo.py's
