"""Where the compute model's error comes from on this machine: one rank, no strategy, the zoo Transformer's forward
and backward (no optimizer), measured against the compute model's parts.

    .venv/bin/python bench/probe_compute.py [--cluster local] [--threads N] [SHAPE ...]

SHAPE: `d_model,n_layers,n_heads,ffn,vocab,batch,seq` (default: a spread of small and mid-sized shapes). Per shape:
the measured median of the untraced forward + backward (perf_counter, 9 samples after 3 warm-up), the prediction's
compute (matmuls + attention + elementwise) and per-op host overhead, and, from one profiled step, the time the
main thread spends in matmuls, attention and everything else (self time, profiler overhead included). Needs a
calibration (`harness calibrate --cluster local`). Prints figures; asserts nothing.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from harness.calibrate.in_step import plain_step_parts
from harness.core.zoo import ModelConfig
from harness.plan.calibration.rates import rates_for
from harness.plan.compute import Gemm, block_linears, linear_gemms
from harness.scenario.cluster import load_cluster
from harness.worker.models import build_model, loss_fn

SHAPES = [
    "64,2,2,172,1000,2,128",
    "128,4,4,344,4096,2,128",
    "128,2,2,344,32000,2,128",
    "192,8,3,512,2048,2,128",
    "256,2,4,688,4096,2,512",
    "256,3,4,688,8192,2,128",
    "384,4,6,1024,8192,2,128",
    "512,2,8,1376,8192,4,128",
]
GEMM = {"aten::mm", "aten::addmm", "aten::bmm", "aten::matmul", "aten::linear"}


def isolated_gemms_s(cfg: ModelConfig, tokens: int, rates) -> tuple[float, float]:
    """(calibrated, measured now) seconds of one forward + backward's matmuls, each GEMM shape timed alone now in
    this process (time_call of the calibration, warm operands): the calibration's interpolation and the host's speed
    since the calibration, apart from what the step adds."""
    from harness.calibrate.device import gemm_fn, time_call

    gemms = []
    for _, out_f, in_f in block_linears(cfg):
        f, b = linear_gemms(tokens, out_f, in_f)
        gemms += (f + b) * cfg.n_layers
    f, b = linear_gemms(tokens, cfg.vocab, cfg.d_model)
    gemms += f + b
    cache: dict[Gemm, float] = {}
    for g in gemms:
        if g not in cache:
            cpu = torch.device("cpu")
            cache[g] = time_call(gemm_fn(g.m, g.n, g.k, g.layout, torch.float32, cpu), device=cpu)
    cal = sum(rates.gemm_s("float32", g.m, g.n, g.k, g.layout) for g in gemms)
    return cal, sum(cache[g] for g in gemms)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("shapes", nargs="*", default=SHAPES)
    ap.add_argument("--cluster", default="local")
    ap.add_argument("--threads", type=int, default=1, help="torch threads (a local rank runs 1)")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    from harness.worker import allocator

    allocator.apply("caching", "cpu")  # as a sweep's rank: freed memory kept, no page faults per step
    rates = rates_for(load_cluster(args.cluster))
    fwd_op, bwd_op = rates.dispatch_s()
    print(f"threads {torch.get_num_threads()}; per-op {fwd_op * 1e6:.1f}/{bwd_op * 1e6:.1f} us")
    print(
        f"{'shape':<28} {'meas ms':>8} {'pred ms':>8} {'err %':>6} |"
        f" {'mm+att':>6} {'mm':>6} {'mm iso':>6} {'ew':>6} {'host':>6}"
        f" | prof: {'mm':>6} {'att':>6} {'rest':>6} {'gap':>6} {'n':>5}"
    )
    for shape in args.shapes:
        d, L, h, ffn, vocab, b, s = (int(x) for x in shape.split(","))
        cfg = ModelConfig(d_model=d, n_layers=L, n_heads=h, ffn=ffn, vocab=vocab)
        torch.manual_seed(0)
        model = build_model(cfg, seed=0, device="cpu")
        tokens = torch.randint(0, vocab, (b, s))

        def step(model: torch.nn.Module = model, tokens: torch.Tensor = tokens) -> None:
            loss_fn(model(tokens), tokens).backward()
            for p in model.parameters():
                p.grad = None

        for _ in range(3):
            step()
        times = []
        for _ in range(9):
            t0 = time.perf_counter()
            step()
            times.append(time.perf_counter() - t0)
        meas = statistics.median(times)
        c, host = plain_step_parts(cfg, b, s, rates, "fp32")
        iso = isolated_gemms_s(cfg, b * s, rates)
        # the matmul and attention share of the compute: total minus the elementwise part
        mm_att = c.total - c.elementwise
        pred = c.total + host
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
            t0 = time.perf_counter()
            step()
            wall = time.perf_counter() - t0
        mm = att = rest = 0.0
        n = 0
        for e in prof.key_averages():
            self_s = e.self_cpu_time_total / 1e6
            if e.key in GEMM:
                mm += self_s
            elif "scaled_dot_product" in e.key or "attention" in e.key:
                att += self_s
            elif e.key.startswith("aten::") or "Backward" in e.key:
                rest += self_s
            n += e.count
        print(
            f"{shape:<28} {meas * 1e3:8.2f} {pred * 1e3:8.2f} {100 * (pred / meas - 1):+6.1f} |"
            f" {mm_att * 1e3:6.2f} {iso[0] * 1e3:6.2f} {iso[1] * 1e3:6.2f}"
            f" {c.elementwise * 1e3:6.2f} {host * 1e3:6.2f} |"
            f" {'':>5} {mm * 1e3:6.2f} {att * 1e3:6.2f} {rest * 1e3:6.2f} {(wall - mm - att - rest) * 1e3:6.2f} {n:5d}"
        )


if __name__ == "__main__":
    main()
