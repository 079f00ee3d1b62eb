"""`harness tune`'s search, as a state machine that launches nothing (docs/tune.md).

Per (model, gpus) group of a scenario's cells:

1. **Prune.** Cells the cluster cannot run (unsupported, cannot be placed) and cells the memory model says will
   not fit with `tune.memory_headroom` to spare are never launched.
2. **Dominance.** A cell is left out while another that fits is at least as fast by construction (`dominates`):
   the same strategy, precision, layout and knobs, a micro-batch at least as large, at least as many sequences
   per optimizer step, and checkpointing no stronger. Larger micro-batches do the same FLOPs per token in bigger
   kernels and pay each step's collectives and optimizer over more tokens; recomputation only adds work. Should
   every cell dominating it fail (an OOM the memory model did not foresee), it is back in the search.
3. **Rank.** The rest by predicted objective (harness.plan.time). A cell the model leaves null (compile on a CPU,
   offload) is ranked by its twin without that knob ("proxy: compile off"). Without a step-time prediction (no
   calibration, `harness tune --no-calibrate`), by the planner's exact counts, which need no rates: hardware FLOPs
   per token per GPU, then collective bytes per token, then collective calls per token ("counts"). A cell without
   any is unranked and measured after the ranked ones, in the seed's order.
4. **Successive halving.** Round 0 measures the best `first_round` candidates with few steps (a failed trial is
   replaced by the next candidate); each round keeps the better half (at least 2) by measured value and measures
   it with more steps; the steps double up to the scenario's own `measure_steps` in the final round.
5. **Confirm.** The final two run `confirm_runs` times each at the scenario's steps; the leader is ahead beyond
   noise when `harness compare`'s run-level test (Welch's t on log run values) gives p < alpha; otherwise one more
   run each, up to `max_runs`, after which they are tied (either is as good as the harness can tell).

A trial that ends OOM drops the group's unmeasured candidates that need at least as much memory by construction
(same strategy, precision, offload and layout; micro-batch at least as large; checkpointing no stronger). The
search is deterministic given the measured records and the seed, so a re-run replays it over the records already
there and goes on where it stopped.
"""

from __future__ import annotations

import dataclasses
import math
import random
import statistics
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from harness.plan.prediction import Prediction, TimePrediction
from harness.scenario.spec import SETTING_FIELDS, RunSpec
from harness.scenario.tune import TuneSpec
from harness.tune.log import CandidateLog, GroupLog, TrialLog

METRIC = {"throughput": ("tokens_per_s_per_gpu", "higher"), "step_time": ("step_time_s", "lower")}
"""objective → (the record metric judged, its good direction)"""
AC_STRENGTH = {"none": 0, "selective": 1, "full": 2}
"""activation checkpointing, by how much memory it saves"""
DOMINANCE_FREE = ("micro_batch", "grad_accum", "activation_checkpointing", "measure_steps")
"""the settings dominance compares; every other one (and model, gpus, strategy, precision) must be equal"""
_FAMILY_FIELDS = tuple(k for k in SETTING_FIELDS if k not in DOMINANCE_FREE)
RANK_TIERS = {"prediction": 0, "proxy": 0, "counts": 1}
"""rank sources, in the order their candidates are measured (a step time beats counts; unranked come last)"""
COUNTS_SOURCE = "counts: FLOPs, then bytes, then calls per token (no calibration)"
"""the rank source of a cell ranked by the planner's counts (harness.tune.search.counts_key)"""
PROXIES: tuple[tuple[str, Any, str], ...] = (("compile", False, "compile off"), ("offload", "none", "offload none"))
"""knobs the time model leaves null on some devices: a cell with one is ranked by its twin without it"""


@dataclass
class Trial:
    round: int
    spec: RunSpec
    """the trial's cell: the candidate with its round's measure_steps"""
    repeat: int
    status: str | None = None
    value: float | None = None
    reason: str = ""

    def to_log(self) -> TrialLog:
        """The trial as the log has it (a reason only where there is one)."""
        return TrialLog.model_validate(
            {
                "round": self.round,
                "run_id": self.spec.run_id,
                "repeat": self.repeat,
                "steps": self.spec.settings.measure_steps,
                "status": self.status,
                "value": self.value,
                **({"reason": self.reason} if self.reason else {}),
            }
        )


