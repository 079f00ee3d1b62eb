"""Library defaults the harness relies on without setting them, each stated once with its source.

The worker leaves these at the libraries' defaults; the planner's memory model (harness.plan.memory) and
collective model (harness.plan.comm) must use the same numbers, so both read them from here. When a library
upgrade changes a default, change it here (and check the `# source:`).

Floor 0: plain numbers, no imports.
"""

from __future__ import annotations

# --------------------------------------------------------------------------------------------------
# DDP (torch.nn.parallel.DistributedDataParallel)

DDP_BUCKET_CAP_MB = 25
"""torch's default bucket_cap_mb (MiB; DDP multiplies by 1024²), the `bucket_cap_mb` setting's default: at it
harness.worker.strategies.ddp passes None, which keeps torch's 1 MiB first bucket (an explicit value caps the first
bucket too; source: torch/nn/parallel/distributed.py `_BucketCapacityConfig.create`, torch 2.13)"""
DDP_FIRST_BUCKET_BYTES = 1024 * 1024
"""the first bucket's limit (bytes); source: torch.distributed._DEFAULT_FIRST_BUCKET_BYTES (torch 2.13)"""

# --------------------------------------------------------------------------------------------------
# DeepSpeed ZeRO; source: deepspeed/runtime/zero/config.py and stage_1_and_2.py, deepspeed 0.19.8.
# harness.worker.strategies.zero sets none of them (overlap_comm defaults to on for stage 3 only, and stage 3
# allocates a single reduce bucket anyway); a cell's `deepspeed_config` may, and the planner then reads the cell's
# values instead (harness.scenario.deepspeed_config.PRICED_KEYS, `zero_value`).

DS_REDUCE_BUCKET_ELEMS = 500_000_000
"""reduce_bucket_size: the contiguous gradient bucket (elements), allocated in full whatever the model size"""
DS_ALLGATHER_BUCKET_ELEMS = 500_000_000
"""allgather_bucket_size (elements): ZeRO-1/2's sharded all_gather, used only without all_gather_into_tensor"""
DS_NCCL_START_ALIGNMENT = 2
"""stage_1_and_2.py nccl_start_alignment_factor: ZeRO-1/2 pad the flat buffer to a multiple of this × world"""
DS_SUB_GROUP_SIZE = 1_000_000_000
"""sub_group_size: ZeRO-3 steps the optimizer over sub-groups of this many elements (per rank)"""
DS_PARAM_PERSISTENCE_THRESHOLD = 100_000
"""stage3_param_persistence_threshold: ZeRO-3 keeps parameters this small (elements) gathered on every rank"""
DS_PREFETCH_BUCKET_ELEMS = 50_000_000
"""stage3_prefetch_bucket_size: elements ZeRO-3 gathers ahead of the module being run"""
DS_MAX_LIVE_PARAMETERS = 1_000_000_000
"""stage3_max_live_parameters: upper bound on gathered ZeRO-3 elements (prefetch stops there)"""
DS_MAX_REUSE_DISTANCE = 1_000_000_000
"""stage3_max_reuse_distance: a ZeRO-3 parameter used again within this many trace elements stays gathered"""
