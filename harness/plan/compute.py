"""The compute model: seconds of one micro-step's matmuls, attention and elementwise work on one rank, from the
model's own operations at the rates of `harness.plan.calibration.Rates` (docs/time-model.md: formulas).

Every matmul of the forward and the backward at the calibrated throughput of its GEMM shape and layout (forward
x·Wᵀ "nt", input gradient dY·W "nn", weight gradient dYᵀ·X "tn"), SDPA attention forward and backward at its
calibrated rate for (sequence, heads), and the elementwise and normalisation work as bytes moved at the calibrated
bandwidth. The bytes and op counts per block and outside the blocks were traced op by op from
`harness.worker.models.Transformer` with a TorchDispatchMode (`BLOCK_BYTES`, `OPS`; tests/unit/test_time_model.py
re-traces them). Activation checkpointing's recompute: `full` recomputes every matmul but w2 (non-reentrant early
stop), attention and the elementwise work; `selective` only the elementwise work. And the optimizer step's elements
and copies.

Pure arithmetic, no torch import; every result is a function of frozen inputs, cached with functools.cache.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

from harness.core import precisions
from harness.core.catalogue import CATALOGUE
from harness.core.zoo import ModelConfig, parameters
from harness.plan.calibration import Rates
from harness.plan.flops import precision_mode
from harness.plan.memory import shard_degree_of, unit_sizes
from harness.scenario.spec import RunSpec

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
IN_STEP_OPERAND_BYTES = math.inf
"""the operand size every elementwise byte of a step is priced at (`Rates.elementwise_s`'s op_bytes): beyond the
caches — the largest operand the calibration measured (its curve is clamped at the ends: 64 MiB in fp32, 32 MiB in
bf16). Inside a step an op's operands were written ops ago, and the step's working set is far larger than the
caches; an activation-sized operand priced at the cache-resident bandwidth of a product timed alone on the same
buffers (63-81 GB/s at 64 KiB on the development host, against 10-12 GB/s beyond the caches) under-priced the
non-matmul work of small shapes 2.3-5x (bench/probe_compute.py: at this size the measured plain step of eight
shapes, d_model 64-512, seq 128-512, vocab 1k-32k, within -5 … +7 %; docs/time-model.md)."""


def compute_kind(precision: str) -> str:
    """The sharing figure a cell's compute is stretched by on a shared CPU host (Rates.share): its matmuls' dtype's"""
    dtype = precisions.get(precision).dtype
    return "compute" if dtype == "float32" else f"compute_{dtype}"


def dot(coeffs: tuple[float, ...], xs: tuple[float, ...]) -> float:
    """Σ coefficient × quantity: bytes moved from a table's coefficients (`BLOCK_BYTES`, `ROOT_BYTES`)."""
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
    d, hd = cfg.d_model, cfg.head_size
    return [
        ("wq", cfg.n_heads * hd, d),
        ("wk", cfg.kv_heads * hd, d),
        ("wv", cfg.kv_heads * hd, d),
        ("wo", d, cfg.n_heads * hd),
        ("w1", cfg.ffn, d),
        *([("w3", cfg.ffn, d)] if cfg.gated else []),
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


def block_ops(mode: str, policy: str) -> tuple[int, int]:
    """(forward, backward) host-dispatched ops of one block in precision `mode` under checkpointing `policy` (the
    backward's include the recompute)."""
    return OPS[mode]["block"] if policy == "none" else RECOMPUTE_OPS[(mode, policy)]


def micro_step_compute(spec: RunSpec, rates: Rates, *, batch: int | None = None) -> Compute:
    """Matmuls, attention and elementwise work of one micro-step (raises Unknown when a rate is missing): of
    `batch` sequences (default: the micro-batch; a pipeline's microbatch is smaller), on this rank's tensor-parallel
    shard of every block and of the head."""
    s = spec.settings
    return compute_of(
        spec.model_config,
        mode=precision_mode(spec.strategy, spec.precision),
        precision=spec.precision,
        batch=s.micro_batch if batch is None else batch,
        seq_len=s.seq_len,
        policy=s.activation_checkpointing,
        tp=s.tp,
        sequence_parallel=s.sequence_parallel and s.tp > 1,
        rates=rates,
    )


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


@functools.cache
def compute_of(
    cfg: ModelConfig,
    *,
    mode: str,
    precision: str,
    batch: int,
    seq_len: int,
    policy: str,
    tp: int,
    sequence_parallel: bool,
    rates: Rates,
) -> Compute:
    """`micro_step_compute` from exactly what it reads (cached: cells that differ in nothing here, e.g. in strategy
    within one precision mode, or in world size, share it): the model, its precision mode (fp32, autocast, lowp),
    the precision, sequences and tokens per sequence, the checkpointing policy, this rank's tensor-parallel degree
    and whether the norms are sequence-parallel."""
    dt = precisions.get(precision).dtype
    ew_dt = "float32" if mode == "fp32" else dt
    tokens, seq = batch * seq_len, seq_len
    d, ffn, hd = cfg.d_model, cfg.ffn, cfg.head_size
    sp = sequence_parallel

    # the isolated rates' factors inside a step (a CPU calibration's in-step probes; 1 otherwise)
    k_kern, k_ew, _ = rates.in_step(dt)

    def gemm_time(gs: list[Gemm]) -> float:
        return k_kern * sum(rates.gemm_s(dt, g.m, g.n, g.k, g.layout) for g in gs)

    fwd_mm = bwd_mm = recompute_mm = 0.0
    linears = tp_linears(cfg, tp)
    for name, out_f, in_f in linears:
        f, b = linear_gemms(tokens, out_f, in_f)
        fwd_mm += gemm_time(f)
        bwd_mm += gemm_time(b)
        if policy == "full" and name != "w2":  # checkpoint's early stop: w2's output is saved by nothing
            recompute_mm += gemm_time(f)
    att = dict(batch=batch, heads=cfg.n_heads // tp, seq=seq, head_dim=hd)
    if cfg.attn_softcap is None:
        att_fwd = k_kern * rates.attention_s(dt, phase="forward", **att)
        att_bwd = k_kern * rates.attention_s(dt, phase="backward", **att)
    else:
        att_fwd, att_bwd = eager_attention_s(rates, dt, ew_dt, k_kern, k_ew, **att)
    p_block = sum(o * i for _, o, i in linears)
    if tp == 1:
        xs: tuple[float, ...] = (tokens * d, tokens * ffn, tokens * cfg.n_heads, seq * hd, d, p_block)
    else:
        # NOTE: heads and ffn columns are this rank's; the d-wide work (norms, residual adds) is whole without
        # sequence parallelism and a sequence shard with it (docs/time-model.md: tensor parallelism)
        td = tokens * d / (tp if sp else 1)
        xs = (td, tokens * ffn / tp, tokens * cfg.n_heads / tp, seq * hd, d, p_block)
    vocab = cfg.vocab if tp == 1 else -(-cfg.vocab // tp)  # the head column-wise, the embedding row-wise

    def ew(nbytes: float) -> float:
        return k_ew * rates.elementwise_s(ew_dt, nbytes, op_bytes=IN_STEP_OPERAND_BYTES)

    bf, bb = BLOCK_BYTES[mode]
    ew_fwd, ew_bwd = ew(dot(bf, xs)), ew(dot(bb, xs))
    block_fwd = fwd_mm + att_fwd + ew_fwd
    block_bwd = bwd_mm + att_bwd + ew_bwd
    block_recompute = ew_recompute = 0.0
    if policy != "none":
        ew_recompute = ew(dot(RECOMPUTE_BYTES[mode], xs))
        block_recompute = recompute_mm + (att_fwd if policy == "full" else 0.0) + ew_recompute
    hf, hb = linear_gemms(tokens, vocab, d)
    rf, rb = ROOT_BYTES[mode]
    root_td = xs[0]

    def root_ew(c: tuple[float, ...], *, embedding: bool) -> float:
        # the loss's T × vocab fp32 logits, the vocab × d embedding gradient and the activation-sized rest
        nbytes = c[0] * root_td + c[3] * d + c[4] * tokens + c[1] * tokens * vocab
        if embedding:
            nbytes += c[2] * vocab * d
        return ew(nbytes)

    emb_grad = ew(rb[2] * vocab * d)
    root_ew_fwd, root_ew_bwd = root_ew(rf, embedding=True), root_ew(rb, embedding=False)
    root_fwd = gemm_time(hf) + root_ew_fwd
    root_bwd_head = gemm_time(hb) + root_ew_bwd
    root_bwd_emb = emb_grad
    L = cfg.n_layers
    blk_ops, root_ops = block_ops(mode, policy), OPS[mode]["root"]
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


EAGER_SCORE_BYTES = (24.0, 40.0)
"""(forward, backward) bytes moved per attention score by soft-capped (eager) attention's elementwise ops, in
units of the compute dtype's element plus the fp32 softmax: the scale, the cap's divide, tanh and multiply, the
mask's add, the fp32 softmax and its cast (priced from the op list of harness.worker.models.Attention._softcapped,
not traced as the decoder's tables are)"""


def eager_attention_s(
    rates: Rates, dt: str, ew_dt: str, k_kern: float, k_ew: float, *, batch: int, heads: int, seq: int, head_dim: int
) -> tuple[float, float]:
    """(forward, backward) seconds of soft-capped attention (no fused kernel takes the cap): its two batched matmuls
    per head (scores q·kᵀ, output p·v; backward twice that) at the GEMM rates, and its seq² elementwise work at the
    elementwise bandwidth."""
    n = batch * heads
    qk = Gemm(seq, seq, head_dim, "nt")
    pv = Gemm(seq, head_dim, seq, "nn")
    fwd_mm = n * (rates.gemm_s(dt, qk.m, qk.n, qk.k, qk.layout) + rates.gemm_s(dt, pv.m, pv.n, pv.k, pv.layout))
    scores = n * seq * seq
    ew = [k_ew * rates.elementwise_s(ew_dt, c * scores, op_bytes=IN_STEP_OPERAND_BYTES) for c in EAGER_SCORE_BYTES]
    return k_kern * fwd_mm + ew[0], 2 * k_kern * fwd_mm + ew[1]


def host_per_op(rates: Rates, precision: str) -> tuple[float, float]:
    """(forward op, backward op) host overhead inside a step of `precision` (s): the isolated per-op cost times the
    calibration's in-step host factor (raises Unknown without a per-op cost)."""
    fwd, bwd = rates.dispatch_s()
    k = rates.in_step(precisions.get(precision).dtype)[2]
    return k * fwd, k * bwd


# --------------------------------------------------------------------------------------------------
# the optimizer step


@functools.cache
def optimizer_elements(cfg: ModelConfig, *, strategy: str, gpus: int, gpus_per_node: int) -> tuple[float, int]:
    """(parameter elements this rank's AdamW updates, tensors it updates them as) of a cell without tensor or pipeline
    parallelism."""
    entry = CATALOGUE[strategy]
    n_tensors = len(parameters(cfg))
    if entry.memory_model == "ddp":
        return float(cfg.n_params()), n_tensors
    if entry.memory_model in ("fsdp1", "fsdp2"):
        nshard = shard_degree_of(strategy, gpus=gpus, gpus_per_node=gpus_per_node)
        if entry.memory_model == "fsdp1" and gpus == 1:
            nshard = 1
        return float(sum(-(-u // nshard) for _, u in unit_sizes(cfg))), n_tensors
    # DeepSpeed: one flat fp32 partition (ZeRO-1/2), per-parameter partitions grouped in sub-groups (ZeRO-3)
    return float(-(-cfg.n_params() // gpus)), 1


def optimizer_copy_bytes(strategy: str, precision: str, elements: float) -> float:
    """Bytes a ZeRO step moves besides AdamW: the gradient partition into the fp32 master's dtype and the updated
    master back into the model's parameters (16-bit: 2 + 4 bytes each way; fp32 stages 1/2: a copy each way)."""
    entry = CATALOGUE[strategy]
    if entry.memory_model != "zero":
        return 0.0
    if precision == "fp32":
        return 0.0 if strategy == "zero3" else 16.0 * elements
    return 12.0 * elements


def clear_caches() -> None:
    """Forget every micro-step's compute and optimizer size (tests compare cold and warm predictions)."""
    for f in (compute_of, optimizer_elements):
        f.cache_clear()
