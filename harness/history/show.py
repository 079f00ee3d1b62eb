"""`history show`: the stored series of the cells a filter picks, one series per cell and machine, with the change
points E-Divisive finds in each metric; `show_history` is the command's output."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from harness.compare.metrics import WATCHED
from harness.history import keys
from harness.history.changepoint import e_divisive
from harness.history.keys import is_exact, iso
from harness.history.render import render_show_json, render_show_table
from harness.history.rows import Cell, Machine, Run
from harness.history.store import HistoryStore, database_errors, open_store
from harness.history.verdicts import Rules


def cell_matches(cell: Cell, text: str | None) -> bool:
    """Every whitespace-separated term of `text` (case-insensitive) occurs in the cell's label, run_id or spec."""
    if not text:
        return True
    hay = f"{cell.label} {cell.run_id} {cell.key}".lower()
    return all(term in hay for term in text.lower().split())


def _change_points(runs: Sequence[Run], *, rules: Rules) -> dict[str, list[dict[str, Any]]]:
    """metric → its change points, as indices into `runs` with the levels on either side."""
    out: dict[str, list[dict[str, Any]]] = {}
    memo: dict[bytes, list[Any]] = {}
    for metric in keys.HISTORY_METRICS:
        if is_exact(metric):
            continue
        # NOTE: the time model's deviation is searched on measured / predicted = 1 + deviation (positive)
        shift = 1.0 if metric.kind == WATCHED else 0.0
        at = [i for i, r in enumerate(runs) if r.values.get(metric.name, -shift) + shift > 0]
        if len(at) < 2 * 2:
            continue
        y = np.log([runs[i].values[metric.name] + shift for i in at])
        centred = np.round(y - y.mean(), 9)
        # NOTE: throughput's log series is step time's negated and shifted: the same change points
        key = ((centred if centred[np.flatnonzero(centred)[:1]].sum() >= 0 else -centred) + 0.0).tobytes()
        if key not in memo:
            memo[key] = e_divisive(y, alpha=rules.alpha, permutations=rules.permutations)
        found = []
        bounds = [0, *(c.index for c in memo[key]), len(y)]
        for j, c in enumerate(memo[key]):
            before = float(np.median(y[bounds[j] : c.index]))
            after = float(np.median(y[c.index : bounds[j + 2]]))
            run = runs[at[c.index]]
            found.append(
                {
                    "index": at[c.index],
                    "time": iso(run.time),
                    "label": run.label,
                    "p_value": c.p_value,
                    "before": math.exp(before) - shift,
                    "after": math.exp(after) - shift,
                }
            )
        if found:
            out[metric.name] = found
    return out


def show_series(
    store: HistoryStore, *, cell_filter: str | None, last: int | None, rules: Rules | None = None
) -> list[dict[str, Any]]:
    """Every matching cell's series (per machine), oldest run first, the last `last` runs (all when None)."""
    rules = rules or Rules()
    out = []
    for cell in store.cells():
        if not cell_matches(cell, cell_filter):
            continue
        runs = store.runs_of(cell.id, limit=last)
        groups: dict[Machine, list[Run]] = {}
        for r in runs:
            groups.setdefault(r.machine, []).append(r)
        for group in groups.values():
            out.append(
                {
                    "key": cell.key,
                    "label": cell.label,
                    "run_id": cell.run_id,
                    "machine": group[0].machine.as_dict(),
                    "runs": [
                        {
                            "time": iso(r.time),
                            "label": r.label,
                            "status": r.status,
                            "values": r.values,
                            "software": r.software.as_dict(),
                        }
                        for r in group
                    ],
                    "change_points": _change_points(group, rules=rules),
                }
            )
    return out


def show_history(db: str, *, cell_filter: str | None, last: int, fmt: str) -> str:
    """`harness history show`'s output: the series `show_series` gives of the history `db` (the last `last` runs of
    each cell; 0: every run) as a table or, with `fmt` "json", one JSON document."""
    with database_errors(db):
        with open_store(db) as store:
            series = show_series(store, cell_filter=cell_filter, last=last or None)
    return render_show_json(series) if fmt == "json" else render_show_table(series)
