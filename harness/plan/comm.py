"""Analytic collective accounting: the bytes and calls every strategy issues per optimizer step, per rank.

`predict_comm(spec)` builds a ledger, one line per kind of collective a strategy issues (what it is, c10d
collective, dtype, bytes per call, calls per step, process-group kind), from the exact parameter shapes of
`harness.worker.models.Transformer` and the exact configuration in `harness.worker.strategies.*`. Bytes follow the
convention of `harness.worker.meters.comm` (nccl-tests): the buffer for all_reduce, the whole output for
all_gather, the whole input for reduce_scatter; everything is what rank 0 sees (every rank is symmetric).

What each family does (torch 2.13, deepspeed 0.19; docs/comm.md has the formulas and measured tables):

- DDP: one all_reduce per gradient bucket (first bucket 1 MiB, then 25 MiB: torch's default; a `bucket_cap_mb`
  setting caps every bucket, the first too; grads fp32 in every precision, autocast keeps fp32 parameters), on the
  last micro-step only (no_sync before).
- FSDP1 (use_orig_params, one unit per Block + the root unit): a FlatParameter per unit, each parameter
  address-aligned to 16 bytes *of the forward dtype* (4 fp32 / 8 bf16 elements of padding at most) and
  the whole padded to a multiple of the shard-group size. all_gather of the flat parameter in the
  parameter dtype; reduce_scatter (all_reduce for NO_SHARD) of the flat gradient in fp32.
  FULL_SHARD re-gathers every non-root unit in backward (the root is not resharded after forward);
  SHARD_GRAD_OP keeps parameters until after the last micro-step's backward. HYBRID: shard inside the
  node, then all_reduce of the fp32 gradient shard across nodes.
- FSDP2 (fully_shard per Block + root, reshard_after_forward=True everywhere, so the root too is
  re-gathered in backward): each parameter's dim 0 padded to a multiple of the shard-group size. With the setting
  reshard_after_forward false every unit is gathered once per micro-step (forward only).
- Both FSDP generations: a unit is `wrap_blocks` consecutive blocks (harness.plan.wrap; 0: the whole model is the
  root unit), one all-gather and one reduction per unit. The prefetch settings change when the all-gathers are
  issued, not what is issued: the ledger's wording carries them to the overlap model (`fsdp_prefetch`).
- DeepSpeed ZeRO-1/2: one flat buffer padded to 2·world elements; gradients all_reduced whole
  (use_multi_rank_bucket_allreduce) in the model dtype, in 5e8-element buckets, once per step (ZeRO-1)
  or every micro-step (ZeRO-2); the grad-norm all_reduce (fp32, one element), the overflow all_reduce
  (uint8, one element) when bf16/fp16; all_gather of the updated flat buffer.
- DeepSpeed ZeRO-3: parameters of <= 1e5 elements are "persistent": resident through forward and
  backward and all-gathered one by one after the step. The others are gathered (coalesced, with
  prefetch) in forward, and again in backward only if their next use lies more than
  stage3_max_reuse_distance (1e9) elements down the module trace (with activation checkpointing the
  recomputed forward is part of that trace) — simulated as DeepSpeed's coordinator does it, call by
  call. Gradients reduce_scattered (coalesced, each padded to the world) in the model dtype every
  micro-step; the grad-norm all_reduce is fp64 (one element per optimizer sub-group); fp16 adds the
  overflow all_reduce. The coordinator's simulation is harness.plan.zero3's.
- World 1: DDP and DeepSpeed still reduce on the one-rank group; FSDP1 runs as NO_SHARD (all_reduce per
  unit); FSDP2 issues nothing.

Returns None (the reason: `no_comm_model_reason`) for cells that cannot run, DeepSpeed CPU offload (other
reduction and norm code paths, not measurable here) and hybrids with one rank per node (a one-rank shard
group: FSDP's fallback there is unmeasured). FSDP1 CPU offload is predicted (same collectives) but could
not be measured here: CPUOffload needs an accelerator.

No torch import: the planner calls this for every cell.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import NamedTuple

from harness.core import precisions
from harness.core.catalogue import CATALOGUE, HYBRID
from harness.core.constants import (
    DDP_BUCKET_CAP_MB,
    DDP_FIRST_BUCKET_BYTES,
    DS_NCCL_START_ALIGNMENT,
    DS_REDUCE_BUCKET_ELEMS,
)
from harness.core.precisions import DTYPE_BYTES
from harness.core.zoo import ModelConfig, Param, parameters
from harness.plan import layouts, runnable, wrap, zero3
from harness.plan.links import box_kind
from harness.plan.zero3 import ZERO3_KEYS, Zero3Config, ds_ipg_buckets, zero3_structure
from harness.scenario import deepspeed_config
from harness.scenario.spec import SETTING_DEFAULTS, RunSpec

# DDP (torch.nn.parallel.DistributedDataParallel, harness.worker.strategies.ddp); the defaults and the DeepSpeed
# ones (DS_*) live in harness.core.constants with their source
DDP_BUCKET_CAP_BYTES = DDP_BUCKET_CAP_MB * 1024 * 1024
# FSDP1 FlatParameter address alignment (torch.distributed.fsdp._flat_param._get_aligned_numel)
FSDP_ALIGNMENT_BYTES = 16


ZERO3 = Zero3Config()
"""the ZeRO-3 coordinator's knobs the collective model uses (DeepSpeed's defaults; a test or a diagnosis may set
others: a CommCell takes them when it is made)"""


def zero3_config(spec: RunSpec) -> Zero3Config:
    """The ZeRO-3 knobs of a cell: `ZERO3`'s, with the values its `deepspeed_config` sets (ZERO3_KEYS)."""
    user = spec.settings.deepspeed_config
    if not user:
        return ZERO3
    given = {
        f: deepspeed_config.zero_value(spec, k)
        for k, f in ZERO3_KEYS.items()
        if deepspeed_config.get_path(user, k) is not deepspeed_config.ABSENT
    }
    return dataclasses.replace(ZERO3, **given) if given else ZERO3


