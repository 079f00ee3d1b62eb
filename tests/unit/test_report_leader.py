"""The best-strategy table's verdict (harness.report.leader): judged on runs (compare's run-level test) when each
cell was measured at least 3 times, else on a results history's between-run noise, else not judged — never on one
run's per-step samples (two sweeps of one commit crowned opposite leaders that way: issue 31)."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from harness.compare.stats import run_level_p
from harness.report.leader import HISTORY, NOT_JUDGED, RUNS, Contest, Noise, leader_verdict


def test_one_run_a_side_is_not_judged_however_large_the_lead():
    v = leader_verdict(Contest(leader_runs=[200.0], runner_runs=[100.0]))
    assert (v.basis, v.distinguishable, v.p, v.n_runs) == (NOT_JUDGED, None, None, (1, 1))
    assert v.text() == "single run: lead not judged"
    two = leader_verdict(Contest(leader_runs=[200.0, 190.0], runner_runs=[100.0]))
    assert two.basis == NOT_JUDGED and two.text() == "2 vs 1 runs: lead not judged (3 a side needed, or a history)"


def test_three_runs_a_side_use_compares_run_level_test():
    a, b = [110.0, 111.0, 109.5], [100.0, 100.5, 99.0]
    v = leader_verdict(Contest(leader_runs=a, runner_runs=b))
    assert v.basis == RUNS and v.p == run_level_p(a, b) and v.p < 0.05 and v.distinguishable is True
    assert v.text() == f"p={v.p:.2g}, 3 vs 3 runs"
    # the leader's third run slower than the runner-up: the lead is noise
    noisy = leader_verdict(Contest(leader_runs=[110.0, 66.0, 130.0], runner_runs=b))
    assert noisy.basis == RUNS and noisy.distinguishable is False and noisy.text().startswith("not distinguishable, p=")


def test_history_noise_judges_single_runs():
    quiet = Noise(sigma=0.02, n=12)
    v = leader_verdict(Contest(leader_runs=[110.0], runner_runs=[100.0], leader_noise=quiet, runner_noise=quiet))
    z = math.log(1.1) / math.sqrt(2 * 0.02**2)
    assert v.basis == HISTORY and v.p == pytest.approx(math.erfc(z / math.sqrt(2)), rel=1e-12)
    assert v.distinguishable is True
    assert v.text() == f"p={v.p:.2g}, 1 vs 1 runs, history noise 2.0% / 2.0% (12 / 12 runs)"
    loud = Noise(sigma=0.10, n=12)
    w = leader_verdict(Contest(leader_runs=[110.0], runner_runs=[100.0], leader_noise=loud, runner_noise=quiet))
    assert w.basis == HISTORY and w.distinguishable is False and w.p > 0.05
    # a history of one cell only is no basis: both cells' noise is needed
    one = leader_verdict(Contest(leader_runs=[110.0], runner_runs=[100.0], leader_noise=quiet))
    assert one.basis == NOT_JUDGED
    # three runs a side: the runs decide, the history is not used
    runs = leader_verdict(
        Contest(leader_runs=[110.0] * 3, runner_runs=[100.0] * 3, leader_noise=loud, runner_noise=loud)
    )
    assert runs.basis == RUNS and runs.p == 0.0


@settings(max_examples=60, deadline=None)
@given(
    runs=st.lists(st.integers(1, 10**6).map(float), min_size=1, max_size=6),
    other=st.lists(st.integers(1, 10**6).map(float), min_size=1, max_size=6),
    scale=st.sampled_from([2.0**-8, 0.5, 2.0, 1024.0]),
    sigma=st.floats(0.001, 0.5),
)
def test_verdict_is_unit_free_and_only_judged_with_a_basis(runs, other, scale, sigma):
    """Scaling both sides' throughput by one factor (exact: a power of two) changes no verdict; with
    fewer than 3 runs a side and no history, nothing is ever judged."""
    noise = Noise(sigma=sigma, n=10)
    for n1, n2 in ((None, None), (noise, noise)):
        v = leader_verdict(Contest(runs, other, n1, n2))
        w = leader_verdict(Contest([x * scale for x in runs], [x * scale for x in other], n1, n2))
        assert (v.basis, v.distinguishable) == (w.basis, w.distinguishable)
        if v.p is not None:
            assert w.p == pytest.approx(v.p, abs=1e-9)
        if min(len(runs), len(other)) < 3 and n1 is None:
            assert v.basis == NOT_JUDGED and v.distinguishable is None
