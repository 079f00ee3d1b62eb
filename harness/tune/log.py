"""`tune.json`, `harness tune`'s log, as typed models: the one type of the file and its one reader.

harness.tune.run writes the log into the tune's sweep folder (RESULTS/<scenario>-tune/tune.json) after every batch
of trials, atomically, and once more when the search ends; `harness report`, `harness tune --format json` and the
tests read it back only through `TuneLog` (`read_tune_file`, `read_tune_logs`). Version 1: later versions add
fields and never rename one.

What a log says, per (model, GPU count) group: each candidate cell with its prediction, its fate (FATES) and its
trials (the sweep cells that measured it, round by round), the group's verdict and p-value. The questions a reader
asks of one candidate or group (was it run, in which rounds, its prediction of the searched metric) are methods
here; the summaries built from them (the funnel, the ranking, the table) are harness.tune.summary.

A file that is not JSON, of another version, or with a field of the wrong type is a ValueError naming the key path,
the value and what is allowed (`groups[0].candidates[3].fate: 'vanished' is not one of winner, …`), which the
report turns into a warning line: one bad log never costs the rest of a report.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Annotated, Any, Final, Literal, get_args

from pydantic import Field, PrivateAttr, ValidationError

from harness.core.errors import one_of
from harness.core.typed import SOMETIMES, Typed, data_location, dotted, expected
from harness.results.record import Status
from harness.results.spec import SpecJSON
from harness.results.store import TUNE_LOG, files_named
from harness.scenario.tune import Objective

__all__ = [
    "FATES",
    "PREDICTION_OF",
    "TUNE_LOG",
    "TUNE_VERSION",
    "Budget",
    "CandidateLog",
    "GroupLog",
    "LeftOut",
    "TrialLog",
    "TuneCalibration",
    "TuneLog",
    "TuneSettings",
    "check_tune_log",
    "is_tune_log",
    "read_tune_file",
    "read_tune_files",
    "read_tune_logs",
    "tune_log_files",
]

TUNE_VERSION: Final = 1
Fate = Literal[
    "winner",
    "runner_up",
    "eliminated",
    "pruned_memory",
    "pruned_prediction",
    "dominated",
    "not_reached",
    "unsupported",
    "failed",
    "dropped_oom_neighbour",
    "unmeasured",
    "measured",
]
"""a candidate's fate ("measured": still in the search, in a log written between batches; "unmeasured": not
reached yet, or — in a finished log — never, the budget having run out; "pruned_prediction": ranked below the
first round, by predicted step time or by counts (its rank_source says which); "dominated": another cell that fits
is at least as fast by construction (harness.tune.search.dominates; the reason names it); "not_reached": neither
ranked nor drawn before the search ended)"""
FATES: tuple[str, ...] = get_args(Fate)
Metric = Literal["tokens_per_s_per_gpu", "step_time_s"]
"""the record metric the search judges (harness.tune.search.METRIC: the objective's)"""
PREDICTION_OF: Final[Mapping[str, str]] = {
    "tokens_per_s_per_gpu": "predicted_tokens_per_s_per_gpu",
    "step_time_s": "predicted_step_time_s",
}
"""the searched metric → the candidate's field that predicts it"""
Better = Literal["higher", "lower"]
"""the searched metric's good direction"""
Verdict = Literal["ahead", "tied", "alone", "unconfirmed", "no winner"]
"""how a group's search ended (docs/tune.md "Confirm beyond noise"); null while it runs"""
TrialStatus = Literal[Status, "missing", "no_value"]
"""a trial's record status; `missing`: no readable record; `no_value`: ok but without the searched metric"""
Stopped = Literal["budget", "interrupted"]
"""why a search ended before its verdicts: a budget (--budget-cells/--budget-minutes), or Ctrl-C / SIGTERM"""
Num = int | float
"""a JSON number as written (an int stays an int)"""

ALLOWED: Final[Mapping[str, tuple[Any, ...]]] = {
    "fate": FATES,
    "metric": get_args(Metric),
    "better": get_args(Better),
    "objective": get_args(Objective),
    "verdict": get_args(Verdict),
    "status": get_args(Status) + ("missing", "no_value"),
    "stopped": get_args(Stopped),
}
"""the values of each Literal field, by the key the file calls it (for the error lines)"""


class TrialLog(Typed):
    """One run of a candidate: an ordinary sweep cell (its record is RESULTS/<sweep>/<run_id>.json, or
    <run_id>.r<repeat>.json from the second run on)."""

    round: int
    """the search round it belongs to (0 first; the final round's confirmation runs too)"""
    run_id: str | None = None
    """the trial's cell: the candidate at its round's measure_steps"""
    repeat: int | None = None
    """which run of that cell (1: the first)"""
    steps: int | None = None
    """the trial's measure_steps (steps)"""
    status: TrialStatus | None = None
    """the record's status, or missing / no_value; null: not run yet"""
    value: Num | None = None
    """the searched metric in its record (tokens/s per GPU, or s per step); null: none"""
    reason: Annotated[str | None, SOMETIMES] = None
    """why it is not ok (absent when there is nothing to say)"""


class CandidateLog(Typed):
    """One cell of the group: its prediction, its fate and its trials."""

    run_id: str
    """the cell's run_id at the scenario's own measure_steps (a sweep of the scenario writes this record)"""
    label: str
    """what tells the group's cells apart: strategy, precision, micro-batch, accumulation, checkpointing, …"""
    spec: SpecJSON | None = None
    """the cell, as a record's spec"""
    predicted_step_time_s: Num | None = None
    """the time model's step time (s); null: no prediction"""
    predicted_tokens_per_s_per_gpu: Num | None = None
    """the time model's throughput (tokens/s per GPU); null: no prediction"""
    predicted_memory_gib: Num | None = None
    """the memory model's peak per rank (GiB, 2**30 B); null: no prediction"""
    rank_source: str | None = None
    """what ranked it: prediction | proxy: compile off | proxy: offload none | counts: FLOPs, then bytes, then
    calls per token (no calibration) | none"""
    predicted_rank: int | None = None
    """1-based place in the predicted order; null: unranked, or pruned before ranking"""
    fate: Fate
    """how it fared (FATES)"""
    reason: str | None = None
    """why that fate ('' where the fate says it all)"""
    round: int
    """the highest round with an ok trial (-1: never measured ok)"""
    measured: Num | None = None
    """the median of its ok trials' values in that round (tokens/s per GPU, or s per step); null: none"""
    trials: list[TrialLog] = Field(default_factory=list)
    """its runs, in the order the search asked for them"""

    def was_run(self) -> bool:
        """Whether the search ran the candidate at all (successfully or not)."""
        return self.round >= 0 or bool(self.trials)

    def measured_rounds(self) -> set[int]:
        """The rounds it was measured in: its trials' rounds, or 0…round when the log lists no trials."""
        if self.trials:
            return {t.round for t in self.trials}
        return set(range(self.round + 1))

    def prediction(self, metric: str) -> float | None:
        """Its prediction of the searched `metric` (tokens/s per GPU, or step time in s); None: none."""
        value: float | None = getattr(self, PREDICTION_OF[metric])
        return value

    def trial_counts(self) -> tuple[int, int]:
        """(trials that ran ok, trials)."""
        return sum(t.status == "ok" for t in self.trials), len(self.trials)

    def ok_runs_in(self, rnd: int) -> int:
        """Its trials in round `rnd` that ran ok (count)."""
        return sum(1 for t in self.trials if t.round == rnd and t.status == "ok")


class GroupLog(Typed):
    """One (model, GPU count) group's search."""

    model: str
    """model name"""
    gpus: int
    """ranks = GPUs"""
    verdict: Verdict | None
    """how the search ended; null: it has not yet"""
    p_value: Num | None = None
    """compare's run-level test of the winner against the runner-up (null: not judged by it)"""
    winner: str | None = None
    """the winner's run_id; null: none"""
    runner_up: str | None = None
    """the runner-up's run_id; null: none"""
    first_round: int | None = None
    """candidates measured in round 0 (count)"""
    steps: list[int] = Field(default_factory=list)
    """measure_steps per round, round 0 first (steps)"""
    candidates: list[CandidateLog]
    """every cell of the group: the winner, the runner-up, then by round reached and measured value, then by
    predicted rank"""

    def n_rounds(self) -> int:
        """Rounds the search planned or ran (count)."""
        seen = [r for c in self.candidates for r in c.measured_rounds()]
        return max([len(self.steps), *(r + 1 for r in seen)])

    def label_of(self, key: Literal["winner", "runner_up"]) -> str | None:
        """The label of the group's winner or runner-up: the candidate its run_id names, else the one of that fate;
        None when the group has none."""
        run_id = self.winner if key == "winner" else self.runner_up
        named = [c for c in self.candidates if run_id and c.run_id == run_id]
        named += [c for c in self.candidates if c.fate == key]
        return named[0].label if named else None

    def fate_counts(self) -> dict[str, int]:
        """Candidates per fate (the fates no candidate has left out)."""
        counts: dict[str, int] = {}
        for c in self.candidates:
            counts[c.fate] = counts.get(c.fate, 0) + 1
        return counts


class TuneSettings(Typed):
    """The scenario's `tune:` section as the search used it (harness.scenario.tune.TuneSpec)."""

    objective: Objective
    """throughput (tokens/s per GPU, higher) | step_time (s per step, lower)"""
    global_batch: int | None
    """sequences per optimizer step over the data-parallel ranks; null: grad_accum as the scenario says"""
    memory_headroom: Num
    """fraction of the usable device memory kept free by the memory pruning (0.1 = 10%)"""
    first_round: int
    """candidates per group measured in round 0, as the scenario asked (the budget may take fewer)"""
    confirm_runs: int
    """runs of each finalist before they are judged"""
    max_runs: int
    """the most runs of either finalist while they cannot be told apart"""
    alpha: Num
    """significance of "ahead beyond noise" (p < alpha)"""


class Budget(Typed):
    """The budget the search was given; null: none."""

    cells: int | None
    """trial runs at most (--budget-cells)"""
    minutes: Num | None
    """wall minutes at most (--budget-minutes)"""


class TuneCalibration(Typed):
    """The calibration the search's predictions came from, and whether the search made it."""

    path: str | None = None
    """the calibration file (absolute path); null: none was used"""
    made_by_tune: bool = False
    """this search ran `harness calibrate --quick` for it (none existed)"""
    seconds: Num | None = None
    """how long that calibration took (s): part of the search's time, not of measured_s"""
    note: str | None = None
    """why none was used or made (--no-calibrate, the profile's sourced rates predict, the calibration failed)"""


class LeftOut(Typed):
    """A matrix cell that is not a candidate (tune.global_batch cannot derive its grad_accum)."""

    cell: dict[str, Any]
    """the matrix cell"""
    reason: str
    """why it is left out"""


class TuneLog(Typed):
    """`harness tune`'s log, version 1 (fields in the order the file has them)."""

    tune_version: Literal[1]
    """the log's version"""
    scenario: str | None = None
    """the searched scenario's name"""
    scenario_file: str | None = None
    """its file (absolute path)"""
    overrides: list[str] = Field(default_factory=list)
    """`harness tune --set KEY=VALUE`'s texts, as given, in order (harness.scenario.schema.apply_overrides); empty
    without any (and in logs written before they were recorded)"""
    sweep: str | None = None
    """the folder of the trials: <scenario>-tune"""
    cluster: str | None = None
    """cluster profile name"""
    objective: Objective
    """what the search optimises"""
    metric: Metric
    """the record metric it judges"""
    better: Better
    """that metric's good direction"""
    seed: int | None = None
    """orders ties and unranked candidates (--seed)"""
    tune: TuneSettings | None = None
    """the scenario's `tune:` section, defaults filled in"""
    budget: Budget | None = None
    """the budget given"""
    started_at: str | None = None
    """ISO-8601 UTC, to the second"""
    finished_at: str | None = None
    """ISO-8601 UTC, to the second; null: not finished"""
    trials: int | None = None
    """trial runs so far (count)"""
    measured_s: Num | None = None
    """wall time of the trials' sweeps (s, to the ms)"""
    finished: bool | None = None
    """whether the search reached its end (a budget's stop included)"""
    stopped: Stopped | None = None
    """why it stopped early; null: it did not"""
    left_out: list[LeftOut] = Field(default_factory=list)
    """matrix cells that are no candidate"""
    calibration: TuneCalibration | None = None
    """where the ranking's step times came from; null in logs written before it was recorded"""
    groups: list[GroupLog]
    """one per (model, GPU count), in the matrix's order"""

    _path: str | None = PrivateAttr(default=None)

    @property
    def path(self) -> str | None:
        """Not in the file: where the log was read from (None: not read from a file)."""
        return self._path

    def at(self, path: str) -> TuneLog:
        """This log, remembered as read from `path`."""
        self._path = path
        return self

    def every_group_won(self) -> bool:
        """Whether every group has a winner (`harness tune` exits 0, else 1)."""
        return all(g.winner for g in self.groups)


# --- reading ------------------------------------------------------------------------------------------------


def is_tune_log(path: str | Path) -> bool:
    return os.path.basename(path) == TUNE_LOG


def tune_log_files(*dirs: str | Path) -> list[str]:
    """Paths of the tune logs under `dirs` (a dir that is itself a tune.json counts), in path order: walked as the
    records are (hidden entries and symlinked folders left out)."""
    return files_named(TUNE_LOG, *dirs)


def _shown(value: Any) -> str:
    """A value as an error line shows it: its repr, cut at 60 characters."""
    text = repr(value)
    return text if len(text) <= 60 else text[:59] + "…"


_TYPE_ERRORS = frozenset({"int_type", "float_type"})


def _reasons(error: ValidationError, doc: Any) -> list[str]:
    """One line per key path that pydantic refused, `KEY.PATH: VALUE is not WHAT`, and one per object that lacks
    keys, `KEY.PATH: missing keys: a, b`; in the order of the file's fields."""
    lines: dict[str, str] = {}
    # NOTE: a union's members each refuse the same value; the line says the most telling one: a type mismatch of a
    # member (`nan` is not an int) gives way to another member's finer reason (`nan is not a finite number`)
    vague: set[str] = set()
    for e in error.errors():
        if e["type"] == "missing":
            parent = dotted(e["loc"][:-1])
            slot = f"missing {parent}"
            head = f"{parent}: missing keys: " if parent else "missing keys: "
            lines[slot] = (lines[slot] + ", " if slot in lines else head) + str(e["loc"][-1])
            continue
        loc = data_location(doc, e["loc"])
        where = dotted(loc)
        if where in lines and (where not in vague or e["type"] in _TYPE_ERRORS):
            continue
        if e["type"] in _TYPE_ERRORS:
            vague.add(where)
        else:
            vague.discard(where)
        key = next((part for part in reversed(loc) if isinstance(part, str)), "")
        value = e.get("input")
        if e["type"] == "literal_error" and key in ALLOWED:
            what = one_of(value, [str(v) for v in ALLOWED[key]])
        else:
            what = f"{_shown(value)} is not {expected(e)}"
        lines[where] = f"{where}: {what}" if where else what
    return list(lines.values())


def check_tune_log(doc: Any) -> TuneLog:
    """A parsed document as a version-1 tune log; ValueError naming each key and what is wrong when it is not."""
    if not isinstance(doc, dict):
        raise ValueError("not a JSON object")
    version = doc.get("tune_version")
    if version != TUNE_VERSION or isinstance(version, bool):
        raise ValueError(f"unknown tune_version {version!r}; this harness reads version {TUNE_VERSION}")
    try:
        return TuneLog.model_validate(doc)
    except ValidationError as e:
        raise ValueError("; ".join(_reasons(e, doc))) from None


def read_tune_file(path: str | Path) -> TuneLog:
    """One tune log, checked (`check_tune_log`) and remembered as read from `path`; ValueError with the reason."""
    try:
        text = Path(path).read_text()
    except (OSError, UnicodeDecodeError) as e:
        raise ValueError(f"unreadable: {e}") from None
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as e:
        raise ValueError(f"not valid JSON (truncated or corrupt?): {e}") from None
    return check_tune_log(doc).at(str(path))


def read_tune_files(paths: Iterable[str | Path], warnings: list[str]) -> list[TuneLog]:
    """The logs at `paths` that are readable version-1 tune logs; one warning line for each other."""
    logs = []
    for p in paths:
        try:
            logs.append(read_tune_file(p))
        except ValueError as e:
            warnings.append(f"{p}: not a readable harness tune log, its search is not shown: {e}")
    return logs


def read_tune_logs(dirs: Iterable[str | Path], *, warnings: list[str] | None = None) -> list[TuneLog]:
    """Every readable tune log under `dirs` (each sweep folder's tune.json), in path order; a log that is not
    readable is a line appended to `warnings`."""
    return read_tune_files(tune_log_files(*dirs), [] if warnings is None else warnings)
