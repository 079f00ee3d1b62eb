"""What the collective meter (harness.worker.meters.comm) costs: harness step time with the meter on vs off.

The worker no longer runs the meter in a timed step: it counts (and times each collective) over one extra
step after the timed ones, so the timed steps carry none of this cost by construction. What this script measures is what
counting *inside* timed steps costs — the reason for that design (fsdp.full_shard on CPU: 1.057, over the
3% target) and the cost a user pays if they move it back.

"On" is the meter installed and counting without timing: a kernel at the Autograd key of every c10d op
appends one tuple per collective. "Off" is the meter uninstalled, the
dispatcher's plain path. Both run in the same processes on the same trainer, alternating step by step
(install / uninstall between steps, outside the timed region; the order flips every round, on-off-off-on,
so drift hits both alike). Printed per strategy: the medians, their ratio (target <= 1.03 on CPU), and the
paired estimate — the median over rounds of (on - off) — with a bootstrap interval.

On a busy machine step-time noise can exceed the meter's cost (on a 2-core box shared with other jobs the
interval was about ±3%), so the script first measures the cost per collective directly — a tight loop of
small all_reduce calls on the process group with the meter off, installed but idle, and counting — and
prints, per strategy, the overhead that cost implies: calls per step × (counting - off) / step time.
Prints figures; asserts nothing.

World 2 on CPU by default: the meter's cost is per collective call, and only a real group issues every
collective of the strategy (at world 1 FSDP falls back to NO_SHARD and ZeRO-3 gathers nothing), so the
script launches itself once per rank (gloo, one thread each, like the `local` cluster profile). On a GPU,
world 1 is one process, NCCL:

    .venv/bin/python bench/bench_comm_meter.py                      # CPU, world 2, tiny, fp32
    .venv/bin/python bench/bench_comm_meter.py --device cuda --world 1 --model 1.3b --precision bf16 \\
        --micro-batch 4 --seq-len 2048
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from harness.core.ports import free_port  # noqa: E402 - after the path of this checkout


def launch(argv: list[str], world: int) -> int:
    """Run this script once per rank (torchrun-style environment); rank 0 prints."""
    env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()), WORLD_SIZE=str(world))
    env.setdefault("OMP_NUM_THREADS", "1")  # ranks share the cores
    procs = [
        subprocess.Popen(
            [sys.executable, __file__, *argv, "--rank", str(r)], env=dict(env, RANK=str(r), LOCAL_RANK=str(r))
        )
        for r in range(world)
    ]
    return max(p.wait() for p in procs)


def bootstrap_median_ci(xs: list[float], *, n: int = 1000, seed: int = 0) -> tuple[float, float]:
    """95% bootstrap interval of the median of `xs`."""
    rng = random.Random(seed)
    meds = sorted(statistics.median(rng.choices(xs, k=len(xs))) for _ in range(n))
    return meds[int(0.025 * n)], meds[int(0.975 * n) - 1]


def per_call_cost_us(device, *, calls: int = 2000, rounds: int = 7) -> dict[str, float]:
    """Median µs per all_reduce of 1024 floats on a one-rank group (the dispatcher path of any collective,
    without a peer's latency in the loop): meter off, installed but not counting, counting."""
    import torch
    import torch.distributed as dist

    from harness.worker.meters.comm import CommMeter
    from harness.worker.meters.timing import synchronize

    t = torch.ones(1024, device=device)
    world, rank = dist.get_world_size(), dist.get_rank()
    own = None
    for r in range(world):  # every rank takes part in creating every group
        g = dist.new_group([r])
        own = g if r == rank else own

    def loop() -> float:
        synchronize(device)
        t0 = time.perf_counter()
        for _ in range(calls):
            dist.all_reduce(t, group=own)
        synchronize(device)
        return (time.perf_counter() - t0) / calls * 1e6

    out: dict[str, list[float]] = {"off": [], "idle": [], "counting": []}
    loop()
    for _ in range(rounds):
        out["off"].append(loop())
        meter = CommMeter().install()
        out["idle"].append(loop())
        with meter.measure():
            out["counting"].append(loop())
        meter.uninstall()
    return {k: statistics.median(v) for k, v in out.items()}


def block(trainer, batches, *, steps: int, device, meter_on: bool):
    """Time `steps` harness steps; with the meter on, it is installed for the block and counts every call."""
    from harness.worker.meters.comm import CommMeter
    from harness.worker.meters.timing import time_steps

    meter = CommMeter().install() if meter_on else None
    try:
        if meter is None:
            times, _ = time_steps(lambda: trainer.step(batches), n=steps, device=device)
            return times, None
        with meter.measure():
            times, _ = time_steps(lambda: trainer.step(batches), n=steps, device=device)
        return times, len(meter.events) / steps
    finally:
        if meter is not None:
            meter.uninstall()


def rank_main(args) -> None:
    import torch
    import torch.distributed as dist

    from harness.scenario.schema import parse_scenario
    from harness.worker.meters.timing import synchronize
    from harness.worker.models import synthetic_batch
    from harness.worker.strategies import family
    from harness.worker.strategies.base import Topology

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    if "OMP_NUM_THREADS" in os.environ:
        torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))
    device = torch.device("cuda", rank) if args.device == "cuda" else torch.device("cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    dist.init_process_group(
        "nccl" if device.type == "cuda" else "gloo",
        rank=rank,
        world_size=world,
        device_id=device if device.type == "cuda" else None,
    )
    topo = Topology(rank=rank, world_size=world, local_rank=rank, gpus_per_node=world, device=device)
    cost = per_call_cost_us(device)
    if rank == 0:
        name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
        print(
            f"device {device} ({name}), world {world}, torch {torch.__version__}, model {args.model}, "
            f"{args.precision}, micro-batch {args.micro_batch}, seq {args.seq_len}; {args.rounds} rounds x "
            f"{args.steps} steps each side, meter on/off alternating"
        )
        print(
            f"per all_reduce (1024 floats, one-rank group): meter off {cost['off']:.1f} us, installed idle "
            f"{cost['idle']:.1f} us, counting {cost['counting']:.1f} us -> "
            f"{cost['counting'] - cost['off']:.1f} us per collective"
        )
        print(
            f"{'strategy':18s} {'calls/step':>10s} {'off ms':>9s} {'on ms':>9s} {'ratio':>7s} {'paired':>7s} "
            f"{'95% interval':>16s} {'from cost/call':>14s}"
        )
        print(
            "  (medians of every timed step, a step's time its slowest rank's; paired = 1 + median over rounds of "
            "(on - off) / off median, with its bootstrap interval; from cost/call = 1 + calls x per-collective "
            "cost / off median)"
        )
    for strategy in args.strategy:
        doc = {
            "name": "bench",
            "matrix": {"model": [args.model], "strategy": [strategy], "precision": [args.precision], "gpus": [world]},
            "settings": {"micro_batch": args.micro_batch, "seq_len": args.seq_len},
        }
        (spec,) = parse_scenario(doc, "bench").expand(gpus_per_node=world)
        torch.manual_seed(0)
        trainer = family(strategy).setup(spec, topo=topo)
        batches = [
            synthetic_batch(
                spec.model_config, seed=0, rank=rank, micro_batch=args.micro_batch, seq_len=args.seq_len, device=device
            )
        ]
        for _ in range(args.warmup):
            trainer.step(batches)
        synchronize(device)
        dist.barrier()
        rounds, calls = [], 0.0  # per round: (on block's step times, off block's step times)
        for r in range(args.rounds):
            order = (True, False) if r % 2 == 0 else (False, True)
            got = {}
            for meter_on in order:
                times, c = block(trainer, batches, steps=args.steps, device=device, meter_on=meter_on)
                got[meter_on] = times
                calls = c if c is not None else calls
            rounds.append((got[True], got[False]))
        # a step ends when its slowest rank ends: MAX over ranks, after all timing (meter uninstalled)
        t = torch.tensor(rounds, dtype=torch.float64, device=device)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        if rank == 0:
            t = t.cpu()
            on, off = t[:, 0].flatten().tolist(), t[:, 1].flatten().tolist()
            m_on, m_off = statistics.median(on), statistics.median(off)
            diffs = (t[:, 0].mean(1) - t[:, 1].mean(1)).tolist()
            paired = statistics.median(diffs)
            lo, hi = bootstrap_median_ci(diffs)
            implied = 1 + calls * (cost["counting"] - cost["off"]) * 1e-6 / m_off
            print(
                f"{strategy:18s} {calls:10.0f} {m_off * 1e3:9.2f} {m_on * 1e3:9.2f} {m_on / m_off:7.3f} "
                f"{1 + paired / m_off:7.3f} [{1 + lo / m_off:.3f}, {1 + hi / m_off:.3f}] {implied:14.3f}",
                flush=True,
            )
        del trainer
        if device.type == "cuda":
            torch.cuda.empty_cache()
        dist.barrier()
    dist.destroy_process_group()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--strategy", nargs="+", default=["ddp", "fsdp.full_shard", "zero3"])
    ap.add_argument("--model", default="tiny")
    ap.add_argument("--precision", default="fp32", choices=["fp32", "bf16", "fp16"])
    ap.add_argument("--micro-batch", type=int, default=2)
    ap.add_argument("--seq-len", type=int, default=64)
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("--world", type=int, default=None, help="ranks (default: 2 on cpu, 1 on cuda)")
    ap.add_argument("--rounds", type=int, default=600, help="alternations of (meter on, meter off) blocks")
    ap.add_argument("--steps", type=int, default=1, help="timed steps per block")
    ap.add_argument("--warmup", type=int, default=5, help="steps before timing (DDP rebuilds buckets at step 2)")
    ap.add_argument("--rank", type=int, default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.rank is not None or "RANK" in os.environ:
        rank_main(args)
        return 0
    world = args.world or (1 if args.device == "cuda" else 2)
    if world == 1:
        os.environ.update(
            MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()), RANK="0", WORLD_SIZE="1", LOCAL_RANK="0"
        )
        rank_main(args)
        return 0
    t0 = time.time()
    rc = launch(sys.argv[1:], world)
    print(f"({time.time() - t0:.0f} s)")
    return rc


if __name__ == "__main__":
    sys.exit(main())
