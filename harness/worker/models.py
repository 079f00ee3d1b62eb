"""Llama-style decoder in torch: RMSNorm, SwiGLU, causal SDPA attention with RoPE (q, k, v biases for Qwen2's
shape), untied output head.

Initialisation is keyed: every weight-bearing leaf module owns an `init_key` and draws its values from a
generator seeded with (seed, init_key), so the weights are the same however the model is built (eagerly,
on the meta device then materialised per module by FSDP, or under `deepspeed.zero.Init`) and whatever
order the strategy initialises modules in. On a given device type, every strategy trains the same model.
"""

from __future__ import annotations

import importlib
import math
from typing import cast

import torch
import torch.nn.functional as F
from torch import nn

from harness.core.families import FAMILIES
from harness.core.zoo import ModelConfig

INIT_STD = 0.02


def _keyed_generator(device: torch.device, seed: int, key: int) -> torch.Generator:
    g = torch.Generator(device=device)
    g.manual_seed((seed * 1_000_003 + key) % (2**63 - 1))
    return g


def keyed_normal_(t: torch.Tensor, *, seed: int, key: int, std: float) -> None:
    """Fill `t` with N(0, std²) from the (seed, key) stream; drawn in fp32 so every dtype sees the same values."""
    if t.is_meta:
        return
    with torch.no_grad():
        g = _keyed_generator(t.device, seed, key)
        vals = torch.empty(t.shape, dtype=torch.float32, device=t.device).normal_(0.0, std, generator=g)
        t.copy_(vals)


class KeyedLinear(nn.Linear):
    """nn.Linear (without bias unless asked: Qwen2's q, k, v) whose reset_parameters draws its weight from its own
    (seed, key) stream; a bias starts at zero."""

    def __init__(self, d_in: int, d_out: int, *, key: int, seed: int, std: float = INIT_STD, bias: bool = False):
        self.init_key, self.init_seed, self.init_std = key, seed, std
        super().__init__(d_in, d_out, bias=bias)

    def reset_parameters(self) -> None:
        keyed_normal_(self.weight, seed=self.init_seed, key=self.init_key, std=self.init_std)
        if self.bias is not None and not self.bias.is_meta:
            with torch.no_grad():
                self.bias.zero_()


class KeyedEmbedding(nn.Embedding):
    def __init__(self, vocab: int, d: int, *, key: int, seed: int):
        self.init_key, self.init_seed = key, seed
        super().__init__(vocab, d)

    def reset_parameters(self) -> None:
        keyed_normal_(self.weight, seed=self.init_seed, key=self.init_key, std=1.0)


class RMSNorm(nn.Module):
    def __init__(self, d: int, eps: float = 1e-5):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(d))

    def reset_parameters(self) -> None:
        if not self.weight.is_meta:
            with torch.no_grad():
                self.weight.fill_(1.0)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # NOTE: normalise in fp32 (as Llama does), return in the input dtype
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return xf.type_as(x) * self.weight


_ROPE_CACHE: dict[tuple, tuple[torch.Tensor, torch.Tensor]] = {}


