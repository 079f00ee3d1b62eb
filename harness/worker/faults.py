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
"""

from __future__ import annotations

import os
import resource
import signal
import time
from typing import Any

import torch


class FaultInjector:
    def __init__(self, inject: dict | None, *, rank: int, device: torch.device):
        inject = inject or {}
        self.fault = inject.get("fault")
        self.armed = self.fault is not None and inject.get("rank", 0) == rank
        self.step = inject.get("step", 1)
        self.rank, self.device = rank, device
        self._hook: Any = None

    def before_step(self, step: int, model: torch.nn.Module) -> None:
        """Called with the 1-based global step (warmup included) before the step runs."""
        if self._hook is not None:
            self._hook.remove()
            self._hook = None
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
