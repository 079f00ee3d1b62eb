"""`factory: package.module:function`: any `nn.Module` a user's function builds, trained and planned by the harness
(the contract: harness.worker.factory_models; docs/models.md, "Your own module").

A scenario's model `{factory: "pkg.mod:build", args: {...}}` is a `FactoryModel`. The harness wrote none of its
code, so nothing is derived from dimensions: what the planner knows is read from the module itself, in a child
interpreter (`python -m harness.worker.factory_models`; the planner's process never imports torch or the user's
code):

- **structure**, built on the meta device: every parameter with its shape and wrap unit (the blocks the factory
  names), hence the counts, the sharded memory and every collective's bytes; the order module hooks fire in over a
  step (DeepSpeed ZeRO-3's trace); the vocabulary (the logits' width); the root's parameters used after the blocks.
- **a step**, per (micro-batch, sequence length, precision mode), run on fake tensors (no memory, no compute):
  its FLOPs under `FlopCounterMode` (with and without full checkpointing's recompute) and the bytes its forward
  saves for backward, outside the blocks and in each (`StepMeasure`).

The step time is null with its reason: the time model prices the decoder's operators, which a foreign module
need not have. Tensor and pipeline parallelism refuse (they shard and cut the decoder's modules by name), as does
selective checkpointing (whose saved set depends on the module's operators, not measured here).

This module registers the `factory` model family (harness.core.families) when harness.scenario is imported.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import re
from dataclasses import dataclass
from typing import Any

from harness.core.errors import InputError, Problem
from harness.core.families import Family, register
from harness.core.zoo import ModelConfig, Param, StepMeasure
from harness.scenario.child import child_json

FAMILY = "factory"
FACTORY_KEY = "factory"
ENTRY_KEYS = ("factory", "args")
TARGET_RE = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$")
NO_TIME = (
    "a factory model: the step-time model prices the decoder's operators, which the harness cannot see in a module "
    "it did not write (its FLOPs, memory and bytes are planned; measure its time)"
)


@dataclass(frozen=True)
class FactoryModel(ModelConfig):
    """A user's module: its blocks and vocabulary read from it; the decoder's width fields unused (0)."""

    d_model: int = 0
    n_layers: int = 0
    n_heads: int = 0
    ffn: int = 0
    vocab: int = 0
    family: str = FAMILY
    factory: str = dataclasses.field(
        default="", metadata={"doc": "package.module:function that builds the module", "text": True}
    )
    factory_args: str = dataclasses.field(
        default="{}", metadata={"doc": "the keyword arguments it is called with (JSON text)", "text": True}
    )

    def to_dict(self) -> dict:
        out = super().to_dict()
        for key in ("d_model", "n_heads", "ffn"):
            if not out.get(key):
                out.pop(key, None)
        return out

    def knobs(self) -> dict:
        return {"factory": self.factory, "args": json.loads(self.factory_args)}

    def shape_problem(self) -> tuple[str, str] | None:
        return None

    @property
    def structure(self) -> dict[str, Any]:
        return _structure(self.factory, self.factory_args)

    def parameter_inventory(self) -> tuple[Param, ...]:
        return tuple(Param(n, tuple(shape), unit) for n, shape, unit in self.structure["params"])

    def module_trace(self, checkpointing: bool) -> tuple[list, list] | None:
        fwd, bwd = self.structure["trace_ckpt" if checkpointing else "trace"]
        return [(n, tuple(i)) for n, i in fwd], [(n, tuple(i)) for n, i in bwd]

    def n_params(self) -> int:
        return sum(p.numel for p in self.parameter_inventory())

    def block_params(self) -> int:
        blocks = [p.numel for p in self.parameter_inventory() if p.unit != "root"]
        return sum(blocks) // max(1, self.n_layers)

    def n_matmul_params(self) -> int:
        return int(self.structure["matmul_params"])

    def head_params(self) -> int:
        return int(self.structure["tail_matmul_params"])

    def lead_params(self) -> int:
        return int(self.structure["lead_params"])

    def last_matmul_params(self) -> int:
        return int(self.structure["last_matmul_params"])

    def flops_per_token(self, seq_len: int) -> float:
        m = self.measured_step(micro_batch=1, seq_len=seq_len, mode="fp32")
        assert m is not None
        return m.flops / seq_len

    def attention_flops_per_token(self, seq_len: int) -> float:
        raise NotImplementedError("a factory model's attention is not known apart from its other FLOPs")

    def measured_step(self, *, micro_batch: int, seq_len: int, mode: str) -> StepMeasure | None:
        doc = _step(self.factory, self.factory_args, micro_batch, seq_len, mode)
        return StepMeasure.of(doc)

    def unmodelled_time(self) -> str | None:
        return NO_TIME

    def checkpointing_refusal(self, policy: str) -> str | None:
        if policy == "selective":
            return (
                "selective checkpointing of a factory model: what it keeps depends on the module's operators, which "
                "the planner does not measure (use none or full)"
            )
        return None


def _child(request: dict[str, Any]) -> dict[str, Any]:
    """Run harness.worker.factory_models on `request`; its stdout's JSON, or InputError with the factory's error."""
    return child_json(
        "harness.worker.factory_models",
        stdin=json.dumps(request),
        where=f"factory {request['factory']}",
        what="cannot build or run the module",
    )


@functools.cache
def _structure(factory: str, args: str) -> dict[str, Any]:
    return _child({"what": "structure", "factory": factory, "args": args})


@functools.cache
def _step(factory: str, args: str, micro_batch: int, seq_len: int, mode: str) -> dict[str, Any]:
    return _child(
        {"what": "step", "factory": factory, "args": args, "micro_batch": micro_batch, "seq_len": seq_len, "mode": mode}
    )


def factory_model_entry(entry: dict[str, Any], *, file: str, where: str, problems: list[Problem]) -> ModelConfig | None:
    """The model a scenario's `factory` entry names, or None with its problems appended (naming the scenario `file`
    and key path `where`)."""
    others = sorted(str(k) for k in entry if k not in ENTRY_KEYS)
    if others:
        problems.append(
            Problem(file, where, f"factory stands alone (or with args): {', '.join(others)} cannot be given with it")
        )
        return None
    target, args = entry[FACTORY_KEY], entry.get("args", {})
    if not isinstance(target, str) or not TARGET_RE.match(target):
        problems.append(Problem(file, f"{where}.factory", f"{target!r} is not package.module:function"))
        return None
    if not isinstance(args, dict):
        problems.append(Problem(file, f"{where}.args", f"{args!r} is not a mapping of keyword arguments"))
        return None
    try:
        text = json.dumps(args, sort_keys=True, separators=(",", ":"))
    except (TypeError, ValueError) as e:
        problems.append(Problem(file, f"{where}.args", f"not JSON-representable: {e}"))
        return None
    try:
        found = _structure(target, text)
    except InputError as e:
        problems.extend(Problem(file, f"{where}.factory", f"{target}: {p.message}") for p in e.problems)
        return None
    return FactoryModel(n_layers=found["n_blocks"], vocab=found["vocab"], factory=target, factory_args=text)


register(
    Family(
        FAMILY,
        FactoryModel,
        "harness.worker.factory_models:new_factory_model",
        "any nn.Module a user's function builds (factory: package.module:function)",
        layout_refusal=(
            "a factory model does not compose with tensor or pipeline parallelism here (the layouts shard and cut "
            "the decoder's modules by name)"
        ),
        # NOTE: the factory initialises as it constructs; a meta twin copies the CPU build's values
        zero_init=False,
        preload=("harness.worker.factory_models",),
    )
)
