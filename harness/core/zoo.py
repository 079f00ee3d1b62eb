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


def _knob(default, doc: str, **meta):
    """A ModelConfig field added after the first records: its default (left out of `to_dict`, so earlier run_ids
    hold), its doc, and for the scenario's validation its kind (`choices`, `number`)."""
    return dataclasses.field(default=default, metadata={"doc": doc, **meta})


NORMS = ("rms", "layer")
NORM_PLACES = ("pre", "post", "sandwich", "parallel", "parallel2")
QK_NORMS = ("none", "head", "proj")
MLPS = ("gated", "plain")
ACTS = ("silu", "gelu_tanh", "gelu")
POSITIONS = ("rope", "learned")


@dataclass(frozen=True)
class ModelConfig:
    """Dimensions of a dense decoder: by default Llama's (RMSNorm before each sublayer, SwiGLU MLP, causal SDPA
    attention with RoPE, untied head); every knob after `vocab` names a variant a current open model uses, read from
    its config.json by harness.scenario.hf_config and built by harness.worker.models."""

    d_model: int
    """hidden size (features)"""
    n_layers: int
    """transformer blocks"""
    n_heads: int
    """attention (query) heads"""
    ffn: int
    """the MLP's hidden size (features): of each of the gate/up projections (gated), of its one up projection (plain)"""
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
    head_dim: int | None = _knob(
        None, "features per head; null = d_model / n_heads (Qwen3, Gemma, Mistral-Nemo set it)"
    )
    tied_embeddings: bool = _knob(False, "the output head is the embedding's weight (Llama 3.2 1B/3B, Gemma, GPT-2)")
    o_bias: bool = _knob(False, "a bias on the attention's output projection (GPT-2, Phi)")
    mlp_bias: bool = _knob(False, "biases on the MLP's projections (GPT-2, Phi)")
    head_bias: bool = _knob(False, "a bias on the output head (Phi)")
    norm: str = _knob("rms", "rms (RMSNorm: a weight) | layer (LayerNorm: a weight and a bias)", choices=NORMS)
    norm_eps: float = _knob(1e-5, "the norms' epsilon", number=True)
    norm_place: str = _knob(
        "pre",
        "pre (a norm before each sublayer: Llama) | post (after each sublayer, before the residual add: OLMo 2) | "
        "sandwich (both: Gemma 2 and 3) | parallel (attention and MLP side by side on one norm's output: Phi, "
        "GPT-J) | parallel2 (side by side, a norm each: GPT-NeoX)",
        choices=NORM_PLACES,
    )
    qk_norm: str = _knob(
        "none",
        "none | head (an RMSNorm over each head's q and k: Qwen3, Gemma 3) | proj (over the whole q and k "
        "projections: OLMo 2)",
        choices=QK_NORMS,
    )
    mlp: str = _knob(
        "gated", "gated (act(x·W1)·(x·W3), then W2: SwiGLU, GeGLU) | plain (act(x·W1), then W2)", choices=MLPS
    )
    act: str = _knob("silu", "the MLP's activation: silu | gelu_tanh (tanh approximation) | gelu (exact)", choices=ACTS)
    positions: str = _knob(
        "rope", "rope (rotary, on q and k) | learned (a position embedding added to the input)", choices=POSITIONS
    )
    rope_dims: int | None = _knob(
        None, "features of each head RoPE rotates (partial rotary: Phi, GPT-NeoX); null = all"
    )
    rope_theta: float = _knob(10000.0, "RoPE's base", number=True)
    rope_local_theta: float | None = _knob(
        None, "RoPE's base in sliding-window layers where it differs (Gemma 3); null = rope_theta", number=True
    )
    max_positions: int | None = _knob(None, "rows of the learned position embedding (positions: learned; seq_len ≤ it)")
    sliding_window: int | None = _knob(None, "keys each query sees in a local layer (tokens); null = full attention")
    global_every: int | None = _knob(
        None, "with sliding_window: every N-th layer (the N-th, 2N-th …) attends globally; null = every layer local"
    )
    attn_softcap: float | None = _knob(
        None, "attention logits soft-capped to ±this (cap·tanh(x/cap): Gemma 2)", number=True
    )
    final_softcap: float | None = _knob(None, "output logits soft-capped to ±this (Gemma 2)", number=True)
    attn_scale_dim: int | None = _knob(
        None, "attention scores scaled by attn_scale_dim^-0.5 instead of head_dim^-0.5 (Gemma's query_pre_attn_scalar)"
    )
    embed_scale: bool = _knob(False, "the embedding's output multiplied by √d_model (Gemma)")
    data_vocab: int | None = _knob(
        None,
        "the tokenizer's vocabulary when `vocab` is padded beyond it (the pad_vocab_multiple setting sets it): "
        "token ids stay below it, the padded rows are never a target; null = vocab",
    )

    def __post_init__(self) -> None:
        # NOTE: one canonical form, so that writing a default out (head_dim = d_model / n_heads, RoPE over the
        # whole head) keeps the run_id of the model that leaves it out
        if self.head_dim is not None and self.n_heads and self.head_dim * self.n_heads == self.d_model:
            object.__setattr__(self, "head_dim", None)
        if self.rope_dims is not None and self.rope_dims == self.head_size:
            object.__setattr__(self, "rope_dims", None)
        if self.attn_scale_dim is not None and self.attn_scale_dim == self.head_size:
            object.__setattr__(self, "attn_scale_dim", None)
        if self.sliding_window is None and self.global_every is not None:
            object.__setattr__(self, "global_every", None)
        for name in NUMBER_FIELDS:
            value = getattr(self, name)
            # NOTE: an int and a float are one model; YAML 1.1 reads 1e-6 (no dot) as a string
            if isinstance(value, (int, str)) and not isinstance(value, bool):
                object.__setattr__(self, name, float(value))

    @property
    def tokens(self) -> int:
        """The token ids the batches draw from: the tokenizer's vocabulary (`data_vocab` when `vocab` is padded)."""
        return self.data_vocab or self.vocab

    def padded(self, multiple: int) -> ModelConfig:
        """This model with its vocabulary padded up to a multiple of `multiple` (embedding rows and head columns, as
        Megatron-LM's `make-vocab-size-divisible-by` × tp), the tokenizer's kept as `data_vocab`; itself when
        `multiple` ≤ 1 or the vocabulary already is one."""
        if multiple <= 1 or self.vocab % multiple == 0:
            return self
        return dataclasses.replace(self, vocab=-(-self.vocab // multiple) * multiple, data_vocab=self.tokens)

    @property
    def kv_heads(self) -> int:
        return self.n_kv_heads or self.n_heads

    @property
    def head_size(self) -> int:
        """Features per head: `head_dim`, or d_model / n_heads."""
        return self.head_dim if self.head_dim is not None else self.d_model // self.n_heads

    @property
    def q_width(self) -> int:
        """Features of the queries (and of the attention's output): n_heads · head_size."""
        return self.n_heads * self.head_size

    @property
    def kv_width(self) -> int:
        """Features of the keys and of the values: kv_heads · head_size."""
        return self.kv_heads * self.head_size

    @property
    def gated(self) -> bool:
        return self.mlp == "gated"

    @property
    def rotary_dims(self) -> int:
        """Features of each head RoPE rotates (0 with learned positions)."""
        if self.positions != "rope":
            return 0
        return self.rope_dims if self.rope_dims is not None else self.head_size

    def local_layer(self, layer: int) -> bool:
        """Whether block `layer` (from 0) attends through the sliding window."""
        if self.sliding_window is None:
            return False
        return self.global_every is None or (layer + 1) % self.global_every != 0

    def attended_keys(self, layer: int, seq_len: int) -> int:
        """Keys a query of block `layer` is counted against: the sequence, or the window in a local layer."""
        return min(seq_len, self.sliding_window) if self.local_layer(layer) and self.sliding_window else seq_len

    def shape_problem(self) -> tuple[str, str] | None:
        """(the key, why) when harness.worker.models cannot build these shapes (heads must divide d_model unless
        head_dim is given, kv heads the heads, the rotated features be even and within a head, a learned position
        table name its rows); None when it can."""
        if self.head_dim is None and self.d_model % self.n_heads:
            return "n_heads", f"d_model {self.d_model} is not divisible by n_heads {self.n_heads} (give head_dim)"
        if self.n_heads % self.kv_heads:
            return "n_kv_heads", f"n_heads {self.n_heads} is not divisible by n_kv_heads {self.kv_heads}"
        if self.positions == "rope":
            if self.rotary_dims > self.head_size:
                return "rope_dims", f"{self.rotary_dims} is more than head_dim {self.head_size}"
            if self.rotary_dims % 2:
                key = "rope_dims" if self.rope_dims else ("head_dim" if self.head_dim else "n_heads")
                return key, f"RoPE rotates pairs: {self.rotary_dims} is odd"
        elif self.max_positions is None:
            return "max_positions", "missing: learned positions need the table's rows"
        if self.global_every is not None and self.global_every < 1:
            return "global_every", f"{self.global_every} is not a positive integer"
        return None

    def to_dict(self) -> dict:
        """The dimensions as a record's `spec.model_config` (and the run_id's digest) holds them: a field added
        later (`OPTIONAL_FIELDS`) only where it differs from its default."""
        return {
            name: getattr(self, name)
            for name in _field_names(type(self))
            if name not in OPTIONAL_FIELDS or getattr(self, name) != OPTIONAL_FIELDS[name]
        }

    def knobs(self) -> dict:
        """The knobs that differ from Llama's (everything `to_dict` holds beyond the five dimensions, kv heads and
        the family): what `harness list models` shows after the dimensions."""
        out = self.to_dict()
        for key in ("d_model", "n_layers", "n_heads", "ffn", "vocab", "n_kv_heads", "family", "hf_json"):
            out.pop(key, None)
        return out

    # -- parameter counts (exact, they match `sum(p.numel())` of harness.worker.models.Transformer) --

    def norm_params(self) -> int:
        """Parameters of one norm over d_model features (RMSNorm: a weight; LayerNorm: a weight and a bias)."""
        return self.d_model * (2 if self.norm == "layer" else 1)

    def norms_per_block(self) -> int:
        """Norms over d_model features in one block: 2 (pre, post, parallel2), 4 (sandwich), 1 (parallel)."""
        return {"pre": 2, "post": 2, "sandwich": 4, "parallel": 1, "parallel2": 2}[self.norm_place]

    def qk_norm_params(self) -> int:
        """Parameters of one block's q and k norms (RMSNorm weights; 0 without qk_norm)."""
        if self.qk_norm == "head":
            return 2 * self.head_size
        if self.qk_norm == "proj":
            return self.q_width + self.kv_width
        return 0

    def block_params(self) -> int:
        """Parameters of one transformer block: q, k, v, o projections, the MLP, its norms, its biases."""
        return (
            self.block_matmul_params()
            + self.bias_params()
            + self.norms_per_block() * self.norm_params()
            + (self.qk_norm_params())
        )

    def block_matmul_params(self) -> int:
        """Weights of one block's projections (every matmul of the block)."""
        d = self.d_model
        attn = d * self.q_width + 2 * d * self.kv_width + self.q_width * d
        return attn + (3 if self.gated else 2) * d * self.ffn

    def bias_params(self) -> int:
        """Parameters of one block's projection biases (q, k, v; o; the MLP's)."""
        n = self.q_width + 2 * self.kv_width if self.qkv_bias else 0
        n += self.d_model if self.o_bias else 0
        n += ((2 if self.gated else 1) * self.ffn + self.d_model) if self.mlp_bias else 0
        return n

    def embedding_params(self) -> int:
        return self.vocab * self.d_model

    def position_params(self) -> int:
        """The learned position table's parameters (0 with RoPE)."""
        return (self.max_positions or 0) * self.d_model if self.positions == "learned" else 0

    def head_params(self) -> int:
        """The output head's own parameters: its weight (none when tied to the embedding) and its bias."""
        return (0 if self.tied_embeddings else self.vocab * self.d_model) + (self.vocab if self.head_bias else 0)

    def n_params(self) -> int:
        """All parameters: embedding (+ positions) + blocks + final norm + output head (unless tied)."""
        return (
            self.embedding_params()
            + self.position_params()
            + self.n_layers * self.block_params()
            + self.norm_params()
            + self.head_params()
        )

    def n_matmul_params(self) -> int:
        """Weights that take part in a matmul per token: every projection and the head's (the embedding's own, when
        tied), not the embedding lookup, norms or biases."""
        return self.n_layers * self.block_matmul_params() + self.vocab * self.d_model

    def parameter_inventory(self) -> tuple[Param, ...]:
        """Every parameter of the family's torch module (harness.worker.models.Transformer for the decoder) in
        `named_parameters()` order, with its shape (nn.Linear weights are (out_features, in_features); no buffers) and
        wrapping unit: what the collective and memory models shard and gather. `sum(numel) == n_params()`."""
        d, q, kv = self.d_model, self.q_width, self.kv_width
        ps = [Param("tok_emb.weight", (self.vocab, d), "root")]
        if self.positions == "learned":
            ps.append(Param("pos_emb.weight", (self.max_positions or 0, d), "root"))
        for i in range(self.n_layers):
            u = f"blocks.{i}"
            attn = [
                *_projection(f"{u}.attn.wq", (q, d), unit=u, bias=self.qkv_bias),
                *_projection(f"{u}.attn.wk", (kv, d), unit=u, bias=self.qkv_bias),
                *_projection(f"{u}.attn.wv", (kv, d), unit=u, bias=self.qkv_bias),
            ]
            if self.qk_norm != "none":
                width = (self.head_size, self.head_size) if self.qk_norm == "head" else (q, kv)
                attn += [
                    Param(f"{u}.attn.q_norm.weight", (width[0],), u),
                    Param(f"{u}.attn.k_norm.weight", (width[1],), u),
                ]
            attn += _projection(f"{u}.attn.wo", (d, q), unit=u, bias=self.o_bias)
            mlp = _projection(f"{u}.mlp.w1", (self.ffn, d), unit=u, bias=self.mlp_bias)
            if self.gated:
                mlp += _projection(f"{u}.mlp.w3", (self.ffn, d), unit=u, bias=self.mlp_bias)
            mlp += _projection(f"{u}.mlp.w2", (d, self.ffn), unit=u, bias=self.mlp_bias)
            for name in self.block_modules():
                if name == "attn":
                    ps += attn
                elif name == "mlp":
                    ps += mlp
                else:
                    ps += self._norm(f"{u}.{name}", u)
        ps += self._norm("norm", "root")
        if not self.tied_embeddings:
            ps += _projection("head", (self.vocab, d), unit="root", bias=self.head_bias)
        elif self.head_bias:
            ps.append(Param("head.bias", (self.vocab,), "root"))
        return tuple(ps)

    def lead_params(self) -> int:
        """The root's parameters the step uses before the blocks (the embedding's): their gradients come last, so a
        root unit's gradient holds all of the root's but these before the embedding's backward."""
        return self.embedding_params()

    def last_matmul_params(self) -> int:
        """The weight of a block's last matmul (the MLP's down projection): the first gradient a block's backward
        makes."""
        return self.d_model * self.ffn

    def measured_step(self, *, micro_batch: int, seq_len: int, mode: str) -> StepMeasure | None:
        """One micro-batch's step measured on fake tensors, for a family whose module the harness did not write
        (its FLOPs and saved activations cannot be derived from dimensions); None: the decoder's formulas."""
        return None

    def checkpointing_refusal(self, policy: str) -> str | None:
        """Why this family's cells cannot run under activation checkpointing `policy`, or None."""
        return None

    def unmodelled_time(self) -> str | None:
        """Why the step-time model cannot price this family's module, or None."""
        return None

    def module_trace(self, checkpointing: bool) -> tuple[list, list] | None:
        """The modules DeepSpeed ZeRO-3's hooks fetch for, when the family knows them better than the decoder's
        rule (harness.plan.zero3.zero3_module_trace); None: that rule."""
        return None

    def block_modules(self) -> tuple[str, ...]:
        """A block's submodules in registration (= forward-use) order: its norms by where they sit, `attn`, `mlp`."""
        return {
            "pre": ("attn_norm", "attn", "mlp_norm", "mlp"),
            "post": ("attn", "attn_out_norm", "mlp", "mlp_out_norm"),
            "sandwich": ("attn_norm", "attn", "attn_out_norm", "mlp_norm", "mlp", "mlp_out_norm"),
            "parallel": ("attn_norm", "attn", "mlp"),
            "parallel2": ("attn_norm", "attn", "mlp_norm", "mlp"),
        }[self.norm_place]

    def _norm(self, name: str, unit: str) -> list[Param]:
        d = self.d_model
        return [Param(f"{name}.weight", (d,), unit)] + (
            [Param(f"{name}.bias", (d,), unit)] if self.norm == "layer" else []
        )

    def attention_flops_per_token(self, seq_len: int) -> float:
        """Attention's score and value matmuls per trained token, forward + backward: 12 · q_width · keys per block,
        keys = the sequence (the full square, the PaLM convention) or the window in a local layer."""
        return 12.0 * self.q_width * sum(self.attended_keys(i, seq_len) for i in range(self.n_layers))

    def flops_per_token(self, seq_len: int) -> float:
        """Model FLOPs per trained token (forward + backward, no recompute).

        6 FLOPs per matmul parameter (2 forward, 4 backward) plus attention's score and value matmuls,
        12 · n_heads · head_dim · seq_len per block per token, the PaLM-paper convention (counts the full, not the
        causal-half, attention square; this is what "model FLOPs" for MFU means in the literature); a sliding-window
        layer counts its window instead of the sequence when that is shorter.
        """
        return 6.0 * self.n_matmul_params() + self.attention_flops_per_token(seq_len)


OPTIONAL_FIELDS: dict[str, object] = {
    "qkv_bias": False,
    "family": "decoder",
    **{f.name: f.default for f in dataclasses.fields(ModelConfig) if "doc" in f.metadata},
}
"""fields added after the first records, with the default `to_dict` leaves out"""
NUMBER_FIELDS = tuple(f.name for f in dataclasses.fields(ModelConfig) if f.metadata.get("number"))
"""the knobs that are real numbers (floats: 500000 and 500000.0 are one model, one run_id)"""
_FIELD_NAMES: dict[type, tuple[str, ...]] = {}


def _field_names(cls: type) -> tuple[str, ...]:
    """A shapes class's field names, in order (asked for every run_id: dataclasses.fields is slow)."""
    names = _FIELD_NAMES.get(cls)
    if names is None:
        names = _FIELD_NAMES[cls] = tuple(f.name for f in dataclasses.fields(cls))
    return names


@dataclass(frozen=True)
class StepMeasure:
    """One micro-batch's forward and backward of a module run on fake tensors (no memory, no compute): what the
    planner uses for a module the harness did not write, in place of the decoder's formulas."""

    flops: int
    """FLOPs of the forward and backward under torch.utils.flop_counter.FlopCounterMode (attention's full square)"""
    recompute_flops: int
    """FLOPs full activation checkpointing adds (the blocks' forwards again)"""
    saved_root: int
    """bytes saved for backward outside the blocks (the embedding's, the head's, the loss's)"""
    saved_blocks: tuple[int, ...]
    """bytes saved for backward inside each block"""
    block_inputs: int
    """bytes of the blocks' inputs: what full checkpointing keeps of each block"""
    logits: int
    """elements of the logits"""
    block_backward: int = 0
    """what a block's backward holds beyond what was live as it began, its own weights' gradients left out (the
    largest block's; torch's MemTracker): its gradients in flight"""

    @classmethod
    def of(cls, doc: dict) -> StepMeasure:
        """From the JSON a measuring child printed (harness.worker.introspect.measure_step), extra keys ignored."""
        fields = {f.name for f in dataclasses.fields(cls)}
        out = {k: v for k, v in doc.items() if k in fields}
        out["saved_blocks"] = tuple(out["saved_blocks"])
        return cls(**out)


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
    (nn.Linear weights are (out_features, in_features); no buffers). `sum(numel) == n_params()`."""
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
    "llama3.1-8b": ModelConfig(
        d_model=4096, n_layers=32, n_heads=32, ffn=14336, vocab=128256, n_kv_heads=8, rope_theta=5e5
    ),
    "llama3.1-70b": ModelConfig(
        d_model=8192, n_layers=80, n_heads=64, ffn=28672, vocab=128256, n_kv_heads=8, rope_theta=5e5
    ),
    "llama3.1-405b": ModelConfig(
        d_model=16384, n_layers=126, n_heads=128, ffn=53248, vocab=128256, n_kv_heads=8, rope_theta=5e5
    ),
    "mistral-7b": ModelConfig(
        d_model=4096, n_layers=32, n_heads=32, ffn=14336, vocab=32768, n_kv_heads=8, rope_theta=1e6
    ),
    "qwen2.5-7b": ModelConfig(
        d_model=3584,
        n_layers=28,
        n_heads=28,
        ffn=18944,
        vocab=152064,
        n_kv_heads=4,
        qkv_bias=True,
        rope_theta=1e6,
        norm_eps=1e-6,
    ),
    "qwen2.5-72b": ModelConfig(
        d_model=8192,
        n_layers=80,
        n_heads=64,
        ffn=29568,
        vocab=152064,
        n_kv_heads=8,
        qkv_bias=True,
        rope_theta=1e6,
        norm_eps=1e-6,
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