# --------------------------------------------------------------------------------------------------
# the model's parameters, exactly as harness.worker.models.Transformer registers them


def model_units(cfg: ModelConfig, wrap_blocks: int = 1) -> tuple[tuple[str, tuple[Param, ...]], ...]:
    """FSDP units in wrapping order: one per Block (per group of `wrap_blocks` Blocks, harness.plan.wrap), then the
    root (what no unit holds), each with its parameters in registration order (cached per model: planning asks per
    cell, and a 70B model has 723 parameters)."""
    return wrap.wrap_units(cfg, wrap_blocks)


@functools.cache
def unit_numels(cfg: ModelConfig, wrap_blocks: int = 1) -> tuple[tuple[str, tuple[int, ...]], ...]:
    """(unit name, its parameters' numels in order) per FSDP unit of the model, in wrapping order."""
    return tuple((name, tuple(p.numel for p in unit)) for name, unit in model_units(cfg, wrap_blocks))


@functools.cache
def param_numels(cfg: ModelConfig) -> tuple[int, ...]:
    """Every parameter's numel in registration order."""
    return tuple(p.numel for p in parameters(cfg))


# --------------------------------------------------------------------------------------------------
# process groups (classified as harness.worker.meters.comm does, from rank 0's point of view)


@dataclass(frozen=True)
class Groups:
    """Rank 0's groups: the world, the shard group and the replicate group (hybrids)."""

    world: str
    shard: str
    replicate: str | None
    shard_size: int
    replicate_size: int


def groups_for(cell: RunSpec | CommCell) -> Groups:
    """Rank 0's groups of a cell (or of its `CommCell`: the same strategy, GPUs and GPUs per node)."""
    return _groups(cell.strategy, cell.gpus, cell.gpus_per_node)


@functools.cache
def _groups(strategy: str, gpus: int, gpus_per_node: int) -> Groups:
    # NOTE: the kinds from the groups' arithmetic (harness.plan.links.box_kind), never from their ranks listed: a
    # 1,048,576-rank world is one box of stride 1, a hybrid's replicate group one of stride gpus_per_node
    w, gpn = gpus, gpus_per_node
    world = box_kind([(1, w)], gpus_per_node=gpn)
    if CATALOGUE[strategy].mesh == HYBRID:
        nodes = w // gpn
        return Groups(
            world=world,
            shard=box_kind([(1, gpn)], gpus_per_node=gpn),
            replicate=box_kind([(gpn, nodes)], gpus_per_node=gpn),
            shard_size=gpn,
            replicate_size=nodes,
        )
    return Groups(world=world, shard=world, replicate=None, shard_size=w, replicate_size=1)


# --------------------------------------------------------------------------------------------------
# the ledger


class Item(NamedTuple):
    """One kind of collective: `calls` calls per step of `bytes_per_call` bytes each. (A NamedTuple, not a frozen
    dataclass: planning builds ~10^5 of them, and a frozen dataclass's __init__ is several times slower.)"""

    what: str
    collective: str
    dtype: str
    bytes_per_call: int
    calls: float
    group: str
    ranks: int = 0
    """the group's size where its kind does not say it (a layout cell's tp, pp and dp groups); 0: from the kind"""

    @property
    def bytes(self) -> float:
        return self.bytes_per_call * self.calls


