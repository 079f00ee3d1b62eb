"""Tensor and pipeline parallelism: the layout layer under the data-parallel families that compose with it.

A cell with `tp > 1` or `pp > 1` (harness.core.layout) runs its strategy's data parallelism (FSDP2's `fully_shard`,
DDP) over the data-parallel part of a device mesh `(pp, dp, tp)`, built here from the cluster layout: TP inside a
node, PP and DP across nodes. This module is shared by those families as `base` is (not a family: it builds no
trainer by itself); each family calls it in its own order (FSDP2 shards on the meta device, then materialises its
shards; DDP wraps materialised modules).

- Tensor parallelism (`apply_tensor_parallel`) is torch's DTensor `parallelize_module`, as torchtitan applies it to
  Llama: q/k/v and gate/up (w1, w3) column-wise, o and down (w2) row-wise, the embedding row-wise (over the vocabulary)
  and the head column-wise with loss parallel (the logits stay sharded over the vocabulary; cross-entropy runs on the
  shards). With `sequence_parallel` the norms run on sequence shards: each block's all-reduces become an all-gather
  before attention and the MLP and a reduce-scatter after them.
- Pipeline parallelism (`build_stages`, `PipelineTrainer`) is `torch.distributed.pipelining`: the model is cut by
  blocks into stages (the embedding on the first, the final norm and the head on the last), each a `Stage` module run
  by a `PipelineStage` under ScheduleGPipe, Schedule1F1B or ScheduleInterleaved1F1B. Each data-parallel replica's
  micro_batch is split into `microbatches`; gradients are averaged over them (the schedule's scale_grads) and over the
  replicas (the strategy's reduction). Only the last stage sees the loss: the trainer names those ranks
  (`loss_ranks`) for the worker's loss aggregation.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, cast

import torch
from torch import nn

from harness.core.layout import Layout, effective_microbatches, stage_blocks, stage_params
from harness.scenario.spec import RunSpec
from harness.worker.models import (
    Attention,
    Transformer,
    apply_activation_checkpointing,
    build_model,
    embed,
    init_module_,
    loss_fn,
    output_logits,
)
from harness.worker.precision import policy
from harness.worker.strategies.base import Batch, scaled_step

LOSS_PARALLEL = True
"""with tp > 1 the head's logits stay sharded over the vocabulary and cross-entropy runs under `loss_parallel()`
(torchtitan's default): no all-gather of batch x seq x vocab logits"""


@dataclass
class Meshes:
    """This rank's view of the cell's device mesh."""

    world: Any
    """the whole mesh, dimensions as Layout.mesh_dims"""
    dp: Any
    """the data-parallel mesh: 1-D (dp) or, for a hybrid, 2-D (dp_replicate, dp_shard)"""
    tp: Any | None
    """the tensor-parallel mesh (None when tp == 1)"""
    pp_group: Any | None
    """the pipeline's process group (None when pp == 1)"""
    pp_rank: int


def meshes(layout: Layout, *, device_type: str, rank: int) -> Meshes:
    """The cell's mesh from its layout: ranks node-major, TP innermost (inside a node), PP outermost."""
    from torch.distributed.device_mesh import init_device_mesh

    names = tuple(name for name, _ in layout.mesh_dims)
    world = init_device_mesh(device_type, tuple(size for _, size in layout.mesh_dims), mesh_dim_names=names)
    dp = world[layout.dp_dims] if len(layout.dp_dims) > 1 else world[layout.dp_dims[0]]
    return Meshes(
        world=world,
        dp=dp,
        tp=world["tp"] if layout.tp > 1 else None,
        pp_group=world["pp"].get_group() if layout.pp > 1 else None,
        pp_rank=layout.pp_rank(rank),
    )


class Stage(nn.Module):
    """A pipeline stage of the zoo Transformer: consecutive blocks, with the embedding on the first stage and the final
    norm and head on the last (the whole model when there is one stage). Its modules are the Transformer's own, so
    their keyed initialisation gives the weights every other strategy trains."""

    def __init__(self, model: Transformer, blocks: list[int], *, index: int, n_stages: int):
        super().__init__()
        self.index, self.block_ids = index, list(blocks)
        self.first, self.last = index == 0, index == n_stages - 1
        self.cfg = model.cfg
        self.tok_emb = model.tok_emb if self.first else None
        self.pos_emb = getattr(model, "pos_emb", None) if self.first else None
        self.blocks = nn.ModuleList(model.blocks[i] for i in blocks)
        self.norm = model.norm if self.last else None
        self.head = model.head if self.last else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """First stage: tokens (batch, seq) → hidden; middle: hidden → hidden; last: hidden → logits."""
        if self.tok_emb is not None:
            x = embed(self.cfg, self.tok_emb, self.pos_emb, x)
        for block in self.blocks:
            x = block(x)
        if self.head is not None:
            assert self.norm is not None
            x = output_logits(self.cfg, self.head(self.norm(x)))
        return x


def build_stages(spec: RunSpec, *, pp_rank: int, device: torch.device | str = "meta") -> list[Stage]:
    """This pipeline rank's stages (one, two with interleaved 1F1B; the whole model without a pipeline), built on
    `device` (meta: no memory; materialise after sharding)."""
    lay = spec.layout
    # NOTE: the decoder's module: a family without its names is refused before launch (Family.layout_refusal)
    model = cast(Transformer, build_model(spec.model_config, seed=spec.settings.seed, device=device))
    split = stage_blocks(spec.model_config.n_layers, lay.n_stages)
    return [Stage(model, split[i], index=i, n_stages=lay.n_stages) for i in lay.stages_of(pp_rank)]


def apply_tensor_parallel(stage: Stage, *, mesh: Any, sequence_parallel: bool, loss_parallel: bool) -> None:
    """Shard the stage's matmuls over the TP mesh (torchtitan's Llama plan; see the module docstring).

    NOTE: applied first, before activation checkpointing and the data-parallel wrapping (torchtitan's order): the
    plan names the blocks' own submodules."""
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        PrepareModuleInput,
        RowwiseParallel,
        SequenceParallel,
        parallelize_module,
    )

    tp = mesh.size()
    act = Shard(1) if sequence_parallel else Replicate()  # the residual stream between the TP regions
    plan: dict[str, Any] = {}
    if stage.tok_emb is not None:
        # NOTE: with learned positions under sequence parallelism the output stays a DTensor: models.embed adds this
        # rank's positions to it
        keep = sequence_parallel and stage.pos_emb is not None
        plan["tok_emb"] = RowwiseParallel(input_layouts=Replicate(), output_layouts=act, use_local_output=not keep)
    if stage.head is not None:
        if sequence_parallel:
            plan["norm"] = SequenceParallel()
        plan["head"] = ColwiseParallel(
            input_layouts=act,
            output_layouts=Shard(-1) if loss_parallel else Replicate(),
            use_local_output=not loss_parallel,
        )
    if plan:
        parallelize_module(stage, mesh, plan)
    for block in stage.blocks:
        block_plan: dict[str, Any] = {
            "attn.wq": ColwiseParallel(),
            "attn.wk": ColwiseParallel(),
            "attn.wv": ColwiseParallel(),
            "attn.wo": RowwiseParallel(output_layouts=act),
            "mlp.w1": ColwiseParallel(),
            "mlp.w2": RowwiseParallel(output_layouts=act),
        }
        if hasattr(block.mlp, "w3"):  # a gated MLP's up projection
            block_plan["mlp.w3"] = ColwiseParallel()
        if sequence_parallel:
            gather = PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),))
            block_plan.update(attn_norm=SequenceParallel(), mlp_norm=SequenceParallel(), attn=gather, mlp=gather)
        parallelize_module(block, mesh, block_plan)
        # the projections now return this rank's heads only
        attn = cast(Attention, block.attn)
        attn.n_heads //= tp
        attn.kv_heads //= tp


