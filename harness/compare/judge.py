"""Judging two record sets: `compare(baseline, candidate)` matches their cells by spec (match.py) and judges
each matched cell's state and each metric of it (its kind comes from metrics.py) into a `Comparison`.

A side may hold several runs of a cell (`harness sweep --repeat K`, sweeps in several dirs): every ok record is a
run, and each run contributes one value per metric (its median step time, the throughput at it, its peak memory).
For each matched cell and metric the candidate/baseline ratio of the medians of those values is judged in the
metric's direction:

- timing metrics (step time, and tokens/s, tokens/s/GPU, MFU derived from it): judged on the *run-level* values,
  so that the noise between runs (another job on the node, clocks, placement) is what a change must stand out
  from — not the spread of one run's steps, which two runs of the same commit routinely leave by 30%. A
  regression needs the change beyond the metric's threshold (default 5%) AND a two-sided Welch t-test on the
  log values with p < alpha (default 0.05) after Holm's adjustment over the cells tested (so that the chance of
  any false alarm in a whole comparison stays below alpha), with at least `min_runs` (3) runs per side; with
  fewer, a change beyond the threshold is "not judged": reported, never a regression;
- measured peak memory: the median of the runs' values, thresholded, no test (one run is enough);
- deterministic metrics (collective bytes per step, measured tensor memory, predicted memory and collective
  bytes): exact, from the cell's latest record; any change is a regression in the bad direction and an
  improvement in the good one;
- the time model's deviation (measured median / predicted − 1, the median of the runs' values): "info", with
  |candidate| − |baseline| in points — never a regression by itself (the timing is judged on step time), unless
  `watch_deviation` (points) is given and |deviation| grew by more than it;
- a null metric on either side is "n/a", never a regression.

A cell's state comes from its latest record on each side: ok in the baseline and not ok in the candidate is a
regression ("newly failing"); the reverse is an improvement ("newly fixed"). Cells only in one set are listed as
added / missing.

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
    INFO,
    MISSING,
    NA,
    NEWLY_FAILING,
    NEWLY_FIXED,
    NOT_JUDGED,
    NOT_SIGNIFICANT,
    REGRESSION,
    STILL_FAILING,
    UNCHANGED,
    CellComparison,
    Comparison,
    MetricComparison,
)
from harness.compare.match import RunValues, SideIndex, cell_labels, spec_differences
from harness.compare.metrics import (
    DEVIATION,
    EXACT,
    SAMPLED,
    THRESHOLDED,
    WATCHED,
    Metric,
    check_thresholds,
    check_watch_deviation,
    deviation_growth,
    metric_value,
    select_metrics,
    watched_deviation,
)
from harness.compare.stats import DEFAULT_ALPHA, DEFAULT_MIN_RUNS, run_level_p
from harness.core.errors import InputError, Problem
from harness.results.metrics import MetricReader
from harness.results.record import Record
from harness.results.store import as_record

_ALL: tuple[Metric, ...] = select_metrics(None)

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


def _null_note(rec: Record, metric: Metric, side: str) -> str:
    why = metric.why_null(rec)
    return f"null in {side}" + (f" ({why})" if why else "")


def _median(values: Sequence[float]) -> float:
    v = sorted(values)
    k = len(v)
    return v[k // 2] if k % 2 else (v[k // 2 - 1] + v[k // 2]) / 2


def _run_values(runs: Sequence[RunValues], metric: Metric) -> list[float]:
    return [r[metric.name] for r in runs if metric.name in r]


def basis_of(n_baseline: int, n_candidate: int, *, min_runs: int) -> str:
    """How a cell's timing is judged, for people."""
    if n_baseline >= min_runs and n_candidate >= min_runs:
        return f"run-level: {n_baseline} vs {n_candidate} runs"
    if n_baseline == n_candidate == 1:
        return "one run: reported, not judged"
    return f"{n_baseline} vs {n_candidate} runs: reported, not judged ({min_runs} per side needed)"


