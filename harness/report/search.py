"""The search sections of the report: one per `harness tune` log (harness.report.tune reads them) — a line of
facts, the funnel table, the search figure, and each group's measured candidates ranked, as tables
(harness.report.table) for both pages.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from harness.report.formats import (
    ABSENT,
    NA,
    fmt_int,
    fmt_ms,
    fmt_p,
    fmt_signed_pct,
    fmt_text,
    fmt_tokens,
    gpus_label,
    is_null,
    shorten,
)
from harness.report.table import Cell, Column, Table, text_cells
from harness.report.tune import metric_unit
from harness.results.spec import spec_to_json
from harness.tune.log import GroupLog, TuneLog
from harness.tune.summary import VERDICT_SHOWN, funnel, ranked_candidates

MAX_REASON = 300
"""a candidate's reason in the ranked tables, characters at most (one line)"""

FUNNEL_HEADER = (
    "model",
    "GPUs",
    "candidates",
    "unsupported",
    "pruned: memory",
    "pruned: dominated",
    "pruned: ranked below",
    "dropped: OOM neighbour",
    "measured per round",
    "failed",
    "not reached",
    "winner",
    "verdict",
    "p",
)
_FUNNEL_NUM = {1, 2, 3, 4, 5, 6, 7, 9, 10, 13}
_RANKED_NUM = {0, 2, 3, 4, 5, 6, 7}
_FATE_TEXT = {
    "runner_up": "runner-up",
    "dropped_oom_neighbour": "dropped (OOM neighbour)",
    "pruned_prediction": "ranked below",
    "not_reached": "not reached",
    "unmeasured": "not reached",
    "pruned_memory": "predicted not to fit",
}


@dataclass(frozen=True)
class SearchGroup:
    title: str
    """model · GPU count: the verdict (and its p-value)"""
    ranked: Table | None
    """its measured candidates, best first; None when nothing was measured"""
    left_out: Table | None = None
    """its candidates never measured, each with why (dominated by which cell, ranked below the first round by
    what, predicted not to fit, …); None when every candidate was measured"""


@dataclass(frozen=True)
class SearchSection:
    title: str
    facts: str
    """one line: what was searched for, on which cluster, what it cost, how it ended"""
    funnel: Table
    figure: str
    """the name of its figure (drawn in place, not in the list of figures)"""
    groups: tuple[SearchGroup, ...]


def _facts(log: TuneLog) -> str:
    budget = log.budget
    given = (("cells", budget.cells), ("minutes", budget.minutes)) if budget is not None else ()
    limits = [f"{v} {k}" for k, v in given if not is_null(v)]
    if log.stopped:
        end = f"stopped early ({log.stopped})"
    else:
        end = "not finished" if log.finished is False else "finished"
    measured_s = log.measured_s
    return (
        f"objective {log.objective} ({log.metric}, {log.better} is better); scenario "
        f"{fmt_text(log.scenario)} on {fmt_text(log.cluster)}; {fmt_int(log.trials)} trial "
        f"runs, {NA if is_null(measured_s) else f'{measured_s:,.0f} s'} measuring; {end}; budget "
        f"{', '.join(limits) or 'none'}; seed {fmt_text(log.seed)}; log {log.path or NA}"
    )


def _funnel_table(log: TuneLog) -> Table:
    rows = [
        [
            str(r.model),
            fmt_int(r.gpus),
            str(r.candidates),
            str(r.unsupported),
            str(r.pruned_memory),
            str(r.dominated),
            str(r.pruned_prediction),
            str(r.dropped_oom_neighbour),
            " → ".join(map(str, r.measured_per_round)) or "none",
            str(r.failed),
            str(r.unmeasured + r.not_reached),
            r.winner or ABSENT,
            str(r.verdict),
            fmt_p(r.p_value),
        ]
        for r in funnel(log)
    ]
    columns = tuple(Column(h, right=i in _FUNNEL_NUM) for i, h in enumerate(FUNNEL_HEADER))
    return Table(columns, tuple(text_cells(r) for r in rows))


def _fmt_metric(metric: str) -> Callable[[Any], str]:
    return fmt_ms if metric == "step_time_s" else fmt_tokens


