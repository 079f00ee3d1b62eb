"""What one process measures on its device for `harness calibrate` (harness.calibrate.process's `compute` role):
GEMM throughput per dtype over a grid of shapes and the three layouts a Linear uses (forward x·Wᵀ "nt", input
gradient "nn", weight gradient "tn"); elementwise bandwidth at a few operand sizes; SDPA attention forward and
backward at a few (sequence, heads); the host overhead of a forward op (with autograd recording) and of a backward
op; AdamW's cost per element and per tensor (the optimizer the strategies build, harness.worker.strategies.base.adamw).

Every timing is the median over repetitions between device synchronisations (`time_call`); each result is the
calibration file's typed part (harness.plan.calibration.file). Progress: one line per part.
"""

from __future__ import annotations

import functools
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch

from harness.plan.calibration.file import (
    AttentionPoint,
    Dispatch,
    ElementwisePoint,
    GemmPoint,
    Optimizer,
    OptimizerPoint,
)

GEMM_DIMS = (64, 256, 1024, 4096)
GEMM_DIMS_QUICK = (64, 512, 4096)
LAYOUTS = ("nt", "nn", "tn")
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
"""a measured dtype → the precision a scenario names it by (the `framework` keys' second half, the in-step probes')"""
GEMM_SKINNY = (16384, 32768)
"""vocabulary-sized dims, measured with the two others small (64, 256): the head's GEMMs, which on some CPUs run at
a fraction of the square shapes' rate (bf16 with K = vocab)"""
MAX_POINT_S = 0.4
"""skip a cube point whose estimated time per call is above this (s): the grid's big corner on a CPU"""
MAX_SKINNY_S = 4.0
"""the same for the vocabulary-sized points, which the model needs whatever they cost"""
SLOW_CALL_S = 0.2


def progress(msg: str) -> None:
    """One line of `harness calibrate`'s progress."""
    print(f"calibrate: {msg}", flush=True)


