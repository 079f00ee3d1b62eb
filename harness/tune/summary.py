"""What a tune log says, summarised for people: per group the funnel (how many candidates each stage left), the
measured candidates ranked, and the table `harness tune` prints — its recommendation in the words `harness plan` and
the report's best-strategy table use (harness.plan.recommend: "recommended …", "runner-up …: 3.1% slower", the
lead's p and runs as the report judges them).

Pure functions of a `TuneLog` (harness.tune.log); the report draws and renders them (harness.report.tune,
harness.report.render), the cli prints `format_tune`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from harness.plan.recommend import (
    FASTEST_MEASURED,
    lead_words,
    no_recommendation_head,
    recommendation_head,
    runner_up_words,
    slower_words,
)
from harness.tune.log import CandidateLog, GroupLog, TuneLog

__all__ = ["Funnel", "format_tune", "funnel", "lead_of", "ranked_candidates", "slower_than"]


@dataclass(frozen=True)
class Funnel:
    """One (model, GPU count) group's search, stage by stage (counts of candidates)."""

    model: str
    gpus: int
    candidates: int
    """cells of the group"""
    unsupported: int
    """the catalogue does not support them on the device, or the cluster cannot place them"""
    pruned_memory: int
    """the memory model says they do not fit (with the headroom)"""
    pruned_prediction: int
    """ranked below the first round (by predicted step time, or by counts), never measured"""
    dominated: int
    """another cell that fits is at least as fast by construction, never measured"""
    not_reached: int
    """neither ranked nor drawn before the search ended, never measured"""
    dropped_oom_neighbour: int
    """need at least the memory of a cell that ran out of it"""
    measured_per_round: tuple[int, ...]
    """candidates measured in each round, round 0 first"""
    failed: int
    """a trial of theirs failed"""
    unmeasured: int
    """not reached (a budget stopped the search)"""
    winner: str | None
    """the winner's label; None: no winner"""
    runner_up: str | None
    """the runner-up's label; None: none"""
    verdict: str | None
    """how the search ended (harness.tune.log.Verdict)"""
    p_value: float | None
    """the winner against the runner-up, compare's run-level test"""
    steps: tuple[int, ...]
    """measure_steps per round (steps)"""


def funnel(log: TuneLog) -> list[Funnel]:
    """Per (model, GPU count) group, in the log's order: the funnel."""
    rows = []
    for g in log.groups:
        counts = g.fate_counts()
        rows.append(
            Funnel(
                model=g.model,
                gpus=g.gpus,
                candidates=len(g.candidates),
                unsupported=counts.get("unsupported", 0),
                pruned_memory=counts.get("pruned_memory", 0),
                pruned_prediction=counts.get("pruned_prediction", 0),
                dominated=counts.get("dominated", 0),
                not_reached=counts.get("not_reached", 0),
                dropped_oom_neighbour=counts.get("dropped_oom_neighbour", 0),
                measured_per_round=tuple(
                    sum(r in c.measured_rounds() for c in g.candidates) for r in range(g.n_rounds())
                ),
                failed=counts.get("failed", 0),
                unmeasured=counts.get("unmeasured", 0),
                winner=g.label_of("winner"),
                runner_up=g.label_of("runner_up"),
                verdict=g.verdict,
                p_value=g.p_value,
                steps=tuple(g.steps),
            )
        )
    return rows


_FATE_ORDER = {"winner": 0, "runner_up": 1, "failed": 3}
"""the fates ranked apart from the rest (2): the winner and the runner-up first, the failed last"""


def ranked_candidates(group: GroupLog, *, better: str) -> list[CandidateLog]:
    """The group's measured candidates, best first: the winner, the runner-up, then by round reached (highest
    first), by the measured metric (best first; `better` is "higher" or "lower"), the failed last."""
    sign = -1.0 if better == "higher" else 1.0

    def key(c: CandidateLog) -> tuple:
        v = c.measured
        return (
            _FATE_ORDER.get(c.fate, 2),
            -c.round,
            v is None,
            0.0 if v is None else sign * v,
            c.predicted_rank is None,
            c.predicted_rank or 0,
            c.label,
        )

    return sorted((c for c in group.candidates if c.was_run()), key=key)


VERDICT_SHOWN = {"ahead": "ahead of the runner-up", "tied": "tied with the runner-up"}
"""a verdict as the table's head words it: what it was judged against (never the cells not measured)"""
FATE_SHOWN = {"runner_up": "runner-up"}
"""a fate as the table words it (the others as they are)"""
_RIGHT = (0, 2, 3, 4, 5)
"""the table's numeric columns (right-aligned)"""


