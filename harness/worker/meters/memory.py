"""Peak memory after warmup. CUDA: allocator peaks (allocated and reserved). CPU: the process's peak RSS,
reset after warmup by writing 5 to /proc/self/clear_refs and read back as VmHWM."""

from __future__ import annotations

import warnings
from pathlib import Path

import torch

GIB = 2**30


class MemoryMeter:
    def __init__(self, device: torch.device):
        self.device = device

    def reset(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(self.device)
            self._retries0 = torch.cuda.memory_stats(self.device).get("num_alloc_retries", 0)
        else:
            try:
                Path("/proc/self/clear_refs").write_text("5")
            except OSError:
                pass

    def read(self) -> dict:
        """{peak_memory_allocated_gib, peak_memory_reserved_gib, alloc_retries, null_reasons}."""
        if self.device.type == "cuda":
            stats = torch.cuda.memory_stats(self.device)
            retries = stats.get("num_alloc_retries", 0) - getattr(self, "_retries0", 0)
            if retries:
                warnings.warn(
                    f"{retries} cudaMalloc retries during measurement: the allocator was under "
                    "memory pressure and step times include cache flushes",
                    stacklevel=2,
                )
            return {
                "peak_memory_allocated_gib": torch.cuda.max_memory_allocated(self.device) / GIB,
                "peak_memory_reserved_gib": torch.cuda.max_memory_reserved(self.device) / GIB,
                "alloc_retries": retries,
                "null_reasons": {},
            }
        hwm = peak_rss_bytes()
        reasons = {
            "peak_memory_reserved_gib": "CPU: there is no caching allocator; the process peak RSS is "
            "reported as allocated"
        }
        if hwm is None:
            reasons["peak_memory_allocated_gib"] = "CPU: /proc/self/status has no VmHWM on this system"
        return {
            "peak_memory_allocated_gib": None if hwm is None else hwm / GIB,
            "peak_memory_reserved_gib": None,
            "alloc_retries": None,
            "null_reasons": reasons,
        }


def _status_kib(field: str) -> int | None:
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def peak_rss_bytes() -> int | None:
    """This process's peak resident set size since the last reset (VmHWM, bytes)."""
    return _status_kib("VmHWM")


def rss_bytes() -> int | None:
    """Current resident set size of this process (bytes)."""
    return _status_kib("VmRSS")