_new = tuple.__new__


@dataclass
class LedgerBuilder:
    """A ledger being written by a collective model: `add` one kind of collective at a time, then `build`."""

    items: list[Item] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def add(self, what: str, collective: str, dtype: str, bytes_per_call: int, calls: float = 1, *, group: str) -> None:
        if calls:  # NOTE: tuple.__new__, not Item(...): ~10^5 items per plan, and the NamedTuple's __new__ is Python
            self.items.append(_new(Item, (what, collective, dtype, int(bytes_per_call), float(calls), group, 0)))

    def build(self) -> Ledger:
        return Ledger(items=tuple(self.items), notes=tuple(self.notes))


@dataclass(frozen=True)
class Ledger:
    """Every collective a strategy issues per step, one Item per kind, and sentences on what was assumed. Frozen:
    cached ledgers are shared between the cells they describe."""

    items: tuple[Item, ...]
    notes: tuple[str, ...]

    def __hash__(self) -> int:
        return self._content_hash

    @functools.cached_property
    def _content_hash(self) -> int:
        # NOTE: computed once: the time model's caches key on the ledger (hundreds of items for a ZeRO-3 cell)
        return hash((self.items, self.notes))

    @functools.cached_property
    def bytes_per_step(self) -> float:
        """Collective bytes per step (B)."""
        return float(sum(it.bytes for it in self.items))

    def summary(self) -> dict:
        by_coll: dict[str, dict] = {}
        by_group: dict[str, dict] = {}
        for it in self.items:
            c = by_coll.setdefault(it.collective, {"calls": 0.0, "bytes": 0.0, "dtypes": {}})
            c["calls"] += it.calls
            c["bytes"] += it.bytes
            c["dtypes"][it.dtype] = c["dtypes"].get(it.dtype, 0.0) + it.bytes
            g = by_group.setdefault(it.group, {"calls": 0.0, "bytes": 0.0})
            g["calls"] += it.calls
            g["bytes"] += it.bytes
        for c in by_coll.values():
            c["dtype"] = max(c["dtypes"], key=c["dtypes"].get)
        total = sum(it.bytes for it in self.items)
        return {
            "comm_bytes_per_step": float(total),
            "bytes_per_step": float(total),  # the name harness.plan.predict reads
            "calls_per_step": float(sum(it.calls for it in self.items)),
            "by_collective": by_coll,
            "by_group": by_group,
            "items": [
                {
                    "what": it.what,
                    "collective": it.collective,
                    "dtype": it.dtype,
                    "bytes_per_call": it.bytes_per_call,
                    "calls": it.calls,
                    "bytes": it.bytes,
                    "group": it.group,
                }
                for it in self.items
            ],
            "notes": list(self.notes),
        }


@dataclass(frozen=True)
class CommCell:
    """Exactly what a cell without tensor or pipeline parallelism issues its collectives from: the collective models
    take this, not the RunSpec, so its ledger is cached on it and shared by cells that differ in nothing it holds
    (micro-batch, sequence, steps, seed), and a setting it does not hold cannot reach a model unseen."""

    model_config: ModelConfig
    strategy: str
    precision: str
    gpus: int
    gpus_per_node: int
    grad_accum: int
    checkpointing: bool
    """activation checkpointing (full or selective): ZeRO-3's module trace includes the recompute"""
    offload: str
    zero3: Zero3Config
    """the ZeRO-3 knobs (the module's `ZERO3` when the cell was taken, with its `deepspeed_config`'s values)"""
    reduce_bucket: int
    """ZeRO-1/2's reduce_bucket_size (elements): DeepSpeed's default or the cell's `deepspeed_config`'s"""
    wrap_blocks: int = 1
    """FSDP: blocks per wrap unit (0: the whole model one unit; harness.plan.wrap)"""
    reshard_after_forward: bool = True
    """FSDP2: whether a unit's parameters are freed after its forward (gathered again in backward)"""
    bucket_cap_mb: float = SETTING_DEFAULTS["bucket_cap_mb"]
    """DDP: the bucket cap (MiB); its default is torch's (first bucket 1 MiB)"""
    prefetch: str = ""
    """how the FSDP units' all-gathers are issued ahead, when not the default (`fsdp_prefetch`): the overlap model
    reads it from the ledger's wording"""

    @classmethod
    def of(cls, spec: RunSpec) -> CommCell:
        s = spec.settings
        return cls(
            model_config=spec.model_config,
            strategy=spec.strategy,
            precision=spec.precision,
            gpus=spec.gpus,
            gpus_per_node=spec.gpus_per_node,
            grad_accum=s.grad_accum,
            checkpointing=s.checkpointing,
            offload=s.offload,
            zero3=zero3_config(spec),
            reduce_bucket=deepspeed_config.zero_value(spec, "zero_optimization.reduce_bucket_size"),
            wrap_blocks=s.wrap_blocks,
            reshard_after_forward=s.reshard_after_forward,
            bucket_cap_mb=s.bucket_cap_mb,
            prefetch=fsdp_prefetch(spec),
        )


