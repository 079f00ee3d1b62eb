"""Judging one metric of one cell: tonight's value against the cell's history of it — is it a regression?

Each run contributes one value per metric (its median step time, the throughput at it, its peak memory, …), so
what is judged is the variation *between* runs — the noise a nightly job actually sees (another job on the node,
clocks, placement) — not the spread of one run's steps. For a cell's series on one machine (its ok runs on the
same cluster profile and device, the last `window` of them) and tonight's value x, in log space (so a factor is a
distance and step time and throughput agree), oriented so that worse is up:

- **noise** σ: 1.4826 × the median absolute night-to-night difference / √2 — the median absolute deviation scaled
  to a standard deviation, taken on differences so that neither an outlier night (two large differences out of
  many) nor an earlier level shift (one) inflates it; while it rests on few values the bands below widen by
  (1 + 4/(n−1));
- **level**: the median of the recent stable runs: the last `2·recent + 1` history values, or those since a
  change point among them;
- **out of band** (tonight alone): x above the level by more than k·σ (k = 4) *and* by more than the metric's
  threshold (the same 5% default as `harness compare`, symmetric in log space). One slow night is flagged: it
  may be an outlier (another job on the node), which re-running the cell tells apart;
- **change point** (a shift that landed on an earlier night, or that builds up over several): E-Divisive means
  (harness.history.changepoint) over the series with x appended, its split searched among the last `recent`
  runs; significant (permutation test, alpha 0.005), the runs from it on (at least 2, x among them) beyond the
  runs before it by max(shift·σ, threshold) — measured by their lower median, so one outlier beside a normal run
  is no shift — and x itself beyond the threshold: a regression attributed to that night: its time, the label it
  was added with, and what changed in the software or machine there;
- **sustained shift**: the same, with no test but the noise band of a mean: the last m ≥ 2 runs' lower median
  beyond the level by k·σ/√m. A permutation test of 2 runs among 60 cannot reach alpha (there are too few
  orderings); this catches a large step on its second night;
- where the shift starts (for both): the permutation test's split, or the m with the largest mean·√m/σ;
- older change points (E-Divisive over the whole window) bound the runs these rules compare with: after a shift
  that is older than `recent` runs, the runs since it are the level;
- fewer than `min_history` values: reported, never a regression; a null value is n/a;
- deterministic metrics (collective bytes, predicted memory and bytes): any change from the previous run is a
  regression in the bad direction (an improvement in the good one), attributed to the run where it changed while
  that run is among the last `recent`;
- the time model's deviation (measured median / predicted − 1): judged by the rules above on measured /
  predicted (= 1 + deviation; lower is better), but a shift is "shifted" — information, never a regression (the
  timing itself is judged on step time) — unless `watch_deviation` (points) is set and |deviation| grew by more
  than it from the level; its change is in points (value − level).

Calibration (tests/history/test_replay.py: lognormal run-to-run noise of σ 3–8%, 0.5% outlier nights): 0.67% of
step-free cell-nights flagged (most of them the outliers), a 3σ step caught within 3 nights in 94% of replays,
on its night or the next in 94% of those.

The permutation test only runs on series where one of the rules could fire (a cheap screen on medians first), so
a quiet night of 1,000 cells costs a median or two per series.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from harness.compare.metrics import WATCHED, Metric, deviation_growth, watched_deviation
from harness.history.changepoint import ChangePoint, e_divisive, recent_change_point
from harness.history.keys import Entry, is_exact
from harness.history.rows import Machine, Run, Software
from harness.history.verdicts import (
    CHANGE_POINT,
    EXACT_CHANGE,
    IMPROVEMENT,
    INSUFFICIENT,
    NA,
    OUT_OF_BAND,
    REGRESSION,
    SHIFTED,
    SUSTAINED,
    UNCHANGED,
    ChangePointInfo,
    MetricVerdict,
    Rules,
)

INFLATE = 4.0
"""while σ rests on n values, the noise band widens by (1 + INFLATE/(n−1))"""
Values = Sequence[float] | np.ndarray
"""a series: a list on the fast path, an array where numpy does the work"""
MAD_TO_SIGMA = 1.4826
"""median absolute deviation × this = standard deviation, for normal noise"""


def noise_sigma(y: Values) -> float:
    """σ of the between-run noise of a log series: MAD of night-to-night differences / √2, scaled to σ."""
    if len(y) < 3:
        return 0.0
    return MAD_TO_SIGMA * median_of([abs(b - a) for a, b in zip(y[:-1], y[1:])]) / math.sqrt(2)


def what_changed(before: tuple[Software, Machine] | None, after: tuple[Software, Machine]) -> list[str]:
    """`field: old → new` for each software and machine field that differs between two runs."""
    if before is None:
        return []
    old = [*before[0].as_dict().items(), *before[1].as_dict().items()]
    new = [*after[0].as_dict().values(), *after[1].as_dict().values()]
    return [f"{k}: {a} → {b}" for (k, a), b in zip(old, new) if a != b]


@dataclass(frozen=True)
class Series:
    """One metric's history values on tonight's machine, oldest first, with the runs they came from."""

    values: list[float]
    runs: list[Run]


def series_of(runs: Sequence[Run], metric: str, *, window: int) -> Series:
    """The last `window` values of `metric` among `runs` (oldest first), each with its run."""
    pairs = [(r.values[metric], r) for r in runs if metric in r.values]
    pairs = pairs[-window:]
    return Series([v for v, _ in pairs], [r for _, r in pairs])


def _stack(run: Run | Entry) -> tuple[Software, Machine]:
    if isinstance(run, Run):
        return run.software, run.machine
    return Software.of(run.software), Machine.of(run.machine)


def _info(
    series: Series, entry: Entry, index: int, *, before: float, after: float, p_value: float | None
) -> ChangePointInfo:
    """The change point at `index` of the series with tonight appended (index len(series): tonight)."""
    runs: list[Run | Entry] = [*series.runs, entry]
    at = runs[index]
    software, machine = _stack(at)
    return ChangePointInfo(
        nights_ago=len(runs) - 1 - index,
        time=at.time,
        label=at.label if isinstance(at, Run) else None,
        harness_sha=software.harness_sha,
        before=before,
        after=after,
        p_value=p_value,
        changes=what_changed(_stack(runs[index - 1]) if index > 0 else None, (software, machine)),
    )


def judge_metric(
    metric: Metric,
    series: Series,
    value: float | None,
    entry: Entry,
    *,
    rules: Rules,
    searches: ChangePoints | None = None,
) -> MetricVerdict:
    """One metric of one cell: tonight's `value` against its history `series`."""
    row = MetricVerdict(
        metric=metric.name,
        unit=metric.unit,
        better=metric.better,
        value=value,
        verdict=NA,
        n_history=len(series.values),
    )
    if value is None:
        row.note = "null tonight"
        return row
    if is_exact(metric):
        return _judge_exact(row, series, value, entry, rules=rules, lower_is_better=metric.lower_is_better)
    threshold = rules.threshold(metric.name)
    row.threshold = threshold
    if metric.kind == WATCHED:
        # NOTE: judged as measured / predicted = 1 + deviation: positive, a factor like the timing metrics (with a
        # fixed prediction its log series is step time's, shifted: the same judgement)
        ratios = Series([1 + v for v in series.values], series.runs)
        _judge_log(
            row, ratios, 1 + value, entry, threshold=threshold, lower_is_better=True, rules=rules, searches=searches
        )
        return _as_deviation(row, value, rules=rules)
    return _judge_log(
        row,
        series,
        value,
        entry,
        threshold=threshold,
        lower_is_better=metric.lower_is_better,
        rules=rules,
        searches=searches,
    )


