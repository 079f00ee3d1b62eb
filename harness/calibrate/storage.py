"""The checkpoint folder's bandwidth, what predicted.checkpoint_s prices with: one file written sequentially in large
chunks and fsynced (a checkpoint is durable only once synced), then read back after its pages were dropped from the
page cache (otherwise the read would measure memory, not storage). One process; the folder is the profile's
checkpoint_dir, else the calibration file's folder.

Units: bytes, seconds; bandwidths in GB/s (1e9 B/s).
"""

from __future__ import annotations

import os
import tempfile
import time
from pathlib import Path

from harness.plan.calibration.file import Storage

CHUNK_BYTES = 8 * 2**20
"""one write or read call (B): large, as torch.save and DCP write tensors"""
FILE_BYTES = 512 * 2**20
"""the measured file (B): large enough that a file system's write-back and read-ahead reach their steady rate"""
QUICK_FILE_BYTES = 32 * 2**20
"""the file with --quick (B)"""


def measure_storage(folder: Path, *, quick: bool) -> Storage:
    """Write, fsync, drop from the page cache and read back one file in `folder`; the file is removed."""
    size = QUICK_FILE_BYTES if quick else FILE_BYTES
    chunk = os.urandom(CHUNK_BYTES)  # NOTE: incompressible, as model weights are to a compressing file system
    folder.mkdir(parents=True, exist_ok=True)
    fd, name = tempfile.mkstemp(prefix=".harness-storage-", dir=folder)
    try:
        t0 = time.perf_counter()
        for _ in range(size // CHUNK_BYTES):
            os.write(fd, chunk)
        os.fsync(fd)
        write_s = time.perf_counter() - t0
        if hasattr(os, "posix_fadvise"):  # NOTE: the synced pages are clean, so the kernel can drop them
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        os.lseek(fd, 0, os.SEEK_SET)
        t0 = time.perf_counter()
        while os.read(fd, CHUNK_BYTES):
            pass
        read_s = time.perf_counter() - t0
    finally:
        os.close(fd)
        os.unlink(name)
    return Storage(path=str(folder), bytes=size, write_gbps=size / write_s / 1e9, read_gbps=size / read_s / 1e9)
