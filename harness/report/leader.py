"""Is the fastest strategy of a (model, GPU count) really faster than the next one, or is the gap noise?

Timing noise here is mostly *between* runs: two sweeps of one commit moved a cell's median by ±40 % (issue 15)
while each run's steps agreed closely. A test on one run's per-step samples therefore says nothing about the next
run, and the lead is judged on runs only, on one of three bases (`Verdict.basis`), the first that applies:

- **runs**: both cells measured at least MIN_RUNS times (`harness sweep --repeat`, or the same sweep in several
  result dirs): compare's run-level test (harness.compare.stats.run_level_p: two-sided Welch t-test on the log of
  each run's tokens/s/GPU) at ALPHA;
- **history**: `harness report --history DB` gave both cells' between-run noise σ (log space, from at least
  `min_history` stored runs on the same machine: harness.history.noise): the difference of the two cells' mean
  log tokens/s/GPU against σ_a²/n_a + σ_b²/n_b, as a two-sided normal test at ALPHA;
- **not judged**: the lead is shown with no ★ and no p-value ("single run: lead not judged").

A lead is "distinguishable" only on a test at ALPHA; a row that was not judged is neither crowned nor tied.

Which cells compete, and on what value: a cell's value is the median of its runs (`run_value`: `harness tune`
ranks its finalists so), and only the cells timed with the most steps compete (`contenders`): runs of 2 steps and
runs of 5 are not runs of one cell, and one 2-step screening run that happened to be fast is no evidence against a
cell measured 5 steps at a time, three times over (issue 48: a report crowned a `harness tune` trial that tune had
eliminated in its first round, pooled with the final round's runs).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from harness.compare.stats import DEFAULT_MIN_RUNS, run_level_p
from harness.plan.recommend import lead_words

ALPHA = 0.05
"""two-sided significance level of both tests"""
MIN_RUNS = DEFAULT_MIN_RUNS
"""runs (ok records) of each cell needed for the run-level test: compare's minimum"""

RUNS = "runs"
HISTORY = "history"
NOT_JUDGED = "not judged"
BASES = (RUNS, HISTORY, NOT_JUDGED)
"""what a lead was judged on"""


@dataclass(frozen=True)
class Noise:
    """A cell's between-run noise from a results history: σ of log tokens/s/GPU (= of log step time) between
    runs, and how many stored runs it rests on."""

    sigma: float
    n: int


@dataclass(frozen=True)
class Verdict:
    basis: str
    """one of BASES"""
    distinguishable: bool | None
    """None when not judged"""
    p: float | None
    """the test's two-sided p-value; None when not judged"""
    n_runs: tuple[int, int]
    """runs (ok records) of the leader and of the runner-up"""
    noise: tuple[Noise, Noise] | None = None
    """the history noise of both cells, when judged on it"""

    def text(self) -> str:
        """'p=0.003, 3 vs 3 runs', 'not distinguishable, p=0.40, …', or why the lead was not judged: in
        harness.plan.recommend's words, which `harness tune`'s table uses too."""
        noise = None
        if self.basis == HISTORY and self.noise is not None:
            na, nb = self.noise
            noise = f"history noise {na.sigma:.1%} / {nb.sigma:.1%} ({na.n} / {nb.n} runs)"
        return lead_words(
            judged=self.basis != NOT_JUDGED,
            distinguishable=self.distinguishable,
            p=self.p,
            runs=self.n_runs,
            noise=noise,
            need=MIN_RUNS,
        )


@dataclass(frozen=True)
class Contest:
    """A leader and its runner-up: the tokens/s/GPU of every ok record of each cell (its runs), and each cell's
    history noise when a history was given."""

    leader_runs: Sequence[float]
    runner_runs: Sequence[float]
    leader_noise: Noise | None = None
    runner_noise: Noise | None = None


def run_value(runs: Sequence[float], *, fallback: float) -> float:
    """A cell's tokens/s/GPU for ranking: the median of its runs (`fallback`, its shown record's, without one)."""
    good = _positive(runs)
    return float(statistics.median(good)) if good else fallback


def contenders(steps: Sequence[float | None]) -> tuple[float, list[int]]:
    """(the most timed steps among cells that ran ok with `steps` each, the indices of the cells timed with that
    many): the cells measured alike, which alone compete for the lead. A cell without a step count (NaN) stands
    with the others that lack one, behind any that has one."""

    def count(v: float | None) -> float:
        return float(v) if isinstance(v, (int, float)) and math.isfinite(v) else -1.0

    if not steps:
        return math.nan, []
    most = max(count(v) for v in steps)
    return (most if most >= 0 else math.nan), [i for i, v in enumerate(steps) if count(v) == most]


def _positive(values: Sequence[float]) -> list[float]:
    return [float(v) for v in values if isinstance(v, (int, float)) and math.isfinite(v) and v > 0]


def _history_p(a: list[float], b: list[float], na: Noise, nb: Noise) -> float | None:
    """Two-sided normal p of the mean log difference against the two cells' between-run noise; None without
    noise (σ 0 on both sides: the history cannot say how far runs wander)."""
    var = na.sigma**2 / len(a) + nb.sigma**2 / len(b)
    if var <= 0:
        return None
    d = math.fsum(map(math.log, a)) / len(a) - math.fsum(map(math.log, b)) / len(b)
    return math.erfc(abs(d) / math.sqrt(2.0 * var))


def leader_verdict(contest: Contest) -> Verdict:
    """The lead judged on runs, else on a history's noise, else not judged (module docstring)."""
    a, b = _positive(contest.leader_runs), _positive(contest.runner_runs)
    n = (len(a), len(b))
    if min(n) >= MIN_RUNS:
        p = run_level_p(a, b)
        return Verdict(RUNS, p < ALPHA, p, n)
    noise = (contest.leader_noise, contest.runner_noise)
    if min(n) >= 1 and noise[0] is not None and noise[1] is not None:
        q = _history_p(a, b, noise[0], noise[1])
        if q is not None:
            return Verdict(HISTORY, q < ALPHA, q, n, noise=(noise[0], noise[1]))
    return Verdict(NOT_JUDGED, None, None, n)


def leader_verdicts(contests: Sequence[Contest]) -> list[Verdict]:
    """The verdict of each contest."""
    return [leader_verdict(c) for c in contests]
