"""CPU ranks keep the memory they free, as PyTorch's caching allocator does on a GPU (profile key `cpu_allocator`).

glibc's malloc serves a buffer above its mmap threshold (128 KiB, rising with use to at most 32 MiB) from a fresh
mapping and hands it back to the kernel on free, and trims the heap's free top the same way; the next step's buffer
of the same size is page-faulted and zeroed again, page by page. A GPU rank pays nothing of the kind (the CUDA
caching allocator keeps freed blocks), so on a CPU stand-in that cost is not the strategy's: it grows with every
buffer a strategy allocates per step (ZeRO-3's gathered parameters and reduce buckets most), it moves with the
kernel's load, and no calibration of tiny models sees it. Measured on the 2-core development host, one rank,
deep-12m fp32 (d_model 384, 3 blocks, vocab 8192, seq 128), steps 4-10: ZeRO-3 45,000 minor page faults and
520-580 ms per step with glibc's defaults, 1-6 faults and 375-445 ms kept; DDP 3,000-9,000 faults and 220-290 ms,
0-3 faults (one step 3,089) and 226-283 ms kept.

`keep_freed_memory` sets glibc's `mallopt` in this process: no mmap-served chunks (`M_MMAP_MAX` 0: large buffers
come from the heap and go back to it), no trimming (`M_TRIM_THRESHOLD` 2 GiB, the largest int) and a 1 GiB top pad
(`M_TOP_PAD`: the heap grows in large steps; address space only, nothing is touched until used). The heap then
grows for the first three or four steps (torch asks for 64-byte aligned blocks, a little more than a freed block of
the same size) and stops faulting. It is called in the process itself, not through `MALLOC_*_` environment
variables, because a forked rank (harness.launch.local.prefork) inherits the allocator its zygote initialised. Peak
RSS (a CPU's peak memory) keeps its meaning: the most the process held at once.
"""

from __future__ import annotations

import ctypes
import ctypes.util

M_TRIM_THRESHOLD = -1
M_TOP_PAD = -2
M_MMAP_MAX = -4
TRIM_THRESHOLD = 2**31 - 1
TOP_PAD = 2**30

_applied: str | None = None


def _glibc() -> ctypes.CDLL | None:
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        libc.gnu_get_libc_version.restype = ctypes.c_char_p
        libc.mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
        libc.mallopt.restype = ctypes.c_int
    except (OSError, AttributeError):  # not glibc (macOS, musl): its malloc has no such switches
        return None
    return libc


def keep_freed_memory() -> str:
    """Make this process keep what it frees; returns what was done, for the record's `env.cpu_allocator`."""
    global _applied
    if _applied is not None:
        return _applied
    libc = _glibc()
    if libc is None:
        _applied = "system (not glibc: the C library's own malloc; cpu_allocator caching needs glibc's mallopt)"
        return _applied
    ok = (
        libc.mallopt(M_MMAP_MAX, 0)
        and libc.mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD)
        and libc.mallopt(M_TOP_PAD, TOP_PAD)
    )
    version = libc.gnu_get_libc_version().decode()
    _applied = (
        f"caching (glibc {version} mallopt: no mmap chunks, no trim, 1 GiB top pad)"
        if ok
        else f"system (glibc {version} refused mallopt)"
    )
    return _applied


def apply(choice: str, device_type: str) -> str:
    """The profile's `cpu_allocator` for this process: 'caching' on a CPU device keeps freed memory; a CUDA rank's
    tensors live in PyTorch's own caching allocator, so there the choice only names the host's malloc."""
    if device_type != "cpu":
        return "cuda caching allocator (torch)"
    if choice == "caching":
        return keep_freed_memory()
    return "system (glibc defaults: buffers over the mmap threshold go back to the kernel on free)"


HEADROOM_MIN = 256 * 2**20
HEADROOM_MAX = 2 * 2**30


def keep_headroom(peak_bytes: int | None, *, ranks_here: int = 1) -> int:
    """Fault in free heap before a phase that allocates beside the step (the profiler), so that the step's buffers
    it displaces land on pages already resident. Returns the bytes faulted in (0 when this process does not keep
    freed memory: there a freed buffer goes back to the kernel anyway, and the timed steps paid the same faults).

    Why (issue 33): with freed memory kept (`keep_freed_memory`) the timed steps run without page faults once the
    heap has grown; the profiler's event buffers, allocated during the traced steps, split the freed blocks the
    step reuses, so each traced step's large buffers come from fresh heap, page-faulted one page at a time.
    Measured on the 2-core host, deep-12m FSDP FULL_SHARD, 2 ranks: 11,359 faults per traced step and the traced
    step 1.3-1.8x the untraced one; with 512 MiB faulted in first, 0-9 faults per traced step. The headroom is the
    rank's peak RSS so far (`peak_bytes`), at least 256 MiB and at most 2 GiB or its share (`ranks_here`: the ranks
    on this host) of a quarter of the host's available memory (MemAvailable; where unknown, 2 GiB); the bytes are
    allocated, touched and freed back to the heap's top, which keeps them (no trimming), so the peak memory the
    record reports (read before) is not changed."""
    if _applied is None or not _applied.startswith("caching"):
        return 0
    import torch

    from harness.plan.placement import mem_available_gib

    available = mem_available_gib()
    share = HEADROOM_MAX if available is None else int(available * 2**30) // (4 * max(ranks_here, 1))
    size = min(max(peak_bytes or 0, HEADROOM_MIN), HEADROOM_MAX, share)
    if size <= 0:
        return 0
    buf = torch.empty(size, dtype=torch.uint8)
    buf.fill_(1)
    del buf
    return size
