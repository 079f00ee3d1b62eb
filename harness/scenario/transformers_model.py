"""`implementation: transformers`: a model's config.json trained through the transformers class itself
(`AutoModelForCausalLM.from_config`, random keyed init, never a download), beside the harness's own decoder.

A scenario's model `{hf_config: path, implementation: transformers}` is a `TransformersModel`: the same shapes and
knobs `harness.scenario.hf_config` reads (so the FLOPs and the time model are the decoder's, which
tests/unit/test_transformers_parity.py holds to these classes), plus the config itself (`hf_json`), from which the
worker builds the class (harness.worker.hf_models). Its activations are the class's own, measured over one step on
fake tensors in a child interpreter (`measured_step`). What the planner cannot know from the shapes — the class's own
parameters (names, order, fused projections: Phi-3's qkv_proj, GPT-2's c_attn), its wrap units (the blocks
`_no_split_modules` names) and the order DeepSpeed's hooks meet its modules in — is read from the class itself,
instantiated on the meta device (no memory) and run forward and backward there under module hooks
(`introspect`): the collective and memory models then shard and gather the class's real parameters.

This module registers the `transformers` model family (harness.core.families) when harness.scenario is imported.
Planning such a model imports torch and transformers (a few seconds, once per config); nothing else does.
"""

from __future__ import annotations

import dataclasses
import functools
import json
from dataclasses import dataclass

from harness.core.families import Family, register
from harness.core.zoo import ModelConfig, Param, StepMeasure
from harness.scenario.child import child_json

FAMILY = "transformers"
ATTN_IMPLEMENTATIONS = ("sdpa", "eager")


@dataclass(frozen=True)
class TransformersModel(ModelConfig):
    """The decoder's shapes and knobs, read from the config, trained through the transformers class."""

    family: str = FAMILY
    hf_json: str = dataclasses.field(
        default="", metadata={"doc": "the config.json the class is built from (its JSON text)", "text": True}
    )
    attn_implementation: str = dataclasses.field(
        default="sdpa",
        metadata={
            "doc": "transformers' attention: sdpa, or eager (soft-capped attention needs it)",
            "choices": ATTN_IMPLEMENTATIONS,
        },
    )

    def parameter_inventory(self) -> tuple[Param, ...]:
        return introspect(self.hf_json, self.attn_implementation).params

    def measured_step(self, *, micro_batch: int, seq_len: int, mode: str) -> StepMeasure | None:
        """The class's activations, measured: its forward and backward run on fake tensors (the decoder's activation
        model need not be the class's: GPT-2's attention saves more)."""
        doc = _step(self.hf_json, self.attn_implementation, micro_batch, seq_len, mode)
        return StepMeasure.of(doc)

    def module_trace(self, checkpointing: bool) -> tuple[list, list] | None:
        """The modules DeepSpeed's hooks fetch for, in order (harness.plan.zero3.zero3_module_trace's form)."""
        found = introspect(self.hf_json, self.attn_implementation)
        fwd, bwd = found.trace_ckpt if checkpointing else found.trace
        return list(fwd), list(bwd)


@dataclass(frozen=True)
class Introspection:
    """What the class is, found by building it on the meta device and running a step there."""

    params: tuple[Param, ...]
    """every parameter in `named_parameters()` order (tied ones once), with its shape and wrap unit: `blocks.<i>`
    for the i-th block `_no_split_modules` names, `root` for the rest"""
    trace: tuple[tuple[tuple[str, tuple[int, ...]], ...], tuple[tuple[str, tuple[int, ...]], ...]]
    """(forward, backward) modules in hook order, each with the indices of its own parameters"""
    trace_ckpt: tuple[tuple[tuple[str, tuple[int, ...]], ...], tuple[tuple[str, tuple[int, ...]], ...]]
    """the same under activation checkpointing (each block's forward run again in backward)"""
    class_name: str
    block_class: str


@functools.cache
def introspect(hf_json: str, attn_implementation: str) -> Introspection:
    """Build the class of `hf_json` on the meta device and read its parameters and module trace (cached: once per
    config). It runs in a child interpreter (`python -m harness.worker.hf_models`): the planner's own process
    never imports torch, and the worker's code stays on its floor."""
    doc = child_json(
        "harness.worker.hf_models",
        attn_implementation,
        stdin=hf_json,
        where="implementation: transformers",
        what="cannot build the class",
    )

    def trace(t: list) -> tuple:
        return tuple(tuple((name, tuple(idx)) for name, idx in phase) for phase in t)

    return Introspection(
        params=tuple(Param(n, tuple(shape), unit) for n, shape, unit in doc["params"]),
        trace=trace(doc["trace"]),
        trace_ckpt=trace(doc["trace_ckpt"]),
        class_name=doc["class_name"],
        block_class=doc["block_class"],
    )


@functools.cache
def _step(hf_json: str, attn: str, micro_batch: int, seq_len: int, mode: str) -> dict:
    """One micro-batch of the class on fake tensors (`python -m harness.worker.hf_models step`), cached."""
    request = {"hf_json": hf_json, "attn": attn, "micro_batch": micro_batch, "seq_len": seq_len, "mode": mode}
    return child_json(
        "harness.worker.hf_models",
        "step",
        stdin=json.dumps(request),
        where="implementation: transformers",
        what="cannot run the class on fake tensors",
    )


register(
    Family(
        FAMILY,
        TransformersModel,
        "harness.worker.hf_models:new_hf_model",
        "a config.json trained through the transformers class itself (implementation: transformers)",
        layout_refusal=(
            "implementation: transformers does not compose with tensor or pipeline parallelism here (the class's "
            "base_model_tp_plan is not applied to the harness's DTensor mesh, and its modules have no pipeline cut)"
        ),
        # NOTE: from_config initialises after construction, which under zero.Init would write into partitions
        zero_init=False,
        preload=("transformers", "transformers.models.auto.modeling_auto", "harness.worker.hf_models"),
    )
)
