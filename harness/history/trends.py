"""Trends for `harness report --history DB`: each cell's stored series of one metric, with the noise band that
`history check` applied to every run and the change points in the series, as plain data (lists and dicts) that
the report draws without importing the history.

A run's band is the out-of-band rule of harness.history.metric_judge applied to it against the runs before it (at most
`window` of them): the level (median of the recent stable values) ± max(k·σ·inflation, threshold) in log space,
σ the between-run noise of those runs. A run with fewer than `min_history` ok values before it has no band (the
judge reports such a run and never flags it). The change points are those of `history show` (E-Divisive means
over the whole stored series).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from harness.history import keys
from harness.history.metric_judge import INFLATE, noise_sigma, recent_level
from harness.history.show import show_series
from harness.history.store import HistoryStore
from harness.history.verdicts import Rules

DEFAULT_METRIC = "step_time_s"


def bands(
    values: Sequence[float | None],
    *,
    lower_is_better: bool,
    threshold: float,
    rules: Rules,
    change_points: Sequence[int] = (),
) -> list[Any]:
    """For each value, (level, low, high) of the band the judge held it to against the values before it, or None
    where it had too few positive values before it (or is itself null). `change_points` (indices into `values`)
    bound the level as they bound the judge's: after a shift, the values since it are the level once there are
    min_history of them."""
    orient = 1.0 if lower_is_better else -1.0
    out: list[Any] = []
    before: list[float] = []  # oriented logs of the positive values so far
    starts: list[int] = []  # where each change point falls in `before`
    thr = math.log1p(threshold)
    for i, v in enumerate(values):
        if i in change_points:
            starts.append(len(before))
        y = before[-rules.window :]
        if v is None or v <= 0 or len(y) < rules.min_history:
            out.append(None)
        else:
            sigma = noise_sigma(y)
            half = max(rules.k * sigma * (1 + INFLATE / max(len(y) - 1, 1)), thr)
            since = max((c - (len(before) - len(y)) for c in starts if c < len(before)), default=0)
            level = recent_level(y, rules=rules, since=max(since, 0))
            lo, hi = sorted((math.exp(orient * (level - half)), math.exp(orient * (level + half))))
            out.append((math.exp(orient * level), lo, hi))
        if v is not None and v > 0:
            before.append(orient * math.log(v))
    return out


def trend_series(
    store: HistoryStore,
    *,
    cell_filter: str | None = None,
    last: int | None = None,
    metric: str = DEFAULT_METRIC,
    rules: Rules | None = None,
) -> dict[str, Any]:
    """{"metric", "unit", "lower_is_better", "series": [{label, run_id, machine, runs: [{time, label, status,
    value, band}], change_points: [{index, time, label, before, after, p_value}], out_of_band: [run indices]}]}"""
    rules = (rules or Rules()).checked()
    m = next((m for m in keys.HISTORY_METRICS if m.name == metric), None)
    if m is None:
        raise KeyError(metric)
    out = []
    for s in show_series(store, cell_filter=cell_filter, last=last, rules=rules):
        runs = s["runs"]
        values = [r["values"].get(metric) if r["status"] == "ok" else None for r in runs]
        cps = s["change_points"].get(metric, [])
        b = bands(
            values,
            lower_is_better=m.lower_is_better,
            threshold=rules.threshold(metric),
            rules=rules,
            change_points=[cp["index"] for cp in cps],
        )
        rows = [
            {
                "time": r["time"],
                "label": r["label"],
                "status": r["status"],
                "value": v,
                "band": None if band is None else {"level": band[0], "low": band[1], "high": band[2]},
            }
            for r, v, band in zip(runs, values, b)
        ]
        out.append(
            {
                "label": s["label"],
                "run_id": s["run_id"],
                "machine": s["machine"],
                "runs": rows,
                "change_points": cps,
                "out_of_band": [
                    i
                    for i, r in enumerate(rows)
                    if r["band"] is not None and not r["band"]["low"] <= r["value"] <= r["band"]["high"]
                ],
            }
        )
    return {"metric": metric, "unit": m.unit, "lower_is_better": m.lower_is_better, "series": out}
