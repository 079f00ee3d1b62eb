"""What the ranks of a process group measure together for `harness calibrate`: how much a rank slows while the
group's ranks share the host (`measure_sharing`, with the wait per collective of a crowded host), and the
collectives' time per message size (`measure_collectives`) through the process-group backend the worker uses (gloo
on CPU, nccl on CUDA), with nccl-tests' conventions for bytes and bus bandwidth. Every rank calls each function and
every rank gets the same result (maxima and medians agreed over the group).

The device process measures them on a one-rank group (link "self"); harness.calibrate.process's `collectives` role
on groups of 2 and more (links "intra" and "inter").
"""

from __future__ import annotations

import datetime
import functools
import os
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch

from harness.calibrate.device import DTYPES, progress, sync
from harness.calibrate.in_step import PROBES, probe_step
from harness.core.ports import free_port
from harness.plan.calibration.bus import BUS_FACTORS, bus_factor
from harness.plan.calibration.file import CommCurve, Sharing

COLLECTIVES = tuple(BUS_FACTORS)
MESSAGE_BYTES = tuple(2**e for e in (10, 13, 16, 19, 22, 25))
"""message sizes of each collective's curve (bytes)"""
MESSAGE_BYTES_QUICK = tuple(2**e for e in (10, 16, 22))
"""the same with `--quick`, and on the device process's one-rank group"""
CURVE_BUDGET_S = 1.8
"""about how long one collective's curve is sampled (every size, interleaved): six sizes at the 0.3 s each had
before"""
CURVE_REPS = (7, 20)
"""the fewest and most passes over a curve's sizes"""
CURVE_TRIM = 0.1
"""the share of each size's samples cut from each end before averaging (scipy.stats.trim_mean)"""
STEP_PROBE = PROBES["mid"]
"""the plain step `measure_sharing` shares (model, micro-batch, sequence): about 0.1 s in fp32 on one core"""


def init_group(device: torch.device, *, rank: int, world: int) -> None:
    """Join the group the launcher set up (MASTER_* in the environment), or make this process a one-rank group."""
    import torch.distributed as dist

    backend = "nccl" if device.type == "cuda" else "gloo"
    if "MASTER_ADDR" not in os.environ:  # the one-rank group of the compute process
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()), RANK="0", WORLD_SIZE="1")
        os.environ.setdefault("LOCAL_RANK", "0")
    dist.init_process_group(
        backend=backend,
        rank=rank,
        world_size=world,
        timeout=datetime.timedelta(seconds=300),
        device_id=device if backend == "nccl" else None,
    )


def measure_sharing(device: torch.device) -> Sharing:
    """How much a rank slows when the cell's ranks share the host (cores, caches, memory bandwidth), for six probes:
    a GEMM in fp32 and one in bf16 (compute bound), an elementwise product on 16 MiB operands (memory bound), an
    AdamW step over 4M elements, and a whole plain step (forward and backward of the zoo Transformer at the in-step
    calibration's `mid` probe shape) in fp32 and in bf16 — the mix of matmuls, elementwise work and per-op host
    overhead a cell's micro-step is, which is what the time model stretches. Each repetition times the probe twice,
    back to back: on rank 0 alone while the other ranks wait at a barrier (`<probe>_alone`), and on every rank of
    the group at the same moment (`<probe>`, the maximum over ranks), alternating which comes first; the slowdown
    (`<probe>_slowdown`) is the median over repetitions of their ratio. Paired in time, a change in the machine's
    load between the parts of a calibration cannot pass for sharing: a one-rank baseline measured minutes before the
    group's figures did (one calibration put fp32 GEMMs at 1.02x on 2 ranks of this 2-core host, others at
    1.16-1.38x)."""
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
    cfg, batch, seq = STEP_PROBE
    probes: dict[str, Callable[[], Any]] = {
        "gemm_s": functools.partial(torch.mm, a, b.t()),
        # NOTE: a bf16 GEMM shares a host differently (on a CPU without bf16 units it is not bound by the same
        # vector units and caches as fp32): bf16 cells are stretched by their own figure
        "gemm_bfloat16_s": functools.partial(torch.mm, a16, b16.t()),
        "elementwise_s": functools.partial(torch.mul, x, y),
        "optimizer_s": opt.step,
        "step_s": probe_step(cfg, batch, seq, torch.float32, device),
        "step_bfloat16_s": probe_step(cfg, batch, seq, torch.bfloat16, device),
    }
    world, rank = dist.get_world_size(), dist.get_rank()
    reps = 7

    def sample(fn: Callable[[], Any], inner: int) -> float:
        sync(device)
        t0 = time.perf_counter()
        for _ in range(inner):
            fn()
        sync(device)
        return (time.perf_counter() - t0) / inner

    out: dict[str, Any] = {"ranks": world}
    for name, fn in probes.items():
        fn()
        # NOTE: each sample repeats the probe for ~0.2 s: a lone 10 ms call on a busy host measures the scheduler's
        # time slice, not the rate
        inner = agreed_repeats(fn, device, 0.2)
        alone, together = [], []
        for i in range(reps):
            first = i % 2 == 0  # alone first in even repetitions, after in odd ones
            for alone_now in (first, not first) if world > 1 else (False,):
                dist.barrier()
                if alone_now:
                    alone.append(sample(fn, inner) if rank == 0 else 0.0)
                else:
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
            f"{out['optimizer_slowdown']:.2f}x, plain step {out['step_slowdown']:.2f}x (bf16 "
            f"{out['step_bfloat16_slowdown']:.2f}x) the rank alone"
            + (f"; {out['sync_wait_s'] * 1e3:.2f} ms wait per collective" if world > 1 else "")
        )
    return Sharing.model_validate(out)


