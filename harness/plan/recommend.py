"""The plan's answer, and the words every verdict about a winner is said in.

`recommend(cells, cluster=…, headroom_gib=…)` answers, per (model, GPU count) of a plan: the fastest predicted cell
that fits with the memory headroom the user sets (`harness plan --headroom GIB`), its runner-up and what separates
them, the cells predicted faster that do not fit and by how much, the cells that fit but have no predicted step time
(never ranked, so never passed over in silence), and how far the published runs say the prediction can be trusted
for each cell's family (harness.plan.validation.family_check). Every cell gets its standing: recommended or not, its
rank among the cells that fit, and a note that says why.

Why here, a pure function over `plan_cells`' PlannedCells: it is a planner's conclusion from the planner's own
numbers (fits, step time, tokens/s per GPU, memory), with no I/O of its own but the published runs it reads through
harness.plan.validation; and the planner's floor is the one `harness tune` and `harness report` both stand on, so the
vocabulary below — "recommended", "the fastest predicted that fits" / "the fastest measured", "runner-up … 3.1%
slower", "does not fit by 4.1 GiB", the judgement of a measured lead — is one set of functions the plan, the tune
log's table and the report's best-strategy table all call: they cannot word one verdict two ways.

The rules (docs: the recommendation):

- a cell *fits with the headroom* when its ranks are predicted to fit where they run (PlannedCell.fits is True: the
  device's memory less the CUDA context/NCCL reserve, and this host's for a local CPU cell) and its predicted total
  leaves at least `headroom_gib` of the device's memory free. The headroom is at least the reserve (a smaller one
  would recommend cells the sweep skips as not fitting); by default it is the reserve, so "fits" and "fits with the
  headroom" agree;
- it is *ranked* when it also can run, can be placed, and has a predicted tokens/s per GPU; rank 1 is the fastest
  (the highest predicted tokens/s per GPU: the shortest step for the same tokens, and the measure that compares cells
  of different micro-batches, as `harness tune` and the report rank measured cells), and it is the one recommended;
  ties keep the plan's order;
- the *runner-up* is the fastest ranked cell of another strategy (a layout makes another strategy: `fsdp2.full_shard
  tp2` is not `fsdp2.full_shard`), as the report's next-best strategy; "N% slower" is the recommended cell's tokens/s
  per GPU over the runner-up's − 1: how much longer the runner-up takes for the same tokens;
- a group where nothing fits with the headroom, or whose device memory is unknown (nothing is known to fit), has no
  recommendation, and says why.

The published runs check the uncalibrated GPU model (a profile's own figures). A plan priced with a calibration file,
or on a CPU host, gets no figure from them, and is told so.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from harness.core.catalogue import FAMILY_SETTINGS
from harness.plan.memory import DEVICE_RESERVE_GIB
from harness.plan.prediction import PlannedCell
from harness.plan.validation import FamilyCheck, family_check, time_model_family
from harness.scenario.cluster import Cluster
from harness.scenario.spec import SETTING_DEFAULTS, RunSpec

# ---- the words (the plan, `harness tune` and the report's best-strategy table) ------------------------------------

RECOMMENDED = "recommended"
FASTEST_PREDICTED = "the fastest predicted that fits"
"""the plan's basis: a prediction, among the cells predicted to fit with the headroom"""
FASTEST_MEASURED = "the fastest measured"
"""tune's and the report's basis: measured tokens/s per GPU (the median of a cell's runs), among cells that ran"""
RUNNER_UP = "runner-up"
TIE = "≈"
"""between two cells whose measured lead is within the noise: neither is crowned"""


def group_name(model: str, gpus: int) -> str:
    """'llama3.1-8b on 8 GPUs': what a recommendation is for."""
    return f"{model} on {gpus} GPU{'s' * (gpus != 1)}"


def slower_words(margin: float) -> str:
    """'3.1% slower': `margin` = the recommended cell's tokens/s per GPU / the other's − 1 (the report's `margin`),
    how much longer the other takes for the same tokens."""
    return f"{margin:.1%} slower"