def sync(device: torch.device) -> None:
    """Wait for the device's queued work (a timing's end); nothing to wait for on a CPU."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_call(fn: Callable[[], Any], *, device: torch.device, min_s: float = 0.03, max_reps: int = 30) -> float:
    """Median seconds of one call of `fn`: one warm-up call, then repetitions until `min_s` has passed (at least
    three); calls shorter than 1 ms are batched so the clock's resolution does not matter, and a call longer than
    SLOW_CALL_S is timed once after the warm-up (the grid's slow corners on a CPU)."""
    fn()
    sync(device)
    t0 = time.perf_counter()
    fn()
    sync(device)
    once = time.perf_counter() - t0
    if once > SLOW_CALL_S:
        return once
    inner = max(1, int(1e-3 / max(once, 1e-7)))
    samples: list[float] = []
    start = time.perf_counter()
    while len(samples) < 3 or (time.perf_counter() - start < min_s and len(samples) < max_reps):
        t0 = time.perf_counter()
        for _ in range(inner):
            fn()
        sync(device)
        samples.append((time.perf_counter() - t0) / inner)
    return statistics.median(samples)


def compute_dtypes(device: torch.device) -> list[str]:
    """The dtypes the device's compute is measured in: fp16 only on CUDA (a CPU runs it through fp32)."""
    return ["float32", "bfloat16"] + (["float16"] if device.type == "cuda" else [])


def measure_gemm(device: torch.device, *, quick: bool) -> list[GemmPoint]:
    """Seconds per matmul over the grid, per dtype and layout."""
    out: list[GemmPoint] = []
    dims = GEMM_DIMS_QUICK if quick else GEMM_DIMS
    for name in compute_dtypes(device):
        dt = DTYPES[name]
        shapes = [(m, n, k) for m in dims for n in dims for k in dims]
        cube = len(shapes)
        if not quick:
            for big in GEMM_SKINNY:
                for a in (64, 256):
                    for b in (64, 256):
                        shapes += [(big, a, b), (a, big, b), (a, b, big)]
        n_done = 0
        for layout in LAYOUTS:
            rate = 2 * 256**3 / time_call(gemm_fn(256, 256, 256, layout, dt, device), device=device)
            for i, (m, n, k) in enumerate(shapes):
                cap = MAX_POINT_S if i < cube else MAX_SKINNY_S
                if 2.0 * m * n * k / rate > cap:
                    continue
                fn = gemm_fn(m, n, k, layout, dt, device)
                s = time_call(fn, device=device, min_s=0.02, max_reps=10)
                out.append(GemmPoint(dtype=name, layout=layout, m=m, n=n, k=k, s=s))
                n_done += 1
        best = max(2.0 * p.m * p.n * p.k / p.s for p in out if p.dtype == name) / 1e12
        progress(f"gemm {name}: {n_done} shapes x layouts, best {best:.3g} TFLOPS")
    return out


def gemm_fn(m: int, n: int, k: int, layout: str, dt: torch.dtype, device: torch.device) -> Callable[[], Any]:
    """One matmul of the shape in the layout, on fresh random operands (the measured call)."""
    if layout == "nt":  # F.linear's forward: x (m, k) @ W (n, k).T
        a, b = torch.randn(m, k, device=device, dtype=dt), torch.randn(n, k, device=device, dtype=dt)
        return lambda: torch.mm(a, b.t())
    if layout == "nn":  # input gradient: dY (m, k) @ W (k, n)
        a, b = torch.randn(m, k, device=device, dtype=dt), torch.randn(k, n, device=device, dtype=dt)
        return lambda: torch.mm(a, b)
    # weight gradient: dY (k, m).T @ X (k, n)
    a, b = torch.randn(k, m, device=device, dtype=dt), torch.randn(k, n, device=device, dtype=dt)
    return lambda: torch.mm(a.t(), b)


def measure_elementwise(device: torch.device) -> list[ElementwisePoint]:
    """Bandwidth of an elementwise product (2 reads, 1 write) at a few operand sizes, net of the op's fixed cost."""
    out = []
    for name in ("float32", "bfloat16"):
        dt = DTYPES[name]
        tiny = torch.ones(8, device=device, dtype=dt)
        fixed = time_call(functools.partial(torch.mul, tiny, tiny), device=device)
        for numel in (2**14, 2**18, 2**22, 2**24):
            a = torch.rand(numel, device=device, dtype=dt)
            b = torch.rand(numel, device=device, dtype=dt)
            s = time_call(functools.partial(torch.mul, a, b), device=device)
            op_bytes = numel * a.element_size()
            gbps = 3 * op_bytes / max(s - fixed, s * 0.05) / 1e9
            out.append(ElementwisePoint(dtype=name, op_bytes=op_bytes, gbps=gbps))
        progress(f"elementwise {name}: " + ", ".join(f"{p.gbps:.3g}" for p in out if p.dtype == name) + " GB/s")
    return out


def measure_attention(device: torch.device, *, quick: bool) -> list[AttentionPoint]:
    """Causal SDPA forward and backward (the model's call) at a few (sequence, heads), head_dim 64, batch 1."""
    import torch.nn.functional as F

    out = []
    grid = [(128, 4), (512, 4), (2048, 4), (512, 16)] if not quick else [(128, 4), (512, 4)]
    for name in compute_dtypes(device):
        dt = DTYPES[name]
        for seq, heads in grid:
            q, k, v = (torch.randn(1, heads, seq, 64, device=device, dtype=dt, requires_grad=True) for _ in range(3))
            fwd = time_call(functools.partial(F.scaled_dot_product_attention, q, k, v, is_causal=True), device=device)
            if fwd > MAX_POINT_S:
                continue
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            g = torch.ones_like(y)

            total = time_call(functools.partial(attention_both, q, k, v, g), device=device)
            del y
            shape = {"batch": 1, "heads": heads, "seq": seq, "head_dim": 64}
            out.append(AttentionPoint(dtype=name, **shape, forward_s=fwd, backward_s=max(total - fwd, fwd)))
        progress(f"attention {name}: {sum(1 for p in out if p.dtype == name)} sizes")
    return out


def attention_both(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor) -> None:
    """Causal SDPA forward then backward with the output gradient `g` (the timed call of forward + backward)."""
    import torch.nn.functional as F

    F.scaled_dot_product_attention(q, k, v, is_causal=True).backward(g)


def measure_dispatch(device: torch.device) -> Dispatch:
    """Host cost of one forward op recorded by autograd, and of one backward op, on tiny tensors."""
    n = 200
    x = torch.ones(8, device=device, requires_grad=True)

    def forward() -> torch.Tensor:
        y = x
        for _ in range(n):
            y = y * 1.0001
        return y

    fwd = time_call(forward, device=device) / n

    def both() -> None:
        forward().sum().backward()

    total = time_call(both, device=device)
    bwd = max(total / n - fwd, fwd * 0.5)
    progress(f"per-op overhead: forward {fwd * 1e6:.1f} us, backward {bwd * 1e6:.1f} us")
    return Dispatch(forward_s=fwd, backward_s=bwd)


def measure_optimizer(device: torch.device) -> Optimizer:
    """AdamW (the strategies' own construction) per step over fp32 tensors: seconds per tensor and per element,
    least squares over (tensors, elements) = (8, 1M), (64, 1M), (8, 8M)."""
    from harness.worker.strategies.base import adamw

    points = []
    for tensors, elements in ((8, 2**20), (64, 2**20), (8, 2**23)):
        params = [torch.nn.Parameter(torch.randn(elements // tensors, device=device)) for _ in range(tensors)]
        for p in params:
            p.grad = torch.randn_like(p)
        opt = adamw(params, lr=1e-3, device=device)
        s = time_call(opt.step, device=device, min_s=0.1, max_reps=10)
        points.append((tensors, elements, s))
    # s = a·tensors + b·elements (least squares, 2 unknowns)
    stt = sum(t * t for t, _, _ in points)
    see = sum(e * e for _, e, _ in points)
    ste = sum(t * e for t, e, _ in points)
    sts = sum(t * s for t, _, s in points)
    ses = sum(e * s for _, e, s in points)
    det = stt * see - ste * ste
    a = (sts * see - ses * ste) / det
    b = (stt * ses - ste * sts) / det
    per_tensor, per_element = max(a, 0.0), max(b, 1e-15)
    progress(f"optimizer: {per_element * 1e9:.2f} ns/element + {per_tensor * 1e6:.1f} us/tensor")
    return Optimizer(
        per_tensor_s=per_tensor,
        per_element_s=per_element,
        points=[OptimizerPoint(tensors=t, elements=e, s=secs) for t, e, secs in points],
    )
