"""A Hugging Face `config.json` as a model: `models: {my-8b: {hf_config: path/to/config.json}}` in a scenario.

The file's format has one typed model here (`HFConfig`: the fields every family names alike; every other field is
kept and read by its family) and one reader (`read_hf_config`). `model_config` turns it into the zoo's `ModelConfig`
for the dense decoder families `ARCHS` lists (what each builds is a row of docs/models.md): the family's fixed
traits (its norm and where it sits, its MLP, its biases, qk-norm, learned or rotary positions, embedding scale)
and the values its config gives (dimensions, explicit head_dim, tied embeddings, norm epsilon, RoPE base and
partial rotary, sliding windows and which layers use them, soft-capping, the attention's scale). A multimodal
config reads its language model (`text_config`). Anything else is refused with the field and the reason, never
approximated: a mixture of experts, an encoder-decoder, a family not in `ARCHS`, a variant the harness does not
build. RoPE scaling (`rope_scaling`, a `rope_type` other than default) is read past: it changes the rotation angles,
not a parameter, FLOP or byte, and the harness's RoPE leaves it out.

A local file only: nothing is downloaded (the harness never reaches the network at run time). Pure: no torch.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any

from pydantic import ValidationError

from harness.core.errors import InputError, Problem
from harness.core.typed import SOMETIMES, Typed, problems_of
from harness.core.zoo import ModelConfig
from harness.scenario.transformers_model import ATTN_IMPLEMENTATIONS, TransformersModel

MOE_FIELDS = ("num_local_experts", "num_experts", "n_routed_experts", "moe_intermediate_size")
"""fields whose presence (a count above 0) marks a mixture of experts"""


class HFConfig(Typed):
    """The fields of a Hugging Face `config.json` every family names alike (transformers' PretrainedConfig names);
    the others (each family's own: `n_embd`, `query_pre_attn_scalar` …) are kept as they are and read by
    `ARCHS`."""

    model_type: str
    """the architecture family: one of `ARCHS` (others refused)"""
    hidden_size: Annotated[int | None, SOMETIMES] = None
    """d_model (features)"""
    num_hidden_layers: Annotated[int | None, SOMETIMES] = None
    """transformer blocks"""
    num_attention_heads: Annotated[int | None, SOMETIMES] = None
    """query heads"""
    intermediate_size: Annotated[int | None, SOMETIMES] = None
    """the MLP's hidden size (features)"""
    vocab_size: Annotated[int | None, SOMETIMES] = None
    """vocabulary (tokens; required)"""
    num_key_value_heads: Annotated[int | None, SOMETIMES] = None
    """key/value heads (grouped-query attention); absent = num_attention_heads"""
    head_dim: Annotated[int | None, SOMETIMES] = None
    """features per head; absent = hidden_size / num_attention_heads"""
    tie_word_embeddings: Annotated[bool | None, SOMETIMES] = None
    """the output head shares the embedding's weight; absent = the family's default"""
    is_encoder_decoder: Annotated[bool, SOMETIMES] = False
    """an encoder-decoder (refused: the harness builds decoders)"""
    sliding_window: Annotated[int | None, SOMETIMES] = None
    """sliding-window attention's window (tokens)"""
    layer_types: Annotated[list[str] | None, SOMETIMES] = None
    """transformers 5: each layer's attention (full_attention | sliding_attention)"""
    architectures: Annotated[list[str] | None, SOMETIMES] = None
    """transformers' class names (shown, not checked)"""


def read_hf_config(path: Path) -> HFConfig:
    """The config.json at `path` (its language model's, when it nests one in `text_config`); InputError naming
    the file (and the key path) when it is not one."""
    return typed_config(read_hf_doc(path), file=str(path))


def typed_config(doc: dict[str, Any], *, file: str) -> HFConfig:
    """A config.json's document (`read_hf_doc`) as its typed model, transformers' defaults filled in for what its
    family's class would (`Arch.defaults`)."""
    arch = ARCHS.get(doc.get("model_type"))  # type: ignore[arg-type]
    if arch is not None:
        doc = {**arch.defaults, **doc}
    try:
        return HFConfig.model_validate(doc)
    except ValidationError as e:
        raise InputError(problems_of(e, file=file, doc=doc)) from None


def read_hf_doc(path: Path) -> dict[str, Any]:
    """The config.json at `path` as written (its language model's, when it nests one in `text_config`)."""
    try:
        text = path.read_bytes()
    except OSError as e:
        raise InputError([Problem(str(path), "", f"cannot read the Hugging Face config: {e.strerror or e}")]) from e
    try:
        doc = json.loads(text)
    except ValueError as e:
        raise InputError([Problem(str(path), "", f"not a JSON config.json: {e}")]) from e
    if not isinstance(doc, dict):
        raise InputError([Problem(str(path), "", "a config.json is a JSON object")])
    return text_model(doc)


def text_model(doc: dict[str, Any]) -> dict[str, Any]:
    """A multimodal config's language model (`text_config`, transformers' nesting: Gemma 3, Mistral 3 …) when its
    own model_type is not a family the harness builds; the config itself otherwise. The vision tower is not
    modelled: the harness trains the language model."""
    nested = doc.get("text_config")
    if doc.get("model_type") in ARCHS or not isinstance(nested, dict):
        return doc
    out = dict(nested)
    out.setdefault("model_type", f"{doc.get('model_type')}_text")
    # NOTE: a few multimodal configs keep the vocabulary or the tie at the top
    for key in ("vocab_size", "tie_word_embeddings"):
        if key not in out and key in doc:
            out[key] = doc[key]
    return out


# ---------------------------------------------------------------------------------------------------------------
# the families


@dataclass(frozen=True)
class Arch:
    """One config.json family: what it is, its fixed traits (ModelConfig knobs), and where its config names what."""

    doc: str
    traits: dict[str, Any] = field(default_factory=dict)
    """ModelConfig knobs every model of the family has"""
    names: dict[str, tuple[str, ...]] = field(default_factory=dict)
    """our dimension → the config's field names for it, first found wins (defaults: transformers' common names)"""
    tied: bool = False
    """tie_word_embeddings when the config leaves it out (the family's PretrainedConfig default)"""
    read: Callable[[Callable[[str], Any]], dict[str, Any]] = lambda get: {}
    """the knobs the family's own fields set (its biases, GPT-NeoX's parallel residual), from `get(name)`"""
    window: str = "all"
    """which layers a `sliding_window` applies to when `layer_types` is absent: all | every2 (Gemma 2) | pattern
    (Gemma 3's sliding_window_pattern) | switch (Qwen: only with use_sliding_window)"""
    refuse: Callable[[Callable[[str], Any]], list[tuple[str, str]]] = lambda get: []
    """(field, reason) for the family's variants the harness does not build"""
    defaults: dict[str, Any] = field(default_factory=dict)
    """the values transformers' config class gives a field the file leaves out (read from transformers 5.23's
    classes; a nested `text_config` often gives only what differs from them)"""


def _attention_bias(get: Callable[[str], Any]) -> dict[str, bool]:
    on = bool(get("attention_bias"))
    return {"qkv_bias": on, "o_bias": on, "mlp_bias": bool(get("mlp_bias"))}


def _all_biases(get: Callable[[str], Any]) -> dict[str, bool]:
    return {"qkv_bias": True, "o_bias": True, "mlp_bias": True}


_GEMMA = {"norm": "rms", "embed_scale": True, "mlp": "gated"}
_LAYERNORM_EPS = ("layer_norm_eps", "layer_norm_epsilon", "norm_epsilon")

ARCHS: dict[str, Arch] = {
    "llama": Arch(
        "Llama (1, 2, 3.x)",
        read=_attention_bias,
        defaults={
            "vocab_size": 32000,
            "hidden_size": 4096,
            "intermediate_size": 11008,
            "num_hidden_layers": 32,
            "num_attention_heads": 32,
            "rms_norm_eps": 1e-06,
        },
    ),
    "mistral": Arch(
        "Mistral (dense; v0.1's sliding window)",
        defaults={
            "vocab_size": 32000,
            "hidden_size": 4096,
            "intermediate_size": 14336,
            "num_hidden_layers": 32,
            "num_attention_heads": 32,
            "num_key_value_heads": 8,
            "rms_norm_eps": 1e-06,
            "sliding_window": 4096,
        },
    ),
    "qwen2": Arch(
        "Qwen2, Qwen2.5 (q, k, v biases)",
        read=lambda get: {"qkv_bias": True},
        window="switch",
        defaults={
            "vocab_size": 151936,
            "hidden_size": 4096,
            "intermediate_size": 22016,
            "num_hidden_layers": 32,
            "num_attention_heads": 32,
            "rms_norm_eps": 1e-06,
            "max_window_layers": 28,
        },
    ),
    "qwen3": Arch(
        "Qwen3 (dense: qk-norm per head, explicit head_dim)",
        {"qk_norm": "head"},
        read=_attention_bias,
        window="switch",
        defaults={
            "vocab_size": 151936,
            "hidden_size": 4096,
            "intermediate_size": 22016,
            "num_hidden_layers": 32,
            "num_attention_heads": 32,
            "head_dim": 128,
            "rms_norm_eps": 1e-06,
            "max_window_layers": 28,
        },
    ),
    "gemma": Arch(
        "Gemma (GeGLU, √d embedding scale, tied)",
        _GEMMA,
        tied=True,
        read=_attention_bias,
        defaults={
            "vocab_size": 256000,
            "hidden_size": 3072,
            "intermediate_size": 24576,
            "num_hidden_layers": 28,
            "num_attention_heads": 16,
            "num_key_value_heads": 16,
            "head_dim": 256,
            "rms_norm_eps": 1e-06,
        },
    ),
    "gemma2": Arch(
        "Gemma 2 (sandwich norms, soft-capping, alternating local/global attention)",
        {**_GEMMA, "norm_place": "sandwich"},
        tied=True,
        read=_attention_bias,
        window="every2",
        defaults={
            "vocab_size": 256000,
            "hidden_size": 2304,
            "intermediate_size": 9216,
            "num_hidden_layers": 26,
            "num_attention_heads": 8,
            "num_key_value_heads": 4,
            "head_dim": 256,
            "rms_norm_eps": 1e-06,
            "sliding_window": 4096,
            "query_pre_attn_scalar": 256,
            "attn_logit_softcapping": 50.0,
            "final_logit_softcapping": 30.0,
        },
    ),
    "gemma3_text": Arch(
        "Gemma 3's language model (sandwich norms, qk-norm, 5 local : 1 global layers)",
        {**_GEMMA, "norm_place": "sandwich", "qk_norm": "head"},
        tied=True,
        read=_attention_bias,
        window="pattern",
        defaults={
            "vocab_size": 262208,
            "hidden_size": 2304,
            "intermediate_size": 9216,
            "num_hidden_layers": 26,
            "num_attention_heads": 8,
            "num_key_value_heads": 4,
            "head_dim": 256,
            "rms_norm_eps": 1e-06,
            "sliding_window": 4096,
            "query_pre_attn_scalar": 256,
            "sliding_window_pattern": 6,
            "rope_theta": 1000000.0,
            "rope_local_base_freq": 10000.0,
        },
    ),
    "phi": Arch(
        "Phi-1, 1.5, 2 (parallel blocks, LayerNorm, GELU MLP, partial rotary, biases)",
        {"norm": "layer", "norm_place": "parallel", "mlp": "plain", "head_bias": True},
        names={"norm_eps": _LAYERNORM_EPS},
        read=_all_biases,
        refuse=lambda get: (
            [("qk_layernorm", "true: LayerNorms on q and k (the harness's qk-norm is an RMSNorm)")]
            if get("qk_layernorm")
            else []
        ),
        defaults={
            "vocab_size": 51200,
            "hidden_size": 2048,
            "intermediate_size": 8192,
            "num_hidden_layers": 24,
            "num_attention_heads": 32,
            "layer_norm_eps": 1e-05,
            "partial_rotary_factor": 0.5,
        },
    ),
    "phi3": Arch(
        "Phi-3, Phi-4 (dense; fused q/k/v and gate/up projections, same parameters)",
        defaults={
            "vocab_size": 32064,
            "hidden_size": 3072,
            "intermediate_size": 8192,
            "num_hidden_layers": 32,
            "num_attention_heads": 32,
            "rms_norm_eps": 1e-05,
        },
    ),
    "olmo2": Arch(
        "OLMo 2 (norms after each sublayer, qk-norm over the projections)",
        {"norm_place": "post", "qk_norm": "proj"},
        read=_attention_bias,
        defaults={
            "vocab_size": 50304,
            "hidden_size": 4096,
            "intermediate_size": 11008,
            "num_hidden_layers": 32,
            "num_attention_heads": 32,
            "rms_norm_eps": 1e-05,
        },
    ),
    "gpt2": Arch(
        "GPT-2 (LayerNorm, GELU MLP, learned positions, tied head, biases)",
        {"norm": "layer", "mlp": "plain", "positions": "learned"},
        names={
            "d_model": ("n_embd", "hidden_size"),
            "n_layers": ("n_layer", "num_hidden_layers"),
            "n_heads": ("n_head", "num_attention_heads"),
            "ffn": ("n_inner",),
            "norm_eps": _LAYERNORM_EPS,
            "act": ("activation_function",),
            "max_positions": ("n_positions", "max_position_embeddings"),
        },
        tied=True,
        read=_all_biases,
        defaults={
            "vocab_size": 50257,
            "n_embd": 768,
            "n_layer": 12,
            "n_head": 12,
            "n_positions": 1024,
            "layer_norm_epsilon": 1e-05,
        },
    ),
    "gpt_neox": Arch(
        "GPT-NeoX, Pythia (parallel residual, LayerNorm, GELU MLP, partial rotary)",
        {"norm": "layer", "mlp": "plain"},
        names={"norm_eps": _LAYERNORM_EPS},
        read=lambda get: {
            "qkv_bias": get("attention_bias") is not False,
            "o_bias": get("attention_bias") is not False,
            "mlp_bias": True,
            "norm_place": "pre" if get("use_parallel_residual") is False else "parallel2",
        },
        defaults={
            "vocab_size": 50432,
            "hidden_size": 6144,
            "intermediate_size": 24576,
            "num_hidden_layers": 44,
            "num_attention_heads": 64,
            "layer_norm_eps": 1e-05,
            "partial_rotary_factor": 0.25,
        },
    ),
    "starcoder2": Arch(
        "StarCoder2 (LayerNorm, GELU MLP, biases, sliding window)",
        {"norm": "layer", "mlp": "plain"},
        names={"norm_eps": _LAYERNORM_EPS},
        tied=True,
        read=lambda get: dict.fromkeys(("qkv_bias", "o_bias", "mlp_bias"), get("use_bias") is not False),
        defaults={
            "vocab_size": 49152,
            "hidden_size": 3072,
            "intermediate_size": 12288,
            "num_hidden_layers": 30,
            "num_attention_heads": 24,
            "num_key_value_heads": 2,
            "norm_epsilon": 1e-05,
        },
    ),
}
"""`model_type` values the harness builds → how"""

FAMILIES: dict[str, str] = {name: arch.doc for name, arch in ARCHS.items()}
"""`model_type` values the harness builds → what they are"""

ACTIVATIONS: dict[str, str] = {
    "silu": "silu",
    "swish": "silu",
    "gelu_pytorch_tanh": "gelu_tanh",
    "gelu_new": "gelu_tanh",
    "gelu_fast": "gelu_tanh",
    "gelu": "gelu",
}
"""a config's activation → ModelConfig.act (gelu_new and gelu_fast are tanh approximations of GELU)"""

_DEFAULT_NAMES: dict[str, tuple[str, ...]] = {
    "d_model": ("hidden_size",),
    "n_layers": ("num_hidden_layers",),
    "n_heads": ("num_attention_heads",),
    "ffn": ("intermediate_size",),
    "vocab": ("vocab_size",),
    "norm_eps": ("rms_norm_eps",),
    "act": ("hidden_activation", "hidden_act"),
    "max_positions": ("max_position_embeddings",),
}

DIMENSIONS: dict[str, str] = {
    "d_model": "hidden_size",
    "n_layers": "num_hidden_layers",
    "n_heads": "num_attention_heads",
    "ffn": "intermediate_size",
    "vocab": "vocab_size",
}
"""ModelConfig's dimension → the config.json field it is read from (most families; GPT-2 names its own)"""


def _getter(hf: HFConfig) -> Callable[[str], Any]:
    return hf.field


def refusals(hf: HFConfig) -> list[tuple[str, str]]:
    """(field, reason) for what in `hf` the harness cannot build as it is; empty when it can. What a model *is* is
    refused first, alone (an encoder-decoder, a mixture of experts, a family not in `ARCHS`: one line, its own);
    a family's variants the harness lacks are listed together."""
    get = _getter(hf)
    if hf.is_encoder_decoder:
        return [("is_encoder_decoder", "an encoder-decoder model; the harness builds decoder-only transformers")]
    for name in MOE_FIELDS:
        value = get(name)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return [(name, f"{value}: a mixture of experts; the harness builds dense decoders only")]
    arch = ARCHS.get(hf.model_type)
    if arch is None:
        allowed = ", ".join(ARCHS)
        return [("model_type", f"{hf.model_type!r} is not a family the harness builds ({allowed})")]
    out = list(arch.refuse(get))
    act = _first(get, _names(arch, "act"))
    if act is not None and act not in ACTIVATIONS:
        out.append((_names(arch, "act")[0], f"{act!r}: the harness builds {', '.join(ACTIVATIONS)}"))
    return out


def _names(arch: Arch, key: str) -> tuple[str, ...]:
    return arch.names.get(key, _DEFAULT_NAMES.get(key, ()))


def _first(get: Callable[[str], Any], names: tuple[str, ...]) -> Any:
    for name in names:
        value = get(name)
        if value is not None:
            return value
    return None


def _rope(get: Callable[[str], Any]) -> dict[str, Any]:
    """RoPE's base (global layers, and local ones where they differ) and partial rotary factor: transformers 5's
    `rope_parameters` (flat, or one per layer type) or the older top-level fields."""
    params = get("rope_parameters")
    params = params if isinstance(params, dict) else {}
    per_type = {k: v for k, v in params.items() if isinstance(v, dict)}
    glob = per_type.get("full_attention", params)
    local = per_type.get("sliding_attention", {})
    theta = glob.get("rope_theta", get("rope_theta"))
    local_theta = local.get("rope_theta", get("rope_local_base_freq"))
    factor = glob.get("partial_rotary_factor", get("partial_rotary_factor"))
    if factor is None:
        factor = get("rotary_pct")
    return {"theta": theta, "local_theta": local_theta, "factor": factor}


def _window(hf: HFConfig, arch: Arch, n_layers: int) -> tuple[dict[str, Any], list[tuple[str, str]]]:
    """The sliding window and the layers it applies to, as ModelConfig knobs; or why not."""
    get = _getter(hf)
    window = hf.sliding_window
    if arch.window == "switch" and not get("use_sliding_window"):
        return {}, []
    if window is None:
        return {}, []
    if hf.layer_types is not None:
        local = [t == "sliding_attention" for t in hf.layer_types]
    elif arch.window == "every2":
        local = [(i + 1) % 2 != 0 for i in range(n_layers)]
    elif arch.window == "pattern":
        k = get("sliding_window_pattern") or get("_sliding_window_pattern") or 6
        local = [(i + 1) % k != 0 for i in range(n_layers)]
    elif arch.window == "switch":
        first = get("max_window_layers") or 0
        local = [i >= first for i in range(n_layers)]
    else:
        local = [True] * n_layers
    if not any(local):
        return {}, []
    if all(local):
        return {"sliding_window": window}, []
    for k in range(2, n_layers + 1):
        if all(local[i] == ((i + 1) % k != 0) for i in range(n_layers)):
            return {"sliding_window": window, "global_every": k}, []
    globals_ = [i for i, is_local in enumerate(local) if not is_local]
    why = f"global attention on layers {globals_}: the harness builds every N-th layer global, or none"
    return {}, [("layer_types" if hf.layer_types is not None else "sliding_window", why)]


def model_config(hf: HFConfig, *, file: str) -> ModelConfig:
    """The ModelConfig `hf` describes; InputError with one line per field the harness cannot build."""
    refused = refusals(hf)
    if refused:
        raise InputError([Problem(file, name, f"cannot build: {why}") for name, why in refused])
    arch = ARCHS[hf.model_type]
    get = _getter(hf)
    dims: dict[str, Any] = {key: _first(get, _names(arch, key)) for key in DIMENSIONS}
    if hf.model_type == "gpt2" and dims["ffn"] is None and isinstance(dims["d_model"], int):
        dims["ffn"] = 4 * dims["d_model"]  # GPT2MLP: n_inner or 4 × n_embd
    bad = [
        Problem(file, _names(arch, key)[0], "missing (required)" if v is None else f"{v!r} is not a positive integer")
        for key, v in dims.items()
        if not isinstance(v, int) or isinstance(v, bool) or v < 1
    ]
    kv = hf.num_key_value_heads
    if kv is not None and kv < 1:
        bad.append(Problem(file, "num_key_value_heads", f"{kv!r} is not a positive integer"))
    if bad:
        raise InputError(bad)
    knobs: dict[str, Any] = {**arch.traits, **arch.read(get)}
    knobs["tied_embeddings"] = arch.tied if hf.tie_word_embeddings is None else hf.tie_word_embeddings
    knobs["head_dim"] = hf.head_dim
    eps = _first(get, _names(arch, "norm_eps"))
    if eps is not None:
        knobs["norm_eps"] = float(eps)
    act = _first(get, _names(arch, "act"))
    if act is not None:
        knobs["act"] = ACTIVATIONS[act]
    elif "gemma" in hf.model_type:
        knobs["act"] = "gelu_tanh"
    if knobs.get("positions") == "learned":
        knobs["max_positions"] = _first(get, _names(arch, "max_positions"))
    else:
        rope = _rope(get)
        if rope["theta"] is not None:
            knobs["rope_theta"] = float(rope["theta"])
        if rope["local_theta"] is not None and rope["local_theta"] != rope["theta"]:
            knobs["rope_local_theta"] = float(rope["local_theta"])
        head = hf.head_dim or dims["d_model"] // dims["n_heads"]
        if rope["factor"] is not None:
            knobs["rope_dims"] = int(head * float(rope["factor"]))
    window, why = _window(hf, arch, dims["n_layers"])
    if why:
        raise InputError([Problem(file, name, f"cannot build: {reason}") for name, reason in why])
    knobs.update(window)
    for ours, theirs in (("attn_softcap", "attn_logit_softcapping"), ("final_softcap", "final_logit_softcapping")):
        if get(theirs) is not None:
            knobs[ours] = float(get(theirs))
    if get("query_pre_attn_scalar") is not None:
        knobs["attn_scale_dim"] = int(get("query_pre_attn_scalar"))
    return ModelConfig(**dims, n_kv_heads=kv, **knobs)


def load_hf_model(path: Path) -> ModelConfig:
    """`read_hf_config` then `model_config`: the model a scenario's `hf_config` names."""
    return model_config(read_hf_config(path), file=str(path))


# ---------------------------------------------------------------------------------------------------------------
# a scenario's `models:` entry


ENTRY_KEYS = ("implementation", "attn_implementation")
"""what a `hf_config` model entry may say beside the path"""
IMPLEMENTATIONS = ("harness", "transformers")
"""`implementation`: the harness's own decoder (default), or the transformers class itself"""
HF_CONFIG_KEY = "hf_config"
"""`models: {NAME: {hf_config: path/to/config.json}}`: the model's dimensions from a Hugging Face config file (a
path relative to the scenario file; a model's folder reads the config.json in it)"""


def hf_config_path(raw: str, *, scenario_file: str) -> Path:
    """An `hf_config` path as written in a scenario: relative to the scenario file's folder (or absolute); a model's
    folder (a Hugging Face snapshot: `models/Llama-3.1-8B`) stands for the config.json inside it."""
    path = Path(raw).expanduser()
    path = path if path.is_absolute() else Path(scenario_file).parent / path
    return path / "config.json" if path.is_dir() else path


def hf_model_entry(entry: dict[str, Any], *, file: str, where: str, problems: list[Problem]) -> ModelConfig | None:
    """The model a scenario's `hf_config` entry names, or None with its problems appended (the entry's, naming the
    scenario `file` and key path `where`; the config's, naming the config file)."""
    others = sorted(str(k) for k in entry if k not in (HF_CONFIG_KEY, *ENTRY_KEYS))
    raw = entry[HF_CONFIG_KEY]
    if others:
        allowed = ", ".join(ENTRY_KEYS)
        problems.append(
            Problem(
                file, where, f"hf_config stands alone (or with {allowed}): {', '.join(others)} cannot be given with it"
            )
        )
        return None
    implementation = entry.get("implementation", "harness")
    attn = entry.get("attn_implementation")
    if implementation not in IMPLEMENTATIONS:
        problems.append(
            Problem(file, f"{where}.implementation", f"{implementation!r} is not one of {', '.join(IMPLEMENTATIONS)}")
        )
        return None
    if attn is not None and (implementation != "transformers" or attn not in ATTN_IMPLEMENTATIONS):
        why = (
            f"{attn!r} is not one of {', '.join(ATTN_IMPLEMENTATIONS)}"
            if implementation == "transformers"
            else "only with implementation: transformers"
        )
        problems.append(Problem(file, f"{where}.attn_implementation", why))
        return None
    if not isinstance(raw, str) or not raw:
        problems.append(Problem(file, f"{where}.{HF_CONFIG_KEY}", f"{raw!r} is not a path to a config.json"))
        return None
    path = hf_config_path(raw, scenario_file=file)
    try:
        doc = read_hf_doc(path)
        cfg = model_config(typed_config(doc, file=str(path)), file=str(path))
    except InputError as e:
        problems.extend(e.problems)
        return None
    bad = cfg.shape_problem()
    if bad is not None:
        key = {
            "n_heads": "num_attention_heads",
            "n_kv_heads": "num_key_value_heads",
            "rope_dims": "partial_rotary_factor",
        }.get(bad[0], bad[0])
        problems.append(Problem(str(path), key, f"cannot build: {bad[1]}"))
        return None
    if implementation == "transformers":
        # NOTE: the config as written (its language model's): transformers fills in its own defaults
        text = json.dumps(doc, sort_keys=True, separators=(",", ":"))
        fields = {f.name: getattr(cfg, f.name) for f in dataclasses.fields(ModelConfig) if f.name != "family"}
        default_attn = "eager" if cfg.attn_softcap is not None else "sdpa"
        return TransformersModel(**fields, hf_json=text, attn_implementation=attn or default_attn)
    return cfg


def model_sources(raw: Any, models: dict[str, ModelConfig], *, file: str) -> dict[str, str]:
    """Where each (valid) scenario model's dimensions come from: `hf_config <path>`, `factory <target>`, or the
    scenario file itself."""
    out = {}
    for name in models:
        path, factory = raw[name].get(HF_CONFIG_KEY), raw[name].get("factory")
        if factory:
            out[name] = f"factory {factory}"
        else:
            out[name] = f"hf_config {hf_config_path(path, scenario_file=file)}" if path else Path(file).name
    return out