def faster_words(margin: float) -> str:
    """'5.8% faster': `margin` = the other cell's tokens/s per GPU / the recommended one's − 1."""
    return f"{margin:.1%} faster"


def short_words(over_gib: float) -> str:
    """'does not fit by 4.1 GiB': the predicted memory per rank beyond what the headroom leaves (GiB)."""
    return f"does not fit by {over_gib:.1f} GiB"


def recommended_words(label: str, *, tied_with: str | None = None) -> str:
    """The recommended cell, or 'a ≈ b' where its lead over the runner-up is within the noise (never crown noise)."""
    return label if tied_with is None else f"{label} {TIE} {tied_with}"


def recommendation_head(model: str, gpus: int, label: str, *, basis: str, tied_with: str | None = None) -> str:
    """'llama3.1-8b on 8 GPUs: recommended zero3 bf16 … (the fastest predicted that fits …)'."""
    return f"{group_name(model, gpus)}: {RECOMMENDED} {recommended_words(label, tied_with=tied_with)} ({basis})"


def no_recommendation_head(model: str, gpus: int, why: str) -> str:
    """'llama3.1-8b on 8 GPUs: no recommendation (why)'."""
    return f"{group_name(model, gpus)}: no recommendation ({why})"


def runner_up_words(label: str, gap: str) -> str:
    """'runner-up fsdp.full_shard bf16 …: 0.5% slower' (or ': does not fit by 4.1 GiB')."""
    return f"{RUNNER_UP} {label}: {gap}"


MIN_RUNS_WORDS = "{need} a side needed, or a history"


def lead_words(
    *,
    judged: bool,
    distinguishable: bool | None,
    p: float | None,
    runs: tuple[int, int],
    noise: str | None = None,
    need: int = 3,
) -> str:
    """How a measured lead over the runner-up was judged: 'p=0.003, 3 vs 3 runs' (ahead beyond the noise), 'not
    distinguishable, p=0.40, 3 vs 3 runs' (a tie), 'single run: lead not judged', '2 vs 1 runs: lead not judged (3 a
    side needed, or a history)'. `noise`: the history's between-run noise it was judged on, when it was. The report
    (harness.report.leader.Verdict) and the tune log's table say it with this."""
    a, b = runs
    if not judged or p is None:
        if max(a, b) <= 1:
            return "single run: lead not judged"
        return f"{a} vs {b} runs: lead not judged ({MIN_RUNS_WORDS.format(need=need)})"
    what = f"{a} vs {b} runs" + (f", {noise}" if noise else "")
    text = f"p={p:.2g}, {what}"
    return text if distinguishable else f"not distinguishable, {text}"


# ---- the plan's recommendation ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Standing:
    """One planned cell's place in its (model, GPU count)."""

    recommended: bool
    rank: int | None
    """1-based, among the group's ranked cells (they fit with the headroom and have a predicted tokens/s per GPU),
    fastest first; None: not ranked (`note` says why)"""
    note: str | None
    """why the cell is not ranked, or how far it is behind the recommended one; None for the recommended cell"""
    memory_left_gib: float | None
    """device memory the predicted total leaves free (GiB); None: device memory or prediction unknown"""
    over_gib: float | None
    """predicted memory beyond what the headroom leaves (GiB; > 0: does not fit with the headroom), None: unknown"""
    family: str
    """the family whose published runs check its step time (harness.plan.validation.time_model_family)"""
    check: FamilyCheck | None
    """what the published runs say of that family's predictions here; None: the cell has no predicted step time"""


@dataclass(frozen=True)
class Group:
    """One (model, GPU count) of a plan: the indices of its cells in the plan, and the answer."""

    model: str
    gpus: int
    cells: tuple[int, ...]
    winner: int | None
    """the recommended cell; None: see `why_none`"""
    runner_up: int | None
    """the fastest ranked cell of another strategy; None: no other strategy fits with the headroom"""
    next_ranked: int | None
    """rank 2, when it is not the runner-up (a cell of the recommended strategy), else None"""
    faster_unfit: tuple[int, ...]
    """cells predicted faster than the recommended one (every priced cell, without one) that do not fit with the
    headroom, fastest first"""
    unpriced: tuple[int, ...]
    """cells that fit with the headroom but have no predicted step time: not ranked, and perhaps faster"""
    why_none: str | None
    """why there is no recommendation, else None"""


