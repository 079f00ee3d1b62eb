"""The model zoo as pure data: Llama-style decoder dimensions, parameter counts, FLOPs per token, and where each
named shape comes from (`ZOO_SOURCES`).

No torch import here: scenario expansion and `harness plan` use this module and must stay fast. The
torch modules that realise these shapes live in `harness.worker.models`.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from dataclasses import dataclass


@dataclass(frozen=True)
class ModelConfig:
    """Dimensions of a Llama-style decoder (RMSNorm, SwiGLU MLP, causal SDPA attention, RoPE, untied head)."""

    d_model: int
    """hidden size (features)"""
    n_layers: int
    """transformer blocks"""
    n_heads: int
    """attention (query) heads; head_dim = d_model / n_heads"""
    ffn: int
    """SwiGLU hidden size (features) of each of the gate/up projections"""
    vocab: int
    """vocabulary size (tokens)"""
    n_kv_heads: int | None = None
    """key/value heads for grouped-query attention; None = n_heads (multi-head attention)"""
    qkv_bias: bool = False
    """biases on the q, k and v projections (Qwen2's attention; n_heads·head_dim + 2·kv_heads·head_dim parameters
    per block); False (Llama, Mistral) is left out of `to_dict`, so every earlier cell keeps its run_id"""
    family: str = "decoder"
    """the model family (harness.core.families): which shapes and which torch module; the decoder, the default, is
    left out of `to_dict`"""

    @property
    def kv_heads(self) -> int:
        return self.n_kv_heads or self.n_heads

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_heads

    def shape_problem(self) -> tuple[str, str] | None:
        """(the key, why) when harness.worker.models cannot build these attention shapes (heads must divide
        d_model, kv heads the heads, and head_dim be even for RoPE); None when it can."""
        if self.d_model % self.n_heads:
            return "n_heads", f"d_model {self.d_model} is not divisible by n_heads {self.n_heads}"
        if self.n_heads % self.kv_heads:
            return "n_kv_heads", f"n_heads {self.n_heads} is not divisible by n_kv_heads {self.kv_heads}"
        if self.head_dim % 2:
            return "n_heads", f"head_dim {self.head_dim} must be even (RoPE)"
        return None

    def to_dict(self) -> dict:
        """The dimensions as a record's `spec.model_config` (and the run_id's digest) holds them: a field added
        later (`OPTIONAL_FIELDS`) only where it differs from its default."""
        return {
            name: getattr(self, name)
            for name in _field_names(type(self))
            if name not in OPTIONAL_FIELDS or getattr(self, name) != OPTIONAL_FIELDS[name]
        }

    # -- parameter counts (exact, they match `sum(p.numel())` of harness.worker.models.Transformer) --

    def block_params(self) -> int:
        """Parameters of one transformer block: q,k,v,o projections, SwiGLU (3 matrices), 2 RMSNorm weights."""
        d, hd = self.d_model, self.head_dim
        attn = d * d + 2 * d * (self.kv_heads * hd) + d * d
        mlp = 3 * d * self.ffn
        return attn + self.bias_params() + mlp + 2 * d

    def bias_params(self) -> int:
        """Parameters of one block's q, k and v biases (0 without `qkv_bias`)."""
        return (self.n_heads + 2 * self.kv_heads) * self.head_dim if self.qkv_bias else 0

    def embedding_params(self) -> int:
        return self.vocab * self.d_model

    def head_params(self) -> int:
        return self.vocab * self.d_model

    def n_params(self) -> int:
        """All parameters: embedding + blocks + final norm + untied output head."""
        return self.embedding_params() + self.n_layers * self.block_params() + self.d_model + self.head_params()

    def n_matmul_params(self) -> int:
        """Parameters that take part in a matmul per token (everything but the embedding lookup and norms)."""
        d, hd = self.d_model, self.head_dim
        per_block = 2 * d * d + 2 * d * (self.kv_heads * hd) + 3 * d * self.ffn
        return self.n_layers * per_block + self.head_params()

    def parameter_inventory(self) -> tuple[Param, ...]:
        """Every parameter of the family's torch module (harness.worker.models.Transformer for the decoder) in
        `named_parameters()` order, with its shape (nn.Linear weights are (out_features, in_features); no buffers) and
        wrapping unit: what the collective and memory models shard and gather. `sum(numel) == n_params()`."""
        d, hd = self.d_model, self.head_dim
        ps = [Param("tok_emb.weight", (self.vocab, d), "root")]
        for i in range(self.n_layers):
            u = f"blocks.{i}"
            ps += [
                Param(f"{u}.attn_norm.weight", (d,), u),
                *_projection(f"{u}.attn.wq", (self.n_heads * hd, d), unit=u, bias=self.qkv_bias),
                *_projection(f"{u}.attn.wk", (self.kv_heads * hd, d), unit=u, bias=self.qkv_bias),
                *_projection(f"{u}.attn.wv", (self.kv_heads * hd, d), unit=u, bias=self.qkv_bias),
                Param(f"{u}.attn.wo.weight", (d, self.n_heads * hd), u),
                Param(f"{u}.mlp_norm.weight", (d,), u),
                Param(f"{u}.mlp.w1.weight", (self.ffn, d), u),
                Param(f"{u}.mlp.w3.weight", (self.ffn, d), u),
                Param(f"{u}.mlp.w2.weight", (d, self.ffn), u),
            ]
        ps += [Param("norm.weight", (d,), "root"), Param("head.weight", (self.vocab, d), "root")]
        return tuple(ps)

    def flops_per_token(self, seq_len: int) -> float:
        """Model FLOPs per trained token (forward + backward, no recompute).

        6 FLOPs per matmul parameter (2 forward, 4 backward) plus attention's score and value matmuls,
        12 * n_layers * d_model * seq_len per token, the PaLM-paper convention (counts the full, not the
        causal-half, attention square; this is what "model FLOPs" for MFU means in the literature).
        """
        return 6.0 * self.n_matmul_params() + 12.0 * self.n_layers * self.d_model * seq_len