def _as_deviation(row: MetricVerdict, value: float, *, rules: Rules) -> MetricVerdict:
    """A watched row judged on 1 + deviation, put back in deviation units: the value, the level and the change
    point's levels minus 1, the change in points (value − level, a fraction); a shift found by the rules is
    information (SHIFTED), a regression only when `rules.watch_deviation` (points) is set and |deviation| grew
    by more than it from the level."""
    row.value = value
    if row.reference is not None:
        row.reference -= 1
        row.change = value - row.reference
    if row.change_point is not None:
        row.change_point.before -= 1
        row.change_point.after -= 1
    if row.verdict not in (REGRESSION, IMPROVEMENT):
        return row
    growth = deviation_growth(row.reference, value) if row.reference is not None else 0.0
    regressed, row.note = watched_deviation(growth, rules.watch_deviation)
    row.verdict = REGRESSION if regressed else SHIFTED
    return row


def _judge_log(
    row: MetricVerdict,
    series: Series,
    value: float,
    entry: Entry,
    *,
    threshold: float,
    lower_is_better: bool,
    rules: Rules,
    searches: ChangePoints | None,
) -> MetricVerdict:
    """A timing-like metric (positive, a factor is a distance) against its history, in log space."""
    if any(v <= 0 for v in series.values):  # NOTE: logs need positive values; runs and values stay paired
        kept = [(v, r) for v, r in zip(series.values, series.runs) if v > 0]
        series = Series([v for v, _ in kept], [r for _, r in kept])
    hist = series.values
    if len(hist) < rules.min_history:
        row.verdict = INSUFFICIENT
        row.reference = float(np.median(hist)) if hist else None
        row.note = f"{len(hist)} history value(s); {rules.min_history} needed to judge"
        return row
    if value <= 0:
        row.note = f"{value!r} is not a positive value"
        return row
    orient = 1.0 if lower_is_better else -1.0
    z = orient * np.log(np.array([*hist, value], dtype=float))
    # NOTE: judged centred: a series and its shifted copy (tokens/s is tokens per step / step time) are one
    # judgement, made once per cell
    offset = float(z.mean())
    centred_array = z - offset
    centred = centred_array.tolist()
    memo = searches or ChangePoints(rules)
    key = (np.round(centred_array, 9).tobytes(), threshold)
    decision = memo.decisions.get(key)
    if decision is None:
        decision = memo.decisions[key] = _decide(centred, rules=rules, threshold=threshold, searches=memo)

    def unit(v: float) -> float:  # centred oriented log → the metric's unit
        return math.exp(orient * (v + offset))

    d = decision
    row.verdict = d.verdict
    row.cause = d.cause
    row.reference = unit(d.level)
    row.noise = math.expm1(d.sigma) if d.sigma else 0.0
    row.sigmas = (centred[-1] - d.level) / d.sigma if d.sigma > 0 else None
    row.change = value / row.reference - 1 if row.reference else None
    row.margin = math.expm1(d.margin)
    if d.at is not None:
        after = centred[-1] if d.after is None else d.after
        row.change_point = _info(series, entry, d.at, before=unit(d.level), after=unit(after), p_value=d.p_value)
    return row


