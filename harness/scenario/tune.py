"""A scenario's `tune:` section: what `harness tune` optimises and how it searches (docs/tune.md).

    tune:
      objective: throughput      # throughput (tokens/s per GPU, the default) | step_time (seconds per step)
      global_batch: 16           # sequences per optimizer step over all data-parallel ranks: grad_accum is derived
      memory_headroom: 0.1       # keep the predicted peak 10% below the device's usable memory
      first_round: 8             # candidates per (model, gpus) measured in the first round
      confirm_runs: 3            # runs of the leader and the runner-up before they are judged
      max_runs: 5                # the most runs either gets while they cannot be told apart
      alpha: 0.05                # significance of "ahead beyond noise" (harness compare's run-level test)

Pure: no torch. With `global_batch`, every cell's `grad_accum` is global_batch / (micro_batch × data-parallel
ranks); a cell where that is not a whole number is left out of the scenario's cells (`Scenario.left_out` says
which and why), for `harness sweep` as for `harness tune`, so the grid a sweep measures is the space tune searches.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any, Literal, get_args

from harness.core.errors import Problem, one_of, unknown

Objective = Literal["throughput", "step_time"]
"""throughput: maximise tokens/s per GPU; step_time: minimise the median step time"""
OBJECTIVES: tuple[str, ...] = get_args(Objective)


@dataclass(frozen=True)
class TuneSpec:
    """The `tune:` section, defaults filled in (the log keeps it as harness.tune.log.TuneSettings)."""

    objective: Objective = "throughput"
    """what the search optimises (OBJECTIVES)"""
    global_batch: int | None = None
    """sequences per optimizer step over the data-parallel ranks; None: grad_accum as the scenario says"""
    memory_headroom: float = 0.0
    """fraction of the usable device memory the predicted peak must leave free (0.1 = 10%)"""
    first_round: int = 8
    """candidates per (model, gpus) measured in round 0"""
    confirm_runs: int = 3
    """runs of the leader and the runner-up before they are judged"""
    max_runs: int = 5
    """the most runs either gets while they cannot be told apart"""
    alpha: float = 0.05
    """significance of "ahead beyond noise" (p < alpha)"""

    def to_dict(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self)}


TUNE_KEYS: tuple[str, ...] = tuple(f.name for f in fields(TuneSpec))
_INTS = {"global_batch": 1, "first_round": 2, "confirm_runs": 2, "max_runs": 2}
"""integer keys and their minimum (two candidates and two runs: a leader needs a runner-up and a spread)"""


def parse_tune(raw: Any, file: str, problems: list[Problem]) -> TuneSpec | None:
    """The `tune:` mapping as a TuneSpec (None when absent); each problem appended with its key path."""
    if raw is None:
        return None
    if not isinstance(raw, dict):
        problems.append(Problem(file, "tune", f"must be a mapping with keys: {', '.join(TUNE_KEYS)}"))
        return None
    before = len(problems)
    values: dict[str, Any] = {}
    for k, v in raw.items():
        where = f"tune.{k}"
        if k not in TUNE_KEYS:
            problems.append(unknown(file, where, k, TUNE_KEYS))
        elif k == "objective":
            if v not in OBJECTIVES:
                problems.append(Problem(file, where, one_of(v, OBJECTIVES)))
            values[k] = v
        elif k in _INTS:
            if k == "global_batch" and v is None:
                continue
            if isinstance(v, bool) or not isinstance(v, int):
                problems.append(Problem(file, where, f"{v!r} is not an integer"))
            elif v < _INTS[k]:
                problems.append(Problem(file, where, f"{v!r} is below the minimum {_INTS[k]}"))
            values[k] = v
        elif k == "memory_headroom":
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0.0 <= v < 1.0:
                problems.append(Problem(file, where, f"{v!r} must be a fraction in [0, 1), e.g. 0.1 for 10%"))
            values[k] = float(v) if isinstance(v, (int, float)) else v
        elif k == "alpha":
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0.0 < v < 0.5:
                problems.append(Problem(file, where, f"{v!r} must be a significance level in (0, 0.5), e.g. 0.05"))
            values[k] = v
    if len(problems) == before and values.get("max_runs", 5) < values.get("confirm_runs", 3):
        problems.append(
            Problem(
                file,
                "tune.max_runs",
                f"{values.get('max_runs', 5)} is below confirm_runs ({values.get('confirm_runs', 3)})",
            )  # fmt: skip
        )
    if len(problems) > before:
        return None
    return TuneSpec(**values)


def derived_grad_accum(global_batch: int, *, micro_batch: int, dp: int) -> tuple[int | None, str | None]:
    """(grad_accum, None) when global_batch sequences split into micro-steps of micro_batch on dp ranks, else
    (None, why not)."""
    per_step = micro_batch * dp
    if global_batch % per_step:
        return None, (
            f"global_batch {global_batch} is not a multiple of micro_batch {micro_batch} x {dp} data-parallel "
            f"ranks = {per_step}"
        )
    return global_batch // per_step, None
