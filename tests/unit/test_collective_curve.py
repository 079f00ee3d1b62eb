"""How `harness calibrate` turns a collective's timed calls into its curve (harness.calibrate.group): each size's
figure is a trimmed mean of its calls (stable where the calls are bimodal, unlike the median), and the curve is made
non-decreasing in size by the least change in log time. The sampling itself runs on real gloo ranks in
tests/dist/test_calibrate.py."""

from __future__ import annotations

import math
import statistics

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from harness.calibrate.group import _trimmed_mean, curve_times

times = st.lists(st.floats(min_value=1e-6, max_value=10.0), min_size=2, max_size=8)


@settings(max_examples=200, deadline=None)
@given(times)
def test_the_curve_never_falls_and_keeps_a_curve_that_does_not(means):
    out = curve_times(means)
    assert len(out) == len(means)
    assert all(b >= a * (1 - 1e-12) for a, b in zip(out, out[1:]))
    if all(b >= a for a, b in zip(means, means[1:])):
        assert out == pytest.approx(means, rel=1e-9)
    # the least change in log time: the geometric mean of the points is kept (isotonic regression keeps each
    # pooled block's mean, here of the logs)
    assert sum(map(math.log, out)) == pytest.approx(sum(map(math.log, means)), abs=1e-6)


def test_a_dip_is_pooled_with_its_neighbour_at_their_geometric_mean():
    # 1 KiB 0.8 ms, 8 KiB 3.6 ms, 64 KiB 3.0 ms (the dip), then growing
    out = curve_times([0.8e-3, 3.6e-3, 3.0e-3, 6.9e-3, 29.8e-3])
    pooled = math.sqrt(3.6e-3 * 3.0e-3)
    assert out == pytest.approx([0.8e-3, pooled, pooled, 6.9e-3, 29.8e-3], rel=1e-9)


def test_bimodal_calls_give_a_stable_mean_where_the_median_jumps():
    """Half the calls about 0.4 ms, half about 3.5 ms (what 60 calls of a 1 KiB gloo all_reduce took on the
    development VM): one call more on either side moves the median across the gap, the trimmed mean by a little."""
    fast, slow = [0.4e-3 + 1e-5 * i for i in range(10)], [3.5e-3 + 1e-5 * i for i in range(10)]
    more_fast, more_slow = fast + slow + [0.45e-3], fast + slow + [3.55e-3]
    assert statistics.median(more_slow) / statistics.median(more_fast) > 7
    a, b = _trimmed_mean(more_fast), _trimmed_mean(more_slow)
    assert 1.0 < b / a < 1.2
    # 10 % cut from each end: a stall far out of either mode does not move it
    assert _trimmed_mean(fast + slow + [0.5]) == pytest.approx(_trimmed_mean(fast + slow + [3.6e-3]), rel=0.1)
