"""`harness compare BASELINE CANDIDATE`: per-cell regressions between two result sets.

Cells are matched by their `spec` (canonical JSON), never by folder, file name or sweep name, so a renamed sweep
or a re-organised results tree still lines up. For each matched cell and metric the candidate/baseline ratio is
judged in the metric's direction:

- sampled metrics (step time, and tokens/s, tokens/s/GPU, MFU derived from it): a regression only when the
  change is beyond the metric's threshold (default 5%) AND a two-sided Mann–Whitney U test on the per-step
  samples gives p < alpha (default 0.05), as asv does; with fewer than `min_samples` samples on a side a change
  beyond the threshold is "insufficient samples", not a regression;
- measured peak memory (one value per run): thresholded, no test;
- deterministic metrics (collective bytes per step, predicted memory and collective bytes): exact; any change
  is a regression in the bad direction and an improvement in the good one;
- a null metric on either side is "n/a", never a regression.

A cell that is ok in the baseline and not ok in the candidate is a regression ("newly failing"); the reverse is
an improvement ("newly fixed"). Cells only in one set are listed as added / missing.

Thresholds are symmetric in log space: with threshold t a metric regresses when it got worse by more than a
factor 1+t (step time x1.05, or tokens/s /1.05), so step time and the throughput derived from it agree.

Exit codes: 0 no regression, 1 regression (or a missing cell with --fail-on-missing), 2 bad input.
Pure: no torch import; scipy is imported where the test runs.
"""

from __future__ import annotations

import ctypes
import dataclasses
import errno
import hashlib
import json
import math
import os
import shutil
import statistics
import sys
import tempfile
import warnings
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import click

from harness.core.errors import InputError, Problem, did_you_mean, one_of
from harness.results.store import (SCHEMA_VERSION, atomic_write_json, atomic_write_text, iter_record_files, load_records,
                             utc_now)

DEFAULT_THRESHOLD = 0.05
"""relative change (fraction) beyond which a non-deterministic metric counts as changed"""
DEFAULT_ALPHA = 0.05
"""two-sided Mann–Whitney U significance level for sampled metrics"""
DEFAULT_MIN_SAMPLES = 5
"""per-step samples needed on each side before a sampled metric can be called a regression"""

SAMPLED, THRESHOLDED, EXACT = "sampled", "thresholded", "exact"

# verdicts of one metric of one matched cell
REGRESSION = "regression"
IMPROVEMENT = "improvement"
UNCHANGED = "unchanged"
NOT_SIGNIFICANT = "not significant"
INSUFFICIENT = "insufficient samples"
NA = "n/a"

# states of one cell
MISSING = "missing"            # only in the baseline
ADDED = "added"                # only in the candidate
BOTH_OK = "ok"
NEWLY_FAILING = "newly failing"
NEWLY_FIXED = "newly fixed"
STILL_FAILING = "still failing"

ENV_KEYS = ("device_name", "torch", "cuda", "nccl", "deepspeed")
"""environment fields whose change is noted beside a matched cell (it often explains a regression)"""
PROMOTED_FILE = ".promoted.json"
"""provenance written into a promoted baseline (hidden, so record loading skips it)"""


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
    """sampled (threshold + Mann–Whitney U), thresholded (threshold only) or exact (any change counts)"""

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
)
METRICS_BY_NAME = {m.name: m for m in METRICS}
THRESHOLD_METRICS = tuple(m.name for m in METRICS if m.kind != EXACT)

# github-action-benchmark: measured metrics only (predicted ones are model arithmetic, not measurements)
BENCHMARK_METRICS = {
    "smaller": ("step_time_s", "peak_memory_allocated_gib", "peak_memory_reserved_gib", "comm.bytes_per_step"),
    "bigger": ("tokens_per_s", "tokens_per_s_per_gpu", "mfu"),
}
BENCHMARK_FILES = {"smaller": "benchmark-smaller.json", "bigger": "benchmark-bigger.json"}
FORMAT_FILES = {"table": "compare.txt", "md": "compare.md", "json": "compare.json"}


# --------------------------------------------------------------------------------------------------
# results of a comparison


@dataclass
class MetricComparison:
    """One metric of one matched cell."""

    metric: str
    unit: str
    better: str
    """lower or higher"""
    kind: str
    baseline: float | None
    candidate: float | None
    verdict: str
    ratio: float | None = None
    """candidate / baseline (None when the baseline is 0 or either side is null)"""
    threshold: float | None = None
    """fraction; None for exact metrics"""
    p_value: float | None = None
    """two-sided Mann–Whitney U on the per-step samples (sampled metrics with enough samples)"""
    n_baseline: int | None = None
    """per-step samples in the baseline (sampled metrics)"""
    n_candidate: int | None = None
    note: str = ""

    @property
    def change(self) -> float | None:
        """ratio - 1 (fraction; +0.2 = 20% larger)."""
        return None if self.ratio is None else self.ratio - 1.0

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["change"] = self.change
        if self.baseline is not None and self.candidate is not None:
            d["delta"] = self.candidate - self.baseline
        return d


@dataclass
class CellComparison:
    """One cell (one spec) across the two sets."""

    key: str
    """canonical JSON of the spec (without ignored keys): the match key"""
    label: str
    """readable name: model strategy precision gN, plus the spec keys that tell same-named cells apart"""
    spec: dict[str, Any]
    state: str
    """missing, added, ok, newly failing, newly fixed or still failing"""
    baseline: dict[str, Any] | None = None
    candidate: dict[str, Any] | None = None
    metrics: list[MetricComparison] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def baseline_status(self) -> str | None:
        return None if self.baseline is None else self.baseline.get("status")

    @property
    def candidate_status(self) -> str | None:
        return None if self.candidate is None else self.candidate.get("status")

    def reason(self, side: str) -> str:
        rec = self.baseline if side == "baseline" else self.candidate
        return str((rec or {}).get("reason") or "")

    def to_dict(self) -> dict[str, Any]:
        return {
            "label": self.label,
            "state": self.state,
            "spec": self.spec,
            "baseline": _record_ref(self.baseline),
            "candidate": _record_ref(self.candidate),
            "notes": self.notes,
            "metrics": [m.to_dict() for m in self.metrics],
        }


def _record_ref(rec: dict[str, Any] | None) -> dict[str, Any] | None:
    if rec is None:
        return None
    return {k: rec.get(k) for k in ("run_id", "sweep", "cluster", "status", "reason", "_path")}


