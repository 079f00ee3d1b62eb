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

The parts add up: step_time_s = compute + recompute + optimizer + comm_exposed + other. A part that needs an
unknown rate is null and so is the step time, with the reason. Pure arithmetic, no torch import.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, NamedTuple

from harness.core.catalogue import CATALOGUE
from harness.core.zoo import ModelConfig, parameters
from harness.plan import comm as cm
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


def micro_step_compute(spec: RunSpec, rates: Rates) -> Compute:
    """Matmuls, attention and elementwise work of one micro-step (raises Unknown when a rate is missing)."""
    s = spec.settings
    mode = precision_mode(spec.strategy, spec.precision)
    key = (spec.model_config, mode, spec.precision, s.micro_batch, s.seq_len, s.activation_checkpointing, id(rates))
    hit = _COMPUTE.get(key)
    if hit is None:
        hit = _COMPUTE[key] = _micro_step_compute(spec, rates)
    return hit


def _micro_step_compute(spec: RunSpec, rates: Rates) -> Compute:
    cfg, s = spec.model_config, spec.settings
    mode = precision_mode(spec.strategy, spec.precision)
    dt = COMPUTE_DTYPE[spec.precision]
    ew_dt = "float32" if mode == "fp32" else dt
    tokens, seq = s.micro_batch * s.seq_len, s.seq_len
    d, ffn, hd = cfg.d_model, cfg.ffn, cfg.head_dim
    policy = s.activation_checkpointing

    def gemm_time(gs: list[Gemm]) -> float:
        return sum(rates.gemm_s(dt, g.m, g.n, g.k, g.layout) for g in gs)

    fwd_mm = bwd_mm = recompute_mm = 0.0
    for name, out_f, in_f in block_linears(cfg):
        f, b = linear_gemms(tokens, out_f, in_f)
        fwd_mm += gemm_time(f)
        bwd_mm += gemm_time(b)
        if policy == "full" and name != "w2":  # checkpoint's early stop: w2's output is saved by nothing
            recompute_mm += gemm_time(f)
    att = dict(batch=s.micro_batch, heads=cfg.n_heads, seq=seq, head_dim=hd)
    att_fwd = rates.attention_s(dt, phase="forward", **att)
    att_bwd = rates.attention_s(dt, phase="backward", **att)
    p_block = sum(o * i for _, o, i in block_linears(cfg))
    xs = (tokens * d, tokens * ffn, tokens * cfg.n_heads, seq * hd, d, p_block)
    op_bytes = tokens * d * (4 if mode == "fp32" else 2)  # the typical elementwise operand: one activation

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
    hf, hb = linear_gemms(tokens, cfg.vocab, d)
    rf, rb = ROOT_BYTES[mode]

    def root_ew(c: tuple[float, ...], *, embedding: bool) -> float:
        # each term at the bandwidth of its own operand size: the loss's T × vocab fp32 logits and the vocab × d
        # embedding gradient are far larger than an activation (and fall out of the caches)
        logits = tokens * cfg.vocab * 4
        small = c[0] * tokens * d + c[3] * d + c[4] * tokens
        t = rates.elementwise_s(ew_dt, small, op_bytes=op_bytes)
        t += rates.elementwise_s(ew_dt, c[1] * tokens * cfg.vocab, op_bytes=logits)
        if embedding:
            t += rates.elementwise_s(ew_dt, c[2] * cfg.vocab * d, op_bytes=4 * cfg.vocab * d)
        return t

    emb_grad = rates.elementwise_s(ew_dt, rb[2] * cfg.vocab * d, op_bytes=4 * cfg.vocab * d)
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
    )


# --------------------------------------------------------------------------------------------------
# the optimizer step


def optimizer_elements(spec: RunSpec) -> tuple[float, int]:
    """(parameter elements this rank's AdamW updates, tensors it updates them as)."""
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
    """(collective_calls, their total seconds per step), cached per ledger, executor and rates."""
    st = spec.settings
    key: tuple = (spec.model_config, spec.strategy, spec.precision, spec.gpus, spec.gpus_per_node, st.grad_accum)
    ckpt = st.checkpointing if CATALOGUE[spec.strategy].comm_model == "zero3" else None  # as harness.plan.comm's key
    key += (ckpt, st.offload, cm.ZERO3, cluster.executor, id(rates))
    hit = _CALLS.get(key)
    if hit is None:
        sizes = _group_ranks(spec)
        on_host = ranks_on_host(spec, cluster)
        groups: dict[str, tuple[int, str, float]] = {}
        for kind in {it.group for it in _ledger(spec).items}:
            ranks = sizes.get(kind, spec.gpus)
            # a sub-group's curve was measured with only its own ranks on the host; in the cell, the other
            # sub-groups (a hybrid's) run theirs at the same time on the same cores and memory
            stretch = 1.0
            if rates.device == "cpu" and ranks < on_host:
                stretch = rates.share("memory", ranks=on_host) / rates.share("memory", ranks=ranks)
            groups[kind] = (ranks, link_of(kind, cluster), stretch)
        calls = []
        for it, unit, phase in _item_meta(_ledger(spec)):
            ranks, link, stretch = groups[it.group]
            sec = stretch * rates.collective_s(
                it.collective, link=link, ranks=ranks, nbytes=it.bytes_per_call, dtype=it.dtype
            )
            calls.append((Coll(it.what, it.collective, it.bytes_per_call, ranks, sec, unit, phase), it.calls))
        hit = _CALLS[key] = (calls, float(sum(c.seconds * n for c, n in calls)))
    return hit


