"""Analytic per-rank memory model for every strategy × precision × world size × offload ×
activation checkpointing cell. Pure arithmetic: no torch import (`harness plan` must stay fast).

Memory is predicted as bytes *allocated* by tensors on one rank at its peak, in five parts that add up
to that peak, and bytes of host memory for CPU offload:

    params       the parameters this rank keeps between steps (sharded, or full)
    grads        gradients allocated at the peak; `grads_after_backward` is their size once backward is done
                 (DDP's buckets and ZeRO-3's partition buffer live all the time; FSDP's shards and ZeRO-1/2's
                 gradients are freed by zero_grad/step and grow again during backward)
    optimizer    AdamW state: two fp32 moments per parameter, plus the fp32 master copy where the precision
                 keeps one apart from the parameters (DeepSpeed), sharded as the strategy shards it
    activations  tensors saved for backward and live at the peak (the zoo's Llama block with SDPA flash
                 attention, traced op by op: `ActivationModel`); under full checkpointing, each block's
                 input plus one block recomputed; under selective, each block's input and its matmul and
                 attention outputs, plus the rest of one block recomputed
    buffers      what the loss, the backward and the strategy hold transiently at the peak: the cross-entropy
                 gradient, gradients in flight, FSDP's gathered units and unsharded gradients, ZeRO's reduce
                 bucket, live parameters and fp32 gradient buffer, autocast's 16-bit weight copies (DDP)

The peak is the largest over the moments of a step (`WINDOWS`: forward end, loss backward, the first
block's backward and its reduction, the last block's backward, backward end, optimizer step); each strategy
says what it holds in each. No allocator fragmentation or caching is modelled: the prediction is
`max_memory_allocated`, not reserved. Whether a cell fits compares the total with the device's memory minus
`DEVICE_RESERVE_GIB`.

Units: bytes internally; GiB = 2**30 in every `*_gib` field; GB = 1e9 only where the users' arithmetic is
quoted. A cell's precision mode and its FLOPs are harness.plan.flops'.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from harness.core import precisions
from harness.core.catalogue import CATALOGUE, HYBRID
from harness.core.zoo import ModelConfig, parameters
from harness.plan import layouts, wrap
from harness.plan.activations import (
    BACKWARD_END,
    BLOCK_BACKWARD,
    BLOCK_REDUCE,
    FORWARD_END,
    HEAD_BACKWARD,
    LAST_BLOCK,
    LOSS_BACKWARD,
    OPTIMIZER_STEP,
    WINDOW_HELP,
    WINDOWS,
    ActivationModel,
    measured_windows,
)
from harness.plan.flops import precision_mode
from harness.scenario.deepspeed_config import unmodelled_keys, zero_value
from harness.scenario.spec import RunSpec

GIB = 2**30
GB = 1e9

DEVICE_RESERVE_GIB = 1.0
"""Device memory the allocator can never hand to tensors (GiB): the CUDA context with lazy module loading
(about 0.5 GiB on A100/H100 with CUDA 12: driver state, cuBLAS/cuDNN handles and kernels torch loads) and
NCCL's communicator buffers (NCCL_BUFFSIZE 4 MiB per channel and peer, a few hundred MiB for an 8-GPU
communicator). Both live outside torch's caching allocator, so they never show in `max_memory_allocated`
but do come out of `total_memory`. A cell fits when its predicted total <= device memory - this reserve."""

# NOTE: the DeepSpeed ZeRO defaults (DS_*) live in harness.core.constants with their source; the collective
# model (harness.plan.comm) uses the same ones, and both read a cell's `deepspeed_config` values instead where it
# sets them (harness.scenario.deepspeed_config.zero_value)
REDUCE_BUCKET = "zero_optimization.reduce_bucket_size"
PREFETCH_BUCKET = "zero_optimization.stage3_prefetch_bucket_size"
MAX_LIVE = "zero_optimization.stage3_max_live_parameters"
MAX_REUSE = "zero_optimization.stage3_max_reuse_distance"
PERSISTENCE = "zero_optimization.stage3_param_persistence_threshold"
SUB_GROUP = "zero_optimization.sub_group_size"


def _deepspeed_notes(spec: RunSpec, notes: dict[str, str]) -> None:
    """Say which of the cell's `deepspeed_config` keys the memory model prices and which it does not model."""
    user = spec.settings.deepspeed_config
    if user:
        skipped = unmodelled_keys(spec)
        notes["deepspeed_config"] = (
            "bucket, prefetch, persistence and sub-group sizes as the cell's config sets them"
            + (f"; not modelled: {', '.join(skipped)}" if skipped else "")
        )


FSDP_UNITS_IN_FLIGHT = 2
"""unsharded block units at once: FSDP1 limit_all_gathers lets one all-gather run ahead, and the default
BACKWARD_PRE prefetch gathers the next unit while the current one computes (FSDP2 prefetches likewise)"""


