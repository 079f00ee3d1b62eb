"""DeepSpeed ZeRO-3's parameter coordinator, simulated: which all_gathers it issues over one forward and backward
(the module trace, prefetch, release and re-gather by reuse distance), its gradient buckets and optimizer
sub-groups. Exactly as partitioned_param_coordinator.py and stage3.py do it (deepspeed 0.19); harness.plan.comm's
ZeRO-3 collective model prices what this finds. Pure, no torch; every result cached on its frozen inputs.
"""

from __future__ import annotations

import functools
from collections import deque
from dataclasses import dataclass, replace

from harness.core.constants import (
    DS_MAX_LIVE_PARAMETERS,
    DS_MAX_REUSE_DISTANCE,
    DS_PARAM_PERSISTENCE_THRESHOLD,
    DS_PREFETCH_BUCKET_ELEMS,
    DS_REDUCE_BUCKET_ELEMS,
    DS_SUB_GROUP_SIZE,
)
from harness.core.zoo import ModelConfig, parameters


@dataclass(frozen=True)
class Zero3Config:
    """The ZeRO-3 knobs the collective model reads: DeepSpeed's defaults, or a cell's `deepspeed_config` values
    (harness.plan.comm.zero3_config)."""

    persistence_threshold: int = DS_PARAM_PERSISTENCE_THRESHOLD
    """stage3_param_persistence_threshold: parameters of at most this many elements stay resident (elements)"""
    max_reuse_distance: int = DS_MAX_REUSE_DISTANCE
    """stage3_max_reuse_distance: a parameter used again within this many trace elements is kept (elements)"""
    prefetch_bucket: int = DS_PREFETCH_BUCKET_ELEMS
    """stage3_prefetch_bucket_size: elements prefetched per fetch"""
    max_live: int = DS_MAX_LIVE_PARAMETERS
    """stage3_max_live_parameters: prefetch stops at this many available elements"""
    reduce_bucket: int = DS_REDUCE_BUCKET_ELEMS
    """reduce_bucket_size: a gradient bucket is reduced before it would pass this many elements"""
    sub_group_size: int = DS_SUB_GROUP_SIZE
    """sub_group_size: the optimizer steps sub-groups of this many elements (per rank)"""


ZERO3_KEYS: dict[str, str] = {
    "zero_optimization.stage3_param_persistence_threshold": "persistence_threshold",
    "zero_optimization.stage3_max_reuse_distance": "max_reuse_distance",
    "zero_optimization.stage3_prefetch_bucket_size": "prefetch_bucket",
    "zero_optimization.stage3_max_live_parameters": "max_live",
    "zero_optimization.reduce_bucket_size": "reduce_bucket",
    "zero_optimization.sub_group_size": "sub_group_size",
}
"""a DeepSpeed config's dotted key → the Zero3Config field it sets (harness.scenario.deepspeed_config.PRICED_KEYS)"""


DEFAULT = Zero3Config()
"""DeepSpeed's defaults, which the harness's ZeRO-3 cells run with"""


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


@dataclass(frozen=True)
class Zero3Trace:
    """What DeepSpeed's PartitionedParameterCoordinator gathers in one forward + backward (complete trace)."""

    gathers: tuple[tuple[str, tuple[int, ...]], ...]
    """(phase the call is issued in, parameter indices) of every all_gather call, in order; a prefetch late
    in forward may already gather parameters for backward"""
    regathered: tuple[int, ...]
    """indices of non-persistent parameters gathered twice (released after forward, needed in backward)"""


def zero3_trace(cfg: ModelConfig, *, conf: Zero3Config | None = None, checkpointing: bool = False) -> Zero3Trace:
    """The coordinator's gathers for `cfg` with the knobs `conf` (default: DeepSpeed's), cached per model, knobs and
    checkpointing: the trace does not depend on the world size, and planning simulates it once per model instead
    of once per cell."""
    conf = conf or DEFAULT
    # NOTE: the trace reads the coordinator's knobs only: one simulation for every bucket and sub-group size
    return simulate_zero3_trace(
        cfg, replace(conf, reduce_bucket=DEFAULT.reduce_bucket, sub_group_size=DEFAULT.sub_group_size), checkpointing
    )


@functools.cache
def simulate_zero3_trace(cfg: ModelConfig, conf: Zero3Config, checkpointing: bool) -> Zero3Trace:
    """Simulate the coordinator's fetch / prefetch / release over the module trace (a complete trace: the
    measured steps come after >= 2 warmup steps, the first records the trace, the second completes it).

    The rules are partitioned_param_coordinator.py's: at each module, gather its unavailable parameters
    (one call), pop its entries off the parameter queue, prefetch the next unavailable parameters of the
    queue up to `conf.prefetch_bucket` elements (one call, at most `conf.max_live` available), then — after
    the module ran — release its non-persistent parameters unless a prefetch already looked past their next
    use, or that use lies within `conf.max_reuse_distance` elements of the remaining module trace.
    """
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
    return Zero3Trace(
        gathers=tuple((ph, tuple(idx)) for ph, idx in gathers),
        regathered=tuple(i for i, t in enumerate(times) if t > 1),
    )


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


@functools.cache
def zero3_structure(cfg: ModelConfig, w: int, conf: Zero3Config, checkpointing: bool) -> Zero3Structure:
    """ZeRO-3's collectives for `cfg` over `w` ranks with the coordinator's knobs `conf`."""
    params = parameters(cfg)
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
    numels = [params[i].numel for i in order]
    buckets = tuple(sum(padded[order[j]] for j in b) for b in ds_ipg_buckets(numels, cap=conf.reduce_bucket))
    return Zero3Structure(
        gathers=tuple(gathers),
        regathered=regathered,
        persistent=tuple((params[i].name, padded[i]) for i in persistent),
        buckets=buckets,
        sub_groups=zero3_sub_groups([pad // w for pad in padded], sub_group_size=conf.sub_group_size),
        n_params=len(params),
    )


def clear_caches() -> None:
    """Forget every simulated trace and structure (tests compare cold and warm predictions)."""
    for f in (simulate_zero3_trace, zero3_structure):
        f.cache_clear()
