"""Measure what the step-time model needs on this machine (`harness calibrate`; the file: harness.plan.calibration).

Two roles, each a process the launcher (harness.launch.calibrate) starts with the cluster profile's environment
(locally OMP_NUM_THREADS=1, as every rank runs):

- `compute`: one process on one device measures GEMM throughput per dtype over a grid of shapes and the three
  layouts a Linear uses (forward x·Wᵀ "nt", input gradient "nn", weight gradient "tn"); elementwise bandwidth at a
  few operand sizes; SDPA attention forward and backward at a few (sequence, heads); the host overhead of a forward
  op (with autograd recording) and of a backward op; AdamW's cost per element and per tensor (the optimizer the
  strategies build, harness.worker.strategies.base.adamw); the collectives of a one-rank group; and each strategy
  family's framework overhead: the real strategy set up on a one-rank group, two tiny models (1 and 3 blocks)
  stepped, the time model's prediction without framework subtracted, split into per step and per block.
- `collectives`: one rank of a group of N (RANK/WORLD_SIZE/MASTER_* from the launcher) times all_reduce,
  all_gather, reduce_scatter and broadcast over message sizes through the same process-group backend the worker
  uses (gloo on CPU, nccl on CUDA), nccl-tests conventions for bytes and bus bandwidth; rank 0 writes the curves.

Every timing is the median over repetitions between device synchronisations. Progress: one line per part.

    python -m harness.worker.calibrate compute --cluster PROFILE --out FILE [--quick]
    python -m harness.worker.calibrate collectives --cluster PROFILE --out FILE [--quick]
"""

from __future__ import annotations

import argparse
import datetime
import functools
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from harness.plan.calibration import BUS_FACTORS, FORMAT, bus_factor, host_fingerprint

if TYPE_CHECKING:
    from harness.scenario.cluster import Cluster

