"""Judging a new sweep against the history: per cell and metric, is tonight's value a regression?

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
  than it from the level; its change is in points (value − level);
- a cell whose last run in the history was ok and that is not ok tonight is a regression (newly failing);
- several runs of a cell tonight (`harness sweep --repeat K`, or `history check --confirm K`'s re-runs): the
  median of their values is tonight's value (the latest run decides the cell's status).

Calibration (tests/history/test_replay.py: lognormal run-to-run noise of σ 3–8%, 0.5% outlier nights): 0.67% of
step-free cell-nights flagged (most of them the outliers), a 3σ step caught within 3 nights in 94% of replays,
on its night or the next in 94% of those.

The permutation test only runs on series where one of the rules could fire (a cheap screen on medians first), so
a quiet night of 1,000 cells costs a median or two per series.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any

import numpy as np

from harness.compare.metrics import (
    WATCHED,
    check_thresholds,
    check_watch_deviation,
    deviation_growth,
    watched_deviation,
)
from harness.core.errors import InputError, Problem
from harness.history.changepoint import ChangePoint, e_divisive, recent_change_point
from harness.history.keys import HISTORY_METRICS, MACHINE_FIELDS, SOFTWARE_FIELDS, Entry, is_exact
from harness.history.store import HistoryStore, Run

REGRESSION, IMPROVEMENT, UNCHANGED = "regression", "improvement", "unchanged"
INSUFFICIENT, NA = "insufficient history", "n/a"
SHIFTED = "shifted"
"""the time model's deviation left its history (the rules below, on measured / predicted): information, never a
regression unless `Rules.watch_deviation` asks"""
OUT_OF_BAND, CHANGE_POINT, SUSTAINED, EXACT_CHANGE = "out of band", "change point", "sustained shift", "exact change"
# cell states
JUDGED, NEW_CELL, NEWLY_FAILING, STILL_FAILING, FAILING = (
    "judged",
    "new cell",
    "newly failing",
    "still failing",
    "failing",
)
INFLATE = 4.0
_WATCHED_NAMES = frozenset(m.name for m in HISTORY_METRICS if m.kind == WATCHED)
Values = Sequence[float] | np.ndarray
"""a series: a list on the fast path, an array where numpy does the work"""
MAD_TO_SIGMA = 1.4826
"""median absolute deviation × this = standard deviation, for normal noise"""


@dataclass(frozen=True)
class Rules:
    """How a value is judged against its history; every field has the default `history check` uses."""

    k: float = 4.0
    """noise band: a value must leave the level by more than k·σ (σ: the series' between-run noise)"""
    min_history: int = 5
    """fewer history values than this: reported, never a regression"""
    window: int = 60
    """history values (runs) considered, the latest ones"""
    recent: int = 5
    """a change point among the last this many runs (tonight included) is tonight's concern"""
    shift: float = 1.0
    """a change point's step must exceed shift·σ (and the threshold) to count"""
    alpha: float = 0.005
    """significance level of the change-point permutation test"""
    permutations: int = 199
    """shuffles per change-point test"""
    thresholds: Mapping[str, float] = field(default_factory=lambda: {"default": 0.05})
    """metric name (or "default") → relative change that counts (0.05 = 5%), as `harness compare`"""
    watch_deviation: float | None = None
    """percentage points: a shift of the time model's deviation whose |deviation| grew by more than this is a
    regression (`--watch-deviation`); None: a shift of the deviation is information only"""

    def threshold(self, metric: str) -> float:
        return self.thresholds.get(metric, self.thresholds.get("default", 0.05))

    def checked(self) -> Rules:
        problems = []
        for name, lo in (("k", 0.0), ("shift", 0.0)):
            v = getattr(self, name)
            if not (isinstance(v, (int, float)) and math.isfinite(v) and v >= lo):
                problems.append(Problem(f"--{name}", "", f"{v!r} is not a number >= {lo:g}"))
        for name, lo in (("min_history", 2), ("window", 3), ("recent", 2), ("permutations", 19)):
            v = getattr(self, name)
            if not isinstance(v, int) or v < lo:
                problems.append(Problem(f"--{name.replace('_', '-')}", "", f"{v!r} is not an integer >= {lo}"))
        if not 0 < self.alpha < 1:
            problems.append(Problem("--alpha", "", f"{self.alpha!r} is not in (0, 1)"))
        try:
            watch = check_watch_deviation(self.watch_deviation)
        except InputError as e:
            problems.extend(e.problems)
            watch = None
        if problems:
            raise InputError(problems)
        return Rules(**{**asdict(self), "thresholds": check_thresholds(self.thresholds), "watch_deviation": watch})


@dataclass
class ChangePointInfo:
    """Where a series shifted, as a person finds it: the night, its label, what changed there."""

    nights_ago: int
    """runs after it up to tonight (0: tonight's run itself)"""
    time: int
    """Unix seconds: when that run finished"""
    label: str | None
    """the label that run was added with (`history add --label`); None for tonight's run"""
    harness_sha: str | None
    before: float
    """median before the change (metric's unit)"""
    after: float
    """median from the change on, tonight included (metric's unit)"""
    p_value: float | None
    """permutation-test p-value (None: an exact metric, or tonight alone out of band)"""
    changes: list[str] = field(default_factory=list)
    """software or machine fields that differ between the run before and the run at the change"""


@dataclass
class MetricVerdict:
    metric: str
    unit: str
    better: str
    value: float | None
    """tonight's value (metric's unit)"""
    verdict: str
    reference: float | None = None
    """the history's level: median of the recent stable runs (metric's unit)"""
    noise: float | None = None
    """σ of the between-run noise, relative (0.03 = 3%)"""
    sigmas: float | None = None
    """tonight's distance from the level in σ, positive = worse"""
    change: float | None = None
    """value / reference − 1; for the time model's deviation value − reference (a fraction: 0.18 = 18 points)"""
    threshold: float | None = None
    margin: float | None = None
    """the relative distance from the level a value must exceed: max(k·σ, threshold), as a fraction"""
    n_history: int = 0
    cause: str | None = None
    """out of band | change point | sustained shift | exact change"""
    change_point: ChangePointInfo | None = None
    note: str = ""


@dataclass
class CellVerdict:
    key: str
    label: str
    run_id: str
    status: str
    state: str
    metrics: list[MetricVerdict] = field(default_factory=list)
    history_runs: int = 0
    """runs of this cell on this cluster in the history"""
    last_status: str | None = None
    """status of the cell's latest run in the history"""
    notes: list[str] = field(default_factory=list)
    entry: Entry | None = None
    runs: int = 1
    """tonight's ok runs of the cell whose median was judged (1: one run)"""
    confirm: dict[str, Any] | None = None
    """`--confirm K`: {"runs": K re-runs judged, "first": the metrics (or "newly failing") flagged at first,
    "persisted": whether the re-runs still regressed}"""

    @property
    def regressions(self) -> list[MetricVerdict]:
        return [m for m in self.metrics if m.verdict == REGRESSION]

    @property
    def regressed(self) -> bool:
        """A metric regressed or the cell newly fails: the cell counts once, however many metrics moved."""
        return self.state == NEWLY_FAILING or bool(self.regressions)


@dataclass
class HistoryCheck:
    """The judgement of one sweep against a history."""

    cells: list[CellVerdict]
    rules: Rules
    db: str
    sources: list[str]
    records: int
    warnings: list[str] = field(default_factory=list)

    @property
    def regressions(self) -> list[tuple[CellVerdict, MetricVerdict]]:
        return [(c, m) for c in self.cells for m in c.regressions]

    @property
    def newly_failing(self) -> list[CellVerdict]:
        return [c for c in self.cells if c.state == NEWLY_FAILING]

    @property
    def regressed_cells(self) -> list[CellVerdict]:
        """What "N cell(s) regressed" counts (as `harness compare` counts cells)."""
        return [c for c in self.cells if c.regressed]

    @property
    def has_regression(self) -> bool:
        return bool(self.regressions or self.newly_failing)

    def exit_code(self) -> int:
        return 1 if self.has_regression else 0

    def summary(self) -> dict[str, int]:
        """Counts: `regressions` counts cells (a slow cell moves step time and the throughputs derived from it:
        one regression, as `harness compare` counts), `metric_regressions` the metrics behind them."""
        verdicts = [m.verdict for c in self.cells for m in c.metrics]
        confirmed = [c.confirm for c in self.cells if c.confirm is not None]
        return {
            "cells": len(self.cells),
            "regressions": len(self.regressed_cells),
            "metric_regressions": len(self.regressions),
            "newly_failing": len(self.newly_failing),
            "improvements": verdicts.count(IMPROVEMENT),
            "insufficient_history": verdicts.count(INSUFFICIENT),
            "deviation_shifts": verdicts.count(SHIFTED),
            "deviation_regressions": sum(1 for _, m in self.regressions if m.metric in _WATCHED_NAMES),
            "new_cells": sum(c.state == NEW_CELL for c in self.cells),
            "confirmed": sum(bool(c["persisted"]) for c in confirmed),
            "not_confirmed": sum(not c["persisted"] for c in confirmed),
        }

    def to_dict(self) -> dict[str, Any]:
        rules = asdict(self.rules)
        rules["thresholds"] = dict(self.rules.thresholds)
        return {
            "db": self.db,
            "sources": self.sources,
            "records": self.records,
            "rules": rules,
            "summary": self.summary(),
            "exit_code": self.exit_code(),
            "cells": [
                {
                    "key": c.key,
                    "label": c.label,
                    "run_id": c.run_id,
                    "status": c.status,
                    "state": c.state,
                    "history_runs": c.history_runs,
                    "last_status": c.last_status,
                    "runs": c.runs,
                    "confirm": c.confirm,
                    "notes": c.notes,
                    "metrics": [_metric_dict(m) for m in c.metrics],
                }
                for c in self.cells
            ],
            "warnings": self.warnings,
        }


def _metric_dict(m: MetricVerdict) -> dict[str, Any]:
    """dataclasses.asdict of a row, written out: asdict deep-copies every value, a tenth of a 1,000-cell check."""
    cp = m.change_point
    return {
        "metric": m.metric,
        "unit": m.unit,
        "better": m.better,
        "value": m.value,
        "verdict": m.verdict,
        "reference": m.reference,
        "noise": m.noise,
        "sigmas": m.sigmas,
        "change": m.change,
        "threshold": m.threshold,
        "margin": m.margin,
        "n_history": m.n_history,
        "cause": m.cause,
        "change_point": None
        if cp is None
        else {
            "nights_ago": cp.nights_ago,
            "time": cp.time,
            "label": cp.label,
            "harness_sha": cp.harness_sha,
            "before": cp.before,
            "after": cp.after,
            "p_value": cp.p_value,
            "changes": list(cp.changes),
        },
        "note": m.note,
    }


# --------------------------------------------------------------------------------------------------
# the statistics


def noise_sigma(y: Values) -> float:
    """σ of the between-run noise of a log series: MAD of night-to-night differences / √2, scaled to σ."""
    if len(y) < 3:
        return 0.0
    return MAD_TO_SIGMA * _med([abs(b - a) for a, b in zip(y[:-1], y[1:])]) / math.sqrt(2)


def _diff_fields(before: Mapping[str, Any], after: Mapping[str, Any], fields: Sequence[str]) -> list[str]:
    return [f"{k}: {before.get(k)} → {after.get(k)}" for k in fields if before.get(k) != after.get(k)]


def _what_changed(before: Run | Entry | None, after: Run | Entry) -> list[str]:
    if before is None:
        return []
    return _diff_fields(before.software, after.software, SOFTWARE_FIELDS) + _diff_fields(
        before.machine, after.machine, MACHINE_FIELDS
    )


def _same_machine(run: Run, entry: Entry) -> bool:
    """Whether a history run was measured on tonight's kind of machine (fields the record lacks match anything)."""
    for k in ("device_type", "device_name", "device_count", "driver"):
        mine, theirs = entry.machine.get(k), run.machine.get(k)
        if mine is not None and theirs is not None and mine != theirs:
            return False
    return True


@dataclass
class _Series:
    """One metric's history values on tonight's machine, oldest first, with the runs they came from."""

    values: list[float]
    runs: list[Run]


def _series(runs: Sequence[Run], metric: str, *, window: int) -> _Series:
    pairs = [(r.values[metric], r) for r in runs if metric in r.values]
    pairs = pairs[-window:]
    return _Series([v for v, _ in pairs], [r for _, r in pairs])


def _info(
    series: _Series, entry: Entry, index: int, *, before: float, after: float, p_value: float | None
) -> ChangePointInfo:
    """The change point at `index` of the series with tonight appended (index len(series): tonight)."""
    runs: list[Run | Entry] = [*series.runs, entry]
    at = runs[index]
    prev = runs[index - 1] if index > 0 else None
    return ChangePointInfo(
        nights_ago=len(runs) - 1 - index,
        time=at.time,
        label=at.label if isinstance(at, Run) else None,
        harness_sha=at.software.get("harness_sha"),
        before=before,
        after=after,
        p_value=p_value,
        changes=_what_changed(prev, at),
    )


def judge_metric(
    metric_name: str,
    series: _Series,
    value: float | None,
    entry: Entry,
    *,
    rules: Rules,
    searches: ChangePoints | None = None,
) -> MetricVerdict:
    """One metric of one cell: tonight's `value` against its history `series`."""
    metric = next(m for m in HISTORY_METRICS if m.name == metric_name)
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
        ratios = _Series([1 + v for v in series.values], series.runs)
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
    series: _Series,
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
        series = _Series([v for v, _ in kept], [r for _, r in kept])
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


def _med(v: Values) -> float:
    """The median of a short sequence (sorting a few dozen floats beats numpy's per-call overhead)."""
    s = sorted(v)
    k = len(s)
    return float(s[k // 2] if k % 2 else (s[k // 2 - 1] + s[k // 2]) / 2)


def _level(y: Values, *, rules: Rules, since: int = 0) -> float:
    """Median of the recent stable values: the last 2·recent+1, or those from `since` on (a change point) when
    at least min_history of them are left."""
    n = len(y)
    start = max(0, n - (2 * rules.recent + 1))
    if since > start and n - since >= rules.min_history:
        start = since
    return _med(y[start:])


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
        pre = _med(z[max(0, c - rules.window) : c])
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
        pre = _med(z[max(start, c - rules.window) : c])
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
    before = _med(pre)
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
    level = _level(y, rules=rules)
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
    level = _level(y, rules=rules, since=since)
    d = x - level
    if abs(d) > band:
        return _Decision(REGRESSION if d > 0 else IMPROVEMENT, OUT_OF_BAND, level=level, sigma=sigma, margin=band, at=n)
    return _Decision(UNCHANGED, None, level=level, sigma=sigma, margin=band)


def _judge_exact(
    row: MetricVerdict, series: _Series, value: float, entry: Entry, *, rules: Rules, lower_is_better: bool
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


# --------------------------------------------------------------------------------------------------
# a whole sweep


def judge_cell(entry: Entry, runs: Sequence[Run], *, rules: Rules) -> CellVerdict:
    """One cell tonight (`entry`) against its runs in the history (oldest first, tonight's own run excluded)."""
    cell = CellVerdict(key=entry.cell, label=entry.label, run_id=entry.run_id, status=entry.status, state=JUDGED)
    cell.entry = entry
    cell.history_runs = len(runs)
    cell.last_status = runs[-1].status if runs else None
    ok = entry.status == "ok"
    if not runs:
        cell.state = NEW_CELL if ok else FAILING
    elif not ok:
        cell.state = NEWLY_FAILING if cell.last_status == "ok" else STILL_FAILING
        return cell
    elif cell.last_status != "ok":
        cell.notes.append(f"newly fixed: the last run in the history was {cell.last_status}")
    if not ok:
        return cell
    same: dict[int, bool] = {}  # NOTE: runs share their machine's dict: one comparison per machine

    def on_this_machine(run: Run) -> bool:
        if id(run.machine) not in same:
            same[id(run.machine)] = _same_machine(run, entry)
        return same[id(run.machine)]

    mine = [r for r in runs if r.status == "ok" and on_this_machine(r)]
    if len(mine) < sum(r.status == "ok" for r in runs):
        cell.notes.append(f"{sum(r.status == 'ok' for r in runs) - len(mine)} ok run(s) on another device left out")
    searches = ChangePoints(rules)
    for metric in HISTORY_METRICS:
        series = _series(mine, metric.name, window=rules.window)
        value = entry.values.get(metric.name)
        cell.metrics.append(judge_metric(metric.name, series, value, entry, rules=rules, searches=searches))
    return cell


def _tonight(entries: Sequence[Entry]) -> Entry:
    """One cell's runs tonight as the one entry judged: the latest run (its status, time, software), valued at
    the median of the ok runs' values when there are several."""
    latest = max(entries, key=lambda e: e.time)
    ok = [e for e in entries if e.status == "ok"]
    if len(ok) < 2 or latest.status != "ok":
        return latest
    names = {name for e in ok for name in e.values}
    values = {}
    for name in names:
        vs = [e.values[name] for e in ok if name in e.values]
        values[name] = float(np.median(vs))
    return replace(latest, values=values)


def check_entries(
    store: HistoryStore, entries: Iterable[Entry], *, rules: Rules, sources: Sequence[str], records: int
) -> HistoryCheck:
    """Judge tonight's entries against the history in `store`: each cell once, on the median of its ok runs
    tonight (one run: its values), its status the latest run's."""
    rules = rules.checked()
    groups: dict[str, list[Entry]] = {}
    for e in entries:
        groups.setdefault(e.cell, []).append(e)
    chosen = {key: _tonight(group) for key, group in groups.items()}
    warnings: list[str] = []
    ids = store.cell_ids(chosen)
    cells = []
    # NOTE: a run per history value and a few more for failed runs among them (a cell failing often has fewer
    # history values; reading twice the window cost a third of a 1,000-cell check)
    limit = rules.window + 2 * rules.recent
    for key in sorted(chosen, key=lambda k: (chosen[k].label, k)):
        entry = chosen[key]
        mine = {e.uid for e in groups[key]}
        runs = []
        if key in ids:
            # NOTE: the runs before tonight's: a sweep already added (or an old one checked again) is judged
            # against what came before it, never against itself or later nights
            stored = store.runs_of(ids[key], cluster=entry.machine["cluster"], limit=limit, until=entry.time)
            runs = [r for r in stored if r.uid not in mine]
        cell = judge_cell(entry, runs, rules=rules)
        cell.runs = max(1, sum(e.status == "ok" for e in groups[key])) if entry.status == "ok" else 1
        if cell.runs > 1:
            cell.notes.append(f"tonight: the median of {cell.runs} runs")
        cells.append(cell)
    return HistoryCheck(
        cells=cells, rules=rules, db=store.where, sources=list(sources), records=records, warnings=warnings
    )
