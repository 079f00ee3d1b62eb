"""Judging a new sweep against the history, cell by cell: is tonight's run of each cell a regression?

Per cell: a cell whose last run in the history was ok and that is not ok tonight is a regression (newly failing);
an ok cell's metrics are judged one by one against its ok runs on the same kind of machine (same cluster profile,
device type, name and count, driver; fields a record lacks match anything) by harness.history.metric_judge,
which also holds the rules (between-run noise band, change points, sustained shifts, exact metrics, the time
model's deviation) and their calibration. Several runs of a cell tonight (`harness sweep --repeat K`, or `history
check --confirm K`'s re-runs): the median of their values is tonight's value (the latest run decides the cell's
status).
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Sequence
from dataclasses import replace

import numpy as np

from harness.history import keys
from harness.history.keys import Entry
from harness.history.metric_judge import ChangePoints, judge_metric, series_of
from harness.history.rows import Machine, Run
from harness.history.store import HistoryStore
from harness.history.verdicts import (
    FAILING,
    JUDGED,
    NEW_CELL,
    NEWLY_FAILING,
    STILL_FAILING,
    CellVerdict,
    HistoryCheck,
    Rules,
)


@functools.cache
def same_machine(history: Machine, tonight: Machine) -> bool:
    """Whether a history run was measured on tonight's kind of machine: device type, name and count and driver
    agree (a field either side lacks matches anything; the cluster profile is matched by the query)."""
    for theirs, mine in (
        (history.device_type, tonight.device_type),
        (history.device_name, tonight.device_name),
        (history.device_count, tonight.device_count),
        (history.driver, tonight.driver),
    ):
        if mine is not None and theirs is not None and mine != theirs:
            return False
    return True


def judge_cell(entry: Entry, runs: Sequence[Run], *, rules: Rules) -> CellVerdict:
    """One cell tonight (`entry`) against its runs in the history (oldest first, tonight's own run excluded)."""
    cell = CellVerdict(key=entry.cell, label=entry.label, run_id=entry.run_id, status=entry.status, state=JUDGED)
    cell.entry = entry
    cell.history_runs = len(runs)
    cell.last_status = runs[-1].status if runs else None
    ok = entry.status == "ok"
    if not runs:
        cell.state = NEW_CELL if ok else FAILING
    elif not ok:
        cell.state = NEWLY_FAILING if cell.last_status == "ok" else STILL_FAILING
        return cell
    elif cell.last_status != "ok":
        cell.notes.append(f"newly fixed: the last run in the history was {cell.last_status}")
    if not ok:
        return cell
    here = Machine.of(entry.machine)
    mine = [r for r in runs if r.status == "ok" and same_machine(r.machine, here)]
    if len(mine) < sum(r.status == "ok" for r in runs):
        cell.notes.append(f"{sum(r.status == 'ok' for r in runs) - len(mine)} ok run(s) on another device left out")
    searches = ChangePoints(rules)
    for metric in keys.HISTORY_METRICS:
        series = series_of(mine, metric.name, window=rules.window)
        value = entry.values.get(metric.name)
        if metric.phase is not None and value is None and not series.values:
            continue  # a phase this cell never ran (trace, checkpoint): no row, as before the phase existed
        cell.metrics.append(judge_metric(metric, series, value, entry, rules=rules, searches=searches))
    return cell


def tonight_of(entries: Sequence[Entry]) -> Entry:
    """One cell's runs tonight as the one entry judged: the latest run (its status, time, software), valued at
    the median of the ok runs' values when there are several."""
    latest = max(entries, key=lambda e: e.time)
    ok = [e for e in entries if e.status == "ok"]
    if len(ok) < 2 or latest.status != "ok":
        return latest
    names = {name for e in ok for name in e.values}
    values = {}
    for name in names:
        vs = [e.values[name] for e in ok if name in e.values]
        values[name] = float(np.median(vs))
    return replace(latest, values=values)


def check_entries(
    store: HistoryStore, entries: Iterable[Entry], *, rules: Rules, sources: Sequence[str], records: int
) -> HistoryCheck:
    """Judge tonight's entries against the history in `store`: each cell once, on the median of its ok runs
    tonight (one run: its values), its status the latest run's."""
    rules = rules.checked()
    groups: dict[str, list[Entry]] = {}
    for e in entries:
        groups.setdefault(e.cell, []).append(e)
    chosen = {key: tonight_of(group) for key, group in groups.items()}
    warnings: list[str] = []
    ids = store.cell_ids(chosen)
    cells = []
    # NOTE: a run per history value and a few more for failed runs among them (a cell failing often has fewer
    # history values; reading twice the window cost a third of a 1,000-cell check)
    limit = rules.window + 2 * rules.recent
    for key in sorted(chosen, key=lambda k: (chosen[k].label, k)):
        entry = chosen[key]
        mine = {e.uid for e in groups[key]}
        runs = []
        if key in ids:
            # NOTE: the runs before tonight's: a sweep already added (or an old one checked again) is judged
            # against what came before it, never against itself or later nights
            stored = store.runs_of(ids[key], cluster=entry.machine["cluster"], limit=limit, until=entry.time)
            runs = [r for r in stored if r.uid not in mine]
        cell = judge_cell(entry, runs, rules=rules)
        cell.runs = max(1, sum(e.status == "ok" for e in groups[key])) if entry.status == "ok" else 1
        if cell.runs > 1:
            cell.notes.append(f"tonight: the median of {cell.runs} runs")
        cells.append(cell)
    return HistoryCheck(
        cells=cells, rules=rules, db=store.where, sources=list(sources), records=records, warnings=warnings
    )