def _item_meta(ledger: cm.Ledger) -> list[tuple[cm.Item, str | None, str]]:
    """(item, the FSDP unit it concerns or None, its phase: forward | backward | step) per ledger item, from the
    ledger's own descriptions (harness.plan.comm); cached per ledger."""
    hit = _META.get(id(ledger))
    if hit is not None and hit[0] is ledger:
        return hit[1]
    out = []
    for it in ledger.items:
        m = _UNIT_RE.search(it.what)
        if "issued in forward" in it.what or it.what.endswith("forward") or "first forward" in it.what:
            phase = "forward"
        elif "after the step" in it.what or it.collective == "all_gather" and "updated flat" in it.what:
            phase = "step"
        elif "norm" in it.what or "overflow" in it.what or "found_inf" in it.what:
            phase = "step"
        else:
            phase = "backward"
        out.append((it, m.group(1) if m else None, phase))
    _META[id(ledger)] = (ledger, out)
    return out


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
    cfg, A = spec.model_config, spec.settings.grad_accum
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
    for i, (c, _) in enumerate(calls):
        last = params[closes[i]] if i < len(closes) else params[-1]
        out.append((c.seconds, segment_of(last) + 1, end))
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
    fwd = [(c.seconds, n / A) for c, n in calls if c.collective == "all_gather" and c.phase == "forward"]
    bwd = [(c.seconds, n / A) for c, n in calls if c.collective == "all_gather" and c.phase == "backward"]
    red = [(c.seconds, n / A) for c, n in calls if c.collective == "reduce_scatter"]
    step = sum(c.seconds * n for c, n in calls if c.phase == "step" or c.collective == "all_reduce")

    def hidden(items: list[tuple[float, float]], window: float, exposed_one: float) -> float:
        total = sum(s * n for s, n in items)
        return exposed_one + max(0.0, total - exposed_one - window)

    exposed = 0.0
    if fwd:
        exposed += hidden(fwd, comp.forward, fwd[0][0])
    if bwd or red:
        last = red[-1][0] if red else 0.0
        exposed += hidden(bwd + red, comp.backward, last + (bwd[0][0] if bwd else 0.0))
    return A * exposed + step


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
    if spec.unsupported_reason() is not None:
        return f"the cell cannot run: {spec.unsupported_reason()}"
    if getattr(s, "tp", 1) > 1 or getattr(s, "pp", 1) > 1:
        return "tensor and pipeline parallel layouts are not part of the step-time model yet"
    if s.compile:
        return "torch.compile is not calibrated: the model prices eager execution only"
    if s.offload != "none":
        return "CPU offload: the host optimizer and host-device traffic are not calibrated"
    why = cm.no_comm_model_reason(spec)
    if why is not None:
        return f"no collective model: {why}"
    return None


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
    why = unmodelled_reason(spec)
    if why is not None:
        reasons["step_time_s"] = why
        return out
    A = spec.settings.grad_accum
    R = ranks_on_host(spec, cluster)
    c, mem = rates.share("compute", ranks=R), rates.share("memory", ranks=R)
    comp: Compute | None = None
    try:
        comp = micro_step_compute(spec, rates)
        plain, re = comp.total - comp.recompute, comp.recompute
        parts["compute"] = A * (c * (plain - comp.elementwise) + mem * comp.elementwise)
        parts["recompute"] = A * (c * (re - comp.recompute_elementwise) + mem * comp.recompute_elementwise)
    except Unknown as e:
        reasons["compute"] = str(e)
    try:
        elements, tensors = optimizer_elements(spec)
        opt = rates.share("optimizer", ranks=R) * rates.optimizer_s(elements=elements, tensors=tensors)
        copies = optimizer_copy_bytes(spec, elements)
        if copies:
            opt += mem * rates.elementwise_s("float32", copies, op_bytes=4.0 * elements)
        parts["optimizer"] = opt
    except Unknown as e:
        reasons["optimizer"] = str(e)
    try:
        fwd_op, bwd_op = rates.dispatch_s()
        framework = rates.framework_s(
            spec.strategy, spec.precision, blocks=spec.model_config.n_layers, elements=optimizer_elements(spec)[0]
        )
        if comp is not None:
            plain_ops = comp.ops_bwd - comp.recompute_ops
            host = A * (comp.ops_fwd * fwd_op + plain_ops * bwd_op)
            parts["other"] = c * (host + A * framework)
            if parts["recompute"] is not None:
                parts["recompute"] += c * A * comp.recompute_ops * bwd_op
    except Unknown as e:
        reasons["other"] = str(e)
    if comp is not None:
        try:
            total, exposed, _ = comm_times(spec, cluster, rates, comp, overlap=overlap and rates.overlap(
                ranks_on_host=ranks_on_host(spec, cluster)))  # fmt: skip
            parts["comm_total"], parts["comm_exposed"] = total, exposed
        except Unknown as e:
            reasons["comm"] = str(e)
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
_CALLS: dict[tuple, tuple[list[tuple[Coll, float]], float]] = {}
_PREPARED: dict[tuple, Prepared] = {}
_META: dict[int, tuple[cm.Ledger, list]] = {}
_PEAKS: dict[tuple, tuple[float | None, str | None]] = {}
_PARAMS: dict[ModelConfig, list] = {}
_UNITS: dict[ModelConfig, dict[str, int]] = {}


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
        getattr(s, "tp", 1),
        getattr(s, "pp", 1),
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