@dataclass(frozen=True)
class Recommendations:
    """A plan's answer: its groups in the order their first cell appears, and every cell's standing in plan order."""

    headroom_gib: float
    """device memory a recommended cell must leave free (GiB): at least the reserve"""
    asked_headroom_gib: float | None
    """the headroom the user set (`--headroom`, or the scenario's `tune.memory_headroom`), None: the default (the
    reserve)"""
    groups: tuple[Group, ...]
    standings: tuple[Standing, ...]
    headroom_from: str | None = None
    """where the headroom comes from when neither the default nor `--headroom` (the scenario's tune section)"""


def effective_headroom(headroom_gib: float | None) -> float:
    """The headroom a recommendation asks for: the user's, but never below the CUDA context/NCCL reserve that
    `fits` already keeps (GiB)."""
    return DEVICE_RESERVE_GIB if headroom_gib is None else max(float(headroom_gib), DEVICE_RESERVE_GIB)


def tune_headroom_gib(fraction: float, usable_gib: float | None) -> tuple[float, str] | None:
    """The headroom that makes the plan recommend only what `harness tune` would run: a scenario's
    `tune.memory_headroom` keeps each candidate's predicted peak under `usable × (1 − fraction)` (harness.tune.run),
    so it leaves the reserve plus `fraction × usable` free; with the words that say so. None without a fraction or a
    known device memory."""
    if fraction <= 0 or usable_gib is None:
        return None
    gib = DEVICE_RESERVE_GIB + fraction * usable_gib
    return gib, (
        f"the scenario's tune.memory_headroom, {fraction:.0%} of {usable_gib:g} GiB usable, and the "
        f"{DEVICE_RESERVE_GIB:g} GiB reserve: what harness tune would run; --headroom GIB overrides"
    )


def strategy_of(cell: PlannedCell) -> str:
    """What makes another strategy: the catalogue name with its layout (`fsdp2.full_shard tp2`)."""
    tag = cell.spec.layout_tag
    return f"{cell.spec.strategy} {tag}" if tag else cell.spec.strategy


def _tokens(cell: PlannedCell) -> float | None:
    v = cell.prediction.tokens_per_s_per_gpu
    return float(v) if isinstance(v, (int, float)) and math.isfinite(v) and v > 0 else None


def _memory(cell: PlannedCell, headroom: float) -> tuple[float | None, float | None]:
    """(GiB the predicted total leaves free of the device's memory, GiB beyond what the headroom leaves)."""
    p = cell.prediction
    total = None if p.memory_gib is None else p.memory_gib.total
    if total is None or p.device_memory_gib is None:
        return None, None
    left = float(p.device_memory_gib) - float(total)
    return left, headroom - left


def _unranked_note(cell: PlannedCell, over: float | None, headroom: float) -> str | None:
    """Why a cell is not ranked (it cannot run, cannot be placed, does not fit, or its fit is unknown), or None."""
    if cell.unsupported:
        return f"cannot run: {cell.unsupported}"
    if cell.cannot_place:
        return f"cannot be placed: {cell.cannot_place}"
    if cell.host_memory:
        return f"does not fit this host: {cell.host_memory}"
    if over is not None and (over > 1e-9 or cell.fits is False):
        total = (cell.prediction.memory_gib.total or 0.0) if cell.prediction.memory_gib else 0.0
        return (
            f"{short_words(max(over, 0.0))} ({total:.1f} GiB per rank + {headroom:g} GiB headroom > "
            f"{cell.prediction.device_memory_gib:g} GiB)"
        )
    if cell.fits is not True:
        return "whether it fits is unknown: the profile gives no device_memory_gib"
    return None


