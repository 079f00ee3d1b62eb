"""Is the fastest strategy of a (model, GPU count) really faster than the next one, or is the gap noise?

Two tests, both two-sided Mann–Whitney U at ALPHA:
- per step: each cell's step-time samples, as tokens/s/GPU per step (the record's tokens/s/GPU scaled by
  median step time ÷ that step's time, so the two cells are compared in the unit the table shows);
- per run: when a cell was measured more than once (several records of one cell: a rerun, or the same sweep
  in two result dirs), every run's tokens/s/GPU. Two runs of one scenario differed by ±40 % (issue 15): a
  difference inside one run's steps says nothing about the next run, so with repeats both tests must agree.

The leader is "distinguishable" only when every test that could be made says so; with no test possible
(fewer than MIN_SAMPLES step samples and no repeats) it is not. Every leader of a report is tested at once
(`leader_verdicts`), with scipy's p-values bit for bit: small tie-free samples by the exact test here (`exact_p`,
without importing scipy.stats), the others by harness.compare.stats.mann_whitney_ps in one batch.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from harness.compare.stats import mann_whitney_ps

ALPHA = 0.05
"""two-sided significance level of both tests"""
MIN_SAMPLES = 5
"""per-step samples needed on each side for the per-step test"""


def per_step_throughput(tokens_per_s_per_gpu: float, samples_s: Sequence[float]) -> np.ndarray:
    """tokens/s/GPU of each measured step: the record's value × median step time ÷ the step's time."""
    s = np.asarray(samples_s, dtype=float)
    s = s[s > 0]
    if not len(s) or not math.isfinite(tokens_per_s_per_gpu):
        return np.zeros(0)
    return tokens_per_s_per_gpu * float(np.median(s)) / s


@dataclass(frozen=True)
class Verdict:
    distinguishable: bool
    p_steps: float | None
    """per-step test; None when a side has fewer than MIN_SAMPLES samples"""
    p_runs: float | None
    """per-run test; None when neither cell was measured more than once"""
    n_runs: tuple[int, int]
    """runs (ok records) of the leader and of the runner-up"""

    @property
    def p(self) -> float | None:
        """the weakest evidence: the larger p of the tests made"""
        ps = [p for p in (self.p_steps, self.p_runs) if p is not None]
        return max(ps) if ps else None

    def text(self) -> str:
        """'p=0.003', 'not distinguishable, p=0.40', or why no test was possible"""
        if self.p is None:
            return f"not distinguishable: fewer than {MIN_SAMPLES} step samples and no repeated runs"
        runs = f", {self.n_runs[0]} vs {self.n_runs[1]} runs" if self.p_runs is not None else ""
        return f"p={self.p:.2g}{runs}" if self.distinguishable else f"not distinguishable, p={self.p:.2g}{runs}"


@dataclass(frozen=True)
class Contest:
    """A leader and its runner-up: tokens/s/GPU, per-step times (s), and the tokens/s/GPU of every ok record
    of each cell (its runs)."""

    leader_tps: float
    leader_samples: Sequence[float]
    runner_tps: float
    runner_samples: Sequence[float]
    leader_runs: Sequence[float]
    runner_runs: Sequence[float]


EXACT_MAX = 8
"""scipy's choice (stats._mannwhitneyu._mwu_choose_method): the exact test when a side has at most this many
samples and no value repeats; otherwise the normal approximation"""


@functools.lru_cache(maxsize=256)
def _u_counts(n1: int, n2: int) -> tuple[int, ...]:
    """How many of the C(n1 + n2, n1) orders of two tie-free samples give each U = 0 … n1·n2 (exact integers):
    an order either ends with a sample of the first side (which then beats all n2 of the other) or not."""
    if n1 == 0 or n2 == 0:
        return (1,)
    a, b = _u_counts(n1 - 1, n2), _u_counts(n1, n2 - 1)
    out = [0] * (n1 * n2 + 1)
    for u, c in enumerate(a):
        out[u + n2] += c
    for u, c in enumerate(b):
        out[u] += c
    return tuple(out)


def exact_p(xs: Sequence[float], ys: Sequence[float]) -> float:
    """Two-sided exact Mann–Whitney U p-value of two tie-free samples, the float scipy.stats.mannwhitneyu gives
    with method "exact" (2 × the cumulative frequency up to n1·n2 − max(U1, U2), each frequency ÷ C(n1 + n2,
    n1) summed in order, at most 1), without importing scipy.stats (about a second on a busy 2-CPU machine, the
    whole best-strategy table's time otherwise). tests/unit/test_report_leader.py holds the two equal."""
    n1, n2 = len(xs), len(ys)
    xy = [*xs, *ys]
    order = sorted(range(n1 + n2), key=xy.__getitem__)
    r1 = sum(rank + 1 for rank, i in enumerate(order) if i < n1)
    u1 = r1 - n1 * (n1 + 1) // 2
    kc = n1 * n2 - max(u1, n1 * n2 - u1)
    counts = _u_counts(min(n1, n2), max(n1, n2))
    total = float(math.comb(n1 + n2, n1))
    cdf = float(np.cumsum(np.array(counts[: kc + 1], dtype=float) / total)[kc])
    return min(1.0, 2.0 * cdf)


def _is_exact(xs: Sequence[float], ys: Sequence[float]) -> bool:
    return min(len(xs), len(ys)) <= EXACT_MAX and len(set(xs) | set(ys)) == len(xs) + len(ys)


def leader_verdicts(contests: Sequence[Contest]) -> list[Verdict]:
    """The verdict of each contest; the tests with small tie-free samples exact here (exact_p), the others in
    one mann_whitney_ps batch (the normal approximation: scipy.special only)."""
    pairs: list[tuple[Sequence[float], Sequence[float]]] = []
    slots: list[tuple[int | None, int | None]] = []
    for c in contests:
        a = per_step_throughput(c.leader_tps, c.leader_samples)
        b = per_step_throughput(c.runner_tps, c.runner_samples)
        steps = runs = None
        if len(a) >= MIN_SAMPLES and len(b) >= MIN_SAMPLES:
            steps = len(pairs)
            pairs.append((a.tolist(), b.tolist()))
        if max(len(c.leader_runs), len(c.runner_runs)) >= 2 and min(len(c.leader_runs), len(c.runner_runs)) >= 1:
            runs = len(pairs)
            pairs.append((list(c.leader_runs), list(c.runner_runs)))
        slots.append((steps, runs))
    ps = [exact_p(xs, ys) if _is_exact(xs, ys) else math.nan for xs, ys in pairs]
    rest = [i for i, p in enumerate(ps) if math.isnan(p)]
    for i, p in zip(rest, mann_whitney_ps([pairs[i] for i in rest]) if rest else []):
        ps[i] = p
    out = []
    for c, (steps, runs) in zip(contests, slots):
        p_steps = None if steps is None else ps[steps]
        p_runs = None if runs is None else ps[runs]
        made = [p for p in (p_steps, p_runs) if p is not None]
        out.append(
            Verdict(
                distinguishable=bool(made) and all(p < ALPHA for p in made),
                p_steps=p_steps,
                p_runs=p_runs,
                n_runs=(len(c.leader_runs), len(c.runner_runs)),
            )
        )
    return out


def leader_verdict(
    *,
    leader_tps: float,
    leader_samples: Sequence[float],
    runner_tps: float,
    runner_samples: Sequence[float],
    leader_runs: Sequence[float],
    runner_runs: Sequence[float],
) -> Verdict:
    """Test the leader against the runner-up; `*_runs` are the tokens/s/GPU of every ok record of each cell."""
    contest = Contest(leader_tps, leader_samples, runner_tps, runner_samples, leader_runs, runner_runs)
    return leader_verdicts([contest])[0]
