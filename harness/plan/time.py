"""Predicted step time of a cell before it runs: compute, recompute, optimizer, collectives and their overlap.

`predict_time(spec, cluster, rates)` prices one optimizer step of one rank from the model's own operations at the
rates of `harness.plan.calibration.Rates` (a calibration file, or the profile's `performance:` figures):

- **compute**: every matmul of the forward and the backward at the calibrated throughput of its GEMM shape and
  layout (forward x·Wᵀ "nt", input gradient dY·W "nn", weight gradient dYᵀ·X "tn"), SDPA attention forward and
  backward at its calibrated rate for (sequence, heads), and the elementwise and normalisation work as bytes moved
  at the calibrated bandwidth. The bytes and op counts per block and outside the blocks were traced op by op from
  `harness.worker.models.Transformer` with a TorchDispatchMode (`BLOCK_BYTES`, `OPS`; tests/unit/test_time_model.py
  re-traces them).
- **recompute**: activation checkpointing's second forward of each block inside the backward — `full` recomputes
  every matmul but w2 (non-reentrant early stop), attention and the elementwise work; `selective` only the
  elementwise work (matmul and attention outputs are kept).
- **optimizer**: AdamW over this rank's parameters (calibrated per element and per tensor), plus the copies a
  ZeRO step makes between its fp32 master partition and the model dtype.
- **other**: per-op host overhead × the op count (dominant for small models on CPU) and the strategy's framework
  overhead per step and per block (hooks, flattening, DeepSpeed's engine), calibrated per family at one rank.
- **comm**: every collective of harness.plan.comm's exact ledger, timed with the calibrated latency and bus
  bandwidth of the link its group runs on (`link_of`), and how much of it is exposed follows each strategy's
  overlap rule (docs/time-model.md): DDP buckets under the remaining backward; FSDP/FSDP2 gathers one unit ahead
  and reduce-scatters under the next unit's backward (the first gather and the last reduction are exposed);
  ZeRO-1/2 nothing (DeepSpeed's overlap_comm is off below stage 3); ZeRO-3 prefetched gathers and asynchronous
  reduce buckets, the first gather of each pass, the last bucket and the after-step gathers exposed. On a CPU
  host where the ranks occupy every core nothing overlaps.

On a CPU host the ranks of a cell share its cores: compute, optimizer and host overhead are stretched by
max(1, ranks on the host / cores); the collectives were calibrated under the same sharing.

Tensor- and pipeline-parallel cells (`layout_parts`): each rank's share of the matmuls, attention and head (÷ tp),
TP's collectives from harness.plan.layouts' exact model, exposed; a pipeline's step is m · the slowest rank's
per-microbatch time + (pp − 1)/v · the mean one (the bubble), its receives on the critical path, the data-parallel
collectives and the optimizer after it (docs/time-model.md: layouts).

The parts add up: step_time_s = compute + recompute + optimizer + comm_exposed + other. A part that needs an
unknown rate is null and so is the step time, with the reason. Pure arithmetic, no torch import.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from typing import Any, NamedTuple

from harness.core.catalogue import CATALOGUE
from harness.core.layout import effective_microbatches, stage_blocks
from harness.core.zoo import ModelConfig, parameters
from harness.plan import comm as cm
from harness.plan import layouts
from harness.plan.calibration import CalibrationMismatch, Rates, Unknown, rates_for
from harness.plan.memory import flops_per_step, precision_mode, shard_degree, unit_numels
from harness.scenario.cluster import Cluster, find_peak
from harness.scenario.schema import RunSpec

PARTS = ("compute", "recompute", "optimizer", "comm_exposed", "comm_total", "other")
"""the breakdown `time_s.*`; every part but comm_total adds up to the step time"""

# --------------------------------------------------------------------------------------------------
# traced per-op inventory of harness.worker.models.Transformer (TorchDispatchMode over forward + backward of a
# one- and a two-block model, rope tables cached; bytes = every non-view, non-matmul, non-attention op's input
# and output tensors; exact to 0.4% over nine shapes, see tests/unit/test_time_model.py)

OPS: dict[str, dict[str, tuple[int, int]]] = {
    # mode → {"block" | "root": (forward ops, backward ops)}; autocast adds its casts, lowp the fp32 round trips
    # of RMSNorm and the loss
    "fp32": {"block": (75, 143), "root": (17, 34)},
    "autocast": {"block": (87, 157), "root": (20, 37)},
    "lowp": {"block": (79, 147), "root": (20, 37)},
}
RECOMPUTE_OPS: dict[tuple[str, str], tuple[int, int]] = {
    # (mode, policy) → (forward ops, backward ops) of a checkpointed block; the backward's includes the recompute
    ("fp32", "full"): (72, 275),
    ("fp32", "selective"): (81, 268),
    ("autocast", "full"): (84, 301),
    ("autocast", "selective"): (93, 294),
    ("lowp", "full"): (76, 283),
    ("lowp", "selective"): (85, 276),
}

# bytes per block: coefficients of (T·d, T·ffn, T·n_heads, S·head_dim, d, block matmul params); T = tokens per
# micro-batch, S = sequence. fp32: RMSNorm's pow/mean/mul, RoPE's muls and cat, the attention output copy, SiLU
# and the product, the residual adds (≈ 40 fp32 passes over d per token forward, 95 backward); autocast adds the
# 6-byte cast of every weight (read 4, write 2), lowp halves the activations but keeps RMSNorm's fp32 round trip.
BLOCK_BYTES: dict[str, tuple[tuple[float, ...], tuple[float, ...]]] = {
    "fp32": ((160, 20, 1, 16.67, 20, 0), (380, 36, 1.5, 17, 34, 0)),
    "autocast": ((146, 10, 1, 8.67, 20, 6), (358, 18, 1.5, 9, 34, 6)),
    "lowp": ((124, 10, 1, 8.67, 16, 0), (286, 18, 1.5, 9, 26, 0)),
}
RECOMPUTE_BYTES: dict[str, tuple[float, ...]] = {
    # what a checkpointed block's backward moves beyond the plain backward (the same for full and selective: both
    # recompute every elementwise op of the block)
    "fp32": (148, 20, 1, 16.67, 20, 0),
    "autocast": (136, 10, 1, 8.67, 20, 6),
    "lowp": (118, 10, 1, 8.67, 16, 0),
}
# outside the blocks: coefficients of (T·d, T·vocab, vocab·d, d, T): the embedding gather, final norm, the loss's
# fp32 log_softmax and nll over T × vocab logits (and their casts), the embedding's dense gradient (vocab·d)
ROOT_BYTES: dict[str, tuple[tuple[float, ...], tuple[float, ...]]] = {
    "fp32": ((32, 12, 0, 4, 40), (100, 20, 4, 8, 52)),
    "autocast": ((38, 18, 6, 4, 40), (106, 26, 10, 8, 52)),
    "lowp": ((38, 18, 0, 2, 40), (98, 26, 2, 4, 52)),
}
COMPUTE_DTYPE = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}


def compute_kind(spec: RunSpec) -> str:
    """The sharing figure a cell's compute is stretched by on a shared CPU host (Rates.share): its matmuls' dtype's"""
    dtype = COMPUTE_DTYPE[spec.precision]
    return "compute" if dtype == "float32" else f"compute_{dtype}"


def _dot(coeffs: tuple[float, ...], xs: tuple[float, ...]) -> float:
    return sum(c * x for c, x in zip(coeffs, xs))