def init_module_sharded_(m: nn.Module) -> None:
    """The module's keyed initialisation, also when its weight is a DTensor (TP or FSDP2 shards): the init runs on
    a plain full-size tensor, whose values are then distributed onto the parameter's mesh like the parameter, so
    every layout starts from the single-process model's values."""
    from torch.distributed.tensor import DTensor, distribute_tensor

    w = getattr(m, "weight", None)
    if getattr(m, "tied", False):
        # NOTE: a tied head's bias; its weight is the embedding's, initialised by the embedding
        init_module_(m)
        return
    if not isinstance(w, DTensor):
        init_module_(m)
        return
    full = torch.nn.Parameter(
        torch.empty(w.shape, dtype=w.dtype, device=w.device_mesh.device_type), requires_grad=False
    )
    m._parameters["weight"] = full
    try:
        init_module_(m)
    finally:
        m._parameters["weight"] = w  # type: ignore[assignment]  # the DTensor parameter, as sharding left it
    with torch.no_grad():
        # NOTE: every rank built the same full tensor, so each takes its own shard (src_data_rank=None: a local
        # split, no scatter; the scatter asserts even chunks, which a _StridedShard of FSDP2 over TP lacks)
        w.copy_(distribute_tensor(full.data, w.device_mesh, w.placements, src_data_rank=None))


