"""`harness tune`'s driver: the search (harness.tune.search) over a scenario's cells, its trials run by the sweep.

Every trial is an ordinary sweep cell in RESULTS/<scenario>-tune/ (its record, manifest entry and lock: `harness
status` and `harness report` read them as any sweep's); a batch of trials is one `run_sweep` call (locally one
after another, on SLURM submitted together). The search's state goes to `tune.json` in the same folder after
every batch, atomically; the winners to `tuned.yaml`. A re-run replays the search over the records already there
(`run_sweep` skips every trial with an ok record) and goes on.

On a terminal, a status line (harness.core.progress) counts the trials run against the search's expected number
(`expected_trials`: `~N`, an estimate, since a failed candidate or a close race changes it) with an ETA from the
mean time of a trial so far; each batch's sweep adds its own cells' count to the same line.
"""

from __future__ import annotations

import functools
import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from harness.compare.metrics import METRICS_BY_NAME, metric_value
from harness.core.errors import InputError, Problem
from harness.core.progress import Progress
from harness.results.store import (
    TUNE_LOG,
    atomic_write_json,
    atomic_write_text,
    read_record,
    record_path,
    sweep_dir,
    utc_now,
)
from harness.scenario.cluster import Cluster
from harness.scenario.schema import Scenario
from harness.scenario.spec import SETTING_DEFAULTS, SETTING_FIELDS, RunSpec
from harness.scenario.tune import TuneSpec
from harness.tune.log import TUNE_VERSION, Budget, LeftOut, TuneCalibration, TuneLog, TuneSettings
from harness.tune.search import METRIC, Candidate, Group, Trial, rank_candidates, search_cost

TUNED_FILE = "tuned.yaml"
EXPLICIT = ("micro_batch", "grad_accum", "activation_checkpointing")
"""settings a winner's entry in tuned.yaml always names: what the search chose, even where it is the default"""


@dataclass
class TuneResult:
    log: TuneLog
    """the log as written last"""
    folder: Path
    """the tune's sweep folder: its trials' records, tune.json"""
    tuned_file: Path | None
    """the winners' scenario file; None: no group has a winner"""


def tune_sweep_name(scenario: Scenario) -> str:
    return f"{scenario.name}-tune"


def least_budget(groups: int, tune: TuneSpec) -> int:
    """The fewest trial runs a search of `groups` groups can be judged in: two candidates, confirm_runs each."""
    return groups * search_cost(2, tune.confirm_runs)


def build_groups(
    scenario: Scenario, cluster: Cluster, *, seed: int, budget_cells: int | None
) -> tuple[list[Group], list[tuple[dict[str, Any], str]]]:
    """The search's groups with every candidate pruned or ranked, and the matrix cells left out (global batch).
    Raises InputError when the budget cannot judge even two candidates per group."""
    from harness.plan.placement import capacity
    from harness.plan.predict import plan_cells, usable_memory_gib
    from harness.plan.time import time_prediction

    tune = scenario.tune or TuneSpec()
    from harness.launch.local.launchers import local_gpus

    specs, left_out = scenario.expand_all(gpus_per_node=cluster.gpus_per_node)
    cap = capacity(cluster, gpus=local_gpus)
    plans = {c.spec.run_id: c for c in plan_cells(specs, cluster, cap=cap)}
    usable = usable_memory_gib(cluster)
    limit = usable * (1.0 - tune.memory_headroom) if usable is not None else None
    by_group: dict[tuple[str, int], list[Candidate]] = {}
    for spec in specs:
        planned = plans[spec.run_id]
        plan = planned.prediction
        c = Candidate(spec=spec, plan=plan)
        why = spec.unsupported_reason(cluster.device) or planned.cannot_place
        total = plan.memory_gib.total if plan.memory_gib is not None else None
        if why:
            c.fate, c.reason = "unsupported", str(why)
        elif plan.fits is False:
            c.fate, c.reason = "pruned_memory", str(plan.reason)
        elif limit is not None and total is not None and total > limit:
            c.fate = "pruned_memory"
            c.reason = (
                f"predicted {total:.2f} GiB per rank > {limit:.2f} GiB ({usable:.2f} GiB usable less the "
                f"{tune.memory_headroom:.0%} headroom of tune.memory_headroom)"
            )
        by_group.setdefault((spec.model, spec.gpus), []).append(c)
    n0 = tune.first_round
    if budget_cells is not None:
        need = least_budget(len(by_group), tune)
        if budget_cells < need:
            raise InputError(
                [
                    Problem(
                        "--budget-cells",
                        "",
                        f"{budget_cells} trial runs cannot judge {len(by_group)} group(s) (model x gpus): the least "
                        f"search is 2 candidates x {tune.confirm_runs} runs (tune.confirm_runs) per group = {need}",
                    )
                ]
            )
        while n0 > 2 and len(by_group) * search_cost(n0, tune.confirm_runs) > budget_cells:
            n0 -= 1
    groups = []
    for key, cands in by_group.items():
        rng = random.Random(f"{seed}/{key[0]}/{key[1]}")
        rank_candidates(cands, objective=tune.objective, predict_twin=lambda s: time_prediction(s, cluster), rng=rng)
        groups.append(Group(key, cands, tune=tune, n0=n0, final_steps=_final_steps(cands)))
    return groups, left_out


