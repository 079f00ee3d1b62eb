"""Analytic collective accounting: the bytes and calls every strategy issues per optimizer step, per rank.

`predict_comm(spec)` builds a ledger, one line per kind of collective a strategy issues (what it is, c10d
collective, dtype, bytes per call, calls per step, process-group kind), from the exact parameter shapes of
`harness.worker.models.Transformer` and the exact configuration in `harness.worker.strategies.*`. Bytes follow the
convention of `harness.worker.meters.comm` (nccl-tests): the buffer for all_reduce, the whole output for
all_gather, the whole input for reduce_scatter; everything is what rank 0 sees (every rank is symmetric).

What each family does (torch 2.13, deepspeed 0.19; docs/comm.md has the formulas and measured tables):

- DDP: one all_reduce per gradient bucket (first bucket 1 MiB, then 25 MiB; grads fp32 in every precision,
  autocast keeps fp32 parameters), on the last micro-step only (no_sync before).
- FSDP1 (use_orig_params, one unit per Block + the root unit): a FlatParameter per unit, each parameter
  address-aligned to 16 bytes *of the forward dtype* (4 fp32 / 8 bf16 elements of padding at most) and
  the whole padded to a multiple of the shard-group size. all_gather of the flat parameter in the
  parameter dtype; reduce_scatter (all_reduce for NO_SHARD) of the flat gradient in fp32.
  FULL_SHARD re-gathers every non-root unit in backward (the root is not resharded after forward);
  SHARD_GRAD_OP keeps parameters until after the last micro-step's backward. HYBRID: shard inside the
  node, then all_reduce of the fp32 gradient shard across nodes.
- FSDP2 (fully_shard per Block + root, reshard_after_forward=True everywhere, so the root too is
  re-gathered in backward): each parameter's dim 0 padded to a multiple of the shard-group size.
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
  overflow all_reduce.
- World 1: DDP and DeepSpeed still reduce on the one-rank group; FSDP1 runs as NO_SHARD (all_reduce per
  unit); FSDP2 issues nothing.

Returns None (the reason: `no_comm_model_reason`) for cells that cannot run, DeepSpeed CPU offload (other
reduction and norm code paths, not measurable here) and hybrids with one rank per node (a one-rank shard
group: FSDP's fallback there is unmeasured). FSDP1 CPU offload is predicted (same collectives) but could
not be measured here: CPUOffload needs an accelerator.

No torch import: the planner calls this for every cell.
"""

from __future__ import annotations

import functools
import math
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import NamedTuple, cast

from harness.core.catalogue import CATALOGUE, HYBRID
from harness.core.constants import (
    DDP_BUCKET_CAP_MB,
    DDP_FIRST_BUCKET_BYTES,
    DS_MAX_LIVE_PARAMETERS,
    DS_MAX_REUSE_DISTANCE,
    DS_NCCL_START_ALIGNMENT,
    DS_PARAM_PERSISTENCE_THRESHOLD,
    DS_PREFETCH_BUCKET_ELEMS,
    DS_REDUCE_BUCKET_ELEMS,
    DS_SUB_GROUP_SIZE,
)
from harness.core.layout import group_kind
from harness.core.zoo import ModelConfig, Param, _parameters, parameters
from harness.plan import layouts
from harness.scenario.schema import RunSpec

DTYPE_BYTES = {"float64": 8, "float32": 4, "bfloat16": 2, "float16": 2, "uint8": 1}
PRECISION_DTYPE = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}

# DDP (torch.nn.parallel.DistributedDataParallel, harness.worker.strategies.ddp); the defaults and the DeepSpeed
# ones (DS_*) live in harness.core.constants with their source
DDP_BUCKET_CAP_BYTES = DDP_BUCKET_CAP_MB * 1024 * 1024
# FSDP1 FlatParameter address alignment (torch.distributed.fsdp._flat_param._get_aligned_numel)
FSDP_ALIGNMENT_BYTES = 16


