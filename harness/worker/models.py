"""The dense decoder in torch: by default Llama's (RMSNorm, SwiGLU, causal SDPA attention with RoPE, untied output
head), and every variant `ModelConfig` names (tied embeddings, explicit head_dim, qk-norm, biases, LayerNorm, post-
and sandwich norms, GeGLU and GELU MLPs, partial rotary or learned positions, sliding-window and alternating
local/global attention, soft-capped logits, parallel blocks): harness.scenario.hf_config reads them from a
config.json, and tests/unit/test_transformers_parity.py holds this module to the transformers classes.

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
        self.tied = False
        """the weight is another module's (a tied head's is the embedding's): that module initialises it"""
        super().__init__(d_in, d_out, bias=bias)

    def reset_parameters(self) -> None:
        if not self.tied:
            keyed_normal_(self.weight, seed=self.init_seed, key=self.init_key, std=self.init_std)
        if self.bias is not None and not self.bias.is_meta:
            with torch.no_grad():
                self.bias.zero_()


class KeyedEmbedding(nn.Embedding):
    def __init__(self, vocab: int, d: int, *, key: int, seed: int, std: float = 1.0):
        self.init_key, self.init_seed, self.init_std = key, seed, std
        super().__init__(vocab, d)

    def reset_parameters(self) -> None:
        keyed_normal_(self.weight, seed=self.init_seed, key=self.init_key, std=self.init_std)


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


def make_norm(cfg: ModelConfig, d: int | None = None) -> nn.Module:
    """The model's norm over `d` features (d_model by default): RMSNorm, or LayerNorm with a bias."""
    width = d or cfg.d_model
    if cfg.norm == "layer":
        return nn.LayerNorm(width, eps=cfg.norm_eps)
    return RMSNorm(width, eps=cfg.norm_eps)


_ROPE_CACHE: dict[tuple, tuple[torch.Tensor, torch.Tensor]] = {}
_MASK_CACHE: dict[tuple, torch.Tensor] = {}


def rope_cos_sin(
    seq_len: int, head_dim: int, device: torch.device, dtype: torch.dtype, base: float = 10000.0
) -> tuple[torch.Tensor, torch.Tensor]:
    """cos/sin tables (seq, head_dim/2), cached per (seq, head_dim, device, dtype, base); not module buffers,
    so sharding wrappers never see or shard them."""
    k = (seq_len, head_dim, str(device), dtype) + ((base,) if base != 10000.0 else ())
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


