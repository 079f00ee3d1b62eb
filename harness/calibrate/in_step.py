"""How the device's rates hold inside a training step, for `harness calibrate` on a CPU: the zoo Transformer's
forward and backward on one rank, without a strategy, at five probe shapes, against the time model's compute and
per-op host overhead at the rates measured moments before; three factors fitted on them.

The device's rates come from operators timed alone: a GEMM on the same operands again and again, an elementwise
product, a tiny op in a loop. Inside a step each operator finds its operands out of the caches, the elementwise work
is norms, rotary, SiLU, softmax and strided copies rather than a product, and every op pays Python, module and
autograd bookkeeping that a loop of one op does not. And the ratio moves with the machine's state: on the 2-core
development host three calibrations within an hour measured the per-op cost at 4.8, 5.1 and 9.9 us and the best
fp32 GEMM at 0.109-0.133 TFLOPS, while the probes' plain steps moved far less; priced at the fast calibration's
isolated rates the five probes ran 14-32 % slower than their prediction, at the slow one's 5 % faster to 8 % slower.
So each calibration measures the step itself, right after the isolated rates, and fits one factor per priced part
(`InStep`): kernels (matmuls and attention), elementwise bytes, per-op host overhead — bounded least squares on
relative error over the probes (`fit_in_step`). The time model multiplies each part by its factor
(harness.plan.compute); the strategies' framework overheads are measured after this, net of the corrected
prediction.

Not on GPUs: there the host runs ahead of the device, and a step is not the sum of its parts.
"""

from __future__ import annotations

import dataclasses
import statistics
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import torch

from harness.calibrate.device import compute_dtypes, progress
from harness.core.precisions import of_dtype
from harness.core.zoo import ModelConfig
from harness.plan.calibration.file import InStep, StepProbe

if TYPE_CHECKING:
    from harness.plan.calibration.rates import Rates
    from harness.plan.compute import Compute

PROBES: dict[str, tuple[ModelConfig, int, int]] = {
    # name → (model, micro-batch, sequence): shapes none of the benches or scenarios use, chosen so each part leads
    # somewhere: per-op host overhead (tiny ops), matmuls (a wide block), elementwise work (many tokens, narrow),
    # the loss over a large vocabulary, and one between
    "host": (ModelConfig(d_model=48, n_layers=3, n_heads=2, ffn=128, vocab=256), 1, 64),
    "wide": (ModelConfig(d_model=448, n_layers=1, n_heads=7, ffn=1200, vocab=1024), 2, 128),
    "tokens": (ModelConfig(d_model=96, n_layers=1, n_heads=3, ffn=256, vocab=512), 4, 256),
    "vocab": (ModelConfig(d_model=96, n_layers=1, n_heads=3, ffn=256, vocab=12000), 2, 128),
    "mid": (ModelConfig(d_model=224, n_layers=2, n_heads=4, ffn=600, vocab=3000), 2, 192),
}
ROUNDS = 7
BOUNDS = (0.5, 3.0)
"""a factor outside this range says the probes measured something other than the rates (a stalled host)"""


def fit_in_step(probes: Sequence[StepProbe]) -> tuple[float, float, float]:
    """(kernels, elementwise, host) factors: bounded least squares of measured = k·kernels + e·elementwise + h·host
    over the probes, each row divided by its measured time (relative error), every factor in BOUNDS."""
    import numpy as np
    from scipy.optimize import lsq_linear

    a = np.array([[p.kernels_s, p.elementwise_s, p.host_s] for p in probes])
    a /= np.array([[p.measured_s] for p in probes])
    k, e, h = (float(x) for x in lsq_linear(a, np.ones(len(probes)), bounds=BOUNDS, method="bvls").x)
    return k, e, h


def plain_step_parts(cfg: ModelConfig, batch: int, seq: int, rates: Rates, precision: str) -> tuple[Compute, float]:
    """The time model's `Compute` of one plain forward and backward (one rank, no strategy, no checkpointing) in
    `precision`, and its per-op host overhead (s): what a probe step is priced at."""
    from harness.plan.compute import compute_of, host_per_op

    mode = "fp32" if precision == "fp32" else "lowp"  # the model itself in the 16-bit dtype (as FSDP/ZeRO run it)
    c = compute_of(
        cfg, mode=mode, precision=precision, batch=batch, seq_len=seq, policy="none", tp=1, sequence_parallel=False,
        rates=rates,
    )  # fmt: skip
    fwd_op, bwd_op = host_per_op(rates, precision)
    return c, c.ops_fwd * fwd_op + c.ops_bwd * bwd_op


def probe_step(cfg: ModelConfig, batch: int, seq: int, dtype: torch.dtype, device: torch.device) -> Callable[[], None]:
    """One forward + backward of the zoo Transformer in `dtype` (no optimizer; the gradients dropped after)."""
    from harness.worker.models import build_model, loss_fn

    torch.manual_seed(0)
    model = build_model(cfg, seed=0, device=device).to(dtype)
    tokens = torch.randint(0, cfg.vocab, (batch, seq), device=device)

    def step() -> None:
        loss_fn(model(tokens), tokens).backward()
        for p in model.parameters():
            p.grad = None

    return step


def time_probes(steps: dict[str, Callable[[], None]], *, rounds: int = ROUNDS) -> dict[str, float]:
    """Median seconds per probe step: three warm-up steps each, then `rounds` rounds stepping the probes in
    alternation, so a change in the machine's load hits all alike."""
    for step in steps.values():
        for _ in range(3):
            step()
    times: dict[str, list[float]] = {p: [] for p in steps}
    for _ in range(rounds):
        for probe, step in steps.items():
            t0 = time.perf_counter()
            step()
            times[probe].append(time.perf_counter() - t0)
    return {p: statistics.median(ts) for p, ts in times.items()}


def measure_in_step(rates: Rates, device: torch.device) -> dict[str, InStep]:
    """The factors per compute dtype, from the probes measured and priced at `rates` (this calibration's device
    figures, factors at 1); {} off CPU."""
    if device.type != "cpu":
        return {}
    out: dict[str, InStep] = {}
    for name in compute_dtypes(device):
        precision = of_dtype(name)
        steps = {p: probe_step(cfg, b, s, getattr(torch, name), device) for p, (cfg, b, s) in PROBES.items()}
        measured = time_probes(steps)
        steps.clear()
        probes = []
        for probe, (cfg, batch, seq) in PROBES.items():
            c, host = plain_step_parts(cfg, batch, seq, rates, precision)
            probes.append(
                StepProbe(
                    probe=probe,
                    model={k: v for k, v in dataclasses.asdict(cfg).items() if type(v) is int},
                    batch=batch,
                    seq=seq,
                    measured_s=measured[probe],
                    predicted_s=c.total + host,
                    kernels_s=c.total - c.elementwise,
                    elementwise_s=c.elementwise,
                    host_s=host,
                )
            )
        k, e, h = fit_in_step(probes)
        out[name] = InStep(kernels=k, elementwise=e, host=h, probes=probes)
        before = ", ".join(f"{p.probe} {100 * (p.predicted_s / p.measured_s - 1):+.0f}%" for p in probes)
        after = ", ".join(
            f"{p.probe} {100 * ((k * p.kernels_s + e * p.elementwise_s + h * p.host_s) / p.measured_s - 1):+.0f}%"
            for p in probes
        )
        progress(
            f"in-step {name}: kernels {k:.2f}x, elementwise {e:.2f}x, per-op {h:.2f}x the isolated rates "
            f"(probes priced {before}; fitted {after})"
        )
    return out