@dataclass(frozen=True)
class Zero3Config:
    """The ZeRO-3 parameter-coordinator knobs (DeepSpeed's defaults; harness.worker.strategies.zero sets none)."""

    persistence_threshold: int = DS_PARAM_PERSISTENCE_THRESHOLD
    """stage3_param_persistence_threshold: parameters of at most this many elements stay resident (elements)"""
    max_reuse_distance: int = DS_MAX_REUSE_DISTANCE
    """stage3_max_reuse_distance: a parameter used again within this many trace elements is kept (elements)"""
    prefetch_bucket: int = DS_PREFETCH_BUCKET_ELEMS
    """stage3_prefetch_bucket_size: elements prefetched per fetch"""
    max_live: int = DS_MAX_LIVE_PARAMETERS
    """stage3_max_live_parameters: prefetch stops at this many available elements"""


ZERO3 = Zero3Config()


# --------------------------------------------------------------------------------------------------
# the model's parameters, exactly as harness.worker.models.Transformer registers them


def units(params: list[Param]) -> dict[str, list[Param]]:
    """FSDP units in wrapping order: one per Block, then the root (what no Block holds). Remembered for the model's
    cached parameter tuple (harness.core.zoo), which the planner passes for every cell: read it, never change it."""
    hit = _UNITS.get(id(params))
    if hit is not None and hit[0] is params:
        return hit[1]
    out = _units(params)
    if isinstance(params, tuple):
        _UNITS[id(params)] = (params, out)
    return out


_UNITS: dict[int, tuple[object, dict[str, list[Param]]]] = {}


@functools.lru_cache(maxsize=256)
def _unit_numels(cfg: ModelConfig) -> tuple[tuple[str, tuple[int, ...]], ...]:
    """(unit name, its parameters' numels in order) per FSDP unit of the model, in wrapping order (cached: planning
    asks per cell, and a 70B model has 723 parameters)."""
    return tuple((name, tuple(p.numel for p in unit)) for name, unit in _units(_parameters(cfg)).items())


@functools.lru_cache(maxsize=256)
def _numels(cfg: ModelConfig) -> tuple[int, ...]:
    """Every parameter's numel in registration order (cached per model)."""
    return tuple(p.numel for p in _parameters(cfg))


def _units(params: Sequence[Param]) -> dict[str, list[Param]]:
    out: dict[str, list[Param]] = {}
    for p in params:
        if p.unit != "root":
            out.setdefault(p.unit, []).append(p)
    out["root"] = [p for p in params if p.unit == "root"]
    return out


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