def compare_metric(
    metric: Metric,
    baseline: Record,
    candidate: Record,
    *,
    threshold: float,
    alpha: float,
    min_runs: int = DEFAULT_MIN_RUNS,
    baseline_runs: Sequence[RunValues] | None = None,
    candidate_runs: Sequence[RunValues] | None = None,
    watch_deviation: float | None = None,
) -> MetricComparison:
    """Judge one metric of one matched, both-ok cell: its latest `baseline` and `candidate` records and the
    values of every ok run on each side (default: the latest record alone). `watch_deviation` (percentage
    points): a watched metric whose |value| grew by more than this regressed; None: information only."""
    b_runs = [{m: v for m, v in _values(baseline).items()}] if baseline_runs is None else baseline_runs
    c_runs = [{m: v for m, v in _values(candidate).items()}] if candidate_runs is None else candidate_runs
    row = MetricComparison(
        metric=metric.name,
        unit=metric.unit,
        better=metric.better,
        kind=metric.kind,
        baseline=None,
        candidate=None,
        verdict=NA,
        threshold=None if metric.kind in (EXACT, WATCHED) else threshold,
    )
    if metric.kind == EXACT:
        b, c = metric_value(baseline, metric), metric_value(candidate, metric)
    else:
        xs, ys = _run_values(b_runs, metric), _run_values(c_runs, metric)
        b, c = (_median(xs) if xs else None), (_median(ys) if ys else None)
        row.n_baseline, row.n_candidate = len(xs), len(ys)
    row.baseline, row.candidate = b, c
    if b is None or c is None:
        notes = [
            _null_note(rec, metric, side)
            for rec, side, v in ((baseline, "baseline", b), (candidate, "candidate", c))
            if v is None
        ]
        if len(notes) == 2 and notes[0].removeprefix("null in baseline") == notes[1].removeprefix("null in candidate"):
            notes = ["null on both sides" + notes[0].removeprefix("null in baseline")]
        row.note = "; ".join(notes)
        return row
    if metric.kind == WATCHED:
        return _watched_verdict(row, b, c, watch_deviation=watch_deviation)
    row.ratio = c / b if b != 0 else (1.0 if c == 0 else None)
    factor = _worse_factor(metric, b, c)
    if metric.kind == EXACT:
        row.verdict = UNCHANGED if b == c else (REGRESSION if factor > 1 else IMPROVEMENT)
        return row
    worse, better = factor > 1 + threshold, factor < 1 / (1 + threshold)
    if metric.kind == SAMPLED and min(len(xs), len(ys)) >= min_runs and min(xs + ys) > 0:
        row.p_value = run_level_p(xs, ys)
    if not (worse or better):
        row.verdict = UNCHANGED
    elif metric.kind == THRESHOLDED:
        row.verdict = REGRESSION if worse else IMPROVEMENT
    elif min(len(xs), len(ys)) < min_runs:
        row.verdict = NOT_JUDGED
        row.note = f"{len(xs)} vs {len(ys)} runs; {min_runs} a side needed"
    elif row.p_value is None:
        row.verdict = NOT_JUDGED
        row.note = "a run value is not positive: no test"
    else:
        _timing_verdict(row, worse=worse, alpha=alpha)
    return row


def _watched_verdict(row: MetricComparison, b: float, c: float, *, watch_deviation: float | None) -> MetricComparison:
    """The time model's deviation on both sides (the median of each side's runs): information (`info`), with how
    much further off the model got, |c| − |b|; a regression only when `watch_deviation` (points) is given and
    that growth exceeds it. No ratio: a deviation is already a relative number, and its change is in points."""
    row.growth = deviation_growth(b, c)
    regressed, row.note = watched_deviation(row.growth, watch_deviation)
    row.verdict = REGRESSION if regressed else INFO
    return row


def _timing_verdict(
    row: MetricComparison, *, worse: bool, alpha: float, raw: float | None = None, cells: int = 1
) -> None:
    """The verdict of a timing change beyond its threshold, from its p-value (`raw`: the Welch p before Holm's
    adjustment over `cells` cells)."""
    assert row.p_value is not None  # called for tested rows only
    how = f"Holm-adjusted over {cells} cells; Welch p={raw:.3g}" if raw is not None and cells > 1 else ""
    if row.p_value < alpha:
        row.verdict = REGRESSION if worse else IMPROVEMENT
        row.note = how
    else:
        row.verdict = NOT_SIGNIFICANT
        row.note = f"p={row.p_value:.3g}{f' ({how})' if how else ''} >= alpha {alpha:g}: the runs overlap"


