"""What the planner reads of a module the harness did not write (a transformers class, a factory's module), run in
its child interpreter (harness.worker.hf_models, harness.worker.factory_models): the order module hooks fire in over
a step on the meta device (DeepSpeed ZeRO-3's module trace), and one micro-batch's forward and backward on fake
tensors (no memory, no compute): its FLOPs, what it saves for backward, its backward's transients."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import nn

from harness.worker.models import apply_activation_checkpointing


def module_hook_trace(
    build: Callable[[], nn.Module], runs: Sequence[Callable[[nn.Module], torch.Tensor]], *, checkpointing: bool
) -> list[list[tuple[str, list[int]]]]:
    """(forward, backward) modules of the model `build` makes (on the meta device), in the order their hooks fire
    over one forward (the first of `runs` that does not raise: each maps the model to its logits) and its backward,
    each with the indices (in `named_parameters()` order) of its own parameters."""
    import warnings

    model = build()
    index = {id(p): i for i, (_, p) in enumerate(model.named_parameters())}
    if checkpointing:
        apply_activation_checkpointing(model, "full")
    fwd: list[tuple[str, list[int]]] = []
    bwd: list[tuple[str, list[int]]] = []
    grad_on = [False]
    for name, module in model.named_modules():
        own = sorted({index[id(p)] for p in module.parameters(recurse=False)})
        label = name or "model"
        module.register_forward_pre_hook(
            lambda *_, label=label, own=own: (bwd if grad_on[0] else fwd).append((label, own))
        )
        module.register_full_backward_pre_hook(lambda *_, label=label, own=own: bwd.append((label, own)))
    for i, run in enumerate(runs):
        fwd.clear()
        bwd.clear()
        grad_on[0] = False
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # NOTE: modules whose outputs are not tensors fire no backward hook
                logits = run(model)
                grad_on[0] = True
                logits.float().sum().backward()
            break
        except RuntimeError:
            if i == len(runs) - 1:
                raise
    # NOTE: DeepSpeed meets the modules whose output is not a tensor (the inner causal LM and its base model) first
    # in backward too; they own no parameter, so only the prefetcher's step count sees them
    # (the containers of modules it met, not the rotary embedding, whose output needs no gradient); and the
    # harness's wrapper, the module DeepSpeed is given, first in both
    seen = {name for name, _ in bwd}
    missing = [(n, own) for n, own in fwd if n not in seen and any(o.startswith(n + ".") for o in seen)]
    return [[("model", [])] + fwd, [("model", [])] + missing + bwd]


def measure_step(build: Callable[[], nn.Module], inputs: Callable[[], tuple[Any, Any]], *, mode: str) -> dict[str, Any]:
    """One micro-batch's forward and backward on fake tensors in precision `mode` (fp32, autocast, lowp) of the model
    `build` makes (a module with `blocks`; built inside a FakeTensorMode) on the batch `inputs` makes: FLOPs
    (attention through SDPA's math path, so its matmuls count: the full square, as the model FLOPs convention
    does), with and without full checkpointing; the bytes saved for backward (distinct storages; parameters and
    autocast's weight copies left out, the planner counts those), by block, with each block's input (what full
    checkpointing keeps of it); and a block's backward transients (`_block_backward`)."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.utils.flop_counter import FlopCounterMode

    from harness.worker.models import blocks_of, loss_fn

    def built() -> nn.Module:
        with torch.device("cpu"):
            model = build()
        if mode == "lowp":
            _to_bf16(model)
        return model

    with FakeTensorMode(allow_non_fake_inputs=True):
        model = built()
        x, y = inputs()

        def autocast() -> contextlib.AbstractContextManager:
            return torch.autocast("cpu", dtype=torch.bfloat16, enabled=mode == "autocast")

        counter = FlopCounterMode(display=False)
        with sdpa_kernel(SDPBackend.MATH), counter:
            with autocast():
                logits = model(x)
            loss_fn(logits, y).backward()
        flops = counter.get_total_flops()
        model.zero_grad(set_to_none=True)
        ckpt = built()
        apply_activation_checkpointing(ckpt, "full")
        counter = FlopCounterMode(display=False)
        with sdpa_kernel(SDPBackend.MATH), counter:
            with autocast():
                out = ckpt(x)
            loss_fn(out, y).backward()
        recompute = counter.get_total_flops() - flops
        del ckpt, out

        params = {p.untyped_storage()._cdata for p in model.parameters()}
        shapes = {tuple(p.shape) for p in model.parameters()} | {tuple(p.shape)[::-1] for p in model.parameters()}
        where = ["root"]
        saved: dict[int, tuple[str, int]] = {}
        block_in: dict[int, int] = {}

        def pack(t: torch.Tensor) -> torch.Tensor:
            key = t.untyped_storage()._cdata
            cast_weight = mode == "autocast" and t.dtype == torch.bfloat16 and tuple(t.shape) in shapes
            if key not in params and not cast_weight and key not in saved:
                saved[key] = (where[0], int(t.untyped_storage().nbytes()))
            return t

        handles = []
        for i, block in enumerate(blocks_of(model)):

            def pre(_m: nn.Module, a: tuple, i: int = i) -> None:
                where[0] = f"blocks.{i}"
                for t in a:
                    if isinstance(t, torch.Tensor):
                        block_in[t.untyped_storage()._cdata] = int(t.untyped_storage().nbytes())

            def post(*_: Any) -> None:
                where[0] = "root"

            handles += [block.register_forward_pre_hook(pre), block.register_forward_hook(post)]
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            with autocast():
                logits = model(x)
            loss = loss_fn(logits, y)
        for h in handles:
            h.remove()
        by_block = [0] * len(blocks_of(model))
        root = 0
        for place, nbytes in saved.values():
            if place == "root":
                root += nbytes
            else:
                by_block[int(place.split(".")[1])] += nbytes
        # under full checkpointing a block keeps its input (the previous block's output, or the root's)
        kept = sum(n for k, n in block_in.items() if k not in saved or saved[k][0] != "root")
        logits_numel = logits.numel()
        del loss, logits  # NOTE: the graph goes with them: its backward is the MemTracker pass's
        block_backward = _block_backward(model, x, y, autocast)
    return {
        "flops": int(flops),
        "recompute_flops": int(recompute),
        "saved_root": root,
        "saved_blocks": by_block,
        "block_inputs": kept,
        "logits": int(logits_numel),
        "block_backward": block_backward,
    }


def _block_backward(model: Any, x: Any, y: Any, autocast: Callable) -> int:
    """What a block's backward holds beyond what was live as it started (its gradients in flight, the largest
    block's), from torch's own MemTracker over a step on fake tensors (activations and temporaries; the
    parameters' gradients are the strategy's to hold)."""
    from torch.distributed._tools.mem_tracker import MemTracker, _MemRefType, _ModState

    from harness.worker.models import loss_fn

    tracker = MemTracker()
    tracker.track_external(model)
    with tracker:
        with autocast():
            logits = model(x)
        loss_fn(logits, y).backward()
    kinds = (_MemRefType.ACT, _MemRefType.TEMP)

    def grown(module: nn.Module) -> int:
        stats = tracker.memory_tracking.get(module)
        if stats is None or _ModState.PEAK_BW not in stats.snapshots:
            return 0
        peak, pre = stats.snapshots[_ModState.PEAK_BW][-1], stats.snapshots[_ModState.PRE_BW][-1]
        return max(0, sum(sum(peak[d].get(k, 0) for k in kinds) - sum(pre[d].get(k, 0) for k in kinds) for d in peak))

    def own_grads(module: nn.Module) -> int:
        # NOTE: a weight's gradient is made inside its module's backward; the strategies hold those (a bucket, an
        # unsharded gradient), so they are not in flight here
        return sum(p.numel() * p.element_size() for p in module.parameters())

    return max((max(0, grown(b) - own_grads(b)) for b in model.blocks), default=0)


def _to_bf16(model: nn.Module) -> None:
    """The model's floating parameters and buffers in bf16, a tied parameter still one (Module.to swaps each
    parameter in place, which a fake tensor shared by two modules refuses)."""
    done: dict[int, nn.Parameter] = {}
    for module in model.modules():
        for name, p in list(module._parameters.items()):
            if p is None or not p.is_floating_point():
                continue
            if id(p) not in done:
                done[id(p)] = nn.Parameter(p.detach().to(torch.bfloat16), requires_grad=p.requires_grad)
            module._parameters[name] = done[id(p)]
        for name, b in list(module._buffers.items()):
            if b is not None and b.is_floating_point():
                module._buffers[name] = b.to(torch.bfloat16)