def median_of(v: Values) -> float:
    """The median of a short sequence (sorting a few dozen floats beats numpy's per-call overhead)."""
    s = sorted(v)
    k = len(s)
    return float(s[k // 2] if k % 2 else (s[k // 2 - 1] + s[k // 2]) / 2)


def recent_level(y: Values, *, rules: Rules, since: int = 0) -> float:
    """Median of the recent stable values: the last 2·recent+1, or those from `since` on (a change point) when
    at least min_history of them are left."""
    n = len(y)
    start = max(0, n - (2 * rules.recent + 1))
    if since > start and n - since >= rules.min_history:
        start = since
    return median_of(y[start:])


def _conservative_median(v: Values, *, up: bool) -> float:
    """The median, or of an even count the middle value nearer the level (the lower one when judging a rise): two
    values after a change point both have to be out, one huge value beside a normal one is not a shift."""
    s = sorted(v)
    k = len(s)
    return float(s[(k - 1) // 2] if up else s[k // 2])


def _candidates(z: Values, *, rules: Rules, bar: float, thr: float) -> bool:
    """Screen: could a shift among the last `recent` runs pass the change-point or sustained-shift rule?"""
    n1 = len(z)
    x = z[-1]
    for c in range(max(rules.min_history, n1 - rules.recent), n1 - 1):
        pre = median_of(z[max(0, c - rules.window) : c])
        if x - pre > thr and _conservative_median(z[c:], up=True) - pre > bar:
            return True
        if x - pre < -thr and _conservative_median(z[c:], up=False) - pre < -bar:
            return True
    return False


class ChangePoints:
    """The change-point searches and judgements of one cell's series, remembered: throughput, TFLOPS and MFU are
    step time's reciprocal times a constant, so in log space their series are step time's shifted (and, oriented,
    the same): the energy statistic sees only differences, and each search runs once for all of them."""

    def __init__(self, rules: Rules) -> None:
        self.rules = rules
        self._memo: dict[tuple[str, bytes], Any] = {}
        self.decisions: dict[tuple[bytes, float], _Decision] = {}

    @staticmethod
    def _print(z: np.ndarray) -> bytes:
        return np.round(z - z.mean(), 9).tobytes()

    def whole(self, z: np.ndarray) -> list[ChangePoint]:
        key = ("whole", self._print(z))
        if key not in self._memo:
            self._memo[key] = e_divisive(z, alpha=self.rules.alpha, permutations=self.rules.permutations)
        return self._memo[key]

    def recent(self, z: np.ndarray) -> ChangePoint | None:
        key = ("recent", self._print(z))
        if key not in self._memo:
            r = self.rules
            self._memo[key] = recent_change_point(z, recent=r.recent, alpha=r.alpha, permutations=r.permutations)
        return self._memo[key]


@dataclass(frozen=True)
class _Shift:
    """A shift among the last runs: where it starts (index into the series with tonight appended), its
    direction (+1 worse, -1 better), the level before it and after it (oriented log)."""

    at: int
    sign: int
    before: float
    after: float
    cause: str
    p_value: float | None = None


@dataclass(frozen=True)
class _Decision:
    """A judgement of one centred, oriented series (tonight last), before it is put in a metric's unit."""

    verdict: str
    cause: str | None
    level: float
    """the level tonight is measured from"""
    sigma: float
    margin: float
    """the distance tonight had to exceed (log)"""
    at: int | None = None
    """where the change it is attributed to starts (index; len − 1: tonight)"""
    after: float | None = None
    """the level from the change on (None: tonight's value)"""
    p_value: float | None = None


def _sustained(
    z: np.ndarray, *, start: int, sigma: float, inflate: float, bar: float, thr: float, rules: Rules
) -> _Shift | None:
    """The sustained-shift rule: the last m ≥ 2 runs (tonight among them) sit beyond the level before them by
    the noise band of m runs, k·σ/√m — measured by their lower median (of two runs the nearer one: two runs out,
    not one outlier beside a normal run) — and by max(shift·σ, threshold), tonight beyond the threshold.

    Where it starts: of every m from 1 (tonight alone) up that passes, the one with the largest standardised
    shift of the mean, mean·√m/σ (the likeliest start of a step in normal noise); when that is tonight alone, the
    band rule speaks instead. None when no m ≥ 2 passes."""
    n1 = len(z)
    x = z[-1]
    best: tuple[float, _Shift | None] | None = None
    for c in range(max(start + rules.min_history, n1 - rules.recent), n1):
        pre = median_of(z[max(start, c - rules.window) : c])
        post = z[c:]
        m = len(post)
        need = max(rules.k * sigma * inflate / math.sqrt(m), bar)
        for sign in (1, -1):
            low = _conservative_median(post, up=sign > 0) - pre
            if sign * low > need and sign * (x - pre) > thr:
                score = sign * (float(post.mean()) - pre) * math.sqrt(m)
                if best is None or score > best[0]:
                    shift = _Shift(at=c, sign=sign, before=pre, after=pre + low, cause=SUSTAINED)
                    best = (score, None if m == 1 else shift)
    return None if best is None else best[1]


def _recent_change_point(
    z: np.ndarray, *, start: int, bar: float, thr: float, rules: Rules, searches: ChangePoints
) -> _Shift | None:
    """The change-point rule: a significant E-Divisive shift among the last runs of z[start:], its lower median
    beyond max(shift·σ, threshold) from the values before it, tonight beyond the threshold."""
    if not _candidates(z[start:], rules=rules, bar=bar, thr=thr):
        return None
    cp = searches.recent(z[start:])
    if cp is None:
        return None
    at = start + cp.index
    pre = z[max(start, at - rules.window) : at]
    if len(pre) < rules.min_history:
        return None
    before = median_of(pre)
    x = z[-1]
    for sign in (1, -1):
        low = _conservative_median(z[at:], up=sign > 0) - before
        if sign * low > bar and sign * (x - before) > thr:
            return _Shift(at=at, sign=sign, before=before, after=before + low, cause=CHANGE_POINT, p_value=cp.p_value)
    return None


def _decide(centred: list[float], *, rules: Rules, threshold: float, searches: ChangePoints) -> _Decision:
    """The verdict on the last value of `centred` (oriented log, worse = up) against the values before it."""
    y = centred[:-1]
    x = centred[-1]
    n = len(y)
    sigma = noise_sigma(y)
    thr = math.log1p(threshold)
    inflate = 1 + INFLATE / max(n - 1, 1)  # NOTE: wider bands while σ rests on few values
    band = max(rules.k * sigma * inflate, thr)
    bar = max(rules.shift * sigma, thr)
    level = recent_level(y, rules=rules)
    out_of_band = abs(x - level) > band
    screened = _candidates(centred, rules=rules, bar=bar, thr=thr)
    if not (out_of_band or screened):  # the common case: a quiet night, decided on medians alone
        return _Decision(UNCHANGED, None, level=level, sigma=sigma, margin=band)
    z = np.asarray(centred)

    def shift_rules(start: int) -> _Shift | None:
        """The change-point rule, then the sustained-shift rule, over z[start:]."""
        found = _recent_change_point(z, start=start, bar=bar, thr=thr, rules=rules, searches=searches)
        if found is None:
            found = _sustained(z, start=start, sigma=sigma, inflate=inflate, bar=bar, thr=thr, rules=rules)
        return found

    # NOTE: the rules over the whole window first; only where something fired the whole-series search, whose
    # older change points bound the segment the rules and the level really use (after an old shift, the values
    # before it are not the level any more)
    shift = shift_rules(0) if screened else None
    indices: list[int] = []
    if out_of_band or shift is not None:
        indices = [c.index for c in searches.whole(z)]
        start = max((c for c in indices if c < len(z) - rules.recent), default=0)
        if start:
            shift = shift_rules(start)
    if shift is not None:
        return _Decision(
            REGRESSION if shift.sign > 0 else IMPROVEMENT,
            shift.cause,
            level=shift.before,
            sigma=sigma,
            margin=bar,
            at=shift.at,
            after=shift.after,
            p_value=shift.p_value,
        )
    since = max((c for c in indices if c <= n), default=0)
    level = recent_level(y, rules=rules, since=since)
    d = x - level
    if abs(d) > band:
        return _Decision(REGRESSION if d > 0 else IMPROVEMENT, OUT_OF_BAND, level=level, sigma=sigma, margin=band, at=n)
    return _Decision(UNCHANGED, None, level=level, sigma=sigma, margin=band)


def _judge_exact(
    row: MetricVerdict, series: Series, value: float, entry: Entry, *, rules: Rules, lower_is_better: bool
) -> MetricVerdict:
    """Deterministic metrics: any change counts, attributed to the run where the value changed."""
    if not series.values:
        row.verdict = INSUFFICIENT
        row.note = "no history value"
        return row
    z = [*series.values, value]
    row.reference = series.values[-1]
    row.change = value / row.reference - 1 if row.reference else None
    changed = [j for j in range(1, len(z)) if z[j] != z[j - 1]]
    last = changed[-1] if changed else None
    if last is None or last < len(z) - rules.recent or z[last] == z[last - 1]:
        row.verdict = UNCHANGED
        return row
    worse = (z[last] > z[last - 1]) == lower_is_better
    row.verdict = REGRESSION if worse else IMPROVEMENT
    row.cause = EXACT_CHANGE
    row.reference = z[last - 1]
    row.change = value / row.reference - 1 if row.reference else None
    row.change_point = _info(series, entry, last, before=z[last - 1], after=z[last], p_value=None)
    return row