@dataclass(frozen=True)
class Gemm:
    m: int
    n: int
    k: int
    layout: str
    """nt: x·Wᵀ (forward); nn: dY·W (input gradient); tn: dYᵀ·X (weight gradient)"""


def linear_gemms(tokens: int, out_f: int, in_f: int) -> tuple[list[Gemm], list[Gemm]]:
    """(forward, backward) GEMMs of one bias-free Linear over `tokens` rows."""
    return [Gemm(tokens, out_f, in_f, "nt")], [Gemm(tokens, in_f, out_f, "nn"), Gemm(out_f, in_f, tokens, "tn")]


def block_linears(cfg: ModelConfig) -> list[tuple[str, int, int]]:
    """(name, out_features, in_features) of a block's Linears in forward order."""
    d, hd = cfg.d_model, cfg.head_dim
    return [
        ("wq", cfg.n_heads * hd, d),
        ("wk", cfg.kv_heads * hd, d),
        ("wv", cfg.kv_heads * hd, d),
        ("wo", d, cfg.n_heads * hd),
        ("w1", cfg.ffn, d),
        ("w3", cfg.ffn, d),
        ("w2", d, cfg.ffn),
    ]


# --------------------------------------------------------------------------------------------------
# the compute of one micro-step on one rank


@dataclass(frozen=True)
class Compute:
    """Seconds of one micro-step on one rank (no sharing of cores applied)."""

    blocks: int
    block_fwd: float
    block_bwd: float
    """one block's forward and backward (matmuls, attention, elementwise), recompute excluded"""
    block_recompute: float
    """what checkpointing adds to one block's backward (0 without)"""
    root_fwd: float
    root_bwd_head: float
    root_bwd_embedding: float
    """outside the blocks: embedding, final norm, head and loss forward; head, norm and loss backward; the
    embedding's dense gradient"""
    elementwise: float
    """of forward + backward (recompute excluded), the elementwise part: memory bound"""
    recompute_elementwise: float
    """of the recompute, the elementwise part"""
    ops_fwd: int
    ops_bwd: int
    """host-dispatched ops per micro-step (all blocks and the root), recompute included"""
    recompute_ops: int
    """of those, the ones the recompute adds"""
    block_elementwise: float = 0.0
    """of one block's forward + backward, the elementwise part (a pipeline stage's share: its blocks')"""
    block_recompute_elementwise: float = 0.0
    """of one block's recompute, the elementwise part"""
    root_ops: tuple[int, int] = (0, 0)
    """(forward, backward) ops outside the blocks (a pipeline's last stage runs them)"""

    @property
    def root_elementwise(self) -> float:
        """the elementwise part outside the blocks (embedding, final norm, loss, the embedding's gradient)"""
        return self.elementwise - self.blocks * self.block_elementwise

    @property
    def forward(self) -> float:
        return self.root_fwd + self.blocks * self.block_fwd

    @property
    def backward(self) -> float:
        return self.root_bwd_head + self.root_bwd_embedding + self.blocks * (self.block_bwd + self.block_recompute)

    @property
    def recompute(self) -> float:
        return self.blocks * self.block_recompute

    @property
    def total(self) -> float:
        """forward + backward, recompute included"""
        return self.forward + self.backward


def micro_step_compute(spec: RunSpec, rates: Rates, *, batch: int | None = None) -> Compute:
    """Matmuls, attention and elementwise work of one micro-step (raises Unknown when a rate is missing): of
    `batch` sequences (default: the micro-batch; a pipeline's microbatch is smaller), on this rank's tensor-parallel
    shard of every block and of the head."""
    s = spec.settings
    mode = precision_mode(spec.strategy, spec.precision)
    batch = s.micro_batch if batch is None else batch
    sp = s.sequence_parallel and s.tp > 1
    key = (spec.model_config, mode, spec.precision, batch, s.seq_len, s.activation_checkpointing, s.tp, sp, id(rates))
    hit = _COMPUTE.get(key)
    if hit is None:
        hit = _COMPUTE[key] = _micro_step_compute(spec, rates, batch=batch, tp=s.tp, sp=sp)
    return hit


