"""`factory: package.module:function` in the worker: any `nn.Module` a user's function builds, behind the harness's
model interface (batch → logits; its blocks in `model.blocks`: FSDP's wrap units and the checkpointed units).

The contract (docs/models.md, "Your own module"): the function takes the scenario's `args` as keyword arguments and
returns `(module, block_classes)`, `(module, block_classes, batch)` or a mapping with those keys (`module`,
`blocks`, optional `batch`). The blocks are the items of one `nn.ModuleList` of the module whose classes are
`block_classes`. The module maps a batch's input to logits `(..., vocab)` (or an object with a `.logits`), which
the harness's loss (mean cross-entropy in fp32) compares with the targets; `batch(micro_batch, seq_len, generator)`
returns `(inputs, targets)` on the CPU, and without it the input is the harness's token rows (int64 in
[0, vocab), vocab the logits' width).

Initialisation is the user's own: the module is built on the CPU under `torch.manual_seed(seed)`, so every rank and
every strategy starts from the same values. A strategy that builds on the meta device (FSDP1, FSDP2) gets a meta
twin whose modules copy their parameters and buffers from that CPU build as they are materialised
(`harness_init`, harness.worker.models.init_module_), then the CPU build is dropped: each rank holds the whole
model in host memory while it sets up.

`python -m harness.worker.factory_models` reads a request (JSON) on stdin and prints what the planner reads
(harness.scenario.factory_model): `structure` (parameters with their wrap units, the ZeRO-3 module trace, vocab,
classes, the root's parameters after the blocks) or `step` (one micro-batch's forward+backward on fake tensors:
harness.worker.introspect.measure_step).
"""

from __future__ import annotations

import functools
import importlib
import json
import sys
from collections.abc import Callable, Mapping
from typing import Any, cast

import torch
from torch import nn


class FactoryError(Exception):
    """The factory could not be imported, called, or its result is not the contract's."""


@functools.cache
def _function(target: str) -> Callable[..., Any]:
    module_name, _, attr = target.partition(":")
    try:
        module = importlib.import_module(module_name)
    except Exception as e:  # NOTE: the user's module: any import error is theirs to read
        raise FactoryError(f"cannot import {module_name!r}: {type(e).__name__}: {e}") from e
    fn = getattr(module, attr, None)
    if not callable(fn):
        raise FactoryError(f"{module_name!r} has no callable {attr!r}")
    return cast(Callable[..., Any], fn)


def call_factory(target: str, args: Mapping[str, Any]) -> tuple[nn.Module, tuple[type, ...], Callable | None]:
    """The factory's (module, block classes, batch function or None), checked against the contract."""
    try:
        got = _function(target)(**args)
    except FactoryError:
        raise
    except Exception as e:
        raise FactoryError(f"{target}(**args) raised {type(e).__name__}: {e}") from e
    if isinstance(got, Mapping):
        module, blocks, batch = got.get("module"), got.get("blocks"), got.get("batch")
    elif isinstance(got, tuple) and len(got) in (2, 3):
        module, blocks, batch = (*got, None)[:3]
    else:
        raise FactoryError(f"{target} returned {type(got).__name__}: expected (module, block_classes[, batch])")
    if not isinstance(module, nn.Module):
        raise FactoryError(f"{target}: the module is a {type(module).__name__}, not an nn.Module")
    classes = (blocks,) if isinstance(blocks, type) else tuple(blocks or ())
    if not classes or not all(isinstance(c, type) and issubclass(c, nn.Module) for c in classes):
        raise FactoryError(f"{target}: the block classes {blocks!r} are not nn.Module classes")
    if batch is not None and not callable(batch):
        raise FactoryError(f"{target}: batch {batch!r} is not callable")
    return module, classes, batch


class FactoryLM(nn.Module):
    """A factory's module behind the harness's interface: forward(inputs) → logits; `blocks` the ModuleList whose
    items are of the block classes."""

    def __init__(self, inner: nn.Module, block_classes: tuple[type, ...]):
        super().__init__()
        self.inner = inner
        object.__setattr__(self, "block_classes", block_classes)  # NOTE: not a submodule
        self.blocks  # noqa: B018  # NOTE: checked at once: a module without them is the factory's error

    @property
    def blocks(self) -> nn.ModuleList:
        classes = cast(tuple[type, ...], self.block_classes)
        for module in self.inner.modules():
            if isinstance(module, nn.ModuleList) and module:
                # NOTE: a block under activation checkpointing is its wrapper's `_checkpoint_wrapped_module`
                first = getattr(module[0], "_checkpoint_wrapped_module", module[0])
                if isinstance(first, classes):
                    return module
        names = ", ".join(c.__name__ for c in classes)
        raise FactoryError(f"{type(self.inner).__name__}: no nn.ModuleList whose items are {names}")

    def forward(self, inputs: Any) -> torch.Tensor:
        out = self.inner(inputs)
        return cast(torch.Tensor, getattr(out, "logits", out))