# --------------------------------------------------------------------------------------------------
# DDP


DDP_DEFAULT_LIMITS = (DDP_FIRST_BUCKET_BYTES, DDP_BUCKET_CAP_BYTES)
"""(first bucket, every other bucket) in bytes at torch's default (the worker passes bucket_cap_mb=None)"""


def ddp_limits(bucket_cap_mb: float) -> tuple[int, int]:
    """(first bucket, every other bucket) limits in bytes of DDP with the `bucket_cap_mb` setting: torch's default
    (1 MiB, then 25 MiB) at the setting's default, else the cap for every bucket, the first too (torch 2.13
    `_BucketCapacityConfig.create`: an explicit bucket_cap_mb is also the first bucket's cap)."""
    if bucket_cap_mb == SETTING_DEFAULTS["bucket_cap_mb"]:
        return DDP_DEFAULT_LIMITS
    cap = int(bucket_cap_mb * 1024 * 1024)
    return cap, cap


def ddp_buckets(sizes_bytes: list[int], limits: tuple[int, int] = DDP_DEFAULT_LIMITS) -> list[int]:
    """Bytes per DDP bucket: `compute_bucket_assignment_by_size` over gradients in ready order, a bucket
    closing once it reaches its limit (`limits`: the first's, then every other's; `ddp_limits`); one dtype, one
    device."""
    buckets, cur, li = [], 0, 0
    for b in sizes_bytes:
        cur += b
        if cur >= limits[min(li, len(limits) - 1)]:
            buckets.append(cur)
            cur, li = 0, li + 1
    if cur:
        buckets.append(cur)
    return buckets