def materialise_(module: nn.Module, *, device: torch.device) -> None:
    """Allocate a meta-built module's parameters on `device` (only the local shards of DTensor parameters) and fill
    them with the values of the keyed initialisation of the whole tensors (distributed onto their mesh)."""
    module.to_empty(device=device)
    for m in module.modules():
        init_module_sharded_(m)


def localise_(module: nn.Module) -> None:
    """Make a tensor-parallel module's DTensor parameters plain Parameters on their local shards — what DDP's reducer
    and the distributed optimizer's flat buffers take — while each owning module's forward still computes with a
    DTensor: a forward pre-hook puts `DTensor.from_local(local)` (no communication; its backward hands the local
    gradient to the plain Parameter) into the module's instance dict, where it shadows the parameter, and the
    forward hook takes it out. Per owning module, so a checkpointed block's recompute sees the DTensors too.

    NOTE: torch's `_pre_dp_module_transform` does this once for the whole module, but makes new Parameters after
    every forward, so DDP and the optimizer would hold stale ones after the first step."""
    from torch.distributed.tensor import DTensor

    for mod in module.modules():
        specs: dict[str, tuple[nn.Parameter, Any, tuple, torch.Size, tuple[int, ...]]] = {}
        for name, p in list(mod._parameters.items()):
            if isinstance(p, DTensor):
                local = nn.Parameter(p.to_local().detach(), requires_grad=p.requires_grad)
                specs[name] = (local, p.device_mesh, tuple(p.placements), p.shape, p.stride())
                mod._parameters[name] = local
        if not specs:
            continue

        def pre(m: nn.Module, args: Any, specs: dict = specs) -> None:
            for name, (local, mesh, placements, shape, stride) in specs.items():
                m.__dict__[name] = DTensor.from_local(local, mesh, placements, run_check=False, shape=shape,
                                                      stride=stride)  # fmt: skip

        def post(m: nn.Module, args: Any, out: Any, specs: dict = specs) -> None:
            for name in specs:
                m.__dict__.pop(name, None)

        mod.register_forward_pre_hook(pre)
        mod.register_forward_hook(post)


def plain_stages(
    spec: RunSpec, *, meshes: Meshes, device: torch.device, loss_parallel: bool, dtype: torch.dtype | None = None
) -> list[Stage]:
    """This rank's stages for a data parallelism that takes plain tensors (DDP, the distributed optimizer): built on
    the meta device, tensor-parallelised, materialised, their DTensor parameters made plain (`localise_`), cast to
    `dtype` when given (16-bit parameters), checkpointed."""
    s = spec.settings
    stages = build_stages(spec, pp_rank=meshes.pp_rank)
    for stage in stages:
        if meshes.tp is not None:
            apply_tensor_parallel(
                stage, mesh=meshes.tp, sequence_parallel=s.sequence_parallel, loss_parallel=loss_parallel
            )
        materialise_(stage, device=device)
        localise_(stage)
        if dtype is not None:
            stage.to(dtype)
        if s.checkpointing:
            apply_activation_checkpointing(cast(Transformer, stage), s.activation_checkpointing)  # it has .blocks
    return stages