def _no_time_note(cell: PlannedCell) -> str:
    why = (cell.prediction.time_null_reasons or {}).get("step_time_s") or "not predicted"
    return f"fits, but has no predicted step time: {why}"


def prediction_check(cell: PlannedCell, cluster: Cluster, family: str) -> FamilyCheck | None:
    """What the published runs say of the cell's predicted step time here, or None without one. A check says why it
    has no figure where the published runs do not apply: a CPU host, a calibrated plan."""
    p = cell.prediction
    if p.step_time_s is None:
        return None
    precision = cell.spec.precision
    if cluster.device != "cuda":
        why = "the published runs are GPU runs: none checks a CPU host's step time"
        return FamilyCheck(family, precision, cluster.name, 0, reason=why)
    source = p.calibration or ""
    if not source.startswith("uncalibrated: profile figures"):
        why = (
            f"the published runs check the {cluster.name} profile's own figures, not the rates this plan used "
            f"({source.split(' (')[0] or 'unknown'}): their error here is unknown"
        )
        return FamilyCheck(family, precision, cluster.name, 0, reason=why)
    return family_check(family, precision, cluster.name)


def recommend(
    cells: list[PlannedCell],
    *,
    cluster: Cluster,
    headroom_gib: float | None = None,
    headroom_from: str | None = None,
) -> Recommendations:
    """The recommendation per (model, GPU count) of `cells` (the module docstring's rules), and every cell's
    standing; `headroom_gib` as `--headroom` takes it (None: the reserve), `headroom_from` says where it came from
    when the user did not type it (`tune_headroom_gib`)."""
    headroom = effective_headroom(headroom_gib)
    order: dict[tuple[str, int], list[int]] = {}
    for i, c in enumerate(cells):
        order.setdefault((c.spec.model, c.spec.gpus), []).append(i)
    memory = [_memory(c, headroom) for c in cells]
    families = [time_model_family(c.spec) for c in cells]
    seen: dict[tuple[str, str, bool, str], FamilyCheck | None] = {}
    checks = []
    for c, f in zip(cells, families):
        # NOTE: one check per family, precision and rates (a 10,000-cell plan has a few dozen): each looks at the files
        key = (f, c.spec.precision, c.prediction.step_time_s is None, c.prediction.calibration or "")
        if key not in seen:
            seen[key] = prediction_check(c, cluster, f)
        checks.append(seen[key])
    notes: dict[int, str | None] = {}
    ranks: dict[int, int] = {}
    groups = []
    for (model, gpus), members in order.items():
        for i in members:
            notes[i] = _unranked_note(cells[i], memory[i][1], headroom)
        fitting = [i for i in members if notes[i] is None]
        ranked = sorted((i for i in fitting if _tokens(cells[i]) is not None), key=lambda i: -(_tokens(cells[i]) or 0))
        unpriced = tuple(i for i in fitting if _tokens(cells[i]) is None)
        for i in unpriced:
            notes[i] = _no_time_note(cells[i])
        for r, i in enumerate(ranked, 1):
            ranks[i] = r
        winner = ranked[0] if ranked else None
        runner = next((i for i in ranked if strategy_of(cells[i]) != strategy_of(cells[ranked[0]])), None)
        second = ranked[1] if len(ranked) > 1 and ranked[1] != runner else None
        best = _tokens(cells[winner]) if winner is not None else None
        if winner is not None and best is not None:
            w = cell_words(cells[winner])
            for i in ranked[1:]:
                notes[i] = f"{slower_words(best / (_tokens(cells[i]) or best) - 1.0)} than the recommended {w}"
        priced = [i for i in members if _tokens(cells[i]) is not None and (notes[i] or "").startswith("does not fit")]
        faster = sorted(
            (i for i in priced if best is None or (_tokens(cells[i]) or 0.0) > best),
            key=lambda i: -(_tokens(cells[i]) or 0.0),
        )
        groups.append(
            Group(
                model=model,
                gpus=gpus,
                cells=tuple(members),
                winner=winner,
                runner_up=runner,
                next_ranked=second,
                faster_unfit=tuple(faster),
                unpriced=unpriced,
                why_none=None if winner is not None else _why_none(cells, members, fitting, memory, headroom),
            )
        )
    winners = {g.winner for g in groups}
    standings = tuple(
        Standing(
            recommended=i in winners,
            rank=ranks.get(i),
            note=notes.get(i),
            memory_left_gib=memory[i][0],
            over_gib=memory[i][1],
            family=families[i],
            check=checks[i],
        )
        for i in range(len(cells))
    )
    return Recommendations(headroom, headroom_gib, tuple(groups), standings, headroom_from)