def _final_steps(cands: list[Candidate]) -> int:
    return max((c.spec.settings.measure_steps for c in cands), default=SETTING_DEFAULTS["measure_steps"])


@dataclass
class Search:
    """One `harness tune` run over its groups: what it searches and what it has spent so far (`log` is a snapshot
    of both, as tune.json has it)."""

    scenario: Scenario
    cluster: Cluster
    groups: list[Group]
    left_out: list[tuple[dict[str, Any], str]]
    """matrix cells that are no candidate, and why"""
    seed: int
    budget: Budget
    started_at: str
    """ISO-8601 UTC, to the second"""
    started_s: float
    """time.time() at the start (s since the epoch): what --budget-minutes counts from"""
    batches: int = 0
    """batches of trials run so far"""
    trials: int = 0
    """trial runs so far"""
    measured_s: float = 0.0
    """wall time of their sweeps (s)"""
    stopped: str | None = None
    """why the search stopped early: budget | interrupted"""
    calibration: TuneCalibration | None = None
    """the calibration its ranking used, or why none"""

    def log(self, *, finished: bool) -> TuneLog:
        """The log as tune.json has it now (`finished`: the search is over, `finished_at` is now)."""
        tune = self.scenario.tune or TuneSpec()
        metric, better = METRIC[tune.objective]
        return TuneLog.model_validate(
            {
                "tune_version": TUNE_VERSION,
                "scenario": self.scenario.name,
                "scenario_file": str(Path(self.scenario.path).resolve()),
                "overrides": list(self.scenario.overrides),
                "sweep": tune_sweep_name(self.scenario),
                "cluster": self.cluster.name,
                "objective": tune.objective,
                "metric": metric,
                "better": better,
                "seed": self.seed,
                "tune": TuneSettings.model_validate(tune.to_dict()),
                "budget": self.budget,
                "started_at": self.started_at,
                "finished_at": utc_now() if finished else None,
                "trials": self.trials,
                "measured_s": round(self.measured_s, 3),
                "finished": finished,
                "stopped": self.stopped,
                "left_out": [LeftOut(cell=cell, reason=why) for cell, why in self.left_out],
                "calibration": self.calibration,
                "groups": [g.to_log() for g in self.groups],
            }
        )

    def over_budget(self, n: int) -> str | None:
        """Why the next batch of `n` trials would overspend the budget; None: it would not."""
        cells, minutes = self.budget.cells, self.budget.minutes
        if cells is not None and self.trials + n > cells:
            return f"{self.trials} of {cells} trial runs spent (--budget-cells), the next batch needs {n}"
        if minutes is not None:
            spent = time.time() - self.started_s
            per_trial = self.measured_s / self.trials if self.trials else 0.0
            if spent + n * per_trial > minutes * 60:
                return (
                    f"{spent / 60:.1f} of {minutes:g} minutes spent (--budget-minutes), the next batch needs "
                    f"~{n * per_trial / 60:.1f}"
                )
        return None

    def stop(self, why: str, batch: list[tuple[Group, Candidate, Trial]]) -> None:
        """The budget cannot pay for `batch`: it is not run, and every group ends on its best measured so far."""
        for _, c, t in batch:
            c.trials.remove(t)
        self.stopped = "budget"
        for g in self.groups:
            g.stop(why)

    def interrupted(self) -> None:
        """Ctrl-C or SIGTERM: the trials that did not run are forgotten (a re-run asks for them again)."""
        self.stopped = "interrupted"
        for g in self.groups:
            for c in g.candidates:
                c.trials = [t for t in c.trials if t.status is not None]