def tp_linears(cfg: ModelConfig, tp: int) -> list[tuple[str, int, int]]:
    """A block's Linears on one tensor-parallel rank: column-wise (q, k, v, gate w1, up w3) keep out_features / tp,
    row-wise (o, down w2) in_features / tp (torchtitan's plan, harness.plan.layouts.COLUMNWISE / ROWWISE)."""
    if tp == 1:
        return block_linears(cfg)
    out = []
    for name, out_f, in_f in block_linears(cfg):
        if name in ("wo", "w2"):
            out.append((name, out_f, -(-in_f // tp)))
        else:
            out.append((name, -(-out_f // tp), in_f))
    return out


def _micro_step_compute(spec: RunSpec, rates: Rates, *, batch: int, tp: int = 1, sp: bool = False) -> Compute:
    cfg, s = spec.model_config, spec.settings
    mode = precision_mode(spec.strategy, spec.precision)
    dt = COMPUTE_DTYPE[spec.precision]
    ew_dt = "float32" if mode == "fp32" else dt
    tokens, seq = batch * s.seq_len, s.seq_len
    d, ffn, hd = cfg.d_model, cfg.ffn, cfg.head_dim
    policy = s.activation_checkpointing

    def gemm_time(gs: list[Gemm]) -> float:
        return sum(rates.gemm_s(dt, g.m, g.n, g.k, g.layout) for g in gs)

    fwd_mm = bwd_mm = recompute_mm = 0.0
    linears = tp_linears(cfg, tp)
    for name, out_f, in_f in linears:
        f, b = linear_gemms(tokens, out_f, in_f)
        fwd_mm += gemm_time(f)
        bwd_mm += gemm_time(b)
        if policy == "full" and name != "w2":  # checkpoint's early stop: w2's output is saved by nothing
            recompute_mm += gemm_time(f)
    att = dict(batch=batch, heads=cfg.n_heads // tp, seq=seq, head_dim=hd)
    att_fwd = rates.attention_s(dt, phase="forward", **att)
    att_bwd = rates.attention_s(dt, phase="backward", **att)
    p_block = sum(o * i for _, o, i in linears)
    if tp == 1:
        xs: tuple[float, ...] = (tokens * d, tokens * ffn, tokens * cfg.n_heads, seq * hd, d, p_block)
        op_bytes: float = tokens * d * (4 if mode == "fp32" else 2)  # the typical elementwise operand: one activation
    else:
        # NOTE: heads and ffn columns are this rank's; the d-wide work (norms, residual adds) is whole without
        # sequence parallelism and a sequence shard with it (docs/time-model.md: tensor parallelism)
        td = tokens * d / (tp if sp else 1)
        xs = (td, tokens * ffn / tp, tokens * cfg.n_heads / tp, seq * hd, d, p_block)
        op_bytes = td * (4 if mode == "fp32" else 2)
    vocab = cfg.vocab if tp == 1 else -(-cfg.vocab // tp)  # the head column-wise, the embedding row-wise

    def ew(nbytes: float) -> float:
        return rates.elementwise_s(ew_dt, nbytes, op_bytes=op_bytes)

    bf, bb = BLOCK_BYTES[mode]
    ew_fwd, ew_bwd = ew(_dot(bf, xs)), ew(_dot(bb, xs))
    block_fwd = fwd_mm + att_fwd + ew_fwd
    block_bwd = bwd_mm + att_bwd + ew_bwd
    block_recompute = ew_recompute = 0.0
    if policy != "none":
        ew_recompute = ew(_dot(RECOMPUTE_BYTES[mode], xs))
        block_recompute = recompute_mm + (att_fwd if policy == "full" else 0.0) + ew_recompute
    hf, hb = linear_gemms(tokens, vocab, d)
    rf, rb = ROOT_BYTES[mode]
    root_td = xs[0]

    def root_ew(c: tuple[float, ...], *, embedding: bool) -> float:
        # each term at the bandwidth of its own operand size: the loss's T × vocab fp32 logits and the vocab × d
        # embedding gradient are far larger than an activation (and fall out of the caches)
        logits = tokens * vocab * 4
        small = c[0] * root_td + c[3] * d + c[4] * tokens
        t = rates.elementwise_s(ew_dt, small, op_bytes=op_bytes)
        t += rates.elementwise_s(ew_dt, c[1] * tokens * vocab, op_bytes=logits)
        if embedding:
            t += rates.elementwise_s(ew_dt, c[2] * vocab * d, op_bytes=4 * vocab * d)
        return t

    emb_grad = rates.elementwise_s(ew_dt, rb[2] * vocab * d, op_bytes=4 * vocab * d)
    root_ew_fwd, root_ew_bwd = root_ew(rf, embedding=True), root_ew(rb, embedding=False)
    root_fwd = gemm_time(hf) + root_ew_fwd
    root_bwd_head = gemm_time(hb) + root_ew_bwd
    root_bwd_emb = emb_grad
    if policy == "none":
        blk_ops = OPS[mode]["block"]
    else:
        blk_ops = RECOMPUTE_OPS[(mode, policy)]
    root_ops = OPS[mode]["root"]
    L = cfg.n_layers
    extra_ops = (blk_ops[0] + blk_ops[1] - sum(OPS[mode]["block"])) * L if policy != "none" else 0
    return Compute(
        blocks=L,
        block_fwd=block_fwd,
        block_bwd=block_bwd,
        block_recompute=block_recompute,
        root_fwd=root_fwd,
        root_bwd_head=root_bwd_head,
        root_bwd_embedding=root_bwd_emb,
        elementwise=cfg.n_layers * (ew_fwd + ew_bwd) + root_ew_fwd + root_ew_bwd + emb_grad,
        recompute_elementwise=cfg.n_layers * ew_recompute,
        ops_fwd=L * blk_ops[0] + root_ops[0],
        ops_bwd=L * blk_ops[1] + root_ops[1],
        recompute_ops=extra_ops,
        block_elementwise=ew_fwd + ew_bwd,
        block_recompute_elementwise=ew_recompute,
        root_ops=root_ops,
    )


# --------------------------------------------------------------------------------------------------
# the optimizer step


def optimizer_elements(spec: RunSpec) -> tuple[float, int]:
    """(parameter elements this rank's AdamW updates, tensors it updates them as); cached per model, strategy and
    world (the planner asks twice per cell)."""
    key = (spec.model_config, spec.strategy, spec.gpus, spec.gpus_per_node)
    hit = _OPT_ELEMENTS.get(key)
    if hit is None:
        hit = _OPT_ELEMENTS[key] = _optimizer_elements(spec)
    return hit


def _optimizer_elements(spec: RunSpec) -> tuple[float, int]:
    cfg = spec.model_config
    entry = CATALOGUE[spec.strategy]
    n_tensors = len(_params(cfg))
    if entry.memory_model == "ddp":
        return float(cfg.n_params()), n_tensors
    if entry.memory_model in ("fsdp1", "fsdp2"):
        nshard = shard_degree(spec)
        if entry.memory_model == "fsdp1" and spec.gpus == 1:
            nshard = 1
        return float(sum(-(-u // nshard) for u in _units(cfg).values())), n_tensors
    # DeepSpeed: one flat fp32 partition (ZeRO-1/2), per-parameter partitions grouped in sub-groups (ZeRO-3)
    return float(-(-cfg.n_params() // spec.gpus)), 1


def optimizer_copy_bytes(spec: RunSpec, elements: float) -> float:
    """Bytes a ZeRO step moves besides AdamW: the gradient partition into the fp32 master's dtype and the updated
    master back into the model's parameters (16-bit: 2 + 4 bytes each way; fp32 stages 1/2: a copy each way)."""
    entry = CATALOGUE[spec.strategy]
    if entry.memory_model != "zero":
        return 0.0
    if spec.precision == "fp32":
        return 0.0 if spec.strategy == "zero3" else 16.0 * elements
    return 12.0 * elements


# --------------------------------------------------------------------------------------------------
# collectives


POINT_TO_POINT = ("send", "recv")
"""a pipeline's transfers between neighbouring stages (harness.plan.layouts), priced by `Rates.p2p_s`"""


def link_of(kind: str, cluster: Cluster) -> str:
    """The link a group kind runs on: "self" (one rank), "intra" (one host or node), "inter" (across nodes: a
    group spanning nodes is bound by its slowest link). A local profile's simulated nodes share one host."""
    if kind == "self":
        return "self"
    if cluster.executor == "local" or kind == "intra":
        return "intra"
    return "inter"


class Coll(NamedTuple):
    """One collective call: its kind, size, group and seconds (a NamedTuple: planning builds ~10^5 of them)."""

    what: str
    collective: str
    nbytes: int
    ranks: int
    seconds: float
    unit: str | None
    """the FSDP unit it concerns ("root", "blocks.<i>"), when it concerns one"""
    phase: str
    """forward | backward | step"""


_UNIT_RE = re.compile(r"(?:unit|group) (root|blocks\.\d+) \(")


def _group_ranks(spec: RunSpec) -> dict[str, int]:
    g = cm.groups_for(spec)
    sizes = {g.world: spec.gpus, g.shard: g.shard_size}
    if g.replicate is not None:
        sizes[g.replicate] = g.replicate_size
    return sizes


def collective_calls(spec: RunSpec, cluster: Cluster, rates: Rates) -> list[tuple[Coll, float]]:
    """Every collective kind of the ledger as (one call, calls per step), timed on its link."""
    return _timed_calls(spec, cluster, rates)[0]


def _timed_calls(spec: RunSpec, cluster: Cluster, rates: Rates) -> tuple[list[tuple[Coll, float]], float]:
    """(collective_calls, their total seconds per step), cached per ledger (harness.plan.comm keeps one per
    everything it depends on, the group sizes included), executor and rates."""
    led = _ledger(spec)
    key = (id(led), cluster.executor, id(rates))
    hit = _CALLS.get(key)
    if hit is not None and hit[0] is led:
        return hit[1], hit[2]
    sizes = _group_ranks(spec)
    on_host = ranks_on_host(spec, cluster)
    groups: dict[tuple[str, int], tuple[int, str, float]] = {}
    # each collective call also waits for the ranks the host's scheduler has not run yet (a CPU host with more
    # ranks than cores; 0 elsewhere)
    wait = rates.sync_wait_s(ranks_on_host=on_host)
    calls = []
    collective_s, new = rates.collective_s, tuple.__new__  # NOTE: bound once: ~10^5 items per plan
    for it, unit, phase in _item_meta(led):
        g = groups.get((it.group, it.ranks))
        if g is None:
            # a layout cell's items name their group's size (tp, pp and dp groups can be of one kind)
            ranks = it.ranks or sizes.get(it.group, spec.gpus)
            # a sub-group's curve was measured with only its own ranks on the host; in the cell, the other
            # sub-groups (a hybrid's) run theirs at the same time on the same cores and memory
            stretch = 1.0
            if rates.device == "cpu" and ranks < on_host:
                stretch = rates.share("memory", ranks=on_host) / rates.share("memory", ranks=ranks)
            g = groups[(it.group, it.ranks)] = (ranks, link_of(it.group, cluster), stretch)
        ranks, link, stretch = g
        if it.collective in POINT_TO_POINT:
            sec = stretch * rates.p2p_s(link=link, nbytes=it.bytes_per_call, dtype=it.dtype)
        else:
            sec = stretch * collective_s(
                it.collective, link=link, ranks=ranks, nbytes=it.bytes_per_call, dtype=it.dtype
            ) + (wait if ranks > 1 else 0.0)
        calls.append((new(Coll, (it.what, it.collective, it.bytes_per_call, ranks, sec, unit, phase)), it.calls))
    total = float(sum(c.seconds * n for c, n in calls))
    _CALLS[key] = (led, calls, total)
    return calls, total


def _item_meta(ledger: cm.Ledger) -> list[tuple[cm.Item, str | None, str]]:
    """(item, the FSDP unit it concerns or None, its phase: forward | backward | step) per ledger item, from the
    ledger's own descriptions (harness.plan.comm); cached per ledger."""
    hit = _META.get(id(ledger))
    if hit is not None and hit[0] is ledger:
        return hit[1]
    out = []
    for it in ledger.items:
        meta = _WHAT.get((it.what, it.collective))
        if meta is None:
            meta = _WHAT[(it.what, it.collective)] = _what_meta(it.what, it.collective)
        out.append((it, *meta))
    _META[id(ledger)] = (ledger, out)
    return out


def _what_meta(what: str, collective: str) -> tuple[str | None, str]:
    """(unit, phase) of a ledger item from its description (cached per description: ledgers of one model at other
    accumulations and strategies repeat them)."""
    m = _UNIT_RE.search(what)
    if "issued in forward" in what or what.endswith("forward") or "first forward" in what:
        phase = "forward"
    elif "after the step" in what or collective == "all_gather" and "updated flat" in what:
        phase = "step"
    elif "norm" in what or "overflow" in what or "found_inf" in what:
        phase = "step"
    else:
        phase = "backward"
    return (m.group(1) if m else None), phase


def simulate(segments: list[float], colls: list[tuple[float, int, int]]) -> float:
    """End time of compute `segments` (run back to back) with collectives on one serial stream beside them.

    A collective (seconds, issue, need) is issued when segment `issue` is about to start (len(segments): after the
    last) and must be done before segment `need` starts (len(segments): before the step ends); collectives issued at
    the same point run in the order given. Returns the step's end; minus sum(segments), the exposed communication."""
    return _simulate(segments, _prepare(colls, len(segments)))


Prepared = tuple[list[float], list[list[int]], list[list[int]]]


def _prepare(colls: list[tuple[float, int, int]], n: int) -> Prepared:
    issued: list[list[int]] = [[] for _ in range(n + 1)]
    needed: list[list[int]] = [[] for _ in range(n + 1)]
    for i, (_, issue, need) in enumerate(colls):
        issued[min(issue, n)].append(i)
        needed[min(need, n)].append(i)
    return [c[0] for c in colls], issued, needed


def _simulate(segments: list[float], prepared: Prepared) -> float:
    seconds, issued, needed = prepared
    n = len(segments)
    ends = [0.0] * len(seconds)
    t = comm_free = 0.0
    for s in range(n + 1):
        for i in issued[s]:
            comm_free = ends[i] = (t if t > comm_free else comm_free) + seconds[i]
        for i in needed[s]:
            if ends[i] > t:
                t = ends[i]
        if s < n:
            t += segments[s]
    return max(t, comm_free)


def _fsdp_segments(comp: Compute, L: int, A: int) -> list[float]:
    """Per micro-step: embedding forward (0), blocks 0..L-1, head+loss; head backward, blocks L-1..0, embedding."""
    one = [0.0] + [comp.block_fwd] * L + [comp.root_fwd, comp.root_bwd_head]
    one += [comp.block_bwd + comp.block_recompute] * L + [comp.root_bwd_embedding]
    return one * A


def _fsdp_colls(spec: RunSpec, calls: list[tuple[Coll, float]]) -> list[tuple[float, int, int]]:
    """When each FSDP collective is issued and needed, against `_fsdp_segments`."""
    L, A = spec.model_config.n_layers, spec.settings.grad_accum
    per = 2 * L + 3

    def fwd_seg(a: int, unit: str) -> int:
        return a * per + (0 if unit == "root" else 1 + int(unit.split(".")[1]))

    def bwd_seg(a: int, unit: str) -> int:
        base = a * per + L + 2
        return base if unit == "root" else base + L - int(unit.split(".")[1])

    out: list[tuple[float, int, int]] = []
    end = per * A
    for c, n_calls in calls:
        unit = c.unit
        if unit is None:  # a step-level flag (fp16 found_inf): after the backward
            out.extend((c.seconds, end, end) for _ in range(int(round(n_calls))))
            continue
        if c.collective == "all_gather":
            per_micro = n_calls / A
            micros = range(A) if per_micro >= 1 else range(1)  # SHARD_GRAD_OP: the first forward only
            for a in micros:
                need = fwd_seg(a, unit)
                out.append((c.seconds, max(need - 1, a * per), need))  # one unit ahead (the root: exposed)
                if per_micro >= 2:  # gathered again for its backward, prefetched one unit ahead
                    need_b = bwd_seg(a, unit) if unit != "root" else a * per + L + 2
                    out.append((c.seconds, max(need_b - 1, a * per + L + 2), need_b))
        else:  # gradient reductions: after the unit's backward in the last micro-step, done before the step
            after = bwd_seg(A - 1, unit) + 1 if unit != "root" else A * per
            out.extend((c.seconds, after, end) for _ in range(int(round(n_calls))))
    return out


def _ddp_segments(comp: Compute, L: int, A: int) -> list[float]:
    """Earlier micro-steps whole (no_sync), then the last one's forward and its backward segment by segment."""
    segs: list[float] = []
    for _ in range(A - 1):
        segs += [comp.forward, comp.backward]
    segs += [comp.forward, comp.root_bwd_head] + [comp.block_bwd + comp.block_recompute] * L
    return segs + [comp.root_bwd_embedding]


def _ddp_colls(spec: RunSpec, calls: list[tuple[Coll, float]]) -> list[tuple[float, int, int]]:
    """DDP: buckets of gradients in ready order (head first, embedding last); a bucket's all_reduce is issued when
    the backward segment that completes it ends, in the last micro-step; all done before the optimizer step."""
    points = _ddp_points(spec.model_config, spec.settings.grad_accum, len(calls))
    return [(c.seconds, issue, need) for (c, _), (issue, need) in zip(calls, points)]


@functools.lru_cache(maxsize=1024)
def _ddp_points(cfg: ModelConfig, A: int, n_calls: int) -> list[tuple[int, int]]:
    """(issue, need) of each of DDP's `n_calls` bucket all_reduces against `_ddp_segments` (cached per model and
    accumulation: the buckets depend on nothing else; read, never change)."""
    L = cfg.n_layers
    first_bwd = 2 * (A - 1) + 1
    end = first_bwd + L + 2
    params = list(reversed(_params(cfg)))

    def segment_of(p: Any) -> int:
        if p.unit == "root":
            return first_bwd + (L + 1 if p.name.startswith("tok_emb") else 0)
        return first_bwd + 1 + (L - 1 - int(p.unit.split(".")[1]))

    closes = _ddp_bucket_closers([p.numel * 4 for p in params])
    out = []
    for i in range(n_calls):
        last = params[closes[i]] if i < len(closes) else params[-1]
        out.append((segment_of(last) + 1, end))
    return out


def _ddp_bucket_closers(sizes_bytes: list[int]) -> list[int]:
    """Index of the gradient that closes each DDP bucket (harness.plan.comm.ddp_buckets' rule)."""
    limits = [cm.DDP_FIRST_BUCKET_BYTES, cm.DDP_BUCKET_CAP_BYTES]
    closes, cur, li = [], 0, 0
    for i, b in enumerate(sizes_bytes):
        cur += b
        if cur >= limits[min(li, len(limits) - 1)]:
            closes.append(i)
            cur, li = 0, li + 1
    if cur:
        closes.append(len(sizes_bytes) - 1)
    return closes


def _zero3_exposed(comp: Compute, calls: list[tuple[Coll, float]], A: int) -> float:
    """ZeRO-3 (overlap_comm on): per micro-step, the gathers of each pass hide behind that pass's compute except the
    first call, reduce buckets behind the backward except the last; after-step gathers and norms are exposed."""
    key = (id(calls), A)
    hit = _ZERO3_SUMS.get(key)
    if hit is None or hit[0] is not calls:
        hit = _ZERO3_SUMS[key] = (calls, _zero3_sums(calls, A))
    fwd, bwd, step = hit[1]

    def hidden(pass_: tuple[float, float] | None, window: float) -> float:
        if pass_ is None:
            return 0.0
        total, exposed_one = pass_
        return exposed_one + max(0.0, total - exposed_one - window)

    exposed = hidden(fwd, comp.forward) + hidden(bwd, comp.backward)
    return A * exposed + step


def _zero3_sums(
    calls: list[tuple[Coll, float]], A: int
) -> tuple[tuple[float, float] | None, tuple[float, float] | None, float]:
    """Per pass (forward; backward with its reduce buckets): (seconds of its collectives per micro-step, the part
    that cannot hide), or None without any; and the step's own (cached per call list: only compute differs per
    cell)."""
    fwd = [(c.seconds, n / A) for c, n in calls if c.collective == "all_gather" and c.phase == "forward"]
    bwd = [(c.seconds, n / A) for c, n in calls if c.collective == "all_gather" and c.phase == "backward"]
    red = [(c.seconds, n / A) for c, n in calls if c.collective == "reduce_scatter"]
    step = sum(c.seconds * n for c, n in calls if c.phase == "step" or c.collective == "all_reduce")
    f = (sum(s * n for s, n in fwd), fwd[0][0]) if fwd else None
    b = None
    if bwd or red:
        last = red[-1][0] if red else 0.0
        b = (sum(s * n for s, n in bwd + red), last + (bwd[0][0] if bwd else 0.0))
    return f, b, step


def comm_times(
    spec: RunSpec, cluster: Cluster, rates: Rates, comp: Compute, *, overlap: bool
) -> tuple[float, float, float]:
    """(total, exposed) seconds of collectives per step, and the compute the schedule ran beside them."""
    calls, total = _timed_calls(spec, cluster, rates)
    L, A = spec.model_config.n_layers, spec.settings.grad_accum
    compute = A * comp.total
    if not overlap or total == 0.0:
        return total, total, compute
    model = CATALOGUE[spec.strategy].comm_model
    if model == "zero3":
        return total, min(total, _zero3_exposed(comp, calls, A)), compute
    if model not in ("fsdp1", "fsdp2", "ddp"):  # ZeRO-1/2: DeepSpeed's overlap_comm defaults to off below stage 3
        return total, total, compute
    segs = _ddp_segments(comp, L, A) if model == "ddp" else _fsdp_segments(comp, L, A)
    key = (id(calls), A, model)
    prepared = _PREPARED.get(key)
    if prepared is None:
        colls = _ddp_colls(spec, calls) if model == "ddp" else _fsdp_colls(spec, calls)
        prepared = _PREPARED[key] = _prepare(colls, len(segs))
    end = _simulate(segs, prepared)
    return total, max(0.0, min(total, end - sum(segs))), compute


# --------------------------------------------------------------------------------------------------
# the cell


def ranks_on_host(spec: RunSpec, cluster: Cluster) -> int:
    """Ranks of the cell that share one host: all of them on a local profile, a node's on SLURM."""
    return spec.gpus if cluster.executor == "local" else min(spec.gpus, spec.gpus_per_node)


def unmodelled_reason(spec: RunSpec) -> str | None:
    """Why this cell's step time is not predicted whatever the rates, or None."""
    s = spec.settings
    unsupported = spec.unsupported_reason()
    if unsupported is not None:
        return f"the cell cannot run: {unsupported}"
    if s.compile:
        return "torch.compile is not calibrated: the model prices eager execution only"
    if s.offload != "none":
        return "CPU offload: the host optimizer and host-device traffic are not calibrated"
    why = cm.no_comm_model_reason(spec)
    if why is not None:
        return f"no collective model: {why}"
    return None


LAYOUT_ON_CPU = (
    "tensor and pipeline parallelism on a CPU host: the host work of DTensor's dispatch and of the pipeline schedule, "
    "which dominates a CPU step, is not calibrated"
)


# --------------------------------------------------------------------------------------------------
# tensor- and pipeline-parallel cells (docs/time-model.md: layouts)


def pipeline_weights(microbatches: int, pp: int, virtual: int) -> tuple[float, float]:
    """(weight of the slowest pipeline rank's per-microbatch time, weight of every rank's) in the step:
    step = m · T_max + (pp − 1) / v · mean(T), i.e. `microbatches` × the slowest rank's time plus the fill and drain
    bubble, (pp − 1) / v of a mean rank's per-microbatch time (GPipe and 1F1B: v = 1; interleaved 1F1B with v
    stages per rank). With equal ranks: (m + (pp − 1) / v) · T, a bubble fraction (pp − 1) / (v·m + pp − 1)."""
    return float(microbatches), (pp - 1) / (virtual * pp)


def bubble_fraction(microbatches: int, pp: int, virtual: int = 1) -> float:
    """The idle share of a balanced pipeline's step: (pp − 1) / (v·m + pp − 1)."""
    w_max, w_each = pipeline_weights(microbatches, pp, virtual)
    return w_each * pp / (w_max + w_each * pp)


class LayoutComm(NamedTuple):
    """A pipeline rank's collectives by role (seconds per step): harness.plan.layouts' exact ledger for that rank,
    each call priced on its group's link."""

    tp: float
    """tensor parallelism's per-forward collectives (all of the step's forwards and backwards)"""
    tp_step: float
    """once per step (sequence parallelism's norm-weight gradients)"""
    recv: float
    """the pipeline's receives (a send is asynchronous; the receiver waits for the transfer)"""
    send: float
    dp: list[tuple[Coll, float]]
    """data parallelism's calls, (call, calls per step)"""

    @property
    def total(self) -> float:
        return self.tp + self.tp_step + self.recv + self.send + sum(c.seconds * n for c, n in self.dp)


def layout_comm(spec: RunSpec, cluster: Cluster, rates: Rates, *, pp_rank: int = 0) -> LayoutComm:
    """The collectives of pipeline rank `pp_rank` (its first rank) by role, priced (raises Unknown)."""
    key = (_spec_key(spec), pp_rank, cluster.executor, id(rates))
    hit = _LAYOUT_COMM.get(key)
    if hit is None:
        hit = _LAYOUT_COMM[key] = _layout_comm(spec, cluster, rates, pp_rank=pp_rank)
    return hit


def _layout_comm(spec: RunSpec, cluster: Cluster, rates: Rates, *, pp_rank: int) -> LayoutComm:
    items, _ = layouts.layout_collectives(spec, ddp_buckets=cm.ddp_buckets, pp_rank=pp_rank)
    by_role = {"tp": 0.0, "tp_step": 0.0, "recv": 0.0, "send": 0.0}
    dp: list[tuple[Coll, float]] = []
    for it in items:
        link = link_of(it.group, cluster)
        if it.collective in POINT_TO_POINT:
            sec = rates.p2p_s(link=link, nbytes=it.bytes_per_call, dtype=it.dtype)
        else:
            sec = rates.collective_s(it.collective, link=link, ranks=it.ranks, nbytes=it.bytes_per_call, dtype=it.dtype)
        if it.role == "dp":
            m = _UNIT_RE.search(it.what)
            dp.append(
                (Coll(it.what, it.collective, it.bytes_per_call, it.ranks, sec, m and m.group(1), "backward"), it.calls)
            )
        else:
            by_role[it.collective if it.role == "p2p" else it.role] += sec * it.calls
    return LayoutComm(dp=dp, **by_role)


class RankTime(NamedTuple):
    """One pipeline rank's (or a tensor-parallel rank's) busy seconds, per microbatch or per micro-step."""

    compute: float
    recompute: float
    other: float
    comm: float
    """tensor parallelism's collectives and the pipeline's receives: exposed, on the critical path"""

    @property
    def total(self) -> float:
        return self.compute + self.recompute + self.other + self.comm


def _stage_time(spec: RunSpec, rates: Rates, comp: Compute, *, pp_rank: int, c: float, mem: float) -> RankTime:
    """Busy seconds of one microbatch (one micro-step without a pipeline) on a rank holding `stages`, no comm:
    its blocks, the embedding's gradient on the first stage, the head, final norm and loss on the last."""
    lay = spec.layout
    stages = lay.stages_of(pp_rank)
    split = stage_blocks(spec.model_config.n_layers, lay.n_stages)
    nb = sum(len(split[st]) for st in stages)
    first, last = 0 in stages, lay.n_stages - 1 in stages
    ew = nb * comp.block_elementwise
    plain = nb * (comp.block_fwd + comp.block_bwd)
    if last:
        plain += comp.root_fwd + comp.root_bwd_head
    if first:
        plain += comp.root_bwd_embedding
    if first and last:
        ew += comp.root_elementwise
    elif last or first:  # NOTE: the root's elementwise work split as its compute is: first stage the embedding's
        root_plain = comp.root_fwd + comp.root_bwd_head + comp.root_bwd_embedding
        share = (comp.root_bwd_embedding if first else comp.root_fwd + comp.root_bwd_head) / root_plain
        ew += comp.root_elementwise * share
    rec, rec_ew = nb * comp.block_recompute, nb * comp.block_recompute_elementwise
    fwd_op, bwd_op = rates.dispatch_s()
    ops_f, ops_b = OPS[precision_mode(spec.strategy, spec.precision)]["block"]
    blk_f, blk_b = (
        (ops_f, ops_b)
        if spec.settings.activation_checkpointing == "none"
        else RECOMPUTE_OPS[(precision_mode(spec.strategy, spec.precision), spec.settings.activation_checkpointing)]
    )
    rec_ops = nb * (blk_f + blk_b - ops_f - ops_b)
    host = nb * (blk_f * fwd_op + blk_b * bwd_op) - rec_ops * bwd_op
    if last:
        host += comp.root_ops[0] * fwd_op + comp.root_ops[1] * bwd_op
    framework = rates.framework_s(spec.strategy, spec.precision, blocks=nb, elements=_layout_elements(spec, pp_rank)[0])
    return RankTime(
        compute=c * (plain - ew) + mem * ew,
        recompute=c * (rec - rec_ew) + mem * rec_ew + c * rec_ops * bwd_op,
        other=c * (host + framework),
        comm=0.0,
    )


def _layout_elements(spec: RunSpec, pp_rank: int = 0) -> tuple[float, int]:
    """(elements this pipeline rank's AdamW updates, parameter tensors): its stages' FSDP2 shards (DDP: whole)."""
    lay = spec.layout
    elements = sum(layouts.local_stage_params(spec, stage=st)["sharded"] for st in lay.stages_of(pp_rank))
    tensors = sum(
        len(ps) for st in lay.stages_of(pp_rank) for ps in layouts.stage_units(spec.model_config, lay, st).values()
    )
    return float(elements), tensors


def layout_parts(
    spec: RunSpec, cluster: Cluster, rates: Rates, parts: dict[str, float | None], *, overlap: bool
) -> dict[str, Any]:
    """Fill `parts` for a tensor- or pipeline-parallel cell's step (raises Unknown; docs/time-model.md). Returns what
    the parts do not show: under a pipeline, each pipeline rank's busy seconds per microbatch (`rank_s`, compute,
    recompute, host overhead, TP collectives and receives), the microbatches and the bubble's seconds (`bubble_s`)."""
    s, lay = spec.settings, spec.layout
    R = ranks_on_host(spec, cluster)
    c, mem = rates.share(compute_kind(spec), ranks=R), rates.share("memory", ranks=R)
    opt_share = rates.share("optimizer", ranks=R)
    info: dict[str, Any] = {}
    if lay.pp == 1:
        A = s.grad_accum
        comp = micro_step_compute(spec, rates)
        own = _stage_time(spec, rates, comp, pp_rank=0, c=c, mem=mem)
        lc = layout_comm(spec, cluster, rates)
        elements, tensors = _layout_elements(spec)
        dp_total = sum(co.seconds * n for co, n in lc.dp)
        dp_exposed = dp_total
        if overlap and dp_total and rates.overlap(ranks_on_host=R):
            # FSDP2 over the tensor-parallel shards: gathers one unit ahead and reduce-scatters after each unit's
            # backward, as without tensor parallelism, beside the compute (TP's collectives are not compute)
            segs = _fsdp_segments(comp, spec.model_config.n_layers, A)
            segs = [c * x for x in segs]
            end = simulate(segs, _fsdp_colls(spec, lc.dp))
            dp_exposed = max(0.0, min(dp_total, end - sum(segs)))
        parts["compute"], parts["recompute"], parts["other"] = A * own.compute, A * own.recompute, A * own.other
        exposed = lc.tp + lc.tp_step + dp_exposed
        parts["comm_total"], parts["comm_exposed"] = lc.total, exposed
    else:
        m = effective_microbatches(s.microbatches, lay.pp)
        comp = micro_step_compute(spec, rates, batch=s.micro_batch // m)
        ranks: list[RankTime] = []
        after: list[tuple[float, float]] = []
        for r in range(lay.pp):
            lc = layout_comm(spec, cluster, rates, pp_rank=r)
            own = _stage_time(spec, rates, comp, pp_rank=r, c=c, mem=mem)
            ranks.append(own._replace(comm=(lc.tp + lc.recv) / m))
            elements, tensors = _layout_elements(spec, r)
            opt = opt_share * rates.optimizer_s(elements=elements, tensors=tensors)
            after.append((lc.tp_step + sum(co.seconds * n for co, n in lc.dp), opt))
        w_max, w_each = pipeline_weights(m, lay.pp, lay.stages_per_rank)
        slow = max(ranks, key=lambda t: t.total)

        def weighted(field: str) -> float:
            return w_max * getattr(slow, field) + w_each * sum(getattr(t, field) for t in ranks)

        dp, opt = max(after, key=lambda x: x[0] + x[1])
        parts["compute"], parts["recompute"], parts["other"] = (weighted(f) for f in ("compute", "recompute", "other"))
        # NOTE: nothing of a pipeline's communication overlaps here: TP's and the receives are on the critical path,
        # data parallelism's run before the first forward and after the last backward (docs/time-model.md)
        parts["comm_exposed"] = parts["comm_total"] = weighted("comm") + dp
        parts["optimizer"] = opt
        info.update(rank_s=[t.total for t in ranks], microbatches=m, bubble_s=w_each * sum(t.total for t in ranks))
        return info
    parts["optimizer"] = opt_share * rates.optimizer_s(elements=elements, tensors=tensors)
    return info


def _mfu_peak(spec: RunSpec, cluster: Cluster, rates: Rates) -> tuple[float | None, str | None]:
    key = (cluster.name, cluster.device, cluster.description, id(rates), spec.precision)
    hit = _PEAKS.get(key)
    if hit is None:
        hit = _PEAKS[key] = _find_mfu_peak(spec, cluster, rates)
    return hit


def _find_mfu_peak(spec: RunSpec, cluster: Cluster, rates: Rates) -> tuple[float | None, str | None]:
    if cluster.device != "cuda":
        return None, "no dense peak FLOPS for a CPU device (harness/scenario/cluster.py PEAKS)"
    name = rates.device_name or cluster.description
    peak = find_peak(name)
    key = spec.precision
    if peak is None or key not in peak.tflops:
        return None, f"no dense peak FLOPS known for {name!r} ({spec.precision}); see harness/scenario/cluster.py"
    return peak.tflops[key], None


def predict_time(spec: RunSpec, cluster: Cluster, rates: Rates, *, overlap: bool = True) -> dict[str, Any]:
    """The predicted step time of `spec` and its breakdown (see the module docstring); nulls carry reasons."""
    key = (_spec_key(spec), cluster.name, cluster.executor, id(rates), overlap)
    hit = _CACHE.get(key)
    if hit is None:
        hit = _predict_time(spec, cluster, rates, overlap=overlap)
        _CACHE[key] = hit
    return {k: (dict(v) if isinstance(v, dict) else v) for k, v in hit.items()}


def _predict_time(spec: RunSpec, cluster: Cluster, rates: Rates, *, overlap: bool) -> dict[str, Any]:
    parts: dict[str, float | None] = dict.fromkeys(PARTS)
    reasons: dict[str, str] = {}
    out: dict[str, Any] = {
        "step_time_s": None,
        "tokens_per_s_per_gpu": None,
        "mfu": None,
        "time_s": parts,
        "calibration": rates.source,
        "time_null_reasons": reasons,
    }
    st = _structure(spec, cluster, rates, overlap)
    if st.why is not None:
        reasons["step_time_s"] = st.why
        return out
    if spec.settings.tp > 1 or spec.settings.pp > 1:
        if rates.device == "cpu":
            reasons["step_time_s"] = LAYOUT_ON_CPU
            return out
        try:
            layout_parts(spec, cluster, rates, parts, overlap=overlap)
        except Unknown as e:
            reasons["step_time_s"] = str(e)
            return out
        return _finish(spec, cluster, rates, out)
    A = spec.settings.grad_accum
    c, mem = st.c, st.mem
    comp: Compute | None = None
    try:
        comp = micro_step_compute(spec, rates)
        plain, re = comp.total - comp.recompute, comp.recompute
        parts["compute"] = A * (c * (plain - comp.elementwise) + mem * comp.elementwise)
        parts["recompute"] = A * (c * (re - comp.recompute_elementwise) + mem * comp.recompute_elementwise)
    except Unknown as e:
        reasons["compute"] = str(e)
    if st.optimizer is None:
        reasons["optimizer"] = st.optimizer_reason
    else:
        parts["optimizer"] = st.optimizer
    if st.dispatch is None or st.framework is None:
        reasons["other"] = st.other_reason
    elif comp is not None:
        fwd_op, bwd_op = st.dispatch
        plain_ops = comp.ops_bwd - comp.recompute_ops
        host = A * (comp.ops_fwd * fwd_op + plain_ops * bwd_op)
        parts["other"] = c * (host + A * st.framework)
        if parts["recompute"] is not None:
            parts["recompute"] += c * A * comp.recompute_ops * bwd_op
    if comp is not None:
        try:
            total, exposed, _ = comm_times(spec, cluster, rates, comp, overlap=st.overlap)
            parts["comm_total"], parts["comm_exposed"] = total, exposed
        except Unknown as e:
            reasons["comm"] = str(e)
    return _finish(spec, cluster, rates, out)


class Structure(NamedTuple):
    """What a cell's prediction shares with every cell of the same model, strategy, precision, world, accumulation
    and settings but micro-batch and sequence (planning a matrix asks for each several times)."""

    why: str | None
    """unmodelled_reason"""
    c: float
    mem: float
    """the compute and memory slowdowns of the ranks sharing a host"""
    optimizer: float | None
    optimizer_reason: str
    dispatch: tuple[float, float] | None
    framework: float | None
    other_reason: str
    overlap: bool
    """whether collectives overlap compute in this cell (the caller's `overlap` and the host's cores)"""


def _structure(spec: RunSpec, cluster: Cluster, rates: Rates, overlap: bool) -> Structure:
    s = spec.settings
    key = (
        spec.model_config,
        spec.strategy,
        spec.precision,
        spec.gpus,
        spec.gpus_per_node,
        s.grad_accum,
        s.activation_checkpointing,
        s.offload,
        s.compile,
        repr(s.inject),
        s.tp,
        s.pp,
        s.pp_schedule,
        s.microbatches,
        s.sequence_parallel,
        cluster.name,
        cluster.executor,
        id(rates),
        overlap,
    )
    hit = _STRUCTURES.get(key)
    if hit is None:
        hit = _STRUCTURES[key] = _structure_of(spec, cluster, rates, overlap)
    return hit


def _structure_of(spec: RunSpec, cluster: Cluster, rates: Rates, overlap: bool) -> Structure:
    why = unmodelled_reason(spec)
    R = ranks_on_host(spec, cluster)
    c, mem = rates.share(compute_kind(spec), ranks=R), rates.share("memory", ranks=R)
    opt: float | None = None
    opt_reason = other_reason = ""
    dispatch: tuple[float, float] | None = None
    framework: float | None = None
    if why is None and spec.layout.is_default:
        try:
            elements, tensors = optimizer_elements(spec)
            opt = rates.share("optimizer", ranks=R) * rates.optimizer_s(elements=elements, tensors=tensors)
            copies = optimizer_copy_bytes(spec, elements)
            if copies:
                opt += mem * rates.elementwise_s("float32", copies, op_bytes=4.0 * elements)
        except Unknown as e:
            opt, opt_reason = None, str(e)
        try:
            dispatch = rates.dispatch_s()
            framework = rates.framework_s(
                spec.strategy, spec.precision, blocks=spec.model_config.n_layers, elements=optimizer_elements(spec)[0]
            )
        except Unknown as e:
            dispatch, other_reason = None, str(e)
    return Structure(
        why=why,
        c=c,
        mem=mem,
        optimizer=opt,
        optimizer_reason=opt_reason,
        dispatch=dispatch,
        framework=framework,
        other_reason=other_reason,
        overlap=overlap and rates.overlap(ranks_on_host=R),
    )


def _finish(spec: RunSpec, cluster: Cluster, rates: Rates, out: dict[str, Any]) -> dict[str, Any]:
    """The step time from its parts, tokens/s per GPU and MFU (or why they are null)."""
    parts, reasons = out["time_s"], out["time_null_reasons"]
    summed = [parts[k] for k in ("compute", "recompute", "optimizer", "comm_exposed", "other")]
    if any(v is None for v in summed):
        reasons["step_time_s"] = next(iter(reasons.values()), "a part is unknown")
        return out
    step = float(sum(v for v in summed if v is not None))
    out["step_time_s"] = step
    out["tokens_per_s_per_gpu"] = spec.tokens_per_step / spec.gpus / step
    peak, why_not = _mfu_peak(spec, cluster, rates)
    if peak is None:
        reasons["mfu"] = why_not or "peak unknown"
    else:
        out["mfu"] = flops_per_step(spec) / spec.gpus / step / (peak * 1e12)
    return out


# --------------------------------------------------------------------------------------------------
# caches: the structural parts depend on a few fields of the spec only


_CACHE: dict[tuple, dict[str, Any]] = {}
_COMPUTE: dict[tuple, Compute] = {}
_CALLS: dict[tuple, tuple[cm.Ledger, list[tuple[Coll, float]], float]] = {}
_OPT_ELEMENTS: dict[tuple, tuple[float, int]] = {}
_LAYOUT_COMM: dict[tuple, LayoutComm] = {}
_STRUCTURES: dict[tuple, Structure] = {}
_WHAT: dict[tuple[str, str], tuple[str | None, str]] = {}
_ZERO3_SUMS: dict[tuple, tuple[list, tuple]] = {}
_PREPARED: dict[tuple, Prepared] = {}
_META: dict[int, tuple[cm.Ledger, list]] = {}
_PEAKS: dict[tuple, tuple[float | None, str | None]] = {}
_PARAMS: dict[ModelConfig, list] = {}
_UNITS: dict[ModelConfig, dict[str, int]] = {}


def clear_caches() -> None:
    """Forget every prediction and structure this module remembers (tests compare cold and warm predictions)."""
    for cache in (
        _CACHE,
        _COMPUTE,
        _CALLS,
        _OPT_ELEMENTS,
        _LAYOUT_COMM,
        _STRUCTURES,
        _PREPARED,
        _META,
        _PEAKS,
        _WHAT,
        _ZERO3_SUMS,
    ):
        cache.clear()
    _PARAMS.clear()
    _UNITS.clear()
    _ddp_points.cache_clear()


def _spec_key(spec: RunSpec) -> tuple:
    s = spec.settings
    return (
        spec.model_config,
        spec.strategy,
        spec.precision,
        spec.gpus,
        spec.gpus_per_node,
        s.micro_batch,
        s.seq_len,
        s.grad_accum,
        s.activation_checkpointing,
        s.offload,
        s.compile,
        s.tp,
        s.pp,
        s.pp_schedule,
        s.microbatches,
        s.sequence_parallel,
        repr(s.inject),  # an injected fault's rank can make the cell unsupported
    )


def _params(cfg: ModelConfig) -> list:
    hit = _PARAMS.get(cfg)
    if hit is None:
        hit = _PARAMS[cfg] = parameters(cfg)
    return hit


def _units(cfg: ModelConfig) -> dict[str, int]:
    hit = _UNITS.get(cfg)
    if hit is None:
        hit = _UNITS[cfg] = unit_numels(cfg)
    return hit


def _ledger(spec: RunSpec) -> cm.Ledger:
    return cm.ledger(spec)


def describe(pred: dict[str, Any]) -> str:
    """One line: the step time and its parts, or why it is null."""
    if pred.get("step_time_s") is None:
        return f"step time unknown: {(pred.get('time_null_reasons') or {}).get('step_time_s')}"
    t = pred["time_s"]
    parts = ", ".join(f"{k} {t[k] * 1e3:.1f}" for k in PARTS if t.get(k) is not None)
    return f"{pred['step_time_s'] * 1e3:.1f} ms/step ({parts} ms)"


def null_prediction(reason: str, calibration: str) -> dict[str, Any]:
    """The time fields of a cell whose step time is not predicted, with the reason."""
    return {
        "step_time_s": None,
        "tokens_per_s_per_gpu": None,
        "mfu": None,
        "time_s": dict.fromkeys(PARTS),
        "calibration": calibration,
        "time_null_reasons": {"step_time_s": reason},
    }


def time_prediction(spec: RunSpec, cluster: Cluster, *, rates: Rates | None = None) -> dict[str, Any]:
    """The time fields `predict` adds to a cell's prediction: the cluster's rates (its calibration file, else its
    profile figures) priced by `predict_time`. A calibration of another machine makes them null with the reason
    here (the sweep goes on); `harness plan` refuses it up front (exit 2)."""
    if rates is None:
        try:
            rates = rates_for(cluster)
        except CalibrationMismatch as e:
            return null_prediction(str(e.problems[0]), "refused: " + str(e.problems[0].file))
    return predict_time(spec, cluster, rates)


# --------------------------------------------------------------------------------------------------
# `harness plan`'s table

TIME_COLUMNS = ("ms/step", "tok/s/gpu", "MFU")


def time_columns(cell: dict[str, Any]) -> list[str]:
    """The table's predicted step time (ms), tokens/s per GPU and MFU of a planned cell; "-" where null."""
    step, tps, mfu = cell.get("step_time_s"), cell.get("tokens_per_s_per_gpu"), cell.get("mfu")
    return [
        "-" if step is None else f"{step * 1e3:.4g}",
        "-" if tps is None else f"{tps:.4g}",
        "-" if mfu is None else f"{mfu:.1%}",
    ]


def time_footer(cells: list[dict[str, Any]]) -> str:
    """The table's last line: where the rates came from, and why step times are null where they are."""
    sources = sorted({c.get("calibration") or "" for c in cells if c.get("calibration")})
    null: dict[str, int] = {}
    for c in cells:
        if c.get("step_time_s") is None and not c.get("unsupported"):
            why = (c.get("time_null_reasons") or {}).get("step_time_s", "unknown")
            null[why] = null.get(why, 0) + 1
    line = "step time: " + ("; ".join(sources) or "no rates")
    if null:
        line += "; null for " + "; ".join(f"{n} cell(s): {why}" for why, n in sorted(null.items(), key=lambda x: -x[1]))
    return line
