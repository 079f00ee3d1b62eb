"""A matmul benchmark's log as an achievable matmul rate per dtype: stas00's mamf-finder
(ml-engineering, compute/accelerator/benchmarks/mamf-finder.py), whose output file (benchmark version 2, since
2025-01) reads

    ** Dtype: torch.bfloat16
    ...
    - _CudaDeviceProperties(name='NVIDIA H100 80GB HBM3', major=9, minor=0, ...)
    ...
    Tried 2240 shapes => the best outcomes were:
    mean:   727.0 TFLOPS @ 11264x4096x4096 (MxNxK)
    median: 727.8 TFLOPS @ 11264x4096x4096 (MxNxK)
    max:    755.6 TFLOPS @ 9472x4096x4096 (MxNxK)

(until 2025-10 `Tried  2240 shapes`, two spaces; until 2025-01 the `max:` line first and `mean:` last).

The rate is the best shape's `mean` (the figure ml-engineering's MAMF table reports, and the one the shipped
profiles cite): TFLOPS = 1e12 FLOP/s. Version 1 (2024) printed one line, `The best outcome was 755.6TFLOPS @ … (tried
80 shapes)` (later `…(max)/…(median) TFLOPS`): the fastest iteration's rate, not a mean; it is refused with that
reason. A log without the summary (the run did not finish) or without its dtype is refused with the file and the
line. Pure: no torch.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from harness.core.errors import InputError, Problem

DTYPE_RE = re.compile(r"^\*\* Dtype:\s*(?:torch\.)?(\S+)")
DEVICE_RE = re.compile(r"name='([^']+)'")
TRIED_RE = re.compile(r"Tried\s+(\d+)\s+shapes => the best outcomes were:")
V1_RE = re.compile(r"The best outcome was (\S+?) ?TFLOPS @ .*\(tried (\d+) shapes\)")
"""version 1's summary: the fastest iteration's rate of the best shape (later also the median)"""
BEST_RE = re.compile(r"^mean:\s+([0-9.]+) TFLOPS @ (\d+)x(\d+)x(\d+)")


@dataclass(frozen=True)
class MatmulLog:
    """What one mamf-finder run found."""

    path: str
    dtype: str
    """torch's dtype name (bfloat16, float16, float32, float8_e4m3fn, …)"""
    tflops: float
    """the best shape's mean rate (1e12 FLOP/s)"""
    m: int
    n: int
    k: int
    """that shape: (m × k) · (k × n)"""
    shapes: int
    """shapes tried"""
    device: str | None
    """the device's name as torch reported it"""
    line: int
    """the line of the `mean:` result"""
    device_line: int = 0
    """the line that names the device (0: none does)"""


def looks_like_mamf(text: str) -> bool:
    """Whether `text` is mamf-finder's output (its dtype line, or its summary)."""
    return any(DTYPE_RE.match(line) or TRIED_RE.search(line) or V1_RE.search(line) for line in text.split("\n"))


def parse_mamf(path: Path, text: str) -> MatmulLog:
    """The mamf-finder log at `path` (its `text`); InputError naming the file and the line when it is not one or
    did not finish."""
    file = str(path)
    lines = text.removesuffix("\n").split("\n")  # NOTE: not splitlines: the progress line's \r are not lines
    dtype = next(((i, m.group(1)) for i, line in enumerate(lines, 1) if (m := DTYPE_RE.match(line))), None)
    if dtype is None:
        raise InputError([Problem(file, "line 1", "not a mamf-finder log: no `** Dtype: …` line")])
    device = next(((i, m.group(1)) for i, line in enumerate(lines, 1) if (m := DEVICE_RE.search(line))), None)
    tried = next(((i, int(m.group(1))) for i, line in enumerate(lines, 1) if (m := TRIED_RE.search(line))), None)
    old = next(((i, m.group(1)) for i, line in enumerate(lines, 1) if (m := V1_RE.search(line))), None)
    if tried is None and old is not None:
        raise InputError(
            [
                Problem(
                    file,
                    f"line {old[0]}",
                    f"mamf-finder version 1's summary ({old[1]} TFLOPS) gives the best shape's fastest iteration, "
                    "not the mean rate the harness plans with; run mamf-finder version 2 (`Tried N shapes => the "
                    "best outcomes were:`, ml-engineering since 2025-01)",
                )
            ]
        )
    if tried is None:
        raise InputError(
            [Problem(file, f"line {len(lines)}", "truncated: no `Tried N shapes => the best outcomes were:` summary")]
        )
    best = next(
        ((i, m) for i, line in enumerate(lines[tried[0] :], tried[0] + 1) if (m := BEST_RE.match(line.strip()))), None
    )
    if best is None:
        raise InputError(
            [Problem(file, f"line {tried[0] + 1}", "no `mean: X TFLOPS @ MxNxK` result after the summary")]
        )
    n, m = best
    tflops = float(m.group(1))
    if tflops <= 0:
        raise InputError([Problem(file, f"line {n}", f"{tflops} TFLOPS is not a measured rate")])
    return MatmulLog(
        path=file,
        dtype=dtype[1],
        tflops=tflops,
        m=int(m.group(2)),
        n=int(m.group(3)),
        k=int(m.group(4)),
        shapes=tried[1],
        device=device[1] if device else None,
        line=n,
        device_line=device[0] if device else 0,
    )
