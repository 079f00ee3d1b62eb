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
  real work (small matmuls on its device) for (factor − 1) × the time that step took on that rank, inside the
  timed region; on one rank (`rank: N`) or, with rank omitted, on every rank. `slowdowns` keeps the accounting
  of each slowed step (its time, the extra work asked for, the extra work done)
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
    """the step's own time on this rank, before the extra work (s)"""
    target_s: float
    """extra work asked for: (factor − 1) × step_s (s)"""
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
            self._slow_t0 = time.perf_counter() if step >= self.step else None
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
        target_s = (self.factor - 1.0) * step_s
        self.slowdowns.append(Slowdown(step=step, step_s=step_s, target_s=target_s, extra_s=self._busy(target_s)))

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


def _vm_size_bytes() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmSize:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmSize in /proc/self/status")
