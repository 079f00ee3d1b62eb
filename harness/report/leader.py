"""Is the fastest strategy of a (model, GPU count) really faster than the next one, or is the gap noise?

Two tests, both two-sided Mann–Whitney U at ALPHA:
- per step: each cell's step-time samples, as tokens/s/GPU per step (the record's tokens/s/GPU scaled by
  median step time ÷ that step's time, so the two cells are compared in the unit the table shows);
- per run: when a cell was measured more than once (several records of one cell: a rerun, or the same sweep
  in two result dirs), every run's tokens/s/GPU. Two runs of one scenario differed by ±40 % (issue 15): a
  difference inside one run's steps says nothing about the next run, so with repeats both tests must agree.

The leader is "distinguishable" only when every test that could be made says so; with no test possible
(fewer than MIN_SAMPLES step samples and no repeats) it is not. scipy is imported where the test runs.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from harness.compare.stats import mann_whitney_p

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
    a, b = per_step_throughput(leader_tps, leader_samples), per_step_throughput(runner_tps, runner_samples)
    p_steps = mann_whitney_p(a.tolist(), b.tolist()) if len(a) >= MIN_SAMPLES and len(b) >= MIN_SAMPLES else None
    p_runs = (
        mann_whitney_p(leader_runs, runner_runs)
        if max(len(leader_runs), len(runner_runs)) >= 2 and min(len(leader_runs), len(runner_runs)) >= 1
        else None
    )
    made = [p for p in (p_steps, p_runs) if p is not None]
    return Verdict(
        distinguishable=bool(made) and all(p < ALPHA for p in made),
        p_steps=p_steps,
        p_runs=p_runs,
        n_runs=(len(leader_runs), len(runner_runs)),
    )
