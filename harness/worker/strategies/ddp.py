"""DDP: full replica per rank, one all_reduce of all gradients per step, in buckets: torch's default (1 MiB, then
25 MiB) or every bucket `bucket_cap_mb` (the setting)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, cast

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from harness.scenario.spec import SETTING_DEFAULTS, RunSpec
from harness.worker.models import apply_activation_checkpointing, build_model
from harness.worker.precision import policy
from harness.worker.strategies.base import Topology, TorchTrainer, adamw


def bucket_cap_mb(spec: RunSpec) -> float | None:
    """DDP's `bucket_cap_mb` argument: None at the setting's default (torch's own: a 1 MiB first bucket, then 25 MiB;
    an explicit 25 would make the first bucket 25 MiB too), else the cell's value (every bucket's cap)."""
    cap = spec.settings.bucket_cap_mb
    return None if cap == SETTING_DEFAULTS["bucket_cap_mb"] else cap


def no_buffer_sync() -> dict[str, Any]:
    """DDP's argument that stops the buffers' broadcast before every forward: the models' buffers are constants every
    rank computes alike (a transformers class's RoPE inv_freq; the decoder has none). torch 2.13 names it
    `forward_sync_buffers` (and warns on the old `broadcast_buffers`); earlier releases `broadcast_buffers`."""
    import inspect

    from torch.nn.parallel import DistributedDataParallel

    params = inspect.signature(DistributedDataParallel.__init__).parameters
    return {"forward_sync_buffers": False} if "forward_sync_buffers" in params else {"broadcast_buffers": False}


def setup(spec: RunSpec, *, topo: Topology) -> Any:
    if not spec.layout.is_default:
        return _setup_layout(spec, topo=topo)
    prec = policy(spec.precision)
    model = build_model(spec.model_config, seed=spec.settings.seed, device=topo.device)
    if spec.settings.checkpointing:
        apply_activation_checkpointing(model, spec.settings.activation_checkpointing)
    ddp = DDP(
        model,
        device_ids=[topo.device.index] if topo.device.type == "cuda" else None,
        bucket_cap_mb=bucket_cap_mb(spec),
        gradient_as_bucket_view=True,
        **no_buffer_sync(),
    )
    opt = adamw(ddp.parameters(), lr=spec.settings.lr, device=topo.device)
    scaler = torch.amp.GradScaler(topo.device_type) if prec.loss_scaling else None
    # NOTE: compile the DDP-wrapped module (DDPOptimizer splits graphs at bucket boundaries, so the
    # reducer still overlaps communication with backward); no_sync stays on the DDP object.
    model_for_step = cast(torch.nn.Module, torch.compile(ddp)) if spec.settings.compile else ddp
    return TorchTrainer(
        model_for_step, opt, autocast=lambda: prec.autocast(topo.device_type), scaler=scaler, no_sync=ddp.no_sync
    )


def _setup_layout(spec: RunSpec, *, topo: Topology) -> Any:
    """DDP as the data parallelism of a tensor- and/or pipeline-parallel layout (harness.worker.strategies.layouts):
    each stage built on the meta device, tensor-parallelised, materialised, its DTensor parameters made plain
    (`layouts.localise_`: DDP's reducer takes plain tensors), checkpointed, under autocast for bf16, wrapped in DDP
    over the data-parallel group. A pipeline stage keeps DDP from reducing until the last microbatch's backward."""
    from harness.worker.strategies import layouts

    s = spec.settings
    prec = policy(spec.precision)
    m = layouts.meshes(spec.layout, device_type=topo.device_type, rank=topo.rank)
    loss_parallel = layouts.LOSS_PARALLEL and m.tp is not None
    stages = layouts.plain_stages(spec, meshes=m, device=topo.device, loss_parallel=loss_parallel)
    modules: list[DDP] = []
    for stage in stages:
        inner = layouts.Autocast(stage, lambda: prec.autocast(topo.device_type)) if prec.mixed else stage
        ddp = DDP(
            inner,
            process_group=m.dp.get_group(),
            device_ids=[topo.device.index] if topo.device.type == "cuda" else None,
            bucket_cap_mb=bucket_cap_mb(spec),
            gradient_as_bucket_view=True,
            **no_buffer_sync(),
        )
        # NOTE: DDP records the order gradients become ready in its first backward and rebuilds its buckets in that
        # order before the second forward; a pipeline runs one backward per microbatch, so it records every
        # parameter once per microbatch and the rebuild fails (reducer.cpp: "rebuilt parameter indices size is not
        # same as original model parameters size"). Rebuild now, in registration order, so nothing is recorded.
        # (static_graph=True instead left the last stage's gradients unreduced.) Without a pipeline too, so every
        # layout cell's buckets are the registration order's (harness.plan.layouts).
        ddp.reducer._push_all_rebuilt_params()
        ddp.reducer._rebuild_buckets()
        modules.append(ddp)
    scaler = layouts.loss_scaler(spec, topo.device)
    params = [p for mod in modules for p in mod.parameters()]
    opt = adamw(params, lr=s.lr, device=topo.device, sharded_scaler=scaler is not None)
    info = layouts.layout_info(spec, loss_parallel=loss_parallel)
    if spec.layout.pp > 1:
        return layouts.PipelineTrainer(
            list(modules), stages, opt, spec=spec, meshes=m, device=topo.device, loss_parallel=loss_parallel,
            layout_info=info, scaler=scaler,
        )  # fmt: skip
    (model,) = modules
    return layouts.TensorParallelTrainer(model, opt, loss_parallel=loss_parallel, no_sync=model.no_sync,
                                         layout_info=info, scaler=scaler)  # fmt: skip


# --------------------------------------------------------------------------------------------------
# checkpoint (harness.worker.checkpoint): the replicated state, written once by rank 0 with torch.save

CHECKPOINT_FILE = "checkpoint.pt"
FORMAT = "torch.save (rank 0)"


def _module(trainer: TorchTrainer) -> torch.nn.Module:
    """The model inside DDP (and torch.compile): its state dict has the plain parameter names."""
    model = getattr(trainer.model, "_orig_mod", trainer.model)
    return cast(torch.nn.Module, getattr(model, "module", model))


def save_checkpoint(trainer: TorchTrainer, directory: Path, *, step: int) -> str:
    """Rank 0 writes the model, the AdamW state (and the loss scaler's) and `step` to one file: every rank holds the
    same replica, so one copy is the whole state (the usual DDP practice). The other ranks write nothing. Returns the
    format's name."""
    if dist.get_rank() == 0:
        state: dict[str, Any] = {
            "model": _module(trainer).state_dict(),
            "optimizer": trainer.optimizer.state_dict(),
            "step": step,
        }
        if trainer.scaler is not None:
            state["scaler"] = trainer.scaler.state_dict()
        torch.save(state, directory / CHECKPOINT_FILE)
    return FORMAT


def load_checkpoint(trainer: TorchTrainer, directory: Path) -> int:
    """Every rank reads rank 0's file (on a multi-node cell: from the shared checkpoint_dir) onto its device; returns
    the step saved."""
    device = next(_module(trainer).parameters()).device
    state = torch.load(directory / CHECKPOINT_FILE, map_location=device, weights_only=True)
    _module(trainer).load_state_dict(state["model"])
    trainer.optimizer.load_state_dict(state["optimizer"])
    if trainer.scaler is not None:
        trainer.scaler.load_state_dict(state["scaler"])
    return int(state["step"])