def attention_mask(seq_len: int, window: int | None, device: torch.device, dtype: torch.dtype) -> torch.Tensor:
    """(seq, seq) additive mask in `dtype`: 0 where query i may attend key j (j ≤ i, and i − j < window in a local
    layer), −inf elsewhere. Cached like the RoPE tables: a constant, which SDPA and the soft-capped attention keep
    for backward without a copy per layer."""
    k = (seq_len, window, str(device), dtype)
    if k in _MASK_CACHE:
        return _MASK_CACHE[k]
    i = torch.arange(seq_len, device=device)
    allowed = i[None, :] <= i[:, None]
    if window is not None:
        allowed = allowed & (i[:, None] - i[None, :] < window)
    mask = torch.zeros(seq_len, seq_len, device=device, dtype=dtype).masked_fill(~allowed, float("-inf"))
    if not torch.compiler.is_compiling():
        _MASK_CACHE[k] = mask
    return mask


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x: (batch, heads, seq, head_dim); rotate interleaved-half pairs."""
    x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2 :]
    return torch.cat((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1)


def apply_partial_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, dims: int) -> torch.Tensor:
    """RoPE over the first `dims` features of each head, the rest passed through (Phi's, GPT-NeoX's)."""
    if dims == x.shape[-1]:
        return apply_rope(x, cos, sin)
    return torch.cat((apply_rope(x[..., :dims], cos, sin), x[..., dims:]), dim=-1)


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig, *, layer: int, seed: int):
        super().__init__()
        d, hd = cfg.d_model, cfg.head_size
        self.n_heads, self.kv_heads, self.head_dim = cfg.n_heads, cfg.kv_heads, hd
        self.window = cfg.sliding_window if cfg.local_layer(layer) else None
        local_theta = cfg.rope_local_theta if self.window is not None else None
        self.rotary, self.theta = cfg.rotary_dims, local_theta or cfg.rope_theta
        self.softcap = cfg.attn_softcap
        self.scale = cfg.attn_scale_dim**-0.5 if cfg.attn_scale_dim else None
        self.qk_norm = cfg.qk_norm
        base = 16 * (layer + 1)
        out_std = INIT_STD / math.sqrt(2 * cfg.n_layers)
        self.wq = KeyedLinear(d, cfg.q_width, key=base + 0, seed=seed, bias=cfg.qkv_bias)
        self.wk = KeyedLinear(d, cfg.kv_width, key=base + 1, seed=seed, bias=cfg.qkv_bias)
        self.wv = KeyedLinear(d, cfg.kv_width, key=base + 2, seed=seed, bias=cfg.qkv_bias)
        if cfg.qk_norm != "none":
            q, k = (hd, hd) if cfg.qk_norm == "head" else (cfg.q_width, cfg.kv_width)
            self.q_norm, self.k_norm = RMSNorm(q, eps=cfg.norm_eps), RMSNorm(k, eps=cfg.norm_eps)
        self.wo = KeyedLinear(cfg.q_width, d, key=base + 3, seed=seed, std=out_std, bias=cfg.o_bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        q, k, v = self.wq(x), self.wk(x), self.wv(x)
        if self.qk_norm == "proj":
            q, k = self.q_norm(q), self.k_norm(k)
        q = q.view(b, t, -1, self.head_dim).transpose(1, 2)
        k = k.view(b, t, -1, self.head_dim).transpose(1, 2)
        v = v.view(b, t, -1, self.head_dim).transpose(1, 2)
        if self.qk_norm == "head":
            q, k = self.q_norm(q), self.k_norm(k)
        if self.rotary:
            cos, sin = rope_cos_sin(t, self.rotary, x.device, q.dtype, self.theta)
            q, k = apply_partial_rope(q, cos, sin, self.rotary), apply_partial_rope(k, cos, sin, self.rotary)
        if k.shape[1] != q.shape[1]:
            rep = q.shape[1] // k.shape[1]
            k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
        window = self.window if self.window is not None and self.window < t else None
        if self.softcap is not None:
            y = self._softcapped(q, k, v, window)
        elif window is not None:
            mask = attention_mask(t, window, x.device, q.dtype)
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=self.scale)
        else:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=self.scale)
        return self.wo(y.transpose(1, 2).reshape(b, t, -1))

    def _softcapped(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, window: int | None) -> torch.Tensor:
        """Attention with its logits soft-capped (Gemma 2): no fused kernel takes the cap, so the scores are
        materialised (seq² per head, saved for backward: harness.plan.activations prices them)."""
        assert self.softcap is not None
        scale = self.scale if self.scale is not None else self.head_dim**-0.5
        scores = torch.matmul(q, k.transpose(-2, -1)) * scale
        scores = torch.tanh(scores / self.softcap) * self.softcap + attention_mask(
            q.shape[2], window, q.device, q.dtype
        )
        probs = F.softmax(scores, dim=-1, dtype=torch.float32).to(q.dtype)
        return torch.matmul(probs, v)


ACTIVATIONS = {
    "silu": F.silu,
    "gelu_tanh": lambda x: F.gelu(x, approximate="tanh"),
    "gelu": F.gelu,
}
"""the MLP's activation functions by `ModelConfig.act`"""


class MLP(nn.Module):
    """The block's MLP: gated (SwiGLU, GeGLU: w2(act(w1·x) · w3·x)) or plain (w2(act(w1·x)))."""

    def __init__(self, cfg: ModelConfig, *, layer: int, seed: int):
        super().__init__()
        base = 16 * (layer + 1) + 8
        out_std = INIT_STD / math.sqrt(2 * cfg.n_layers)
        self.act = ACTIVATIONS[cfg.act]
        self.w1 = KeyedLinear(cfg.d_model, cfg.ffn, key=base + 0, seed=seed, bias=cfg.mlp_bias)
        if cfg.gated:
            self.w3 = KeyedLinear(cfg.d_model, cfg.ffn, key=base + 1, seed=seed, bias=cfg.mlp_bias)
        self.w2 = KeyedLinear(cfg.ffn, cfg.d_model, key=base + 2, seed=seed, std=out_std, bias=cfg.mlp_bias)
        self.gated = cfg.gated

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.gated:
            return self.w2(self.act(self.w1(x)) * self.w3(x))
        return self.w2(self.act(self.w1(x)))


SwiGLU = MLP
"""the decoder's MLP under its first name"""


class Block(nn.Module):
    """One transformer block: the unit every sharding strategy wraps. Its norms sit where `cfg.norm_place` says."""

    # the submodules `cfg.block_modules()` registers (a norm only where its placement has one)
    attn: nn.Module
    mlp: nn.Module
    attn_norm: nn.Module
    attn_out_norm: nn.Module
    mlp_norm: nn.Module
    mlp_out_norm: nn.Module

    def __init__(self, cfg: ModelConfig, *, layer: int, seed: int):
        super().__init__()
        self.place = cfg.norm_place
        for name in cfg.block_modules():
            if name == "attn":
                self.attn = Attention(cfg, layer=layer, seed=seed)
            elif name == "mlp":
                self.mlp = MLP(cfg, layer=layer, seed=seed)
            else:
                setattr(self, name, make_norm(cfg))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.place == "pre":
            x = x + self.attn(self.attn_norm(x))
            return x + self.mlp(self.mlp_norm(x))
        if self.place == "post":
            x = x + self.attn_out_norm(self.attn(x))
            return x + self.mlp_out_norm(self.mlp(x))
        if self.place == "sandwich":
            x = x + self.attn_out_norm(self.attn(self.attn_norm(x)))
            return x + self.mlp_out_norm(self.mlp(self.mlp_norm(x)))
        if self.place == "parallel":
            h = self.attn_norm(x)
            return self.attn(h) + self.mlp(h) + x
        a = self.attn(self.attn_norm(x))  # NOTE: attention first, as registered (ZeRO-3's module trace reads the order)
        return self.mlp(self.mlp_norm(x)) + a + x