def _holm(cells: Sequence[CellComparison], *, alpha: float) -> None:
    """Holm's step-down adjustment of the timing p-values over the cells tested: the chance that *any* cell of an
    unchanged pair is called changed stays below alpha, however many cells there are (a 6-cell compare at 0.05 per
    cell would fail about 1 trial in 7 on identical code). One test per cell: step time and the throughputs derived
    from it are the same runs, so they share one p-value. The rows' p becomes the adjusted one."""
    raw = {}
    for c in cells:
        ps = [m.p_value for m in c.metrics if m.kind == SAMPLED and m.p_value is not None]
        if ps:
            raw[c.key] = min(ps)
    m = len(raw)
    if m < 2:
        return
    adjusted: dict[str, float] = {}
    running = 0.0
    for i, (key, p) in enumerate(sorted(raw.items(), key=lambda kp: kp[1])):
        running = max(running, min(1.0, (m - i) * p))
        adjusted[key] = running
    for c in cells:
        for row in c.metrics:
            if row.kind != SAMPLED or row.p_value is None:
                continue
            p = row.p_value
            row.p_value = adjusted[c.key]
            if row.verdict in (REGRESSION, IMPROVEMENT, NOT_SIGNIFICANT):
                worse = (row.ratio or 1.0) > 1 if row.better == "lower" else (row.ratio or 1.0) < 1
                _timing_verdict(row, worse=worse, alpha=alpha, raw=p, cells=m)


_READER = MetricReader(_ALL)


def _values(rec: Record) -> RunValues:
    global _READER
    _READER = _READER.of(_ALL)
    return {m.name: v for m, v in zip(_ALL, _READER.values(rec)) if v is not None} if rec.ok else {}


# --------------------------------------------------------------------------------------------------
# comparing two sets


def _settings(
    *,
    thresholds: Mapping[str, float] | None,
    alpha: float,
    min_runs: int,
    metrics: Iterable[str] | None,
    watch_deviation: float | None = None,
) -> tuple[dict[str, float], tuple[Metric, ...]]:
    """(thresholds, metrics) checked: InputError for a bad alpha, min_runs, threshold, metric or
    watch_deviation (or one given while `metrics` leaves the deviation out)."""
    if not 0 < alpha < 1:
        raise InputError([Problem("--alpha", "", f"{alpha!r} is not in (0, 1)")])
    if isinstance(min_runs, bool) or not isinstance(min_runs, int) or min_runs < 2:
        raise InputError([Problem("--min-runs", "", f"{min_runs!r} is not a whole number >= 2 (a test needs 2)")])
    judged = select_metrics(metrics)
    if check_watch_deviation(watch_deviation) is not None and not any(m.kind == WATCHED for m in judged):
        raise InputError(
            [
                Problem(
                    "--watch-deviation",
                    "",
                    f"the metrics chosen with --metric leave out {DEVIATION}: add --metric {DEVIATION}",
                )
            ]
        )
    return check_thresholds(thresholds), judged


def compare(
    baseline_records: Iterable[Record | Mapping[str, Any]],
    candidate_records: Iterable[Record | Mapping[str, Any]],
    *,
    thresholds: Mapping[str, float] | None = None,
    alpha: float = DEFAULT_ALPHA,
    ignore_spec_keys: Iterable[str] = (),
    baseline_sources: Sequence[str] = (),
    candidate_sources: Sequence[str] = (),
    metrics: Iterable[str] | None = None,
    min_runs: int = DEFAULT_MIN_RUNS,
    watch_deviation: float | None = None,
) -> Comparison:
    """Match two record sets by spec and judge every metric of every cell (or only `metrics`, by name).

    `thresholds` maps metric name (see METRICS) → fraction, with "default" for the rest (0.05 when absent).
    `ignore_spec_keys` are top-level spec keys left out of matching (e.g. time_limit_s after raising it).
    `watch_deviation` (percentage points, e.g. 10.0): a cell whose |time-model deviation| grew by more than this
    regressed; None (the default): the deviation is information only.
    """
    metrics = None if metrics is None else tuple(metrics)
    _settings(
        thresholds=thresholds,
        alpha=alpha,
        min_runs=min_runs,
        metrics=metrics,
        watch_deviation=watch_deviation,
    )
    ignore = tuple(ignore_spec_keys)
    base = SideIndex(side="baseline", ignore=ignore).add_all(as_record(r) for r in baseline_records)
    cand = SideIndex(side="candidate", ignore=ignore).add_all(as_record(r) for r in candidate_records)
    return compare_indexed(
        base,
        cand,
        thresholds=thresholds,
        alpha=alpha,
        baseline_sources=baseline_sources,
        candidate_sources=candidate_sources,
        metrics=metrics,
        min_runs=min_runs,
        watch_deviation=watch_deviation,
    )