def agreed_repeats(fn: Callable[[], Any], device: torch.device, target_s: float) -> int:
    """How many calls of `fn` take about `target_s` on the slowest rank: one call timed on every rank, the maximum
    agreed over the group, so that every rank runs the same work."""
    import torch.distributed as dist

    t0 = time.perf_counter()
    fn()
    sync(device)
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
    inner = agreed_repeats(gemm, device, 0.02)

    def loop(compute: bool, comm: bool) -> float:
        dist.barrier()
        sync(device)
        t0 = time.perf_counter()
        for _ in range(calls):
            if compute:
                for _ in range(inner):
                    gemm()
            if comm:
                dist.all_reduce(small)
        sync(device)
        took = torch.tensor([time.perf_counter() - t0], dtype=torch.float64, device=device)
        dist.all_reduce(took, op=dist.ReduceOp.MAX)
        return float(took.item())

    waits = []
    for _ in range(reps):
        both, compute_only, comm_only = loop(True, True), loop(True, False), loop(False, True)
        waits.append(max(0.0, (both - compute_only - comm_only) / calls))
    return statistics.median(waits)


def collective_fn(name: str, nbytes: int, dt: torch.dtype, device: torch.device, n: int) -> Callable[[], Any]:
    """One call of the collective on about `nbytes` (nccl-tests' bytes: all_gather's output, reduce_scatter's input)
    in the group of `n` ranks, on buffers made once."""
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
        gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
        return lambda: gather(out, inp)
    inp = torch.ones(numel, dtype=dt, device=device)  # reduce_scatter, bytes: the whole input
    out = torch.empty(numel // n, dtype=dt, device=device)
    # NOTE: torch 2.13 deprecates the *_tensor names (a FutureWarning per call: about 80 lines per calibration) for
    # the *_single ones, which older torch lacks
    scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
    return lambda: scatter(out, inp)


def timed_once(fn: Callable[[], Any], device: torch.device) -> float:
    """Seconds of one call on this rank, started behind a barrier so that every rank starts together."""
    import torch.distributed as dist

    dist.barrier()
    sync(device)
    t0 = time.perf_counter()
    fn()
    sync(device)
    return time.perf_counter() - t0


def measure_collectives(*, link: str, device: torch.device, quick: bool) -> list[CommCurve]:
    """Curves of every collective on the current default group (every rank calls this; all return the same)."""
    import torch.distributed as dist

    n = dist.get_world_size()
    sizes = MESSAGE_BYTES_QUICK if quick else MESSAGE_BYTES
    out: list[CommCurve] = []
    plan = [(c, "float32") for c in COLLECTIVES] + [(c, "bfloat16") for c in ("all_reduce", "reduce_scatter")]
    for coll, dtype in plan:
        fns = [collective_fn(coll, nbytes, DTYPES[dtype], device, n) for nbytes in sizes]
        for fn in fns:
            for _ in range(2):  # warm-up: connections, buffers
                fn()
        # the same number of passes on every rank (each call is a barrier and a collective)
        probe = torch.tensor([sum(timed_once(fn, device) for fn in fns)], dtype=torch.float64, device=device)
        dist.all_reduce(probe, op=dist.ReduceOp.MAX)
        lo, hi = CURVE_REPS
        passes = int(min(hi, max(lo, CURVE_BUDGET_S / max(float(probe.item()), 1e-6))))
        # NOTE: the sizes interleaved, pass after pass (alternating direction), not one size's repetitions after
        # another's: a slow moment of the host then lands on every size alike instead of bending one point of the
        # curve (on a 2-core VM, consecutive 1 KiB and 8 KiB points came out 0.5 and 3.2 ms that way)
        samples: list[list[float]] = [[] for _ in sizes]
        for k in range(passes):
            for i in range(len(fns)) if k % 2 == 0 else reversed(range(len(fns))):
                samples[i].append(timed_once(fns[i], device))
        # the collective took as long as its slowest rank: the maximum over ranks of each size's mean
        mine = torch.tensor([_trimmed_mean(s) for s in samples], dtype=torch.float64, device=device)
        dist.all_reduce(mine, op=dist.ReduceOp.MAX)
        times = curve_times(mine.tolist())
        lat = times[0]
        big, prev = sizes[-1], sizes[-2]
        beta = max((times[-1] - times[-2]) / (big - prev), 1e-15)
        factor = bus_factor(coll, n) or 1.0
        out.append(
            CommCurve(
                link=link,
                collective=coll,
                dtype=dtype,
                ranks=n,
                sizes=list(sizes),
                times=times,
                latency_s=lat,
                busbw_gbps=factor / beta / 1e9,
                busbw_at_sizes_gbps=[nb * (bus_factor(coll, n)) / t / 1e9 for nb, t in zip(sizes, times)],
            )
        )
        if dist.get_rank() == 0:
            progress(curve_line(out[-1]))
    return out


def curve_line(curve: CommCurve) -> str:
    """`harness calibrate`'s progress line of one measured curve: its latency, and its bus bandwidth where there is
    one (a one-rank group has none: nothing crosses a link, and its curve's slope is no bus's bandwidth)."""
    latency = f"latency {curve.latency_s * 1e6:.0f} us" if curve.latency_s is not None else "no latency"
    if curve.ranks <= 1:
        bus = "no bus bandwidth (one rank: nothing crosses a link)"
    elif curve.busbw_gbps is None:
        bus = "no bus bandwidth"
    else:
        bus = f"busbw {curve.busbw_gbps:.3g} GB/s at large messages"
    return f"{curve.collective} {curve.dtype} on {curve.ranks} rank(s) ({curve.link}): {latency}, {bus}"


def _trimmed_mean(samples: list[float]) -> float:
    from scipy.stats import trim_mean

    return float(trim_mean(samples, CURVE_TRIM))


def curve_times(means: list[float]) -> list[float]:
    """A curve's seconds per size (ascending sizes) from each size's mean: made non-decreasing in size, the least
    change in log time that does so (isotonic regression, scipy): a bigger message never takes less time, and
    a dip is noise.

    NOTE: each size's figure is a trimmed mean, not a median: a step's communication is a sum of calls, which
    tends to count × mean; and calls can be bimodal — on the 2-core development VM, 60 calls of a 1 KiB gloo
    all_reduce took 0.23–0.83 ms or 2.1–7.6 ms, about half each — where the median falls in the gap and jumps from
    one mode to the other between calibrations (an 8.9 ms "latency" in one), while the mean moves with the mix."""
    import math

    from scipy.optimize import isotonic_regression

    logs = [math.log(max(t, 1e-9)) for t in means]
    return [math.exp(x) for x in isotonic_regression(logs, increasing=True).x]
