"""The oldest Python and torch the harness runs on, and why: every torch name the harness imports, with the release
that made it importable from there.

GPU users bring their own torch build (the one for their CUDA), so the minimum in pyproject.toml must be true:
tests/unit/test_versions.py checks that this table lists exactly the torch imports of harness/ (a new import must be
placed here with its release), that each resolves in the installed torch, and that pyproject.toml and the README
state PYTHON_MIN and TORCH_MIN. A rank on an older torch stops at `require_torch` with a message naming what is
missing, instead of an ImportError or, worse, an AttributeError inside the failure writer (torch.OutOfMemoryError).
"""

from __future__ import annotations

PYTHON_MIN = (3, 11)
"""subprocess.Popen(process_group=...) (Python 3.11): `harness run`'s ranks, packed SLURM cells, the warm zygote"""

TORCH_MIN = (2, 6)
"""the newest `since` of TORCH_APIS: FSDP2's public fully_shard"""

TORCH_APIS: dict[str, tuple[int, int]] = {
    # "module:name" (from module import name) or "module" (import module) → the torch release it appeared in
    "torch:nn": (2, 0),
    # the tensor-memory meter (harness.worker.meters.tensors); always_call on the global forward hook: 2.1
    "torch.utils._pytree:tree_leaves": (2, 1),
    "torch.utils.weak:WeakIdKeyDictionary": (2, 0),
    "torch.nn.modules.module:register_module_forward_hook": (2, 1),
    "torch.nn.modules.module:register_module_forward_pre_hook": (2, 0),
    "torch.optim.optimizer:register_optimizer_step_pre_hook": (2, 0),
    "torch.optim.optimizer:register_optimizer_step_post_hook": (2, 0),
    "torch.nn.functional": (2, 0),
    "torch.nn.parallel:DistributedDataParallel": (2, 0),
    "torch.distributed": (2, 0),
    "torch.distributed.distributed_c10d": (2, 0),
    "torch.distributed.fsdp:FullyShardedDataParallel": (2, 0),
    "torch.distributed.fsdp:CPUOffload": (2, 0),
    "torch.distributed.fsdp:MixedPrecision": (2, 0),
    "torch.distributed.fsdp:ShardingStrategy": (2, 0),
    "torch.distributed.fsdp:BackwardPrefetch": (2, 0),
    "torch._subclasses.fake_tensor:FakeTensor": (2, 0),
    # a factory's (or a transformers class's) step on fake tensors (harness.worker.factory_models): its FLOPs with
    # SDPA's math path chosen, its saved bytes, and torch's module-wise memory tracker (PR #124688, in 2.5)
    "torch._subclasses.fake_tensor:FakeTensorMode": (2, 0),
    "torch.nn.attention:SDPBackend": (2, 3),
    "torch.nn.attention:sdpa_kernel": (2, 3),
    "torch.utils.flop_counter:FlopCounterMode": (2, 1),
    "torch.distributed._tools.mem_tracker:MemTracker": (2, 5),
    "torch.distributed._tools.mem_tracker:_MemRefType": (2, 5),
    "torch.distributed._tools.mem_tracker:_ModState": (2, 5),
    "torch.distributed.fsdp.wrap:ModuleWrapPolicy": (2, 0),
    "torch.distributed.fsdp.sharded_grad_scaler:ShardedGradScaler": (2, 0),
    "torch.distributed.algorithms._checkpoint.checkpoint_wrapper:checkpoint_wrapper": (2, 0),
    "torch.distributed.algorithms._checkpoint.checkpoint_wrapper:CheckpointImpl": (2, 0),
    "torch.utils._python_dispatch:TorchDispatchMode": (2, 0),
    "torch._dynamo.utils:counters": (2, 0),
    "torch.profiler:profile": (2, 0),  # the traced step (trace: true)
    "torch.profiler:ProfilerActivity": (2, 0),
    "torch.profiler:record_function": (2, 0),
    "torch.autograd.profiler:record_function": (2, 0),
    "torch.distributed.checkpoint": (2, 0),  # the checkpoint phase (checkpoint: true): DCP
    "torch.distributed.checkpoint.api:CheckpointException": (2, 0),
    "torch.distributed.checkpoint.state_dict:get_state_dict": (2, 2),
    "torch.distributed.checkpoint.state_dict:set_state_dict": (2, 2),
    "torch.distributed.device_mesh:init_device_mesh": (2, 2),
    "torch.distributed.tensor.parallel:ColwiseParallel": (2, 2),
    "torch.distributed.tensor.parallel:RowwiseParallel": (2, 2),
    "torch.distributed.tensor.parallel:SequenceParallel": (2, 2),
    "torch.distributed.tensor.parallel:PrepareModuleInput": (2, 2),
    "torch.distributed.tensor.parallel:parallelize_module": (2, 2),
    "torch.distributed.tensor.parallel:loss_parallel": (2, 3),
    "torch.distributed:pipelining": (2, 4),
    "torch.utils.checkpoint:CheckpointPolicy": (2, 4),
    "torch.utils.checkpoint:create_selective_checkpoint_contexts": (2, 4),
    # torch.distributed._tensor until 2.5
    "torch.distributed.tensor:DTensor": (2, 5),
    "torch.distributed.tensor:Shard": (2, 5),
    "torch.distributed.tensor:Replicate": (2, 5),
    "torch.distributed.tensor:distribute_tensor": (2, 5),
    # torch.distributed._composable.fsdp until 2.6
    "torch.distributed.fsdp:fully_shard": (2, 6),
    "torch.distributed.fsdp:FSDPModule": (2, 6),
    "torch.distributed.fsdp:MixedPrecisionPolicy": (2, 6),
}

TORCH_ATTRIBUTES: dict[str, tuple[int, int]] = {
    # names the harness reaches as attributes, not imports (not found by the import walk)
    "torch:OutOfMemoryError": (2, 5),  # the failure writer's oom test; torch.cuda.OutOfMemoryError before
    "torch.amp:GradScaler": (2, 3),  # GradScaler(device_type), DDP fp16
}


def version_tuple(version: str) -> tuple[int, int]:
    """(major, minor) of a version string such as '2.13.0+cpu' or '2.6.0a0+git1234'."""
    major, minor = version.split("+")[0].split(".")[:2]
    return int(major), int("".join(c for c in minor if c.isdigit()) or 0)


def missing_for(version: str) -> list[str]:
    """What a torch of `version` lacks of what the harness imports: 'module:name (torch X.Y)' for each."""
    have = version_tuple(version)
    needed = {**TORCH_APIS, **TORCH_ATTRIBUTES}
    # NOTE: newest first: what sets the minimum leads the message
    return [
        f"{api} (torch {v[0]}.{v[1]})"
        for api, v in sorted(needed.items(), key=lambda kv: kv[1], reverse=True)
        if v > have
    ]


def require_torch(version: str) -> None:
    """RuntimeError naming the minimum and what is missing when torch `version` is older than TORCH_MIN."""
    if version_tuple(version) < TORCH_MIN:
        missing = missing_for(version)
        raise RuntimeError(
            f"torch {version} is older than the harness's minimum {TORCH_MIN[0]}.{TORCH_MIN[1]}: it lacks "
            + ", ".join(missing)
            + " (harness/worker/versions.py)"
        )