def _local(t: torch.Tensor) -> torch.Tensor:
    """A plain tensor: the full value of a (replicated) DTensor loss."""
    from torch.distributed.tensor import DTensor

    return t.full_tensor() if isinstance(t, DTensor) else t


def _loss_context(enabled: bool) -> contextlib.AbstractContextManager:
    if not enabled:
        return contextlib.nullcontext()
    from torch.distributed.tensor.parallel import loss_parallel

    return loss_parallel()


def layout_info(spec: RunSpec, *, loss_parallel: bool) -> dict[str, Any]:
    """What the record says of the layout (record.layout): degrees, mesh, schedule and the stage balance."""
    lay, s = spec.layout, spec.settings
    split = stage_blocks(spec.model_config.n_layers, lay.n_stages)
    return {
        **lay.to_dict(),
        "microbatches": effective_microbatches(s.microbatches, lay.pp) if lay.pp > 1 else None,
        "sequence_parallel": s.sequence_parallel,
        "loss_parallel": loss_parallel and lay.tp > 1,
        "stages": [len(b) for b in split],
        "stage_blocks": split,
        "stage_params": stage_params(spec.model_config, lay.n_stages),
    }


def loss_scaler(spec: RunSpec, device: torch.device) -> Any:
    """fp16's dynamic loss scaler for a layout cell, else None: torch's ShardedGradScaler over the whole world, whose
    `unscale_` all-reduces the overflow verdict, so an inf or NaN in any TP, PP or DP rank's gradients skips the step
    on every rank (each holds other gradients: a per-rank verdict would let ranks disagree)."""
    if not policy(spec.precision).loss_scaling:
        return None
    from torch.distributed.fsdp.sharded_grad_scaler import ShardedGradScaler

    scaler = ShardedGradScaler(device.type)
    # NOTE: the scale is made on the first scale(); a pipeline rank without the last stage never scales a loss, and
    # its unscale_ would find no scale ("Attempted unscale_ but _scale is None"): make it now, on every rank
    scaler.scale(torch.zeros((), device=device))
    return scaler


def optimizer_step(optimizer: Any, scaler: Any) -> None:
    """The step after the last backward (base.scaled_step), then zero the gradients; the distributed optimizer
    scales inside its own step (it holds the scaler, harness.worker.strategies.distributed_optimizer)."""
    if isinstance(optimizer, torch.optim.Optimizer):
        scaled_step(optimizer, scaler)
    else:
        optimizer.step()
    optimizer.zero_grad(set_to_none=True)


class TensorParallelTrainer:
    """The step of a tensor-parallel cell without a pipeline: forward, loss (loss parallel), backward per micro-step
    (of the scaled loss in fp16), then the optimizer step."""

    def __init__(
        self,
        model: nn.Module,
        optimizer: torch.optim.Optimizer,
        *,
        loss_parallel: bool,
        no_sync: Callable[[], contextlib.AbstractContextManager] | None,
        layout_info: dict[str, Any],
        scaler: Any = None,
    ):
        self.model, self.optimizer = model, optimizer
        self._loss_parallel, self._no_sync = loss_parallel, no_sync
        self.layout_info = layout_info
        self.scaler = scaler

    def step(self, micro_batches: Sequence[Batch]) -> torch.Tensor:
        n = len(micro_batches)
        total = None
        for i, (x, y) in enumerate(micro_batches):
            sync = i == n - 1 or self._no_sync is None
            with contextlib.nullcontext() if sync or self._no_sync is None else self._no_sync():
                # NOTE: the backward too runs under loss_parallel (its cross-entropy backward is the sharded one)
                with _loss_context(self._loss_parallel):
                    loss = loss_fn(self.model(x), y) / n
                    (loss if self.scaler is None else self.scaler.scale(loss)).backward()
            part = _local(loss.detach())
            total = part if total is None else total + part
        optimizer_step(self.optimizer, self.scaler)
        assert total is not None, "a step has at least one micro-batch"
        return total


