"""fp16 under tensor and pipeline parallelism (issue 49): an overflow in one rank's gradients skips the step on every
rank of the layout — its TP, PP and DP peers alike — and every rank backs off to the same scale.

One 4-rank gloo launch, the real strategy setups (the tiny model, fp16): DDP over tp 2 × dp 2, the distributed
optimizer (zero1) over tp 2 × pp 2, FSDP2 over pp 2 × dp 2. Each runs step 1 clean, step 2 with an inf written into
rank 3's gradients after its backward (rank 3 is a TP peer in the first two, the last pipeline stage in the last two,
a DP peer in the first and the last), step 3 clean. Each rank reports its scale and how many of its parameters the
step changed."""

from __future__ import annotations

import json
import os

import pytest

from tests.dist.conftest import spawn_ranks

pytestmark = pytest.mark.dist

CELLS = {
    "ddp tp2 x dp2": {"strategy": "ddp", "tp": 2},
    "zero1 tp2 x pp2": {"strategy": "zero1", "tp": 2, "pp": 2},
    "fsdp2 pp2 x dp2": {"strategy": "fsdp2.full_shard", "pp": 2},
}
POISONED_RANK = 3
WORLD = 4


def _local(t):
    from torch.distributed.tensor import DTensor

    return t.to_local() if isinstance(t, DTensor) else t


def _poison(trainer) -> None:
    """An inf in this rank's gradients, after the backward, before the step: the distributed optimizer's fp32
    main-gradient buffer, else the first local gradient."""
    opt = trainer.optimizer
    if hasattr(opt, "chunks"):
        opt.chunks[0].grad_buf[0] = float("inf")
        return
    grad = next(_local(p.grad) for p in trainer.model.parameters() if p.grad is not None and _local(p.grad).numel())
    grad.view(-1)[0] = float("inf")


def _run_rank(rank: int, port: int, out: str) -> None:
    import torch
    import torch.distributed as dist

    from harness.worker.models import synthetic_batch
    from harness.worker.strategies import family, layouts
    from harness.worker.strategies.base import Topology
    from harness.worker.teardown import end_process_group
    from tests.conftest import make_spec

    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=WORLD)
    step_fn = layouts.optimizer_step
    got: dict = {}
    for name, cell in CELLS.items():
        spec = make_spec(precision="fp16", gpus=WORLD, **cell)
        topo = Topology(rank=rank, world_size=WORLD, local_rank=rank % 2, gpus_per_node=2, device=torch.device("cpu"))
        trainer = family(spec.strategy).setup(spec, topo=topo)
        s, lay = spec.settings, spec.layout
        batch = [synthetic_batch(spec.model_config, seed=s.seed, rank=lay.dp_rank(rank), micro_batch=s.micro_batch,
                                 seq_len=s.seq_len)]  # fmt: skip
        scaler = trainer.scaler
        params = list(trainer.model.parameters())

        def poisoned(optimizer, scaler, trainer=trainer):
            if rank == POISONED_RANK:
                _poison(trainer)
            step_fn(optimizer, scaler)

        rows = []
        for step in (1, 2, 3):
            before = [_local(p).detach().clone() for p in params]
            layouts.optimizer_step = poisoned if step == 2 else step_fn
            trainer.step(batch)
            layouts.optimizer_step = step_fn
            changed = sum(int(not torch.equal(b, _local(p).detach())) for b, p in zip(before, params))
            rows.append({"scale": float(scaler.get_scale()), "changed": changed, "params": len(params)})
        got[name] = rows
        dist.barrier()
    with open(f"{out}.rank{rank}.json", "w") as f:
        json.dump(got, f)
    end_process_group()


@pytest.fixture(scope="module")
def steps(tmp_path_factory) -> list[dict]:
    return spawn_ranks(_run_rank, nprocs=WORLD, out=tmp_path_factory.mktemp("fp16") / "steps")


@pytest.mark.parametrize("cell", list(CELLS))
def test_an_overflow_on_one_rank_skips_the_step_on_every_rank(cell, steps):
    init = 2.0**16  # GradScaler's init_scale; growth only after 2000 clean steps
    for rank, got in enumerate(steps):
        rows = got[cell]
        assert [row["scale"] for row in rows] == [init, init / 2, init / 2], f"rank {rank}"
        assert rows[0]["changed"] == rows[0]["params"] > 0, f"rank {rank}: the clean step changed every parameter"
        assert rows[1]["changed"] == 0, f"rank {rank} stepped on rank {POISONED_RANK}'s overflow"
        assert rows[2]["changed"] == rows[2]["params"], f"rank {rank}: the clean step after it"