def run_tune(
    scenario: Scenario,
    cluster: Cluster,
    *,
    results: str | Path,
    seed: int = 0,
    budget_cells: int | None = None,
    budget_minutes: float | None = None,
    echo: Callable[[str], None] = print,
    tuned_file: str | Path | None = None,
    pack: bool = False,
    calibrate: bool = True,
) -> TuneResult:
    """Search `scenario` on `cluster`; trials and the log in RESULTS/<scenario>-tune/ (see the module docstring).
    `pack` (SLURM): each batch's trials of one job shape share one job (harness sweep --pack). `calibrate`: when
    no candidate has a predicted step time and the cluster has no calibration, run a quick one first
    (`quick_calibration`); else the ranking is by counts."""
    from harness.launch.sweep import run_sweep

    tune = scenario.tune or TuneSpec()
    metric = METRIC[tune.objective][0]
    name = tune_sweep_name(scenario)
    folder = sweep_dir(results, name)
    started_at, started_s = utc_now(), time.time()
    groups, left_out = build_groups(scenario, cluster, seed=seed, budget_cells=budget_cells)
    calibration = quick_calibration(cluster, groups, enabled=calibrate, echo=echo)
    if calibration.made_by_tune:  # NOTE: ranked again, now by predicted step time
        groups, left_out = build_groups(scenario, cluster, seed=seed, budget_cells=budget_cells)
    budget = Budget(cells=budget_cells, minutes=budget_minutes)
    search = Search(scenario, cluster, groups, left_out, seed, budget, started_at=started_at, started_s=started_s)
    search.calibration = calibration
    _echo_funnel(groups, left_out, echo)
    sweep = functools.partial(run_sweep, pack=pack)
    expected = expected_trials(groups, budget_cells=budget_cells)
    progress = Progress(f"tune {scenario.name}", expected, unit="trials", approx=True)
    echo = progress.above(echo)
    try:
        with progress:
            while True:
                batch = [(g, c, t) for g in groups for c, t in g.next_trials()]
                if not batch:
                    break
                why = search.over_budget(len(batch))
                if why:
                    echo(f"budget: {why}; stopping with the best measured so far")
                    search.stop(why, batch)
                    break
                if search.trials + len(batch) > (progress.total or 0):
                    progress.grow(search.trials + len(batch))  # NOTE: more than expected (failures, a close race)
                rounds = sorted({(t.round, g.final) for g, _, t in batch})
                shown = ", ".join(_round_name(r, f) for r, f in rounds)
                echo(f"tune: batch {search.batches + 1}: {len(batch)} trial(s), {shown}")
                wall = _run_batch(scenario, cluster, name, results, [t for _, _, t in batch], sweep, echo)
                search.batches += 1
                search.trials += len(batch)
                search.measured_s += wall
                progress.advance(len(batch))
                for g in groups:
                    g.absorb(_outcomes(results, name, [t for gg, _, t in batch if gg is g], metric))
                _write_log(folder, search.log(finished=False))
    except KeyboardInterrupt:
        search.interrupted()
        _write_log(folder, search.log(finished=False))
        raise
    for g in groups:
        g.close()
    final = search.log(finished=True)
    _write_log(folder, final)
    out: Path | None = None
    if any(g.winner for g in groups):
        out = Path(tuned_file) if tuned_file is not None else folder / TUNED_FILE
        atomic_write_text(out, tuned_scenario(scenario, cluster, groups, final))
    return TuneResult(log=final, folder=folder, tuned_file=out)


def expected_trials(groups: list[Group], *, budget_cells: int | None) -> int:
    """The trial runs the search is expected to take: each group's `search_cost` when nothing fails and the leader
    is ahead after its confirmation runs (a group with no candidate takes none), at most the budget's. An estimate
    for the status line's ETA, not a limit."""
    tune = groups[0].tune if groups else TuneSpec()
    total = sum(search_cost(g.n0, tune.confirm_runs) for g in groups if not g.done)
    return min(total, budget_cells) if budget_cells is not None else total