def _ties(root: nn.Module) -> list[tuple[nn.Module, str, nn.Module, str]]:
    """(alias module, attribute, owner module, attribute) for each parameter registered in more than one module."""
    owner: dict[int, tuple[nn.Module, str]] = {}
    out = []
    for module in root.modules():
        for name, p in module.named_parameters(recurse=False):
            if id(p) in owner and owner[id(p)][0] is not module:
                out.append((module, name, *owner[id(p)]))
            owner.setdefault(id(p), (module, name))
    return out


class _CopyInit:
    """One meta-built module's initialisation: its own parameters and buffers copied from the same module of the CPU
    build (a DTensor parameter takes its shard of the value); a tied alias written, then pointed at its owner's
    parameter."""

    def __init__(self, module: nn.Module, source: nn.Module, ties: list):
        self.module, self.ties = module, ties
        self.source: nn.Module | None = source

    def __call__(self) -> None:
        from torch.distributed.tensor import DTensor, distribute_tensor

        if self.source is None:  # materialised already: its values are the training's now
            return
        own = dict(self.source.named_parameters(recurse=False))
        with torch.no_grad():
            # NOTE: a tied alias is written too: materialising its module (FSDP1's to_empty, module by module)
            # swaps the shared parameter's storage, its owner's values with it
            for name, p in self.module.named_parameters(recurse=False, remove_duplicate=False):
                if p.is_meta:
                    continue
                value = own[name].detach()
                if isinstance(p, DTensor):
                    full = value.to(device=p.device_mesh.device_type, dtype=p.dtype)
                    p.copy_(distribute_tensor(full, p.device_mesh, p.placements, src_data_rank=None))
                else:
                    p.copy_(value)
            for name, b in self.source.named_buffers(recurse=False):
                mine = self.module._buffers.get(name)
                if mine is not None and not mine.is_meta:
                    mine.copy_(b)
        for alias, attr, owner, owner_attr in self.ties:
            if getattr(alias, attr) is not getattr(owner, owner_attr):
                setattr(alias, attr, getattr(owner, owner_attr))
        # NOTE: the CPU build's tensors are let go module by module: kept, they would stay alive beside the
        # training's for the whole run (the tensor meter found them in FSDP1's peak)
        self.source = None


def build_factory(target: str, args: Mapping[str, Any], *, seed: int) -> FactoryLM:
    """The factory's module on the current default device, initialised by the factory itself under `seed`."""
    device = torch.get_default_device()
    with torch.device("cpu"), torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        source, classes, _ = call_factory(target, args)
    if device.type != "meta":
        return FactoryLM(source.to(device), classes)
    with torch.device("meta"):
        twin, _, _ = call_factory(target, args)
    model = FactoryLM(twin, classes)
    sources = dict(source.named_modules())
    ties = _ties(twin)
    for name, module in twin.named_modules():
        mine = [t for t in ties if t[0] is module or t[2] is module]
        object.__setattr__(module, "harness_init", _CopyInit(module, sources[name], mine))  # NOTE: not a submodule
        if any(t[0] is module for t in mine):
            object.__setattr__(module, "tied", True)
    return model


def new_factory_model(cfg: Any, *, seed: int) -> FactoryLM:
    """The family builder (harness.core.families: `factory`)."""
    return build_factory(cfg.factory, json.loads(cfg.factory_args or "{}"), seed=seed)


def cell_batch(
    cfg: Any, *, seed: int, rank: int, micro_batch: int, seq_len: int, micro_step: int, device: Any
) -> tuple[Any, Any]:
    """One micro-step's batch of a cell (harness.worker.models.synthetic_batch's rows), or a factory's own batch for
    the same global rows when it gives a batch function: one generator per row, seeded like the token rows, so a
    single process holding every row sees what the ranks see together."""
    from harness.worker.models import synthetic_batch

    batch = _batch_function(cfg.factory, cfg.factory_args) if cfg.family == "factory" else None
    if batch is None:
        return synthetic_batch(
            cfg, seed=seed, rank=rank, micro_batch=micro_batch, seq_len=seq_len, micro_step=micro_step, device=device
        )
    rows = [(micro_step * 1_000_003) + rank * micro_batch + i for i in range(micro_batch)]
    parts = [batch(1, seq_len, torch.Generator().manual_seed(seed * 7919 + row)) for row in rows]
    xs, ys = zip(*parts, strict=True)
    return torch.cat(xs).to(device), torch.cat(ys).to(device)


