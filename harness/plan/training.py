"""What training a number of tokens costs at a cell's predicted throughput (`harness plan --tokens 1T`): days of
wall time on the cell's GPUs, GPU-hours, and the price where the profile has a sourced `price_per_gpu_hour` (else
null with the reason). Pure arithmetic on the prediction; no figure is invented (docs/planner.md: training cost).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from harness.core.errors import InputError, Problem
from harness.plan.prediction import PlannedCell

SUFFIXES = {"": 1.0, "K": 1e3, "M": 1e6, "B": 1e9, "G": 1e9, "T": 1e12}
_TOKENS = re.compile(r"^\s*(\d+(?:\.\d*)?(?:[eE][+-]?\d+)?)\s*([KMBGT]?)\s*$", re.IGNORECASE)


def parse_tokens(text: str, *, option: str = "--tokens") -> float:
    """Tokens from `1T`, `300B`, `2.5e12` or `1000000` (K, M, B/G, T: powers of 1000); bad input raises InputError
    naming the option, the value and the allowed forms."""
    m = _TOKENS.match(text)
    value = float(m.group(1)) * SUFFIXES[m.group(2).upper()] if m else 0.0
    if value < 1:
        raise InputError([Problem(option, "", f"{text!r} is not a token count: a positive number, optionally "
                                               "with K, M, B or T (1T, 300B, 2.5e12)")])  # fmt: skip
    return value


@dataclass(frozen=True)
class TrainingCost:
    """Training `tokens` on one cell."""

    tokens: float
    days: float | None
    """wall-clock days on the cell's GPUs at its predicted tokens/s per GPU"""
    gpu_hours: float | None
    """GPU-hours: tokens / (tokens/s per GPU) / 3600"""
    cost: float | None
    """gpu_hours × the profile's price_per_gpu_hour (its currency), None without a price"""
    reason: str | None
    """why days, GPU-hours or the cost are null"""

    def to_dict(self) -> dict:
        return {
            "tokens": self.tokens,
            "days": self.days,
            "gpu_hours": self.gpu_hours,
            "cost": self.cost,
            "reason": self.reason,
        }


def training_cost(cell: PlannedCell, *, tokens: float, price_per_gpu_hour: float | None, profile: str) -> TrainingCost:
    """Days, GPU-hours and cost of training `tokens` on `cell` (null with the reason where the step time is null,
    or the profile has no price)."""
    p = cell.prediction
    rate = p.tokens_per_s_per_gpu
    if cell.unsupported or cell.cannot_place or rate is None or rate <= 0:
        why = cell.unsupported or cell.cannot_place or (p.time_null_reasons or {}).get("step_time_s")
        return TrainingCost(tokens, None, None, None, f"no step time: {why or 'not predicted'}")
    gpu_hours = tokens / rate / 3600.0
    days = gpu_hours / cell.spec.gpus / 24.0
    if price_per_gpu_hour is None:
        reason = (
            f"the {profile} profile has no performance.price_per_gpu_hour (no sourced price: prices differ by "
            "provider and contract; set yours, with its source)"
        )
        return TrainingCost(tokens, days, gpu_hours, None, reason)
    return TrainingCost(tokens, days, gpu_hours, gpu_hours * price_per_gpu_hour, None)