OPTIONAL_FIELDS: dict[str, object] = {"qkv_bias": False, "family": "decoder"}
"""fields added after the first records, with the default `to_dict` leaves out"""
_FIELD_NAMES: dict[type, tuple[str, ...]] = {}


def _field_names(cls: type) -> tuple[str, ...]:
    """A shapes class's field names, in order (asked for every run_id: dataclasses.fields is slow)."""
    names = _FIELD_NAMES.get(cls)
    if names is None:
        names = _FIELD_NAMES[cls] = tuple(f.name for f in dataclasses.fields(cls))
    return names


@dataclass(frozen=True)
class Param:
    """One parameter tensor of harness.worker.models.Transformer, in registration (= forward-use) order."""

    name: str
    shape: tuple[int, ...]
    unit: str
    """the wrapping unit: "root" (embedding, final norm, head) or "blocks.<i>" (an FSDP unit, a checkpointed block)"""

    @property
    def numel(self) -> int:
        return math.prod(self.shape)


def parameters(cfg: ModelConfig) -> list[Param]:
    """Every parameter of `harness.worker.models.Transformer(cfg)` in `named_parameters()` order, with its shape
    (nn.Linear weights are (out_features, in_features); no biases, no buffers). `sum(numel) == n_params()`."""
    return list(_parameters(cfg))


@functools.lru_cache(maxsize=256)
def _parameters(cfg: ModelConfig) -> tuple[Param, ...]:
    # NOTE: cached per model: the planner asks for every cell (a 70B model has 723 parameters)
    return cfg.parameter_inventory()


def _projection(name: str, shape: tuple[int, int], *, unit: str, bias: bool) -> list[Param]:
    """A projection's weight (out, in) and, with `bias`, its bias (out,): nn.Linear's registration order."""
    return [Param(f"{name}.weight", shape, unit)] + ([Param(f"{name}.bias", shape[:1], unit)] if bias else [])