@dataclass
class Candidate:
    spec: RunSpec
    plan: Prediction
    """the cell's prediction (harness.plan.predict): memory, fits, predicted step time"""
    rank_key: tuple[float, ...] | None = None
    """predicted cost, lower is better: (tier, step time or seconds per token per GPU), or (tier, FLOPs, bytes,
    calls per token) for a cell ranked by counts"""
    dominators: list[Candidate] = field(default_factory=list)
    """the candidates that dominate it (`dominates`), best-ranked first; empty: none"""
    rank_source: str = "none"
    predicted_rank: int | None = None
    fate: str = "unmeasured"
    reason: str = ""
    trials: list[Trial] = field(default_factory=list)

    @property
    def label(self) -> str:
        return cell_label(self.spec)

    def add_trial(self, rnd: int, spec: RunSpec) -> Trial:
        """A new run of `spec`: the next repeat of its run_id (two rounds at the same steps are two runs)."""
        k = 1 + max((t.repeat for t in self.trials if t.spec.run_id == spec.run_id), default=0)
        t = Trial(rnd, spec, k)
        self.trials.append(t)
        return t

    def ok_values(self, rnd: int) -> list[float]:
        return [t.value for t in self.trials if t.round == rnd and t.status == "ok" and t.value is not None]

    @property
    def round(self) -> int:
        """The highest round with an ok trial (-1: never measured ok)."""
        return max((t.round for t in self.trials if t.status == "ok" and t.value is not None), default=-1)

    @property
    def measured(self) -> float | None:
        vals = self.ok_values(self.round)
        return statistics.median(vals) if vals else None

    def to_log(self) -> CandidateLog:
        """The candidate as the log has it: its cell, prediction, fate and trials."""
        mem = self.plan.memory_gib
        return CandidateLog.model_validate(
            {
                "run_id": self.spec.run_id,
                "label": self.label,
                "spec": self.spec,
                "predicted_step_time_s": self.plan.step_time_s,
                "predicted_tokens_per_s_per_gpu": self.plan.tokens_per_s_per_gpu,
                "predicted_memory_gib": mem.total if mem is not None else None,
                "rank_source": self.rank_source,
                "predicted_rank": self.predicted_rank,
                "fate": self.fate,
                "reason": self.reason,
                "round": self.round,
                "measured": self.measured,
                "trials": [t.to_log() for t in self.trials],
            }
        )


def cell_label(spec: RunSpec) -> str:
    """What tells a group's cells apart: strategy, micro-batch, accumulation, checkpointing and the rarer knobs."""
    s = spec.settings
    parts = [spec.strategy, spec.precision, f"mb {s.micro_batch}", f"ga {s.grad_accum}"]
    parts.append(f"ckpt {s.activation_checkpointing}")
    if s.compile:
        parts.append("compile")
    if s.offload != "none":
        parts.append(f"offload {s.offload}")
    if s.tp > 1 or s.pp > 1:
        parts.append(f"tp {s.tp} pp {s.pp}")
    return " ".join(parts)


def needs_more_memory(a: RunSpec, b: RunSpec) -> bool:
    """Whether cell `a` needs at least as much memory as `b` by construction (b ended OOM, so a would too)."""
    sa, sb = a.settings, b.settings
    same = (a.model, a.gpus, a.strategy, a.precision, sa.offload, sa.tp, sa.pp, sa.seq_len) == (
        b.model,
        b.gpus,
        b.strategy,
        b.precision,
        sb.offload,
        sb.tp,
        sb.pp,
        sb.seq_len,
    )
    return (
        same
        and sa.micro_batch >= sb.micro_batch
        and AC_STRENGTH[sa.activation_checkpointing] <= AC_STRENGTH[sb.activation_checkpointing]
    )


