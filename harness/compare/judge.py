"""Judging two record sets: `compare(baseline, candidate)` matches their cells by spec (match.py) and judges
each matched cell's state and each metric of it (its kind comes from metrics.py) into a `Comparison`.

For each matched cell and metric the candidate/baseline ratio is judged in the metric's direction:

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
Pure: no torch import; scipy is imported where the test runs.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from harness.compare.comparison import (
    ADDED,
    BOTH_OK,
    IMPROVEMENT,
    INSUFFICIENT,
    MISSING,
    NA,
    NEWLY_FAILING,
    NEWLY_FIXED,
    NOT_SIGNIFICANT,
    REGRESSION,
    STILL_FAILING,
    UNCHANGED,
    CellComparison,
    Comparison,
    MetricComparison,
)
from harness.compare.match import SideIndex, cell_labels, spec_differences
from harness.compare.metrics import (
    EXACT,
    SAMPLED,
    THRESHOLDED,
    Metric,
    check_thresholds,
    metric_samples,
    metric_value,
    select_metrics,
    step_samples,
    value_at,
)
from harness.compare.stats import DEFAULT_ALPHA, DEFAULT_MIN_SAMPLES, mann_whitney_p, mann_whitney_ps
from harness.core.errors import InputError, Problem

ENV_KEYS = ("device_name", "torch", "cuda", "nccl", "deepspeed")
"""environment fields whose change is noted beside a matched cell (it often explains a regression)"""


# --------------------------------------------------------------------------------------------------
# judging one metric


def _worse_factor(metric: Metric, b: float, c: float) -> float:
    """How many times worse the candidate is (>1 worse, <1 better), symmetric for both directions."""
    if b == c:
        return 1.0
    if b > 0 and c > 0:
        return c / b if metric.lower_is_better else b / c
    worse = (c > b) == metric.lower_is_better
    return math.inf if worse else 0.0


def _null_note(rec: Mapping[str, Any], metric: Metric, side: str) -> str:
    why = value_at(rec, ("metrics", "null_reasons", metric.name))
    return f"null in {side}" + (f" ({why})" if why else "")


def _measure(
    metric: Metric,
    baseline: Mapping[str, Any],
    candidate: Mapping[str, Any],
    *,
    threshold: float,
    min_samples: int,
    times: tuple[list[float], list[float]] | None = None,
) -> tuple[MetricComparison, float | None, tuple[list[float], list[float]] | None]:
    """First half of judging one metric: (row, worse factor, samples to test). The factor is None when the
    row is already judged (a null side, an exact metric); samples are None when no test runs."""
    b, c = metric_value(baseline, metric), metric_value(candidate, metric)
    row = MetricComparison(
        metric=metric.name,
        unit=metric.unit,
        better=metric.better,
        kind=metric.kind,
        baseline=b,
        candidate=c,
        verdict=NA,
        threshold=None if metric.kind == EXACT else threshold,
    )
    if b is None or c is None:
        notes = [
            _null_note(rec, metric, side)
            for rec, side, v in ((baseline, "baseline", b), (candidate, "candidate", c))
            if v is None
        ]
        if len(notes) == 2 and notes[0].removeprefix("null in baseline") == notes[1].removeprefix("null in candidate"):
            notes = ["null on both sides" + notes[0].removeprefix("null in baseline")]
        row.note = "; ".join(notes)
        return row, None, None
    row.ratio = c / b if b != 0 else (1.0 if c == 0 else None)
    factor = _worse_factor(metric, b, c)
    if metric.kind == EXACT:
        row.verdict = UNCHANGED if b == c else (REGRESSION if factor > 1 else IMPROVEMENT)
        return row, None, None
    samples = None
    if metric.kind == SAMPLED:
        bt, ct = times if times is not None else (None, None)
        xs, ys = metric_samples(baseline, metric, times=bt), metric_samples(candidate, metric, times=ct)
        row.n_baseline, row.n_candidate = len(xs), len(ys)
        if len(xs) >= min_samples and len(ys) >= min_samples:
            samples = (xs, ys)
    return row, factor, samples


def _settle(
    row: MetricComparison,
    metric: Metric,
    factor: float,
    *,
    p_value: float | None,
    threshold: float,
    alpha: float,
    min_samples: int,
) -> MetricComparison:
    """Second half: the verdict of a thresholded or sampled metric, given the test's p-value (None: no test)."""
    row.p_value = p_value
    worse, better = factor > 1 + threshold, factor < 1 / (1 + threshold)
    if not (worse or better):
        row.verdict = UNCHANGED
    elif metric.kind == THRESHOLDED:
        row.verdict = REGRESSION if worse else IMPROVEMENT
    elif row.p_value is None:
        row.verdict = INSUFFICIENT
        row.note = (
            f"{row.n_baseline} baseline / {row.n_candidate} candidate samples; "
            f"{min_samples} per side needed for the test"
        )
    elif row.p_value < alpha:
        row.verdict = REGRESSION if worse else IMPROVEMENT
    else:
        row.verdict = NOT_SIGNIFICANT
        row.note = f"p={row.p_value:.3g} >= alpha {alpha:g}: the samples overlap"
    return row


def compare_metric(
    metric: Metric,
    baseline: Mapping[str, Any],
    candidate: Mapping[str, Any],
    *,
    threshold: float,
    alpha: float,
    min_samples: int,
) -> MetricComparison:
    """Judge one metric of one matched, both-ok cell."""
    row, factor, samples = _measure(metric, baseline, candidate, threshold=threshold, min_samples=min_samples)
    if factor is None:
        return row
    return _settle(
        row,
        metric,
        factor,
        p_value=None if samples is None else mann_whitney_p(*samples),
        threshold=threshold,
        alpha=alpha,
        min_samples=min_samples,
    )


