"""A Hugging Face `config.json` as a model: `models: {my-8b: {hf_config: path/to/config.json}}` in a scenario.

The file's format has one typed model here (`HFConfig`, the fields the harness reads; every other field is kept and
ignored) and one reader (`read_hf_config`). `model_config` turns it into the zoo's `ModelConfig` for the dense
decoder families the harness builds (harness.worker.models: RMSNorm, SwiGLU, RoPE, untied head): Llama, Mistral,
Qwen2. Anything else is refused with the field and the reason, never approximated: a mixture of experts, an
encoder-decoder, another MLP or norm (GPT-NeoX's GELU MLP with biases and LayerNorm), tied embeddings, a head_dim
other than hidden_size / num_attention_heads, sliding-window attention. RoPE's theta and scaling change neither
FLOPs nor memory, so they are read past (the harness's RoPE uses base 10000).

A local file only: nothing is downloaded (the harness never reaches the network at run time). Pure: no torch.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

from pydantic import ValidationError

from harness.core.errors import InputError, Problem
from harness.core.typed import SOMETIMES, Typed, problems_of
from harness.core.zoo import ModelConfig

FAMILIES: dict[str, str] = {
    "llama": "Llama (1, 2, 3.x)",
    "mistral": "Mistral (dense)",
    "qwen2": "Qwen2, Qwen2.5 (q, k, v biases)",
}
"""`model_type` values the harness builds → what they are"""

QKV_BIAS_FAMILIES = ("qwen2",)
"""families whose q, k and v projections always carry biases (transformers' Qwen2Attention: bias=True)"""

MOE_FIELDS = ("num_local_experts", "num_experts", "n_routed_experts", "moe_intermediate_size")
"""fields whose presence (a count above 0) marks a mixture of experts"""


class HFConfig(Typed):
    """The fields of a Hugging Face `config.json` the harness reads (transformers' PretrainedConfig names); every
    other field is kept as it is and ignored."""

    model_type: str
    """the architecture family: llama | mistral | qwen2 (others refused)"""
    hidden_size: Annotated[int | None, SOMETIMES] = None
    """d_model (features); required of the families the harness builds (an encoder-decoder names it otherwise)"""
    num_hidden_layers: Annotated[int | None, SOMETIMES] = None
    """transformer blocks (required)"""
    num_attention_heads: Annotated[int | None, SOMETIMES] = None
    """query heads (required)"""
    intermediate_size: Annotated[int | None, SOMETIMES] = None
    """the SwiGLU MLP's hidden size (features; required)"""
    vocab_size: Annotated[int | None, SOMETIMES] = None
    """vocabulary (tokens; required)"""
    num_key_value_heads: Annotated[int | None, SOMETIMES] = None
    """key/value heads (grouped-query attention); absent = num_attention_heads"""
    head_dim: Annotated[int | None, SOMETIMES] = None
    """features per head; absent = hidden_size / num_attention_heads (the only value the harness builds)"""
    tie_word_embeddings: Annotated[bool, SOMETIMES] = False
    """the output head shares the embedding's weight (refused: the harness builds an untied head)"""
    hidden_act: Annotated[str, SOMETIMES] = "silu"
    """the MLP's activation: silu (SwiGLU) is what the harness builds"""
    attention_bias: Annotated[bool, SOMETIMES] = False
    """biases on every attention projection (Llama's option; refused)"""
    mlp_bias: Annotated[bool, SOMETIMES] = False
    """biases on the MLP's projections (refused)"""
    is_encoder_decoder: Annotated[bool, SOMETIMES] = False
    """an encoder-decoder (refused: the harness builds decoders)"""
    sliding_window: Annotated[int | None, SOMETIMES] = None
    """sliding-window attention's window (tokens); refused where it is in use (the harness prices full attention)"""
    use_sliding_window: Annotated[bool | None, SOMETIMES] = None
    """Qwen2's switch for sliding_window (false: the window is not used)"""
    architectures: Annotated[list[str] | None, SOMETIMES] = None
    """transformers' class names (shown, not checked)"""


def read_hf_config(path: Path) -> HFConfig:
    """The config.json at `path`; InputError naming the file (and the key path) when it is not one."""
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
    try:
        return HFConfig.model_validate(doc)
    except ValidationError as e:
        raise InputError(problems_of(e, file=str(path), doc=doc)) from None


def refusals(hf: HFConfig) -> list[tuple[str, str]]:
    """(field, reason) for everything in `hf` the harness cannot build as it is; empty when it can."""
    out: list[tuple[str, str]] = []
    if hf.is_encoder_decoder:
        out.append(("is_encoder_decoder", "an encoder-decoder model; the harness builds decoder-only transformers"))
    for name in MOE_FIELDS:
        value = hf.field(name)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            out.append((name, f"{value}: a mixture of experts; the harness builds dense decoders only"))
    if hf.model_type not in FAMILIES:
        allowed = ", ".join(FAMILIES)
        out.append(("model_type", f"{hf.model_type!r} is not a family the harness builds ({allowed})"))
    if hf.hidden_act != "silu":
        out.append(("hidden_act", f"{hf.hidden_act!r}: the harness builds a SwiGLU MLP (silu)"))
    if hf.tie_word_embeddings:
        out.append(("tie_word_embeddings", "true: the harness builds an untied output head"))
    for name in ("attention_bias", "mlp_bias"):
        if hf.field(name):
            out.append((name, "true: the harness builds projections without biases (only Qwen2's q, k, v have one)"))
    if hf.head_dim is not None and hf.num_attention_heads and hf.head_dim * hf.num_attention_heads != hf.hidden_size:
        out.append(
            (
                "head_dim",
                f"{hf.head_dim} × {hf.num_attention_heads} heads is not hidden_size {hf.hidden_size}: the harness "
                "builds head_dim = hidden_size / num_attention_heads",
            )
        )
    window_used = hf.use_sliding_window if hf.model_type == "qwen2" else True
    if hf.sliding_window is not None and window_used:
        out.append(
            (
                "sliding_window",
                f"{hf.sliding_window}: sliding-window attention; the harness builds and prices full causal attention",
            )
        )
    return out


def model_config(hf: HFConfig, *, file: str) -> ModelConfig:
    """The ModelConfig `hf` describes; InputError with one line per field the harness cannot build."""
    refused = refusals(hf)
    if refused:
        raise InputError([Problem(file, name, f"cannot build: {why}") for name, why in refused])
    dims = {key: hf.field(key) for key in DIMENSIONS.values()}
    bad = [
        Problem(file, key, "missing (required)" if v is None else f"{v!r} is not a positive integer")
        for key, v in dims.items()
        if v is None or v < 1
    ]
    kv = hf.num_key_value_heads
    if kv is not None and kv < 1:
        bad.append(Problem(file, "num_key_value_heads", f"{kv!r} is not a positive integer"))
    if bad:
        raise InputError(bad)
    return ModelConfig(
        **{ours: dims[theirs] for ours, theirs in DIMENSIONS.items()},
        n_kv_heads=kv,
        qkv_bias=hf.model_type in QKV_BIAS_FAMILIES,
    )


DIMENSIONS: dict[str, str] = {
    "d_model": "hidden_size",
    "n_layers": "num_hidden_layers",
    "n_heads": "num_attention_heads",
    "ffn": "intermediate_size",
    "vocab": "vocab_size",
}
"""ModelConfig's dimension → the config.json field it is read from"""


def load_hf_model(path: Path) -> ModelConfig:
    """`read_hf_config` then `model_config`: the model a scenario's `hf_config` names."""
    return model_config(read_hf_config(path), file=str(path))


# ---------------------------------------------------------------------------------------------------------------
# a scenario's `models:` entry


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
    others = sorted(str(k) for k in entry if k != HF_CONFIG_KEY)
    raw = entry[HF_CONFIG_KEY]
    if others:
        problems.append(Problem(file, where, f"hf_config stands alone: {', '.join(others)} cannot be given with it"))
        return None
    if not isinstance(raw, str) or not raw:
        problems.append(Problem(file, f"{where}.{HF_CONFIG_KEY}", f"{raw!r} is not a path to a config.json"))
        return None
    path = hf_config_path(raw, scenario_file=file)
    try:
        cfg = load_hf_model(path)
    except InputError as e:
        problems.extend(e.problems)
        return None
    bad = cfg.shape_problem()
    if bad is not None:
        key = {"n_heads": "num_attention_heads", "n_kv_heads": "num_key_value_heads"}.get(bad[0], bad[0])
        problems.append(Problem(str(path), key, f"cannot build: {bad[1]}"))
        return None
    return cfg


def model_sources(raw: Any, models: dict[str, ModelConfig], *, file: str) -> dict[str, str]:
    """Where each (valid) scenario model's dimensions come from: `hf_config <path>`, or the scenario file itself."""
    out = {}
    for name in models:
        path = raw[name].get(HF_CONFIG_KEY)
        out[name] = f"hf_config {hf_config_path(path, scenario_file=file)}" if path else Path(file).name
    return out
