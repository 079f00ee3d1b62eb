"""Step timing between device synchronisations; every measured step is kept as a sample."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence

import torch


def synchronize(device: torch.device) -> None:
    """Fence: wait until every kernel queued on the device has finished (no-op on CPU, which is synchronous)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_steps(
    step: Callable[[], torch.Tensor], *, n: int, device: torch.device
) -> tuple[list[float], list[torch.Tensor]]:
    """Run `step` n times; return each step's wall time (s, between fences) and its (device) loss tensor.

    Losses stay on the device: reading them would add a host sync inside the timed region.
    """
    times, losses = [], []
    synchronize(device)
    for _ in range(n):
        t0 = time.perf_counter()
        loss = step()
        synchronize(device)
        times.append(time.perf_counter() - t0)
        losses.append(loss)
    return times, losses


def percentile(samples: Sequence[float], q: float) -> float:
    """Linear-interpolated percentile (q in [0, 100]), numpy's default method."""
    xs = sorted(samples)
    if len(xs) == 1:
        return xs[0]
    pos = (len(xs) - 1) * q / 100.0
    lo = int(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def summarize(samples: Sequence[float]) -> dict:
    return {
        "median": statistics.median(samples),
        "p10": percentile(samples, 10),
        "p90": percentile(samples, 90),
        "mean": statistics.fmean(samples),
        "samples": list(samples),
    }
