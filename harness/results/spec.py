"""The cell's JSON form: the one pair of functions that writes a `RunSpec` (harness.scenario.spec) as the flat `spec`
object of a record, a payload, a tune log, a history row or `harness plan --format json`, and reads it back.

Every other stage passes the typed cell; none builds or reads its dict. `SpecJSON` is the field type the file models
use (`Record.spec`, `Payload.spec`, a tune log's candidates), so pydantic calls these two functions on every read and
write.

Reading keeps every record the harness ever wrote: the GPU count written as `world_size` (before 2026-12) is read as
`gpus`; `activation_checkpointing: true/false` (before the policies) as `full`/`none`; a setting a record lacks (added
after it was written) at its default; a key this version does not know (a newer harness's setting) kept in the
cell's `extra`, written back and part of its identity. A spec that names no cell (a core key missing, a value of the
wrong type) is refused with the key path, the value and what was expected: the record is then unreadable, with that
reason, because a measurement whose cell cannot be told is no measurement of any cell.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Mapping
from typing import Annotated, Any

from pydantic import PlainSerializer, PlainValidator
from pydantic_core import PydanticCustomError

from harness.core.families import dimension_problems, shapes_of
from harness.core.zoo import ModelConfig
from harness.scenario.spec import (
    LEGACY_GPUS_KEY,
    SETTING_FIELDS,
    TYPE_NAMES,
    RunSpec,
    Settings,
    thawed,
    value_is,
)

CORE_KEYS: tuple[str, ...] = ("model", "model_config", "strategy", "precision", "gpus", "nodes", "gpus_per_node")
"""the keys every spec holds, in the order it is written; the settings follow (harness.scenario.spec.SETTING_FIELDS)"""
_TEXT_KEYS = ("model", "strategy", "precision")
MAPPING_SETTINGS = frozenset({"inject", "deepspeed_config"})
"""the settings whose value is an object (or null)"""
_COUNT_KEYS = ("gpus", "nodes", "gpus_per_node")


class SpecError(ValueError):
    """A spec that names no cell: `problems` are `key.path: what is wrong` lines."""

    def __init__(self, problems: list[str]) -> None:
        self.problems = problems
        super().__init__("; ".join(problems))


def spec_to_json(spec: RunSpec) -> dict[str, Any]:
    """The cell as a record's flat `spec`: the core keys (CORE_KEYS), then every setting in declaration order, then the
    keys a newer harness wrote (`extra`)."""
    out: dict[str, Any] = {
        "model": spec.model,
        "model_config": spec.model_config.to_dict(),
        "strategy": spec.strategy,
        "precision": spec.precision,
        "gpus": spec.gpus,
        "nodes": spec.nodes,
        "gpus_per_node": spec.gpus_per_node,
    }
    settings = spec.settings
    for name in SETTING_FIELDS:
        value = getattr(settings, name)
        out[name] = thawed(value) if isinstance(value, dict) else value
    out.update((key, json.loads(text)) for key, text in spec.extra)
    return out


def spec_from_json(doc: Any) -> RunSpec:
    """A record's `spec` (as written by any version) as the cell; SpecError listing every problem when it names none."""
    if isinstance(doc, RunSpec):
        return doc
    if not isinstance(doc, Mapping):
        raise SpecError([f"{doc!r} is not an object"])
    d = dict(doc)
    if LEGACY_GPUS_KEY in d:
        legacy = d.pop(LEGACY_GPUS_KEY)
        d.setdefault("gpus", legacy)
    # NOTE: read for every record of every report and comparison (bench_compare: 20,000 of them, a few thousand
    # cells): a spec read before is the same cell, its match key made once; the common case (every value of its
    # type) without a problem list; anything else the slow way, for the problems
    key = _typed_key(d)
    spec = _READ.get(key) if key is not None else None
    if spec is None:
        spec = _fast(d) or _checked(d)
        if key is not None:
            if len(_READ) >= _READ_MAX:
                _READ.clear()
            _READ[key] = spec
    return spec


_READ: dict[tuple[Any, ...], RunSpec] = {}
"""specs read, by their typed key: records of one cell share one RunSpec (and so its cached match key)"""
_READ_MAX = 50_000
"""forget them all beyond this many (a bound on memory; a cell read again is just read again)"""


def _typed_key(d: dict[str, Any]) -> tuple[Any, ...] | None:
    """A spec document as a hashable key that tells apart what JSON tells apart (900 from 900.0, 1 from true: each
    value with its type), or None for one holding a value that cannot be a key (a list: read it, not cached)."""
    out: list[Any] = []
    for k, v in d.items():
        t = type(v)
        if t is dict:
            items = tuple((ik, iv, type(iv)) for ik, iv in v.items())
            try:
                hash(items)
            except TypeError:
                return None
            out.append((k, items, t))
        elif t in _KEY_TYPES:
            out.append((k, v, t))
        else:
            return None
    return tuple(out)