def quick_calibration(
    cluster: Cluster, groups: list[Group], *, enabled: bool, echo: Callable[[str], None]
) -> TuneCalibration:
    """The calibration the ranking uses: the cluster's own when it has one; else, when no candidate has a predicted
    step time (a CPU profile, whose rates only a calibration gives) and `enabled`, a quick one made now (`harness
    calibrate --quick`, written where `harness plan` finds it, its time counted in the search's); else none, and
    the candidates are ranked by counts (harness.tune.search.counts_key)."""
    from harness.plan.calibration import CalibrationMismatch, find_calibration

    try:
        found = find_calibration(cluster)
    except (CalibrationMismatch, InputError) as e:
        return TuneCalibration(note=f"the cluster's calibration is not used: {e}")
    if found is not None:
        return TuneCalibration(path=str(found.path.resolve()))
    live = [c for g in groups for c in g.pool]
    if not live:
        return TuneCalibration(note="no candidate to rank")
    if any(c.rank_source == "prediction" or c.rank_source.startswith("proxy") for c in live):
        return TuneCalibration(note=f"the profile's own rates predict step times ({cluster.path})")
    if not enabled:
        echo("tune: no calibration (--no-calibrate): candidates ranked by counts (FLOPs, bytes, calls per token)")
        return TuneCalibration(note="--no-calibrate: ranked by counts (FLOPs, then bytes, then calls per token)")
    from harness.calibrate.run import CalibrationFailed, calibrate
    from harness.launch.slurm.sacct import SlurmUnavailable

    echo(
        f"tune: cluster {cluster.name} has no calibration: running `harness calibrate --cluster {cluster.name} "
        "--quick` first (its time counts in the search's; --no-calibrate ranks by counts instead)"
    )
    t0 = time.time()
    try:
        path = calibrate(cluster, quick=True)
    except (CalibrationFailed, SlurmUnavailable, InputError, OSError) as e:
        seconds = round(time.time() - t0, 1)
        echo(f"tune: the quick calibration failed ({e}); candidates ranked by counts")
        return TuneCalibration(seconds=seconds, note=f"the quick calibration failed: {e}; ranked by counts")
    seconds = round(time.time() - t0, 1)
    echo(f"tune: calibration written to {path} in {seconds:.0f} s; ranking by predicted step time")
    return TuneCalibration(path=str(Path(path).resolve()), made_by_tune=True, seconds=seconds)


def _write_log(folder: Path, log: TuneLog) -> None:
    """tune.json, atomically: a reader sees the log of the last batch or of this one, whole."""
    atomic_write_json(folder / TUNE_LOG, log.to_dict())


def _round_name(rnd: int, final: bool) -> str:
    return f"round {rnd}" + (" (final)" if final else "")


def _echo_funnel(groups: list[Group], left_out: list, echo: Callable[[str], None]) -> None:
    from harness.tune.search import COUNTS_SOURCE

    for g in groups:
        fates: dict[str, int] = {}
        for c in g.candidates:
            fates[c.fate] = fates.get(c.fate, 0) + 1
        by_counts = sum(1 for c in g.candidates if c.rank_source == COUNTS_SOURCE and c.predicted_rank is not None)
        by_time = sum(1 for c in g.candidates if c.predicted_rank is not None) - by_counts
        ranked = f"{by_time} ranked by predicted step time" + (f", {by_counts} by counts" if by_counts else "")
        echo(
            f"tune: {g.key[0]} on {g.key[1]} GPUs: {len(g.candidates)} cells, {fates.get('unsupported', 0)} "
            f"unsupported, {fates.get('pruned_memory', 0)} predicted not to fit, {fates.get('dominated', 0)} "
            f"dominated; {ranked}; first round {g.n0}, steps per round {g.steps}"
        )
        if not by_time and not by_counts and g.pool:
            echo("tune: nothing to rank the candidates by: the first round is drawn at random from --seed")
    if left_out:
        more = " (and others)" if len(left_out) > 1 else ""
        echo(f"tune: {len(left_out)} matrix cell(s) left out: {left_out[0][1]}{more}")


def trial_scenario(scenario: Scenario, name: str, specs: list[RunSpec], path: Path) -> Scenario:
    """A scenario whose cells are exactly `specs` (every setting explicit), written to `path` as a file that
    `harness sweep` reads the same (the manifest names it)."""
    cells = tuple(_cell_of(s) for s in specs)
    doc = {
        "name": name,
        "description": f"harness tune trials of {scenario.name}",
        **({"models": {k: v.to_dict() for k, v in scenario.models.items()}} if scenario.models else {}),
        "matrix": {"include": [_file_cell(c) for c in cells]},
    }
    atomic_write_text(path, yaml.safe_dump(doc, sort_keys=False))
    return Scenario(name=name, path=str(path), models=scenario.models, cells=cells, settings={})


def _cell_of(spec: RunSpec) -> dict[str, Any]:
    cell: dict[str, Any] = {
        "model": spec.model,
        "strategy": spec.strategy,
        "precision": spec.precision,
        "gpus": spec.gpus,
    }
    for k in SETTING_FIELDS:
        v = getattr(spec.settings, k)
        cell[k] = dict(v) if isinstance(v, dict) else v  # NOTE: a FrozenDict (inject) as the plain mapping YAML writes
    return cell


