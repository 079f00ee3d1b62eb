"""DDP: full replica per rank, one all_reduce of all gradients per step (in 25 MB buckets)."""

from __future__ import annotations

from typing import cast

import torch
from torch.nn.parallel import DistributedDataParallel as DDP

from harness.core.constants import DDP_BUCKET_CAP_MB
from harness.scenario.schema import RunSpec
from harness.worker.models import apply_activation_checkpointing, build_model
from harness.worker.precision import policy
from harness.worker.strategies.base import Topology, TorchTrainer, adamw


def setup(spec: RunSpec, *, topo: Topology) -> TorchTrainer:
    prec = policy(spec.precision)
    model = build_model(spec.model_config, seed=spec.settings.seed, device=topo.device)
    if spec.settings.checkpointing:
        apply_activation_checkpointing(model, spec.settings.activation_checkpointing)
    ddp = DDP(
        model,
        device_ids=[topo.device.index] if topo.device.type == "cuda" else None,
        bucket_cap_mb=DDP_BUCKET_CAP_MB,
        gradient_as_bucket_view=True,
    )
    opt = adamw(ddp.parameters(), lr=spec.settings.lr, device=topo.device)
    scaler = torch.amp.GradScaler(topo.device_type) if prec.loss_scaling else None
    # NOTE: compile the DDP-wrapped module (DDPOptimizer splits graphs at bucket boundaries, so the
    # reducer still overlaps communication with backward); no_sync stays on the DDP object.
    model_for_step = cast(torch.nn.Module, torch.compile(ddp)) if spec.settings.compile else ddp
    return TorchTrainer(
        model_for_step, opt, autocast=lambda: prec.autocast(topo.device_type), scaler=scaler, no_sync=ddp.no_sync
    )
