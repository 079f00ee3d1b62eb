"""What `harness history check` decides, as types: the verdict and cell-state names, the rules a value is judged
by (`Rules`, every default `history check` uses), one metric's verdict, one cell's, and the whole check with its
JSON form (`HistoryCheck.to_dict`, what `--format json` writes).

harness.history.metric_judge fills a `MetricVerdict`, harness.history.judge the cells and the check;
harness.history.render prints them.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from harness.compare.metrics import WATCHED, check_thresholds, check_watch_deviation
from harness.core.errors import InputError, Problem
from harness.history import keys
from harness.history.keys import Entry

REGRESSION, IMPROVEMENT, UNCHANGED = "regression", "improvement", "unchanged"
INSUFFICIENT, NA = "insufficient history", "n/a"
SHIFTED = "shifted"
"""the time model's deviation left its history (metric_judge's rules, on measured / predicted): information, never a
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
        watched = {m.name for m in keys.HISTORY_METRICS if m.kind == WATCHED}
        confirmed = [c.confirm for c in self.cells if c.confirm is not None]
        return {
            "cells": len(self.cells),
            "regressions": len(self.regressed_cells),
            "metric_regressions": len(self.regressions),
            "newly_failing": len(self.newly_failing),
            "improvements": verdicts.count(IMPROVEMENT),
            "insufficient_history": verdicts.count(INSUFFICIENT),
            "deviation_shifts": verdicts.count(SHIFTED),
            "deviation_regressions": sum(1 for _, m in self.regressions if m.metric in watched),
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