@functools.cache
def ddp_sizes(
    cfg: ModelConfig, limits: tuple[int, int] = DDP_DEFAULT_LIMITS
) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(fp32 gradient bytes in ready order, bytes per bucket) of DDP over the model, with bucket `limits`."""
    sizes = [n * 4 for n in reversed(param_numels(cfg))]
    return tuple(sizes), tuple(ddp_buckets(sizes, limits))


def _ddp(*, model_config: ModelConfig, bucket_cap_mb: float, g: Groups, led: LedgerBuilder) -> None:
    # gradients become ready in reverse registration order (head first, embedding last); DDP rebuilds its
    # buckets in that order after the first step, so measured steps see these buckets
    first, cap = limits = ddp_limits(bucket_cap_mb)
    sizes, buckets = ddp_sizes(model_config, limits)
    for i, b in enumerate(buckets):
        led.add(f"gradient bucket {i} (fp32)", "all_reduce", "float32", b, group=g.world)
    led.notes.append(
        f"DDP: {len(buckets)} bucket(s) of fp32 gradients (all {sum(sizes)} bytes; first bucket {first} bytes, then "
        f"{cap}), once per step; autocast keeps fp32 parameters so bf16/fp16 change nothing"
    )


# --------------------------------------------------------------------------------------------------
# FSDP1


def fsdp1_flat_numel(unit: list[Param], *, shard_size: int, param_dtype_bytes: int) -> int:
    """Numel of a unit's padded FlatParameter: with use_orig_params every parameter starts at a 16-byte
    boundary of the forward dtype (padding inserted before it), then the total is padded to a multiple of
    the shard-group size (FlatParamHandle._init_flat_param_and_metadata)."""
    return _flat_numel(tuple(p.numel for p in unit), shard_size, param_dtype_bytes)


@functools.cache
def _flat_numel(numels: tuple[int, ...], shard_size: int, param_dtype_bytes: int) -> int:
    # NOTE: cached per numel sequence: every block of a model has the same one
    aligned = FSDP_ALIGNMENT_BYTES // param_dtype_bytes
    total = 0
    for n in numels:
        if total % aligned:
            total += aligned - total % aligned
        total += n
    if total % shard_size:
        total += shard_size - total % shard_size
    return total


def _fsdp1(
    *,
    model_config: ModelConfig,
    strategy: str,
    precision: str,
    grad_accum: int,
    offload: str,
    wrap_blocks: int,
    prefetch: str,
    g: Groups,
    led: LedgerBuilder,
) -> None:
    entry = CATALOGUE[strategy]
    s = strategy.split(".", 1)[1]  # the ShardingStrategy's name, for the notes
    sharded = entry.shards
    prec = precision
    pdt = precisions.get(prec).dtype  # MixedPrecision(param_dtype=compute dtype) for bf16/fp16; none for fp32
    pbytes = DTYPE_BYTES[pdt]
    accum = grad_accum
    if g.shard_size == 1 and g.replicate is None and sharded:
        # FSDP1 turns every strategy into NO_SHARD on a one-rank group (and still all_reduces on it)
        led.notes.append(f"FSDP1 {s} at world 1 runs as NO_SHARD")
        s, sharded = "no_shard", False
    reshard_after_forward = entry.reshard_after_forward
    ahead = f" [{prefetch}]" if prefetch else ""
    for name, numels in unit_numels(model_config, wrap_blocks):
        flat = _flat_numel(numels, g.shard_size, pbytes)
        pad = flat - sum(numels)
        label = f"unit {name} ({flat} elements, {pad} padding)"
        if sharded:
            if reshard_after_forward:
                # the root is not resharded after forward (it would be gathered again at once); the
                # others are, and every unit is freed after backward, so each micro-step gathers again
                per_micro = 1 if name == "root" else 2
                led.add(
                    f"all_gather {label}{ahead}, forward{'' if name == 'root' else ' + backward'}",
                    "all_gather",
                    pdt,
                    flat * pbytes,
                    per_micro * accum,
                    group=g.shard,
                )
            else:
                # SHARD_GRAD_OP: no reshard after forward, and none after a no_sync backward either
                led.add(
                    f"all_gather {label}, first forward of the step", "all_gather", pdt, flat * pbytes, 1, group=g.shard
                )
            led.add(f"reduce_scatter gradient {label}, fp32", "reduce_scatter", "float32", flat * 4, 1, group=g.shard)
            if g.replicate is not None:
                led.add(
                    f"all_reduce gradient shard of {label} across nodes",
                    "all_reduce",
                    "float32",
                    flat // g.shard_size * 4,
                    1,
                    group=g.replicate,
                )
        else:
            led.add(f"all_reduce gradient {label}, fp32", "all_reduce", "float32", flat * 4, 1, group=g.world)
    if precisions.get(prec).loss_scaling:
        led.add("ShardedGradScaler found_inf", "all_reduce", "float32", 4, 1, group=g.world)
    if offload != "none":
        led.notes.append(
            "FSDP1 CPUOffload: the same collectives (the shard is copied to the device before the "
            "all_gather, the reduced shard back after the reduce_scatter); not measured here, CPUOffload "
            "needs an accelerator"
        )
    led.notes.append(
        f"FSDP1 {s}: flat parameters padded to {FSDP_ALIGNMENT_BYTES}-byte alignment of {pdt} and to a "
        f"multiple of {g.shard_size}; gathered in {pdt}, gradients reduced in fp32"
    )
    if wrap_blocks != 1:
        led.notes.append(wrap_note(wrap_blocks))


# --------------------------------------------------------------------------------------------------
# FSDP2


def fsdp2_padded_numel(p: Param, *, shard_size: int) -> int:
    """Numel of a parameter with dim 0 padded to a multiple of the shard-group size (Shard(0) + padding)."""
    d0 = -(-p.shape[0] // shard_size) * shard_size
    return d0 * math.prod(p.shape[1:])


@functools.cache
def _fsdp2_units(cfg: ModelConfig, shard_size: int, wrap_blocks: int = 1) -> tuple[tuple[str, int, int], ...]:
    """(group, padded elements, padding) per FSDP2 group of the model over `shard_size` ranks."""
    out = []
    for name, unit in model_units(cfg, wrap_blocks):
        numel = sum(fsdp2_padded_numel(p, shard_size=shard_size) for p in unit)
        out.append((name, numel, numel - sum(p.numel for p in unit)))
    return tuple(out)


def wrap_note(wrap_blocks: int) -> str:
    """The ledger's note on a cell's wrap units (wrap_blocks other than 1)."""
    if wrap_blocks == 0:
        return "wrap_blocks 0: the whole model is one FSDP unit (the root): one all-gather and one reduction of it"
    return (
        f"wrap_blocks {wrap_blocks}: {wrap_blocks} consecutive blocks per FSDP unit, named after its first block: one "
        "all-gather and one reduction per unit"
    )


def _fsdp2(
    *,
    model_config: ModelConfig,
    precision: str,
    grad_accum: int,
    wrap_blocks: int,
    reshard_after_forward: bool,
    prefetch: str,
    g: Groups,
    led: LedgerBuilder,
) -> None:
    prec = precision
    pdt = precisions.get(prec).dtype  # MixedPrecisionPolicy(param_dtype=compute dtype), reduce fp32
    pbytes = DTYPE_BYTES[pdt]
    accum = grad_accum
    if g.shard_size == 1 and g.replicate is None:
        led.notes.append("FSDP2 at world 1 issues no collective (all_gather and reduce_scatter are skipped)")
        return
    ahead = f" [{prefetch}]" if prefetch else ""
    for name, numel, pad in _fsdp2_units(model_config, g.shard_size, wrap_blocks):
        label = f"group {name} ({numel} elements, {pad} padding)"
        if reshard_after_forward:
            # NOTE: reshard_after_forward=True is passed explicitly, which turns off FSDP2's "root is not
            # resharded after forward" default: the root is gathered in backward again like every Block
            when, per_micro = "forward + backward", 2
        else:
            # kept gathered from the forward to the backward; resharded after the backward (reshard_after_backward
            # stays on), so every micro-step gathers once
            when, per_micro = "forward", 1
        gather = f"all_gather {label}{ahead}, {when}"
        led.add(gather, "all_gather", pdt, numel * pbytes, per_micro * accum, group=g.shard)
        led.add(f"reduce_scatter gradient {label}, fp32", "reduce_scatter", "float32", numel * 4, 1, group=g.shard)
        if g.replicate is not None:
            led.add(
                f"all_reduce gradient shard of {label} across nodes",
                "all_reduce",
                "float32",
                numel // g.shard_size * 4,
                1,
                group=g.replicate,
            )
    if precisions.get(prec).loss_scaling:
        led.add("ShardedGradScaler found_inf", "all_reduce", "float32", 4, 1, group=g.world)
    led.notes.append(
        f"FSDP2: dim 0 of every parameter padded to a multiple of {g.shard_size}; gathered in {pdt} "
        + ("twice per micro-step (root included)" if reshard_after_forward else "once per micro-step "
           "(reshard_after_forward false: no all-gather in backward)")
        + ", gradients reduced in fp32"
    )  # fmt: skip
    if wrap_blocks != 1:
        led.notes.append(wrap_note(wrap_blocks))


# --------------------------------------------------------------------------------------------------
# DeepSpeed


@functools.cache
def _zero12_buckets(cfg: ModelConfig, stage: int, cap: int = DS_REDUCE_BUCKET_ELEMS) -> tuple[int, ...]:
    """Elements per ZeRO-1/2 gradient bucket of at most `cap` elements (reduce_bucket_size; a larger gradient is
    a bucket of its own)."""
    # ZeRO-1 reduces at the accumulation boundary, walking the parameter group in order; ZeRO-2 reduces
    # from gradient hooks (reverse registration order) on every micro-step
    order = list(param_numels(cfg)) if stage == 1 else list(reversed(param_numels(cfg)))
    return tuple(sum(order[i] for i in b) for b in ds_ipg_buckets(order, cap=cap))


def _zero12(
    *,
    model_config: ModelConfig,
    strategy: str,
    precision: str,
    gpus: int,
    grad_accum: int,
    reduce_bucket: int,
    g: Groups,
    led: LedgerBuilder,
) -> None:
    stage = int(strategy[-1])
    prec = precision
    dt = precisions.get(prec).dtype  # the model dtype: parameters, gradients and communication
    eb = DTYPE_BYTES[dt]
    w = gpus
    accum = grad_accum
    numel = sum(param_numels(model_config))
    align = DS_NCCL_START_ALIGNMENT * w
    flat = -(-numel // align) * align
    buckets = _zero12_buckets(model_config, stage, reduce_bucket)
    per_step = 1 if stage == 1 else accum
    for i, b in enumerate(buckets):
        led.add(
            f"gradient bucket {i} ({b} elements), whole (use_multi_rank_bucket_allreduce)",
            "all_reduce",
            dt,
            b * eb,
            per_step,
            group=g.world,
        )
    if precisions.get(prec).mixed:  # check_grad_overflow: bf16 config default True, fp16 always
        led.add("overflow flag", "all_reduce", "uint8", 1, 1, group=g.world)
    led.add("gradient norm (one per parameter group)", "all_reduce", "float32", 4, 1, group=g.world)
    if w > 1:
        led.add(
            f"all_gather updated flat {dt} buffer ({flat} elements, {flat - numel} padding)",
            "all_gather",
            dt,
            flat * eb,
            1,
            group=g.world,
        )
    led.notes.append(
        f"ZeRO-{stage}: gradients all_reduced whole in {dt} ({len(buckets)} bucket(s) of <= "
        f"{reduce_bucket:.0e} elements{', every micro-step' if stage == 2 else ''}); flat "
        f"buffer padded to a multiple of {align}"
    )


def _zero3(
    *,
    model_config: ModelConfig,
    precision: str,
    gpus: int,
    grad_accum: int,
    checkpointing: bool,
    zero3: Zero3Config,
    g: Groups,
    led: LedgerBuilder,
) -> None:
    prec = precision
    dt = precisions.get(prec).dtype
    eb = DTYPE_BYTES[dt]
    w = gpus
    accum = grad_accum
    conf = zero3
    st = zero3_structure(model_config, w, conf, checkpointing)
    if w > 1:
        for phase, k, n_idx, n_elem in st.gathers:
            led.add(
                f"all_gather #{k} issued in {phase}, {n_idx} parameter(s) ({n_elem} elements)",
                "all_gather",
                dt,
                n_elem * eb,
                accum,
                group=g.world,
            )
        if st.regathered:
            led.notes.append(
                f"ZeRO-3: {st.regathered} parameter(s) lie beyond stage3_max_reuse_distance and are "
                "gathered again in backward"
            )
        for name, padded in st.persistent:
            led.add(f"persistent {name} gathered after the step", "all_gather", dt, padded * eb, 1, group=g.world)
    for k, numel in enumerate(st.buckets):
        led.add(
            f"gradient bucket {k} reduce_scatter_coalesced ({numel} elements)",
            "reduce_scatter",
            dt,
            numel * eb,
            accum,
            group=g.world,
        )
    if precisions.get(prec).loss_scaling:
        led.add("overflow flag", "all_reduce", "uint8", 1, 1, group=g.world)
    led.add(
        f"gradient norm (fp64, one per optimizer sub-group: {st.sub_groups})",
        "all_reduce",
        "float64",
        8,
        st.sub_groups,
        group=g.world,
    )
    led.notes.append(
        f"ZeRO-3: {len(st.persistent)} of {st.n_params} parameters persistent (<= {conf.persistence_threshold} "
        f"elements), gathered once after the step; gradients reduce_scattered in {dt}"
    )


# --------------------------------------------------------------------------------------------------


COMM_MODELS: dict[str, Callable[..., None]] = {
    "ddp": _ddp,
    "fsdp1": _fsdp1,
    "fsdp2": _fsdp2,
    "zero12": _zero12,
    "zero3": _zero3,
}
"""a catalogue entry's `comm_model` → the function that writes its collectives into the ledger (`led`), given the
cell's groups (`g`) and, as keyword arguments, the CommCell fields its signature names: what it reads, and so what
its ledger is cached on (`model_reads`)"""
OFFLOAD_NOT_MODELLED = {
    "zero12": "DeepSpeed CPU offload reduces and norms gradients on other code paths, not modelled",
    "zero3": "DeepSpeed CPU offload reduces and norms gradients on other code paths, not modelled",
}
"""comm models whose CPU offload cells issue other collectives than the model counts → why"""


def no_comm_model_reason(spec: RunSpec, *, unsupported: str | None | runnable.Unasked = runnable.UNASKED) -> str | None:
    """Why `predict_comm` returns None for this cell (no collective model applies), or None when it can model it.

    Not `RunSpec.unsupported_reason`, which says why a cell cannot run at all (one of the reasons here): the caller
    hands its answer down as `unsupported` where it has asked (harness.plan.runnable), else it is asked here, once."""
    s = spec.settings
    cannot_run = runnable.unsupported_reason(spec, unsupported)
    if cannot_run is not None:
        return f"the cell cannot run: {cannot_run}"
    entry = CATALOGUE.get(spec.strategy)
    if entry is None or entry.comm_model not in COMM_MODELS:
        return f"no collective model for strategy {spec.strategy!r}"
    if entry.mesh == HYBRID and spec.gpus_per_node == 1:
        return "a hybrid with one rank per node has a one-rank shard group: FSDP's fallback there is not measured"
    if s.offload != "none" and entry.comm_model in OFFLOAD_NOT_MODELLED:
        return OFFLOAD_NOT_MODELLED[entry.comm_model]
    unmodelled = deepspeed_config.unmodelled_keys(spec)
    if unmodelled:
        return f"deepspeed_config sets {', '.join(unmodelled)}, which the collective model does not model"
    return None


def fsdp_prefetch(spec: RunSpec) -> str:
    """How an FSDP cell's all-gathers are issued ahead when not as the overlap model assumes by default (one unit
    ahead in forward and backward), in the ledger's words, or '': FSDP1 without backward prefetch (backward_post
    issues the next unit's all-gather after the current unit's gradients, none when it is needed), FSDP2 with
    prefetch_units N > 1. (FSDP1's forward_prefetch and limit_all_gathers issue the same all-gathers, one unit
    ahead as the CPU runs ahead anyway: priced as the default.)"""
    entry, s = CATALOGUE.get(spec.strategy), spec.settings
    if entry is None:
        return ""
    if entry.family == "fsdp" and s.backward_prefetch != "backward_pre":
        return f"{BACKWARD_NOT_PREFETCHED} ({s.backward_prefetch})"
    if entry.family == "fsdp2" and s.prefetch_units > 1:
        return f"prefetched {s.prefetch_units} units ahead"
    return ""


BACKWARD_NOT_PREFETCHED = "backward all-gather not prefetched"
"""the ledger's words for an FSDP1 cell whose backward all-gathers are issued when needed (harness.plan.overlap)"""


