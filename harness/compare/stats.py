"""The statistics behind `harness compare`: the significance test on run-level values (`run_level_p`), the
Mann–Whitney U test on per-step samples (`mann_whitney_p`, `mann_whitney_ps`: the report's leader test) and the
spread shown beside a github-action-benchmark value.

Why a t-test on runs and not Mann–Whitney: timing is judged on one value per run (its median), K per side, and
with 3 runs a side the smallest two-sided Mann–Whitney p is 0.1 — it could never reach 0.05. Welch's t-test on
the log of the values (a factor is a distance, so step time and the throughput derived from it agree) can.

Kept apart so the one place that imports numpy and scipy is here, inside the functions that need them: `import
harness.compare...` and the exact-only comparison (`--metric exact`) never load them. `mann_whitney_ps` (every
pair at once, bit for bit scipy's) is the report's leader test (harness.report.leader); compare itself judges
timing on runs only.
"""

from __future__ import annotations

import math
import statistics
import warnings
from collections.abc import Sequence
from typing import Any

DEFAULT_ALPHA = 0.05
"""significance level of the timing test (`run_level_p`: two-sided Welch t-test on the log run-level values,
Holm-adjusted over the cells tested): the chance of any false alarm in a comparison"""
DEFAULT_MIN_RUNS = 3
"""runs (ok records of one cell) needed on each side before a timing change can be a regression"""


def run_level_p(xs: Sequence[float], ys: Sequence[float]) -> float:
    """Two-sided Welch t-test p-value on log(xs) vs log(ys): positive run-level values, at least 2 per side.
    Both sides without spread: 0.0 when they differ, 1.0 when equal (a t of ±inf or 0/0)."""
    from scipy.special import stdtr

    lx, ly = [math.log(v) for v in xs], [math.log(v) for v in ys]
    nx, ny = len(lx), len(ly)
    if nx < 2 or ny < 2:
        return 1.0
    mx, my = math.fsum(lx) / nx, math.fsum(ly) / ny
    # NOTE: float sums, not statistics.variance's exact fractions: the same to ~1e-16 and 30x faster (a 10,000-
    # record compare tests thousands of cells)
    vx = math.fsum((v - mx) ** 2 for v in lx) / (nx - 1) / nx
    vy = math.fsum((v - my) ** 2 for v in ly) / (ny - 1) / ny
    se2 = vx + vy
    if se2 <= 0:
        return 0.0 if mx != my else 1.0
    t = (my - mx) / math.sqrt(se2)
    df = se2**2 / ((vx**2 / (nx - 1) if vx else 0.0) + (vy**2 / (ny - 1) if vy else 0.0))
    p = 2 * float(stdtr(df, -abs(t)))
    return min(1.0, p) if math.isfinite(p) else 1.0


def mann_whitney_p(xs: Sequence[float], ys: Sequence[float]) -> float:
    """Two-sided Mann–Whitney U p-value; 1.0 when the test is undefined (every sample equal)."""
    from scipy.stats import mannwhitneyu

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        p = float(mannwhitneyu(xs, ys, alternative="two-sided").pvalue)
    return p if math.isfinite(p) else 1.0


