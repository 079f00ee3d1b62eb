"""`implementation: transformers` in the worker: the transformers class of a model's config.json, built from the
config (never a download), with keyed initialisation, behind the harness's model interface (tokens → logits, its
blocks in `model.blocks`: the classes `_no_split_modules` names, FSDP's wrap units and the checkpointed units).

Initialisation is keyed like the decoder's (harness.worker.models): each parameter is drawn from a generator
seeded with (seed, a digest of its name) — weights N(0, initializer_range), biases 0, norm weights 1 (0 for
Gemma's (1 + w) norms) — so the values are the same however the model is built (eagerly, on the meta device
then materialised module by module by FSDP1, sharded by FSDP2) and every strategy trains the same model. A tied
head's weight is the embedding's, re-tied where a module-by-module materialisation split it.

`python -m harness.worker.hf_models ATTN < config.json` prints what the planner reads of the class
(harness.scenario.transformers_model.introspect): its parameters with their wrap units, and the order module hooks
fire in over a forward and a backward on the meta device (DeepSpeed ZeRO-3's module trace), with and without
activation checkpointing; `python -m harness.worker.hf_models step < request.json` one micro-batch's step on fake
tensors (its saved activations, FLOPs and backward transients: harness.worker.introspect.measure_step).
"""

from __future__ import annotations

import json
import sys
import zlib
from typing import Any, cast

import torch
from torch import nn

from harness.worker.models import keyed_normal_

DROPOUT_KEYS = ("dropout", "pdrop")
"""config fields that set a dropout probability: all 0 (the step is measured, and every strategy must train the
same model: a dropout's random draws would differ between them)"""


def hf_config(hf_json: str, *, attn_implementation: str) -> Any:
    """The transformers config of `hf_json`, with the key-value cache and every dropout off."""
    import transformers

    doc = json.loads(hf_json)
    model_type = doc.pop("model_type")
    doc["use_cache"] = False
    config = transformers.AutoConfig.for_model(model_type, **doc)
    for key, value in config.to_dict().items():  # NOTE: the class's defaults too (GPT-2's 0.1)
        if any(k in key for k in DROPOUT_KEYS) and isinstance(value, float):
            setattr(config, key, 0.0)
    config._attn_implementation = attn_implementation
    return config


class HFCausalLM(nn.Module):
    """A transformers causal LM behind the harness's interface: forward(tokens) → logits; `blocks` its decoder
    layers (the ModuleList whose items are the classes `_no_split_modules` names)."""

    def __init__(self, inner: nn.Module):
        super().__init__()
        self.inner = inner

    @property
    def blocks(self) -> nn.ModuleList:
        names = set(getattr(self.inner, "_no_split_modules", None) or ())
        for module in self.inner.modules():
            # NOTE: a block under activation checkpointing is its wrapper's `_checkpoint_wrapped_module`
            first = (
                getattr(module[0], "_checkpoint_wrapped_module", module[0])
                if isinstance(module, nn.ModuleList) and module
                else None
            )
            if first is not None and type(first).__name__ in names:
                return cast(nn.ModuleList, module)
        raise RuntimeError(f"{type(self.inner).__name__}: no ModuleList of its _no_split_modules {sorted(names)}")

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.inner(input_ids=tokens, use_cache=False).logits


def build_hf(hf_json: str, *, attn_implementation: str, seed: int) -> HFCausalLM:
    """The class of `hf_json` on the current default device, initialised from the keyed streams (not on meta)."""
    import transformers

    config = hf_config(hf_json, attn_implementation=attn_implementation)
    inner = transformers.AutoModelForCausalLM.from_config(config, attn_implementation=attn_implementation)
    model = HFCausalLM(inner)
    std = float(getattr(config, "initializer_range", 0.02))
    zero_norms = type(inner).__name__.startswith("Gemma")
    canonical: dict[int, tuple[nn.Module, str, str]] = {}  # parameter → (its first module, attribute, full name)
    for mname, module in inner.named_modules():
        for pname, p in module.named_parameters(recurse=False):
            canonical.setdefault(id(p), (module, pname, f"{mname}.{pname}" if mname else pname))
    ties: list[tuple[nn.Module, str, nn.Module, str]] = []  # (alias module, attribute, owner module, attribute)
    for module in inner.modules():
        for pname, p in module.named_parameters(recurse=False):
            owner, attr, _ = canonical[id(p)]
            if owner is not module:
                ties.append((module, pname, owner, attr))
    for mname, module in inner.named_modules():
        mine = [t for t in ties if t[0] is module or t[2] is module]
        init = _KeyedInit(module, prefix=mname, seed=seed, std=std, zero_norms=zero_norms, ties=mine, root=inner)
        object.__setattr__(module, "harness_init", init)  # NOTE: not a submodule, not a parameter
        if any(t[0] is module for t in mine):
            object.__setattr__(module, "tied", True)
        init()
    return model