GEMM_DIMS = (64, 256, 1024, 4096)
GEMM_DIMS_QUICK = (64, 512, 4096)
LAYOUTS = ("nt", "nn", "tn")
COLLECTIVES = tuple(BUS_FACTORS)
MESSAGE_BYTES = tuple(2**e for e in (10, 13, 16, 19, 22, 25))
MESSAGE_BYTES_QUICK = tuple(2**e for e in (10, 16, 22))
FRAMEWORK_STRATEGIES = ("ddp", "fsdp.full_shard", "fsdp2.full_shard", "zero1", "zero2", "zero3")
"""one strategy per framework code path: every FSDP1 (or FSDP2) strategy runs the same code at one rank"""
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
PRECISION_OF = {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16"}
GEMM_SKINNY = (16384, 32768)
"""vocabulary-sized dims, measured with the two others small (64, 256): the head's GEMMs, which on some CPUs run at
a fraction of the square shapes' rate (bf16 with K = vocab)"""
MAX_POINT_S = 0.4
"""skip a cube point whose estimated time per call is above this (s): the grid's big corner on a CPU"""
MAX_SKINNY_S = 4.0
"""the same for the vocabulary-sized points, which the model needs whatever they cost"""
SLOW_CALL_S = 0.2


def progress(msg: str) -> None:
    print(f"calibrate: {msg}", flush=True)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_call(fn: Callable[[], Any], *, device: torch.device, min_s: float = 0.03, max_reps: int = 30) -> float:
    """Median seconds of one call of `fn`: one warm-up call, then repetitions until `min_s` has passed (at least
    three); calls shorter than 1 ms are batched so the clock's resolution does not matter, and a call longer than
    SLOW_CALL_S is timed once after the warm-up (the grid's slow corners on a CPU)."""
    fn()
    _sync(device)
    t0 = time.perf_counter()
    fn()
    _sync(device)
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
        _sync(device)
        samples.append((time.perf_counter() - t0) / inner)
    return statistics.median(samples)


def compute_dtypes(device: torch.device) -> list[str]:
    return ["float32", "bfloat16"] + (["float16"] if device.type == "cuda" else [])


# --------------------------------------------------------------------------------------------------
# compute


def measure_gemm(device: torch.device, *, quick: bool) -> list[dict]:
    """Seconds per matmul over the grid, per dtype and layout."""
    out: list[dict[str, Any]] = []
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
            rate = 2 * 256**3 / time_call(_gemm_fn(256, 256, 256, layout, dt, device), device=device)
            for i, (m, n, k) in enumerate(shapes):
                cap = MAX_POINT_S if i < cube else MAX_SKINNY_S
                if 2.0 * m * n * k / rate > cap:
                    continue
                fn = _gemm_fn(m, n, k, layout, dt, device)
                s = time_call(fn, device=device, min_s=0.02, max_reps=10)
                out.append({"dtype": name, "layout": layout, "m": m, "n": n, "k": k, "s": s})
                n_done += 1
        best = max(2.0 * p["m"] * p["n"] * p["k"] / p["s"] for p in out if p["dtype"] == name) / 1e12
        progress(f"gemm {name}: {n_done} shapes x layouts, best {best:.3g} TFLOPS")
    return out


def _gemm_fn(m: int, n: int, k: int, layout: str, dt: torch.dtype, device: torch.device) -> Callable[[], Any]:
    if layout == "nt":  # F.linear's forward: x (m, k) @ W (n, k).T
        a, b = torch.randn(m, k, device=device, dtype=dt), torch.randn(n, k, device=device, dtype=dt)
        return lambda: torch.mm(a, b.t())
    if layout == "nn":  # input gradient: dY (m, k) @ W (k, n)
        a, b = torch.randn(m, k, device=device, dtype=dt), torch.randn(k, n, device=device, dtype=dt)
        return lambda: torch.mm(a, b)
    # weight gradient: dY (k, m).T @ X (k, n)
    a, b = torch.randn(k, m, device=device, dtype=dt), torch.randn(k, n, device=device, dtype=dt)
    return lambda: torch.mm(a.t(), b)


def measure_elementwise(device: torch.device) -> list[dict]:
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
            out.append({"dtype": name, "op_bytes": op_bytes, "gbps": 3 * op_bytes / max(s - fixed, s * 0.05) / 1e9})
        progress(f"elementwise {name}: " + ", ".join(f"{p['gbps']:.3g}" for p in out if p["dtype"] == name) + " GB/s")
    return out


def measure_attention(device: torch.device, *, quick: bool) -> list[dict]:
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

            total = time_call(functools.partial(_attention_both, q, k, v, g), device=device)
            del y
            out.append(
                {
                    "dtype": name,
                    "batch": 1,
                    "heads": heads,
                    "seq": seq,
                    "head_dim": 64,
                    "forward_s": fwd,
                    "backward_s": max(total - fwd, fwd),
                }
            )
        progress(f"attention {name}: {sum(1 for p in out if p['dtype'] == name)} sizes")
    return out


def _attention_both(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor) -> None:
    import torch.nn.functional as F

    F.scaled_dot_product_attention(q, k, v, is_causal=True).backward(g)


def measure_dispatch(device: torch.device) -> dict:
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
    return {"forward_s": fwd, "backward_s": bwd}


def measure_optimizer(device: torch.device) -> dict:
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
    return {
        "per_tensor_s": per_tensor,
        "per_element_s": per_element,
        "points": [{"tensors": t, "elements": e, "s": s} for t, e, s in points],
    }


# --------------------------------------------------------------------------------------------------
# sharing a host: the same probes on every rank at once


def measure_sharing(device: torch.device) -> dict:
    """How much a rank slows when the cell's ranks share the host (cores, caches, memory bandwidth), for four probes:
    a GEMM in fp32 and one in bf16 (compute bound), an elementwise product on 16 MiB operands (memory bound) and an
    AdamW step over 4M elements. Each repetition times the probe twice, back to back: on rank 0 alone while the
    other ranks wait at a barrier (`<probe>_alone`), then on every rank of the group at the same moment
    (`<probe>`, the maximum over ranks); the slowdown (`<probe>_slowdown`) is the median over repetitions of their
    ratio. Paired in time, a change in the machine's load between the parts of a calibration cannot pass for
    sharing: a one-rank baseline measured minutes before the group's figures did (one calibration put fp32 GEMMs at
    1.02x on 2 ranks of this 2-core host, others at 1.16-1.38x)."""
    import torch.distributed as dist

    from harness.worker.strategies.base import adamw

    a = torch.randn(256, 1024, device=device)
    b = torch.randn(1024, 1024, device=device)
    a16, b16 = a.to(torch.bfloat16), b.to(torch.bfloat16)
    x, y = torch.rand(2**22, device=device), torch.rand(2**22, device=device)
    params = [torch.nn.Parameter(torch.randn(2**19, device=device)) for _ in range(8)]
    for p in params:
        p.grad = torch.randn_like(p)
    opt = adamw(params, lr=1e-3, device=device)
    probes: dict[str, Callable[[], Any]] = {
        "gemm_s": functools.partial(torch.mm, a, b.t()),
        # NOTE: a bf16 GEMM shares a host differently (on a CPU without bf16 units it is not bound by the same
        # vector units and caches as fp32): bf16 cells are stretched by their own figure
        "gemm_bfloat16_s": functools.partial(torch.mm, a16, b16.t()),
        "elementwise_s": functools.partial(torch.mul, x, y),
        "optimizer_s": opt.step,
    }
    world, rank = dist.get_world_size(), dist.get_rank()
    reps = 5

    def sample(fn: Callable[[], Any], inner: int) -> float:
        _sync(device)
        t0 = time.perf_counter()
        for _ in range(inner):
            fn()
        _sync(device)
        return (time.perf_counter() - t0) / inner

    out: dict[str, Any] = {"ranks": world}
    for name, fn in probes.items():
        fn()
        # NOTE: each sample repeats the probe for ~0.2 s: a lone 10 ms call on a busy host measures the scheduler's
        # time slice, not the rate
        inner = _agreed_repeats(fn, device, 0.2)
        alone, together = [], []
        for _ in range(reps):
            if world > 1:
                dist.barrier()
                alone.append(sample(fn, inner) if rank == 0 else 0.0)
            dist.barrier()
            together.append(sample(fn, inner))
        both = torch.tensor(together + (alone or together), dtype=torch.float64, device=device)
        dist.all_reduce(both, op=dist.ReduceOp.MAX)  # together: the slowest rank; alone: rank 0's (others sent 0)
        t_together, t_alone = both[:reps].tolist(), both[reps:].tolist()
        out[name] = statistics.median(t_together)
        out[name.replace("_s", "_alone_s")] = statistics.median(t_alone)
        out[name.replace("_s", "_slowdown")] = statistics.median(t / a for t, a in zip(t_together, t_alone))
    if world > 1:
        out["sync_wait_s"] = measure_sync_wait(functools.partial(torch.mm, a, b.t()), device)
    if rank == 0:
        progress(
            f"sharing on {world} rank(s): gemm {out['gemm_slowdown']:.2f}x, bf16 gemm "
            f"{out['gemm_bfloat16_slowdown']:.2f}x, elementwise {out['elementwise_slowdown']:.2f}x, optimizer "
            f"{out['optimizer_slowdown']:.2f}x the rank alone"
            + (f"; {out['sync_wait_s'] * 1e3:.2f} ms wait per collective" if world > 1 else "")
        )
    return out


def _agreed_repeats(fn: Callable[[], Any], device: torch.device, target_s: float) -> int:
    """How many calls of `fn` take about `target_s` on the slowest rank: one call timed on every rank, the maximum
    agreed over the group, so that every rank runs the same work."""
    import torch.distributed as dist

    t0 = time.perf_counter()
    fn()
    _sync(device)
    once = torch.tensor([time.perf_counter() - t0], dtype=torch.float64, device=device)
    dist.all_reduce(once, op=dist.ReduceOp.MAX)
    return max(1, int(target_s / max(float(once.item()), 1e-6)))


def measure_sync_wait(gemm: Callable[[], Any], device: torch.device, *, calls: int = 8, reps: int = 3) -> float:
    """Seconds each collective waits for the ranks the host has not run yet, beyond its own time. Every rank of the
    group alternates ~20 ms of GEMMs with a 1 KiB all_reduce, `calls` times, as a training step alternates compute
    with collectives; the same loop without the all_reduces and the all_reduces without the compute are timed too
    (each the slowest rank's time), and the wait is the excess of the first over the other two, per call (the
    median of `reps`, at least 0). On a host with a core per rank it is about 0; with more ranks than cores a rank
    reaches each collective when the scheduler has run it, and the others wait for it."""
    import torch.distributed as dist

    small = torch.zeros(256, device=device)
    inner = _agreed_repeats(gemm, device, 0.02)

    def loop(compute: bool, comm: bool) -> float:
        dist.barrier()
        _sync(device)
        t0 = time.perf_counter()
        for _ in range(calls):
            if compute:
                for _ in range(inner):
                    gemm()
            if comm:
                dist.all_reduce(small)
        _sync(device)
        took = torch.tensor([time.perf_counter() - t0], dtype=torch.float64, device=device)
        dist.all_reduce(took, op=dist.ReduceOp.MAX)
        return float(took.item())

    waits = []
    for _ in range(reps):
        both, compute_only, comm_only = loop(True, True), loop(True, False), loop(False, True)
        waits.append(max(0.0, (both - compute_only - comm_only) / calls))
    return statistics.median(waits)


# --------------------------------------------------------------------------------------------------
# collectives (any world size, this process one rank)


def _collective_fn(name: str, nbytes: int, dt: torch.dtype, device: torch.device, n: int) -> Callable[[], Any]:
    import torch.distributed as dist

    esize = torch.tensor([], dtype=dt).element_size()
    numel = max(n, nbytes // esize // n * n)  # whole elements, divisible by the group
    if name == "all_reduce":
        t = torch.ones(numel, dtype=dt, device=device)
        return lambda: dist.all_reduce(t)
    if name == "broadcast":
        t = torch.ones(numel, dtype=dt, device=device)
        return lambda: dist.broadcast(t, src=0)
    if name == "all_gather":  # bytes: the whole output
        out = torch.empty(numel, dtype=dt, device=device)
        inp = torch.ones(numel // n, dtype=dt, device=device)
        return lambda: dist.all_gather_into_tensor(out, inp)
    inp = torch.ones(numel, dtype=dt, device=device)  # reduce_scatter, bytes: the whole input
    out = torch.empty(numel // n, dtype=dt, device=device)
    return lambda: dist.reduce_scatter_tensor(out, inp)


def _timed_once(fn: Callable[[], Any], device: torch.device) -> float:
    import torch.distributed as dist

    dist.barrier()
    _sync(device)
    t0 = time.perf_counter()
    fn()
    _sync(device)
    return time.perf_counter() - t0


def measure_collectives(*, link: str, device: torch.device, quick: bool) -> list[dict]:
    """Curves of every collective on the current default group (every rank calls this; all return the same)."""
    import torch.distributed as dist

    n = dist.get_world_size()
    sizes = MESSAGE_BYTES_QUICK if quick else MESSAGE_BYTES
    out = []
    plan = [(c, "float32") for c in COLLECTIVES] + [(c, "bfloat16") for c in ("all_reduce", "reduce_scatter")]
    for coll, dtype in plan:
        times = []
        for nbytes in sizes:
            fn = _collective_fn(coll, nbytes, DTYPES[dtype], device, n)
            for _ in range(2):  # warm-up: connections, buffers
                fn()
            # the same number of repetitions on every rank (each one is a barrier and a collective)
            probe = torch.tensor([_timed_once(fn, device)], dtype=torch.float64, device=device)
            dist.all_reduce(probe, op=dist.ReduceOp.MAX)
            n_reps = int(min(20, max(3, 0.3 / max(float(probe.item()), 1e-6))))
            reps = [_timed_once(fn, device) for _ in range(n_reps)]
            # the collective took as long as its slowest rank: the maximum over ranks of their medians
            med = torch.tensor([statistics.median(reps)], dtype=torch.float64, device=device)
            dist.all_reduce(med, op=dist.ReduceOp.MAX)
            times.append(float(med.item()))
        lat = times[0]
        big, prev = sizes[-1], sizes[-2]
        beta = max((times[-1] - times[-2]) / (big - prev), 1e-15)
        factor = bus_factor(coll, n) or 1.0
        out.append(
            {
                "link": link,
                "collective": coll,
                "dtype": dtype,
                "ranks": n,
                "sizes": list(sizes),
                "times": times,
                "latency_s": lat,
                "busbw_gbps": factor / beta / 1e9,
                "busbw_at_sizes_gbps": [nb * (bus_factor(coll, n)) / t / 1e9 for nb, t in zip(sizes, times)],
            }
        )
        if dist.get_rank() == 0:
            progress(
                f"{coll} {dtype} on {n} rank(s) ({link}): latency {lat * 1e6:.0f} us, "
                f"busbw {out[-1]['busbw_gbps']:.3g} GB/s at large messages"
            )
    return out


# --------------------------------------------------------------------------------------------------
# framework overhead per strategy family (one rank)


def measure_framework(cluster_path: str, partial: dict, device: torch.device, *, quick: bool) -> dict:
    """Per-step, per-block and per-parameter overhead of each strategy family beyond what the time model prices: the
    real strategy on a one-rank group steps three models in alternation (one and three blocks of d_model 64, and one
    block of d_model 512 with a 4096-token vocabulary: 7.4M parameters, 60x the first, so the per-parameter term is
    measured at the sizes it is used at, out of the caches, instead of extrapolated from a tiny model; `quick`: one
    block of d_model 256, 1.0M; seq 64, so every GEMM lies inside the calibrated grid); each step's time minus the
    model's prediction with the framework term at zero, solved for the three terms from the paired differences."""
    from harness.core.zoo import ModelConfig
    from harness.plan.calibration import CalibratedRates, Found, parse_calibration
    from harness.plan.time import predict_time
    from harness.scenario.cluster import load_cluster
    from harness.scenario.schema import RunSpec, Settings
    from harness.worker.meters.timing import time_steps
    from harness.worker.runner import _build_trainer

    cluster = load_cluster(cluster_path)
    precisions = [PRECISION_OF[d] for d in compute_dtypes(device)]
    zero = {f"{s}/{p}": {"fixed_s": 0.0, "per_block_s": 0.0} for s in FRAMEWORK_STRATEGIES for p in precisions}
    data = dict(partial, compute=dict(partial["compute"], framework=zero))
    rates = CalibratedRates(Found(Path("(this calibration)"), parse_calibration(data, file="(this calibration)"), None))
    out: dict[str, dict] = {}
    rounds = 4 if quick else 8
    # one block, three blocks, one wide block with many parameters (every GEMM inside the grid)
    # NOTE: the wide model used to be d_model 256 and vocab 512 (1.0M parameters): the per-parameter term, measured
    # over 0.9M parameters, moved 2-3x between calibrations (zero3 fp32: 16.1 and 6.6 ns), and a 12M-parameter
    # model's step with it by 130 ms
    wide = (
        ModelConfig(d_model=256, n_layers=1, n_heads=4, ffn=688, vocab=512)
        if quick
        else ModelConfig(d_model=512, n_layers=1, n_heads=8, ffn=1376, vocab=4096)
    )
    models = {
        "one": (ModelConfig(d_model=64, n_layers=1, n_heads=4, ffn=176, vocab=512), 64),
        "three": (ModelConfig(d_model=64, n_layers=3, n_heads=4, ffn=176, vocab=512), 64),
        "wide": (wide, 64),
    }
    for strategy in FRAMEWORK_STRATEGIES:
        for prec in precisions:
            steps, predicted = {}, {}
            for name, (cfg, seq) in models.items():
                spec = RunSpec(
                    model=f"calibrate-{name}",
                    model_config=cfg,
                    strategy=strategy,
                    precision=prec,
                    gpus=1,
                    nodes=1,
                    gpus_per_node=1,
                    settings=Settings(micro_batch=1, seq_len=seq),
                )
                if spec.unsupported_reason(device.type):
                    break
                trainer, batches = _build_trainer(spec, rank=0, world_size=1, local_rank=0, device=device)
                steps[name] = functools.partial(trainer.step, batches)
                time_steps(steps[name], n=3, device=device)
                predicted[name] = predict_time(spec, cluster, rates, overlap=False).step_time_s or 0.0
            if len(steps) < len(models):
                continue
            # NOTE: the models step in alternation, so a change in the machine's load hits all alike; medians of the
            # paired differences give the per-block and per-element costs
            times: dict[str, list[float]] = {name: [] for name in models}
            for _ in range(rounds):
                for name in models:
                    times[name] += time_steps(steps[name], n=1, device=device)[0]
            resid = {name: [t - predicted[name] for t in times[name]] for name in models}
            n_params = {name: cfg.n_params() for name, (cfg, _) in models.items()}
            d_wide = statistics.median(w - o for o, w in zip(resid["one"], resid["wide"]))
            d_three = statistics.median(t - o for o, t in zip(resid["one"], resid["three"]))
            per_element = max(0.0, d_wide / (n_params["wide"] - n_params["one"]))
            per_block = max(0.0, (d_three - per_element * (n_params["three"] - n_params["one"])) / 2)
            fixed = max(0.0, statistics.median(resid["one"]) - per_block - per_element * n_params["one"])
            out[f"{strategy}/{prec}"] = {
                "fixed_s": fixed,
                "per_block_s": per_block,
                "per_element_s": per_element,
                "measured_s": {name: statistics.median(ts) for name, ts in times.items()},
                "predicted_s": predicted,
            }
            steps.clear()
            progress(
                f"framework {strategy} {prec}: {fixed * 1e3:.2f} ms/step + {per_block * 1e3:.2f} ms/block + "
                f"{per_element * 1e9:.2f} ns/parameter"
            )
    return out


# --------------------------------------------------------------------------------------------------
# the processes


def fingerprint(device: torch.device, backend: str, cpu_allocator: str) -> dict[str, Any]:
    fp = host_fingerprint().to_dict()
    fp.update(
        device=device.type,
        device_name=torch.cuda.get_device_name(device) if device.type == "cuda" else None,
        device_count=torch.cuda.device_count() if device.type == "cuda" else None,
        backend=backend,
        threads_per_rank=torch.get_num_threads(),
        torch_full=torch.__version__,
        cpu_allocator=cpu_allocator,
    )
    return fp


def _process_setup(cluster_path: str) -> tuple[Cluster, torch.device]:
    """This calibration process as the profile makes a sweep's rank: its threads, its allocator, its device. Returns
    the profile (read once) and the device."""
    from harness.scenario.cluster import load_cluster
    from harness.worker import allocator

    if "OMP_NUM_THREADS" in os.environ:
        torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))
    cluster = load_cluster(cluster_path)
    allocator.apply(cluster.cpu_allocator, cluster.device)
    if cluster.device == "cuda":
        if not torch.cuda.is_available():
            raise RuntimeError(f"profile {cluster.name!r} says cuda, but torch.cuda.is_available() is False here")
        local = int(os.environ.get("LOCAL_RANK", os.environ.get("RANK", "0")))
        torch.cuda.set_device(local)
        return cluster, torch.device("cuda", local)
    return cluster, torch.device("cpu")


def _init_group(device: torch.device, *, rank: int, world: int) -> None:
    import torch.distributed as dist

    backend = "nccl" if device.type == "cuda" else "gloo"
    if "MASTER_ADDR" not in os.environ:  # the one-rank group of the compute process
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(_free_port()), RANK="0", WORLD_SIZE="1")
        os.environ.setdefault("LOCAL_RANK", "0")
    dist.init_process_group(
        backend=backend,
        rank=rank,
        world_size=world,
        timeout=datetime.timedelta(seconds=300),
        device_id=device if backend == "nccl" else None,
    )


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_compute(cluster_path: str, out: Path, *, quick: bool) -> None:
    cluster, device = _process_setup(cluster_path)
    t0 = time.perf_counter()
    compute: dict[str, Any] = {}
    compute["gemm"] = measure_gemm(device, quick=quick)
    compute["elementwise"] = measure_elementwise(device)
    compute["attention"] = measure_attention(device, quick=quick)
    compute["dispatch"] = measure_dispatch(device)
    compute["optimizer"] = measure_optimizer(device)
    _init_group(device, rank=0, world=1)
    comm = measure_collectives(link="self", device=device, quick=True)
    sharing = [measure_sharing(device)]
    partial: dict[str, Any] = {
        "format": FORMAT,
        "cluster": cluster.name,
        "fingerprint": fingerprint(device, "nccl" if device.type == "cuda" else "gloo", cluster.cpu_allocator),
        "compute": compute,
        "comm": comm,
        "sharing": sharing,
    }
    compute["framework"] = measure_framework(cluster_path, partial, device, quick=quick)
    partial["compute_s"] = time.perf_counter() - t0
    _write(out, partial)


def run_collectives(cluster_path: str, out: Path, *, quick: bool, link: str) -> None:
    import torch.distributed as dist

    _, device = _process_setup(cluster_path)
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    _init_group(device, rank=rank, world=world)
    shared = measure_sharing(device)
    curves = measure_collectives(link=link, device=device, quick=quick)
    if rank == 0:
        _write(out, {"comm": curves, "sharing": [shared] if link == "intra" else []})
    dist.barrier()
    dist.destroy_process_group()


def _write(path: Path, data: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".tmp")
    with os.fdopen(fd, "w") as f:
        json.dump(data, f, indent=1, allow_nan=False)
    os.replace(tmp, path)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m harness.worker.calibrate", description=__doc__.splitlines()[0])
    ap.add_argument("role", choices=["compute", "collectives"])
    ap.add_argument("--cluster", required=True, help="cluster profile path")
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--quick", action="store_true", help="a smaller grid (tests)")
    ap.add_argument("--link", default="intra", help="collectives: the link the group spans (intra | inter)")
    args = ap.parse_args(argv)
    if args.role == "compute":
        run_compute(args.cluster, args.out, quick=args.quick)
    else:
        run_collectives(args.cluster, args.out, quick=args.quick, link=args.link)
    return 0


if __name__ == "__main__":
    sys.exit(main())