def fsdp_units_in_flight(spec: RunSpec) -> int:
    """Block units unsharded at once in a block's backward: the one computing and those gathered ahead of it. FSDP1's
    backward_prefetch backward_pre (its default) gathers the next one while the current computes; backward_post
    issues it only after the current unit is resharded, and none when it is needed, so one unit at a time. FSDP2
    gathers `prefetch_units` ahead (its implicit prefetch: one). FSDP_UNITS_IN_FLIGHT at the defaults; never more
    than the model's block units once they are groups (wrap_blocks, harness.plan.wrap)."""
    s = spec.settings
    if CATALOGUE[spec.strategy].family == "fsdp2":
        ahead = s.prefetch_units
    else:
        ahead = 1 if s.backward_prefetch == "backward_pre" else 0
    if s.wrap_blocks == 1:  # NOTE: every prediction made before wrap units keeps its figure (even for one block)
        return 1 + ahead
    return min(1 + ahead, wrap.wrap_summary(spec.model_config, s.wrap_blocks)[2])


# --------------------------------------------------------------------------------------------------
# parameters by module


def unit_numels(cfg: ModelConfig) -> dict[str, int]:
    """Elements per FSDP unit: 'root' and 'blocks.0'…'blocks.<L-1>' (a new dict: the caller's to change)."""
    return dict(unit_sizes(cfg))


@functools.cache
def unit_sizes(cfg: ModelConfig) -> tuple[tuple[str, int], ...]:
    """(unit, elements) per FSDP unit, in the order the parameters first name them (cached per model: the planner
    asks for every cell)."""
    units: dict[str, int] = {}
    for p in parameters(cfg):
        units[p.unit] = units.get(p.unit, 0) + p.numel
    return tuple(units.items())


@functools.cache
def unit_summary(cfg: ModelConfig) -> tuple[int, int]:
    """(largest block unit, root unit) in elements: what every FSDP cell of the model reads."""
    units = dict(unit_sizes(cfg))
    return max(v for k, v in units.items() if k != "root"), units["root"]


@functools.cache
def sharded_units(cfg: ModelConfig, nshard: int, wrap_blocks: int = 1) -> int:
    """Elements of one rank's FSDP1 flat-parameter shards: every unit (of `wrap_blocks` blocks, harness.plan.wrap)
    cut into `nshard` (rounded up), summed."""
    return sum(_ceil_div(u, nshard) for _, u in wrap.wrap_sizes(cfg, wrap_blocks))


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


# --------------------------------------------------------------------------------------------------
# per-strategy memory


@dataclass(frozen=True)
class Memory:
    """Predicted bytes on one rank's device at its peak (the five parts add up to it), and in host memory."""

    params: float
    grads: float
    optimizer: float
    activations: float
    buffers: float
    grads_after_backward: float = 0.0
    """gradient bytes on the device once backward is done (the users' "gradients" line)"""
    cpu: float = 0.0
    """host bytes per rank held for CPU offload (a node holds ranks-per-node times this)"""
    window: str = ""
    """the moment of the step the peak falls in (one of WINDOWS)"""
    window_totals: dict[str, float] = field(default_factory=dict, compare=False)
    """every moment's total (bytes): how far ahead of the next the peak is (a near tie means the categories at the
    measured peak may come from either moment, though the total does not change)"""
    notes: dict[str, str] = field(default_factory=dict, compare=False)
    """how each part was derived, keyed like the parts"""

    @property
    def total(self) -> float:
        return self.params + self.grads + self.optimizer + self.activations + self.buffers

    def gib(self) -> dict[str, float]:
        parts = {k: getattr(self, k) for k in ("params", "grads", "optimizer", "activations", "buffers")}
        parts["total"] = self.total
        return {k: v / GIB for k, v in parts.items()}


Held = dict[str, list[tuple[str, int]]]
"""window → [(what, bytes)] a strategy holds beyond parameters, gradients and optimizer state"""


def shard_degree(spec: RunSpec) -> int:
    """Ranks a parameter / gradient / optimizer shard is split over: the world, or one node for hybrids,
    or 1 for replicating strategies (the catalogue entry's `shards` and `mesh`)."""
    return shard_degree_of(spec.strategy, gpus=spec.gpus, gpus_per_node=spec.gpus_per_node)


def shard_degree_of(strategy: str, *, gpus: int, gpus_per_node: int) -> int:
    """`shard_degree` from what it reads: the strategy, the GPUs and the GPUs per node."""
    entry = CATALOGUE[strategy]
    if not entry.shards:
        return 1
    if entry.mesh == HYBRID:
        return min(gpus_per_node, gpus)
    return gpus


