"""The base of every typed file model, and pydantic's validation errors as the user's error lines.

Every format the harness writes and reads back (records, the payload, manifests, calibrations, tune logs,
projections) is a pydantic model in the layer that owns the format; this module is what they share:

- `Typed`: frozen (a value, safe to cache on), strict (no silent "3" → 3: a wrong type is an error, not a
  coercion), no NaN/inf (JSON has none), and it keeps the fields a newer harness added (extra="allow"), so reading
  and writing a file back loses nothing;
- `SOMETIMES`: the marker of a field that a file may lack (added in a later version, or written only in some
  cases); every other field of a contract model is written every time (possibly null);
- `problems_of`: a ValidationError as `Problem` lines (file, dotted key path, the value, what was expected).

Writers dump with `to_dict` (Python's own float formatting, keys in declaration order, only the fields that
were set), so files stay byte-for-byte what the harness wrote before the models existed.
"""

from __future__ import annotations

import types
from collections.abc import Iterable, Mapping
from typing import Any, Union, get_args, get_origin

from pydantic import BaseModel, ConfigDict, ValidationError

from harness.core.errors import Problem


class Typed(BaseModel):
    """A frozen, strict model of (part of) a file; unknown fields are kept, not refused (forward compatibility)."""

    model_config = ConfigDict(frozen=True, strict=True, extra="allow", allow_inf_nan=False)

    def field(self, key: str) -> Any:
        """The value of the field the file calls `key` (its alias, or its name; a kept unknown field too), None
        when absent."""
        try:
            return self.__dict__[key]
        except KeyError:
            return (self.__pydantic_extra__ or {}).get(key)

    def to_dict(self) -> dict[str, Any]:
        """The JSON-able dict of the fields that were set (as read, or as given), in declaration order."""
        return self.model_dump(mode="python", exclude_unset=True, by_alias=True)


class _Sometimes:
    """Field metadata: the field may be absent from a file (see the module docstring)."""

    def __repr__(self) -> str:
        return "SOMETIMES"


SOMETIMES = _Sometimes()
"""`x: Annotated[int | None, SOMETIMES] = None`: a field a valid file may lack"""


def sometimes(model: type[BaseModel], name: str) -> bool:
    """Whether a file may lack `model`'s field `name`."""
    return any(m is SOMETIMES for m in model.model_fields[name].metadata)


def dotted(loc: Iterable[int | str]) -> str:
    """A pydantic error location as the key path users read: `metrics.step_time_s.samples[3]`."""
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def data_location(doc: Any, loc: Iterable[int | str]) -> tuple[Any, ...]:
    """The part of a pydantic error location that addresses `doc` itself (a union's member tags such as
    `int`/`float`, which pydantic appends, dropped)."""
    node, kept = doc, []
    for part in loc:
        if isinstance(node, Mapping) and isinstance(part, str) and part in node:
            node = node[part]
        elif isinstance(node, list) and isinstance(part, int) and 0 <= part < len(node):
            node = node[part]
        else:
            break
        kept.append(part)
    return tuple(kept)


def expected(error: Mapping[str, Any]) -> str:
    """What a failed field wanted, in the words of the error lines: 'a number', 'an integer', …"""
    kind = str(error.get("type", ""))
    if tuple(error.get("loc", ()))[-1:] in (("int",), ("float",)) and kind in ("int_type", "float_type"):
        return "a number"  # a member of an int | float union: either would do
    return {
        "float_type": "a number",
        "finite_number": "a finite number",
        "int_type": "an integer",
        "int_from_float": "an integer",
        "string_type": "a string",
        "bool_type": "a boolean",
        "dict_type": "an object",
        "model_type": "an object",
        "list_type": "a list",
        "missing": "present",
    }.get(kind, str(error.get("msg", "valid")).lower())


def problems_of(error: ValidationError, *, file: str, doc: Any = None) -> list[Problem]:
    """One Problem per distinct key path of `error` (union members' errors on one path are one line)."""
    seen: dict[str, Problem] = {}
    for e in error.errors():
        loc = data_location(doc, e["loc"]) if doc is not None and e["type"] != "missing" else tuple(e["loc"])
        where = dotted(loc)
        if where in seen:
            continue
        if e["type"] == "missing":
            seen[where] = Problem(file, where, "missing (required)")
        elif e["type"] == "extra_forbidden":
            seen[where] = Problem(file, where, "unknown key")
        else:
            seen[where] = Problem(file, where, f"{e.get('input')!r} is not {expected(e)}")
    return list(seen.values())


def models_in(tp: Any, *, key: str = "<>") -> list[tuple[type[BaseModel], str]]:
    """The pydantic models a field's type annotation holds, each with the path suffix that reaches its fields: `[]`
    for a list's items, `.<key>` for a dict's values, nothing for the model itself (the record page of the docs and
    tests/unit/test_record_schema.py walk the record's keys with it)."""
    out: list[tuple[type[BaseModel], str]] = []
    for t in get_args(tp) if get_origin(tp) in (Union, types.UnionType) else (tp,):
        origin, args = get_origin(t), get_args(t)
        if isinstance(t, type) and issubclass(t, BaseModel):
            out.append((t, ""))
        elif origin is list and args and isinstance(args[0], type) and issubclass(args[0], BaseModel):
            out.append((args[0], "[]"))
        elif origin is dict and args and isinstance(args[1], type) and issubclass(args[1], BaseModel):
            out.append((args[1], f".{key}"))
    return out