def rope_cos_sin(
    seq_len: int, head_dim: int, device: torch.device, dtype: torch.dtype, base: float = 10000.0
) -> tuple[torch.Tensor, torch.Tensor]:
    """cos/sin tables (seq, head_dim/2), cached per (seq, head_dim, device, dtype); not module buffers,
    so sharding wrappers never see or shard them."""
    k = (seq_len, head_dim, str(device), dtype)
    if k in _ROPE_CACHE:
        return _ROPE_CACHE[k]
    inv = 1.0 / (base ** (torch.arange(0, head_dim, 2, device=device, dtype=torch.float32) / head_dim))
    ang = torch.outer(torch.arange(seq_len, device=device, dtype=torch.float32), inv)
    tables = (ang.cos().to(dtype), ang.sin().to(dtype))
    # NOTE: never fill the cache from compiled code: under activation checkpointing, dynamo refuses a
    # forward that mutates outside state ("HOP: Unsafe side effect") and runs the whole block eagerly
    if not torch.compiler.is_compiling():
        _ROPE_CACHE[k] = tables
    return tables


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x: (batch, heads, seq, head_dim); rotate interleaved-half pairs."""
    x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2 :]
    return torch.cat((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1)


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig, *, layer: int, seed: int):
        super().__init__()
        d, hd = cfg.d_model, cfg.head_dim
        self.n_heads, self.kv_heads, self.head_dim = cfg.n_heads, cfg.kv_heads, hd
        base = 16 * (layer + 1)
        out_std = INIT_STD / math.sqrt(2 * cfg.n_layers)
        self.wq = KeyedLinear(d, cfg.n_heads * hd, key=base + 0, seed=seed, bias=cfg.qkv_bias)
        self.wk = KeyedLinear(d, cfg.kv_heads * hd, key=base + 1, seed=seed, bias=cfg.qkv_bias)
        self.wv = KeyedLinear(d, cfg.kv_heads * hd, key=base + 2, seed=seed, bias=cfg.qkv_bias)
        self.wo = KeyedLinear(cfg.n_heads * hd, d, key=base + 3, seed=seed, std=out_std)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        q = self.wq(x).view(b, t, self.n_heads, self.head_dim).transpose(1, 2)
        k = self.wk(x).view(b, t, self.kv_heads, self.head_dim).transpose(1, 2)
        v = self.wv(x).view(b, t, self.kv_heads, self.head_dim).transpose(1, 2)
        cos, sin = rope_cos_sin(t, self.head_dim, x.device, q.dtype)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        if self.kv_heads != self.n_heads:
            rep = self.n_heads // self.kv_heads
            k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.wo(y.transpose(1, 2).reshape(b, t, -1))


class SwiGLU(nn.Module):
    def __init__(self, cfg: ModelConfig, *, layer: int, seed: int):
        super().__init__()
        base = 16 * (layer + 1) + 8
        out_std = INIT_STD / math.sqrt(2 * cfg.n_layers)
        self.w1 = KeyedLinear(cfg.d_model, cfg.ffn, key=base + 0, seed=seed)
        self.w3 = KeyedLinear(cfg.d_model, cfg.ffn, key=base + 1, seed=seed)
        self.w2 = KeyedLinear(cfg.ffn, cfg.d_model, key=base + 2, seed=seed, std=out_std)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class Block(nn.Module):
    """One transformer block: the unit every sharding strategy wraps."""

    def __init__(self, cfg: ModelConfig, *, layer: int, seed: int):
        super().__init__()
        self.attn_norm = RMSNorm(cfg.d_model)
        self.attn = Attention(cfg, layer=layer, seed=seed)
        self.mlp_norm = RMSNorm(cfg.d_model)
        self.mlp = SwiGLU(cfg, layer=layer, seed=seed)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.attn_norm(x))
        return x + self.mlp(self.mlp_norm(x))


class Transformer(nn.Module):
    def __init__(self, cfg: ModelConfig, *, seed: int = 0):
        super().__init__()
        self.cfg = cfg
        self.tok_emb = KeyedEmbedding(cfg.vocab, cfg.d_model, key=1, seed=seed)
        self.blocks = nn.ModuleList(Block(cfg, layer=i, seed=seed) for i in range(cfg.n_layers))
        self.norm = RMSNorm(cfg.d_model)
        self.head = KeyedLinear(cfg.d_model, cfg.vocab, key=2, seed=seed)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        """tokens (batch, seq) → logits (batch, seq, vocab)."""
        x = self.tok_emb(tokens)
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x))


def loss_fn(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean next-token cross-entropy, computed in fp32."""
    return F.cross_entropy(logits.float().view(-1, logits.shape[-1]), targets.reshape(-1))


def init_module_(module: nn.Module) -> None:
    """Re-draw a module's own (non-recursive) parameters from their keyed streams."""
    if isinstance(module, (KeyedLinear, KeyedEmbedding, RMSNorm)):
        module.reset_parameters()