def memory(spec: RunSpec, *, device: str = "cuda") -> Memory:
    """The per-rank memory prediction for one cell (see the module docstring for what each part holds): the
    model its catalogue entry names (`memory_model`). `device`: the cluster's device type ('cuda' or 'cpu'), which
    decides how AdamW runs (`foreach_optimizer`)."""
    entry = CATALOGUE.get(spec.strategy)
    if entry is None or entry.memory_model not in MEMORY_MODELS:
        raise ValueError(f"no memory model for strategy {spec.strategy!r}")
    s = spec.settings
    if s.tp != 1 or s.pp != 1:  # tensor / pipeline parallelism: harness.plan.layouts
        out = Memory(**layouts.layout_memory(spec, foreach=foreach_optimizer(spec, device)))
    else:
        out = MEMORY_MODELS[entry.memory_model](spec, foreach_optimizer(spec, device))
    cfg = spec.model_config
    if cfg.data_vocab is not None and cfg.data_vocab != cfg.vocab:
        pad = (
            f"; vocabulary padded {cfg.data_vocab} → {cfg.vocab} (pad_vocab_multiple {s.pad_vocab_multiple} × tp "
            f"{s.tp}): {cfg.vocab - cfg.data_vocab} more embedding rows and head columns, counted here and in the "
            "FLOPs and bytes"
        )
        out = dataclasses.replace(out, notes={**out.notes, "params": out.notes.get("params", "") + pad})
    return out


def foreach_optimizer(spec: RunSpec, device: str) -> bool:
    """Whether AdamW steps this cell's device-resident state with torch's foreach implementation, which holds one
    temporary as large as the stepped parameters (`_foreach_sqrt(exp_avg_sq)`, fp32) through the step. The worker's
    rule (harness.worker.strategies.base.adamw_kwargs): fused on CUDA, foreach elsewhere and wherever a
    ShardedGradScaler drives the step (fp16 under FSDP1/FSDP2, and under every tensor- or pipeline-parallel layout:
    harness.worker.strategies.layouts.loss_scaler); an offloaded optimizer steps in host memory (DeepSpeedCPUAdam,
    or FSDP's CPU-offloaded shards)."""
    if spec.settings.offload != "none":
        return False
    family = CATALOGUE[spec.strategy].family
    sharded_scaler = spec.precision == "fp16" and (family in ("fsdp", "fsdp2") or not spec.layout.is_default)
    return device != "cuda" or sharded_scaler


def activation_model(spec: RunSpec) -> ActivationModel:
    s = spec.settings
    mode = precision_mode(spec.strategy, spec.precision)
    return ActivationModel(spec.model_config, mode, s.micro_batch * s.seq_len, seq_len=s.seq_len)


def _assemble(
    spec: RunSpec,
    *,
    params: int,
    grads: int,
    grads_persistent: bool,
    optimizer: int,
    held: Held,
    held_activations: Held | None = None,
    cpu: int = 0,
    notes: dict[str, str],
    foreach: bool = False,
    stepped: int = 0,
) -> Memory:
    """Pick the peak window: the one where activations + gradients present + held buffers is largest.
    `held_activations`: what a strategy's forward makes beyond the model's activations (autocast's weight copies),
    added to them. `foreach` (foreach_optimizer): the optimizer step also holds one fp32 temporary per `stepped`
    element.

    Gradients that are freed between steps (`grads_persistent` False) grow during backward: none before
    the first block's gradients, all but the root's and one block's in the last block's backward, all of
    them from backward end on.
    """
    s = spec.settings
    mode = precision_mode(spec.strategy, spec.precision)
    windows = activation_windows(
        spec.model_config, mode, s.micro_batch * s.seq_len, s.activation_checkpointing, seq_len=s.seq_len
    )
    fraction = grad_fractions(spec.model_config)
    best: tuple[int, str, int, int, list[tuple[str, int]]] | None = None
    totals: dict[str, float] = {}
    if foreach and stepped:
        held = {**held, OPTIMIZER_STEP: [*held.get(OPTIMIZER_STEP, []), ("AdamW foreach temporary", 4 * stepped)]}
    for window, model_activations, own in windows:
        made = (held_activations or {}).get(window, [])
        activations = model_activations + sum(b for _, b in made)
        present = grads if grads_persistent else int(grads * fraction.get(window, 0.0))
        extra = held.get(window)
        both = list(own) + extra if extra else list(own)
        live = activations + present + sum([b for _, b in both])
        totals[window] = params + optimizer + live
        if best is None or live > best[0]:
            best = (live, window, activations, present, both)
    assert best is not None
    _, window, activations, present, both = best
    items = [(w, b) for w, b in both if b]
    notes = dict(notes)
    made = [(w, b) for w, b in (held_activations or {}).get(window, []) if b]
    if made:
        notes["activations"] = "the model's saved tensors" + "".join(f"; {w} {b / GIB:.2f} GiB" for w, b in made)
    notes["buffers"] = f"peak at the {window} ({WINDOW_HELP[window]})" + "".join(
        f"; {w} {b / GIB:.2f} GiB" for w, b in items
    )
    return Memory(
        params=params,
        grads=present,
        optimizer=optimizer,
        activations=activations,
        buffers=sum(b for _, b in items),
        grads_after_backward=grads,
        cpu=cpu,
        window=window,
        window_totals=totals,
        notes=notes,
    )