@dataclass
class Comparison:
    """Everything `harness compare` found; `exit_code()` is what the command returns."""

    cells: list[CellComparison]
    thresholds: dict[str, float]
    """"default" plus per-metric overrides (fractions)"""
    alpha: float
    min_samples: int
    baseline_sources: list[str] = field(default_factory=list)
    candidate_sources: list[str] = field(default_factory=list)
    baseline_records: int = 0
    candidate_records: int = 0
    warnings: list[str] = field(default_factory=list)

    def _rows(self, verdict: str) -> list[tuple[CellComparison, MetricComparison]]:
        return [(c, m) for c in self.cells for m in c.metrics if m.verdict == verdict]

    def _cells(self, state: str) -> list[CellComparison]:
        return [c for c in self.cells if c.state == state]

    @property
    def regressions(self) -> list[tuple[CellComparison, MetricComparison]]:
        return self._rows(REGRESSION)

    @property
    def improvements(self) -> list[tuple[CellComparison, MetricComparison]]:
        return self._rows(IMPROVEMENT)

    @property
    def insufficient(self) -> list[tuple[CellComparison, MetricComparison]]:
        return self._rows(INSUFFICIENT)

    @property
    def not_significant(self) -> list[tuple[CellComparison, MetricComparison]]:
        return self._rows(NOT_SIGNIFICANT)

    @property
    def matched(self) -> list[CellComparison]:
        return [c for c in self.cells if c.baseline is not None and c.candidate is not None]

    @property
    def added(self) -> list[CellComparison]:
        return self._cells(ADDED)

    @property
    def missing(self) -> list[CellComparison]:
        return self._cells(MISSING)

    @property
    def newly_failing(self) -> list[CellComparison]:
        return self._cells(NEWLY_FAILING)

    @property
    def newly_fixed(self) -> list[CellComparison]:
        return self._cells(NEWLY_FIXED)

    @property
    def still_failing(self) -> list[CellComparison]:
        return self._cells(STILL_FAILING)

    @property
    def has_regression(self) -> bool:
        return bool(self.regressions or self.newly_failing)

    def exit_code(self, *, fail_on_missing: bool = False) -> int:
        return 1 if self.has_regression or (fail_on_missing and self.missing) else 0

    def cell(self, label: str) -> CellComparison:
        """The cell with this label (KeyError when there is none): for tests and scripts."""
        for c in self.cells:
            if c.label == label:
                return c
        raise KeyError(label)

    def summary(self) -> dict[str, int]:
        return {
            "matched": len(self.matched),
            "added": len(self.added),
            "missing": len(self.missing),
            "regressions": len(self.regressions) + len(self.newly_failing),
            "metric_regressions": len(self.regressions),
            "newly_failing": len(self.newly_failing),
            "improvements": len(self.improvements) + len(self.newly_fixed),
            "metric_improvements": len(self.improvements),
            "newly_fixed": len(self.newly_fixed),
            "still_failing": len(self.still_failing),
            "insufficient_samples": len(self.insufficient),
            "not_significant": len(self.not_significant),
        }

    def to_dict(self) -> dict[str, Any]:
        return {
            "format": "harness.compare.compare",
            "version": 1,
            "baseline": {"sources": self.baseline_sources, "records": self.baseline_records},
            "candidate": {"sources": self.candidate_sources, "records": self.candidate_records},
            "settings": {"thresholds": self.thresholds, "alpha": self.alpha, "min_samples": self.min_samples},
            "regression": self.has_regression,
            "summary": self.summary(),
            "warnings": self.warnings,
            "cells": [c.to_dict() for c in self.cells],
        }


# --------------------------------------------------------------------------------------------------
# matching


