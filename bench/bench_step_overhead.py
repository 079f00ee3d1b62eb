"""Harness-timed step vs a minimal hand-written training loop of the same model and strategy.

Both run in one process (world 1), alternating in blocks so drift and noise hit both alike; the ratio of
medians tells whether the harness's Trainer/timing adds cost a user's own loop would not have
(target <= 1.02). With `--compile on|both`, each strategy also runs compiled on both sides (the harness's
`compile: true` against the bare loop compiled in the same known-good order: the wrapped model for DDP and
FSDP1, each block for FSDP2 (before fully_shard) and ZeRO). Printed per row: both medians, the ratio, and
the harness's TFLOPS per GPU (model FLOPs, harness.plan.flops) and MFU against the device's dense peak
for the precision (harness.scenario.cluster.PEAKS; "n/a" where unknown, e.g. CPU), and on CUDA the host syncs one
step makes on each side (CUDA's sync debug mode; the timing fence is outside the step). Prints figures;
asserts nothing.

    python bench/bench_step_overhead.py --strategy ddp --model tiny
    python bench/bench_step_overhead.py --device cuda --model 1.3b --micro-batch 8 --seq-len 2048 \
        --precision bf16 --strategy ddp fsdp.full_shard fsdp2.full_shard zero1 zero3 --compile both
"""

from __future__ import annotations

import argparse
import gc
import os
import socket
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from harness.scenario.schema import parse_scenario  # noqa: E402
from harness.worker.meters.timing import synchronize, time_steps  # noqa: E402
from harness.worker.models import Block, build_model, synthetic_batch  # noqa: E402
from harness.worker.strategies import family  # noqa: E402
from harness.worker.strategies.base import Topology, adamw  # noqa: E402

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def bare_loop(strategy: str, spec, device: torch.device):
    """The loop a user would write by hand: library defaults, nothing from harness.worker.strategies but the optimizer
    (`base.adamw`: the implementation a tuned loop picks, fused on CUDA, foreach on CPU, where torch's default
    for FSDP2's DTensor parameters is the per-parameter loop that made the bare FSDP2 step twice the harness's)."""
    cfg, s = spec.model_config, spec.settings
    compiled = s.compile
    dtype = DTYPES[spec.precision]
    if strategy.startswith("zero"):
        import deepspeed

        conf = {
            "train_micro_batch_size_per_gpu": s.micro_batch,
            "zero_optimization": {"stage": int(strategy[-1])},
            "zero_allow_untested_optimizer": True,
        }
        if spec.precision == "bf16":
            conf["bf16"] = {"enabled": True}
        if strategy == "zero3":
            with deepspeed.zero.Init(config_dict_or_path=conf):
                model = build_model(cfg, seed=s.seed, device=device)
        else:
            model = build_model(cfg, seed=s.seed, device=device)
        if compiled:
            for b in model.blocks:
                b.compile()
        opt = adamw(model.parameters(), lr=s.lr, device=device)
        engine, *_ = deepspeed.initialize(model=model, optimizer=opt, config=conf)

        def step(x, y):
            loss = F.cross_entropy(engine(x).float().flatten(0, 1), y.flatten())
            engine.backward(loss)
            engine.step()
            return loss

        return step

    model = build_model(cfg, seed=s.seed, device=device)
    autocast = torch.autocast(device.type, dtype=dtype) if dtype != torch.float32 else None
    if strategy == "ddp":
        from torch.nn.parallel import DistributedDataParallel as DDP

        model = DDP(model, device_ids=[device.index] if device.type == "cuda" else None)
        if compiled:
            model = torch.compile(model)
    elif strategy.startswith("fsdp2"):
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

        mp = MixedPrecisionPolicy(param_dtype=dtype, reduce_dtype=torch.float32)
        for b in model.blocks:
            if compiled:
                b.compile()
            fully_shard(b, mp_policy=mp)
        fully_shard(model, mp_policy=mp)
        autocast = None
    elif strategy.startswith("fsdp"):
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
        from torch.distributed.fsdp import MixedPrecision
        from torch.distributed.fsdp.wrap import ModuleWrapPolicy

        mp = MixedPrecision(param_dtype=dtype, reduce_dtype=torch.float32) if dtype != torch.float32 else None
        model = FSDP(
            model,
            auto_wrap_policy=ModuleWrapPolicy({Block}),
            mixed_precision=mp,
            device_id=device,
            use_orig_params=True,
        )
        if compiled:
            model = torch.compile(model)
        autocast = None
    opt = adamw(model.parameters(), lr=s.lr, device=device)

    def step(x, y):
        if autocast is not None:
            with autocast:
                logits = model(x)
        else:
            logits = model(x)
        loss = F.cross_entropy(logits.float().flatten(0, 1), y.flatten())
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss

    return step


def bare_times(step, x, y, n: int, device: torch.device) -> list[float]:
    times = []
    synchronize(device)
    for _ in range(n):
        t0 = time.perf_counter()
        step(x, y)
        synchronize(device)
        times.append(time.perf_counter() - t0)
    return times