def compare_indexed(
    base: SideIndex,
    cand: SideIndex,
    *,
    thresholds: Mapping[str, float] | None = None,
    alpha: float = DEFAULT_ALPHA,
    baseline_sources: Sequence[str] = (),
    candidate_sources: Sequence[str] = (),
    metrics: Iterable[str] | None = None,
    min_runs: int = DEFAULT_MIN_RUNS,
    watch_deviation: float | None = None,
) -> Comparison:
    """`compare` of two sides already indexed by spec (harness compare indexes each record as it loads it)."""
    limits, judged = _settings(
        thresholds=thresholds,
        alpha=alpha,
        min_runs=min_runs,
        metrics=metrics,
        watch_deviation=watch_deviation,
    )
    notes = base.warnings() + cand.warnings()
    specs = {k: r.spec for k, r in base.chosen.items()}
    specs.update({k: r.spec for k, r in cand.chosen.items()})
    labels = cell_labels(specs)
    timing = any(m.kind == SAMPLED for m in judged)

    cells = []
    for key in sorted(specs, key=lambda k: labels[k]):
        b, c = base.chosen.get(key), cand.chosen.get(key)
        cell = CellComparison(key=key, label=labels[key], spec=specs[key], state=BOTH_OK, baseline=b, candidate=c)
        if c is None:
            cell.state = MISSING
        elif b is None:
            cell.state = ADDED
        else:
            b_ok, c_ok = b.ok, c.ok
            cell.state = {
                (True, True): BOTH_OK,
                (True, False): NEWLY_FAILING,
                (False, True): NEWLY_FIXED,
                (False, False): STILL_FAILING,
            }[(b_ok, c_ok)]
            cell.notes.extend(_env_notes(b, c))
            if cell.state == BOTH_OK:
                b_runs, c_runs = base.runs.get(key, []), cand.runs.get(key, [])
                cell.runs = (len(b_runs), len(c_runs))
                if timing:
                    cell.basis = basis_of(len(b_runs), len(c_runs), min_runs=min_runs)
                cell.notes.extend(_failed_runs_notes(base, cand, key))
                for m in judged:
                    if m.absent_in(b, c):  # a phase neither cell ran (trace, checkpoint): no row, as before it existed
                        continue
                    threshold = limits.get(m.name, limits["default"])
                    cell.metrics.append(
                        compare_metric(
                            m,
                            b,
                            c,
                            threshold=threshold,
                            alpha=alpha,
                            min_runs=min_runs,
                            baseline_runs=b_runs,
                            candidate_runs=c_runs,
                            watch_deviation=watch_deviation,
                        )
                    )
        cells.append(cell)
    _holm(cells, alpha=alpha)
    _note_near_misses(cells)
    return Comparison(
        cells=cells,
        thresholds=limits,
        alpha=alpha,
        baseline_sources=list(baseline_sources),
        candidate_sources=list(candidate_sources),
        baseline_records=base.records,
        candidate_records=cand.records,
        warnings=notes,
        min_runs=min_runs,
        watch_deviation=watch_deviation,
    )


def _failed_runs_notes(base: SideIndex, cand: SideIndex, key: str) -> list[str]:
    """A cell ok in its latest record on both sides, with runs that were not: said beside it."""
    out = []
    for side in (base, cand):
        failed = side.failed_runs.get(key, [])
        if failed:
            total = len(failed) + len(side.runs.get(key, []))
            out.append(f"{side.side}: {len(failed)} of {total} runs not ok ({', '.join(sorted(set(failed)))})")
    return out


def _env_notes(b: Record, c: Record) -> list[str]:
    out = []
    for k in ENV_KEYS:
        vb, vc = b.env.field(k), c.env.field(k)
        if vb != vc and (vb is not None or vc is not None):
            out.append(f"env.{k}: {vb} → {vc}")
    if b.cluster != c.cluster:
        out.append(f"cluster: {b.cluster} → {c.cluster}")
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