_ABSENT = object()
_PY_TYPES = {"int": int, "float": float, "bool": bool, "str": str}
_EXACT: dict[str, tuple[type, ...]] = {
    **{k: (str,) for k in _TEXT_KEYS},
    **{k: (int,) for k in _COUNT_KEYS},
}
"""the exact Python types (a bool is no int) each core key takes"""
_SETTING_EXACT: dict[str, tuple[type, ...]] = {
    name: (
        (dict, type(None))
        if name in MAPPING_SETTINGS
        else (str, bool)
        if name == "activation_checkpointing"
        else (int, float)
        if _PY_TYPES.get(str(f.type)) is float
        else (_PY_TYPES.get(str(f.type), object),)
    )
    for name, f in SETTING_FIELDS.items()
}
"""the exact Python types each setting takes in a record (activation_checkpointing: its booleans of old records)"""
_KNOWN = frozenset(CORE_KEYS) | frozenset(SETTING_FIELDS)
_KEY_TYPES = frozenset({str, int, float, bool, type(None)})
_DIMENSION_TYPES = (int, bool, str, type(None))
"""what a model dimension can be (a count, a flag, the family's name, null): hashable, so the shapes are cached"""


def _fast(d: dict[str, Any]) -> RunSpec | None:
    """The cell when every value has its type and the model its family's keys, else None (then `_checked` says
    what is wrong). Same result as `_checked` wherever both answer."""
    for key, allowed in _EXACT.items():
        if type(d.get(key)) not in allowed:
            return None
    config = d.get("model_config")
    if type(config) is not dict or any(type(v) not in _DIMENSION_TYPES for v in config.values()):
        return None
    shapes = _shapes(tuple((k, v, type(v)) for k, v in config.items()))
    if shapes is None:
        return None
    settings: dict[str, Any] = {}
    for name, allowed in _SETTING_EXACT.items():
        value = d.get(name, _ABSENT)
        if value is _ABSENT:
            continue
        if type(value) not in allowed or (type(value) is float and value - value != 0):  # NOTE: NaN, inf
            return None
        settings[name] = value
    return _cell(d, shapes, settings)


@functools.lru_cache(maxsize=1024)
def _shapes(items: tuple[tuple[str, Any, type], ...]) -> ModelConfig | None:
    """A model's shapes from its dimensions' (key, value, type) — typed, so that 1 and True never share an entry —
    or None when they are not a model (`_model_config` then says why). Records share a few models: cached."""
    dims = {k: v for k, v, _ in items}
    return None if dimension_problems(dims) else shapes_of(dims)


def _checked(d: dict[str, Any]) -> RunSpec:
    """spec_from_json's slow way: every problem found and raised, or the cell."""
    problems: list[str] = []
    for key in _TEXT_KEYS:
        _check(d, key, str, problems)
    for key in _COUNT_KEYS:
        _check(d, key, int, problems)
    config = _model_config(d.get("model_config"), problems)
    settings: dict[str, Any] = {}
    for name, f in SETTING_FIELDS.items():
        if name in d and _setting_ok(name, d[name], f.type, problems):
            settings[name] = d[name]
    if problems or config is None:
        raise SpecError(problems)
    return _cell(d, config, settings)


def _cell(d: dict[str, Any], shapes: ModelConfig, settings: dict[str, Any]) -> RunSpec:
    """The cell of a checked spec document: its core keys, its shapes, its settings, and the keys this version
    does not know (kept as JSON text, in the file's order)."""
    unknown = d.keys() - _KNOWN
    return RunSpec(
        model=d["model"],
        model_config=shapes,
        strategy=d["strategy"],
        precision=d["precision"],
        gpus=d["gpus"],
        nodes=d["nodes"],
        gpus_per_node=d["gpus_per_node"],
        settings=Settings(**settings),
        extra=tuple((k, json.dumps(v, sort_keys=True)) for k, v in d.items() if k in unknown) if unknown else (),
    )


def _check(d: dict[str, Any], key: str, typ: type, problems: list[str]) -> None:
    if key not in d:
        problems.append(f"{key}: missing")
    elif not value_is(d[key], typ):
        problems.append(f"{key}: {d[key]!r} is not {TYPE_NAMES[typ]}")


def _setting_ok(name: str, value: Any, typ: Any, problems: list[str]) -> bool:
    """Whether a setting's value has its type (a record carries what the scenario validated; only the type is
    checked here, so a record of a value this version no longer offers still reads)."""
    if name in MAPPING_SETTINGS:
        ok = value is None or isinstance(value, Mapping)
        expected = "an object or null"
    elif name == "activation_checkpointing":
        ok = isinstance(value, (str, bool))  # NOTE: true/false in records written before the policies
        expected = "a string"
    else:
        py = {"int": int, "float": float, "bool": bool, "str": str}[typ] if isinstance(typ, str) else typ
        ok = value_is(value, py)
        expected = TYPE_NAMES[py]
    if not ok:
        problems.append(f"{name}: {value!r} is not {expected}")
    return ok


def _model_config(raw: Any, problems: list[str]) -> ModelConfig | None:
    if raw is None:
        problems.append("model_config: missing")
        return None
    if not isinstance(raw, Mapping):
        problems.append(f"model_config: {raw!r} is not an object")
        return None
    found = dimension_problems(raw)
    for key, why in found:
        problems.append(
            f"model_config.{key}: {why or 'not a dimension this version knows (a newer harness wrote it?)'}"
        )
    return None if found else shapes_of(raw)


def _validate(value: Any) -> RunSpec:
    try:
        return spec_from_json(value)
    except SpecError as e:
        raise PydanticCustomError("cell_spec", "{problems}", {"problems": "; ".join(e.problems)}) from None


SpecJSON = Annotated[RunSpec, PlainValidator(_validate), PlainSerializer(spec_to_json)]
"""the field type of a cell inside a file model: read with spec_from_json, written with spec_to_json"""
