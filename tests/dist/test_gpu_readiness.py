"""GPU paths of issue 32 that a gloo group can show (one 2-rank launch for all). fp16 under FSDP1 and FSDP2: when one rank's gradient shard overflows, every rank skips the step and backs off to
the same scale (harness.worker.strategies.base.TorchTrainer.optimizer_step unscales before stepping).

Real gloo groups, the real strategy setup (fsdp.full_shard and fsdp2.full_shard, fp16, the tiny model, 2 ranks), with
the optimizer a CUDA rank gets (adamw_kwargs("cuda"); until issue 32 that was fused=True, and CPU has the fused kernel
too, so this test ran CUDA's path and failed: a fused step checks this rank's shard alone, and ShardedGradScaler
all-reduces the verdict only inside unscale_). One 2-rank launch serves both strategies: step 1 clean, step 2 with an inf written into rank
1's local gradient shard after the backward (the overflow of one rank's shard), step 3 clean again. The same group then checks that the allocator's retries are the maximum over ranks, and that the
timed comm meter leaves ops inside a coalescing block untimed.
"""

from __future__ import annotations

import json
import os

import pytest

from tests.dist.conftest import spawn_ranks

pytestmark = pytest.mark.dist

STRATEGIES = ("fsdp.full_shard", "fsdp2.full_shard")


def _local(t):
    from torch.distributed.tensor import DTensor

    return t.to_local() if isinstance(t, DTensor) else t


def _run_rank(rank: int, port: int, out: str) -> None:
    import torch
    import torch.distributed as dist

    from harness.worker.models import synthetic_batch
    from harness.worker.strategies import family
    from harness.worker.strategies.base import Topology, adamw_kwargs
    from harness.worker.teardown import end_process_group
    from tests.conftest import make_spec

    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    got: dict = {}
    for strategy in STRATEGIES:
        spec = make_spec(strategy=strategy, precision="fp16", gpus=2)
        topo = Topology(rank=rank, world_size=2, local_rank=rank, gpus_per_node=2, device=torch.device("cpu"))
        trainer = family(strategy).setup(spec, topo=topo)
        # NOTE: the optimizer a CUDA rank of this cell gets (adamw_kwargs for "cuda"), built on CPU
        params = [p for g in trainer.optimizer.param_groups for p in g["params"]]
        trainer.optimizer = torch.optim.AdamW(params, lr=spec.settings.lr, **adamw_kwargs("cuda", sharded_scaler=True))
        s = spec.settings
        batch = [synthetic_batch(spec.model_config, seed=s.seed, rank=rank, micro_batch=s.micro_batch,
                                 seq_len=s.seq_len)]  # fmt: skip
        step_optimizer = trainer.optimizer_step

        def overflow_then_step(rank=rank, params=params, step_optimizer=step_optimizer):
            if rank == 1:  # the overflow: one element of rank 1's own shard
                grad = next(_local(p.grad) for p in params if p.grad is not None and _local(p.grad).numel())
                grad.view(-1)[0] = float("inf")
            step_optimizer()

        rows = []
        for step in (1, 2, 3):
            before = [_local(p).detach().clone() for p in params]
            if step == 2:
                trainer.optimizer_step = overflow_then_step
            trainer.step(batch)
            trainer.optimizer_step = step_optimizer
            changed = sum(int(not torch.equal(b, _local(p).detach())) for b, p in zip(before, params))
            rows.append({"scale": float(trainer.scaler.get_scale()), "params_changed": changed,
                         "params": len(params)})  # fmt: skip
        got[strategy] = rows
    # the same group: the worker's aggregation over ranks, given this rank's memory meter readings as CUDA would
    # give them (NOTE: the readings are made up, no GPU here): rank 1 alone retried cudaMalloc 3 times
    from harness.worker.runner import _aggregate_over_ranks, _Timed

    mem = {"peak_memory_allocated_gib": 1.0 + rank, "peak_memory_reserved_gib": None,
           "alloc_retries": 3 if rank == 1 else 0, "null_reasons": {}}  # fmt: skip
    timed = _Timed(times=[0.1], losses=[torch.tensor(1.0)], mem=mem, dynamo_warm={"frames": 0}, dynamo={"frames": 0})
    over = _aggregate_over_ranks([torch.tensor(1.0)], timed=timed, world_size=2, device=torch.device("cpu"))
    got["peaks"] = over.peaks.tolist()
    # the same group: the timed comm meter inside a non-fast-path _coalescing_manager block, entered as torch's manager
    # enters it (NOTE: gloo cannot start coalescing, "Backend gloo does not implement startCoalescing"; NCCL queues the
    # block's ops and launches them at _end_coalescing): counted, not timed; outside the block, timed
    from torch.distributed.distributed_c10d import _world

    from harness.worker.meters.comm import CommMeter

    meter = CommMeter(timed=True, device=torch.device("cpu")).install()
    t = torch.ones(4)
    with meter.measure():
        _world.pg_coalesce_state[dist.group.WORLD] = []
        try:
            dist.broadcast(t, 0)
        finally:
            _world.pg_coalesce_state.pop(dist.group.WORLD)
        dist.broadcast(t, 0)
    meter.uninstall()
    got["coalesced"] = [(coll, nbytes, seconds is not None) for coll, _, nbytes, _, seconds in meter.events]
    with open(f"{out}.rank{rank}.json", "w") as f:
        json.dump(got, f)
    end_process_group()


@pytest.fixture(scope="module")
def steps(tmp_path_factory) -> list[dict]:
    return spawn_ranks(_run_rank, nprocs=2, out=tmp_path_factory.mktemp("fp16") / "steps")


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_an_overflow_in_one_ranks_shard_makes_every_rank_skip_and_back_off_alike(strategy, steps):
    rank0, rank1 = (s[strategy] for s in steps)
    init = 2.0**16  # GradScaler's init_scale; growth only after 2000 clean steps
    # step 1: clean, every rank steps (every parameter it holds a shard of changes)
    # step 2: rank 1's shard overflowed: every rank skips (no parameter changes) and halves its scale
    # step 3: clean again, every rank steps at the halved scale
    for r, rows in enumerate((rank0, rank1)):
        assert [row["scale"] for row in rows] == [init, init / 2, init / 2], f"rank {r}"
        assert rows[1]["params_changed"] == 0, f"rank {r} stepped on an overflow"
        assert rows[0]["params_changed"] > 0 and rows[2]["params_changed"] > 0, f"rank {r}"
    assert [row["scale"] for row in rank0] == [row["scale"] for row in rank1]


def test_allocator_retries_are_the_maximum_over_ranks(steps):
    """[peak allocated GiB, peak reserved GiB (-1: null), frames compiled, alloc retries]: rank 1's 3 retries, on
    every rank (metrics.alloc_retries was rank 0's 0 before issue 32)."""
    assert steps[0]["peaks"] == steps[1]["peaks"] == [2.0, -1.0, 0.0, 3.0]


def test_ops_in_a_coalescing_block_are_counted_but_not_timed_alone(steps):
    """(collective, bytes, timed) of a broadcast inside the block, then one outside it; before issue 32 the one inside
    was timed alone (its queueing, ~0 s on NCCL: an absurd bandwidth)."""
    for s in steps:
        assert s["coalesced"] == [["broadcast", 16, False], ["broadcast", 16, True]]