def host_syncs(fn) -> str:
    """Host synchronisations one call of fn makes, as CUDA's sync debug mode reports them (it catches
    cudaStreamSynchronize, blocking copies, .item(); not every sync, per torch's docs). "-" on CPU, where
    there is nothing to catch."""
    if not torch.cuda.is_available():
        return "-"
    import warnings

    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            torch.cuda.set_sync_debug_mode("warn")
            try:
                fn()
            finally:
                torch.cuda.set_sync_debug_mode("default")
        return str(sum("synchroniz" in str(w.message) for w in caught))
    except Exception as e:  # noqa: BLE001 - a figure the table can do without; the timing rows still print
        return f"err:{type(e).__name__}"


def measure(strategy: str, *, compiled: bool, args, topo, device: torch.device, peak, peak_key: str) -> str:
    """One row: the harness's step and the bare loop of `strategy`, alternating in blocks. Everything it builds is
    local to it, so it is freed when it returns (the lambdas and closures over a trainer once kept the previous
    strategy's model alive through the next one's setup)."""
    from harness.plan.flops import flops_per_step

    doc = {
        "name": "bench",
        "matrix": {"model": [args.model], "strategy": [strategy], "precision": [args.precision], "gpus": [1]},
        "settings": {"micro_batch": args.micro_batch, "seq_len": args.seq_len, "compile": compiled},
    }
    (spec,) = parse_scenario(doc, "bench").expand(gpus_per_node=1)
    trainer = family(strategy).setup(spec, topo=topo)
    bare = bare_loop(strategy, spec, device)
    x, y = synthetic_batch(
        spec.model_config, seed=0, rank=0, micro_batch=args.micro_batch, seq_len=args.seq_len, device=device
    )
    for _ in range(3):  # warmup both
        trainer.step([(x, y)])
        bare(x, y)
    h: list[float] = []
    b: list[float] = []

    def harness_step():
        trainer.step([(x, y)])

    def bare_step():
        bare(x, y)

    for r in range(args.rounds):
        blocks = [
            ("h", lambda: time_steps(harness_step, n=args.steps, device=device)[0]),
            ("b", lambda: bare_times(bare, x, y, args.steps, device)),
        ]
        for name, fn in blocks if r % 2 == 0 else blocks[::-1]:
            (h if name == "h" else b).extend(fn())
    syncs = f"{host_syncs(harness_step)}/{host_syncs(bare_step)}"
    mh, mb = statistics.median(h), statistics.median(b)
    tflops = flops_per_step(spec) / mh / 1e12
    mfu = f"{tflops / peak.tflops[peak_key]:6.1%}" if peak else f"{'n/a':>6s}"
    return (
        f"{strategy:18s} {'on' if compiled else 'off':>7s} {mh * 1e3:11.2f} {mb * 1e3:9.2f} {mh / mb:7.3f} "
        f"{tflops:8.2f} {mfu} {syncs:>9s}"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--strategy", nargs="+", default=["ddp", "fsdp.full_shard", "fsdp2.full_shard", "zero1", "zero3"])
    ap.add_argument("--model", default="tiny")
    ap.add_argument("--precision", default="fp32", choices=list(DTYPES))
    ap.add_argument("--micro-batch", type=int, default=4)
    ap.add_argument("--seq-len", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=10, help="alternations of (harness block, bare block)")
    ap.add_argument("--steps", type=int, default=5, help="timed steps per block")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--compile", choices=["off", "on", "both"], default="off")
    args = ap.parse_args()
    from harness.scenario.cluster import find_peak

    device = torch.device("cuda", 0) if args.device == "cuda" else torch.device("cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    with socket.socket() as sk:
        sk.bind(("127.0.0.1", 0))
        port = sk.getsockname()[1]
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK="0", WORLD_SIZE="1", LOCAL_RANK="0")
    dist.init_process_group("nccl" if device.type == "cuda" else "gloo", rank=0, world_size=1)
    topo = Topology(rank=0, world_size=1, local_rank=0, gpus_per_node=1, device=device)

    print(
        f"device {device} ({torch.cuda.get_device_name() if device.type == 'cuda' else 'cpu'}), torch "
        f"{torch.__version__}, model {args.model}, {args.precision}, micro-batch {args.micro_batch}, seq "
        f"{args.seq_len}; {args.rounds} rounds x {args.steps} steps each side, world 1"
    )
    peak = find_peak(torch.cuda.get_device_name()) if device.type == "cuda" else None
    peak_key = args.precision if args.precision != "fp32" else "fp32"
    print(f"dense peak: {f'{peak.tflops[peak_key]:g} TFLOPS ({peak_key})' if peak else 'unknown (MFU n/a)'}")
    print(
        f"{'strategy':18s} {'compile':>7s} {'harness ms':>11s} {'bare ms':>9s} {'ratio':>7s} {'TFLOPS':>8s} "
        f"{'MFU':>6s} {'syncs h/b':>9s}  (medians of all timed steps; TFLOPS and MFU of the harness's step; "
        "host syncs in one step, harness/bare)"
    )
    variants = {"off": [False], "on": [True], "both": [False, True]}[args.compile]
    for strategy, compiled in [(st, c) for st in args.strategy for c in variants]:
        print(measure(strategy, compiled=compiled, args=args, topo=topo, device=device, peak=peak, peak_key=peak_key),
              flush=True)  # fmt: skip
        # NOTE: measure() has returned, so its trainer, bare loop and the closures over them are gone before the next
        # setup: two 1.3b setups at once fit 141 GB, not 80 GB
        gc.collect()
        if device.type == "cuda":
            torch.cuda.empty_cache()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
