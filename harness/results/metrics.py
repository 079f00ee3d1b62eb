"""Every quantity a record yields, in one registry: where it sits in the record, its unit, its good direction, how
it is judged, and its column in the report's table.

A metric is added here, once, and reaches every reader: `harness report`'s table (table.csv, table.parquet, the
frame every figure draws from: harness.report.frame), `harness compare` and its JSON/Markdown/github-benchmark
outputs (harness.compare.metrics), and the results history (harness.history: a column per stored metric, added
to an existing database when it opens for writing). tests/unit/test_metric_registry.py adds one and finds it in
all four.

Kinds (how compare and the history judge a metric):
- sampled: timing, one value per run (step time, and tokens/s, tokens/s/GPU, MFU, TFLOPS derived from it); a
  threshold plus a test on the runs' values, never on one run's per-step samples;
- thresholded: one value per run, threshold only (the allocator's measured peak memory);
- exact: deterministic (collective bytes, measured tensor memory, predicted memory and bytes): any change counts;
- watched: information (the time model's deviation), a regression only when asked (`--watch-deviation`);
- shown: the report's table only (percentiles, the predicted breakdowns, the memory categories, the loss): not
  judged, not stored.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from harness.core.typed import Typed
from harness.results.record import Record

SAMPLED, THRESHOLDED, EXACT, WATCHED, SHOWN = "sampled", "thresholded", "exact", "watched", "shown"
KINDS = (SAMPLED, THRESHOLDED, EXACT, WATCHED, SHOWN)
JUDGED = (SAMPLED, THRESHOLDED, EXACT, WATCHED)
"""the kinds compare and the history read (the others are the report's)"""


def finite_number(value: Any) -> float | None:
    """`value` as a float when it is a finite int or float (not a bool), else None."""
    if type(value) is float:  # the common case, first
        return value if math.isfinite(value) else None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    value = float(value)
    return value if math.isfinite(value) else None


def value_at(node: Any, path: Sequence[str]) -> Any:
    """The value at `path` (the file's keys from the record root; keys inside a mapping), None where a step is
    missing. Works on a typed record and on plain data alike."""
    for k in path:
        if isinstance(node, Typed):
            node = node.field(k)
        elif isinstance(node, Mapping):
            node = node.get(k)
        else:
            return None
    return node


def path_getter(path: Sequence[str]) -> Callable[[Any], Any]:
    """`value_at(node, path)` as one function, for a path read for every record (the fields' dicts directly; a
    mapping or a kept unknown field on the way takes value_at's general route)."""
    keys = tuple(path)

    def get(node: Any) -> Any:
        for i, name in enumerate(keys):
            if node is None:
                return None
            try:
                node = node.__dict__[name]
            except (KeyError, AttributeError):
                return value_at(node, keys[i:])
        return node

    get.path_keys = keys  # type: ignore[attr-defined]  # NOTE: MetricReader walks the paths it finds
    return get


def _old_fractional_rule(column: str) -> bool:
    return column.endswith(("_s", "_gib", "_per_s", "_per_gpu")) or column in ("mfu", "loss")


@dataclass(frozen=True)
class Metric:
    """One quantity of a record: where it sits, its unit, its good direction, how it is judged, its report column."""

    name: str
    """its name in compare and the history, and in `--threshold NAME=FRACTION`, `--metric NAME`"""
    path: tuple[str, ...]
    """field names from the record root to the value"""
    unit: str
    lower_is_better: bool
    kind: str
    """one of KINDS (the module docstring)"""
    column: str = ""
    """its column in the report's table (units in the name); default: `name` with dots as underscores"""
    null_reason: tuple[str, ...] | None = None
    """where a record says why the value is null (default: metrics.null_reasons.<name>)"""
    compared: bool = True
    """judged by `harness compare` (a judged kind that compare leaves out is still stored by the history)"""
    fractional: bool | None = None
    """stays a float in table.csv even when a value is whole (default: by the column's unit suffix)"""
    get: Callable[[Record], Any] | None = None
    """how to read it: `path`'s value by default (path_getter); a function for a derived value (a count)"""
    phase: str | None = None
    """the optional phase that measures it (`trace`, `checkpoint`): compare and the history leave it out of a cell where
    neither side has it, so cells that never ran the phase compare exactly as before it existed"""

    def absent_in(self, *recs: Record | None) -> bool:
        """A phase's metric that none of `recs` has (nothing to compare)."""
        return self.phase is not None and all(r is None or self.raw(r) is None for r in recs)

    def __post_init__(self) -> None:
        if self.get is None:
            object.__setattr__(self, "get", path_getter(self.path))
        if self.kind not in KINDS:
            raise ValueError(f"metric {self.name}: kind {self.kind!r} is not one of {', '.join(KINDS)}")
        if not self.column:
            object.__setattr__(self, "column", self.name.replace(".", "_"))
        if self.fractional is None:
            object.__setattr__(self, "fractional", _old_fractional_rule(self.column))

    @property
    def better(self) -> str:
        return "lower" if self.lower_is_better else "higher"

    @property
    def judged(self) -> bool:
        return self.kind in JUDGED

    def raw(self, rec: Record) -> Any:
        """The value as the record holds it (None where absent)."""
        assert self.get is not None  # NOTE: set in __post_init__
        return self.get(rec)

    def value(self, rec: Record) -> float | None:
        """The value as a finite number, or None (null, absent, or not a finite number)."""
        assert self.get is not None
        return finite_number(self.get(rec))

    def why_null(self, rec: Record) -> str | None:
        """Why the record has no value, when it says."""
        why = value_at(rec, self.null_reason or ("metrics", "null_reasons", self.name))
        return why if isinstance(why, str) else None


def _samples_count(rec: Record) -> int | None:
    step = rec.metrics.step_time_s
    n = len(step.finite_samples()) if step is not None else 0
    return n or None


def _untraced_median(rec: Record) -> float | None:
    t = rec.metrics.time_s
    steps = [v for v in map(finite_number, (t.untraced_steps or ()) if t is not None else ()) if v is not None]
    return statistics.median(steps) if steps else None


DEVIATION = "predicted.step_time_deviation"
"""the watched metric: measured median step time / predicted − 1 (fraction; 0.25 = 25% slower than predicted)"""

PREDICTED_PARTS: tuple[str, ...] = ("compute", "recompute", "optimizer", "comm_exposed", "other")
"""the parts of the predicted step time (predicted.time_s, harness.plan.time) that add up to it"""

MEASURED_PARTS: tuple[str, ...] = (*PREDICTED_PARTS, "comm_total", "step")
"""the traced step's measured breakdown (metrics.time_s, `trace: true`): the predicted parts, the communication
hidden or not, and the traced step's wall time"""
TRACE_OFF = ("metrics", "null_reasons", "time_s")
"""where an untraced record says why it has no measured breakdown"""

MEMORY_CATEGORIES: tuple[str, ...] = ("params", "grads", "optimizer", "activations", "buffers")
"""the categories of tensor memory, measured (metrics.memory_gib) and predicted (predicted.memory_gib) alike, that
add up to each side's total"""
MEMORY_OFF = ("metrics", "null_reasons", "memory_gib")
"""where a record says why it has no measured tensor memory (metrics.memory_gib)"""


def _memory_deviation(rec: Record) -> float | None:
    """Measured tensor memory over the predicted, minus one (fraction; +0.1 = 10% more than the planner said):
    None unless both totals are finite and the predicted one positive."""
    measured = rec.metrics.memory_gib
    predicted = rec.predicted.memory_gib if rec.predicted is not None else None
    m = finite_number(measured.total) if measured is not None else None
    p = finite_number(predicted.total) if predicted is not None else None
    return None if m is None or p is None or p <= 0 else m / p - 1.0


METRICS: tuple[Metric, ...] = (
    Metric("step_time_s", ("metrics", "step_time_s", "median"), "s", True, SAMPLED, column="step_time_median_s"),
    Metric("tokens_per_s", ("metrics", "tokens_per_s"), "tokens/s", False, SAMPLED),
    Metric("tokens_per_s_per_gpu", ("metrics", "tokens_per_s_per_gpu"), "tokens/s/GPU", False, SAMPLED),
    Metric("mfu", ("metrics", "mfu"), "fraction", False, SAMPLED),
    Metric("peak_memory_allocated_gib", ("metrics", "peak_memory_allocated_gib"), "GiB", True, THRESHOLDED),
    Metric("peak_memory_reserved_gib", ("metrics", "peak_memory_reserved_gib"), "GiB", True, THRESHOLDED),
    # NOTE: the live tensor bytes at the peak of one untimed step are deterministic (the same ops allocate the same
    # storages every run): exact. Its categories are the report's; a byte moving from one category to another is
    # no regression, and a change in any of them changes the total. phase: records from before the measurement
    # have none, and compare exactly as they did
    Metric(
        "memory_gib.total",
        ("metrics", "memory_gib", "total"),
        "GiB",
        True,
        EXACT,
        column="memory_total_gib",
        null_reason=MEMORY_OFF,
        phase="memory",
    ),
    Metric("comm.bytes_per_step", ("comm", "bytes_per_step"), "bytes", True, EXACT),
    Metric(
        "predicted.memory_gib.total",
        ("predicted", "memory_gib", "total"),
        "GiB",
        True,
        EXACT,
        column="predicted_memory_gib",
    ),
    Metric("predicted.comm_bytes_per_step", ("predicted", "comm_bytes_per_step"), "bytes", True, EXACT),
    # NOTE: lower_is_better: a smaller |deviation| (the model nearer the machine); the sign says which way it is off
    Metric(
        DEVIATION,
        ("predicted", "step_time_deviation"),
        "fraction",
        True,
        WATCHED,
        column="step_time_deviation",
        null_reason=("predicted", "time_null_reasons", "step_time_s"),
    ),
    # NOTE: stored by the history, not judged by compare (its verdict would repeat tokens/s's: both follow step time)
    Metric("tflops_per_gpu", ("metrics", "tflops_per_gpu"), "TFLOPS", False, SAMPLED, compared=False),
    # the traced step's measured parts (trace: true): timing, one value per run, judged on the runs like step time
    *(
        Metric(
            f"time_s.{p}",
            ("metrics", "time_s", p),
            "s",
            True,
            SAMPLED,
            column=f"measured_{p}_s",
            null_reason=TRACE_OFF,
            phase="trace",
        )
        for p in MEASURED_PARTS
    ),
    # the report's table only
    Metric("step_time_p10_s", ("metrics", "step_time_s", "p10"), "s", True, SHOWN),
    Metric("step_time_p90_s", ("metrics", "step_time_s", "p90"), "s", True, SHOWN),
    Metric("step_time_mean_s", ("metrics", "step_time_s", "mean"), "s", True, SHOWN),
    Metric("n_step_samples", ("metrics", "step_time_s", "samples"), "count", False, SHOWN, get=_samples_count),
    Metric("device_memory_gib", ("env", "device_memory_gib"), "GiB", False, SHOWN),
    # tensor memory by category, measured (metrics.memory_gib) beside predicted (predicted.memory_gib: its total is
    # predicted_memory_gib above), and how far the measured total is from the predicted one
    *(
        Metric(f"memory_{c}_gib", ("metrics", "memory_gib", c), "GiB", True, SHOWN, null_reason=MEMORY_OFF)
        for c in MEMORY_CATEGORIES
    ),
    *(
        Metric(f"predicted_memory_{c}_gib", ("predicted", "memory_gib", c), "GiB", True, SHOWN)
        for c in MEMORY_CATEGORIES
    ),
    # NOTE: lower_is_better: a smaller |deviation|, as the step time's
    Metric(
        "memory_deviation",
        ("metrics", "memory_gib", "total"),
        "fraction",
        True,
        SHOWN,
        null_reason=MEMORY_OFF,
        get=_memory_deviation,
        fractional=True,
    ),
    Metric("memory_fragmentation_gib", ("metrics", "memory_fragmentation_gib"), "GiB", True, SHOWN),
    Metric("comm_calls_per_step", ("comm", "calls_per_step"), "count", True, SHOWN),
    Metric("predicted_step_time_s", ("predicted", "step_time_s"), "s", True, SHOWN),
    *(Metric(f"predicted_{p}_s", ("predicted", "time_s", p), "s", True, SHOWN) for p in PREDICTED_PARTS),
    Metric("predicted_comm_total_s", ("predicted", "time_s", "comm_total"), "s", True, SHOWN),
    Metric("loss", ("metrics", "loss"), "nats", True, SHOWN),
    Metric("measured_spread_s", ("metrics", "time_s", "spread_s"), "s", True, SHOWN, null_reason=TRACE_OFF),
    # the traced steps' untraced neighbours (median) and the profiler's cost (traced median / theirs)
    Metric(
        "untraced_step_s",
        ("metrics", "time_s", "untraced_steps"),
        "s",
        True,
        SHOWN,
        null_reason=TRACE_OFF,
        get=_untraced_median,
    ),
    Metric(
        "profiler_cost",
        ("metrics", "time_s", "profiler_cost"),
        "ratio",
        True,
        SHOWN,
        null_reason=TRACE_OFF,
        fractional=True,
    ),
    # the checkpoint phase (`checkpoint: true` cells; absent elsewhere): times judged like timing, bytes exactly
    Metric(
        "checkpoint.save_s",
        ("metrics", "checkpoint", "save_s"),
        "s",
        True,
        SAMPLED,
        column="checkpoint_save_s",
        phase="checkpoint",
    ),
    Metric(
        "checkpoint.load_s",
        ("metrics", "checkpoint", "load_s"),
        "s",
        True,
        SAMPLED,
        column="checkpoint_load_s",
        phase="checkpoint",
    ),
    Metric(
        "checkpoint.bytes",
        ("metrics", "checkpoint", "bytes"),
        "bytes",
        True,
        EXACT,
        column="checkpoint_bytes",
        phase="checkpoint",
    ),
    Metric(
        "predicted.checkpoint_bytes",
        ("predicted", "checkpoint_bytes"),
        "bytes",
        True,
        EXACT,
        column="predicted_checkpoint_bytes",
        null_reason=("predicted", "checkpoint_null_reasons", "checkpoint_bytes"),
        phase="checkpoint",
    ),
    Metric("checkpoint_files", ("metrics", "checkpoint", "files"), "count", True, SHOWN),
    Metric(
        "resume_loss_delta",
        ("metrics", "checkpoint", "resume_loss_delta"),
        "nats",
        True,
        SHOWN,
        null_reason=("metrics", "null_reasons", "checkpoint.resume_loss_delta"),
    ),
    Metric(
        "predicted_checkpoint_s",
        ("predicted", "checkpoint_s"),
        "s",
        True,
        SHOWN,
        null_reason=("predicted", "checkpoint_null_reasons", "checkpoint_s"),
    ),
)
"""every quantity, in the order compare lists the judged ones (then the report's own)"""
METRICS_BY_NAME: dict[str, Metric] = {m.name: m for m in METRICS}
STORED: tuple[Metric, ...] = tuple(m for m in METRICS if m.judged)
"""what the history stores per run"""
COMPARED: tuple[Metric, ...] = tuple(m for m in STORED if m.compared)
"""what `harness compare` judges"""


def register(metric: Metric) -> None:
    """Add a metric to the registry (a site's own quantity, or a test's), before the read side is imported: the
    report, compare and the history take their views of the registry when they are imported."""
    global METRICS, METRICS_BY_NAME, STORED, COMPARED
    if metric.name in METRICS_BY_NAME or any(m.column == metric.column for m in METRICS):
        raise ValueError(f"metric {metric.name!r} (column {metric.column!r}) is already registered")
    METRICS = (*METRICS, metric)
    METRICS_BY_NAME = {m.name: m for m in METRICS}
    STORED = tuple(m for m in METRICS if m.judged)
    COMPARED = tuple(m for m in STORED if m.compared)


class MetricReader:
    """Many metrics read from each of many records (a report's every column, compare's every judged metric): the
    paths walked as one tree, so a shared prefix (`metrics.step_time_s.` of five quantities) is reached once per
    record, and a missing part (no `metrics.time_s` in an untraced record) skips every metric under it. The values
    are each metric's `value(rec)`, in the order given (tests/unit/test_metric_registry.py holds them equal)."""

    def __init__(self, metrics: tuple[Metric, ...]) -> None:
        self.metrics = metrics
        self._tree: dict[str, tuple[dict, list[int]]] = {}
        self._derived: list[tuple[int, Callable[[Any], Any]]] = []
        for i, m in enumerate(self.metrics):
            keys = getattr(m.get, "path_keys", None)
            if not keys:
                assert m.get is not None  # NOTE: set in Metric.__post_init__
                self._derived.append((i, m.get))
                continue
            node = self._tree
            for k in keys[:-1]:
                node = node.setdefault(k, ({}, []))[0]
            node.setdefault(keys[-1], ({}, []))[1].append(i)

    def of(self, metrics: tuple[Metric, ...]) -> MetricReader:
        """This reader when it reads `metrics` (the very tuple), else a new one for them: a read side keeps one
        reader of its view of the registry and asks it this before each use, so a metric registered (a test's, a
        site's) after the reader was made is read too."""
        return self if metrics is self.metrics else MetricReader(metrics)

    def values(self, rec: Record) -> list[float | None]:
        """Every metric's value of `rec` (a finite number or None), in the reader's order."""
        out: list[float | None] = [None] * len(self.metrics)
        _walk(rec, self._tree, out)
        for i, get in self._derived:
            out[i] = finite_number(get(rec))
        return out


def _walk(node: Any, tree: dict[str, tuple[dict, list[int]]], out: list[float | None]) -> None:
    for key, (sub, leaves) in tree.items():
        try:
            child = node.__dict__[key]
        except (KeyError, AttributeError):  # NOTE: a mapping, or a kept unknown field: value_at's general route
            child = value_at(node, (key,))
        if child is None:
            continue
        for i in leaves:
            out[i] = finite_number(child)
        if sub:
            _walk(child, sub, out)


def step_samples(rec: Record) -> list[float]:
    """The record's per-step times (s), finite and positive ones only: what every sampled metric derives from."""
    step = rec.metrics.step_time_s
    if step is None:
        return []
    return [x for x in (finite_number(v) for v in step.samples or ()) if x is not None and x > 0]