def dominates(a: RunSpec, b: RunSpec) -> bool:
    """Whether cell `a` is at least as fast as `b` by construction, `a` fitting: the same cell but for a
    micro-batch at least as large, at least as many sequences per optimizer step, and checkpointing no stronger
    (and not the same cell)."""
    sa, sb = a.settings, b.settings
    if (a.model, a.gpus, a.strategy, a.precision) != (b.model, b.gpus, b.strategy, b.precision):
        return False
    if any(getattr(sa, k) != getattr(sb, k) for k in _FAMILY_FIELDS):
        return False
    return (
        (sa.micro_batch, sa.grad_accum, sa.activation_checkpointing)
        != (sb.micro_batch, sb.grad_accum, sb.activation_checkpointing)
        and sa.micro_batch >= sb.micro_batch
        and sa.micro_batch * sa.grad_accum >= sb.micro_batch * sb.grad_accum
        and AC_STRENGTH[sa.activation_checkpointing] <= AC_STRENGTH[sb.activation_checkpointing]
    )


def dominance_reason(a: Candidate, b: Candidate) -> str:
    """Why `a` dominates `b`, in words."""
    sa, sb = a.spec.settings, b.spec.settings
    why = []
    if sa.micro_batch != sb.micro_batch:
        why.append(f"micro-batch {sa.micro_batch} > {sb.micro_batch}")
    if sa.micro_batch * sa.grad_accum != sb.micro_batch * sb.grad_accum:
        why.append(f"{sa.micro_batch * sa.grad_accum} > {sb.micro_batch * sb.grad_accum} sequences per step")
    if sa.activation_checkpointing != sb.activation_checkpointing:
        why.append(f"checkpointing {sa.activation_checkpointing} instead of {sb.activation_checkpointing}")
    state = {"winner": "the winner", "runner_up": "the runner-up"}.get(a.fate)
    state = state or ("measured" if a.round >= 0 else "predicted to fit")
    return f"dominated by {a.label} ({state}): the same cell with {', '.join(why)}"


def steps_schedule(n0: int, final_steps: int) -> list[int]:
    """measure_steps per round: halving from n0 candidates down to two, doubling up to the scenario's own
    `final_steps` in the final round (at least 2 steps: a median of one sample is that sample)."""
    rounds, n = 0, n0
    while n > 2:
        n, rounds = math.ceil(n / 2), rounds + 1
    return [max(2, final_steps >> (rounds - r)) if r < rounds else final_steps for r in range(rounds + 1)]


def search_cost(n0: int, confirm_runs: int) -> int:
    """Trial runs one group's search takes when nothing fails and the leader is ahead after `confirm_runs`."""
    total, n = 0, n0
    while n > 2:
        total, n = total + n, math.ceil(n / 2)
    return total + n * confirm_runs


def mark_dominated(cands: list[Candidate]) -> None:
    """Give each candidate still in the search its dominators among those; a candidate with one is `dominated`.
    `cands` in measuring order (the dominators are kept in that order)."""
    live = [c for c in cands if c.fate == "unmeasured"]
    for b in live:
        b.dominators = [a for a in live if a is not b and dominates(a.spec, b.spec)]
    for b in live:
        if b.dominators:
            b.fate = "dominated"


def _alive(c: Candidate) -> bool:
    """Whether a candidate can still be measured or was measured ok (not failed, nor dropped beside an OOM)."""
    return c.fate not in ("failed", "dropped_oom_neighbour", "unsupported", "pruned_memory")


