"""Analytic models of tensor- and pipeline-parallel cells (harness.core.layout): the collectives rank 0 issues per
step, and its memory. Pure arithmetic, no torch; `harness.plan.comm` and `harness.plan.memory` call in here for a
cell whose layout is not the default (tp = pp = 1), and wrap what comes back in their own ledger and Memory.

What the worker (harness.worker.strategies.layouts) does, per micro-step (a microbatch under a pipeline), measured on
gloo with torch 2.13 and modelled call for call:

Tensor parallelism (torchtitan's Llama plan, loss parallel on), in the activation dtype (the compute dtype: FSDP2's
16-bit parameters make the residual stream 16 bit), on the TP group:

- without sequence parallelism, every TP region ends in an all_reduce of the (tokens, d_model) activation: forward,
  the embedding (row-wise over the vocabulary) and each block's o and down projections (2 per block); backward, the
  input gradient of every column-wise projection (q, k, v, gate, up: 5 per block) and of the head;
- with sequence parallelism each all_reduce becomes an all_gather (into a TP region) or a reduce_scatter (out of
  one) of the same whole (tokens, d_model) buffer: forward, the embedding's reduce_scatter, per block an all_gather
  before attention and before the MLP and a reduce_scatter after each, the head's all_gather; backward the mirror
  image; and once per step an all_reduce of each norm weight's gradient (its partial sums over the sequence shards);
- loss parallel: cross-entropy over vocabulary-sharded logits all_reduces three fp32 values per token (the max, the
  sum of exponentials, the target's logit).

Pipeline parallelism: per microbatch and stage this rank holds, a send of the stage's output and a receive of the
next stage's input gradient (not on the last stage), a receive of its input and a send of its input gradient (not
on the first), each one (tokens of a microbatch, d_model) residual-stream tensor (its sequence shard under sequence
parallelism), on the pipeline group.

Data parallelism, per stage (the whole model without a pipeline) over this rank's TP shards:

- FSDP2: one group per block and one per stage root (the embedding, the final norm and the head, where the stage
  has them); each parameter's local TP shard with dim 0 padded to the shard degree. Without a pipeline as in the
  plain model (all_gather in forward and in backward per micro-step, one reduce_scatter per step, plus HSDP's
  all_reduce of the shard across replicas); under a pipeline the parameters stay gathered across microbatches
  (reshard_after_forward=False): one all_gather and one reduce_scatter per group per step. A one-rank shard group
  issues neither.
- DDP (pipelines only): the stage's fp32 gradients in buckets (first 1 MiB, then 25 MiB; every bucket the cell's
  `bucket_cap_mb` when set) in registration order (the worker rebuilds DDP's buckets that way up front), one
  all_reduce each per step.

Rank 0 sits on the first pipeline stage: the embedding's collectives are its own, the head's and the loss's are
not (unless it also holds the last stage).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from dataclasses import dataclass

from harness.core import precisions
from harness.core.catalogue import CATALOGUE
from harness.core.layout import Layout, effective_microbatches, stage_blocks
from harness.core.precisions import DTYPE_BYTES
from harness.core.zoo import ModelConfig, Param, parameters
from harness.plan.activations import LOSS_TRANSIENT_BYTES_PER_LOGIT, ActivationModel
from harness.plan.flops import precision_mode
from harness.plan.links import mesh_group_kind
from harness.scenario.spec import RunSpec

COLUMNWISE = ("attn.wq", "attn.wk", "attn.wv", "mlp.w1", "mlp.w3")
"""projections sharded over their output features (dim 0 of the weight)"""
ROWWISE = ("attn.wo", "mlp.w2")
"""projections sharded over their input features (dim 1 of the weight)"""
FSDP_UNITS_IN_FLIGHT = 2
"""FSDP2 block units unsharded at once without a pipeline (harness.plan.memory's figure: one prefetched)"""
LOSS_PARALLEL_VALUES_PER_TOKEN = 3
"""fp32 values per token loss parallel's cross-entropy all_reduces: max, sum of exponentials, target logit"""


@dataclass(frozen=True)
class Item:
    """One kind of collective: the same fields as harness.plan.comm.Item."""

    what: str
    collective: str
    dtype: str
    bytes_per_call: int
    calls: float
    group: str
    ranks: int = 0
    """the group's size (tp, pp or a data-parallel group: several can be of one kind)"""
    role: str = ""
    """what the step-time model (harness.plan.time) does with it: "tp" (on every microbatch's critical path, `calls`
    counts all forwards), "tp_step" (once per step: sequence parallelism's norm gradients), "p2p" (a pipeline's
    send or recv per microbatch) or "dp" (data parallelism's, per step)"""


def local_shape(p: Param, *, tp: int) -> tuple[int, ...]:
    """Rank 0's tensor-parallel shard of a parameter (torch.chunk: rank 0 holds ceil(size / tp))."""
    if tp == 1:
        return p.shape
    name = p.name.removesuffix(".weight").removesuffix(".bias")  # NOTE: a column-wise projection's bias is split too
    if name == "tok_emb" or name == "head" or any(name.endswith(c) for c in COLUMNWISE):
        return (-(-p.shape[0] // tp), *p.shape[1:])
    if any(name.endswith(r) for r in ROWWISE) and len(p.shape) == 2:
        return (p.shape[0], -(-p.shape[1] // tp))
    return p.shape  # the norms, a row-wise projection's bias: replicated


def stage_units(cfg: ModelConfig, layout: Layout, stage: int) -> dict[str, list[Param]]:
    """The data-parallel groups of a pipeline stage, in wrapping order: each of its blocks, then its root (the
    embedding on the first stage, the final norm and head on the last; possibly nothing)."""
    split = stage_blocks(cfg.n_layers, layout.n_stages)
    blocks = {f"blocks.{i}" for i in split[stage]}
    out: dict[str, list[Param]] = {}
    root: list[Param] = []
    for p in parameters(cfg):
        if p.unit in blocks:
            out.setdefault(p.unit, []).append(p)
        elif p.unit == "root":
            first = p.name.startswith(("tok_emb", "pos_emb"))
            if (first and stage == 0) or (not first and stage == layout.n_stages - 1):
                root.append(p)
    out["root"] = root
    return out


def activation_dtype(spec: RunSpec) -> str:
    """The residual stream's dtype: the compute dtype where the parameters are 16 bit (FSDP2), fp32 under
    autocast (DDP: the embedding and the residual adds stay fp32)."""
    if spec.precision == "fp32" or CATALOGUE[spec.strategy].mixed == "autocast":
        return "float32"
    return precisions.get(spec.precision).dtype


DISTRIBUTED_OPTIMIZER = "distributed_optimizer"
"""`data_parallel(spec)` of a zero1 cell under a layout: the harness's Megatron-style distributed optimizer"""


def data_parallel(spec: RunSpec) -> str:
    """How a layout cell's data parallelism runs: `fsdp2`, `ddp`, or `distributed_optimizer` (zero1:
    harness.worker.strategies.distributed_optimizer)."""
    family = CATALOGUE[spec.strategy].family
    return DISTRIBUTED_OPTIMIZER if family == "zero" else family


def flat_numel(numel: int, dp: int) -> int:
    """The distributed optimizer's flat buffer of a stage's `numel` local elements: padded to a multiple of dp."""
    return -(-numel // dp) * dp


def matmul_output_dtype(spec: RunSpec) -> str:
    """The dtype of a projection's output: the compute dtype in 16 bit (autocast too), fp32 in fp32."""
    return precisions.get(spec.precision).dtype


AddItem = Callable[[str, str, str, int, float, str, int, str], None]
"""adds one Item: (what, collective, dtype, bytes per call, calls, group kind, group ranks, role)"""


def layout_collectives(
    spec: RunSpec, *, ddp_buckets: Callable[[list[int]], list[int]], pp_rank: int = 0
) -> tuple[list[Item], list[str]]:
    """(items, notes): every collective rank 0 issues per step in a tensor- or pipeline-parallel cell (see the module
    docstring), or with `pp_rank`, the first rank of that pipeline rank (its stages; tp and dp coordinates 0: every
    rank of a stage issues the same). `ddp_buckets` is harness.plan.comm's DDP bucket assignment (bytes per bucket
    from gradient bytes)."""
    lay, s = spec.layout, spec.settings
    items: list[Item] = []
    notes: list[str] = []
    rank = lay.rank_of({name: pp_rank if name == "pp" else 0 for name, _ in lay.mesh_dims})

    def add(what: str, coll: str, dtype: str, nbytes: int, calls: float, group: str, ranks: int, role: str) -> None:
        if calls:
            items.append(Item(what, coll, dtype, int(nbytes), float(calls), group, ranks, role))

    tp_g = mesh_group_kind(lay, rank=rank, dims=("tp",))
    pp_g = mesh_group_kind(lay, rank=rank, dims=("pp",))
    if lay.pp > 1:
        m = effective_microbatches(s.microbatches, lay.pp)
        forwards, tokens = m, s.micro_batch // m * s.seq_len
    else:
        forwards, tokens = s.grad_accum, s.micro_batch * s.seq_len
    local_stages = lay.stages_of(pp_rank)
    for st in local_stages:
        where = f"stage {st}" if lay.pp > 1 else "model"
        if lay.tp > 1:
            _tensor_parallel(spec, stage=st, where=where, forwards=forwards, tokens=tokens, group=tp_g, add=add)
        if lay.pp > 1:
            _pipeline_transfers(spec, stage=st, where=where, forwards=forwards, tokens=tokens, group=pp_g, add=add)
        _data_parallel(spec, stage=st, rank=rank, add=add, notes=notes, ddp_buckets=ddp_buckets)
    if precisions.get(spec.precision).loss_scaling:  # fp16: the overflow verdict, agreed by every rank
        world = mesh_group_kind(lay, rank=rank, dims=tuple(name for name, _ in lay.mesh_dims))
        add("ShardedGradScaler found_inf (every rank)", "all_reduce", "float32", 4, 1, world, lay.gpus, "dp")
    what = []
    sp = s.sequence_parallel
    if lay.tp > 1:
        what.append(f"TP {lay.tp} ({'sequence parallel, ' if sp else ''}loss parallel) on a {tp_g} group")
    if lay.pp > 1:
        what.append(f"PP {lay.pp} ({lay.schedule}, {lay.n_stages} stages, {forwards} microbatches) on a {pp_g} group")
    notes.append(f"layout: {', '.join(what)}; data parallel {lay.dp}; rank {rank} holds stage(s) {local_stages}")
    return items, notes


def _tensor_parallel(
    spec: RunSpec, *, stage: int, where: str, forwards: int, tokens: int, group: str, add: AddItem
) -> None:
    """Tensor parallelism's collectives of one stage over `forwards` forwards (+ backwards) of `tokens` tokens.

    Each in the dtype of what it moves: the residual stream's (`activation_dtype`) for what enters a TP region (the
    norms' outputs, the embedding's output, the input gradients), a row-wise projection's output dtype for what
    leaves one (the compute dtype: under autocast the matmul's output is 16 bit while the residual stream is fp32)
    and, with sequence parallelism, for that output's gradient in backward."""
    lay, cfg, s = spec.layout, spec.model_config, spec.settings
    first, last = stage == 0, stage == lay.n_stages - 1
    nb = len(stage_blocks(cfg.n_layers, lay.n_stages)[stage])
    act, out = activation_dtype(spec), matmul_output_dtype(spec)

    def both(what: str, coll: str, n_act: float, n_out: float) -> None:
        """`n_act` calls moving residual-stream tensors, `n_out` moving row-wise outputs (one item when alike)."""
        if act == out:
            add(what, coll, act, tokens * cfg.d_model * DTYPE_BYTES[act], n_act + n_out, group, lay.tp, "tp")
            return
        add(f"{what} [{act}]", coll, act, tokens * cfg.d_model * DTYPE_BYTES[act], n_act, group, lay.tp, "tp")
        add(f"{what} [{out}]", coll, out, tokens * cfg.d_model * DTYPE_BYTES[out], n_out, group, lay.tp, "tp")

    edges = (1 if first else 0) + (1 if last else 0)
    if s.sequence_parallel:
        # forward: all_gather into attention, MLP (the norms' outputs) and the head; reduce_scatter out of the
        # embedding, attention and MLP (row-wise outputs); backward: the mirror image of each
        both(f"{where}: TP all_gather into attention/MLP/head fwd, of attention/MLP output grads bwd",
             "all_gather", (2 * nb + edges) * forwards, 2 * nb * forwards)  # fmt: skip
        both(f"{where}: TP reduce_scatter out of embedding/attention/MLP fwd, of their input grads bwd",
             "reduce_scatter", (2 * nb + edges) * forwards, 2 * nb * forwards)  # fmt: skip
        if first and cfg.positions == "learned":  # the positions' gradient shards, gathered in each backward
            add(f"{where}: TP all_gather of the learned positions' gradient (bwd)", "all_gather", act,
                s.seq_len * cfg.d_model * DTYPE_BYTES[act], forwards, group, lay.tp, "tp")  # fmt: skip
        # one all_reduce per norm parameter: RMSNorm's weight; LayerNorm's weight and bias
        norms = (2 * nb + (1 if last else 0)) * (cfg.norm_params() // cfg.d_model)
        pdt = precisions.get(spec.precision).dtype
        if data_parallel(spec) == "fsdp2":  # FSDP2 reduces the partial sums once, with the step's gradients
            add(f"{where}: sequence-parallel norm weight gradients", "all_reduce", pdt,
                cfg.d_model * DTYPE_BYTES[pdt], norms, group, lay.tp, "tp_step")  # fmt: skip
        else:  # localised parameters (DDP, the distributed optimizer): each backward's DTensor.from_local reduces
            # them, in the parameters' dtype: the residual stream's (DDP's fp32 under autocast)
            add(f"{where}: sequence-parallel norm weight gradients (each backward)", "all_reduce", act,
                cfg.d_model * DTYPE_BYTES[act], norms * forwards, group, lay.tp, "tp")  # fmt: skip
    else:
        # forward: o and down (row-wise outputs) and the embedding; backward: the input gradient of every
        # column-wise projection (q, k, v, gate and up; a plain MLP has no gate) and of the head
        inputs = (5 if cfg.gated else 4) * nb + edges
        both(f"{where}: TP all_reduce (o/down/embedding fwd, q/k/v/gate/up/head input grads bwd)", "all_reduce",
             inputs * forwards, 2 * nb * forwards)  # fmt: skip
    if s.checkpointing:
        # the recompute in backward re-runs each block's forward up to its last saved tensor (non-reentrant
        # checkpoint stops there): every forward TP collective but the one after the down projection, whose output
        # nothing saves; the same under `selective`, which recomputes the collectives (only matmul and attention
        # outputs are kept). Measured: tests/dist/test_layouts.py
        if s.sequence_parallel:
            both(f"{where}: checkpoint recompute: TP all_gather into attention and MLP", "all_gather",
                 2 * nb * forwards, 0)  # fmt: skip
            both(f"{where}: checkpoint recompute: TP reduce_scatter out of attention", "reduce_scatter",
                 0, nb * forwards)  # fmt: skip
        else:
            both(f"{where}: checkpoint recompute: TP all_reduce after attention's o", "all_reduce", 0, nb * forwards)
    if last:
        add(
            f"{where}: loss parallel cross-entropy (max, sum exp, target logit)",
            "all_reduce",
            "float32",
            tokens * 4,
            LOSS_PARALLEL_VALUES_PER_TOKEN * forwards,
            group,
            lay.tp,
            "tp",
        )


def _pipeline_transfers(
    spec: RunSpec, *, stage: int, where: str, forwards: int, tokens: int, group: str, add: AddItem
) -> None:
    """A pipeline stage's sends and receives to its neighbours, per microbatch (`forwards` of them)."""
    lay = spec.layout
    act = activation_dtype(spec)
    x = tokens * spec.model_config.d_model * DTYPE_BYTES[act]
    boundary = x // lay.tp if spec.settings.sequence_parallel else x
    if stage != 0:
        add(f"{where}: receive activations, send their gradients", "recv", act, boundary, forwards, group, 2, "p2p")
        add(f"{where}: send input gradients", "send", act, boundary, forwards, group, 2, "p2p")
    if stage != lay.n_stages - 1:
        add(f"{where}: send activations", "send", act, boundary, forwards, group, 2, "p2p")
        add(f"{where}: receive output gradients", "recv", act, boundary, forwards, group, 2, "p2p")


def _data_parallel(
    spec: RunSpec,
    *,
    stage: int,
    rank: int,
    add: AddItem,
    notes: list[str],
    ddp_buckets: Callable[[list[int]], list[int]],
) -> None:
    lay, cfg = spec.layout, spec.model_config
    entry = CATALOGUE[spec.strategy]
    units = stage_units(cfg, lay, stage)
    if data_parallel(spec) == DISTRIBUTED_OPTIMIZER:
        numel = local_stage_params(spec, stage=stage)["flat"]
        if lay.dp > 1:
            dp_g = mesh_group_kind(lay, rank=rank, dims=("dp",))
            pdt = precisions.get(spec.precision).dtype
            label = f"stage {stage}: distributed optimizer"
            add(f"{label} reduce_scatter fp32 main gradients ({numel} elements)", "reduce_scatter", "float32",
                numel * 4, 1, dp_g, lay.dp, "dp")  # fmt: skip
            add(f"{label} all_gather {pdt} parameters ({numel} elements)", "all_gather", pdt,
                numel * DTYPE_BYTES[pdt], 1, dp_g, lay.dp, "dp")  # fmt: skip
        return
    if entry.family == "ddp":
        # registration order: the embedding first, then the blocks, then the final norm and head
        params = [p for p in units["root"] if p.name.startswith("tok_emb")]
        params += [p for u, ps in units.items() if u != "root" for p in ps]
        params += [p for p in units["root"] if not p.name.startswith("tok_emb")]
        sizes = [4 * math.prod(local_shape(p, tp=lay.tp)) for p in params]
        dp_g = mesh_group_kind(lay, rank=rank, dims=("dp",))
        for i, b in enumerate(ddp_buckets(sizes)):
            add(f"stage {stage}: DDP gradient bucket {i} (fp32)", "all_reduce", "float32", b, 1, dp_g, lay.dp, "dp")
        return
    # FSDP2 over the data-parallel mesh
    pdt = precisions.get(spec.precision).dtype
    pb = DTYPE_BYTES[pdt]
    shard, rep = lay.dp_shard, lay.dp_replicate
    shard_g = mesh_group_kind(lay, rank=rank, dims=("dp_shard",) if lay.hybrid else ("dp",))
    rep_g = mesh_group_kind(lay, rank=rank, dims=("dp_replicate",)) if lay.hybrid else None
    per_micro = lay.pp == 1
    gathers = 2 * spec.settings.grad_accum if per_micro else 1
    for name, unit in units.items():
        if not unit:
            continue
        numel = 0
        for p in unit:
            shape = local_shape(p, tp=lay.tp)
            numel += -(-shape[0] // shard) * shard * math.prod(shape[1:])
        label = f"stage {stage} group {name} ({numel} elements)" if lay.pp > 1 else f"group {name} ({numel} elements)"
        if shard > 1:
            add(f"FSDP2 all_gather {label}", "all_gather", pdt, numel * pb, gathers, shard_g, shard, "dp")
            rs = f"FSDP2 reduce_scatter gradient {label}, fp32"
            add(rs, "reduce_scatter", "float32", numel * 4, 1, shard_g, shard, "dp")
        if rep_g is not None and rep > 1:
            ar = f"HSDP all_reduce gradient shard {label}"
            add(ar, "all_reduce", "float32", numel // shard * 4, 1, rep_g, rep, "dp")
    if shard == 1 and rep > 1:
        notes.append("HSDP, one-rank shard group beside tp: no all_gather or reduce_scatter, the replicas' all_reduce")


def layout_ledger(spec: RunSpec, *, item: Callable, ddp_buckets: Callable[[list[int]], list[int]]) -> tuple[list, list]:
    """(items, notes) for harness.plan.comm's Ledger: `layout_collectives`, each item built with `item` (its Item)."""
    items, notes = layout_collectives(spec, ddp_buckets=ddp_buckets)
    return [item(i.what, i.collective, i.dtype, i.bytes_per_call, i.calls, i.group, i.ranks) for i in items], notes


# --------------------------------------------------------------------------------------------------
# memory: rank 0's parameters, gradients, optimizer state and in-flight activations


def in_flight(layout: Layout, microbatches: int, pp_rank: int = 0) -> list[int]:
    """The local stages of pipeline rank `pp_rank`'s microbatch forwards whose activations are all alive at its peak,
    one entry per forward: GPipe runs every forward before any backward; 1F1B warms up pp - 1 - pp_rank forwards
    (capped at the microbatches), then runs one more before it alternates a backward and a forward; interleaved 1F1B
    warms up (v - 1) × microbatches per round + 2 (pp - 1 - pp_rank) forwards (torch's `_get_warmup_ops`, capped at
    all of them) in round order, then one more forward before its first backward."""
    if layout.pp == 1:
        return [0]
    if layout.schedule == "gpipe":
        return [pp_rank] * microbatches
    if layout.schedule == "1f1b":
        return [pp_rank] * min(microbatches, layout.pp - pp_rank)
    v, pp = layout.stages_per_rank, layout.pp
    rounds = max(1, microbatches // pp)
    per_round = microbatches // rounds
    total = microbatches * v
    warmup = min((v - 1) * per_round + 2 * (pp - 1 - pp_rank), total)
    n = min(warmup + 1, total)
    return [((op // per_round) % v) * pp + pp_rank for op in range(n)]


@dataclass(frozen=True)
class StageActivations:
    """Bytes one forward of a stage keeps for its backward on rank 0 (a microbatch, or a micro-step without a
    pipeline), by part: the zoo's ActivationModel (harness.plan.memory) split by tensor parallelism.

    Per token, with a = bytes of the compute dtype: each RMSNorm saves its fp32 input, rsqrt and the normalised
    value (8d + 4 in fp32; 4d + 4 + a·d in 16 bit) — over a sequence shard (÷ tp) with sequence parallelism, whole
    otherwise; the q/k/v and gate/up projections save their (whole, gathered) input once each group (a·d each); the
    attention core (rotated q, k, v, SDPA output and the copy reshaped for o: 5·a·d, fp32 logsumexp 4·n_heads) and
    the MLP (w1 and w3 outputs, silu, product: 4·a·ffn) only this rank's heads and ffn columns (÷ tp). Outside the
    blocks: the token ids (8) on the first stage; on the last, the final norm, the head's input (whole), loss
    parallel's fp32 log-probabilities over this rank's vocabulary shard (4·vocab ÷ tp) and the targets (8). Checked
    against the bytes rank 0 saves for backward on CPU in tests/dist/test_layout_memory.py.

    Under activation checkpointing a block keeps its input (the residual stream, its sequence shard with sequence
    parallelism) and, `selective`, its matmul and attention outputs (q, k, v, SDPA, w1, w3 ÷ tp; o and down whole:
    a row-wise projection's output is a whole partial sum); one block's forward is recomputed in backward
    (`recompute`). NOTE: the checkpointed figures are derived, not measured."""

    blocks: int
    outside: int
    recompute: int = 0
    """what one recomputed block adds in backward (checkpointing)"""

    @property
    def total(self) -> int:
        return self.blocks + self.outside


def stage_activations(spec: RunSpec, *, stage: int, tokens: int) -> StageActivations:
    """What one forward of `stage` over `tokens` tokens keeps for backward on rank 0 (see StageActivations)."""
    lay, cfg, s = spec.layout, spec.model_config, spec.settings
    tp, d = lay.tp, cfg.d_model
    a = DTYPE_BYTES[activation_dtype(spec)]
    # NOTE: the block's activation model over this rank's heads and ffn columns: its d-wide tensors (norms, the
    # projections' inputs, the row-wise outputs) are whole, the attention core and the MLP this rank's share
    mode = precision_mode(spec.strategy, spec.precision)
    model = ActivationModel(local_model(cfg, tp), mode, tokens, seq_len=s.seq_len)
    norms = model.block_norms_per_token()
    per_block = model.block_per_token() - (norms - norms / tp if s.sequence_parallel else 0)
    kept, recompute = float(per_block), 0.0
    if s.checkpointing:
        kept = a * d / (tp if s.sequence_parallel else 1)
        recompute = per_block
        if s.activation_checkpointing == "selective":  # what it keeps, the recompute need not make again
            kept += model.selective_kept_per_token()
            recompute -= model.selective_kept_per_token()
    blocks = len(stage_blocks(cfg.n_layers, lay.n_stages)[stage])
    last = stage == lay.n_stages - 1
    outside = 0.0
    if stage == 0:
        outside += 8
    if last:
        norm = model.final_norm_per_token()
        softcap = a * cfg.vocab / tp if cfg.final_softcap is not None else 0
        outside += (norm / tp if s.sequence_parallel else norm) + a * d + 4 * cfg.vocab / tp + softcap + 8
    copies = StageActivations(0, 0)
    if precision_mode(spec.strategy, spec.precision) == "autocast":
        copies = _autocast_copies(spec, stage=stage, blocks=blocks, last=last)
    return StageActivations(
        blocks=int(tokens * blocks * kept) + copies.blocks,
        outside=int(tokens * outside) + copies.outside,
        recompute=int(tokens * recompute) + copies.recompute,
    )


def _autocast_copies(spec: RunSpec, *, stage: int, blocks: int, last: bool) -> StageActivations:
    """Autocast's 16-bit copies of this rank's weight shards, which each forward makes and autograd keeps for the
    backward (the weight a matmul's input gradient needs; harness.plan.memory._ddp has the same without a layout):
    every projection of the blocks and the head; under checkpointing only the head's outlives the forward and a
    recomputed block makes its own again (bar its last projection, which the recompute does not reach)."""
    lay, cfg = spec.layout, spec.model_config
    b = DTYPE_BYTES[precisions.get(spec.precision).dtype]
    units = stage_units(cfg, lay, stage)
    block = max((sum(math.prod(local_shape(p, tp=lay.tp)) for p in ps if len(p.shape) == 2)
                 for u, ps in units.items() if u != "root"), default=0)  # fmt: skip
    head = sum(math.prod(local_shape(p, tp=lay.tp)) for p in units["root"] if p.name == "head.weight") if last else 0
    if spec.settings.checkpointing:
        w2 = next(p for p in parameters(cfg) if p.name.endswith("mlp.w2.weight"))
        last_mm = math.prod(local_shape(w2, tp=lay.tp))
        return StageActivations(0, b * head, b * (block - last_mm))
    return StageActivations(b * block * blocks, b * head)


def local_model(cfg: ModelConfig, tp: int) -> ModelConfig:
    """The shapes one tensor-parallel rank's blocks compute with: its heads, key/value heads and ffn columns."""
    if tp == 1:
        return cfg
    return dataclasses.replace(
        cfg, n_heads=cfg.n_heads // tp, n_kv_heads=cfg.kv_heads // tp, ffn=-(-cfg.ffn // tp), head_dim=cfg.head_size
    )


def local_stage_params(spec: RunSpec, *, stage: int) -> dict[str, int]:
    """Rank 0's elements per data-parallel group of a stage: its tensor-parallel shard ('unsharded', what FSDP2
    gathers), and its FSDP2 shard ('sharded', padded dim 0 / shard degree; the whole TP shard for DDP)."""
    lay = spec.layout
    fsdp2 = data_parallel(spec) == "fsdp2"
    unsharded = sharded = largest_block = root = 0
    for name, unit in stage_units(spec.model_config, lay, stage).items():
        local = padded = 0
        for p in unit:
            shape = local_shape(p, tp=lay.tp)
            local += math.prod(shape)
            padded += -(-shape[0] // lay.dp_shard) * lay.dp_shard * math.prod(shape[1:])
        unsharded += local
        sharded += padded // lay.dp_shard if fsdp2 else local
        if name != "root":
            largest_block = max(largest_block, local)
        else:
            root = local
    return {
        "unsharded": unsharded,
        "sharded": sharded,
        "largest_block": largest_block,
        "root": root,
        "flat": flat_numel(unsharded, lay.dp),
    }


def layout_memory(spec: RunSpec, *, foreach: bool = False) -> dict:
    """The memory of the pipeline rank with the largest peak (`rank_layout_memory` of each; rank 0 without a
    pipeline): the first stage holds the most forwards in flight, the last one the logits and the loss."""
    ranks = range(spec.layout.pp)
    peaks = [rank_layout_memory(spec, pp_rank=r, foreach=foreach) for r in ranks]
    total = [sum(m[k] for k in ("params", "grads", "optimizer", "activations", "buffers")) for m in peaks]
    r = max(ranks, key=lambda r: (total[r], -r))
    best = peaks[r]
    if spec.layout.pp > 1:
        best["notes"]["buffers"] += f" (pipeline rank {r}: the largest of the {spec.layout.pp})"
    return best


def rank_layout_memory(spec: RunSpec, *, pp_rank: int = 0, foreach: bool = False) -> dict:
    """Pipeline rank `pp_rank`'s memory at its peak as harness.plan.memory.Memory's fields (bytes): fp32 parameter,
    gradient and AdamW state of its tensor- (and FSDP2-) sharded stage(s); the activations of the forwards in flight
    at the pipeline's peak (`in_flight`); buffers: FSDP2's gathered parameters (every unit of a pipeline stage stays
    gathered across microbatches; two blocks without a pipeline), the pipeline's receive buffers (one input and one
    gradient per microbatch), the loss's logits and their gradient (vocabulary-sharded under loss parallel). The
    peak is the largest of its moments: the forward end, a microbatch's backward (the first, every forward in flight;
    a later one, gradients accumulated), the backward end and the optimizer step (`window_totals` has each)."""
    lay, cfg, s = spec.layout, spec.model_config, spec.settings
    kind = data_parallel(spec)
    fsdp2, distopt = kind == "fsdp2", kind == DISTRIBUTED_OPTIMIZER
    pb = DTYPE_BYTES[precisions.get(spec.precision).dtype]
    ab = DTYPE_BYTES[activation_dtype(spec)]
    m = effective_microbatches(s.microbatches, lay.pp) if lay.pp > 1 else 1
    tokens = (s.micro_batch // m if lay.pp > 1 else s.micro_batch) * s.seq_len
    local = lay.stages_of(pp_rank)
    sizes = {st: local_stage_params(spec, stage=st) for st in local}
    sharded = sum(v["sharded"] for v in sizes.values())
    unsharded = sum(v["unsharded"] for v in sizes.values())
    if distopt:
        # the flat buffers: parameters in the compute dtype and fp32 main gradients, padded to a multiple of dp,
        # both whole; AdamW's moments (and in 16 bit the fp32 master) on this rank's 1/dp of them
        flat = sum(v["flat"] for v in sizes.values())
        stepped = flat // lay.dp
        params_b, grads_b, opt_b = pb * flat, 4 * flat, (8 + (4 if pb != 4 else 0)) * stepped
    else:
        params_b, grads_b, opt_b, stepped = 4 * sharded, 4 * sharded, 8 * sharded, sharded
    per_stage = {st: stage_activations(spec, stage=st, tokens=tokens) for st in local}
    acts = {st: a.total for st, a in per_stage.items()}
    recompute = max(a.recompute for a in per_stage.values())
    flight = in_flight(lay, m, pp_rank)
    activations = sum(acts[st] for st in flight)
    gathering = fsdp2 and (lay.dp_shard > 1 or pb != 4)
    if not gathering:
        gathered = 0
    elif lay.pp > 1:
        gathered = pb * unsharded
    else:  # FULL_SHARD without a pipeline: two blocks in flight and the root (in the backward: the root is resharded
        # after the forward too, harness.plan.memory._fsdp2)
        (only,) = sizes.values()
        gathered = pb * (FSDP_UNITS_IN_FLIGHT * only["largest_block"] + only["root"])
    boundary = tokens * cfg.d_model * ab // (lay.tp if s.sequence_parallel else 1)
    recv = (
        sum((m if st > 0 else 0) + (m if st < lay.n_stages - 1 else 0) for st in local) * boundary if lay.pp > 1 else 0
    )
    last = lay.n_stages - 1 in local
    logits = tokens * cfg.vocab // lay.tp * (pb + (4 if pb != 4 else 0) + 8) if last else 0
    # under loss parallel (tp > 1) the vocabulary-parallel cross-entropy's backward also holds the logits' exp
    per_logit = LOSS_TRANSIENT_BYTES_PER_LOGIT + (4 if lay.tp > 1 else 0)
    loss_grad = tokens * cfg.vocab // lay.tp * per_logit if last and lay.pp > 1 else 0
    ddp_grads = 0 if fsdp2 else grads_b  # DDP's buckets (the main gradients) are the gradients, allocated once
    # the last stage's schedule keeps its output (the logits) for the loss until the microbatch's backward
    kept_output = tokens * cfg.vocab // lay.tp * pb if last and lay.pp > 1 else 0
    gathered_recv = [("gathered parameters", gathered), ("receive buffers", recv)]
    block_grad = 4 * max(v["largest_block"] for v in sizes.values()) if fsdp2 else 0  # a block's fp32 gradients
    block_backward: list[tuple[str, int]] = []
    if lay.pp == 1 and s.checkpointing:
        # a checkpointed block's backward (measured: FSDP2 × TP, full): its recomputed MLP's gradients in flight and,
        # under FSDP2, the previous block's fp32 gradients copied into the reduce-scatter's input
        local_acts = ActivationModel(local_model(cfg, lay.tp), precision_mode(spec.strategy, spec.precision), tokens,
                                     seq_len=s.seq_len)  # fmt: skip
        block_backward = [("block gradients in flight", local_acts.mlp_backward_transient())]
        if fsdp2:
            block_backward.append(("reduce-scatter input: a block's fp32 gradients", block_grad))
    root = sum(v["root"] for v in sizes.values())
    backwards, accumulated = _backwards(
        lay, fsdp2=fsdp2, gathering=gathering, microbatches=m, flight=len(flight), activations=activations,
        flight_last=sum(1 for st in flight if st == lay.n_stages - 1),
        blocks=sum(a.blocks for a in per_stage.values()),
        block_grad=block_grad,
        # the distributed optimizer's new gradients go into the main-gradient buffer as each is made (fp32: autograd
        # adds into the `.grad` view; 16 bit: the hook adds it and drops it): none accumulate beside it
        kept_output=kept_output, new=0 if distopt else 4 * (unsharded if fsdp2 else sharded),
        root_grad=4 * root if fsdp2 else 0,
    )  # fmt: skip
    # (window, grads, activations, buffers: [(what, bytes)])
    windows = [
        (
            "forward end",
            ddp_grads,
            activations,
            [
                ("gathered parameters", gathered if lay.pp > 1 else 0),
                ("receive buffers", recv),
                ("logits and their gradient", logits),
            ],
        ),
        *(
            (
                name,
                ddp_grads,
                acts + recompute,
                # the last stage runs the loss's backward inside the schedule: the cross-entropy gradient (fp32, two
                # tensors at once)
                [
                    *gathered_recv,
                    ("new and accumulated gradients", grads_now),
                    ("loss gradient", loss_grad),
                    *block_backward,
                ],
            )
            for name, acts, grads_now in backwards
        ),
        ("backward end", grads_b, 0, [*gathered_recv, ("unsharded fp32 gradients", accumulated)]),
        # AdamW's step: with the foreach implementation (harness.plan.memory.foreach_optimizer), one fp32 temporary
        # as large as the shards it steps
        ("optimizer step", grads_b, 0, [("AdamW foreach temporary", 4 * stepped if foreach else 0)]),
    ]
    totals = {w[0]: params_b + opt_b + w[1] + w[2] + sum(b for _, b in w[3]) for w in windows}
    window, grads, acts_at_peak, buffers = max(windows, key=lambda w: totals[w[0]])
    what = "FSDP2 shards" if fsdp2 else "replica"
    notes = {
        "params": f"{'fp32' if not distopt else precisions.get(spec.precision).dtype} {what} of pipeline rank "
        f"{pp_rank}'s stage(s) {local} ({'tensor-parallel shards, ' if lay.tp > 1 else ''}{sharded} elements"
        f"{f', one flat buffer padded to {flat}' if distopt else ''})",
        "grads": "fp32 gradient shards, complete at the backward end"
        if fsdp2
        else "fp32 main gradients, one flat buffer per stage, allocated once"
        if distopt
        else "fp32 gradients in DDP's buckets, allocated once",
        "optimizer": "AdamW moments (8 B/param) on the same shards"
        if not distopt
        else f"distributed optimizer: AdamW moments{' and the fp32 master' if pb != 4 else ''} on this rank's "
        f"1/{lay.dp}"
        " of the flat buffer",
        "activations": f"{len(flight)} microbatch forward(s) in flight at pipeline rank {pp_rank}'s peak "
        f"({lay.schedule}); "
        f"per forward {', '.join(f'stage {st}: {acts[st]} B' for st in local)}"
        if lay.pp > 1
        else f"one micro-step's forward, {acts[local[0]]} B (tensor-parallel: heads and ffn / {lay.tp})",
        "buffers": f"peak at the {window}: " + "; ".join(f"{w} {b} B" for w, b in buffers if b),
    }
    return {
        "params": params_b,
        "grads": grads,
        "optimizer": opt_b,
        "activations": acts_at_peak,
        "buffers": sum(b for _, b in buffers),
        "grads_after_backward": grads_b,
        "window": window,
        "window_totals": totals,
        "notes": notes,
    }


def _backwards(
    lay: Layout,
    *,
    fsdp2: bool,
    gathering: bool,
    microbatches: int,
    flight: int,
    activations: int,
    kept_output: int,
    flight_last: int,
    blocks: int = 0,
    block_grad: int = 0,
    new: int,
    root_grad: int,
) -> tuple[list[tuple[str, int, int]], int]:
    """([(moment, activations, gradients held)] of a rank's backward, the unsharded gradients held at its end).

    A pipeline stage defers the data-parallel reduction to the schedule's end (FSDP2's unsharded gradients
    accumulate in fp32; DDP's in its buckets, under no_sync). A microbatch's backward makes the stage's `new`
    gradients beside what has accumulated: the first microbatch's backward (every forward in flight, nothing
    accumulated yet) or a later one's (GPipe: one forward left; 1F1B: as many in flight as in its warmup), where
    FSDP2's accumulated gradients double them when its parameters are not gathered (a one-rank shard group in fp32:
    the gradients accumulate on the parameters themselves); a gathering FSDP2 holds the gathered parameters and one
    set of gradients (measured: tests/dist/test_layouts.py). Without a pipeline: one backward, the root's unsharded
    gradient (the last to be reduced) held."""
    if lay.pp == 1:
        # the last block's backward: every block's kept activations still alive (a checkpointed block's input; the
        # recompute comes on top, `recompute`), the head's and the loss's gone; FSDP2's unsharded fp32 gradients of
        # the block beside the root's
        return [("block backward", blocks, root_grad + block_grad)], root_grad
    doubles = fsdp2 and not gathering
    per_forward = activations // max(flight, 1)
    later = 1 if lay.schedule == "gpipe" else flight
    # the schedule keeps the output (the logits) of the last stage's forwards only: with interleaving, of the
    # forwards in flight those of the rank's last-stage chunk (`flight_last`)
    backwards = [
        ("first microbatch's backward", activations + flight_last * kept_output, new),
        ("later microbatch's backward", later * per_forward + min(later, flight_last) * kept_output,
         new + (new if doubles else 0)),
    ]  # fmt: skip
    return backwards[: 2 if microbatches > 1 else 1], new if fsdp2 else 0