def new_model(cfg: ModelConfig, *, seed: int) -> nn.Module:
    """The torch module of `cfg`'s family (harness.core.families: its builder), on the current default device."""
    family = FAMILIES[cfg.family]
    module, _, attr = family.builder.partition(":")
    return getattr(importlib.import_module(module), attr)(cfg, seed=seed)


def build_model(cfg: ModelConfig, *, seed: int, device: torch.device | str) -> nn.Module:
    """Build with weights on `device` (use "meta" to build without memory and materialise later)."""
    with torch.device(device):
        return new_model(cfg, seed=seed)


def blocks_of(model: nn.Module) -> nn.ModuleList:
    """A model's blocks (`model.blocks`, every family's): its FSDP units, checkpointed units and pipeline cuts."""
    return cast(nn.ModuleList, model.blocks)


def block_types(model: nn.Module) -> set[type[nn.Module]]:
    """The classes of a model's blocks: its FSDP1 wrap units, whatever its family."""
    return {type(b) for b in blocks_of(model)}


SELECTIVE_SAVE_OPS = (
    "mm",
    "addmm",
    "bmm",
    "_scaled_dot_product_flash_attention",
    "_scaled_dot_product_efficient_attention",
    "_scaled_dot_product_cudnn_attention",
    "_scaled_dot_product_flash_attention_for_cpu",
)
"""aten ops whose outputs the `selective` policy keeps from the forward: every matmul and the attention kernel.
What is left to recompute (norms, RoPE, SiLU, products, casts) costs no matmul FLOPs."""


def _selective_policy():
    from torch.utils.checkpoint import CheckpointPolicy

    save = {getattr(torch.ops.aten, name).default for name in SELECTIVE_SAVE_OPS if hasattr(torch.ops.aten, name)}

    def policy(ctx, op, *args, **kwargs):
        return CheckpointPolicy.MUST_SAVE if op in save else CheckpointPolicy.PREFER_RECOMPUTE

    return policy


def apply_activation_checkpointing(model: nn.Module, policy: str = "full") -> None:
    """Wrap every Block in a non-reentrant checkpoint: `full` recomputes the block in backward; `selective`
    keeps the outputs of its matmuls and attention (`SELECTIVE_SAVE_OPS`) and recomputes only the rest.

    NOTE: applied before any sharding wrapper, as torchtitan does, so FSDP units wrap checkpointed blocks.
    """
    import functools

    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import CheckpointImpl, checkpoint_wrapper
    from torch.utils.checkpoint import create_selective_checkpoint_contexts

    if policy not in ("full", "selective"):
        raise ValueError(f"activation checkpointing policy {policy!r}: expected full or selective")
    extra = {}
    if policy == "selective":
        extra["context_fn"] = functools.partial(create_selective_checkpoint_contexts, _selective_policy())
    blocks = blocks_of(model)
    for i, block in enumerate(blocks):
        blocks[i] = checkpoint_wrapper(block, checkpoint_impl=CheckpointImpl.NO_REENTRANT, **extra)


def synthetic_batch(
    cfg: ModelConfig,
    *,
    seed: int,
    rank: int,
    micro_batch: int,
    seq_len: int,
    micro_step: int = 0,
    device: torch.device | str = "cpu",
) -> tuple[torch.Tensor, torch.Tensor]:
    """Deterministic token batch for (seed, global row): rows of rank r are rows r*mb … (r+1)*mb-1 of the
    global batch, so a single process holding all rows sees exactly what the ranks see together.

    The tokens follow a learnable pattern (each row is an arithmetic progression mod vocab with a random
    start and stride), so a training run's loss visibly decreases.
    """
    rows = []
    for i in range(micro_batch):
        row_id = (micro_step * 1_000_003) + rank * micro_batch + i
        g = torch.Generator().manual_seed(seed * 7919 + row_id)
        start = int(torch.randint(0, cfg.vocab, (1,), generator=g))
        stride = int(torch.randint(1, 8, (1,), generator=g))
        rows.append((start + stride * torch.arange(seq_len + 1)) % cfg.vocab)
    data = torch.stack(rows).to(device)
    return data[:, :-1].contiguous(), data[:, 1:].contiguous()