ZOO: dict[str, ModelConfig] = {
    # CPU-sized: seconds per step on a laptop, enough structure (2 blocks) for per-layer sharding
    "tiny": ModelConfig(d_model=64, n_layers=2, n_heads=4, ffn=176, vocab=512),
    # GPT-3 / Llama-like ladder (vocab 32000, the Llama tokenizer)
    "125m": ModelConfig(d_model=768, n_layers=12, n_heads=12, ffn=2048, vocab=32000),
    "350m": ModelConfig(d_model=1024, n_layers=24, n_heads=16, ffn=2816, vocab=32000),
    "1.3b": ModelConfig(d_model=2048, n_layers=24, n_heads=16, ffn=5504, vocab=32000),
    "2.7b": ModelConfig(d_model=2560, n_layers=32, n_heads=32, ffn=6912, vocab=32000),
    "7b": ModelConfig(d_model=4096, n_layers=32, n_heads=32, ffn=11008, vocab=32000),
    "13b": ModelConfig(d_model=5120, n_layers=40, n_heads=40, ffn=13824, vocab=32000),
    "30b": ModelConfig(d_model=6656, n_layers=60, n_heads=52, ffn=17920, vocab=32000),
    "70b": ModelConfig(d_model=8192, n_layers=80, n_heads=64, ffn=28672, vocab=32000, n_kv_heads=8),
    # current open models, each from its config.json (ZOO_SOURCES); tests/unit/test_hf_config.py reads the same
    # fields from copies of those files and checks n_params() against the published count
    "llama3.1-8b": ModelConfig(d_model=4096, n_layers=32, n_heads=32, ffn=14336, vocab=128256, n_kv_heads=8),
    "llama3.1-70b": ModelConfig(d_model=8192, n_layers=80, n_heads=64, ffn=28672, vocab=128256, n_kv_heads=8),
    "llama3.1-405b": ModelConfig(d_model=16384, n_layers=126, n_heads=128, ffn=53248, vocab=128256, n_kv_heads=8),
    "mistral-7b": ModelConfig(d_model=4096, n_layers=32, n_heads=32, ffn=14336, vocab=32768, n_kv_heads=8),
    "qwen2.5-7b": ModelConfig(
        d_model=3584, n_layers=28, n_heads=28, ffn=18944, vocab=152064, n_kv_heads=4, qkv_bias=True
    ),
    "qwen2.5-72b": ModelConfig(
        d_model=8192, n_layers=80, n_heads=64, ffn=29568, vocab=152064, n_kv_heads=8, qkv_bias=True
    ),
}
"""Named sizes. 7b/13b/70b are Llama-2's shapes; the names are nominal, `n_params()` is exact."""

ZOO_SOURCES: dict[str, str] = {
    **{name: "harness ladder (GPT-3 / Llama-like widths, Llama tokenizer)" for name in ZOO},
    "tiny": "harness (CPU-sized)",
    "7b": "Llama 2 7B (meta-llama/Llama-2-7b-hf config.json)",
    "13b": "Llama 2 13B (meta-llama/Llama-2-13b-hf config.json)",
    "30b": "LLaMA 33B's shape (Touvron et al. 2023, table 2: d_model 6656, 60 layers, 52 heads)",
    "70b": "Llama 2 70B (meta-llama/Llama-2-70b-hf config.json)",
    "llama3.1-8b": "meta-llama/Llama-3.1-8B config.json; published 8.03B (model card)",
    "llama3.1-70b": "meta-llama/Llama-3.1-70B config.json; published 70.6B (model card)",
    "llama3.1-405b": "meta-llama/Llama-3.1-405B config.json; published 406B (model card)",
    "mistral-7b": "mistralai/Mistral-7B-v0.3 config.json; published 7.25B (model card)",
    "qwen2.5-7b": "Qwen/Qwen2.5-7B config.json; published 7.61B (model card)",
    "qwen2.5-72b": "Qwen/Qwen2.5-72B config.json; published 72.7B (model card)",
}
"""Where each zoo shape comes from: the config.json it was read from and the count its model card publishes"""
