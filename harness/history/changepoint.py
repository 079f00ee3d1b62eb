"""E-Divisive means change points (Matteson & James 2014), in numpy: where a series of nightly values shifted.

The method MongoDB's performance CI and Apache Otava (Hunter) use on their histories: for a segment of n values
the split τ maximising the energy statistic

    q(τ) = τ(n−τ)/n · (2·mean|a−b| − mean|a−a'| − mean|b−b'|)      a ∈ x[:τ], b ∈ x[τ:]

is the candidate; a permutation test (the values of the segment shuffled `permutations` times, q's maximum
recomputed each time) gives its p-value, and a candidate with p <= alpha splits the segment. The segments are
split again, largest q first, until the next candidate is not significant. Distances are |x_i − x_j| (the
energy distance with exponent 1): no assumption about the noise's distribution, only that it does not change
without the level changing.

Every q(τ) of a segment comes from one prefix-sum table of its distance matrix (O(n²)); the permutations are done
in batches of such tables. The shuffles come from a generator seeded by `seed`: the same series always gives
the same change points. Pure numpy; nothing here knows what a record is.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

DEFAULT_ALPHA = 0.01
"""significance level of the permutation test (MongoDB's signal-processing default)"""
DEFAULT_PERMUTATIONS = 199
"""shuffles per test: p-values in steps of 1/200"""
DEFAULT_MIN_SIZE = 2
"""fewest values on each side of a split (the within-side mean distance needs a pair)"""
_BATCH_ELEMENTS = 250_000
"""distance-matrix elements per batch of permutations: bounds memory (2 MB of float64), and lets a test that
is clearly not significant stop after its first batch"""


@dataclass(frozen=True)
class ChangePoint:
    """A significant shift: the series' values from `index` on differ from those before."""

    index: int
    """position of the first value after the shift (0-based, in the series given)"""
    q: float
    """the energy statistic of the split (in the series' units)"""
    p_value: float
    """permutation-test p-value of the split, in its segment"""


def q_values(x: np.ndarray, *, min_size: int = DEFAULT_MIN_SIZE) -> np.ndarray:
    """q(τ) for every τ in 0..n of each row of `x` (shape (..., n)); -inf where a side would be shorter than
    `min_size`."""
    x = np.asarray(x, dtype=float)
    n = x.shape[-1]
    upper = np.triu(np.abs(x[..., :, None] - x[..., None, :]), 1)  # d_ij for i < j
    into = upper.sum(-2)  # Σ_{i<j} d_ij: what value j adds to the pairs of the values before it
    out_of = upper.sum(-1)  # Σ_{j>i} d_ij: what value i adds to the pairs of the values after it
    zero = np.zeros(x.shape[:-1] + (1,))
    left = np.concatenate([zero, into.cumsum(-1)], -1)  # pairs inside [0, τ)
    right = np.concatenate([out_of[..., ::-1].cumsum(-1)[..., ::-1], zero], -1)  # pairs inside [τ, n)
    between = left[..., -1:] - left - right  # every pair, less those inside a side
    t = np.arange(n + 1)
    m = n - t
    valid = (t >= min_size) & (m >= min_size)
    q = np.full(x.shape[:-1] + (n + 1,), -np.inf)
    tv, mv = t[valid], m[valid]
    q[..., valid] = (tv * mv / n) * (
        2 * between[..., valid] / (tv * mv)
        - left[..., valid] / (tv * (tv - 1) / 2)
        - right[..., valid] / (mv * (mv - 1) / 2)
    )
    return q


def best_split(x: np.ndarray, *, min_size: int = DEFAULT_MIN_SIZE) -> tuple[int, float] | None:
    """(τ, q) of the split maximising q, or None when the segment is too short to split."""
    if len(x) < 2 * min_size:
        return None
    q = q_values(x, min_size=min_size)
    tau = int(np.argmax(q))
    return tau, float(q[tau])


def permutation_p(
    x: np.ndarray,
    q_observed: float,
    *,
    permutations: int = DEFAULT_PERMUTATIONS,
    alpha: float = DEFAULT_ALPHA,
    min_size: int = DEFAULT_MIN_SIZE,
    rng: np.random.Generator,
    splits: np.ndarray | None = None,
) -> float:
    """(1 + shuffles whose best q >= q_observed) / (1 + permutations), the best q taken over `splits` (every
    split when None) as it was for the observed value. Stops early once the count already makes p > alpha (the
    answer is then a lower bound above alpha: not significant either way)."""
    n = len(x)
    batch = max(1, _BATCH_ELEMENTS // max(n * n, 1))
    give_up = int(np.floor(alpha * (permutations + 1)))  # at this many exceedances p > alpha for sure
    exceed = done = 0
    while done < permutations:
        k = min(batch, permutations - done)
        shuffled = rng.permuted(np.broadcast_to(x, (k, n)), axis=1)
        q = q_values(shuffled, min_size=min_size)
        best = (q if splits is None else q[:, splits]).max(axis=1)
        exceed += int(np.count_nonzero(best >= q_observed))
        done += k
        if exceed >= give_up + 1 and done < permutations:
            break
    return (1 + exceed) / (1 + done)


def recent_change_point(
    x: np.ndarray | list[float],
    *,
    recent: int,
    alpha: float = DEFAULT_ALPHA,
    permutations: int = DEFAULT_PERMUTATIONS,
    min_size: int = DEFAULT_MIN_SIZE,
    seed: int = 0,
) -> ChangePoint | None:
    """A significant shift among the last `recent` values of `x` (at least `min_size` values after it), or None.

    E-Divisive's statistic and permutation test with the split searched only where a nightly check looks: among
    the latest runs. The null distribution is that of the same restricted maximum, so the test stays exact; it
    has far more power at the end of a series than the whole-series search, whose maximum over every split is
    dominated by the middle (q weighs a split by τ(n−τ)/n): a 3σ step with 3 values after it is found in about
    19 of 20 series here, against 4 of 5."""
    x = np.asarray(x, dtype=float)
    n = len(x)
    splits = np.arange(max(min_size, n - recent), n - min_size + 1)
    if len(splits) == 0 or n < 2 * min_size:
        return None
    q = q_values(x, min_size=min_size)[splits]
    i = int(np.argmax(q))
    if not q[i] > 0:
        return None
    rng = np.random.default_rng(seed)
    p = permutation_p(x, float(q[i]), permutations=permutations, alpha=alpha, min_size=min_size, rng=rng, splits=splits)
    return ChangePoint(index=int(splits[i]), q=float(q[i]), p_value=p) if p <= alpha else None


def e_divisive(
    x: np.ndarray | list[float],
    *,
    alpha: float = DEFAULT_ALPHA,
    permutations: int = DEFAULT_PERMUTATIONS,
    min_size: int = DEFAULT_MIN_SIZE,
    seed: int = 0,
    max_change_points: int | None = None,
) -> list[ChangePoint]:
    """The significant change points of `x`, in order of position."""
    x = np.asarray(x, dtype=float)
    if x.ndim != 1:
        raise ValueError(f"e_divisive takes a 1-d series, not shape {x.shape}")
    rng = np.random.default_rng(seed)
    bounds = [0, len(x)]
    found: list[ChangePoint] = []
    candidates: dict[tuple[int, int], tuple[int, float] | None] = {}
    while max_change_points is None or len(found) < max_change_points:
        best: tuple[float, int, int, int] | None = None  # (q, start, end, τ)
        for a, b in zip(bounds, bounds[1:]):
            if (a, b) not in candidates:
                candidates[(a, b)] = best_split(x[a:b], min_size=min_size)
            split = candidates[(a, b)]
            if split is not None and (best is None or split[1] > best[0]):
                best = (split[1], a, b, split[0])
        if best is None or not best[0] > 0:
            break
        q, a, b, tau = best
        p = permutation_p(x[a:b], q, permutations=permutations, alpha=alpha, min_size=min_size, rng=rng)
        if p > alpha:
            break
        found.append(ChangePoint(index=a + tau, q=q, p_value=p))
        bounds = sorted([*bounds, a + tau])
    return sorted(found, key=lambda c: c.index)