SCHEDULES = {"gpipe": "ScheduleGPipe", "1f1b": "Schedule1F1B", "interleaved_1f1b": "ScheduleInterleaved1F1B"}
"""pp_schedule → the torch.distributed.pipelining schedule class"""


class PipelineTrainer:
    """The step of a pipeline-parallel cell: one schedule step over this replica's micro_batch (split into the
    microbatches), then the optimizer step. Returns the mean microbatch loss on the last stage's ranks, a placeholder
    (0) on the others, which `loss_ranks` leaves out of the worker's aggregation."""

    def __init__(
        self,
        modules: list[nn.Module],
        stages: list[Stage],
        optimizer: torch.optim.Optimizer,
        *,
        spec: RunSpec,
        meshes: Meshes,
        device: torch.device,
        loss_parallel: bool,
        layout_info: dict[str, Any],
        scaler: Any = None,
    ):
        from torch.distributed import pipelining

        lay = spec.layout
        self.scaler = scaler
        self.model = nn.ModuleList(modules)
        self.optimizer, self.device = optimizer, device
        self._loss_parallel = loss_parallel
        self.layout_info = layout_info
        self.has_first = any(st.first for st in stages)
        self.has_last = any(st.last for st in stages)
        last_pp = (lay.n_stages - 1) % lay.pp
        self.loss_ranks = [r for r in range(lay.gpus) if lay.pp_rank(r) == last_pp]
        pipe_stages = [
            pipelining.PipelineStage(mod, st.index, lay.n_stages, device, group=meshes.pp_group)
            for mod, st in zip(modules, stages)
        ]
        m = effective_microbatches(spec.settings.microbatches, lay.pp)
        cls = getattr(pipelining, SCHEDULES[lay.schedule])
        # NOTE: loss_fn is each microbatch's mean cross-entropy; scale_grads (the default) divides the summed
        # gradients by the microbatches, so the step's gradient is that of the whole micro_batch's mean loss
        # in fp16 the schedule's backward starts from the scaled loss
        step_loss = loss_fn if scaler is None else (lambda out, y: scaler.scale(loss_fn(out, y)))
        if lay.stages_per_rank > 1:
            self.schedule = cls(pipe_stages, n_microbatches=m, loss_fn=step_loss)
        else:
            (only,) = pipe_stages
            self.schedule = cls(only, n_microbatches=m, loss_fn=step_loss)

    def step(self, micro_batches: Sequence[Batch]) -> torch.Tensor:
        # NOTE: one micro-step (validation refuses grad_accum > 1 with pp > 1: the microbatches are the accumulation)
        ((x, y),) = micro_batches
        losses: list[torch.Tensor] = []
        scale = 1.0 if self.scaler is None else float(self.scaler.get_scale())  # this step's, before the update
        with _loss_context(self._loss_parallel):
            args = (x,) if self.has_first else ()
            if self.has_last:
                self.schedule.step(*args, target=y, losses=losses, return_outputs=False)
            else:
                self.schedule.step(*args, return_outputs=False)
        optimizer_step(self.optimizer, self.scaler)
        if not self.has_last:
            return torch.zeros((), device=self.device)
        return torch.stack([_local(loss.detach()).float() for loss in losses]).mean() / scale


class Autocast(nn.Module):
    """Runs a stage's forward under autocast (DDP's bf16): the pipeline schedule runs forward and backward itself, and
    backward must not run under autocast."""

    def __init__(self, module: nn.Module, autocast: Callable[[], contextlib.AbstractContextManager]):
        super().__init__()
        self.module = module
        self._autocast = autocast

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with self._autocast():
            return self.module(x)
