"""What a comparison found: the verdict of each metric of each matched cell, the state of each cell, and the
whole `Comparison` with its summary and exit code.

Plain data shared by the judging (judge.py, which fills it), the renderers (render.py) and the command (which
returns `Comparison.exit_code()`); `to_dict()` is the compare.json format.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from harness.results.record import Record
from harness.results.spec import spec_to_json
from harness.scenario.spec import RunSpec

# verdicts of one metric of one matched cell
REGRESSION = "regression"
IMPROVEMENT = "improvement"
UNCHANGED = "unchanged"
NOT_SIGNIFICANT = "not significant"
NOT_JUDGED = "not judged"
"""a timing change beyond the threshold with fewer than `min_runs` runs on a side: reported, never a regression"""
NA = "n/a"
INFO = "info"
"""a watched metric (the time model's deviation) present on both sides: information, never a regression unless
`--watch-deviation` asks"""
VERDICTS = (REGRESSION, NOT_JUDGED, NOT_SIGNIFICANT, IMPROVEMENT, UNCHANGED, INFO, NA)
"""every verdict, the worst first: the order a cell's metrics are listed in and its counts are keyed"""

# states of one cell
MISSING = "missing"  # only in the baseline
ADDED = "added"  # only in the candidate
BOTH_OK = "ok"
NEWLY_FAILING = "newly failing"
NEWLY_FIXED = "newly fixed"
STILL_FAILING = "still failing"

JSON_FORMAT = "harness.compare.compare"
"""the "format" field of compare.json; it names the module that first wrote it and stays as it is (file format)"""


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
    """two-sided Welch t-test on the log run-level values (timing metrics with `min_runs` runs per side),
    Holm-adjusted over the cells tested (the raw p is in `note`)"""
    n_baseline: int | None = None
    """runs (ok records) the baseline value is the median of (timing and memory metrics)"""
    n_candidate: int | None = None
    note: str = ""
    growth: float | None = None
    """watched metrics: |candidate| − |baseline| (fraction; 0.18 = the model 18 points further off)"""

    @property
    def change(self) -> float | None:
        """ratio - 1 (fraction; +0.2 = 20% larger)."""
        return None if self.ratio is None else self.ratio - 1.0

    def to_dict(self) -> dict[str, Any]:
        # NOTE: the fields are plain values, so this is dataclasses.asdict without its deep copy (one per value)
        d = {name: getattr(self, name) for name in _METRIC_FIELDS}
        d["change"] = self.change
        if self.baseline is not None and self.candidate is not None:
            d["delta"] = self.candidate - self.baseline
        return d


_METRIC_FIELDS = tuple(f.name for f in dataclasses.fields(MetricComparison))


@dataclass
class CellComparison:
    """One cell (one spec) across the two sets."""

    key: str
    """canonical JSON of the spec (without ignored keys): the match key"""
    label: str
    """readable name: model strategy precision gN, plus the spec keys that tell same-named cells apart"""
    spec: RunSpec
    state: str
    """missing, added, ok, newly failing, newly fixed or still failing"""
    baseline: Record | None = None
    candidate: Record | None = None
    metrics: list[MetricComparison] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    runs: tuple[int, int] | None = None
    """ok runs of the cell on each side (baseline, candidate): what its timing is judged on"""
    basis: str = ""
    """how its timing was judged, for people: `run-level: 3 vs 3 runs`, `one run: reported, not judged`"""

    @property
    def baseline_status(self) -> str | None:
        return None if self.baseline is None else self.baseline.status

    @property
    def candidate_status(self) -> str | None:
        return None if self.candidate is None else self.candidate.status

    def reason(self, side: str) -> str:
        rec = self.baseline if side == "baseline" else self.candidate
        return "" if rec is None else rec.reason or ""

    @property
    def regressed(self) -> bool:
        """A metric regressed or the cell newly fails: the cell counts once, however many of its metrics moved
        (one slow cell moves step time and the three throughputs derived from it)."""
        return self.state == NEWLY_FAILING or any(m.verdict == REGRESSION for m in self.metrics)

    @property
    def improved(self) -> bool:
        """A metric improved or the cell is newly fixed (a cell can have improved and regressed metrics)."""
        return self.state == NEWLY_FIXED or any(m.verdict == IMPROVEMENT for m in self.metrics)

    def metric_counts(self) -> dict[str, int]:
        """How many of this cell's metrics got each verdict: every verdict, in VERDICTS order, zeros included."""
        counts = dict.fromkeys(VERDICTS, 0)
        for m in self.metrics:
            counts[m.verdict] += 1
        return counts

    def to_dict(self) -> dict[str, Any]:
        return {
            "label": self.label,
            "state": self.state,
            "regressed": self.regressed,
            "basis": self.basis,
            "runs": None if self.runs is None else {"baseline": self.runs[0], "candidate": self.runs[1]},
            "metric_counts": self.metric_counts(),
            "spec": spec_to_json(self.spec),
            "baseline": _record_ref(self.baseline),
            "candidate": _record_ref(self.candidate),
            "notes": self.notes,
            "metrics": [m.to_dict() for m in self.metrics],
        }


def _record_ref(rec: Record | None) -> dict[str, Any] | None:
    if rec is None:
        return None
    return {
        "run_id": rec.run_id,
        "sweep": rec.sweep,
        "cluster": rec.cluster,
        "status": rec.status,
        "reason": rec.reason,
        "_path": rec.path,
    }


@dataclass
class Comparison:
    """Everything `harness compare` found; `exit_code()` is what the command returns."""

    cells: list[CellComparison]
    thresholds: dict[str, float]
    """"default" plus per-metric overrides (fractions)"""
    alpha: float
    baseline_sources: list[str] = field(default_factory=list)
    candidate_sources: list[str] = field(default_factory=list)
    baseline_records: int = 0
    candidate_records: int = 0
    warnings: list[str] = field(default_factory=list)
    min_runs: int = 3
    """runs per side below which a timing change is reported, never a regression"""
    watch_deviation: float | None = None
    """`--watch-deviation PCT` (percentage points): a cell whose |deviation| grew by more than this regressed;
    None: the deviation is information only"""

    def _rows(self, verdict: str) -> list[tuple[CellComparison, MetricComparison]]:
        return [(c, m) for c in self.cells for m in c.metrics if m.verdict == verdict]

    def _cells(self, state: str) -> list[CellComparison]:
        return [c for c in self.cells if c.state == state]

    def cells_with(self, verdict: str) -> list[CellComparison]:
        """The cells with at least one metric of this verdict."""
        return [c for c in self.cells if any(m.verdict == verdict for m in c.metrics)]

    @property
    def regressed_cells(self) -> list[CellComparison]:
        """Cells with a regressed metric, and newly failing cells: what "N cells regressed" counts."""
        return [c for c in self.cells if c.regressed]

    @property
    def improved_cells(self) -> list[CellComparison]:
        return [c for c in self.cells if c.improved]

    @property
    def regressions(self) -> list[tuple[CellComparison, MetricComparison]]:
        return self._rows(REGRESSION)

    @property
    def improvements(self) -> list[tuple[CellComparison, MetricComparison]]:
        return self._rows(IMPROVEMENT)

    @property
    def not_judged(self) -> list[tuple[CellComparison, MetricComparison]]:
        return self._rows(NOT_JUDGED)

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
        """Counts. `regressions` and `improvements` count cells (a cell with four regressed metrics is one
        regression); `metric_*`, `not_judged` and `not_significant` count metrics, and the `*_cells` beside the
        last two count the cells those metrics are in; `few_runs_cells` counts matched ok cells whose timing was
        not judged (fewer than `min_runs` runs on a side)."""
        return {
            "matched": len(self.matched),
            "added": len(self.added),
            "missing": len(self.missing),
            "regressions": len(self.regressed_cells),
            "metric_regressions": len(self.regressions),
            "newly_failing": len(self.newly_failing),
            "improvements": len(self.improved_cells),
            "metric_improvements": len(self.improvements),
            "newly_fixed": len(self.newly_fixed),
            "still_failing": len(self.still_failing),
            "not_judged": len(self.not_judged),
            "not_judged_cells": len(self.cells_with(NOT_JUDGED)),
            "few_runs_cells": sum(
                c.runs is not None and min(c.runs) < self.min_runs for c in self.cells if c.state == BOTH_OK
            ),
            "not_significant": len(self.not_significant),
            "not_significant_cells": len(self.cells_with(NOT_SIGNIFICANT)),
            "deviation_regressions": sum(1 for _, m in self.regressions if m.kind == "watched"),
        }

    def to_dict(self) -> dict[str, Any]:
        return {
            "format": JSON_FORMAT,
            "version": 1,
            "baseline": {"sources": self.baseline_sources, "records": self.baseline_records},
            "candidate": {"sources": self.candidate_sources, "records": self.candidate_records},
            "settings": {
                "thresholds": self.thresholds,
                "alpha": self.alpha,
                "min_runs": self.min_runs,
                "timing_test": "two-sided Welch t-test on the log of each run's value (its median step time, the "
                "throughput at it), min_runs runs per side, p Holm-adjusted over the cells tested",
                "watch_deviation": self.watch_deviation,
            },
            "regression": self.has_regression,
            "summary": self.summary(),
            "warnings": self.warnings,
            "cells": [c.to_dict() for c in self.cells],
        }