def predict_comm(spec: RunSpec) -> dict | None:
    """Predicted collectives per optimizer step on rank 0: bytes, calls, by collective and group kind.

    Returns {"comm_bytes_per_step", "bytes_per_step" (same), "calls_per_step", "by_collective": {name:
    {"calls", "bytes", "dtype", "dtypes"}}, "by_group": {kind: {"calls", "bytes"}}, "items": the ledger,
    "notes": [...]}, or None where `no_comm_model_reason(spec)` says why no model applies.
    """
    if no_comm_model_reason(spec) is not None:
        return None
    return ledger(spec).summary()


def ledger(spec: RunSpec) -> Ledger:
    """The cell's ledger (for a cell `no_comm_model_reason` accepts): a cell without tensor or pipeline parallelism
    from its `CommCell` (shared by every cell of the same one), a layout cell from its spec (harness.plan.layouts)."""
    if spec.layout.is_default:
        return plain_ledger(CommCell.of(spec))
    return layout_ledger(spec)


def ledger_bytes(spec: RunSpec, *, unsupported: str | None | runnable.Unasked = runnable.UNASKED) -> float | None:
    """Collective bytes per step of the cell (predict_comm's `bytes_per_step`), None where no model applies;
    `unsupported` as `no_comm_model_reason` takes it."""
    if no_comm_model_reason(spec, unsupported=unsupported) is not None:
        return None
    return ledger(spec).bytes_per_step