@functools.cache
def grad_fractions(cfg: ModelConfig) -> Mapping[str, float]:
    """Share of the gradients complete at each window where freed gradients have grown back (absent: none yet)."""
    blocks_done = (cfg.n_layers - 1) * cfg.block_params() / cfg.n_params()
    return MappingProxyType({LAST_BLOCK: blocks_done, BACKWARD_END: 1.0, OPTIMIZER_STEP: 1.0})


@functools.cache
def activation_windows(
    cfg: ModelConfig, mode: str, tokens: int, policy: str, *, seq_len: int = 0
) -> tuple[tuple[str, int, tuple[tuple[str, int], ...]], ...]:
    """(window, activation bytes, the backward's own transients) at each moment of WINDOWS (ActivationModel.windows),
    cached: strategies of one precision mode share it."""
    measured = cfg.measured_step(micro_batch=tokens // (seq_len or tokens), seq_len=seq_len or tokens, mode=mode)
    if measured is not None:
        windows = measured_windows(measured, mode, checkpointing=policy)
    else:
        windows = ActivationModel(cfg, mode, tokens, seq_len=seq_len).windows(checkpointing=policy)
    return tuple((w, acts, tuple(own)) for w, (acts, own) in windows.items())


def _ddp(spec: RunSpec, foreach: bool = False) -> Memory:
    cfg, n = spec.model_config, spec.model_config.n_params()
    held: Held = {}
    if spec.precision != "fp32":
        # NOTE: autocast caches the 16-bit copy of every weight until the autocast region (forward + loss)
        # exits, and autograd keeps each copy until its weight's backward. Under checkpointing, only the
        # head's copy outlives the forward, and a recomputed block re-creates its own (bar w2, not recomputed).
        b, what = precisions.get(spec.precision).element_bytes, f"autocast's {spec.precision} weight copies"
        everything = b * cfg.n_matmul_params()
        if spec.settings.checkpointing:  # full or selective: both recompute the casts
            per_block = (cfg.n_matmul_params() - cfg.head_params()) // cfg.n_layers - cfg.last_matmul_params()
            held = {
                FORWARD_END: [(what, everything)],
                LOSS_BACKWARD: [(what, b * cfg.head_params())],
                HEAD_BACKWARD: [(what, 0)],
                BLOCK_BACKWARD: [(what, b * per_block)],
                LAST_BLOCK: [(what, b * per_block)],
            }
        else:
            block = (cfg.n_matmul_params() - cfg.head_params()) // cfg.n_layers
            held = {w: [(what, everything)] for w in (FORWARD_END, LOSS_BACKWARD, BLOCK_BACKWARD)}
            held[HEAD_BACKWARD] = [(what, everything - b * cfg.head_params())]
            held[BLOCK_REDUCE] = [(what, everything - b * (cfg.head_params() + block))]
            held[LAST_BLOCK] = [(what, b * block)]
    notes = {
        "params": "fp32 parameters, full replica (4 B/param)",
        "grads": "fp32 gradients; gradient_as_bucket_view makes DDP's 25 MB buckets the gradients, allocated once",
        "optimizer": "AdamW exp_avg + exp_avg_sq in fp32 (8 B/param); no master copy, the params are fp32",
    }
    # NOTE: the copies are made by the forward and saved for backward: activations (the tensor-memory meter files
    # them so too), not buffers
    return _assemble(
        spec, params=4 * n, grads=4 * n, grads_persistent=True, optimizer=8 * n, held={}, held_activations=held,
        notes=notes, foreach=foreach, stepped=n,
    )  # fmt: skip


def _fsdp_no_sync_grads(spec: RunSpec, *, grad_bytes: int) -> int:
    """Gradient accumulation under no_sync keeps every unsharded gradient until the last micro-step."""
    if spec.settings.grad_accum > 1 and shard_degree(spec) > 1:
        return grad_bytes * spec.model_config.n_params()
    return 0


def _fsdp_memory(
    spec: RunSpec,
    *,
    sharded: int,
    root_gathered_in_loss: bool,
    gathered: tuple[str, int],
    gathered_from_forward: bool = False,
    reduce_copy: bool,
    offload_name: str,
    no_sync_bytes: int,
    foreach: bool = False,
    copy_out_root: bool = False,
) -> Memory:
    """What both FSDP generations hold, per window. `gathered` is what is unsharded during a block's backward
    besides the root; `gathered_from_forward` when it stays so from the forward on (SHARD_GRAD_OP);
    `reduce_copy` when a unit's gradient is copied into an fp32 reduce-scatter input. A block unit is the cell's
    (`wrap_blocks` blocks; none when the whole model is the root unit)."""
    nshard = shard_degree(spec)
    cfg, wrap_blocks = spec.model_config, spec.settings.wrap_blocks
    _, root, _ = wrap.wrap_summary(cfg, wrap_blocks)
    # the block units in backward order: the first one's gradient is reduced first, the last one's (the first
    # group, the largest) runs last; all one block at the default
    order = wrap.backward_units(cfg, wrap_blocks) or (0,)
    first_unit, last_unit = order[0], order[-1]
    previous_unit = order[-2] if len(order) > 1 else last_unit
    p = precisions.get(spec.precision).element_bytes  # bytes of gathered parameters and of their unsharded gradients
    replicated_fp32 = nshard == 1 and spec.precision == "fp32" and not reduce_copy
    # NO_SHARD in fp32 (FSDP1): the flat params and grads are the full ones, nothing is gathered or copied
    root_params = ("gathered root unit", 0 if replicated_fp32 else p * root)
    # the root's unsharded gradient accumulates from the head's backward (first) to the embedding's (last)
    root_grad = ("unsharded root gradient", 0 if replicated_fp32 else p * root)
    # each unit's gradient, once complete, is cast/copied to an fp32 reduce-scatter input and reduced into a shard
    copy = 4 if reduce_copy else 0

    def unit_grad(unit: int) -> int:
        return 0 if replicated_fp32 else p * unit + copy * unit + 4 * _ceil_div(unit, nshard)

    block_grad = ("unsharded block gradient + reduce-scatter input/output", unit_grad(first_unit))
    root_reduce = (
        "root reduce-scatter input/output",
        0 if replicated_fp32 else copy * root + 4 * _ceil_div(root, nshard),
    )
    # before the embedding's backward (the very last) only the head's and the final norm's gradients exist
    head = root - spec.model_config.lead_params()
    head_grad = ("unsharded head gradient", 0 if replicated_fp32 else p * head)
    w2_grad = ("unsharded w2 gradient", 0 if replicated_fp32 else p * spec.model_config.last_matmul_params())
    first = [root_params] if root_gathered_in_loss else []
    # NOTE: a unit's reduce-scatter runs while the next unit computes its backward, so its input and output
    # stay allocated through that backward (both FSDP generations reduce on a side stream)
    previous_reduce = ("previous block's unsharded gradient + reduce-scatter buffers", unit_grad(previous_unit))
    last_block = ("last block gathered", 0 if replicated_fp32 else p * last_unit)
    held: Held = {
        FORWARD_END: first + ([gathered] if gathered_from_forward else []),
        LOSS_BACKWARD: first + ([gathered] if gathered_from_forward else []),
        # the root regathered for the head's backward and the last block prefetched (BACKWARD_PRE)
        HEAD_BACKWARD: [root_params, (f"{gathered[0]} (the next one prefetched)", gathered[1]), head_grad],
        # the block's down projection's unsharded weight gradient, the first of the unit's
        BLOCK_BACKWARD: [root_params, gathered, head_grad, w2_grad],
        # the first block is resharded before its gradients are reduced (FULL_SHARD: the next one, prefetched,
        # stays; SHARD_GRAD_OP: the rest stay)
        BLOCK_REDUCE: [
            root_params,
            (gathered[0], max(gathered[1] - p * first_unit, 0)),
            head_grad,
            block_grad,
        ],
        LAST_BLOCK: [root_params, last_block, head_grad, previous_reduce],
        BACKWARD_END: [root_params, root_grad, root_reduce],
    }
    if copy_out_root:
        # FSDP2 reshards the root before reducing it; its gradients are cast into an fp32 reduce-scatter input and
        # split again for the reduction (two fp32 copies of the root unit), the head's 16-bit gradient still
        # referenced; the reduce-scatter output is the root's gradient shard (counted in grads)
        held[BACKWARD_END] = [
            ("unsharded head gradient", p * head),
            ("fp32 reduce-scatter input of the root and its split", 2 * 4 * root),
        ]
    no_sync = _fsdp_no_sync_grads(spec, grad_bytes=no_sync_bytes)
    if no_sync:
        for w in (LOSS_BACKWARD, HEAD_BACKWARD, BLOCK_BACKWARD, BLOCK_REDUCE, LAST_BLOCK, BACKWARD_END):
            held[w].append(("no_sync gradient accumulation", no_sync))
    notes = {
        "params": f"fp32 shards, {nshard} ways (padded); the shards are the master weights",
        "grads": f"fp32 gradient shards, {nshard} ways; freed by zero_grad, produced unit by unit in backward",
        "optimizer": f"AdamW moments on the fp32 shards (8 B/param / {nshard})",
    }
    if spec.settings.offload == "optimizer+params":
        notes["cpu"] = f"{offload_name}: fp32 param and gradient shards and AdamW moments in host memory (16 B/param)"
        return _assemble(
            spec, params=0, grads=0, grads_persistent=False, optimizer=0, held=held, cpu=16 * sharded, notes=notes
        )
    return _assemble(
        spec,
        params=4 * sharded,
        grads=4 * sharded,
        grads_persistent=False,
        optimizer=8 * sharded,
        held=held,
        notes=notes,
        foreach=foreach,
        stepped=sharded,
    )


def _fsdp1(spec: RunSpec, foreach: bool = False) -> Memory:
    """FSDP1: one flat parameter per unit (each Block, and the root), each padded to a multiple of the
    shard degree; the sharded flat params are fp32; MixedPrecision gathers them in 16 bit."""
    nshard = shard_degree(spec)
    cfg, wrap_blocks = spec.model_config, spec.settings.wrap_blocks
    _, root, _ = wrap.wrap_summary(cfg, wrap_blocks)
    flight = fsdp_units_in_flight(spec)
    in_flight = wrap.gathered_elements(cfg, wrap_blocks, flight)
    p = precisions.get(spec.precision).element_bytes
    mixed = spec.precision != "fp32"
    keeps_gathered = not CATALOGUE[spec.strategy].reshard_after_forward  # SHARD_GRAD_OP, _HYBRID_SHARD_ZERO2
    if nshard == 1 or not CATALOGUE[spec.strategy].shards:
        # NOTE: FSDP1 switches any strategy to NO_SHARD when it has a single rank to shard over. With mixed
        # precision it makes a 16-bit copy per unit and frees it after the unit's forward, the root's too,
        # and again after its backward; in fp32 the flat params are the parameters
        gathered = ("16-bit copies of the units in flight", p * in_flight if mixed else 0)
        root_in_loss = False
    elif keeps_gathered:
        # every block stays gathered from its forward to its backward
        gathered = ("every block unit gathered", p * (spec.model_config.n_params() - root))
        root_in_loss = True
    else:
        # FULL_SHARD / HYBRID_SHARD; NOTE: FSDP does not reshard the root after forward (needed first in backward)
        gathered = (f"{flight} block units gathered", p * in_flight)
        root_in_loss = True
    return _fsdp_memory(
        spec,
        sharded=sharded_units(spec.model_config, nshard, spec.settings.wrap_blocks),
        root_gathered_in_loss=root_in_loss,
        gathered=gathered,
        gathered_from_forward=keeps_gathered and nshard > 1,
        reduce_copy=mixed,  # FSDP1 reduces the flat gradient in place when it is already fp32
        offload_name="CPUOffload(offload_params=True)",
        no_sync_bytes=p,
        foreach=foreach,
    )


def _fsdp2(spec: RunSpec, foreach: bool = False) -> Memory:
    """FSDP2: each parameter a DTensor sharded on dim 0 (padded to a multiple of the shard degree)."""
    cfg, s = spec.model_config, spec.settings
    nshard = shard_degree(spec)
    root = wrap.wrap_summary(cfg, s.wrap_blocks)[1]
    p = precisions.get(spec.precision).element_bytes
    flight = fsdp_units_in_flight(spec)
    # NOTE: the worker passes reshard_after_forward=True to the root's fully_shard too (only a default of None
    # keeps the root gathered), so the root is freed after the forward and gathered again for the head's backward;
    # with reshard_after_forward false every unit, the root too, stays gathered from its forward to its backward
    keeps = not s.reshard_after_forward and nshard > 1
    gathered = (
        ("every block unit gathered", p * (cfg.n_params() - root))
        if keeps
        else (f"{flight} block units gathered", p * wrap.gathered_elements(cfg, s.wrap_blocks, flight))
    )
    return _fsdp_memory(
        spec,
        sharded=_fsdp2_sharded(cfg, nshard),
        root_gathered_in_loss=keeps,
        gathered=gathered,
        gathered_from_forward=keeps,
        reduce_copy=True,  # FSDP2 copies every unit's gradients into one reduce-scatter input, fp32 or not
        offload_name="CPUOffloadPolicy",
        no_sync_bytes=4,
        foreach=foreach,
        copy_out_root=True,
    )  # FSDP2 accumulates unsharded grads in the fp32 reduce dtype


def _zero(spec: RunSpec, foreach: bool = False) -> Memory:
    """DeepSpeed ZeRO with bf16/fp16 (16-bit params and grads, fp32 master + moments) or fp32.

    The users' arithmetic, unsharded: 2 + 2 + 12 bytes/param (master 4, moments 8). ZeRO-1 shards the
    optimizer over N, ZeRO-2 also the gradients, ZeRO-3 also the parameters. In fp32, stages 1/2 still
    clone an fp32 master partition (stage_1_and_2.py clones the partition whatever its dtype), and so does
    ZeRO-3 (its no-copy branch in `_create_fp32_partitions` is never taken, see `_zero3`).
    """
    stage = int(spec.strategy[-1])
    if stage == 3:
        return _zero3(spec, foreach)
    cfg, s = spec.model_config, spec.settings
    nshard = spec.gpus
    b = precisions.get(spec.precision).element_bytes
    off_opt = s.offload in ("optimizer", "optimizer+params")
    bucket = ("reduce bucket", b * zero_value(spec, REDUCE_BUCKET))
    notes: dict[str, str] = {}
    _deepspeed_notes(spec, notes)

    n = cfg.n_params()
    part = _ceil_div(n, nshard)  # this rank's partition of the flat parameter group
    grads = b * n if stage == 1 else b * part
    master, moments = 4 * part, 8 * part
    # the contiguous reduce bucket is allocated by the first gradient hook (the head's, after the loss's backward)
    # and released at the backward's end; the step then casts this rank's gradient partition to fp32
    held: Held = {
        # the gradients the hooks have copied into the bucket stay allocated until it is reduced (the head's, then
        # the first block's down projection's)
        HEAD_BACKWARD: [bucket, ("head gradient", b * cfg.head_params())],
        BLOCK_BACKWARD: [bucket, ("head and w2 gradients", b * (cfg.head_params() + cfg.last_matmul_params()))],
        BLOCK_REDUCE: [bucket],
        LAST_BLOCK: [bucket],
        BACKWARD_END: [bucket],
        OPTIMIZER_STEP: [("fp32 gradient partition for the step", 0 if off_opt else 4 * part)],
    }
    cpu = 0
    if off_opt:
        # ZeRO-Offload: master, moments and an fp32 gradient partition in host memory, with a 16-bit
        # staging copy of the partition; ZeRO-2 copies each reduced bucket straight to the host
        cpu = master + moments + 4 * part + b * part
        grads = 0 if stage == 2 else grads
        master = moments = 0
        notes["cpu"] = "offload_optimizer: fp32 master, moments, fp32 gradient partition, 16-bit staging copy"
    notes.update(
        {
            "params": f"{spec.precision} parameters, full replica",
            "grads": f"{spec.precision} gradients, "
            + ("full (ZeRO-1)" if stage == 1 else f"partitioned {nshard} ways")
            + ("; reduced straight into host memory" if off_opt and stage == 2 else "")
            + "; produced during backward, freed by the step",
            "optimizer": f"fp32 master + AdamW moments (12 B/param) / {nshard}" + ("; offloaded" if off_opt else ""),
        }
    )
    return _assemble(
        spec,
        params=b * n,
        grads=grads,
        grads_persistent=False,
        optimizer=master + moments,
        held=held,
        cpu=cpu,
        notes=notes,
        foreach=foreach,
        stepped=moments // 8,
    )


def _zero3(spec: RunSpec, foreach: bool = False) -> Memory:
    """DeepSpeed ZeRO-3: every parameter partitioned (padded to a multiple of N); parameters at or below the
    persistence threshold also stay gathered on every rank."""
    cfg, s = spec.model_config, spec.settings
    nshard = spec.gpus
    b = precisions.get(spec.precision).element_bytes
    nvme = s.offload == "nvme"
    off_opt = s.offload in ("optimizer", "optimizer+params") or nvme
    off_par = s.offload == "optimizer+params" or nvme
    bucket = ("reduce bucket", b * zero_value(spec, REDUCE_BUCKET))
    notes: dict[str, str] = {}
    _deepspeed_notes(spec, notes)
    partitions, persistent, largest_module = _zero3_sizes(cfg, nshard, zero_value(spec, PERSISTENCE))
    # NOTE: an fp32 master copy in every precision: _create_fp32_partitions skips the copy only when the partition's
    # device equals `self.device`, the accelerator's device *name* (a str), which never equals a torch.device
    # (deepspeed 0.19.8 stage3.py:1162); the tensor-memory meter finds the third fp32 partition in fp32 cells
    master = 4 * partitions
    moments = 8 * partitions
    params = b * (partitions + persistent)
    grads = b * partitions  # the flat gradient partition buffer, allocated once at initialisation
    # ZeRO-3 gathers per module (every module here holds one weight) and prefetches ahead of it (never more than
    # the parameters that are not kept gathered anyway); a parameter used again within stage3_max_reuse_distance
    # elements of the trace is not released, so around the turn from forward to backward (the last blocks and the
    # head are used again at once) up to that many stay gathered, under stage3_max_live_parameters
    # (partitioned_param_coordinator.py `__params_to_release`; measured: tests/dist/test_tensor_memory.py)
    gatherable = cfg.n_params() - persistent
    max_live = zero_value(spec, MAX_LIVE)
    prefetched = min(max_live, largest_module + zero_value(spec, PREFETCH_BUCKET), gatherable)
    kept = min(max_live, zero_value(spec, MAX_REUSE), gatherable)
    live = ("live gathered parameters", b * prefetched)
    turn = ("gathered parameters kept for their reuse in backward", b * max(prefetched, kept))
    # the reduce bucket: allocated once, never freed; the optimizer's fp32 gradient buffer: one sub-group at a time,
    # inside the optimizer step only (stage3.py _prepare_fp32_grad_for_sub_group / _release_sub_group)
    fp32_grad = ("fp32 gradient sub-group buffer", 4 * min(zero_value(spec, SUB_GROUP), partitions))
    cpu = 0
    if off_opt:
        cpu = master + moments + 4 * partitions + b * partitions
        master = moments = grads = 0
        fp32_grad = (fp32_grad[0], 0)
        notes["cpu"] = "offload_optimizer: fp32 master, moments, fp32 and 16-bit gradient partitions"
    if off_par:
        cpu += b * partitions
        params = b * persistent
        notes["cpu"] += "; offload_param: 16-bit parameter partitions"
    if nvme:
        # NOTE: ZeRO-Infinity swaps the same states to files under nvme_path; its pinned host swap buffers (aio
        # buffer_count x buffer_size, the parameter swapper's buffers) are not modelled
        cpu = 0
        notes["cpu"] = (
            "offload nvme: fp32 master, moments, gradient and parameter partitions swapped to nvme_path (not host "
            "memory); DeepSpeed's pinned swap buffers in host memory are not modelled"
        )
    held = {
        w: [bucket]
        + ([turn] if w in (FORWARD_END, LOSS_BACKWARD, HEAD_BACKWARD, BLOCK_BACKWARD) else [])
        + ([live] if w in (BLOCK_REDUCE, LAST_BLOCK) else [])
        + ([fp32_grad] if w == OPTIMIZER_STEP else [])
        + ([("head gradient", b * cfg.head_params())] if w == HEAD_BACKWARD else [])
        for w in WINDOWS
    }
    notes.update(
        {
            "params": f"{spec.precision} partitions ({nshard} ways) + {persistent:,} persistent elements gathered"
            + ("; partitions offloaded" if off_par else ""),
            "grads": f"{spec.precision} gradient partitions, one buffer allocated at initialisation"
            + ("; in host memory" if off_opt else ""),
            "optimizer": "fp32 master + AdamW moments (12 B/param, the master cloned in fp32 too)"
            + f" / {nshard}"
            + ("; offloaded" if off_opt else ""),
        }
    )
    return _assemble(
        spec,
        params=params,
        grads=grads,
        grads_persistent=True,
        optimizer=master + moments,
        held=held,
        cpu=cpu,
        notes=notes,
        foreach=foreach,
        stepped=moments // 8,
    )


@functools.cache
def _fsdp2_sharded(cfg: ModelConfig, nshard: int) -> int:
    """Elements of one rank's FSDP2 shards: every parameter's dim 0 padded to a multiple of `nshard`."""
    return sum(_ceil_div(ps.shape[0], nshard) * math.prod(ps.shape[1:]) for ps in parameters(cfg))


@functools.cache
def _zero3_sizes(cfg: ModelConfig, nshard: int, threshold: int) -> tuple[int, int, int]:
    """(partition elements, persistent elements, largest parameter) of ZeRO-3 over `nshard` ranks, parameters of at
    most `threshold` elements persistent (stage3_param_persistence_threshold)."""
    shapes = parameters(cfg)
    partitions = sum(_ceil_div(ps.numel, nshard) for ps in shapes)
    persistent = sum(ps.numel for ps in shapes if ps.numel <= threshold)
    return partitions, persistent, max(ps.numel for ps in shapes)


MEMORY_MODELS = {"ddp": _ddp, "fsdp1": _fsdp1, "fsdp2": _fsdp2, "zero": _zero}
"""a catalogue entry's `memory_model` → the function predicting its per-rank memory"""


def clear_caches() -> None:
    """Forget every per-model structure this module remembers (tests compare cold and warm predictions)."""
    for f in (
        unit_sizes,
        unit_summary,
        sharded_units,
        grad_fractions,
        activation_windows,
        _fsdp2_sharded,
        _zero3_sizes,
    ):
        f.cache_clear()