class Group:
    """One (model, gpus) group's search."""

    def __init__(
        self,
        key: tuple[str, int],
        candidates: list[Candidate],
        *,
        tune: TuneSpec,
        n0: int,
        final_steps: int,
    ) -> None:
        self.key, self.candidates, self.tune = key, candidates, tune
        self.metric, self.better = METRIC[tune.objective]
        self.pool = [c for c in candidates if c.fate in ("unmeasured", "dominated")]
        self.n0 = min(n0, sum(c.fate == "unmeasured" for c in self.pool))
        self.steps = steps_schedule(max(self.n0, 1), final_steps)
        self.round = 0
        self.alive: list[Candidate] = []
        self.final = False
        self.verdict: str | None = None
        self.p_value: float | None = None
        self.winner: Candidate | None = None
        self.runner_up: Candidate | None = None
        self.stopped: str | None = None
        if not self.pool:
            self.verdict = "no winner"

    # -- measured values ------------------------------------------------------------------------------------
    def key_of(self, value: float) -> float:
        """Sort key: lower is better."""
        return -value if self.better == "higher" else value

    def _trial_spec(self, c: Candidate, rnd: int) -> RunSpec:
        steps = self.steps[min(rnd, len(self.steps) - 1)] if not self.final else self.steps[-1]
        return dataclasses.replace(c.spec, settings=dataclasses.replace(c.spec.settings, measure_steps=steps))

    def pending(self) -> list[Trial]:
        return [t for c in self.candidates for t in c.trials if t.status is None]

    @property
    def done(self) -> bool:
        return self.verdict is not None

    # -- the state machine ---------------------------------------------------------------------------------
    def next_trials(self) -> list[tuple[Candidate, Trial]]:
        """The trials to run next (empty when the search of this group is over). Call `absorb` with their
        records before asking again."""
        if self.done:
            return []
        if not self.final and self.round == 0:
            ok = [c for c in self.alive if c.ok_values(0)]
            want = self.n0 - len(ok) - len([c for c in self.alive if not c.trials[-1].status])
            fresh = [c for c in self.pool if c.fate == "unmeasured"][: max(0, want)]
            if fresh:
                out = []
                for c in fresh:
                    c.fate = "measured"
                    self.alive.append(c)
                    out.append((c, c.add_trial(0, self._trial_spec(c, 0))))
                return out
            self._close_round()
            return [] if self.done else self.next_trials()
        if self.final:
            return self._confirm_trials()
        return [(c, c.add_trial(self.round, self._trial_spec(c, self.round))) for c in self.alive]

    def absorb(self, results: Mapping[tuple[str, int], tuple[str, float | None, str]]) -> None:
        """Each pending trial's (status, value, reason), keyed by (run_id, repeat); OOM prunes the neighbours."""
        for c in self.candidates:
            for t in c.trials:
                if t.status is None and (t.spec.run_id, t.repeat) in results:
                    t.status, t.value, t.reason = results[(t.spec.run_id, t.repeat)]
                    if t.status == "ok" and t.value is None:
                        t.status, t.reason = "no_value", f"the record has no {self.metric}"
                    if t.status != "ok":
                        self._failed(c, t)
        if self.final:
            return
        if self.round > 0 and not self.pending():
            self._close_round()

    def _failed(self, c: Candidate, t: Trial) -> None:
        why = f"round {t.round} run {t.repeat}: {t.status}" + (f": {t.reason}" if t.reason else "")
        c.fate, c.reason = "failed", why
        if c in self.alive:
            self.alive.remove(c)
        if t.status == "oom":
            for o in self.pool:
                if o.fate in ("unmeasured", "dominated") and needs_more_memory(o.spec, c.spec):
                    o.fate = "dropped_oom_neighbour"
                    o.reason = f"needs at least the memory of {c.label}, which ran out of memory"
        for o in self.pool:  # NOTE: every cell that dominated it failed: it is back in the search, in its place
            if o.fate == "dominated" and not any(_alive(d) for d in o.dominators):
                o.fate, o.reason = "unmeasured", ""

    def _close_round(self) -> None:
        """Round `self.round` is measured: keep the better half, or enter the final stage."""
        ok = sorted(self.alive, key=lambda c: (self.key_of(c.ok_values(self.round)[0]), c.spec.run_id))
        if not ok:
            self.verdict = "no winner"
            return
        if len(ok) <= 2:
            self.alive, self.final = ok, True
            if len(ok) == 1:
                self._finish("alone", ok[0], None, None)
            elif self.steps[min(self.round, len(self.steps) - 1)] != self.steps[-1]:
                self.round += 1  # NOTE: measured with fewer steps than the final round's: confirmed afresh
            return
        keep = max(2, math.ceil(len(ok) / 2))
        for i, c in enumerate(ok[keep:], keep + 1):
            c.fate, c.reason = "eliminated", f"round {self.round}: {_ordinal(i)} of {len(ok)} (kept {keep})"
        self.alive = ok[:keep]
        self.round += 1
        if len(self.alive) <= 2:
            self.final = True

    def _confirm_trials(self) -> list[tuple[Candidate, Trial]]:
        if len(self.alive) < 2:
            if self.alive:
                self._finish("alone", self.alive[0], None, None)
            else:
                self.verdict = "no winner"
            return []
        a, b = self.alive
        va, vb = a.ok_values(self.round), b.ok_values(self.round)
        if min(len(va), len(vb)) >= self.tune.confirm_runs:
            from harness.compare.stats import run_level_p

            p = run_level_p(va, vb)
            a_leads = self.key_of(statistics.median(va)) <= self.key_of(statistics.median(vb))
            lead, runner = (a, b) if a_leads else (b, a)
            if p < self.tune.alpha:
                self._finish("ahead", lead, runner, p)
                return []
            if min(len(va), len(vb)) >= self.tune.max_runs:
                self._finish("tied", lead, runner, p)
                return []
        target = max(self.tune.confirm_runs, min(len(va), len(vb)) + 1)
        out = []
        for c, have in ((a, len(va)), (b, len(vb))):
            for _ in range(target - have):
                out.append((c, c.add_trial(self.round, self._trial_spec(c, self.round))))
        return out

    def stop(self, why: str) -> None:
        """The budget is spent: the best measured so far leads, unconfirmed."""
        if self.done:
            return
        for c in self.candidates:
            c.trials = [t for t in c.trials if t.status is not None]
            if c.fate == "measured" and not c.trials:  # NOTE: picked for the batch the budget refused
                c.fate = "unmeasured"
        self.alive = [c for c in self.alive if c.trials]
        self.stopped = why
        best = [c for c in self.alive if c.ok_values(c.round)]
        best.sort(key=lambda c: (-c.round, self.key_of(statistics.median(c.ok_values(c.round))), c.spec.run_id))
        if not best:
            self.verdict = "no winner"
            return
        runner = best[1] if len(best) > 1 else None
        self._finish("unconfirmed", best[0], runner, None)

    def _finish(self, verdict: str, winner: Candidate, runner: Candidate | None, p: float | None) -> None:
        self.verdict, self.winner, self.runner_up, self.p_value = verdict, winner, runner, p
        winner.fate = "winner"
        winner.reason = {
            "ahead": f"ahead of the runner-up beyond noise (p = {p:.3g})" if p is not None else "",
            "tied": f"not distinguishable from the runner-up after {self.tune.max_runs} runs (p = {p:.3g})"
            if p is not None
            else "",
            "alone": "the only candidate left",
            "unconfirmed": f"best measured when the search stopped ({self.stopped}); not confirmed",
        }[verdict]
        if runner is not None:
            runner.fate, runner.reason = "runner_up", ""
        for c in self.alive:
            if c not in (winner, runner) and c.fate == "measured":
                c.fate, c.reason = "eliminated", "the budget ran out"

    def close(self) -> None:
        """After the search: why each candidate never measured was left out (dominated by whom, ranked below
        the first round by what, or neither ranked nor reached)."""
        ranked = sum(1 for c in self.candidates if c.predicted_rank is not None)
        for c in self.candidates:
            if c.fate == "dominated":
                best = sorted((d for d in c.dominators if _alive(d)), key=lambda d: (-d.round, d.fate != "winner"))
                c.reason = dominance_reason(best[0], c)
            elif c.fate == "unmeasured" and self.stopped:
                c.reason = f"not reached: the search stopped ({self.stopped})"
            elif c.fate == "unmeasured" and c.predicted_rank is None:
                c.fate = "not_reached"
                c.reason = "no prediction and no counts to rank it by; the search ended before it was drawn"
            elif c.fate == "unmeasured":
                by = "by predicted " + ("step time" if self.metric == "step_time_s" else "throughput")
                if c.rank_source == COUNTS_SOURCE:
                    by = "by counts (FLOPs, bytes, calls per token; no calibration)"
                c.fate = "pruned_prediction"
                place = _ordinal(c.predicted_rank or 0)
                c.reason = f"ranked {place} of {ranked} {by}: below the first round's {self.n0}"
            elif c.fate == "measured":  # a search stopped between rounds
                c.fate, c.reason = "eliminated", c.reason or "the search stopped"

    def to_log(self) -> GroupLog:
        """The group as the log has it: its verdict and every candidate (winner, runner-up, then as measured)."""
        return GroupLog.model_validate(
            {
                "model": self.key[0],
                "gpus": self.key[1],
                "verdict": self.verdict,
                "p_value": self.p_value,
                "winner": self.winner.spec.run_id if self.winner else None,
                "runner_up": self.runner_up.spec.run_id if self.runner_up else None,
                "first_round": self.n0,
                "steps": self.steps,
                "candidates": [c.to_log() for c in _shown_order(self)],
            }
        )


