"""harness.history.changepoint: E-Divisive means against its definition, and on series with known shifts."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from harness.history.changepoint import e_divisive, q_values, recent_change_point


def brute_q(x: np.ndarray, tau: int) -> float:
    """q(τ) straight from the definition: τ(n−τ)/n · (2·mean|a−b| − mean|a−a'| − mean|b−b'|)."""
    a, b = x[:tau], x[tau:]
    n = len(x)
    between = np.mean([abs(i - j) for i in a for j in b])
    within_a = np.mean([abs(i - j) for i, j in itertools.combinations(a, 2)])
    within_b = np.mean([abs(i - j) for i, j in itertools.combinations(b, 2)])
    return tau * (n - tau) / n * (2 * between - within_a - within_b)


def test_q_values_equal_the_definition():
    x = np.random.default_rng(3).normal(size=17)
    q = q_values(x)
    for tau in range(2, 16):
        assert q[tau] == pytest.approx(brute_q(x, tau), rel=1e-12, abs=1e-12)
    assert np.isneginf(q[[0, 1, 16, 17]]).all()  # a side shorter than 2 values: no split


def test_q_values_of_a_batch_equal_each_row():
    x = np.random.default_rng(4).normal(size=(5, 12))
    assert np.array_equal(q_values(x), np.stack([q_values(row) for row in x]))


@pytest.mark.parametrize("where", [7, 30, 52])
def test_a_planted_shift_is_found_where_it_is(where):
    rng = np.random.default_rng(where)
    x = rng.normal(0, 1, 60)
    x[where:] += 4.0
    (cp,) = e_divisive(x)
    assert cp.index == where
    assert cp.p_value <= 0.01


def test_two_shifts_are_both_found():
    rng = np.random.default_rng(11)
    x = np.concatenate([rng.normal(0, 1, 40), rng.normal(5, 1, 30), rng.normal(-2, 1, 30)])
    assert [c.index for c in e_divisive(x)] == [40, 70]


def test_noise_and_constant_series_have_no_change_point():
    rng = np.random.default_rng(5)
    false = sum(bool(e_divisive(rng.normal(size=60))) for _ in range(100))
    assert false <= 3  # alpha 0.01 per series, and the test is exact
    assert e_divisive(np.full(40, 3.0)) == []


def test_results_are_deterministic():
    x = np.random.default_rng(6).normal(size=50)
    x[35:] += 1.5
    assert e_divisive(x) == e_divisive(x.copy())
    assert recent_change_point(x, recent=20) == recent_change_point(x.copy(), recent=20)


def test_the_recent_search_looks_only_at_the_end():
    rng = np.random.default_rng(8)
    old = rng.normal(0, 1, 60)
    old[20:] += 5  # a shift 40 values back: not recent
    assert recent_change_point(old, recent=5) is None
    new = rng.normal(0, 1, 60)
    new[57:] += 5  # 3 values ago
    cp = recent_change_point(new, recent=5)
    assert cp is not None and cp.index == 57
    assert recent_change_point(new[:58], recent=5) is None  # one value after it: not a shift yet (min 2)