def _file_cell(cell: dict[str, Any]) -> dict[str, Any]:
    """A cell as an include entry: the settings left at their default are left out."""
    return {k: v for k, v in cell.items() if k not in SETTING_DEFAULTS or v != SETTING_DEFAULTS[k]}


def _run_batch(
    scenario: Scenario,
    cluster: Cluster,
    name: str,
    results: str | Path,
    trials: list,
    run_sweep: Callable[..., Any],
    echo: Callable[[str], None],
) -> float:
    """Run the trials (each the k-th run of its cell) with as few sweeps as their run counts allow; wall seconds."""
    most: dict[str, tuple[RunSpec, int]] = {}
    for t in trials:
        spec, k = most.get(t.spec.run_id, (t.spec, 0))
        most[t.spec.run_id] = (spec, max(k, t.repeat))
    by_k: dict[int, list[RunSpec]] = {}
    for spec, k in most.values():
        by_k.setdefault(k, []).append(spec)
    wall = 0.0
    trials_dir = sweep_dir(results, name) / ".tune"
    for k, specs in sorted(by_k.items()):
        n = len(list(trials_dir.glob("batch-*.yaml"))) if trials_dir.is_dir() else 0
        sc = trial_scenario(scenario, name, specs, trials_dir / f"batch-{n + 1:03d}.yaml")
        res = run_sweep(sc, cluster, results=results, echo=echo, repeat=k)
        wall += res.wall_s
    return wall


def _outcomes(
    results: str | Path, name: str, trials: list, metric: str
) -> dict[tuple[str, int], tuple[str, float | None, str]]:
    out: dict[tuple[str, int], tuple[str, float | None, str]] = {}
    for t in trials:
        try:
            rec = read_record(record_path(results, name, t.spec.run_id, repeat=t.repeat))
        except ValueError as e:
            out[(t.spec.run_id, t.repeat)] = ("missing", None, f"no record: {e}")
            continue
        v = metric_value(rec, METRICS_BY_NAME[metric])  # NOTE: compare's reader: the same value compare judges
        value = v if v is not None and v > 0 else None
        out[(t.spec.run_id, t.repeat)] = (rec.status, value, rec.reason or "")
    return out


def tuned_scenario(scenario: Scenario, cluster: Cluster, groups: list[Group], log: TuneLog) -> str:
    """The winners as a ready scenario file: one include entry per (model, gpus), with the searched knobs (EXPLICIT)
    and every setting that differs from the file's `settings` (grad_accum explicit: the file has no tune
    section)."""
    base = {**SETTING_DEFAULTS, **scenario.settings}
    entries = []
    notes = []
    for g in groups:
        if g.winner is None:
            notes.append(f"#   {g.key[0]} on {g.key[1]} GPUs: no winner ({g.verdict})")
            continue
        cell = _cell_of(g.winner.spec)
        entries.append({k: v for k, v in cell.items() if k not in SETTING_FIELDS or k in EXPLICIT or v != base[k]})
        p = f", p = {g.p_value:.3g}" if g.p_value is not None else ""
        tie = f" with {g.runner_up.label}" if g.verdict == "tied" and g.runner_up is not None else ""
        notes.append(f"#   {g.key[0]} on {g.key[1]} GPUs: {g.winner.label} ({g.verdict}{tie}{p})")
    used = {e["model"] for e in entries}
    doc: dict[str, Any] = {
        "name": f"{scenario.name}-tuned"[:64],
        "description": f"harness tune winners of {scenario.name} on {cluster.name} ({log.objective})",
    }
    models = {k: v.to_dict() for k, v in scenario.models.items() if k in used}
    if models:
        doc["models"] = models
    doc["matrix"] = {"include": entries}
    settings = {k: v for k, v in scenario.settings.items() if k in SETTING_FIELDS and k != "grad_accum"}
    if settings:
        doc["settings"] = settings
    head = [
        f"# Written by `harness tune` ({log.finished_at}): the fastest cell found per model and GPU count of "
        f"{Path(scenario.path).name} on cluster {cluster.name},",
        f"# objective {log.objective} ({log.metric}, {log.better} is better), seed {log.seed}, "
        f"{log.trials} trial runs in {log.measured_s or 0:.0f} s. `harness sweep` runs it as it is.",
        *(
            [f"# The scenario was read with {' '.join('--set ' + o for o in scenario.overrides)}: the cells hold them."]
            if scenario.overrides
            else []
        ),
        *notes,
    ]
    return "\n".join(head) + "\n" + yaml.safe_dump(doc, sort_keys=False)
