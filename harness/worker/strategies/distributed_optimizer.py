"""ZeRO-1 under tensor and pipeline parallelism: a Megatron-style distributed optimizer over the data-parallel group.

DeepSpeed's engine wraps the whole model and brings its own pipeline engine, so it does not compose with torch's
DTensor tensor parallelism or torch.distributed.pipelining (harness.core.catalogue). A `zero1` cell with tp or pp
> 1 runs this instead: what Megatron-LM's `--use-distributed-optimizer` does, without its overlap options (its
default: the reductions run after the backward, the gather after the step).

Per pipeline stage this rank holds (a Megatron "model chunk"; the whole model without a pipeline):

- its parameters (the local tensor-parallel shards, made plain by `layouts.localise_`) are views of one flat buffer
  in the parameter dtype (16 bit for bf16: the model computes in bf16, as Megatron's does), padded to a multiple of
  the data-parallel degree;
- their gradients accumulate into one flat **fp32** main-gradient buffer of the same layout (Megatron's default
  `accumulate_allreduce_grads_in_fp32`): in fp32 the buffer's views are the `.grad`s; in 16 bit a hook adds each new
  16-bit gradient into its fp32 view and drops it;
- after the last backward: one `reduce_scatter` of the buffer over the data-parallel group (pre-divided by dp, so
  it averages), each rank keeping its `1/dp` shard;
- AdamW (torch's, as every family here) steps the fp32 **master** shard: in fp32 the parameter buffer's own shard (no
  copy), in 16 bit an fp32 copy of it, written back to the 16-bit shard after the step;
- one `all_gather` of the parameter buffer over the data-parallel group puts every rank's updated shard back.

Parameters and gradients are replicated over dp, the optimizer state (and the fp32 master) sharded over it: per
parameter 2 + 4 + 12/dp bytes in bf16, 4 + 4 + 8/dp in fp32 (harness.plan.layouts models the same).
"""

from __future__ import annotations

from typing import Any, cast

import torch
import torch.distributed as dist
from torch import nn

from harness.core.layout import effective_microbatches
from harness.scenario.spec import RunSpec
from harness.worker.precision import policy
from harness.worker.strategies.base import Topology, adamw, scaled_step

IMPLEMENTATION = "harness distributed optimizer (Megatron-style: fp32 main grads, reduce_scatter, all_gather)"
"""what the record's layout says runs a zero1 cell under tensor or pipeline parallelism"""