def groups_for(spec: RunSpec) -> Groups:
    w, gpn = spec.gpus, spec.gpus_per_node
    world = group_kind(list(range(w)), gpn)
    if CATALOGUE[spec.strategy].mesh == HYBRID:
        nodes = w // gpn
        return Groups(
            world=world,
            shard=group_kind(list(range(gpn)), gpn),
            replicate=group_kind([n * gpn for n in range(nodes)], gpn),
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
class Ledger:
    """Every collective a strategy issues per step, one Item per kind, and sentences on what was assumed."""

    items: list[Item] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def add(self, what: str, collective: str, dtype: str, bytes_per_call: int, calls: float = 1, *, group: str) -> None:
        if calls:  # NOTE: tuple.__new__, not Item(...): ~10^5 items per plan, and the NamedTuple's __new__ is Python
            self.items.append(_new(Item, (what, collective, dtype, int(bytes_per_call), float(calls), group, 0)))

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


# --------------------------------------------------------------------------------------------------
# DDP


def ddp_buckets(sizes_bytes: list[int]) -> list[int]:
    """Bytes per DDP bucket: `compute_bucket_assignment_by_size` over gradients in ready order, a bucket
    closing once it reaches its limit (1 MiB for the first, then the cap); one dtype, one device."""
    limits = [DDP_FIRST_BUCKET_BYTES, DDP_BUCKET_CAP_BYTES]
    buckets, cur, li = [], 0, 0
    for b in sizes_bytes:
        cur += b
        if cur >= limits[min(li, len(limits) - 1)]:
            buckets.append(cur)
            cur, li = 0, li + 1
    if cur:
        buckets.append(cur)
    return buckets


@functools.lru_cache(maxsize=256)
def _ddp_sizes(cfg: ModelConfig) -> tuple[list[int], list[int]]:
    """(fp32 gradient bytes in ready order, bytes per bucket) of DDP over the model (cached; read, never change)."""
    sizes = [n * 4 for n in reversed(_numels(cfg))]
    return sizes, ddp_buckets(sizes)


def _ddp(spec: RunSpec, *, params: list[Param], g: Groups, led: Ledger) -> None:
    # gradients become ready in reverse registration order (head first, embedding last); DDP rebuilds its
    # buckets in that order after the first step, so measured steps see these buckets
    sizes, buckets = _ddp_sizes(spec.model_config)
    for i, b in enumerate(buckets):
        led.add(f"gradient bucket {i} (fp32)", "all_reduce", "float32", b, group=g.world)
    led.notes.append(
        f"DDP: {len(buckets)} bucket(s) of fp32 gradients (all {sum(sizes)} bytes), once per step; "
        "autocast keeps fp32 parameters so bf16/fp16 change nothing"
    )


# --------------------------------------------------------------------------------------------------
# FSDP1


def fsdp1_flat_numel(unit: list[Param], *, shard_size: int, param_dtype_bytes: int) -> int:
    """Numel of a unit's padded FlatParameter: with use_orig_params every parameter starts at a 16-byte
    boundary of the forward dtype (padding inserted before it), then the total is padded to a multiple of
    the shard-group size (FlatParamHandle._init_flat_param_and_metadata)."""
    return _flat_numel(tuple(p.numel for p in unit), shard_size, param_dtype_bytes)


@functools.lru_cache(maxsize=4096)
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


def _fsdp1(spec: RunSpec, *, params: list[Param], g: Groups, led: Ledger) -> None:
    entry = CATALOGUE[spec.strategy]
    s = spec.strategy.split(".", 1)[1]  # the ShardingStrategy's name, for the notes
    sharded = entry.shards
    prec = spec.precision
    pdt = PRECISION_DTYPE[prec]  # MixedPrecision(param_dtype=compute dtype) for bf16/fp16; none for fp32
    pbytes = DTYPE_BYTES[pdt]
    accum = spec.settings.grad_accum
    if g.shard_size == 1 and g.replicate is None and sharded:
        # FSDP1 turns every strategy into NO_SHARD on a one-rank group (and still all_reduces on it)
        led.notes.append(f"FSDP1 {s} at world 1 runs as NO_SHARD")
        s, sharded = "no_shard", False
    reshard_after_forward = entry.reshard_after_forward
    for name, numels in _unit_numels(spec.model_config):
        flat = _flat_numel(numels, g.shard_size, pbytes)
        pad = flat - sum(numels)
        label = f"unit {name} ({flat} elements, {pad} padding)"
        if sharded:
            if reshard_after_forward:
                # the root is not resharded after forward (it would be gathered again at once); the
                # others are, and every unit is freed after backward, so each micro-step gathers again
                per_micro = 1 if name == "root" else 2
                led.add(
                    f"all_gather {label}, forward{'' if name == 'root' else ' + backward'}",
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
    if prec == "fp16":
        led.add("ShardedGradScaler found_inf", "all_reduce", "float32", 4, 1, group=g.world)
    if spec.settings.offload != "none":
        led.notes.append(
            "FSDP1 CPUOffload: the same collectives (the shard is copied to the device before the "
            "all_gather, the reduced shard back after the reduce_scatter); not measured here, CPUOffload "
            "needs an accelerator"
        )
    led.notes.append(
        f"FSDP1 {s}: flat parameters padded to {FSDP_ALIGNMENT_BYTES}-byte alignment of {pdt} and to a "
        f"multiple of {g.shard_size}; gathered in {pdt}, gradients reduced in fp32"
    )


# --------------------------------------------------------------------------------------------------
# FSDP2


def fsdp2_padded_numel(p: Param, *, shard_size: int) -> int:
    """Numel of a parameter with dim 0 padded to a multiple of the shard-group size (Shard(0) + padding)."""
    d0 = -(-p.shape[0] // shard_size) * shard_size
    return d0 * math.prod(p.shape[1:])


@functools.lru_cache(maxsize=1024)
def _fsdp2_units(cfg: ModelConfig, shard_size: int) -> tuple[tuple[str, int, int], ...]:
    """(group, padded elements, padding) per FSDP2 group of the model over `shard_size` ranks (cached)."""
    out = []
    for name, unit in _units(_parameters(cfg)).items():
        numel = sum(fsdp2_padded_numel(p, shard_size=shard_size) for p in unit)
        out.append((name, numel, numel - sum(p.numel for p in unit)))
    return tuple(out)


def _fsdp2(spec: RunSpec, *, params: list[Param], g: Groups, led: Ledger) -> None:
    prec = spec.precision
    pdt = PRECISION_DTYPE[prec]  # MixedPrecisionPolicy(param_dtype=compute dtype), reduce fp32
    pbytes = DTYPE_BYTES[pdt]
    accum = spec.settings.grad_accum
    if g.shard_size == 1 and g.replicate is None:
        led.notes.append("FSDP2 at world 1 issues no collective (all_gather and reduce_scatter are skipped)")
        return
    for name, numel, pad in _fsdp2_units(spec.model_config, g.shard_size):
        label = f"group {name} ({numel} elements, {pad} padding)"
        # NOTE: reshard_after_forward=True is passed explicitly, which turns off FSDP2's "root is not
        # resharded after forward" default: the root is gathered in backward again like every Block
        led.add(f"all_gather {label}, forward + backward", "all_gather", pdt, numel * pbytes, 2 * accum, group=g.shard)
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
    if prec == "fp16":
        led.add("ShardedGradScaler found_inf", "all_reduce", "float32", 4, 1, group=g.world)
    led.notes.append(
        f"FSDP2: dim 0 of every parameter padded to a multiple of {g.shard_size}; gathered in {pdt} "
        "twice per micro-step (root included), gradients reduced in fp32"
    )


# --------------------------------------------------------------------------------------------------
# DeepSpeed


def ds_ipg_buckets(numels: list[int], *, cap: int = DS_REDUCE_BUCKET_ELEMS) -> list[list[int]]:
    """DeepSpeed's independent-partition gradient buckets, as lists of positions in `numels` (the order
    gradients arrive in): a bucket is reduced before a gradient that would take it past `cap` elements is
    added, and at the end of backward."""
    buckets: list[list[int]] = []
    cur: list[int] = []
    total = 0
    for i, n in enumerate(numels):
        if cur and total + n > cap:
            buckets.append(cur)
            cur, total = [], 0
        cur.append(i)
        total += n
    if cur:
        buckets.append(cur)
    return buckets


@functools.lru_cache(maxsize=256)
def _zero12_buckets(cfg: ModelConfig, stage: int) -> list[int]:
    """Elements per ZeRO-1/2 gradient bucket (cached per model and stage; read, never change)."""
    # ZeRO-1 reduces at the accumulation boundary, walking the parameter group in order; ZeRO-2 reduces
    # from gradient hooks (reverse registration order) on every micro-step
    order = list(_numels(cfg)) if stage == 1 else list(reversed(_numels(cfg)))
    return [sum(order[i] for i in b) for b in ds_ipg_buckets(order)]


def _zero12(spec: RunSpec, *, params: list[Param], g: Groups, led: Ledger) -> None:
    stage = int(spec.strategy[-1])
    prec = spec.precision
    dt = PRECISION_DTYPE[prec]  # the model dtype: parameters, gradients and communication
    eb = DTYPE_BYTES[dt]
    w = spec.gpus
    accum = spec.settings.grad_accum
    numel = sum(_numels(spec.model_config))
    align = DS_NCCL_START_ALIGNMENT * w
    flat = -(-numel // align) * align
    buckets = _zero12_buckets(spec.model_config, stage)
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
    if prec in ("bf16", "fp16"):  # check_grad_overflow: bf16 config default True, fp16 always
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
        f"{DS_REDUCE_BUCKET_ELEMS:.0e} elements{', every micro-step' if stage == 2 else ''}); flat "
        f"buffer padded to a multiple of {align}"
    )


def zero3_module_trace(
    cfg: ModelConfig, *, checkpointing: bool = False
) -> tuple[list[tuple[str, int | None]], list[tuple[str, int | None]]]:
    """The modules DeepSpeed's hooks fetch for, in order, over one forward and one backward: (module, index
    of the one parameter it owns, or None). Parameter-less modules (Transformer, Block, Attention, SwiGLU,
    the checkpoint wrapper) are in the trace too: every fetch runs the prefetcher.

    Backward follows autograd: a module's pre-backward hook fires when its output's gradient is ready —
    the outermost module first, a block's SwiGLU before its w2, w3 before w1 (created later in forward),
    the norm feeding both after them, wv before wk before wq. With activation checkpointing the block's
    forward runs again (every forward hook fires) when w2's backward first unpacks a saved tensor.
    """

    def block_fwd(i: int) -> list[tuple[str, int | None]]:
        b, u = 1 + 9 * i, f"blocks.{i}"
        return [
            (u, None),
            (f"{u}.attn_norm", b),
            (f"{u}.attn", None),
            (f"{u}.attn.wq", b + 1),
            (f"{u}.attn.wk", b + 2),
            (f"{u}.attn.wv", b + 3),
            (f"{u}.attn.wo", b + 4),
            (f"{u}.mlp_norm", b + 5),
            (f"{u}.mlp", None),
            (f"{u}.mlp.w1", b + 6),
            (f"{u}.mlp.w3", b + 7),
            (f"{u}.mlp.w2", b + 8),
        ]

    def block_bwd(i: int) -> list[tuple[str, int | None]]:
        b, u = 1 + 9 * i, f"blocks.{i}"
        head = [(u, None), (f"{u}.mlp", None), (f"{u}.mlp.w2", b + 8)]
        rest = [
            (f"{u}.mlp.w3", b + 7),
            (f"{u}.mlp.w1", b + 6),
            (f"{u}.mlp_norm", b + 5),
            (f"{u}.attn", None),
            (f"{u}.attn.wo", b + 4),
            (f"{u}.attn.wv", b + 3),
            (f"{u}.attn.wk", b + 2),
            (f"{u}.attn.wq", b + 1),
            (f"{u}.attn_norm", b),
        ]
        if checkpointing:
            return [(f"{u}.ckpt", None)] + head + block_fwd(i) + rest
        return head + rest

    n = 1 + 9 * cfg.n_layers
    fwd: list[tuple[str, int | None]] = [("model", None), ("tok_emb", 0)]
    for i in range(cfg.n_layers):
        fwd += ([(f"blocks.{i}.ckpt", None)] if checkpointing else []) + block_fwd(i)
    fwd += [("norm", n), ("head", n + 1)]
    bwd: list[tuple[str, int | None]] = [("model", None), ("head", n + 1), ("norm", n)]
    for i in reversed(range(cfg.n_layers)):
        bwd += block_bwd(i)
    bwd.append(("tok_emb", 0))
    return fwd, bwd


@dataclass
class Zero3Trace:
    """What DeepSpeed's PartitionedParameterCoordinator gathers in one forward + backward (complete trace)."""

    gathers: list[tuple[str, list[int]]]
    """(phase the call is issued in, parameter indices) of every all_gather call, in order; a prefetch late
    in forward may already gather parameters for backward"""
    regathered: list[int]
    """indices of non-persistent parameters gathered twice (released after forward, needed in backward)"""


def zero3_trace(cfg: ModelConfig, *, conf: Zero3Config | None = None, checkpointing: bool = False) -> Zero3Trace:
    """The coordinator's gathers for `cfg` (`_zero3_trace`), cached per model, knobs and checkpointing: the trace
    does not depend on the world size, and planning simulates it once per model instead of once per cell. Shared
    between callers: read it, never change it."""
    return _zero3_trace_cached(cfg, conf or ZERO3, checkpointing)


@functools.lru_cache(maxsize=64)
def _zero3_trace_cached(cfg: ModelConfig, conf: Zero3Config, checkpointing: bool) -> Zero3Trace:
    return _zero3_trace(cfg, conf=conf, checkpointing=checkpointing)


def _zero3_trace(cfg: ModelConfig, *, conf: Zero3Config | None = None, checkpointing: bool = False) -> Zero3Trace:
    """Simulate the coordinator's fetch / prefetch / release over the module trace (a complete trace: the
    measured steps come after >= 2 warmup steps, the first records the trace, the second completes it).

    The rules are partitioned_param_coordinator.py's: at each module, gather its unavailable parameters
    (one call), pop its entries off the parameter queue, prefetch the next unavailable parameters of the
    queue up to `conf.prefetch_bucket` elements (one call, at most `conf.max_live` available), then — after
    the module ran — release its non-persistent parameters unless a prefetch already looked past their next
    use, or that use lies within `conf.max_reuse_distance` elements of the remaining module trace.
    """
    conf = conf or ZERO3
    params = parameters(cfg)
    numel = [p.numel for p in params]
    persist = [p.numel <= conf.persistence_threshold for p in params]
    fwd, bwd = zero3_module_trace(cfg, checkpointing=checkpointing)
    trace = fwd + bwd
    n_fwd = len(fwd)
    queue = deque((pi, s) for s, (_, pi) in enumerate(trace) if pi is not None)
    available = list(persist)  # persistent parameters were gathered after the previous step
    recent = [-(10**12)] * len(params)
    n_avail = 0
    gathers: list[tuple[str, list[int]]] = []
    times = [0] * len(params)

    def gather(phase: str, idx: list[int]) -> None:
        nonlocal n_avail
        gathers.append((phase, sorted(idx)))
        for i in idx:
            available[i] = True
            n_avail += numel[i]
            times[i] += 1

    for s, (_, pi) in enumerate(trace):
        phase = "forward" if s < n_fwd else "backward"
        if pi is not None:
            if not available[pi]:
                gather(phase, [pi])
            if recent[pi] < s:  # not popped by an earlier prefetch: its entry heads the queue
                q, t = queue.popleft()
                if q != pi:
                    raise RuntimeError(f"ZeRO-3 trace simulation out of order at step {s}")
                recent[q] = t
        budget = min(conf.max_live - n_avail, conf.prefetch_bucket)
        batch: list[int] = []
        taken = 0
        while queue and taken < budget:
            q, t = queue.popleft()
            if not available[q] and q not in batch:
                batch.append(q)
                taken += numel[q]
            recent[q] = max(recent[q], t)
        if batch:
            gather(phase, batch)
        step = s + 1
        if pi is None or persist[pi] or recent[pi] > step:
            continue
        traversed = 0
        reused = False
        for _, m in trace[step:]:
            if traversed >= conf.max_reuse_distance:
                break
            if m is None:
                continue
            if m == pi:
                reused = True
                break
            traversed += numel[m]
        if not reused:
            available[pi] = False
            n_avail -= numel[pi]
    return Zero3Trace(gathers=gathers, regathered=[i for i, t in enumerate(times) if t > 1])


def zero3_sub_groups(partition_numels: list[int], *, sub_group_size: int = DS_SUB_GROUP_SIZE) -> int:
    """How many optimizer sub-groups ZeRO-3 cuts the parameter group into (stage3._create_fp16_sub_groups):
    consecutive parameters until their per-rank partitions reach `sub_group_size` elements."""
    if sub_group_size >= sum(partition_numels):
        return 1
    groups, acc = 0, 0
    for i, n in enumerate(partition_numels):
        acc += n
        if acc >= sub_group_size or i == len(partition_numels) - 1:
            groups, acc = groups + 1, 0
    return groups


@dataclass(frozen=True)
class Zero3Structure:
    """What ZeRO-3's collectives are made of for a model, a world size and the coordinator's knobs, whatever the
    precision and the accumulation (cached: planning asks for every cell)."""

    gathers: tuple[tuple[str, int, int, int], ...]
    """(phase, index in the phase, parameters, padded elements) of every all_gather call (world > 1)"""
    regathered: int
    """non-persistent parameters gathered again in backward"""
    persistent: tuple[tuple[str, int], ...]
    """(name, padded elements) of each persistent parameter"""
    buckets: tuple[int, ...]
    """padded elements of each gradient bucket's reduce_scatter"""
    sub_groups: int
    n_params: int


@functools.lru_cache(maxsize=1024)
def zero3_structure(cfg: ModelConfig, w: int, conf: Zero3Config, checkpointing: bool) -> Zero3Structure:
    params = _parameters(cfg)
    padded = [-(-p.numel // w) * w for p in params]  # each parameter partitioned into ceil(numel / world)
    persistent = [i for i, p in enumerate(params) if p.numel <= conf.persistence_threshold]
    gathers: list[tuple[str, int, int, int]] = []
    regathered = 0
    if w > 1:
        tr = zero3_trace(cfg, conf=conf, checkpointing=checkpointing)
        for phase in ("forward", "backward"):
            calls = [idx for ph, idx in tr.gathers if ph == phase]
            for k, idx in enumerate(calls):
                gathers.append((phase, k, len(idx), sum(padded[i] for i in idx)))
        regathered = len(tr.regathered)
    # gradients reach the bucket from backward hooks, reverse registration order; the bucket threshold
    # counts unpadded elements, the reduce_scatter input pads every gradient to the world
    order = list(reversed(range(len(params))))
    buckets = tuple(sum(padded[order[j]] for j in b) for b in ds_ipg_buckets([params[i].numel for i in order]))
    return Zero3Structure(
        gathers=tuple(gathers),
        regathered=regathered,
        persistent=tuple((params[i].name, padded[i]) for i in persistent),
        buckets=buckets,
        sub_groups=zero3_sub_groups([pad // w for pad in padded]),
        n_params=len(params),
    )


def _zero3(spec: RunSpec, *, params: list[Param], g: Groups, led: Ledger) -> None:
    prec = spec.precision
    dt = PRECISION_DTYPE[prec]
    eb = DTYPE_BYTES[dt]
    w = spec.gpus
    accum = spec.settings.grad_accum
    conf = ZERO3
    st = zero3_structure(spec.model_config, w, conf, spec.settings.checkpointing)
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
    if prec == "fp16":
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


COMM_MODELS = {"ddp": _ddp, "fsdp1": _fsdp1, "fsdp2": _fsdp2, "zero12": _zero12, "zero3": _zero3}
"""a catalogue entry's `comm_model` → the function that writes its collectives into the ledger"""
OFFLOAD_NOT_MODELLED = {
    "zero12": "DeepSpeed CPU offload reduces and norms gradients on other code paths, not modelled",
    "zero3": "DeepSpeed CPU offload reduces and norms gradients on other code paths, not modelled",
}
"""comm models whose CPU offload cells issue other collectives than the model counts → why"""


def no_comm_model_reason(spec: RunSpec) -> str | None:
    """Why `predict_comm` returns None for this cell (no collective model applies), or None when it can model it.

    Not `RunSpec.unsupported_reason`, which says why a cell cannot run at all (one of the reasons here)."""
    s = spec.settings
    if spec.unsupported_reason() is not None:
        return f"the cell cannot run: {spec.unsupported_reason()}"
    entry = CATALOGUE.get(spec.strategy)
    if entry is None or entry.comm_model not in COMM_MODELS:
        return f"no collective model for strategy {spec.strategy!r}"
    if entry.mesh == HYBRID and spec.gpus_per_node == 1:
        return "a hybrid with one rank per node has a one-rank shard group: FSDP's fallback there is not measured"
    if s.offload != "none" and entry.comm_model in OFFLOAD_NOT_MODELLED:
        return OFFLOAD_NOT_MODELLED[entry.comm_model]
    return layouts.no_model_reason(spec)  # tensor / pipeline parallelism: harness.plan.layouts


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
    """The cell's ledger (for a cell `no_comm_model_reason` accepts), cached per everything it depends on: planning
    thousands of cells builds each model × strategy × size once. Shared between callers: read it, never change it."""
    return _ledger_entry(spec)[0]


def ledger_bytes(spec: RunSpec) -> float | None:
    """Collective bytes per step of the cell (predict_comm's `bytes_per_step`), None where no model applies."""
    if no_comm_model_reason(spec) is not None:
        return None
    return _ledger_entry(spec)[1]


def _ledger_entry(spec: RunSpec) -> tuple[Ledger, float]:
    last = _LAST
    if last[0] is spec and last[1] is ZERO3:  # the planner asks twice per cell (bytes, then the time model)
        return last[2]
    hit = _ledger_entry_of(spec)
    _LAST[:] = [spec, ZERO3, hit]
    return hit


def _ledger_entry_of(spec: RunSpec) -> tuple[Ledger, float]:
    s = spec.settings
    default_layout = s.tp == 1 and s.pp == 1
    key = (
        spec.model_config,
        spec.strategy,
        spec.precision,
        spec.gpus,
        spec.gpus_per_node,
        s.grad_accum,
        # only ZeRO-3's trace depends on checkpointing: the other models share one ledger for both
        s.checkpointing if not default_layout or CATALOGUE[spec.strategy].comm_model == "zero3" else None,
        s.offload,
        ZERO3,  # the coordinator's knobs (a test or a diagnosis may change them)
        () if default_layout else layouts.cache_key(spec),  # () without tensor/pipeline parallelism
    )
    hit = _LEDGERS.get(key)
    if hit is None:
        led = Ledger()
        if not default_layout:  # tensor / pipeline parallelism: harness.plan.layouts
            led.items, led.notes = layouts.layout_ledger(spec, item=Item, ddp_buckets=ddp_buckets)
        else:
            # NOTE: the cached tuple itself (not a copy): `units` remembers its split per model
            params = cast(list[Param], _parameters(spec.model_config))
            COMM_MODELS[CATALOGUE[spec.strategy].comm_model](spec, params=params, g=groups_for(spec), led=led)
        if len(_LEDGERS) > 65536:
            _LEDGERS.clear()
        hit = _LEDGERS[key] = (led, float(sum(it.bytes for it in led.items)))
    return hit


_LEDGERS: dict[tuple, tuple[Ledger, float]] = {}
_LAST: list = [None, None, None]
"""(spec, ZERO3, entry) of the last `_ledger_entry` call"""


def clear_caches() -> None:
    """Forget every ledger and per-model structure (tests compare cold and warm predictions)."""
    _LEDGERS.clear()
    _UNITS.clear()
    _LAST[:] = [None, None, None]
    for f in (_unit_numels, _numels, _flat_numel, _fsdp2_units, _zero12_buckets, _ddp_sizes, zero3_structure):
        f.cache_clear()
    _zero3_trace_cached.cache_clear()