def _shown_order(g: Group) -> list[Candidate]:
    """Winner, runner-up, then by round reached and measured value, then the rest by predicted rank."""
    fates = {"winner": 0, "runner_up": 1}

    def key(c: Candidate) -> tuple:
        m = c.measured
        return (
            fates.get(c.fate, 2),
            -c.round,
            g.key_of(m) if m is not None else math.inf,
            c.predicted_rank if c.predicted_rank is not None else math.inf,
            c.spec.run_id,
        )

    return sorted(g.candidates, key=key)


def _ordinal(i: int) -> str:
    return f"{i}{'th' if 10 <= i % 100 <= 20 else {1: 'st', 2: 'nd', 3: 'rd'}.get(i % 10, 'th')}"


def counts_key(plan: Prediction, spec: RunSpec) -> tuple[float, float, float] | None:
    """A cell's cost by the planner's exact counts, lower is better: hardware FLOPs per token per GPU (recompute
    included), then collective bytes per token, then collective calls per token (rank 0's; FLOPs compared to
    3 significant digits, so cells of the same model and work tie on them and are told apart by their traffic).
    None when the planner has no FLOPs or no collective model for the cell."""
    s = spec.settings
    tokens = s.micro_batch * s.grad_accum * s.seq_len  # per data-parallel rank per optimizer step
    dp = max(1, spec.gpus // (s.tp * s.pp))
    if plan.hardware_flops_per_step is None or plan.comm_bytes_per_step is None or tokens <= 0:
        return None
    from harness.plan.comm import predict_comm

    comm = predict_comm(spec)
    if comm is None:
        return None
    flops = float(f"{plan.hardware_flops_per_step / (tokens * dp) / spec.gpus:.3g}")
    return flops, plan.comm_bytes_per_step / tokens, float(comm["calls_per_step"]) / tokens


def rank_candidates(
    cands: list[Candidate],
    *,
    objective: str,
    predict_twin: Callable[[RunSpec], Prediction | TimePrediction],
    rng: random.Random,
    dominance: bool = True,
) -> None:
    """Set each unpruned candidate's rank key, source and predicted rank, and order `cands` for measurement:
    those with a predicted step time (or a twin's) by it, then those ranked by counts (`counts_key`), then the
    unranked in the seed's order; then (`dominance`) mark the dominated (`mark_dominated`: they keep their place
    in the order, and their rank)."""

    def cost(p: Prediction | TimePrediction) -> float | None:
        if objective == "throughput":
            v = p.tokens_per_s_per_gpu
            return 1.0 / v if v is not None and v > 0 else None
        v = p.step_time_s
        return float(v) if v is not None and v > 0 else None

    for c in cands:
        if c.fate != "unmeasured":
            continue
        k = cost(c.plan)
        if k is not None:
            c.rank_key, c.rank_source = (0, k), "prediction"
            continue
        for knob, off, name in PROXIES:
            if getattr(c.spec.settings, knob) != off:
                changes: dict[str, Any] = {knob: off}
                twin = dataclasses.replace(c.spec, settings=dataclasses.replace(c.spec.settings, **changes))
                k = cost(predict_twin(twin))
                if k is not None:
                    c.rank_key, c.rank_source = (0, k), f"proxy: {name}"
                    break
        if c.rank_key is None:
            counts = counts_key(c.plan, c.spec)
            if counts is not None:
                c.rank_key, c.rank_source = (1, *counts), COUNTS_SOURCE
    live = [c for c in cands if c.fate == "unmeasured"]
    draw = [rng.random() for _ in live]  # NOTE: one draw per live candidate, in order, ranked or not: the seed's
    ranked_at = sorted(
        (i for i, c in enumerate(live) if c.rank_key is not None), key=lambda i: (live[i].rank_key, draw[i])
    )
    ranked = [live[i] for i in ranked_at]
    for i, c in enumerate(ranked, 1):
        c.predicted_rank = i
    unranked = [c for c in live if c.rank_key is None]
    rng.shuffle(unranked)
    rest = [c for c in cands if c.fate != "unmeasured"]
    cands[:] = ranked + unranked + rest
    if dominance:
        mark_dominated(cands)
