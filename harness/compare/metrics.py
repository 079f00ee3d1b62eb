"""The metrics `harness compare` judges (the judged ones of the registry, harness.results.metrics: which record
values, their unit, their good direction, how each is judged), and the thresholds that apply to them.

Every other part of compare (judging, rendering, the github-benchmark entries) reads a metric from a record
through the registry's `Metric.value` (`metric_value`) and `metric_samples`.

- sampled metrics (step time, and tokens/s, tokens/s/GPU, MFU derived from it): timing, one value per run;
  threshold + a test on the runs' values (harness.compare.judge), never on one run's per-step samples;
- thresholded (measured peak memory, one value per run): threshold only;
- exact (collective bytes per step, measured tensor memory, predicted memory and collective bytes: deterministic):
  any change counts;
- watched (the time model's deviation, `predicted.step_time_deviation` = measured median / predicted − 1, one
  value per run): information — shown on each side with its change in points, never a regression by itself (a
  timing change is already judged on step time), unless the user asks (`--watch-deviation PCT`: |deviation| grew
  by more than PCT points).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from harness.core.errors import InputError, Problem, did_you_mean, one_of
from harness.results.metrics import (
    COMPARED,
    DEVIATION,
    EXACT,
    SAMPLED,
    THRESHOLDED,
    WATCHED,
    Metric,
    finite_number,
    step_samples,
    value_at,
)
from harness.results.record import Record

__all__ = [
    "DEVIATION",
    "EXACT",
    "SAMPLED",
    "THRESHOLDED",
    "WATCHED",
    "Metric",
    "finite_number",
    "step_samples",
    "value_at",
]  # re-exported from the registry (harness.results.metrics): compare's readers need no second import

DEFAULT_THRESHOLD = 0.05
"""relative change (fraction) beyond which a non-deterministic metric counts as changed"""

METRICS: tuple[Metric, ...] = COMPARED
"""what compare judges: the registry's judged metrics (harness.results.metrics), in its order"""
METRICS_BY_NAME = {m.name: m for m in METRICS}
THRESHOLD_METRICS = tuple(m.name for m in METRICS if m.kind in (SAMPLED, THRESHOLDED))


# --------------------------------------------------------------------------------------------------
# reading a record


def metric_value(rec: Record, metric: Metric) -> float | None:
    return metric.value(rec)


def metric_samples(rec: Record, metric: Metric, *, times: list[float] | None = None) -> list[float]:
    """Per-step samples of a sampled metric: step times as recorded; a throughput-like metric v (tokens/s,
    tokens/s/GPU, MFU — each inversely proportional to step time) as v * median_step_time / step_time_i, i.e.
    tokens per step / step time for tokens/s. `times`: the record's `step_samples`, when already read."""
    if times is None:
        times = step_samples(rec)
    if metric.name == "step_time_s":
        return times
    step = rec.metrics.step_time_s
    value = metric.value(rec)
    median = finite_number(step.median) if step is not None else None
    if value is None or not median:
        return []
    per_step = value * median  # e.g. tokens per step for tokens/s
    return [per_step / t for t in times]


# --------------------------------------------------------------------------------------------------
# choosing metrics and thresholds


def select_metrics(names: Iterable[str] | None) -> tuple[Metric, ...]:
    """The metrics to judge: all, or the named ones ("exact" stands for every deterministic metric)."""
    if names is None:
        return METRICS
    wanted: set[str] = set()
    problems = []
    for n in names:
        if n == "exact":
            wanted |= {m.name for m in METRICS if m.kind == EXACT}
        elif n in METRICS_BY_NAME:
            wanted.add(n)
        else:
            problems.append(Problem("--metric", "", one_of(n, [*METRICS_BY_NAME, "exact"])))
    if problems:
        raise InputError(problems)
    return tuple(m for m in METRICS if m.name in wanted)


def check_thresholds(thresholds: Mapping[str, float] | None) -> dict[str, float]:
    """{"default": fraction, metric: fraction, ...}; InputError for unknown/exact metrics or bad values."""
    out = {"default": DEFAULT_THRESHOLD}
    problems = []
    for name, value in (thresholds or {}).items():
        if name != "default" and name not in THRESHOLD_METRICS:
            if name in METRICS_BY_NAME and METRICS_BY_NAME[name].kind == WATCHED:
                msg = f"{name} is information and takes no threshold; --watch-deviation PCT fails on its growth"
            elif name in METRICS_BY_NAME:
                msg = f"{name} is deterministic and compared exactly; it takes no threshold"
            else:
                msg = (
                    f"unknown metric {name!r}; thresholds apply to {', '.join(THRESHOLD_METRICS)}"
                    f"{did_you_mean(name, THRESHOLD_METRICS)}"
                )
            problems.append(Problem("--threshold", name, msg))
            continue
        v = finite_number(value)
        if v is None or v < 0:
            problems.append(Problem("--threshold", name, f"{value!r} is not a fraction >= 0 (0.05 = 5%)"))
            continue
        out[name] = v
    if problems:
        raise InputError(problems)
    return out


def check_watch_deviation(points: float | None) -> float | None:
    """`--watch-deviation PCT`: percentage points (10 = fail when |deviation| grew by more than 10 points), a
    finite number >= 0, or None (off: the deviation is information only)."""
    if points is None:
        return None
    v = finite_number(points)
    if v is None or v < 0:
        raise InputError(
            [
                Problem(
                    "--watch-deviation",
                    "",
                    f"{points!r} is not a number of percentage points >= 0 (10: fail when |{DEVIATION}| grew by "
                    "more than 10 points)",
                )
            ]
        )
    return v


def deviation_growth(baseline: float, candidate: float) -> float:
    """How much further the model is off: |candidate| − |baseline| (fraction; 0.18 = 18 points more)."""
    return abs(candidate) - abs(baseline)


def watched_deviation(growth: float, watch_deviation: float | None) -> tuple[bool, str]:
    """(a regression?, the note) for a deviation whose magnitude grew by `growth` (a fraction): a regression only
    when `watch_deviation` (points, `--watch-deviation`) is set and the growth exceeds it. compare and the
    history say it in the same words."""
    points = growth * 100
    if watch_deviation is not None and points > watch_deviation:
        return True, f"|deviation| grew by {points:.1f} points > --watch-deviation {watch_deviation:g}"
    note = f"|deviation| {'grew' if points > 0 else 'shrank'} by {abs(points):.1f} points"
    return False, note + (f" (<= --watch-deviation {watch_deviation:g})" if watch_deviation is not None else "")


def parse_thresholds(values: Sequence[str]) -> dict[str, float]:
    """`0.05` (the default) and `metric=0.10` (an override), each a fraction."""
    out: dict[str, float] = {}
    problems = []
    for text in values:
        name, sep, number = text.partition("=")
        if not sep:
            name, number = "default", text
        try:
            out[name.strip()] = float(number)
        except ValueError:
            problems.append(Problem("--threshold", text, "expected FRACTION or METRIC=FRACTION, e.g. 0.05 or mfu=0.10"))
    if problems:
        raise InputError(problems)
    return check_thresholds(out)