def _canonical(obj: Any) -> Any:
    """Spec values normalised so that 900 and 900.0 (YAML vs dataclass) match."""
    if isinstance(obj, float) and obj.is_integer():
        return int(obj)
    if isinstance(obj, dict):
        return {str(k): _canonical(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_canonical(v) for v in obj]
    return obj


def spec_key(spec: Mapping[str, Any], *, ignore: Iterable[str] = ()) -> str:
    """The match key of a cell: canonical JSON of its spec, minus `ignore`d top-level keys and minus
    settings at their default (RunSpec.identity's rule: a setting added later, at its default, still
    matches records written before it existed)."""
    from harness.scenario.schema import SETTING_FIELDS, canonical_setting

    ignored = set(ignore)
    spec = {k: canonical_setting(k, v) for k, v in spec.items()}
    kept = {k: v for k, v in spec.items() if k not in ignored
            and not (k in SETTING_FIELDS and _canonical(v) == _canonical(SETTING_FIELDS[k].default))}
    return json.dumps(_canonical(kept), sort_keys=True, separators=(",", ":"))


def _where(rec: Mapping[str, Any]) -> str:
    return str(rec.get("_path") or rec.get("run_id") or "<record>")


def _index(records: Iterable[Mapping[str, Any]], *, side: str, ignore: Iterable[str],
           warnings_out: list[str]) -> dict[str, dict[str, Any]]:
    """key → record; of several records with one spec the one finished last wins (a rerun), with a warning."""
    ignore = tuple(ignore)
    groups: dict[str, list[dict[str, Any]]] = {}
    for rec in records:
        spec = rec.get("spec")
        if not isinstance(spec, dict):
            warnings_out.append(f"{_where(rec)}: {side}: 'spec' is not a mapping; record skipped")
            continue
        groups.setdefault(spec_key(spec, ignore=ignore), []).append(dict(rec))
    chosen: dict[str, dict[str, Any]] = {}
    for key, recs in groups.items():
        recs.sort(key=lambda r: str(r.get("finished_at") or ""))
        chosen[key] = recs[-1]
        if len(recs) > 1:
            others = ", ".join(_where(r) for r in recs[:-1])
            warnings_out.append(f"{side}: {len(recs)} records for one spec; using the one finished last "
                                f"({_where(recs[-1])}), ignoring {others}")
    return chosen


def _short(value: Any) -> str:
    if isinstance(value, (dict, list)):
        return json.dumps(value, sort_keys=True, separators=(",", ":"))
    return str(value)


def _labels(specs: dict[str, dict[str, Any]]) -> dict[str, str]:
    """key → label; cells sharing `model strategy precision gN` get the spec keys that differ among them."""
    core = {k: f"{s.get('model')} {s.get('strategy')} {s.get('precision')} g{s.get('world_size')}"
            for k, s in specs.items()}
    groups: dict[str, list[str]] = {}
    for k, name in core.items():
        groups.setdefault(name, []).append(k)
    labels: dict[str, str] = {}
    for name, keys in groups.items():
        if len(keys) == 1:
            labels[keys[0]] = name
            continue
        all_keys = sorted({sk for k in keys for sk in specs[k]})
        differing = [sk for sk in all_keys
                     if len({_short(_canonical(specs[k].get(sk))) for k in keys}) > 1]
        for k in keys:
            extra = " ".join(f"{sk}={_short(specs[k].get(sk))}" for sk in differing)
            labels[k] = f"{name} {extra}".strip()
    if len(set(labels.values())) < len(labels):  # cannot happen for distinct canonical specs; be safe anyway
        labels = {k: f"{v} #{i}" for i, (k, v) in enumerate(sorted(labels.items(), key=lambda kv: kv[1]))}
    return labels


def spec_differences(a: Mapping[str, Any], b: Mapping[str, Any]) -> list[str]:
    """`key: a → b` for every top-level spec key whose value differs."""
    out = []
    for k in sorted(set(a) | set(b)):
        va, vb = _canonical(a.get(k)), _canonical(b.get(k))
        if va != vb:
            out.append(f"{k}: {_short(a.get(k, '<absent>'))} → {_short(b.get(k, '<absent>'))}")
    return out


# --------------------------------------------------------------------------------------------------
# judging one metric


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    value = float(value)
    return value if math.isfinite(value) else None


def _get(rec: Mapping[str, Any], path: Sequence[str]) -> Any:
    node: Any = rec
    for k in path:
        if not isinstance(node, Mapping):
            return None
        node = node.get(k)
    return node


def metric_value(rec: Mapping[str, Any], metric: Metric) -> float | None:
    return _number(_get(rec, metric.path))


def metric_samples(rec: Mapping[str, Any], metric: Metric) -> list[float]:
    """Per-step samples of a sampled metric: step times as recorded; a throughput-like metric v (tokens/s,
    tokens/s/GPU, MFU — each inversely proportional to step time) as v * median_step_time / step_time_i, i.e.
    tokens per step / step time for tokens/s."""
    step = _get(rec, ("metrics", "step_time_s"))
    raw = step.get("samples") if isinstance(step, Mapping) else None
    times = [x for x in (_number(v) for v in (raw or [])) if x is not None and x > 0]
    if metric.name == "step_time_s":
        return times
    value = metric_value(rec, metric)
    median = _number(step.get("median")) if isinstance(step, Mapping) else None
    if value is None or not median:
        return []
    per_step = value * median  # e.g. tokens per step for tokens/s
    return [per_step / t for t in times]


def mann_whitney_p(xs: Sequence[float], ys: Sequence[float]) -> float:
    """Two-sided Mann–Whitney U p-value; 1.0 when the test is undefined (every sample equal)."""
    from scipy.stats import mannwhitneyu

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        p = float(mannwhitneyu(xs, ys, alternative="two-sided").pvalue)
    return p if math.isfinite(p) else 1.0


def _worse_factor(metric: Metric, b: float, c: float) -> float:
    """How many times worse the candidate is (>1 worse, <1 better), symmetric for both directions."""
    if b == c:
        return 1.0
    if b > 0 and c > 0:
        return c / b if metric.lower_is_better else b / c
    worse = (c > b) == metric.lower_is_better
    return math.inf if worse else 0.0


def _null_note(rec: Mapping[str, Any], metric: Metric, side: str) -> str:
    why = _get(rec, ("metrics", "null_reasons", metric.name))
    return f"null in {side}" + (f" ({why})" if why else "")


def compare_metric(metric: Metric, baseline: Mapping[str, Any], candidate: Mapping[str, Any], *,
                   threshold: float, alpha: float, min_samples: int) -> MetricComparison:
    """Judge one metric of one matched, both-ok cell."""
    b, c = metric_value(baseline, metric), metric_value(candidate, metric)
    row = MetricComparison(metric=metric.name, unit=metric.unit, better=metric.better, kind=metric.kind,
                           baseline=b, candidate=c, verdict=NA,
                           threshold=None if metric.kind == EXACT else threshold)
    if b is None or c is None:
        notes = [_null_note(rec, metric, side) for rec, side, v in
                 ((baseline, "baseline", b), (candidate, "candidate", c)) if v is None]
        if len(notes) == 2 and notes[0].removeprefix("null in baseline") == notes[1].removeprefix("null in candidate"):
            notes = ["null on both sides" + notes[0].removeprefix("null in baseline")]
        row.note = "; ".join(notes)
        return row
    row.ratio = c / b if b != 0 else (1.0 if c == 0 else None)
    factor = _worse_factor(metric, b, c)
    if metric.kind == EXACT:
        row.verdict = UNCHANGED if b == c else (REGRESSION if factor > 1 else IMPROVEMENT)
        return row

    if metric.kind == SAMPLED:
        xs, ys = metric_samples(baseline, metric), metric_samples(candidate, metric)
        row.n_baseline, row.n_candidate = len(xs), len(ys)
        if len(xs) >= min_samples and len(ys) >= min_samples:
            row.p_value = mann_whitney_p(xs, ys)
    worse, better = factor > 1 + threshold, factor < 1 / (1 + threshold)
    if not (worse or better):
        row.verdict = UNCHANGED
    elif metric.kind == THRESHOLDED:
        row.verdict = REGRESSION if worse else IMPROVEMENT
    elif row.p_value is None:
        row.verdict = INSUFFICIENT
        row.note = (f"{row.n_baseline} baseline / {row.n_candidate} candidate samples; "
                    f"{min_samples} per side needed for the test")
    elif row.p_value < alpha:
        row.verdict = REGRESSION if worse else IMPROVEMENT
    else:
        row.verdict = NOT_SIGNIFICANT
        row.note = f"p={row.p_value:.3g} >= alpha {alpha:g}: the samples overlap"
    return row


# --------------------------------------------------------------------------------------------------
# comparing two sets


def check_thresholds(thresholds: Mapping[str, float] | None) -> dict[str, float]:
    """{"default": fraction, metric: fraction, ...}; InputError for unknown/exact metrics or bad values."""
    out = {"default": DEFAULT_THRESHOLD}
    problems = []
    for name, value in (thresholds or {}).items():
        if name != "default" and name not in THRESHOLD_METRICS:
            if name in METRICS_BY_NAME:
                msg = f"{name} is deterministic and compared exactly; it takes no threshold"
            else:
                msg = (f"unknown metric {name!r}; thresholds apply to {', '.join(THRESHOLD_METRICS)}"
                       f"{did_you_mean(name, THRESHOLD_METRICS)}")
            problems.append(Problem("--threshold", name, msg))
            continue
        v = _number(value)
        if v is None or v < 0:
            problems.append(Problem("--threshold", name, f"{value!r} is not a fraction >= 0 (0.05 = 5%)"))
            continue
        out[name] = v
    if problems:
        raise InputError(problems)
    return out


def compare(baseline_records: Iterable[Mapping[str, Any]], candidate_records: Iterable[Mapping[str, Any]], *,
            thresholds: Mapping[str, float] | None = None, alpha: float = DEFAULT_ALPHA,
            min_samples: int = DEFAULT_MIN_SAMPLES, ignore_spec_keys: Iterable[str] = (),
            baseline_sources: Sequence[str] = (), candidate_sources: Sequence[str] = (),
            metrics: Iterable[str] | None = None) -> Comparison:
    """Match two record sets by spec and judge every metric of every cell (or only `metrics`, by name).

    `thresholds` maps metric name (see METRICS) → fraction, with "default" for the rest (0.05 when absent).
    `ignore_spec_keys` are top-level spec keys left out of matching (e.g. time_limit_s after raising it).
    """
    if not 0 < alpha < 1:
        raise InputError([Problem("--alpha", "", f"{alpha!r} is not in (0, 1)")])
    if min_samples < 1:
        raise InputError([Problem("--min-samples", "", f"{min_samples!r} is below 1")])
    limits = check_thresholds(thresholds)
    judged = select_metrics(metrics)
    base_list, cand_list = list(baseline_records), list(candidate_records)
    notes: list[str] = []
    base = _index(base_list, side="baseline", ignore=ignore_spec_keys, warnings_out=notes)
    cand = _index(cand_list, side="candidate", ignore=ignore_spec_keys, warnings_out=notes)
    specs = {k: r["spec"] for k, r in base.items()}
    specs.update({k: r["spec"] for k, r in cand.items()})
    labels = _labels(specs)

    cells = []
    for key in sorted(specs, key=lambda k: labels[k]):
        b, c = base.get(key), cand.get(key)
        cell = CellComparison(key=key, label=labels[key], spec=specs[key], state=BOTH_OK, baseline=b, candidate=c)
        if c is None:
            cell.state = MISSING
        elif b is None:
            cell.state = ADDED
        else:
            b_ok, c_ok = b.get("status") == "ok", c.get("status") == "ok"
            cell.state = {(True, True): BOTH_OK, (True, False): NEWLY_FAILING,
                          (False, True): NEWLY_FIXED, (False, False): STILL_FAILING}[(b_ok, c_ok)]
            cell.notes.extend(_env_notes(b, c))
            if cell.state == BOTH_OK:
                cell.metrics = [compare_metric(m, b, c, threshold=limits.get(m.name, limits["default"]),
                                               alpha=alpha, min_samples=min_samples) for m in judged]
        cells.append(cell)
    _note_near_misses(cells)
    return Comparison(cells=cells, thresholds=limits, alpha=alpha, min_samples=min_samples,
                      baseline_sources=list(baseline_sources), candidate_sources=list(candidate_sources),
                      baseline_records=len(base_list), candidate_records=len(cand_list), warnings=notes)


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


def _env_notes(b: Mapping[str, Any], c: Mapping[str, Any]) -> list[str]:
    out = []
    for k in ENV_KEYS:
        vb, vc = _get(b, ("env", k)), _get(c, ("env", k))
        if vb != vc and (vb is not None or vc is not None):
            out.append(f"env.{k}: {vb} → {vc}")
    if b.get("cluster") != c.get("cluster"):
        out.append(f"cluster: {b.get('cluster')} → {c.get('cluster')}")
    return out


def _note_near_misses(cells: list[CellComparison]) -> None:
    """A missing cell whose spec differs from an added one in a few keys is probably the same cell, edited."""
    added = [c for c in cells if c.state == ADDED]
    for cell in cells:
        if cell.state != MISSING or not added:
            continue
        best = min(added, key=lambda a: len(spec_differences(cell.spec, a.spec)))
        diffs = spec_differences(cell.spec, best.spec)
        if len(diffs) <= 3:
            cell.notes.append(f"closest added cell {best.label!r} differs in {'; '.join(diffs)} "
                              "(--ignore-spec-key KEY matches across it)")


# --------------------------------------------------------------------------------------------------
# formatting


def _fmt_value(unit: str, v: float | None, digits: int = 4) -> str:
    if v is None:
        return "null"
    if unit == "s":
        return f"{v * 1e3:.{digits}g} ms" if abs(v) < 1 else f"{v:.{digits}g} s"
    if unit == "bytes":
        return f"{int(v):,} B" if float(v).is_integer() else f"{v:.{digits}g} B"
    if unit == "fraction":
        return f"{v * 100:.{max(digits - 2, 1)}f}%"
    if unit.startswith("tokens"):
        return f"{v:,.0f}" if abs(v) >= 1000 and digits <= 6 else f"{v:.{digits}g}"
    return f"{v:.{digits}g} {unit}"


def _fmt_pair(row: MetricComparison) -> tuple[str, str]:
    """Baseline and candidate formatted with enough digits that different values never print the same."""
    for digits in (4, 6, 9, 12, 17):
        b, c = _fmt_value(row.unit, row.baseline, digits), _fmt_value(row.unit, row.candidate, digits)
        if b != c or row.baseline == row.candidate:
            return b, c
    return b, c


def _fmt_change(row: MetricComparison) -> tuple[str, str]:
    """(ratio, change): exact metrics show the delta in their unit, others the relative change."""
    if row.baseline is None or row.candidate is None:
        return "-", "-"
    ratio = "-" if row.ratio is None else f"{row.ratio:.3f}x"
    if row.kind == EXACT:
        delta = row.candidate - row.baseline
        if row.unit == "bytes" and float(delta).is_integer():
            return ratio, f"{int(delta):+,} B"
        return ratio, f"{delta:+.6g} {row.unit}"
    return ratio, "-" if row.change is None else f"{row.change * 100:+.1f}%"


def _fmt_p(row: MetricComparison) -> str:
    return "-" if row.p_value is None else f"{row.p_value:.2g}"


def _fmt_threshold(limits: Mapping[str, float]) -> str:
    text = f"{limits['default'] * 100:g}%"
    extra = [f"{k} {v * 100:g}%" for k, v in limits.items() if k != "default"]
    return text + (f" ({', '.join(extra)})" if extra else "")


NOTABLE = (REGRESSION, IMPROVEMENT, INSUFFICIENT, NOT_SIGNIFICANT)
_ORDER = {REGRESSION: 0, INSUFFICIENT: 1, NOT_SIGNIFICANT: 2, IMPROVEMENT: 3, UNCHANGED: 4, NA: 5}


def _metric_rows(cmp: Comparison, *, all_rows: bool) -> list[tuple[CellComparison, MetricComparison]]:
    rows = [(c, m) for c in cmp.cells for m in c.metrics if all_rows or m.verdict in NOTABLE]
    if not all_rows:
        rows.sort(key=lambda cm: _ORDER[cm[1].verdict])  # stable: cell order within a verdict
    return rows


def _row_cells(cell: CellComparison, m: MetricComparison) -> list[str]:
    b, c = _fmt_pair(m)
    ratio, change = _fmt_change(m)
    return [cell.label, m.metric, b, c, ratio, change, _fmt_p(m), m.verdict + (f" ({m.note})" if m.note else "")]


HEADERS = ["cell", "metric", "baseline", "candidate", "ratio", "change", "p", "verdict"]


def _verdict_line(cmp: Comparison, *, fail_on_missing: bool) -> str:
    s = cmp.summary()
    code = cmp.exit_code(fail_on_missing=fail_on_missing)
    parts = [f"{s['regressions']} regression(s) ({s['metric_regressions']} metric, {s['newly_failing']} newly "
             f"failing cell(s))", f"{s['improvements']} improvement(s)"]
    if s["insufficient_samples"]:
        parts.append(f"{s['insufficient_samples']} change(s) with insufficient samples")
    if s["not_significant"]:
        parts.append(f"{s['not_significant']} change(s) not significant")
    if fail_on_missing and s["missing"]:
        parts.append(f"{s['missing']} missing cell(s) (--fail-on-missing)")
    return "result: " + ", ".join(parts) + f" → exit {code}"


def _cell_sections(cmp: Comparison) -> list[tuple[str, list[str]]]:
    def failing(c: CellComparison) -> str:
        return f"{c.label}: {c.baseline_status} → {c.candidate_status}" + (
            f" ({c.reason('candidate')})" if c.reason("candidate") else "")

    def fixed(c: CellComparison) -> str:
        return f"{c.label}: {c.baseline_status} → ok" + (
            f" (was: {c.reason('baseline')})" if c.reason("baseline") else "")

    def still(c: CellComparison) -> str:
        return f"{c.label}: {c.baseline_status} → {c.candidate_status}" + (
            f" ({c.reason('candidate')})" if c.reason("candidate") else "")

    def plain(c: CellComparison) -> str:
        rec = c.baseline or c.candidate or {}
        return f"{c.label} [{rec.get('status')}]" + (f" — {'; '.join(c.notes)}" if c.notes else "")

    return [
        ("newly failing (regression)", [failing(c) for c in cmp.newly_failing]),
        ("newly fixed (improvement)", [fixed(c) for c in cmp.newly_fixed]),
        ("missing (only in baseline)", [plain(c) for c in cmp.missing]),
        ("added (only in candidate)", [plain(c) for c in cmp.added]),
        ("still failing", [still(c) for c in cmp.still_failing]),
        # an ok candidate's note is a caveat on the numbers compared above (e.g. a recompilation timed as step time)
        ("candidate ok cells with a note", [f"{c.label}: {c.reason('candidate')}" for c in cmp.cells
                                            if c.candidate is not None and c.candidate_status == "ok"
                                            and c.reason("candidate")]),
    ]


def _sources(paths: Sequence[str]) -> str:
    return ", ".join(paths) if paths else "<records>"


def render_table(cmp: Comparison, *, all_rows: bool = False, fail_on_missing: bool = False) -> str:
    """Plain-text report for a terminal."""
    s = cmp.summary()
    lines = [
        f"baseline:  {_sources(cmp.baseline_sources)} ({cmp.baseline_records} records)",
        f"candidate: {_sources(cmp.candidate_sources)} ({cmp.candidate_records} records)",
        f"threshold {_fmt_threshold(cmp.thresholds)}; Mann–Whitney U alpha {cmp.alpha:g}, "
        f">= {cmp.min_samples} samples per side; {s['matched']} matched, {s['added']} added, "
        f"{s['missing']} missing",
        "",
    ]
    rows = _metric_rows(cmp, all_rows=all_rows)
    if rows:
        table = [HEADERS] + [_row_cells(c, m) for c, m in rows]
        widths = [max(len(r[i]) for r in table) for i in range(len(HEADERS) - 1)]
        for r in table:
            lines.append("  ".join(v.ljust(w) for v, w in zip(r, widths)) + "  " + r[-1])
    else:
        lines.append("no metric changed beyond its threshold")
    for title, items in _cell_sections(cmp):
        if items:
            lines += ["", f"{title} ({len(items)}):"] + [f"  {i}" for i in items]
    notes = [(c.label, n) for c in cmp.matched for n in c.notes if c.state == BOTH_OK]
    if notes and (cmp.regressions or all_rows):
        lines += ["", "environment changes:"] + [f"  {label}: {n}" for label, n in notes]
    if cmp.warnings:
        lines += ["", "warnings:"] + [f"  {w}" for w in cmp.warnings]
    lines += ["", _verdict_line(cmp, fail_on_missing=fail_on_missing)]
    return "\n".join(lines) + "\n"


def _md_escape(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _md_table(rows: list[list[str]]) -> list[str]:
    out = ["| " + " | ".join(HEADERS) + " |", "|" + "|".join("---" for _ in HEADERS) + "|"]
    out += ["| " + " | ".join(_md_escape(v) for v in r) + " |" for r in rows]
    return out


def render_markdown(cmp: Comparison, *, all_rows: bool = False, fail_on_missing: bool = False) -> str:
    """GitHub-flavoured Markdown for $GITHUB_STEP_SUMMARY and PR comments."""
    s = cmp.summary()
    code = cmp.exit_code(fail_on_missing=fail_on_missing)
    head = (f"🔴 {s['regressions']} regression(s)" if cmp.has_regression
            else "🟠 missing cells" if code else "🟢 no regressions")
    lines = [
        f"## Benchmark comparison: {head}",
        "",
        f"Baseline `{_sources(cmp.baseline_sources)}` ({cmp.baseline_records} records) vs candidate "
        f"`{_sources(cmp.candidate_sources)}` ({cmp.candidate_records} records). "
        f"Threshold {_fmt_threshold(cmp.thresholds)}; sampled metrics also need a two-sided Mann–Whitney U "
        f"p < {cmp.alpha:g} with >= {cmp.min_samples} samples per side; deterministic metrics compare exactly.",
        "",
        f"**{s['matched']}** matched · **{s['added']}** added · **{s['missing']}** missing · "
        f"**{s['regressions']}** regressions · **{s['improvements']}** improvements · "
        f"**{s['insufficient_samples']}** insufficient samples · **{s['not_significant']}** not significant",
        "",
    ]
    notable = _metric_rows(cmp, all_rows=False)
    if notable:
        lines += ["### Changes", ""] + _md_table([_row_cells(c, m) for c, m in notable]) + [""]
    else:
        lines += ["No metric changed beyond its threshold.", ""]
    for title, items in _cell_sections(cmp):
        if items:
            lines += [f"### {title[0].upper()}{title[1:]} ({len(items)})", ""]
            lines += [f"- {_md_escape(i)}" for i in items] + [""]
    if cmp.warnings:
        lines += ["### Warnings", ""] + [f"- {_md_escape(w)}" for w in cmp.warnings] + [""]
    every = _metric_rows(cmp, all_rows=True)
    if every:
        table = _md_table([_row_cells(c, m) for c, m in every])
        if all_rows:
            lines += ["### All comparisons", ""] + table + [""]
        else:
            lines += [f"<details><summary>All {len(every)} metric comparisons</summary>", ""] + table
            lines += ["", "</details>", ""]
    lines.append(f"_{_verdict_line(cmp, fail_on_missing=fail_on_missing)}_")
    return "\n".join(lines) + "\n"


def render_json(cmp: Comparison, *, fail_on_missing: bool = False) -> str:
    d = cmp.to_dict()
    d["exit_code"] = cmp.exit_code(fail_on_missing=fail_on_missing)
    return json.dumps(d, indent=2, allow_nan=False, default=str) + "\n"


def _spread(values: Sequence[float]) -> float | None:
    """Half the p10–p90 spread of samples (same unit), the ± shown as github-action-benchmark's range."""
    if len(values) < 2:
        return None
    qs = statistics.quantiles(values, n=10, method="inclusive")
    return (qs[-1] - qs[0]) / 2


def benchmark_entries(cmp: Comparison, direction: str) -> list[dict[str, Any]]:
    """github-action-benchmark `customSmallerIsBetter` (direction smaller) or `customBiggerIsBetter` (bigger)
    entries: the candidate's measured values, one per ok cell and metric, named `<run_id> <metric>`."""
    if direction not in BENCHMARK_METRICS:
        raise InputError([Problem("--direction", "", f"{direction!r} is not one of smaller, bigger")])
    entries = []
    for cell in cmp.cells:
        rec = cell.candidate
        if rec is None or rec.get("status") != "ok":
            continue
        rows = {m.metric: m for m in cell.metrics}
        for name in BENCHMARK_METRICS[direction]:
            metric = METRICS_BY_NAME[name]
            value = metric_value(rec, metric)
            if value is None:
                continue
            entry: dict[str, Any] = {"name": f"{rec.get('run_id') or cell.label} {name}", "unit": metric.unit,
                                     "value": value}
            spread = _spread(metric_samples(rec, metric)) if metric.kind == SAMPLED else None
            if spread is not None:
                entry["range"] = f"± {spread:.4g}"
            row = rows.get(name)
            if row is not None and row.baseline is not None:
                ratio = _fmt_change(row)[0]
                extra = f"{cell.label}; baseline {row.baseline:.6g}; ratio {ratio}; {row.verdict}"
                if row.p_value is not None:
                    extra += f"; p={row.p_value:.2g}"
            else:
                extra = f"{cell.label}; " + ("new cell" if cell.state == ADDED else "no baseline value")
            entry["extra"] = extra
            entries.append(entry)
    return entries


def render_benchmark(cmp: Comparison, direction: str) -> str:
    return json.dumps(benchmark_entries(cmp, direction), indent=2, allow_nan=False) + "\n"


# --------------------------------------------------------------------------------------------------
# loading (CLI side)


def _existing(paths: Sequence[Path], side: str, problems: list[Problem]) -> list[Path]:
    ok = []
    for p in paths:
        if not p.exists():
            problems.append(Problem(str(p), "", f"{side}: no such file or directory"))
        else:
            ok.append(p)
    return ok


def _unknown_schema(path: Path) -> Any:
    """The schema_version of a parseable record whose version this harness does not read, else None."""
    try:
        doc = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return None
    if isinstance(doc, dict) and doc.get("schema_version") != SCHEMA_VERSION:
        return doc.get("schema_version", "<absent>")
    return None


def load_side(paths: Sequence[Path], *, side: str, problems: list[Problem],
              notes: list[str]) -> list[dict[str, Any]]:
    """Records under `paths` via harness.results.store.load_records. Unknown schema versions are problems (comparing
    around them would silently drop cells); other unreadable files are warnings unless nothing is left."""
    records: list[dict[str, Any]] = []
    skipped: list[tuple[str, str]] = []
    existing = _existing(paths, side, problems)
    for p in existing:
        recs, warns = load_records(p)
        records.extend(recs)
        files = {str(f): f for f in iter_record_files(p)}
        for w in warns:
            name = next((f for f in files if w.startswith(f + ": ")), None)
            version = _unknown_schema(files[name]) if name is not None else None
            if version is not None:
                problems.append(Problem(name, "schema_version",
                                        f"{side}: unknown schema_version {version!r}; this harness reads version "
                                        f"{SCHEMA_VERSION} (compare with the harness version that wrote it)"))
            else:
                skipped.append((name, w[len(name) + 2:]) if name is not None else ("", w))
    if existing and not records:
        where = ", ".join(str(p) for p in existing)
        detail = f"; {len(skipped)} unreadable file(s) skipped" if skipped else " (no *.json record files found)"
        problems.append(Problem(where, "", f"{side}: no readable records{detail}"))
        problems.extend(Problem(f, "", f"{side}: {why}") for f, why in skipped)
    else:
        notes.extend(f"{side}: skipped {f}: {why}" for f, why in skipped)
    return records


# --------------------------------------------------------------------------------------------------
# writing and promoting


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _copy_durably(src: Path, dest: Path) -> None:
    dest.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(src, dest)
    with open(dest, "rb+") as f:
        os.fsync(f.fileno())


def _exchange(a: Path, b: Path) -> bool:
    """Atomically swap two directories (Linux renameat2 RENAME_EXCHANGE); False where unsupported (NFS…)."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        renameat2 = ctypes.CDLL(None, use_errno=True).renameat2
    except (OSError, AttributeError):
        return False
    at_fdcwd, rename_exchange = -100, 2
    if renameat2(at_fdcwd, os.fsencode(a), at_fdcwd, os.fsencode(b), rename_exchange) == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.ENOSYS, errno.EINVAL, errno.EOPNOTSUPP, errno.EPERM):
        return False
    raise OSError(err, os.strerror(err), str(a))


def _keep_files(baseline: Path) -> list[Path]:
    """Files of an old baseline that are not records (README, .gitattributes): carried into the new one.
    Not carried: records, sweep manifests, the old provenance, temp files, anything under a hidden dir."""
    records = {p.resolve() for p in iter_record_files(baseline)}
    keep = []
    for p in sorted(baseline.rglob("*")):
        if not p.is_file() or p.resolve() in records or p.name in (PROMOTED_FILE, "manifest.json"):
            continue
        if p.name.endswith(".tmp") or any(part.startswith(".") for part in p.relative_to(baseline).parts[:-1]):
            continue  # temp files; hidden dirs (a sweep's .fragments/)
        keep.append(p)
    return keep


def _safe_name(value: Any, fallback: str) -> str:
    text = str(value or "")
    return text if text and Path(text).name == text and text not in (".", "..") else fallback


def check_promote_target(baseline_dir: str | Path, *, sources: Sequence[str | Path]) -> None:
    """InputError when `baseline_dir` is not a directory or overlaps a candidate source (promotion would
    delete the records it copies)."""
    b = Path(baseline_dir).resolve()
    if b.exists() and not b.is_dir():
        raise InputError([Problem(str(baseline_dir), "", "baseline to promote into is not a directory")])
    for src in sources:
        s = Path(src).resolve()
        if s == b or b in s.parents or s in b.parents:
            raise InputError([Problem(str(baseline_dir), "", f"promote: baseline and candidate {src} overlap")])


def promote_baseline(records: Sequence[Mapping[str, Any]], baseline_dir: str | Path, *,
                     sources: Sequence[str] = ()) -> Path:
    """Make `records` the baseline: write them (original bytes when a record has `_path`) into a staging dir
    beside `baseline_dir` as `<sweep>/<run_id>.json`, carry over non-record files, then swap the staging dir in
    (atomic exchange where the filesystem allows; else two renames, during which the path is briefly absent but
    never holds a mix of old and new records). Returns the baseline dir."""
    baseline_dir = Path(baseline_dir).absolute()
    check_promote_target(baseline_dir, sources=sources)
    baseline_dir.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{baseline_dir.name}.promote-", dir=baseline_dir.parent))
    try:
        if baseline_dir.exists():
            for p in _keep_files(baseline_dir):
                _copy_durably(p, staging / p.relative_to(baseline_dir))
        written = set()
        for rec in records:
            digest = hashlib.sha256(spec_key(rec.get("spec") or {}).encode()).hexdigest()[:10]
            rel = Path(_safe_name(rec.get("sweep"), "records"),
                       _safe_name(rec.get("run_id"), f"cell-{digest}") + ".json")
            if rel in written:
                raise InputError([Problem(_where(rec), "run_id", f"promote: two records would both be {rel}")])
            written.add(rel)
            src = rec.get("_path")
            if src and Path(src).is_file():
                _copy_durably(Path(src), staging / rel)
            else:
                atomic_write_json(staging / rel, {k: v for k, v in rec.items() if k != "_path"})
        shas = sorted({str(sha) for r in records if (sha := _get(r, ("env", "harness_git_sha")))})
        atomic_write_json(staging / PROMOTED_FILE, {"promoted_at": utc_now(), "sources": list(sources),
                                                    "records": len(records), "harness_git_sha": shas})
        for d in sorted({p.parent for p in staging.rglob("*")} | {staging}, key=lambda p: -len(p.parts)):
            _fsync_dir(d)
        if not baseline_dir.exists():
            os.rename(staging, baseline_dir)
        elif _exchange(staging, baseline_dir):
            shutil.rmtree(staging)  # now holds the old baseline
        else:
            old = staging.with_name(staging.name + ".old")
            os.rename(baseline_dir, old)
            os.rename(staging, baseline_dir)
            shutil.rmtree(old)
        _fsync_dir(baseline_dir.parent)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return baseline_dir


# --------------------------------------------------------------------------------------------------
# the command


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
            problems.append(Problem("--threshold", text, "expected FRACTION or METRIC=FRACTION, e.g. 0.05 or "
                                    "mfu=0.10"))
    if problems:
        raise InputError(problems)
    return check_thresholds(out)


@click.command("compare")
@click.argument("baseline", required=False, type=click.Path(path_type=Path))
@click.argument("candidate", required=False, type=click.Path(path_type=Path))
@click.option("-B", "--baseline-dir", "more_baseline", multiple=True, type=click.Path(path_type=Path),
              help="Another baseline results dir (repeatable): a side may be several dirs.")
@click.option("-C", "--candidate-dir", "more_candidate", multiple=True, type=click.Path(path_type=Path),
              help="Another candidate results dir (repeatable).")
@click.option("--threshold", "threshold_args", multiple=True, metavar="[METRIC=]FRACTION",
              help=f"Change beyond which a metric counts (default {DEFAULT_THRESHOLD}); METRIC=FRACTION overrides "
                   f"one metric ({', '.join(THRESHOLD_METRICS)}). Repeatable.")
@click.option("--alpha", type=click.FloatRange(0, 1, min_open=True, max_open=True), default=DEFAULT_ALPHA,
              show_default=True, help="Mann–Whitney U significance level for sampled metrics.")
@click.option("--min-samples", type=click.IntRange(min=1), default=DEFAULT_MIN_SAMPLES, show_default=True,
              help="Per-step samples needed on each side to call a sampled metric a regression.")
@click.option("--format", "fmt", type=click.Choice(["table", "md", "json", "github-benchmark"]), default="table",
              show_default=True, help="What goes to stdout (and -o).")
@click.option("--direction", type=click.Choice(["smaller", "bigger"]),
              help="With --format github-benchmark: customSmallerIsBetter or customBiggerIsBetter entries.")
@click.option("-o", "--output", type=click.Path(path_type=Path), help="Also write the output to FILE (atomically).")
@click.option("--output-dir", type=click.Path(path_type=Path),
              help="Also write every format: compare.txt, compare.md, compare.json, benchmark-smaller.json, "
                   "benchmark-bigger.json.")
@click.option("--all", "all_rows", is_flag=True, help="List unchanged and n/a metrics too.")
@click.option("--ignore-spec-key", multiple=True, metavar="KEY",
              help="Leave a top-level spec key out of matching (e.g. time_limit_s). Repeatable.")
@click.option("--metric", "metric_names", multiple=True, metavar="NAME",
              help="Judge only these metrics (repeatable); 'exact' = the deterministic ones (collective bytes, "
                   "predicted memory and bytes), for CI on machines whose timings mean nothing.")
@click.option("--fail-on-missing", is_flag=True, help="Exit 1 when a baseline cell is missing from the candidate.")
@click.option("--promote", is_flag=True,
              help="Afterwards, replace BASELINE's records with CANDIDATE's if there is no regression.")
@click.option("--force", is_flag=True,
              help="With --promote: promote even with regressions, or when BASELINE does not exist yet.")
def compare_command(baseline: Path | None, candidate: Path | None, more_baseline: tuple[Path, ...],
                    more_candidate: tuple[Path, ...], threshold_args: tuple[str, ...], alpha: float,
                    min_samples: int, fmt: str, direction: str | None, output: Path | None,
                    output_dir: Path | None, all_rows: bool, ignore_spec_key: tuple[str, ...],
                    metric_names: tuple[str, ...],
                    fail_on_missing: bool, promote: bool, force: bool) -> int:
    """Compare CANDIDATE results against BASELINE results, cell by cell (matched by spec).

    Exit 0 without regressions, 1 with any (a metric beyond its threshold and, for sampled metrics,
    significant; or a cell ok in BASELINE that fails in CANDIDATE), 2 for bad input.
    """
    if (baseline is None) != (candidate is None):
        raise click.UsageError("give both BASELINE and CANDIDATE (or neither, with -B/-C)")
    base_paths = ([baseline] if baseline else []) + list(more_baseline)
    cand_paths = ([candidate] if candidate else []) + list(more_candidate)
    if not base_paths or not cand_paths:
        raise click.UsageError("need a baseline and a candidate: harness compare BASELINE CANDIDATE")
    if fmt == "github-benchmark" and direction is None and output_dir is None:
        raise click.UsageError("--format github-benchmark writes one tool kind per file: add --direction "
                               "smaller|bigger, or --output-dir DIR to write benchmark-smaller.json and "
                               "benchmark-bigger.json")
    if direction is not None and fmt != "github-benchmark":
        raise click.UsageError("--direction only applies to --format github-benchmark")
    if force and not promote:
        raise click.UsageError("--force only applies with --promote")
    if promote and len(base_paths) != 1:
        raise click.UsageError("--promote needs exactly one BASELINE directory to replace")

    if promote and not force and not base_paths[0].exists():
        raise InputError([Problem(str(base_paths[0]), "", "baseline: no such directory; to make CANDIDATE "
                                  "the first baseline: --promote --force")])
    if promote:
        check_promote_target(base_paths[0], sources=cand_paths)
    thresholds = parse_thresholds(threshold_args)
    problems: list[Problem] = []
    notes: list[str] = []
    bootstrap = promote and force and not base_paths[0].exists()
    base_records = [] if bootstrap else load_side(base_paths, side="baseline", problems=problems, notes=notes)
    cand_records = load_side(cand_paths, side="candidate", problems=problems, notes=notes)
    if problems:
        raise InputError(problems)

    cmp = compare(base_records, cand_records, thresholds=thresholds, alpha=alpha, min_samples=min_samples,
                  ignore_spec_keys=ignore_spec_key, baseline_sources=[str(p) for p in base_paths],
                  candidate_sources=[str(p) for p in cand_paths], metrics=metric_names or None)
    cmp.warnings[:0] = notes
    if not cmp.matched and not (promote and force):
        raise InputError([_no_match_problem(cmp, base_paths, cand_paths)])

    render = {
        "table": lambda: render_table(cmp, all_rows=all_rows, fail_on_missing=fail_on_missing),
        "md": lambda: render_markdown(cmp, all_rows=all_rows, fail_on_missing=fail_on_missing),
        "json": lambda: render_json(cmp, fail_on_missing=fail_on_missing),
    }
    if fmt == "github-benchmark":
        text = render_benchmark(cmp, direction) if direction else render["table"]()
    else:
        text = render[fmt]()
    click.echo(text, nl=False)
    if output is not None:
        atomic_write_text(output, text)
    if output_dir is not None:
        for name, filename in FORMAT_FILES.items():
            atomic_write_text(output_dir / filename, render[name]())
        for d, filename in BENCHMARK_FILES.items():
            atomic_write_text(output_dir / filename, render_benchmark(cmp, d))
    for w in cmp.warnings:
        click.echo(f"warning: {w}", err=True)

    code = cmp.exit_code(fail_on_missing=fail_on_missing)
    if promote:
        if code == 0 or force:
            chosen = [c.candidate for c in cmp.cells if c.candidate is not None]
            dest = promote_baseline(chosen, base_paths[0], sources=[str(p) for p in cand_paths])
            click.echo(f"promoted {len(chosen)} candidate record(s) to baseline {dest}"
                       + (" (forced)" if code else ""), err=True)
        else:
            click.echo(f"not promoted: the comparison failed (exit {code}); baseline {base_paths[0]} is "
                       "unchanged (--force promotes anyway)", err=True)
    return code


def _no_match_problem(cmp: Comparison, base_paths: Sequence[Path], cand_paths: Sequence[Path]) -> Problem:
    hint = ""
    if cmp.missing and cmp.added:
        diffs = min((spec_differences(m.spec, a.spec) for m in cmp.missing for a in cmp.added), key=len)
        hint = f"; the closest pair differs in {'; '.join(diffs[:4])} (--ignore-spec-key KEY matches across it)"
    return Problem(", ".join(map(str, cand_paths)), "",
                   f"no cell matches a baseline cell ({', '.join(map(str, base_paths))}) by spec{hint}; to make "
                   "this candidate the new baseline anyway: --promote --force")