@functools.cache
def model_reads(comm_model: str) -> tuple[str, ...]:
    """The CommCell fields the collective model `comm_model` reads: its keyword parameters but the groups and the
    ledger (its signature is the list: a model cannot read a field it does not name)."""
    return tuple(p for p in inspect.signature(COMM_MODELS[comm_model]).parameters if p not in ("g", "led"))


def plain_ledger(cell: CommCell) -> Ledger:
    """The collectives of a cell without tensor or pipeline parallelism: its catalogue entry's collective model,
    cached on exactly what that model reads (a DDP ledger is shared by every precision and accumulation)."""
    model = CATALOGUE[cell.strategy].comm_model
    return model_ledger(model, groups_for(cell), tuple((k, getattr(cell, k)) for k in model_reads(model)))


@functools.cache
def model_ledger(comm_model: str, groups: Groups, reads: tuple[tuple[str, object], ...]) -> Ledger:
    """The ledger the collective model `comm_model` writes for `groups` and the (field, value) pairs it reads."""
    led = LedgerBuilder()
    COMM_MODELS[comm_model](g=groups, led=led, **dict(reads))
    return led.build()


@functools.cache
def layout_ledger(spec: RunSpec) -> Ledger:
    """The collectives of a tensor- or pipeline-parallel cell (harness.plan.layouts), as a ledger."""
    limits = ddp_limits(spec.settings.bucket_cap_mb)
    items, notes = layouts.layout_ledger(spec, item=Item, ddp_buckets=functools.partial(ddp_buckets, limits=limits))
    return Ledger(items=tuple(items), notes=tuple(notes))


def clear_caches() -> None:
    """Forget every ledger and per-model structure (tests compare cold and warm predictions)."""
    zero3.clear_caches()
    wrap.clear_caches()
    for f in (
        unit_numels,
        param_numels,
        _groups,
        model_reads,
        ddp_sizes,
        _flat_numel,
        _fsdp2_units,
        _zero12_buckets,
        model_ledger,
        layout_ledger,
    ):
        f.cache_clear()