def mann_whitney_ps(pairs: Sequence[tuple[Sequence[float], Sequence[float]]]) -> list[float]:
    """`mann_whitney_p` of every (xs, ys) pair, the same floats, for many pairs at once.

    scipy's normal approximation (what it uses unless a side has 8 or fewer samples and there are no ties) is
    computed here with numpy over all pairs of one size together, in scipy's own order of floating-point steps:
    ranks, rank sums and tie counts are exact (half-)integers, and the few steps after them (tie-corrected
    sigma, z with continuity correction, normal tail) are the same operations, so the p-values are bit for bit
    scipy's (tests/unit/test_compare.py holds them equal). The exact test, for small tie-free pairs, is scipy's
    (its null distribution is not restated here), one call per size. Without such pairs scipy.stats is never
    imported, only scipy.special's normal tail.
    """
    import numpy as np

    by_size: dict[tuple[int, int], list[int]] = {}
    for i, (xs, ys) in enumerate(pairs):
        by_size.setdefault((len(xs), len(ys)), []).append(i)
    out = [1.0] * len(pairs)
    others: dict[tuple[int, int, bool], list[int]] = {}
    for (n1, n2), rows in by_size.items():
        xy = np.array([[*pairs[i][0], *pairs[i][1]] for i in rows], dtype=float).reshape(len(rows), n1 + n2)
        ties, p = _normal_approximation(xy, n1, n2)
        # NOTE: scipy's choice of method (_mwu_choose_method); rows with NaN (never from metric_samples) go to it
        exact = (ties == 0) if n1 <= 8 or n2 <= 8 else np.zeros(len(rows), dtype=bool)
        nan = np.isnan(xy).any(axis=1)
        for i, value, by_scipy, with_nan in zip(rows, p.tolist(), (exact | nan).tolist(), nan.tolist()):
            if by_scipy:
                others.setdefault((n1, n2, with_nan), []).append(i)
            else:
                out[i] = value if math.isfinite(value) else 1.0
    for (n1, n2, _), rows in others.items():
        for i, value in zip(rows, _scipy_ps([pairs[i] for i in rows], n1, n2)):
            out[i] = value
    return out


def _normal_approximation(xy: Any, n1: int, n2: int) -> tuple[Any, Any]:
    """(tie count, p-value) of each row of `xy` (n1 baseline then n2 candidate samples): scipy's asymptotic
    two-sided Mann–Whitney U with continuity and tie correction (scipy.stats._mannwhitneyu, step for step)."""
    import numpy as np
    from scipy.special import ndtr

    rows, n = xy.shape
    order = np.argsort(xy, axis=1, kind="stable")
    srt = np.take_along_axis(xy, order, axis=1)
    first = np.ones((rows, n), dtype=bool)  # first of a run of equal values
    first[:, 1:] = srt[:, 1:] != srt[:, :-1]
    last = np.ones((rows, n), dtype=bool)
    last[:, :-1] = first[:, 1:]
    idx = np.arange(n)
    start = np.maximum.accumulate(np.where(first, idx, 0), axis=1)
    end = np.minimum.accumulate(np.where(last, idx, n - 1)[:, ::-1], axis=1)[:, ::-1]
    ranks = np.empty((rows, n))
    np.put_along_axis(ranks, order, (start + end) / 2 + 1, axis=1)  # average ranks, 1-based
    counts = np.where(first, end - start + 1, 0).astype(float)
    # the same operations as scipy: exact (half-)integers up to tie_term, then sigma, z, the normal tail
    r1 = ranks[:, :n1].sum(axis=1)
    u1 = r1 - n1 * (n1 + 1) / 2
    u2 = n1 * n2 - u1
    u = np.maximum(u1, u2)
    mu = n1 * n2 / 2
    tie_term = (counts**3 - counts).sum(axis=1)
    s = np.sqrt(n1 * n2 / 12 * ((n + 1) - tie_term / (n * (n - 1))))
    numerator = u - mu
    numerator -= 0.5
    with np.errstate(divide="ignore", invalid="ignore"):
        z = numerator / s
        p = ndtr(-z)
    p *= 2
    return (counts > 1).sum(axis=1), np.clip(p, 0.0, 1.0)


def _scipy_ps(pairs: Sequence[tuple[Sequence[float], Sequence[float]]], n1: int, n2: int) -> list[float]:
    """scipy's test over pairs of one size and one method (its choice is made over the whole array)."""
    import numpy as np
    from scipy.stats import mannwhitneyu

    xs = np.array([x for x, _ in pairs], dtype=float).reshape(len(pairs), n1)
    ys = np.array([y for _, y in pairs], dtype=float).reshape(len(pairs), n2)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ps = mannwhitneyu(xs, ys, alternative="two-sided", axis=1).pvalue
    return [p if math.isfinite(p) else 1.0 for p in np.atleast_1d(ps).tolist()]


def half_spread(values: Sequence[float]) -> float | None:
    """Half the p10–p90 spread of samples (same unit), the ± shown as github-action-benchmark's range."""
    if len(values) < 2:
        return None
    qs = statistics.quantiles(values, n=10, method="inclusive")
    return (qs[-1] - qs[0]) / 2
