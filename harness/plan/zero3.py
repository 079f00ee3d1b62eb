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


def _module_params(cfg: ModelConfig) -> dict[str, tuple[int, ...]]:
    """Each module's own parameters (indices into `parameters(cfg)`), as DeepSpeed fetches them: a module's direct
    parameters in one call. A tied head's weight is the embedding's (index 0): the head module fetches it."""
    out: dict[str, list[int]] = {}
    for i, p in enumerate(parameters(cfg)):
        out.setdefault(p.name.rsplit(".", 1)[0], []).append(i)
    if cfg.tied_embeddings:
        out["head"] = [0] + out.get("head", [])
    return {m: tuple(idx) for m, idx in out.items()}


def _block_children(cfg: ModelConfig) -> list[tuple[str, list[str]]]:
    """A block's submodules in call order, each with its own children in call order."""
    attn = ["wq", "wk", "wv"] + (["q_norm", "k_norm"] if cfg.qk_norm != "none" else []) + ["wo"]
    mlp = ["w1"] + (["w3"] if cfg.gated else []) + ["w2"]
    return [(m, attn if m == "attn" else mlp if m == "mlp" else []) for m in cfg.block_modules()]


def zero3_module_trace(
    cfg: ModelConfig, *, checkpointing: bool = False
) -> tuple[list[tuple[str, tuple[int, ...]]], list[tuple[str, tuple[int, ...]]]]:
    """The modules DeepSpeed's hooks fetch for, in order, over one forward and one backward: (module, indices of
    the parameters it owns, empty for a container). Parameter-less modules (Transformer, Block, Attention, the
    MLP, the checkpoint wrapper) are in the trace too: every fetch runs the prefetcher.

    Forward runs the modules as they are called (= registered). Backward follows autograd: a module's pre-backward
    hook fires when its output's gradient is ready — the outermost module first, then its children in reverse
    (a block's MLP before its w2, w3 before w1 (created later in forward), the norm feeding both after them, wv
    before wk before wq). With activation checkpointing the block's forward runs again (every forward hook fires)
    when its first leaf's backward first unpacks a saved tensor.
    """
    found = cfg.module_trace(checkpointing)
    if found is not None:
        return found
    own = _module_params(cfg)

    def node(name: str) -> tuple[str, tuple[int, ...]]:
        return name, own.get(name, ())

    def block_fwd(i: int) -> list[tuple[str, tuple[int, ...]]]:
        u = f"blocks.{i}"
        out = [node(u)]
        for child, grand in _block_children(cfg):
            out.append(node(f"{u}.{child}"))
            out += [node(f"{u}.{child}.{g}") for g in grand]
        return out

    def block_bwd(i: int) -> list[tuple[str, tuple[int, ...]]]:
        u = f"blocks.{i}"
        out = [node(u)]
        for child, grand in reversed(_block_children(cfg)):
            out.append(node(f"{u}.{child}"))
            out += [node(f"{u}.{child}.{g}") for g in reversed(grand)]
        if not checkpointing:
            return out
        first_leaf = next(k for k, (_, idx) in enumerate(out) if idx)
        return [(f"{u}.ckpt", ())] + out[: first_leaf + 1] + block_fwd(i) + out[first_leaf + 1 :]

    roots_in = [node("tok_emb")] + ([node("pos_emb")] if cfg.positions == "learned" else [])
    fwd: list[tuple[str, tuple[int, ...]]] = [("model", ()), *roots_in]
    for i in range(cfg.n_layers):
        fwd += ([(f"blocks.{i}.ckpt", ())] if checkpointing else []) + block_fwd(i)
    fwd += [node("norm"), node("head")]
    bwd: list[tuple[str, tuple[int, ...]]] = [("model", ()), node("head"), node("norm")]
    for i in reversed(range(cfg.n_layers)):
        bwd += block_bwd(i)
    bwd += list(reversed(roots_in))
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
    queue = deque((pi, s) for s, (_, own) in enumerate(trace) for pi in own)
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

    for s, (_, own) in enumerate(trace):
        phase = "forward" if s < n_fwd else "backward"
        if own:
            missing = [pi for pi in own if not available[pi]]
            if missing:
                gather(phase, missing)
            for pi in own:
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
        for pi in own:
            if persist[pi] or recent[pi] > step:
                continue
            traversed = 0
            reused = False
            for _, later in trace[step:]:
                if traversed >= conf.max_reuse_distance:
                    break
                if pi in later:
                    reused = True
                    break
                traversed += sum(numel[m] for m in later)
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
