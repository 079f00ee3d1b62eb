"""FSDP2 (`fully_shard`): per-parameter DTensor sharding; hybrid = 2-D mesh (replicate × shard).

Built on the meta device, sharded, then materialised: each rank allocates only its shards, and each
parameter is initialised from its full keyed values (generated one parameter at a time) distributed
onto the mesh, so weights equal every other strategy's.
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any, cast

import torch
from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard
from torch.distributed.fsdp.sharded_grad_scaler import ShardedGradScaler

from harness.scenario.spec import RunSpec
from harness.worker.models import (
    Transformer,
    apply_activation_checkpointing,
    blocks_of,
    build_model,
    has_keyed_init,
)
from harness.worker.precision import policy
from harness.worker.strategies import dcp
from harness.worker.strategies.base import Topology, TorchTrainer, adamw, block_groups
from harness.worker.strategies.layouts import init_module_sharded_


def _init_sharded_(model: torch.nn.Module) -> None:
    """Initialise every (DTensor) parameter from the full values its module's keyed init would produce."""
    for module in model.modules():
        if has_keyed_init(module):
            init_module_sharded_(module)


def _unit(blocks: torch.nn.ModuleList, indices: range) -> Any:
    """The module(s) of one FSDP2 unit: a block by itself (as every cell before wrap_blocks), or a list of them."""
    return blocks[indices[0]] if len(indices) == 1 else [blocks[i] for i in indices]


def _prefetch(units: list[Any], n: int) -> None:
    """Each unit prefetches the next `n` units' all-gathers in forward and the previous `n` in backward (FSDP2's
    explicit prefetch; its implicit one is one unit ahead)."""
    modules = [cast(FSDPModule, u[0] if isinstance(u, list) else u) for u in units]
    for i, m in enumerate(modules):
        ahead = modules[i + 1 : i + 1 + n]
        behind = modules[max(0, i - n) : i][::-1]
        if ahead:
            m.set_modules_to_forward_prefetch(ahead)
        if behind:
            m.set_modules_to_backward_prefetch(behind)


def setup(spec: RunSpec, *, topo: Topology) -> TorchTrainer:
    if not spec.layout.is_default:
        return _setup_layout(spec, topo=topo)
    prec = policy(spec.precision)
    model = build_model(spec.model_config, seed=spec.settings.seed, device="meta")
    if spec.settings.checkpointing:
        apply_activation_checkpointing(model, spec.settings.activation_checkpointing)
    mesh = topo.mesh_for(spec.strategy)
    mp = (
        MixedPrecisionPolicy(param_dtype=prec.compute_dtype, reduce_dtype=torch.float32)
        if prec.mixed
        else MixedPrecisionPolicy()
    )
    if spec.settings.compile:
        # NOTE: per-block compile before fully_shard (torchtitan's order): each block is one graph and
        # FSDP2's all-gather/reduce-scatter hooks stay outside it
        for block in blocks_of(model):
            block.compile()
    s = spec.settings
    reshard = s.reshard_after_forward
    blocks = blocks_of(model)
    # NOTE: one fully_shard per unit of `wrap_blocks` consecutive blocks (a list makes one group: gathered before
    # its first block's forward, resharded after its last's), none for wrap_blocks 0 (the root holds everything)
    units = [
        fully_shard(_unit(blocks, r), mesh=mesh, mp_policy=mp, reshard_after_forward=reshard)
        for r in block_groups(len(blocks), s.wrap_blocks)
    ]
    fully_shard(model, mesh=mesh, mp_policy=mp, reshard_after_forward=reshard)
    if s.prefetch_units > 1:
        _prefetch(units, s.prefetch_units)
    model.to_empty(device=topo.device)
    _init_sharded_(model)
    opt = adamw(model.parameters(), lr=spec.settings.lr, device=topo.device, sharded_scaler=prec.loss_scaling)
    scaler = ShardedGradScaler(topo.device_type) if prec.loss_scaling else None

    @contextlib.contextmanager
    def no_sync():
        model.set_requires_gradient_sync(False)
        try:
            yield
        finally:
            model.set_requires_gradient_sync(True)

    return TorchTrainer(model, opt, scaler=scaler, no_sync=no_sync)


def _setup_layout(spec: RunSpec, *, topo: Topology) -> Any:
    """FSDP2 as the data parallelism of a tensor- and/or pipeline-parallel layout (harness.worker.strategies.layouts):
    each stage (the whole model without a pipeline) built on the meta device, tensor-parallelised, checkpointed, then
    fully_shard per block and per stage over the data-parallel mesh (2-D for HSDP), then materialised shard by shard."""
    from harness.worker.strategies import layouts

    lay, s = spec.layout, spec.settings
    prec = policy(spec.precision)
    m = layouts.meshes(lay, device_type=topo.device_type, rank=topo.rank)
    mp = (
        MixedPrecisionPolicy(param_dtype=prec.compute_dtype, reduce_dtype=torch.float32)
        if prec.mixed
        else MixedPrecisionPolicy()
    )
    loss_parallel = layouts.LOSS_PARALLEL and m.tp is not None
    # NOTE: under a pipeline, a stage keeps its gathered parameters from its first microbatch's forward to the
    # schedule's final gradient reduction (torchtitan's choice): resharding after each forward would gather them
    # again for every microbatch
    reshard = lay.pp == 1
    stages = layouts.build_stages(spec, pp_rank=m.pp_rank)
    for stage in stages:
        if m.tp is not None:
            layouts.apply_tensor_parallel(
                stage, mesh=m.tp, sequence_parallel=s.sequence_parallel, loss_parallel=loss_parallel
            )
        if s.checkpointing:
            apply_activation_checkpointing(cast(Transformer, stage), s.activation_checkpointing)  # it has .blocks
        for block in stage.blocks:
            fully_shard(block, mesh=m.dp, mp_policy=mp, reshard_after_forward=reshard)
        fully_shard(stage, mesh=m.dp, mp_policy=mp, reshard_after_forward=reshard)
        layouts.materialise_(stage, device=topo.device)
    scaler = layouts.loss_scaler(spec, topo.device)
    params = [p for stage in stages for p in stage.parameters()]
    opt = adamw(params, lr=s.lr, device=topo.device, sharded_scaler=scaler is not None)
    info = layouts.layout_info(spec, loss_parallel=loss_parallel)
    if lay.pp > 1:
        return layouts.PipelineTrainer(
            list(stages),
            stages,
            opt,
            spec=spec,
            meshes=m,
            device=topo.device,
            loss_parallel=loss_parallel,
            layout_info=info,
            scaler=scaler,
        )
    (model,) = stages

    @contextlib.contextmanager
    def no_sync():
        cast(FSDPModule, model).set_requires_gradient_sync(False)
        try:
            yield
        finally:
            cast(FSDPModule, model).set_requires_gradient_sync(True)

    return layouts.TensorParallelTrainer(
        model, opt, loss_parallel=loss_parallel, no_sync=no_sync, layout_info=info, scaler=scaler
    )


# --------------------------------------------------------------------------------------------------
# checkpoint (harness.worker.checkpoint): DCP with FSDP2's DTensor state dicts


def save_checkpoint(trainer: TorchTrainer, directory: Path, *, step: int) -> str:
    """Each rank writes its DTensor shards of the parameters and of their AdamW state (torch.distributed.checkpoint);
    returns the format's name."""
    dcp.save(trainer, directory, step=step)
    return dcp.FORMAT


def load_checkpoint(trainer: TorchTrainer, directory: Path) -> int:
    """The step saved, with the state loaded into `trainer` (a fresh one)."""
    return dcp.load(trainer, directory)
