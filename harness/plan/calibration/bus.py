"""nccl-tests' bandwidth conventions, which the calibration's measurements, its file and the rates share.

Bytes of a collective are nccl-tests' (harness.worker.meters.comm): all_gather's whole output, reduce_scatter's
whole input. Bandwidths in GB/s (1e9 B/s).
"""

from __future__ import annotations

from collections.abc import Callable

BUS_FACTORS: dict[str, Callable[[int], float]] = {
    "all_reduce": lambda n: 2 * (n - 1) / n,
    "all_gather": lambda n: (n - 1) / n,
    "reduce_scatter": lambda n: (n - 1) / n,
    "broadcast": lambda n: 1.0,
}
"""busbw / algbw for a group of n ranks (nccl-tests doc/PERFORMANCE.md), the collectives the model times; the
same factors as harness.worker.meters.comm.BUS_FACTORS, which a test holds equal (this floor cannot import it)"""


def bus_factor(collective: str, n: int) -> float:
    """busbw / algbw of `collective` in a group of `n` ranks; 0 for a one-rank group (nothing crosses a link)."""
    return BUS_FACTORS[collective](n) if n > 1 else 0.0


def algbw_gbps(nbytes: float, seconds: float) -> float:
    """nccl-tests algorithm bandwidth: bytes (the convention of harness.worker.meters.comm) per second, GB/s."""
    return nbytes / seconds / 1e9


def busbw_gbps(collective: str, n: int, nbytes: float, seconds: float) -> float:
    """nccl-tests bus bandwidth: algbw × the collective's factor for n ranks (GB/s)."""
    return algbw_gbps(nbytes, seconds) * bus_factor(collective, n)