# --------------------------------------------------------------------------------------------------
# comparing two sets


def _settings(
    *, thresholds: Mapping[str, float] | None, alpha: float, min_samples: int, metrics: Iterable[str] | None
) -> tuple[dict[str, float], tuple[Metric, ...]]:
    """(thresholds, metrics) checked: InputError for a bad alpha, min_samples, threshold or metric name."""
    if not 0 < alpha < 1:
        raise InputError([Problem("--alpha", "", f"{alpha!r} is not in (0, 1)")])
    if min_samples < 1:
        raise InputError([Problem("--min-samples", "", f"{min_samples!r} is below 1")])
    return check_thresholds(thresholds), select_metrics(metrics)


def compare(
    baseline_records: Iterable[Mapping[str, Any]],
    candidate_records: Iterable[Mapping[str, Any]],
    *,
    thresholds: Mapping[str, float] | None = None,
    alpha: float = DEFAULT_ALPHA,
    min_samples: int = DEFAULT_MIN_SAMPLES,
    ignore_spec_keys: Iterable[str] = (),
    baseline_sources: Sequence[str] = (),
    candidate_sources: Sequence[str] = (),
    metrics: Iterable[str] | None = None,
) -> Comparison:
    """Match two record sets by spec and judge every metric of every cell (or only `metrics`, by name).

    `thresholds` maps metric name (see METRICS) → fraction, with "default" for the rest (0.05 when absent).
    `ignore_spec_keys` are top-level spec keys left out of matching (e.g. time_limit_s after raising it).
    """
    metrics = None if metrics is None else tuple(metrics)
    _settings(thresholds=thresholds, alpha=alpha, min_samples=min_samples, metrics=metrics)
    ignore = tuple(ignore_spec_keys)
    base = SideIndex(side="baseline", ignore=ignore).add_all(baseline_records)
    cand = SideIndex(side="candidate", ignore=ignore).add_all(candidate_records)
    return compare_indexed(
        base,
        cand,
        thresholds=thresholds,
        alpha=alpha,
        min_samples=min_samples,
        baseline_sources=baseline_sources,
        candidate_sources=candidate_sources,
        metrics=metrics,
    )


def compare_indexed(
    base: SideIndex,
    cand: SideIndex,
    *,
    thresholds: Mapping[str, float] | None = None,
    alpha: float = DEFAULT_ALPHA,
    min_samples: int = DEFAULT_MIN_SAMPLES,
    baseline_sources: Sequence[str] = (),
    candidate_sources: Sequence[str] = (),
    metrics: Iterable[str] | None = None,
) -> Comparison:
    """`compare` of two sides already indexed by spec (harness compare indexes each record as it loads it)."""
    limits, judged = _settings(thresholds=thresholds, alpha=alpha, min_samples=min_samples, metrics=metrics)
    notes = base.warnings() + cand.warnings()
    specs = {k: r["spec"] for k, r in base.chosen.items()}
    specs.update({k: r["spec"] for k, r in cand.chosen.items()})
    labels = cell_labels(specs)
    sampled = any(m.kind == SAMPLED for m in judged)

    cells = []
    pending = []  # (row, metric, factor, threshold, samples) of the metrics judged once every p-value is known
    for key in sorted(specs, key=lambda k: labels[k]):
        b, c = base.chosen.get(key), cand.chosen.get(key)
        cell = CellComparison(key=key, label=labels[key], spec=specs[key], state=BOTH_OK, baseline=b, candidate=c)
        if c is None:
            cell.state = MISSING
        elif b is None:
            cell.state = ADDED
        else:
            b_ok, c_ok = b.get("status") == "ok", c.get("status") == "ok"
            cell.state = {
                (True, True): BOTH_OK,
                (True, False): NEWLY_FAILING,
                (False, True): NEWLY_FIXED,
                (False, False): STILL_FAILING,
            }[(b_ok, c_ok)]
            cell.notes.extend(_env_notes(b, c))
            if cell.state == BOTH_OK:
                times = (step_samples(b), step_samples(c)) if sampled else None
                for m in judged:
                    threshold = limits.get(m.name, limits["default"])
                    row, factor, samples = _measure(m, b, c, threshold=threshold, min_samples=min_samples, times=times)
                    cell.metrics.append(row)
                    if factor is not None:
                        pending.append((row, m, factor, threshold, samples))
        cells.append(cell)
    # NOTE: one batched test over every cell's samples, then the verdicts that wait on it
    tested = [samples for *_, samples in pending if samples is not None]
    p_values = iter(mann_whitney_ps(tested) if tested else [])
    for row, m, factor, threshold, samples in pending:
        _settle(
            row,
            m,
            factor,
            p_value=None if samples is None else next(p_values),
            threshold=threshold,
            alpha=alpha,
            min_samples=min_samples,
        )
    _note_near_misses(cells)
    return Comparison(
        cells=cells,
        thresholds=limits,
        alpha=alpha,
        min_samples=min_samples,
        baseline_sources=list(baseline_sources),
        candidate_sources=list(candidate_sources),
        baseline_records=base.records,
        candidate_records=cand.records,
        warnings=notes,
    )


def _env_notes(b: Mapping[str, Any], c: Mapping[str, Any]) -> list[str]:
    out = []
    for k in ENV_KEYS:
        vb, vc = value_at(b, ("env", k)), value_at(c, ("env", k))
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
            cell.notes.append(
                f"closest added cell {best.label!r} differs in {'; '.join(diffs)} "
                "(--ignore-spec-key KEY matches across it)"
            )