class _Chunk:
    """One stage's flat parameter and main-gradient buffers and this rank's shard of them."""

    def __init__(self, params: list[nn.Parameter], *, dp: int, rank: int, param_dtype: torch.dtype, device: Any):
        self.params = params
        numel = sum(p.numel() for p in params)
        self.padded = -(-numel // dp) * dp
        self.shard_numel = self.padded // dp
        self.param_buf = torch.zeros(self.padded, dtype=param_dtype, device=device)
        self.grad_buf = torch.zeros(self.padded, dtype=torch.float32, device=device)
        self.grad_views: list[torch.Tensor] = []
        offset = 0
        with torch.no_grad():
            for p in params:
                n = p.numel()
                view = self.param_buf[offset : offset + n].view_as(p)
                view.copy_(p.detach())
                p.data = view
                self.grad_views.append(self.grad_buf[offset : offset + n].view_as(p))
                offset += n
        lo = rank * self.shard_numel
        self.param_shard = self.param_buf[lo : lo + self.shard_numel]
        self.grad_shard = self.grad_buf[lo : lo + self.shard_numel]
        # the fp32 master: the parameter buffer's own shard in fp32, an fp32 copy of it in 16 bit
        if param_dtype == torch.float32:
            self.master = self.param_shard
        else:
            self.master = self.param_shard.detach().float().clone()
        self.master.requires_grad_(True)
        self.master.grad = self.grad_shard


class DistributedOptimizer:
    """The step of the distributed optimizer (see the module docstring) over every stage this rank holds. It is the
    trainer's `optimizer`: `step()` reduces, steps and gathers; `zero_grad()` zeroes the main-gradient buffers."""

    def __init__(
        self,
        stages: list[nn.Module],
        *,
        dp_group: Any,
        lr: float,
        device: torch.device,
        param_dtype: torch.dtype,
        divisor: int,
        scaler: Any = None,
    ):
        self.group = dp_group
        self.scaler = scaler
        """fp16's ShardedGradScaler (layouts.loss_scaler): unscales the reduced fp32 shards, skips the step on every
        rank when any rank's shard overflowed"""
        self.dp = dist.get_world_size(dp_group)
        self.divisor = divisor
        """what the summed gradients are divided by before the reduction: dp (the average over the replicas), times
        the microbatches in 16 bit under a pipeline (the schedule's scale_grads divides the `.grad`s, which the
        16-bit hook has already moved into the main gradients)"""
        rank = dist.get_rank(dp_group)
        self.chunks = [
            _Chunk(list(stage.parameters()), dp=self.dp, rank=rank, param_dtype=param_dtype, device=device)
            for stage in stages
        ]
        for chunk in self.chunks:
            for p, g in zip(chunk.params, chunk.grad_views):
                if param_dtype == torch.float32:
                    p.grad = g  # autograd accumulates into the buffer's view in place
                else:
                    p.register_post_accumulate_grad_hook(_into_main_grad(g))
        self.inner = adamw([c.master for c in self.chunks], lr=lr, device=device, sharded_scaler=scaler is not None)
        """torch's AdamW over the fp32 master shards (the tensor-memory meter files its state as the optimizer's)"""

    def step(self) -> None:
        with torch.no_grad():
            for c in self.chunks:
                c.grad_buf.div_(self.divisor)
                if self.dp > 1:  # a one-rank group's shard is the whole buffer already
                    dist.reduce_scatter_tensor(c.grad_shard, c.grad_buf, group=self.group)
        scaled_step(self.inner, self.scaler)
        with torch.no_grad():
            for c in self.chunks:
                if c.master is not c.param_shard:
                    c.param_shard.copy_(c.master)
                if self.dp > 1:
                    dist.all_gather_into_tensor(c.param_buf, c.param_shard, group=self.group)

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Zero the main-gradient buffers (the `.grad` views stay: `set_to_none` does not apply)."""
        for c in self.chunks:
            c.grad_buf.zero_()


def _into_main_grad(main: torch.Tensor):
    def hook(p: torch.Tensor) -> None:
        assert p.grad is not None
        main.add_(p.grad)
        p.grad = None

    return hook


def setup(spec: RunSpec, *, topo: Topology) -> Any:
    """A zero1 cell under tensor and/or pipeline parallelism: each stage built on the meta device,
    tensor-parallelised, materialised, its DTensor parameters made plain (layouts.localise_), cast to the compute
    dtype in 16 bit, checkpointed; the distributed optimizer over the data-parallel group."""
    from harness.worker.strategies import layouts

    lay, s = spec.layout, spec.settings
    prec = policy(spec.precision)
    m = layouts.meshes(lay, device_type=topo.device_type, rank=topo.rank)
    loss_parallel = layouts.LOSS_PARALLEL and m.tp is not None
    stages = layouts.plain_stages(spec, meshes=m, device=topo.device, loss_parallel=loss_parallel,
                                  dtype=prec.compute_dtype if prec.mixed else None)  # fmt: skip
    microbatches = effective_microbatches(s.microbatches, lay.pp) if lay.pp > 1 and prec.mixed else 1
    scaler = layouts.loss_scaler(spec, topo.device)
    opt = DistributedOptimizer(
        list(stages), dp_group=m.dp.get_group(), lr=s.lr, device=topo.device, param_dtype=prec.compute_dtype,
        divisor=lay.dp * microbatches, scaler=scaler,
    )  # fmt: skip
    info = {**layouts.layout_info(spec, loss_parallel=loss_parallel), "data_parallel": IMPLEMENTATION}
    if lay.pp > 1:
        return layouts.PipelineTrainer(
            list(stages), stages, cast(Any, opt), spec=spec, meshes=m, device=topo.device,
            loss_parallel=loss_parallel, layout_info=info, scaler=scaler,
        )  # fmt: skip
    (model,) = stages
    return layouts.TensorParallelTrainer(model, cast(Any, opt), loss_parallel=loss_parallel, no_sync=None,
                                         layout_info=info, scaler=scaler)  # fmt: skip