def _ranked_columns(metric: str) -> tuple[Column, ...]:
    unit = metric_unit(metric)[1]
    header = [
        "#",
        "candidate",
        "predicted rank",
        f"predicted {unit}",
        f"measured {unit}",
        "measured vs predicted",
        "round reached",
        "runs ok",
        "fate",
        "reason",
    ]
    return tuple(Column(h, right=i in _RANKED_NUM, cls="reason" if h == "reason" else "") for i, h in enumerate(header))


def _ranked_table(log: TuneLog, group: GroupLog) -> Table | None:
    """The group's measured candidates, best first; the candidate's hover text is its run_id and spec."""
    metric, fmt = log.metric, _fmt_metric(log.metric)
    rows = []
    for i, c in enumerate(ranked_candidates(group, better=log.better), start=1):
        pred, meas = c.prediction(metric), c.measured
        dev = None if pred is None or meas is None or not pred else meas / pred - 1
        ok, n = c.trial_counts()
        fields = spec_to_json(c.spec) if c.spec is not None else {}
        spec = ", ".join(f"{k}={v}" for k, v in fields.items() if not isinstance(v, (dict, list)))
        rows.append(
            (
                Cell(str(i)),
                Cell(c.label, title=f"{c.run_id}: {spec}" if spec else c.run_id),
                Cell(fmt_int(c.predicted_rank), title=fmt_text(c.rank_source)),
                Cell(fmt(pred)),
                Cell(fmt(meas)),
                Cell(fmt_signed_pct(dev)),
                Cell(str(c.round), title="") if c.round >= 0 else Cell(ABSENT, title="no run ended ok"),
                Cell(f"{ok} of {n}"),
                Cell(_FATE_TEXT.get(c.fate, c.fate)),
                Cell(shorten(c.reason or "", MAX_REASON)),
            )
        )
    return Table(_ranked_columns(metric), tuple(rows)) if rows else None


_LEFT_OUT_ORDER = ("dominated", "pruned_prediction", "not_reached", "unmeasured", "dropped_oom_neighbour")
"""the fates of candidates never measured, in the order the left-out table lists them (then the pruned by memory
and the unsupported)"""


def _left_out_table(log: TuneLog, group: GroupLog) -> Table | None:
    """The group's candidates never measured: the cell, its fate, its prediction and why it was left out."""
    fmt = _fmt_metric(log.metric)
    order = {f: i for i, f in enumerate(_LEFT_OUT_ORDER)}
    never = sorted(
        (c for c in group.candidates if not c.was_run()),
        key=lambda c: (order.get(c.fate, len(order)), c.predicted_rank or 0, c.label),
    )
    rows = tuple(
        (
            Cell(c.label, title=c.run_id),
            Cell(_FATE_TEXT.get(c.fate, c.fate)),
            Cell(fmt_int(c.predicted_rank), title=fmt_text(c.rank_source)),
            Cell(fmt(c.prediction(log.metric))),
            Cell(shorten(c.reason or "", MAX_REASON)),
        )
        for c in never
    )
    unit = metric_unit(log.metric)[1]
    columns = (
        Column("left out"),
        Column("fate"),
        Column("predicted rank", right=True),
        Column(f"predicted {unit}", right=True),
        Column("why", cls="reason"),
    )
    return Table(columns, rows) if rows else None


def _group_title(group: GroupLog) -> str:
    p = group.p_value
    verdict = VERDICT_SHOWN.get(group.verdict or "", group.verdict)
    run = sum(1 for c in group.candidates if c.was_run())
    judged = f"{verdict}" + ("" if is_null(p) else f" (p = {p:.3g})")
    return f"{group.model} · {gpus_label(group.gpus)}: {judged}; {run} of {len(group.candidates)} cells measured"


def search_sections(tune: tuple[tuple[TuneLog, str], ...]) -> tuple[SearchSection, ...]:
    """One section per (tune log, the name of its figure)."""
    return tuple(
        SearchSection(
            title=f"Search (harness tune): {log.sweep or log.scenario or 'sweep'}",
            facts=_facts(log),
            funnel=_funnel_table(log),
            figure=figure,
            groups=tuple(
                SearchGroup(_group_title(g), _ranked_table(log, g), _left_out_table(log, g)) for g in log.groups
            ),
        )
        for log, figure in tune
    )
