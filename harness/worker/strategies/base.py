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
from typing import Protocol

import torch
import torch.distributed as dist

from harness.core.catalogue import CATALOGUE, HYBRID
from harness.worker.models import loss_fn

Batch = tuple[torch.Tensor, torch.Tensor]


@dataclass
class Topology:
    """Where this rank sits: process-group facts the strategies need."""

    rank: int
    world_size: int
    local_rank: int
    gpus_per_node: int
    device: torch.device

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
        if self.scaler is not None:
            self.scaler.step(self.optimizer)
            self.scaler.update()
        else:
            self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        assert total is not None, "a step has at least one micro-batch"
        return total


def adamw(params, *, lr: float, device: torch.device) -> torch.optim.Optimizer:
    """AdamW with the fastest honest implementation the device has (fused on CUDA, foreach elsewhere)."""
    fused = device.type == "cuda"
    return torch.optim.AdamW(params, lr=lr, fused=fused, foreach=None if fused else True)


def barrier() -> None:
    if dist.is_initialized():
        dist.barrier()
