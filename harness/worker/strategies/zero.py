"""DeepSpeed ZeRO stages 1/2/3 (deepspeed is imported only here).

A torch AdamW is passed to `deepspeed.initialize` (DeepSpeed's FusedAdam JIT build fails on some CUDA
stacks, and a torch optimizer keeps the optimizer math identical to the other families);
DeepSpeedCPUAdam when the optimizer is offloaded. ZeRO-3 builds the model under `deepspeed.zero.Init`,
so parameters are partitioned as each module is constructed and no rank holds the whole model.
"""

from __future__ import annotations

import functools
import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from harness.core.families import FAMILIES
from harness.scenario.deepspeed_config import ZERO_STAGES, merged_config, runs_deepspeed
from harness.scenario.spec import RunSpec
from harness.worker.models import apply_activation_checkpointing, blocks_of, build_model, loss_fn, new_model
from harness.worker.strategies.base import Batch, Topology, adamw

STAGES = ZERO_STAGES
ZERO_OVERRIDES_ENV = "HARNESS_DS_ZERO_OVERRIDES"
"""JSON merged into `zero_optimization` (e.g. lowered stage3_* knobs so that a CPU-sized model shows
re-gathers); for diagnosing the accounting model, not for benchmarks"""


def ds_config(spec: RunSpec, *, world_size: int, nvme_path: str | None = None) -> dict[str, Any]:
    """The DeepSpeed config for a cell (also recorded, so a user can reproduce the cell outside the harness): the
    harness's own with the cell's `deepspeed_config` merged over it (harness.scenario.deepspeed_config; validation
    refused a cell whose config changes a key the harness owns). `nvme_path`: an `offload: nvme` cell's swap
    folder."""
    if world_size != spec.gpus:
        raise RuntimeError(f"a cell of {spec.gpus} GPUs runs on a world of {world_size}")
    cfg = merged_config(spec, nvme_path=nvme_path)
    overrides = os.environ.get(ZERO_OVERRIDES_ENV)
    if overrides:  # diagnostics only (tests/dist/test_comm.py); the record's env.deepspeed_config shows it
        cfg["zero_optimization"].update(json.loads(overrides))
    return cfg


class DeepSpeedTrainer:
    def __init__(self, engine, config: dict[str, Any]):
        self.engine = engine
        self.model = engine.module
        self.config = config
        """the DeepSpeed config, recorded as env.deepspeed_config"""

    def step(self, micro_batches: Sequence[Batch]) -> torch.Tensor:
        total = None
        n = len(micro_batches)
        for x, y in micro_batches:
            loss = loss_fn(self.engine(x), y)
            # DeepSpeed scales by 1/gradient_accumulation_steps itself and steps only at the boundary
            self.engine.backward(loss)
            self.engine.step()
            part = loss.detach() / n
            total = part if total is None else total + part
        assert total is not None, "a step has at least one micro-batch"
        return total

    def memory_extra(self) -> dict[str, list]:
        """The states the tensor-memory meter (harness.worker.meters.tensors) cannot file by its rules: ZeRO-3's
        parameter partitions (attributes of the parameters, `ds_tensor`, views of one flat buffer), its fp32 master
        partitions and its flat gradient partition buffer (the optimizer steps fp32 copies of it, never the buffer
        itself). Host-memory buffers (offload) are not device memory and are left out."""
        extra: dict[str, list] = {}
        parts = [p.ds_tensor for p in self.model.parameters() if getattr(p, "ds_tensor", None) is not None]
        if parts:
            extra["params"] = parts
        masters = getattr(self.engine.optimizer, "fp32_partitioned_groups_flat", None)
        if masters:  # ZeRO-3's fp32 master partitions, in the inner optimizer's param_groups only while it steps
            extra["optimizer"] = list(masters)
        flat = getattr(self.engine.optimizer, "grad_partitions_flat_buffer", None)
        if flat is not None:
            extra["grads"] = [flat]
        return extra


def _skip_shm_comm_build() -> None:
    """DeepSpeed's CPU backend JIT-compiles a shared-memory all_reduce (deepspeed_shm_comm) when its comm layer
    starts, which only `inference_all_reduce` uses; training never calls it. The build is a C++ compile in every
    rank's startup: about 30 s on a fresh 2-core machine, 65 s with two cells building at once under SLURM, and
    again whenever the virtual environment's path changes. Skipping it changes no collective (the comm tests
    count the same bytes either way)."""
    import importlib

    # NOTE: not `import deepspeed.comm.torch as m`: deepspeed.comm re-exports the real torch as `torch`, so
    # that binds torch itself
    ds_comm_torch = importlib.import_module("deepspeed.comm.torch")
    if hasattr(ds_comm_torch, "build_shm_op"):
        ds_comm_torch.build_shm_op = lambda: None  # type: ignore[attr-defined]


NVME_SUBDIR = "nvme"
"""the swap folder of an `offload: nvme` cell without its own nvme_path: under the run's scratch folder"""


