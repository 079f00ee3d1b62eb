"""The statistics behind `harness compare`: the significance test on run-level values (`run_level_p`, also the
report's best-strategy test) and the spread shown beside a github-action-benchmark value.

Why a t-test on runs and not Mann–Whitney: timing is judged on one value per run (its median), K per side, and
with 3 runs a side the smallest two-sided Mann–Whitney p is 0.1 — it could never reach 0.05. Welch's t-test on
the log of the values (a factor is a distance, so step time and the throughput derived from it agree) can. No test
here takes one run's per-step samples: timing noise is mostly between runs, so a within-run test says nothing
about the next run.

Kept apart so the one place that imports scipy is here, inside the functions that need it: `import
harness.compare...` and the exact-only comparison (`--metric exact`) never load it.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence

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


def half_spread(values: Sequence[float]) -> float | None:
    """Half the p10–p90 spread of samples (same unit), the ± shown as github-action-benchmark's range."""
    if len(values) < 2:
        return None
    qs = statistics.quantiles(values, n=10, method="inclusive")
    return (qs[-1] - qs[0]) / 2