class _KeyedInit:
    """One module's keyed initialisation (see the module docstring); aliases (a tied head's weight) are re-pointed
    at their owner's parameter instead of drawn."""

    def __init__(
        self, module: nn.Module, *, prefix: str, seed: int, std: float, zero_norms: bool, ties: list, root: nn.Module
    ):
        self.module, self.prefix, self.seed, self.std = module, prefix, seed, std
        self.zero_norms, self.ties, self.root = zero_norms, ties, root

    def __call__(self) -> None:
        m = self.module
        buffers = [b for b in m.buffers(recurse=False) if not b.is_meta]
        if buffers:
            # NOTE: a buffer (RoPE's inv_freq, Gemma's embedding scale) is a function of the config, which the class's
            # own init computes; materialising a meta-built module leaves it uninitialised. Its parameters, which
            # that init draws from the global stream, are drawn again below from the keyed ones
            cast(Any, self.root)._init_weights(m)
        aliases = {attr for alias, attr, _, _ in self.ties if alias is m}
        with torch.no_grad():
            for pname, p in m.named_parameters(recurse=False):
                if pname in aliases or p.is_meta:
                    continue
                name = f"{self.prefix}.{pname}" if self.prefix else pname
                if pname.endswith("bias"):
                    p.zero_()
                elif p.dim() == 1:
                    p.fill_(0.0 if self.zero_norms and "norm" in type(m).__name__.lower() else 1.0)
                else:
                    keyed_normal_(p, seed=self.seed, key=zlib.crc32(name.encode()), std=self.std)
        # NOTE: FSDP1 materialises module by module (a head may come before the embedding it shares a weight
        # with), each getting new tensors: whichever side comes last points the alias at the owner's again
        for alias, attr, owner, owner_attr in self.ties:
            if getattr(alias, attr) is not getattr(owner, owner_attr):
                setattr(alias, attr, getattr(owner, owner_attr))


def new_hf_model(cfg: Any, *, seed: int) -> HFCausalLM:
    """The family builder (harness.core.families: `transformers`)."""
    return build_hf(cfg.hf_json, attn_implementation=cfg.attn_implementation, seed=seed)


def hooked_trace(hf_json: str, attn_implementation: str, *, checkpointing: bool) -> list[list[tuple[str, list[int]]]]:
    """(forward, backward) modules in the order their hooks fire over one step on the meta device, each with the
    indices (in `named_parameters()` order) of its own parameters: what DeepSpeed ZeRO-3's coordinator traces."""

    def build() -> nn.Module:
        with torch.device("meta"):
            return build_hf(hf_json, attn_implementation=attn_implementation, seed=0)

    tokens = torch.zeros(1, 8, dtype=torch.long, device="meta")
    # NOTE: transformers' mask code reads a value in some of its paths (to find packed sequences, or a cache's
    # length), which a meta tensor has none of: the first of these calls its model's mask code can take on meta
    # (neither a cache nor a mask changes which module runs when)
    mask = torch.ones_like(tokens)
    calls: tuple[dict[str, Any], ...] = (
        {"use_cache": True},
        {"attention_mask": mask, "use_cache": False},
        {"attention_mask": mask, "use_cache": True},
    )
    runs = [lambda m, kw=kw: m.inner(input_ids=tokens, **kw).logits for kw in calls]
    from harness.worker.introspect import module_hook_trace

    return module_hook_trace(build, runs, checkpointing=checkpointing)


def step(request: dict[str, Any]) -> dict[str, Any]:
    """One micro-batch of the class measured on fake tensors (harness.worker.introspect.measure_step)."""
    from harness.worker.introspect import measure_step

    micro_batch, seq_len = request["micro_batch"], request["seq_len"]

    def build() -> nn.Module:
        return build_hf(request["hf_json"], attn_implementation=request["attn"], seed=0)

    def inputs() -> tuple[torch.Tensor, torch.Tensor]:
        x = torch.zeros(micro_batch, seq_len, dtype=torch.long)
        return x, torch.zeros_like(x)

    return measure_step(build, inputs, mode=request["mode"])


def main(argv: list[str]) -> int:
    if argv and argv[0] == "step":
        print(json.dumps(step(json.loads(sys.stdin.read()))))
        return 0
    hf_json = sys.stdin.read()
    attn = argv[0] if argv else "sdpa"
    with torch.device("meta"):
        model = build_hf(hf_json, attn_implementation=attn, seed=0)
    unit = {}
    blocks = model.blocks
    for i, block in enumerate(blocks):
        for p in block.parameters():
            unit[id(p)] = f"blocks.{i}"
    params = [[n, list(p.shape), unit.get(id(p), "root")] for n, p in model.named_parameters()]
    doc = {
        "params": params,
        "trace": hooked_trace(hf_json, attn, checkpointing=False),
        "trace_ckpt": hooked_trace(hf_json, attn, checkpointing=True),
        "class_name": type(model.inner).__name__,
        "block_class": type(blocks[0]).__name__,
    }
    print(json.dumps(doc))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