def _aligned(rows: list[list[str]]) -> list[str]:
    """Rows (the header first) as text columns two spaces apart, indented by two."""
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return [
        "  " + "  ".join(v.rjust(w) if i in _RIGHT else v.ljust(w) for i, (v, w) in enumerate(zip(r, widths))).rstrip()
        for r in rows
    ]


def lead_of(log: TuneLog, win: CandidateLog, runner: CandidateLog | None, verdict: str | None, p: float | None) -> str:
    """How the search judged its winner, in harness.plan.recommend's words (the report's "judged" column says a lead
    so): the run-level test's p and runs for a lead or a tie, else why there was no test."""
    if verdict in ("ahead", "tied") and runner is not None:
        runs = (win.ok_runs_in(win.round), runner.ok_runs_in(runner.round))
        return lead_words(judged=p is not None, distinguishable=verdict == "ahead", p=p, runs=runs)
    if verdict == "alone":
        return "the only candidate left"
    return win.reason or str(verdict)


def slower_than(log: TuneLog, win: CandidateLog, other: CandidateLog) -> str | None:
    """'3.1% slower': the other's measured time for the same tokens over the winner's (None without both values)."""
    a, b = win.measured, other.measured
    if not isinstance(a, (int, float)) or not isinstance(b, (int, float)) or a <= 0 or b <= 0:
        return None
    return slower_words(a / b - 1.0 if log.better == "higher" else b / a - 1.0)


def _group_lines(log: TuneLog, g: GroupLog, *, unit: str, shown: Callable[[float | None], str]) -> list[str]:
    """One group's part of the table: what it recommends (harness.plan.recommend's words: `harness plan` and the
    report say it so), the runner-up and how much slower it is, its measured candidates, what was not measured."""
    win = next((c for c in g.candidates if c.fate == "winner"), None)
    runner = next((c for c in g.candidates if c.fate == "runner_up"), None)
    counts = g.fate_counts()
    run = sum(1 for c in g.candidates if c.was_run())
    if win is None:
        head = no_recommendation_head(g.model, g.gpus, str(g.verdict))
    else:
        basis = f"{FASTEST_MEASURED}; {lead_of(log, win, runner, g.verdict, g.p_value)}"
        tied = runner.label if g.verdict == "tied" and runner is not None else None
        head = recommendation_head(g.model, g.gpus, win.label, basis=basis, tied_with=tied)
        head += f", the best of {run} measured"
    if win and counts.get("not_reached", 0):
        head += f"; {counts['not_reached']} neither ranked nor measured could be faster"
    second = []
    if win is not None and runner is not None:
        gap = slower_than(log, win, runner)
        second = [f"  {runner_up_words(runner.label, gap or 'not measured alike')}"]
    header = ["#", "cell", f"predicted {unit}", f"measured {unit}", "runs", "round", "fate"]
    rows = []
    for i, c in enumerate([c for c in g.candidates if c.trials], 1):
        fate = FATE_SHOWN.get(c.fate, c.fate)
        if c.fate == "failed":
            fate += f": {(c.reason or '')[:60]}"
        pred = c.prediction(log.metric)
        runs = c.ok_runs_in(c.round)
        rows.append([str(i), c.label, shown(pred), shown(c.measured), str(runs), str(c.round), fate])
    tail = (
        f"  measured {run} of {len(g.candidates)} cells; not measured: {counts.get('dominated', 0)} dominated, "
        f"{counts.get('pruned_prediction', 0)} ranked below the first round, {counts.get('not_reached', 0)} not "
        f"reached, {counts.get('pruned_memory', 0)} predicted not to fit, {counts.get('dropped_oom_neighbour', 0)} "
        f"beside an OOM, {counts.get('unsupported', 0)} unsupported; first round {g.first_round}, steps {g.steps}"
    )
    return ["", head, *second, *_aligned([header, *rows]), tail]


def format_tune(log: TuneLog) -> str:
    """The ranked table per group, as `harness tune` prints it: the measured candidates (measured and predicted,
    the runs ok in the round each reached, its fate), then what was left without a measurement and why."""
    per_gpu = log.metric == "tokens_per_s_per_gpu"
    unit = "tok/s/GPU" if per_gpu else "step ms"

    def shown(v: float | None) -> str:
        if not isinstance(v, (int, float)):
            return "n/a"
        return f"{v:,.0f}" if per_gpu else f"{v * 1e3:.1f}"

    lines = [
        f"tune {log.scenario} on {log.cluster}: objective {log.objective} ({log.better} {unit} is better), "
        f"{log.trials} trial runs, {log.measured_s or 0:.0f} s measuring"
        + (f"; stopped: {log.stopped}" if log.stopped else "")
    ]
    for g in log.groups:
        lines += _group_lines(log, g, unit=unit, shown=shown)
    return "\n".join(lines)
