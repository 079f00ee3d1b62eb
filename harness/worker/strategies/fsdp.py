"""FSDP1 (`FullyShardedDataParallel`): the sharding strategies users know by name.

Each transformer Block is one FSDP unit (ModuleWrapPolicy); the root unit holds the embedding, final norm and head.
`wrap_blocks` N > 1 wraps N consecutive blocks as one unit (base.group_blocks: a module per group, since FSDP1 wraps
modules whose forward runs), 0 the whole model as the one (root) unit. The prefetch options (`forward_prefetch`,
`backward_prefetch`, `limit_all_gathers`) are passed as the cell sets them. The model is built on the meta device
and each unit is materialised and initialised on its own device by `param_init_fn`, so no rank ever holds the
whole unsharded model.
"""

from __future__ import annotations

from pathlib import Path
from typing import cast

import torch
from torch.distributed.fsdp import BackwardPrefetch, CPUOffload, MixedPrecision, ShardingStrategy
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
from torch.distributed.fsdp.sharded_grad_scaler import ShardedGradScaler
from torch.distributed.fsdp.wrap import ModuleWrapPolicy

from harness.core.catalogue import is_hybrid
from harness.scenario.spec import RunSpec
from harness.worker.models import apply_activation_checkpointing, block_types, build_model, init_module_
from harness.worker.precision import policy
from harness.worker.strategies import dcp
from harness.worker.strategies.base import BlockGroup, Topology, TorchTrainer, adamw, group_blocks

SHARDING = {
    "fsdp.full_shard": ShardingStrategy.FULL_SHARD,
    "fsdp.shard_grad_op": ShardingStrategy.SHARD_GRAD_OP,
    "fsdp.no_shard": ShardingStrategy.NO_SHARD,
    "fsdp.hybrid_shard": ShardingStrategy.HYBRID_SHARD,
    "fsdp.hybrid_shard_zero2": ShardingStrategy._HYBRID_SHARD_ZERO2,
}
BACKWARD_PREFETCH = {
    "backward_pre": BackwardPrefetch.BACKWARD_PRE,
    "backward_post": BackwardPrefetch.BACKWARD_POST,
    "none": None,
}
"""the `backward_prefetch` setting → FSDP1's argument (harness.scenario.spec.BACKWARD_PREFETCH)"""


def mixed_precision(name: str) -> MixedPrecision | None:
    prec = policy(name)
    if not prec.mixed:
        return None
    # NOTE: reduce in fp32 (see harness.worker.precision); buffers (none in the zoo) follow the compute dtype
    return MixedPrecision(param_dtype=prec.compute_dtype, reduce_dtype=torch.float32, buffer_dtype=prec.compute_dtype)


def setup(spec: RunSpec, *, topo: Topology) -> TorchTrainer:
    offload = spec.settings.offload
    prec = policy(spec.precision)
    model = build_model(spec.model_config, seed=spec.settings.seed, device="meta")
    s = spec.settings
    units = block_types(model)  # NOTE: before checkpointing wraps them: the policy wraps the inner blocks
    if s.checkpointing:
        # NOTE: checkpoint wrappers go on before FSDP wrapping; the policy then wraps the inner Blocks
        apply_activation_checkpointing(model, s.activation_checkpointing)
    if s.wrap_blocks != 1:
        # NOTE: after checkpointing (each group holds checkpointed blocks), before FSDP: the policy wraps the groups,
        # or nothing but the root when the whole model is one unit
        group_blocks(model, s.wrap_blocks)
        units = {BlockGroup} if s.wrap_blocks > 1 else set()
    # offloaded parameters are materialised on the CPU and FSDP keeps them there
    init_device = torch.device("cpu") if offload == "optimizer+params" else topo.device

    def param_init_fn(module: torch.nn.Module) -> None:
        module.to_empty(device=init_device, recurse=False)
        init_module_(module)

    kwargs = {}
    if is_hybrid(spec.strategy):
        kwargs["device_mesh"] = topo.mesh_for(spec.strategy)
    fsdp = FSDP(
        model,
        auto_wrap_policy=ModuleWrapPolicy(units) if units else None,
        sharding_strategy=SHARDING[spec.strategy],
        mixed_precision=mixed_precision(spec.precision),
        cpu_offload=CPUOffload(offload_params=offload == "optimizer+params"),
        device_id=topo.device,
        param_init_fn=param_init_fn,
        use_orig_params=True,
        limit_all_gathers=s.limit_all_gathers,
        forward_prefetch=s.forward_prefetch,
        backward_prefetch=BACKWARD_PREFETCH[s.backward_prefetch],
        sync_module_states=False,
        **kwargs,
    )
    opt = adamw(
        fsdp.parameters(),
        lr=spec.settings.lr,
        device=init_device if offload == "optimizer+params" else topo.device,
        sharded_scaler=prec.loss_scaling,
    )
    scaler = ShardedGradScaler(topo.device_type) if prec.loss_scaling else None
    model_for_step = cast(torch.nn.Module, torch.compile(fsdp)) if spec.settings.compile else fsdp
    return TorchTrainer(model_for_step, opt, scaler=scaler, no_sync=fsdp.no_sync)


# --------------------------------------------------------------------------------------------------
# checkpoint (harness.worker.checkpoint): DCP with FSDP1's sharded state dicts


def save_checkpoint(trainer: TorchTrainer, directory: Path, *, step: int) -> str:
    """Each rank writes its flat-parameter shards and their AdamW state (torch.distributed.checkpoint); returns the
    format's name."""
    dcp.save(trainer, directory, step=step)
    return dcp.FORMAT


def load_checkpoint(trainer: TorchTrainer, directory: Path) -> int:
    """The step saved, with the state loaded into `trainer` (a fresh one)."""
    return dcp.load(trainer, directory)