def _why_none(
    cells: list[PlannedCell],
    members: list[int],
    fitting: list[int],
    memory: list[tuple[float | None, float | None]],
    headroom: float,
) -> str:
    """Why a group has no recommendation: nothing fits with the headroom (the closest by how much), its fit is
    unknown, or what fits has no predicted step time."""
    if fitting:
        return f"the {len(fitting)} cell(s) that fit have no predicted step time"
    if any(cells[i].fits is None and not (cells[i].unsupported or cells[i].cannot_place) for i in members):
        return "whether any cell fits is unknown: the profile gives no device_memory_gib"
    over = [(memory[i][1], i) for i in members if memory[i][1] is not None]
    if not over:
        return "no cell can run or be placed"
    gib, closest = min(over, key=lambda x: x[0] or 0.0)
    return (
        f"no cell fits with {headroom:g} GiB headroom; the closest, {cell_words(cells[closest])}, "
        f"{short_words(max(gib or 0.0, 0.0))}"
    )


def option_list(spec: RunSpec) -> list[str]:
    """The settings that tell cells apart: checkpointing, offload, layout, compile, the checkpoint phase, micro-batch ×
    sequence, gradient accumulation and a family's framework options (`wrap_blocks=2`; compile, accumulation and the
    options only where they are not the default)."""
    s = spec.settings
    ac = s.activation_checkpointing
    options = [f"{n}={_word(v)}" for n in FAMILY_SETTINGS if (v := getattr(s, n)) != SETTING_DEFAULTS[n]]
    return [
        *(
            o
            for o in (
                (f"ac={ac}" if ac != "none" else ""),
                (f"offload={s.offload}" if s.offload != "none" else ""),
                (f"tp{s.tp}" + (" sp" if s.sequence_parallel else "") if s.tp > 1 else ""),
                (f"pp{s.pp}:{s.pp_schedule}" if s.pp > 1 else ""),
                ("compile" if s.compile else ""),
                ("ckpt" if s.checkpoint else ""),
                f"mb{s.micro_batch}x{s.seq_len}",
                (f"ga{s.grad_accum}" if s.grad_accum > 1 else ""),
            )
            if o
        ),
        *options,
    ]


def _word(value: Any) -> str:
    """A setting's value as a cell's words write it: true/false as YAML spells them, 0.5 not 0.50000."""
    if isinstance(value, bool):
        return str(value).lower()
    return f"{value:g}" if isinstance(value, float) else str(value)


def cell_words(cell: PlannedCell) -> str:
    """How the recommendation names a cell within its (model, GPU count): as the plan's table row does — strategy,
    precision, and the settings that set it apart (`option_list`)."""
    return " ".join([cell.spec.strategy, cell.spec.precision, *option_list(cell.spec)])


def standing_json(standing: Standing, *, headroom_gib: float) -> dict[str, Any]:
    """The fields a cell gains in `harness plan --format json`."""
    return {
        "recommended": standing.recommended,
        "rank": standing.rank,
        "rank_note": standing.note,
        "headroom_gib": headroom_gib,
        "memory_left_gib": None if standing.memory_left_gib is None else round(standing.memory_left_gib, 6),
        "time_model_family": standing.family,
        "time_model_check": None if standing.check is None else standing.check.to_dict(),
    }