class Transformer(nn.Module):
    def __init__(self, cfg: ModelConfig, *, seed: int = 0):
        super().__init__()
        self.cfg = cfg
        self.tok_emb = KeyedEmbedding(cfg.vocab, cfg.d_model, key=1, seed=seed)
        if cfg.positions == "learned":
            self.pos_emb = KeyedEmbedding(cfg.max_positions or 0, cfg.d_model, key=3, seed=seed, std=INIT_STD)
        self.blocks = nn.ModuleList(Block(cfg, layer=i, seed=seed) for i in range(cfg.n_layers))
        self.norm = make_norm(cfg)
        self.head = KeyedLinear(cfg.d_model, cfg.vocab, key=2, seed=seed, bias=cfg.head_bias)
        if cfg.tied_embeddings:
            # NOTE: one Parameter under two modules, as transformers ties them: `named_parameters()` lists it once
            # (the embedding's), the head's call still uses it (so ZeRO-3's hooks fetch it for the head)
            self.head.weight = self.tok_emb.weight
            self.head.tied = True
            object.__setattr__(self.head, "tie_source", self.tok_emb)  # NOTE: not a submodule: no second registration

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        """tokens (batch, seq) → logits (batch, seq, vocab)."""
        x = embed(self.cfg, self.tok_emb, getattr(self, "pos_emb", None), tokens)
        for block in self.blocks:
            x = block(x)
        return output_logits(self.cfg, self.head(self.norm(x)))


def embed(cfg: ModelConfig, tok_emb: nn.Module, pos_emb: nn.Module | None, tokens: torch.Tensor) -> torch.Tensor:
    """The residual stream's start: the token embedding (times √d_model with `embed_scale`), plus the learned
    position embedding. The model's and a first pipeline stage's."""
    x = tok_emb(tokens)
    if cfg.embed_scale:
        x = x * torch.tensor(cfg.d_model**0.5, dtype=x.dtype)
    if pos_emb is not None:
        pos = pos_emb(torch.arange(tokens.shape[1], device=tokens.device))
        if type(x) is torch.Tensor:
            return x + pos
        from torch.distributed.tensor import DTensor, Replicate

        if isinstance(x, DTensor):
            # sequence parallelism: the embedding's output is a DTensor sharded over the sequence (layouts keeps it
            # one); DTensor adds this rank's rows of the (replicated) positions, no communication; the backward
            # all-gathers the position gradient's shards. Then the local shard, as the blocks take it.
            summed = cast(DTensor, x + DTensor.from_local(pos, x.device_mesh, [Replicate()], run_check=False))
            x = summed.to_local()
        else:
            x = x + pos
    return x


def output_logits(cfg: ModelConfig, logits: torch.Tensor) -> torch.Tensor:
    """The head's output, soft-capped with `final_softcap`. The model's and a last pipeline stage's."""
    if cfg.final_softcap is not None:
        logits = torch.tanh(logits / cfg.final_softcap) * cfg.final_softcap
    return logits


def loss_fn(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean next-token cross-entropy, computed in fp32."""
    return F.cross_entropy(logits.float().view(-1, logits.shape[-1]), targets.reshape(-1))


def init_module_(module: nn.Module) -> None:
    """Re-draw a module's own (non-recursive) parameters from their keyed streams; a tied head takes the
    embedding's weight again (materialising a meta-built module one module at a time, as FSDP1 does, gives the
    head a weight of its own otherwise: the embedding is materialised first, as it is registered first)."""
    if isinstance(module, INIT_MODULES):
        module.reset_parameters()
    hf_init = getattr(module, "harness_init", None)  # a transformers class's module (harness.worker.hf_models)
    if hf_init is not None:
        hf_init()
    source = getattr(module, "tie_source", None)
    if source is not None and module.weight is not source.weight:
        module.weight = source.weight


INIT_MODULES = (KeyedLinear, KeyedEmbedding, RMSNorm, nn.LayerNorm)
"""the modules that own parameters, each initialised by its own reset_parameters"""


def has_keyed_init(module: nn.Module) -> bool:
    """Whether `init_module_` initialises `module`'s own parameters (the decoder's modules, and every module of a
    transformers class built by harness.worker.hf_models)."""
    return isinstance(module, INIT_MODULES) or hasattr(module, "harness_init")


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
        start = int(torch.randint(0, cfg.tokens, (1,), generator=g))
        stride = int(torch.randint(1, 8, (1,), generator=g))
        rows.append((start + stride * torch.arange(seq_len + 1)) % cfg.tokens)
    data = torch.stack(rows).to(device)
    return data[:, :-1].contiguous(), data[:, 1:].contiguous()