@functools.cache
def _batch_function(target: str, args: str) -> Callable | None:
    """The factory's batch function (or None), looked up once per model (the factory builds its module, on the meta
    device, to return it)."""
    with torch.device("meta"):
        return call_factory(target, json.loads(args or "{}"))[2]


# ---- introspection (the planner's child process)


def _structure(target: str, args: Mapping[str, Any]) -> dict[str, Any]:
    from harness.worker.introspect import module_hook_trace

    with torch.device("meta"):
        module, classes, batch = call_factory(target, args)
        model = FactoryLM(module, classes)
    unit = {id(p): f"blocks.{i}" for i, block in enumerate(model.blocks) for p in block.parameters()}
    named = list(model.named_parameters())
    params = [[n, list(p.shape), unit.get(id(p), "root")] for n, p in named]
    x, _ = _inputs(batch, micro_batch=1, seq_len=8, device="meta")

    def build() -> nn.Module:
        with torch.device("meta"):
            return FactoryLM(call_factory(target, args)[0], classes)

    trace = module_hook_trace(build, [lambda m: m(x)], checkpointing=False)
    trace_ckpt = module_hook_trace(build, [lambda m: m(x)], checkpointing=True)
    # the root's modules the step uses before the blocks (an embedding) and after them (a head, a final norm)
    order: list[str] = [name for name, _ in trace[0]]
    prefix = "inner." + _blocks_path(model)
    in_blocks = [i for i, n in enumerate(order) if n.startswith(prefix)]
    before = set(order[: in_blocks[0]] if in_blocks else [])
    after = set(order[in_blocks[-1] + 1 :] if in_blocks else order)
    by_module = {name or "model": m for name, m in model.named_modules()}
    lead = sum(p.numel() for n in before for p in by_module[n].parameters(recurse=False))
    matmul = sum(p.numel() for m in model.modules() if isinstance(m, nn.Linear) for p in [m.weight])
    tail_matmul = sum(m.weight.numel() for n in after if isinstance(m := by_module[n], nn.Linear))
    last_linear = [m for m in model.blocks[-1].modules() if isinstance(m, nn.Linear)]
    with torch.device("meta"):
        logits = model(x)
    return {
        "params": params,
        "trace": trace,
        "trace_ckpt": trace_ckpt,
        "class_name": type(module).__name__,
        "block_class": type(model.blocks[0]).__name__,
        "n_blocks": len(model.blocks),
        "vocab": int(logits.shape[-1]),
        "lead_params": lead,
        "matmul_params": matmul,
        "tail_matmul_params": tail_matmul,
        "last_matmul_params": last_linear[-1].weight.numel() if last_linear else 0,
    }


def _blocks_path(model: FactoryLM) -> str:
    blocks = model.blocks
    return next(name for name, m in model.inner.named_modules() if m is blocks)


def _inputs(batch: Callable | None, *, micro_batch: int, seq_len: int, device: str) -> tuple:
    if batch is None:
        x = torch.zeros(micro_batch, seq_len, dtype=torch.long, device=device)
        return x, x
    with torch.device("cpu"):
        x, y = batch(micro_batch, seq_len, torch.Generator().manual_seed(0))
    return x.to(device), y.to(device)


def _step(target: str, args: Mapping[str, Any], *, micro_batch: int, seq_len: int, mode: str) -> dict[str, Any]:
    """`measure_step` of the factory's module."""
    with torch.device("meta"):
        _, classes, batch = call_factory(target, args)

    def build() -> nn.Module:
        return FactoryLM(call_factory(target, args)[0], classes)

    def inputs() -> tuple[Any, Any]:
        x, y = _inputs(batch, micro_batch=micro_batch, seq_len=seq_len, device="cpu")
        return torch.empty_like(x).copy_(x), torch.empty_like(y).copy_(y)

    from harness.worker.introspect import measure_step

    return measure_step(build, inputs, mode=mode)


def main() -> int:
    req = json.loads(sys.stdin.read())
    args = json.loads(req.get("args") or "{}")
    try:
        if req["what"] == "structure":
            doc = _structure(req["factory"], args)
        else:
            doc = _step(req["factory"], args, micro_batch=req["micro_batch"], seq_len=req["seq_len"], mode=req["mode"])
    except FactoryError as e:
        print(str(e), file=sys.stderr)
        return 3
    print(json.dumps(doc))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
