"""The one interface every strategy family implements, and the training step they share.

`setup(spec, *, topo) -> Trainer`: the family builds the model the way it must (meta device, per-unit
materialisation, deepspeed.zero.Init, ...), wraps it, and returns a Trainer whose `step(micro_batches)`
does forward, backward (with the family's loss scaling), the optimizer step and zero-grad. The worker
times `step` and nothing else, so every family is measured the same way.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import torch
import torch.distributed as dist

from harness.core.catalogue import CATALOGUE, HYBRID
from harness.worker.models import blocks_of, loss_fn

Batch = tuple[torch.Tensor, torch.Tensor]


@dataclass
class Topology:
    """Where this rank sits: process-group facts the strategies need."""

    rank: int
    world_size: int
    local_rank: int
    gpus_per_node: int
    device: torch.device
    scratch: Path | None = None
    """a folder of this run's own for temporary files (an `offload: nvme` cell's swap files): made by whoever writes
    there, removed by the runner after the run; None outside a run (calibration)"""

    @property
    def nodes(self) -> int:
        return self.world_size // self.gpus_per_node

    @property
    def device_type(self) -> str:
        return self.device.type

    def mesh_for(self, strategy: str):
        """The mesh `strategy` runs on: its catalogue entry's `mesh` (flat or hybrid)."""
        return self.mesh(hybrid=CATALOGUE[strategy].mesh == HYBRID)

    def mesh(self, hybrid: bool):
        """1-D mesh over all ranks, or the 2-D (replicate across nodes, shard within a node) mesh for hybrids.

        Ranks are node-major (rank = node * gpus_per_node + local), as SLURM and torchrun number them.
        """
        from torch.distributed.device_mesh import init_device_mesh

        if hybrid:
            return init_device_mesh(
                self.device_type, (self.nodes, self.gpus_per_node), mesh_dim_names=("replicate", "shard")
            )
        return init_device_mesh(self.device_type, (self.world_size,), mesh_dim_names=("shard",))


class Trainer(Protocol):
    model: torch.nn.Module

    def step(self, micro_batches: Sequence[Batch]) -> torch.Tensor:
        """One optimizer step over `micro_batches` (gradient accumulation); returns the mean loss, detached."""


class TorchTrainer:
    """The step for families driven by a torch optimizer: DDP, FSDP1, FSDP2."""

    def __init__(
        self,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer,
        *,
        autocast: Callable[[], contextlib.AbstractContextManager] = contextlib.nullcontext,
        scaler=None,
        no_sync: Callable[[], contextlib.AbstractContextManager] | None = None,
    ):
        self.model, self.optimizer, self.scaler = model, optimizer, scaler
        self._autocast, self._no_sync = autocast, no_sync

    def step(self, micro_batches: Sequence[Batch]) -> torch.Tensor:
        n = len(micro_batches)
        total = None
        for i, (x, y) in enumerate(micro_batches):
            sync = i == n - 1 or self._no_sync is None
            with contextlib.nullcontext() if sync or self._no_sync is None else self._no_sync():
                with self._autocast():
                    loss = loss_fn(self.model(x), y) / n
                (self.scaler.scale(loss) if self.scaler is not None else loss).backward()
            total = loss.detach() if total is None else total + loss.detach()
        self.optimizer_step()
        assert total is not None, "a step has at least one micro-batch"
        return total

    def optimizer_step(self) -> None:
        """The optimizer step after the last backward (`scaled_step`), then zero the gradients."""
        scaled_step(self.optimizer, self.scaler)
        self.optimizer.zero_grad(set_to_none=True)


def scaled_step(optimizer: torch.optim.Optimizer, scaler: Any) -> None:
    """A torch optimizer's step: with a loss scaler, unscale, then step (skipped when any rank's gradients hold an inf
    or NaN), then update the scale; without one, the step."""
    if scaler is None:
        optimizer.step()
        return
    # NOTE: unscale_ before step, on every device: ShardedGradScaler all-reduces found_inf over the ranks only inside
    # unscale_. A fused optimizer's step without it (GradScaler.step's _check_inf_per_device path) looks at this
    # rank's shard alone: a rank whose shard overflowed skipped the step and halved its scale while the others
    # stepped. After unscale_, step skips on the reduced verdict (adamw_kwargs: not fused).
    scaler.unscale_(optimizer)
    scaler.step(optimizer)
    scaler.update()


def adamw_kwargs(device_type: str, *, sharded_scaler: bool = False) -> dict[str, Any]:
    """How AdamW runs on `device_type`: the fastest honest implementation (fused on CUDA, foreach elsewhere), but
    foreach wherever a ShardedGradScaler drives the step (fp16 under FSDP1/FSDP2).

    Why not fused there: ShardedGradScaler agrees on an overflow across ranks only inside `unscale_`, and its
    verdict is a shape-(1,) tensor; a fused step given that verdict fails subtracting it from its shape-() step
    counters ("output with shape [] doesn't match the broadcast shape [1]", torch 2.13), and a fused step without
    `unscale_` first checks this rank's shard alone, so ranks disagreed about skipping (issue 32)."""
    fused = device_type == "cuda" and not sharded_scaler
    return {"fused": fused, "foreach": None if fused else True}


def adamw(params, *, lr: float, device: torch.device, sharded_scaler: bool = False) -> torch.optim.Optimizer:
    """AdamW as adamw_kwargs chooses for the device (`sharded_scaler`: a ShardedGradScaler drives its step)."""
    return torch.optim.AdamW(params, lr=lr, **adamw_kwargs(device.type, sharded_scaler=sharded_scaler))


def barrier() -> None:
    if dist.is_initialized():
        dist.barrier()


# --------------------------------------------------------------------------------------------------
# wrap units of several blocks (the `wrap_blocks` setting)


class BlockGroup(torch.nn.Module):
    """Consecutive blocks run one after another: the module FSDP1 wraps as one unit of `wrap_blocks` blocks (FSDP1
    hooks a module's own forward, so a group must be a module the model calls). Its parameters keep the blocks'
    order, so the group's flat parameter holds them as the planner lists them (harness.plan.wrap)."""

    def __init__(self, blocks: Sequence[torch.nn.Module]):
        super().__init__()
        self.members = torch.nn.ModuleList(blocks)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.members:
            x = block(x)
        return x


def block_groups(n_blocks: int, wrap_blocks: int) -> list[range]:
    """The block indices of each wrap unit: `wrap_blocks` consecutive blocks each (the last may hold fewer); no unit
    for wrap_blocks 0 (the whole model is the root unit). The planner's grouping (harness.plan.wrap) is the same."""
    if wrap_blocks == 0:
        return []
    return [range(i, min(i + wrap_blocks, n_blocks)) for i in range(0, n_blocks, wrap_blocks)]


def group_blocks(model: torch.nn.Module, wrap_blocks: int) -> None:
    """Replace the model's blocks by `BlockGroup`s of `wrap_blocks` consecutive blocks (wrap_blocks > 1): the model's
    forward runs its `blocks` in order, so it runs the same blocks in the same order. wrap_blocks 0 and 1 leave the
    blocks as they are."""
    if wrap_blocks <= 1:
        return
    blocks = blocks_of(model)
    model.blocks = torch.nn.ModuleList(
        BlockGroup([blocks[i] for i in r]) for r in block_groups(len(blocks), wrap_blocks)
    )
