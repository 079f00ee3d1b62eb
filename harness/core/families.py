"""The model families the harness trains: one entry each, naming the planner's shapes and the worker's builder.

A family is:

- its **shapes** for the planner: a frozen dataclass with harness.core.zoo.ModelConfig's interface (its fields are
  the model keys a scenario and a record give; `parameter_inventory` lists every parameter with its shape and
  wrapping unit, from which the counts, the collective bytes and the sharded memory follow; `flops_per_token`;
  `shape_problem`). The decoder's is ModelConfig itself; a family that differs subclasses it and overrides what
  differs.
- its **builder** for the worker: `module:callable` taking (shapes, *, seed) and returning the torch module. The
  module keeps the decoder's layout where the strategies reach into it: `blocks` (an nn.ModuleList: each block is
  an FSDP unit, a checkpointed unit, a pipeline cut point), and for tensor and pipeline parallelism the decoder's
  names (`tok_emb`, `norm`, `head`, a block's `attn.wq` …) or the layouts refuse the cell.

A scenario's model says `family: NAME` (absent: `decoder`); the record's `spec.model_config` carries it when it is
not the decoder, so every earlier run_id holds. Adding one is an entry here (docs/extending.md, "A model family");
tests/unit/test_extending.py registers one in a fresh interpreter and sweeps it.

Floor 0: no torch, no import from the rest of the harness but the zoo.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from harness.core.zoo import ModelConfig

DEFAULT_FAMILY = "decoder"
_NO_LAYOUTS = (
    "the {family} model family does not compose with tensor or pipeline parallelism here (the layouts shard and cut "
    "the decoder's modules by name)"
)


@dataclass(frozen=True)
class Family:
    """One model family."""

    name: str
    """what a model's `family` key says"""
    shapes: type[ModelConfig]
    """the planner's view: its fields are the model keys, its methods the counts and the parameter inventory"""
    builder: str
    """`module:callable` (shapes, *, seed) → torch module, imported by harness.worker.models where it builds"""
    doc: str = ""
    layout_refusal: str | None = _NO_LAYOUTS
    """why its cells cannot run with tensor or pipeline parallelism (its module lacks the decoder's names the layouts
    shard and cut by), or None when they can"""
    zero_init: bool = True
    """ZeRO-3 builds its module under `deepspeed.zero.Init` (the builder initialises inside the modules'
    constructors, as the decoder's keyed modules do); False: built whole, then partitioned by deepspeed.initialize"""
    preload: tuple[str, ...] = ()
    """modules a local sweep's warm zygote imports for this family's cells (harness.launch.local.prefork), which
    each rank would otherwise import itself"""


FAMILIES: dict[str, Family] = {
    DEFAULT_FAMILY: Family(
        DEFAULT_FAMILY,
        ModelConfig,
        "harness.worker.models:Transformer",
        "Llama-style decoder: RMSNorm, SwiGLU MLP, causal attention with RoPE, untied head",
        layout_refusal=None,
    ),
}
"""every family, by name"""


def register(family: Family) -> None:
    """Add a family (a site's, or a test's); before the stages read a model that names it."""
    if family.name in FAMILIES:
        raise ValueError(f"model family {family.name!r} exists already")
    if not (isinstance(family.shapes, type) and issubclass(family.shapes, ModelConfig)):
        raise TypeError(f"model family {family.name!r}: its shapes must be a ModelConfig (sub)class")
    FAMILIES[family.name] = family


def family_of(dims: Mapping[str, Any]) -> Family | None:
    """The family a model's dimensions name (`family`, default the decoder); None for a name no entry has."""
    name = dims.get("family", DEFAULT_FAMILY)
    return FAMILIES.get(name) if isinstance(name, str) else None


def model_keys(family: Family) -> dict[str, str]:
    """The model keys of a family, each with its kind: `bool`, `count` (a positive integer, null where its default
    is null), `required` (a positive integer that must be given), `number` (a positive number, null where its
    default is null), `choice` (one of the field's `choices`: `key_choices`) or `family` (the family's own name)."""
    out: dict[str, str] = {}
    for f in dataclasses.fields(family.shapes):
        if f.name == "family":
            out[f.name] = "family"
        elif str(f.type) == "bool":
            out[f.name] = "bool"
        elif "choices" in f.metadata:
            out[f.name] = "choice"
        elif f.metadata.get("text"):
            out[f.name] = "text"
        elif f.metadata.get("number"):
            out[f.name] = "number"
        else:
            out[f.name] = "required" if f.default is dataclasses.MISSING else "count"
    return out


def key_choices(family: Family, key: str) -> tuple[str, ...]:
    """The values a `choice` model key allows."""
    return next(f.metadata["choices"] for f in dataclasses.fields(family.shapes) if f.name == key)


def dimension_problems(dims: Mapping[str, Any]) -> list[tuple[str, str]]:
    """(key, sentence) for every reason `dims` are not a model of their family; [] when `shapes(dims)` builds one.
    An unknown key's sentence is "" (each caller words it: a scenario lists the known keys, a record's reader says a
    newer harness wrote it)."""
    family = family_of(dims)
    if family is None:
        return [("family", f"{dims.get('family')!r} is not one of {', '.join(FAMILIES)}")]
    kinds = model_keys(family)
    out: list[tuple[str, str]] = []
    for key, value in dims.items():
        kind = kinds.get(key)
        if kind is None:
            out.append((key, ""))
        elif kind == "bool" and not isinstance(value, bool):
            out.append((key, f"{value!r} is not true or false"))
        elif kind in ("count", "required") and not _count(value, nullable=kind == "count"):
            out.append((key, f"{value!r} is not a positive integer"))
        elif kind == "number" and not _number(value):
            out.append((key, f"{value!r} is not a positive number"))
        elif kind == "text" and not isinstance(value, str):
            out.append((key, f"{value!r} is not a string"))
        elif kind == "choice" and value not in key_choices(family, key):
            out.append((key, f"{value!r} is not one of {', '.join(key_choices(family, key))}"))
    out += [(k, "missing (required)") for k, kind in kinds.items() if kind == "required" and k not in dims]
    return out


def _count(value: Any, *, nullable: bool) -> bool:
    if value is None:
        return nullable
    return isinstance(value, int) and not isinstance(value, bool) and value >= 1


def _number(value: Any) -> bool:
    if value is None:
        return True
    if isinstance(value, str):  # NOTE: YAML 1.1 (PyYAML) reads 1e-6, without a dot, as a string
        try:
            value = float(value)
        except ValueError:
            return False
    return isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0


def shapes_of(dims: Mapping[str, Any]) -> ModelConfig:
    """The family's shapes built from `dims` (which dimension_problems found none in)."""
    family = family_of(dims)
    if family is None:
        raise ValueError(f"model family {dims.get('family')!r} is not one of {', '.join(FAMILIES)}")
    return family.shapes(**dims)
