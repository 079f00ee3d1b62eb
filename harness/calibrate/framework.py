"""Each strategy family's framework overhead for `harness calibrate`: the host work a strategy does per step
beyond what the time model prices (hooks, flattening, an engine's bookkeeping), measured at one rank with the real
strategy, net of the time model's own prediction at this calibration's rates (harness.calibrate.process's `compute`
role, after the device's rates are known).
"""

from __future__ import annotations

import functools
import statistics
from collections.abc import Mapping
from pathlib import Path

import torch

from harness.calibrate.device import compute_dtypes, progress
from harness.core.precisions import of_dtype
from harness.core.zoo import ModelConfig
from harness.plan.calibration.file import FRAMEWORK_STRATEGIES, Calibration, FrameworkCost
from harness.scenario.cluster import Cluster

SEQ = 64
"""tokens per sequence of the calibration's models: every GEMM of theirs lies inside the calibrated grid"""


def framework_models(*, quick: bool) -> dict[str, ModelConfig]:
    """The three models each strategy steps: one and three blocks of d_model 64, and one wide block with many
    parameters (d_model 512, a 4096-token vocabulary: 7.4M parameters, 60x the first, so the per-parameter term is
    measured at the sizes it is used at, out of the caches, instead of extrapolated from a tiny model; `quick`: d_model
    256, vocabulary 512, 1.0M)."""
    # NOTE: the wide model used to be d_model 256 and vocab 512 (1.0M parameters): the per-parameter term, measured
    # over 0.9M parameters, moved 2-3x between calibrations (zero3 fp32: 16.1 and 6.6 ns), and a 12M-parameter
    # model's step with it by 130 ms
    wide = (
        ModelConfig(d_model=256, n_layers=1, n_heads=4, ffn=688, vocab=512)
        if quick
        else ModelConfig(d_model=512, n_layers=1, n_heads=8, ffn=1376, vocab=4096)
    )
    return {
        "one": ModelConfig(d_model=64, n_layers=1, n_heads=4, ffn=176, vocab=512),
        "three": ModelConfig(d_model=64, n_layers=3, n_heads=4, ffn=176, vocab=512),
        "wide": wide,
    }


def solve_framework_cost(
    times: Mapping[str, list[float]], *, predicted: Mapping[str, float], n_params: Mapping[str, int]
) -> FrameworkCost:
    """The three terms from each model's step times (s, paired by round: the models stepped in alternation) minus
    its prediction without framework overhead: per element from the wide model's excess over the one-block model's,
    per block from the three-block model's (net of its extra elements, over its two extra blocks), the rest per step;
    each the median of the paired differences, at least 0."""
    resid = {name: [t - predicted[name] for t in ts] for name, ts in times.items()}
    d_wide = statistics.median(w - o for o, w in zip(resid["one"], resid["wide"]))
    d_three = statistics.median(t - o for o, t in zip(resid["one"], resid["three"]))
    per_element = max(0.0, d_wide / (n_params["wide"] - n_params["one"]))
    per_block = max(0.0, (d_three - per_element * (n_params["three"] - n_params["one"])) / 2)
    fixed = max(0.0, statistics.median(resid["one"]) - per_block - per_element * n_params["one"])
    return FrameworkCost(
        fixed_s=fixed,
        per_block_s=per_block,
        per_element_s=per_element,
        measured_s={name: statistics.median(ts) for name, ts in times.items()},
        predicted_s=dict(predicted),
    )


def measure_framework(
    cluster: Cluster, part: Calibration, device: torch.device, *, quick: bool
) -> dict[str, FrameworkCost]:
    """Per-step, per-block and per-parameter overhead of each strategy family beyond what the time model prices: the
    real strategy on a one-rank group steps the three `framework_models` in alternation; each step's time minus the
    model's prediction with the framework term at zero, solved for the three terms (`solve_framework_cost`).
    `part`: the device's rates measured so far (the file without its framework figures)."""
    from harness.plan.calibration.find import Found
    from harness.plan.calibration.rates import CalibratedRates
    from harness.plan.time import predict_time
    from harness.scenario.spec import RunSpec, Settings
    from harness.worker.meters.timing import time_steps
    from harness.worker.runner import build_trainer

    precisions = [of_dtype(d) for d in compute_dtypes(device)]
    zero = {f"{s}/{p}": FrameworkCost(fixed_s=0.0, per_block_s=0.0) for s in FRAMEWORK_STRATEGIES for p in precisions}
    unpriced = part.model_copy(update={"compute": part.compute.model_copy(update={"framework": zero})})
    rates = CalibratedRates(Found(Path("(this calibration)"), unpriced, None))
    models = framework_models(quick=quick)
    n_params = {name: cfg.n_params() for name, cfg in models.items()}
    out: dict[str, FrameworkCost] = {}
    for strategy in FRAMEWORK_STRATEGIES:
        for prec in precisions:
            steps, predicted = {}, {}
            for name, cfg in models.items():
                spec = RunSpec(
                    model=f"calibrate-{name}",
                    model_config=cfg,
                    strategy=strategy,
                    precision=prec,
                    gpus=1,
                    nodes=1,
                    gpus_per_node=1,
                    settings=Settings(micro_batch=1, seq_len=SEQ),
                )
                if spec.unsupported_reason(device.type):
                    break
                trainer, batches = build_trainer(spec, rank=0, world_size=1, local_rank=0, device=device)
                steps[name] = functools.partial(trainer.step, batches)
                time_steps(steps[name], n=3, device=device)
                predicted[name] = predict_time(spec, cluster, rates, overlap=False).step_time_s or 0.0
            if len(steps) < len(models):
                continue
            # NOTE: the models step in alternation, so a change in the machine's load hits all alike
            times: dict[str, list[float]] = {name: [] for name in models}
            for _ in range(4 if quick else 8):
                for name in models:
                    times[name] += time_steps(steps[name], n=1, device=device)[0]
            steps.clear()
            cost = out[f"{strategy}/{prec}"] = solve_framework_cost(times, predicted=predicted, n_params=n_params)
            progress(
                f"framework {strategy} {prec}: {cost.fixed_s * 1e3:.2f} ms/step + {cost.per_block_s * 1e3:.2f} "
                f"ms/block + {cost.per_element_s * 1e9:.2f} ns/parameter"
            )
    return out