def nvme_folder(spec: RunSpec, *, scratch: Path | None) -> str | None:
    """Where an `offload: nvme` cell swaps (made here): the cell's nvme_path, else the run's scratch folder's
    `nvme/`; None for every other cell."""
    if spec.settings.offload != "nvme":
        return None
    if spec.settings.nvme_path:
        folder = Path(spec.settings.nvme_path).expanduser()
    elif scratch is not None:
        folder = scratch / NVME_SUBDIR
    else:
        raise RuntimeError("offload: nvme needs nvme_path or a run's scratch folder; neither was given")
    folder.mkdir(parents=True, exist_ok=True)
    return str(folder)


@functools.cache
def nvme_refusal() -> str | None:
    """Why this host cannot run `offload: nvme` (DeepSpeed's async I/O op, AsyncIOBuilder, cannot be built here:
    it links libaio), or None. Asked once per process; imports deepspeed (the sweep asks for local nvme cells only).
    """
    from deepspeed.ops.op_builder import AsyncIOBuilder

    builder = AsyncIOBuilder()
    if builder.is_compatible(verbose=False):
        return None
    return (
        "offload nvme needs DeepSpeed's async I/O op (AsyncIOBuilder), which cannot be built on this host: "
        "libaio's library and headers were not found (install libaio-dev, or set CFLAGS/LDFLAGS to where they are)"
    )


def setup(spec: RunSpec, *, topo: Topology) -> Any:
    if not runs_deepspeed(spec):  # zero1 under tensor/pipeline parallelism: the harness's distributed optimizer
        from harness.worker.strategies import distributed_optimizer

        return distributed_optimizer.setup(spec, topo=topo)
    import deepspeed

    _skip_shm_comm_build()
    if spec.settings.offload == "nvme" and (why := nvme_refusal()) is not None:
        raise RuntimeError(why)
    deepspeed.init_distributed(dist_backend="nccl" if topo.device_type == "cuda" else "gloo", auto_mpi_discovery=False)
    config = ds_config(spec, world_size=topo.world_size, nvme_path=nvme_folder(spec, scratch=topo.scratch))
    cfg = spec.model_config
    if spec.strategy == "zero3" and FAMILIES[cfg.family].zero_init:
        # NOTE: no dtype= here: zero.Init derives it from the config. An explicit dtype is ignored on
        # devices without fp16 support (deepspeed 0.19's `dtype or fp16 if fp16_supported else bf16`
        # precedence), which silently built fp32 cells in bf16 on CPU.
        with deepspeed.zero.Init(config_dict_or_path=config):
            model = new_model(cfg, seed=spec.settings.seed)
    else:
        model = build_model(cfg, seed=spec.settings.seed, device=topo.device)
    if spec.settings.checkpointing:
        apply_activation_checkpointing(model, spec.settings.activation_checkpointing)
    if spec.settings.compile:
        for block in blocks_of(model):  # per block, so DeepSpeed's ZeRO-3 gather hooks stay outside the graphs
            block.compile()
    if spec.settings.offload != "none":
        from deepspeed.ops.adam import DeepSpeedCPUAdam

        opt = DeepSpeedCPUAdam(model.parameters(), lr=spec.settings.lr, adamw_mode=True, weight_decay=0.01)
    else:
        opt = adamw(model.parameters(), lr=spec.settings.lr, device=topo.device)
    engine, _, _, _ = deepspeed.initialize(model=model, optimizer=opt, config=config)
    return DeepSpeedTrainer(engine, config)


# --------------------------------------------------------------------------------------------------
# checkpoint (harness.worker.checkpoint): DeepSpeed's own save_checkpoint / load_checkpoint

CHECKPOINT_TAG = "state"
"""the tag (sub-folder) DeepSpeed writes the checkpoint under"""
FORMAT = "deepspeed"


def save_checkpoint(trainer: DeepSpeedTrainer, directory: Path, *, step: int) -> str:
    """`engine.save_checkpoint`: the module's state (dp rank 0; ZeRO-3's partitioned parameters are placeholders
    there) and each rank's ZeRO partition of the fp32 master weights and the AdamW moments (`zero_pp_rank_*`), with
    `step` as client state. DeepSpeed also writes `latest` and copies its zero_to_fp32.py beside them. Collective."""
    trainer.engine.save_checkpoint(str(directory), tag=CHECKPOINT_TAG, client_state={"harness_step": step})
    return FORMAT


def load_checkpoint(trainer: DeepSpeedTrainer, directory: Path) -> int:
    """`engine.load_checkpoint` into a fresh engine (the same stage and world); returns the step saved."""
    path, client = trainer.engine.load_checkpoint(str(directory), tag=CHECKPOINT_TAG)
    if path is None:
        raise RuntimeError(f"DeepSpeed found no checkpoint {CHECKPOINT_TAG!r} under {directory}")
    return int(client["harness_step"])
