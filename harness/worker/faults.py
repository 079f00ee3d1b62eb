"""Fault injection (`settings.inject: {fault, rank, step}`): real failures, on purpose, at a chosen step
and rank, so users can check that a cluster and the harness report each kind truthfully.

- exception: raises RuntimeError in the step
- oom: a real allocation failure — CUDA: an allocation larger than the device; CPU: the address-space
  limit (RLIMIT_AS) is lowered just above current use and a large tensor is allocated
- nan: the model's output is multiplied by NaN for that one step on that rank; the real backward and
  gradient reduction spread it
- crash: the rank SIGKILLs itself (dies without an exception)
- hang: the rank stops making progress (sleeps); the others block in their next collective until the
  process-group watchdog fires
- slow: a real, known slowdown (`factor: 1.3`): from step K on, after each step's own work, the rank does extra
  real work (small matmuls on its device) for (factor − 1) × a *reference* step time of that rank, inside the
  timed region; on one rank (`rank: N`) or, with rank omitted, on every rank. The reference is fixed by steps the
  fault did not slow, never by the step being slowed: a step's own time includes its wait in collectives for
  the other ranks' extra work, so slowing by (factor − 1) × that time passed any skew between ranks on,
  multiplied by factor − 1, every step (factor 8 on both ranks of a 2-rank cell grew until the 120 s watchdog).
  The reference:
    - K > 1: the median of this rank's own times of steps 1 … K − 1 (unslowed), fixed from step K on (a K
      a few steps past the warmup makes it the median of steady steps);
    - K = 1 (the default; no unslowed step): the shortest own time of this rank's steps so far, this one
      included. A step's own time is its work plus waits for other ranks, so the shortest is the nearest to the
      work alone; it never grows, so nothing compounds. Not the first step's time alone: the first steps are
      the slowest (lazy initialisation, DDP's bucket rebuild at step 2), and a reference fixed by them would
      slow the timed steps by far more than the factor.
  `slowdowns` keeps the accounting of each slowed step (its own time, the reference, the extra work asked for,
  the extra work done)
"""

from __future__ import annotations

import os
import resource
import signal
import time
from dataclasses import dataclass
from typing import Any

import torch

_WORK_SIDE = 64
"""side of the square matmul the slow fault repeats: short enough (tens of µs on a CPU core) to stop close to
the time asked for"""


@dataclass(frozen=True)
class Slowdown:
    """One step the `slow` fault slowed, as it accounted for it on its rank."""

    step: int
    """1-based global step (warmup included)"""
    step_s: float
    """the step's own time on this rank, before the extra work (s; waits for other ranks included)"""
    reference_s: float
    """the reference step time of this rank the slowdown is a multiple of (s; see the module docstring)"""
    target_s: float
    """extra work asked for: (factor − 1) × reference_s (s)"""
    extra_s: float
    """extra work done (s; at least target_s, by at most one matmul more)"""


class FaultInjector:
    def __init__(self, inject: dict | None, *, rank: int, device: torch.device):
        inject = inject or {}
        self.fault = inject.get("fault")
        if self.fault == "slow":  # NOTE: a slowdown with no rank slows every rank
            self.armed = inject.get("rank") is None or inject.get("rank") == rank
        else:
            self.armed = self.fault is not None and inject.get("rank", 0) == rank
        self.step = inject.get("step", 1)
        self.factor = float(inject.get("factor", 1.0))
        self.rank, self.device = rank, device
        self._hook: Any = None
        self.slowdowns: list[Slowdown] = []
        self._slow_t0: float | None = None
        self._unslowed_s: list[float] = []
        """own times of this rank's steps before the fault's step (s)"""
        self._reference_s: float | None = None
        self._work = (
            torch.full((_WORK_SIDE, _WORK_SIDE), 1.0 / _WORK_SIDE, device=device)
            if self.armed and self.fault == "slow"
            else None
        )

    def before_step(self, step: int, model: torch.nn.Module) -> None:
        """Called with the 1-based global step (warmup included) before the step runs."""
        if self._hook is not None:
            self._hook.remove()
            self._hook = None
        if self.armed and self.fault == "slow":
            # NOTE: the previous step ended at a device synchronisation (the timing's fence): this is its start
            self._slow_t0 = time.perf_counter()  # NOTE: steps before the fault's are timed too: the reference
            return
        if not self.armed or step != self.step:
            return
        where = f"rank {self.rank}, step {step}"
        if self.fault == "exception":
            raise RuntimeError(f"injected exception ({where})")
        if self.fault == "crash":
            os.kill(os.getpid(), signal.SIGKILL)
        if self.fault == "hang":
            while True:
                time.sleep(3600)
        if self.fault == "oom":
            self._oom()
        if self.fault == "nan":
            self._hook = model.register_forward_hook(lambda mod, args, out: out * float("nan"))

    def after_step(self, step: int) -> None:
        """Called after the step's work is queued, still inside the timed region: the `slow` fault's extra work."""
        if self._slow_t0 is None:
            return
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)  # the step's own time includes its kernels
        step_s = time.perf_counter() - self._slow_t0
        self._slow_t0 = None
        if step < self.step:
            self._unslowed_s.append(step_s)
            return
        reference_s = self._reference(step_s)
        target_s = (self.factor - 1.0) * reference_s
        self.slowdowns.append(
            Slowdown(step=step, step_s=step_s, reference_s=reference_s, target_s=target_s, extra_s=self._busy(target_s))
        )

    def _reference(self, step_s: float) -> float:
        """The step time the slowdown is a multiple of (s): the median of the unslowed steps before the fault's,
        fixed; with none (the fault starts at step 1), the shortest own time so far, `step_s` included."""
        if self._unslowed_s:
            if self._reference_s is None:
                self._reference_s = _median(self._unslowed_s)
            return self._reference_s
        self._reference_s = step_s if self._reference_s is None else min(self._reference_s, step_s)
        return self._reference_s

    def _busy(self, seconds: float) -> float:
        """Real work on the device for at least `seconds`; returns how long it ran (s)."""
        work = self._work
        if work is None:  # NOTE: allocated in __init__ whenever the slow fault is armed
            raise RuntimeError("the slow fault's work tensor is missing")
        t0 = time.perf_counter()
        while time.perf_counter() - t0 < seconds:
            work = work @ work
            if self.device.type == "cuda":
                torch.cuda.synchronize(self.device)
        return time.perf_counter() - t0

    def _oom(self) -> None:
        if self.device.type == "cuda":
            free, total = torch.cuda.mem_get_info(self.device)
            torch.empty(int(total * 2), dtype=torch.uint8, device=self.device)  # raises torch.OutOfMemoryError
            return
        vm = _vm_size_bytes()
        soft, hard = resource.getrlimit(resource.RLIMIT_AS)
        resource.setrlimit(resource.RLIMIT_AS, (vm + 256 * 2**20, hard))
        try:
            torch.empty(4 * 2**30, dtype=torch.uint8).fill_(1)
        finally:
            resource.setrlimit(resource.RLIMIT_AS, (soft, hard))


def _median(values: list[float]) -> float:
    v = sorted(values)
    k = len(v)
    return v[k // 2] if k % 2 else (v[k // 2 - 1] + v[k // 2]) / 2


def _vm_size_bytes() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmSize:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmSize in /proc/self/status")
