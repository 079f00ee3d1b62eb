"""The metric model of `harness compare`: which record values are compared, their unit, their good direction,
and how each is judged (sampled, thresholded or exact), plus the thresholds that apply to them.

It exists so that every other part of compare (judging, rendering, the github-benchmark entries) reads a metric
from a record the same way: `metric_value` and `metric_samples` are the only readers of a record's metrics.

- sampled metrics (step time, and tokens/s, tokens/s/GPU, MFU derived from it): timing, one value per run;
  threshold + a test on the runs' values (harness.compare.judge), never on one run's per-step samples;
- thresholded (measured peak memory, one value per run): threshold only;
- exact (collective bytes per step, predicted memory and collective bytes: deterministic): any change counts;
- watched (the time model's deviation, `predicted.step_time_deviation` = measured median / predicted − 1, one
  value per run): information — shown on each side with its change in points, never a regression by itself (a
  timing change is already judged on step time), unless the user asks (`--watch-deviation PCT`: |deviation| grew
  by more than PCT points).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from harness.core.errors import InputError, Problem, did_you_mean, one_of

DEFAULT_THRESHOLD = 0.05
"""relative change (fraction) beyond which a non-deterministic metric counts as changed"""

SAMPLED, THRESHOLDED, EXACT, WATCHED = "sampled", "thresholded", "exact", "watched"
DEVIATION = "predicted.step_time_deviation"
"""the watched metric: measured median step time / predicted − 1 (fraction; 0.25 = 25% slower than predicted)"""


@dataclass(frozen=True)
class Metric:
    """One compared quantity: where it sits in a record, its unit, its good direction and how it is judged."""

    name: str
    """key in the output and in `--threshold NAME=FRACTION`"""
    path: tuple[str, ...]
    """keys from the record root to the value"""
    unit: str
    lower_is_better: bool
    kind: str
    """sampled (timing: threshold + a test on run-level values), thresholded (threshold only), exact (any change
    counts) or watched (information; a regression only when asked: `--watch-deviation`)"""
    null_reason: tuple[str, ...] | None = None
    """where a record says why the value is null (default: metrics.null_reasons.<name>)"""

    @property
    def better(self) -> str:
        return "lower" if self.lower_is_better else "higher"


METRICS: tuple[Metric, ...] = (
    Metric("step_time_s", ("metrics", "step_time_s", "median"), "s", True, SAMPLED),
    Metric("tokens_per_s", ("metrics", "tokens_per_s"), "tokens/s", False, SAMPLED),
    Metric("tokens_per_s_per_gpu", ("metrics", "tokens_per_s_per_gpu"), "tokens/s/GPU", False, SAMPLED),
    Metric("mfu", ("metrics", "mfu"), "fraction", False, SAMPLED),
    Metric("peak_memory_allocated_gib", ("metrics", "peak_memory_allocated_gib"), "GiB", True, THRESHOLDED),
    Metric("peak_memory_reserved_gib", ("metrics", "peak_memory_reserved_gib"), "GiB", True, THRESHOLDED),
    Metric("comm.bytes_per_step", ("comm", "bytes_per_step"), "bytes", True, EXACT),
    Metric("predicted.memory_gib.total", ("predicted", "memory_gib", "total"), "GiB", True, EXACT),
    Metric("predicted.comm_bytes_per_step", ("predicted", "comm_bytes_per_step"), "bytes", True, EXACT),
    # NOTE: lower_is_better: a smaller |deviation| (the model nearer the machine); the sign says which way it is off
    Metric(
        DEVIATION,
        ("predicted", "step_time_deviation"),
        "fraction",
        True,
        WATCHED,
        null_reason=("predicted", "time_null_reasons", "step_time_s"),
    ),
)
METRICS_BY_NAME = {m.name: m for m in METRICS}
THRESHOLD_METRICS = tuple(m.name for m in METRICS if m.kind in (SAMPLED, THRESHOLDED))


# --------------------------------------------------------------------------------------------------
# reading a record


def finite_number(value: Any) -> float | None:
    """`value` as a float when it is a finite int or float (not a bool), else None."""
    if type(value) is float:  # the common case, first
        return value if math.isfinite(value) else None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    value = float(value)
    return value if math.isfinite(value) else None


def value_at(rec: Mapping[str, Any], path: Sequence[str]) -> Any:
    """The value at `path` (keys from the record root), None where a key or a mapping is missing."""
    node: Any = rec
    for k in path:
        if not isinstance(node, Mapping):
            return None
        node = node.get(k)
    return node


def metric_value(rec: Mapping[str, Any], metric: Metric) -> float | None:
    return finite_number(value_at(rec, metric.path))


def step_samples(rec: Mapping[str, Any]) -> list[float]:
    """The record's per-step times (s), finite and positive ones only: what every sampled metric derives from."""
    step = value_at(rec, ("metrics", "step_time_s"))
    raw = step.get("samples") if isinstance(step, Mapping) else None
    return [x for x in (finite_number(v) for v in (raw or [])) if x is not None and x > 0]


def metric_samples(rec: Mapping[str, Any], metric: Metric, *, times: list[float] | None = None) -> list[float]:
    """Per-step samples of a sampled metric: step times as recorded; a throughput-like metric v (tokens/s,
    tokens/s/GPU, MFU — each inversely proportional to step time) as v * median_step_time / step_time_i, i.e.
    tokens per step / step time for tokens/s. `times`: the record's `step_samples`, when already read."""
    if times is None:
        times = step_samples(rec)
    if metric.name == "step_time_s":
        return times
    step = value_at(rec, ("metrics", "step_time_s"))
    value = metric_value(rec, metric)
    median = finite_number(step.get("median")) if isinstance(step, Mapping) else None
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
