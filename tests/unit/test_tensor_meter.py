"""harness.worker.meters.tensors: the storage-level accounting behind `metrics.memory_gib`, in one process.

Checked against torch's own tracker (torch.distributed._tools.mem_tracker.MemTracker) on a model whose every tensor
both can see: the same peak to the byte, and the same parameters, gradients and optimizer state. Then what MemTracker
cannot see and the meter must: a gradient whose storage existed before the step (DDP's buckets), a storage that
grows by `resize_` (FSDP's gathered parameters), optimizer state of parameters that are not the model's (DeepSpeed's
fp32 partitions)."""

from __future__ import annotations

import torch
from torch import nn

from harness.worker.meters.tensors import CATEGORIES, TensorMemoryMeter, measure_step


def _model_and_optimizer(seed: int = 0) -> tuple[nn.Module, torch.optim.Optimizer, torch.Tensor]:
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(64, 128, bias=False), nn.ReLU(), nn.Linear(128, 32, bias=False))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, foreach=True)
    return model, opt, torch.randn(16, 64)


def _step(model: nn.Module, opt: torch.optim.Optimizer, x: torch.Tensor) -> None:
    model(x).square().mean().backward()
    opt.step()
    opt.zero_grad(set_to_none=True)


class _Trainer:
    def __init__(self, model: nn.Module):
        self.model = model


def test_the_peak_and_the_states_equal_torchs_memtracker():
    from torch.distributed._tools.mem_tracker import MemTracker

    model, opt, x = _model_and_optimizer()
    _step(model, opt, x)  # the optimizer's state exists from here on, as after a warmup
    ours = measure_step(lambda: _step(model, opt, x), trainer=_Trainer(model))
    tracker = MemTracker()
    tracker.track_external(model, opt, x)
    with tracker:
        _step(model, opt, x)
    (theirs,) = tracker.get_tracker_snapshot("peak").values()
    by_name = {str(k).split(".")[-1]: v for k, v in theirs.items()}
    params = (64 * 128 + 128 * 32) * 4
    # the meter also counts every other tensor alive in this process (other tests'), which MemTracker is not shown
    others = measure_step(lambda: None, trainer=_Trainer(model)).bytes["buffers"] - x.nbytes
    assert ours.total == by_name["Total"] + others  # at the optimizer step, both
    assert ours.bytes["params"] == by_name["PARAM"] == params
    assert ours.bytes["grads"] == by_name["GRAD"] == params
    # AdamW's two moments and one fp32 `step` tensor per parameter (torch keeps `step` as a tensor); MemTracker files
    # everything the step makes as optimizer state, its foreach temporaries too, and the input batch as OTH: those
    # are buffers here
    assert ours.bytes["optimizer"] == 2 * params + 2 * 4
    rest = by_name["OPT"] + by_name["ACT"] + by_name["TEMP"] + by_name["OTH"] + by_name["BUFFER"]
    assert ours.bytes["optimizer"] + ours.bytes["activations"] + ours.bytes["buffers"] == rest + others
    assert sum(ours.bytes[c] for c in CATEGORIES) == ours.total
    assert ours.phase == "optimizer"


def test_a_gradient_in_a_storage_older_than_the_step_counts_from_its_start():
    """DDP's buckets: the gradients are views of a flat buffer made at wrap time, reached only through `.grad`."""
    model, opt, x = _model_and_optimizer()
    flat = torch.zeros(sum(p.numel() for p in model.parameters()))
    views = flat.split([p.numel() for p in model.parameters()])

    def step() -> None:
        model(x).square().mean().backward()
        with torch.no_grad():
            for p, v in zip(model.parameters(), views, strict=True):
                v.copy_(p.grad.flatten())
                p.grad = v.view_as(p)  # the bucket view becomes the gradient, as gradient_as_bucket_view does
        opt.step()
        opt.zero_grad(set_to_none=True)

    step()
    got = measure_step(step, trainer=_Trainer(model))
    assert got.bytes["grads"] >= flat.nbytes  # the whole buffer, filed as gradients
    meter = TensorMemoryMeter()
    with meter.measure(model, {}):
        step()
    rows = meter.live_at_peak()
    assert (flat.nbytes, "grads", "") in rows  # alive from the step's start, found at the optimizer step


def test_a_storage_grown_by_resize_counts_and_a_freed_one_stops_counting():
    """FSDP frees a gathered parameter with `storage.resize_(0)` and refills it with `resize_(n)`: no dispatch mode
    sees either, so the meter wraps `resize_`."""
    model, _, x = _model_and_optimizer()
    gathered = torch.empty(0)
    n = 1 << 20

    def step(grow: bool) -> None:
        if grow:
            gathered.untyped_storage().resize_(n)  # 1 MiB gathered ...
        y = x * 2
        if grow:
            gathered.untyped_storage().resize_(0)  # ... and freed
        del y
        z = x * 3  # the step's other peak, as high as y's
        del z

    plain = measure_step(lambda: step(False), trainer=_Trainer(model))
    grown = measure_step(lambda: step(True), trainer=_Trainer(model))
    assert grown.total - plain.total == n
    assert grown.bytes["buffers"] - plain.bytes["buffers"] == n


def test_a_sharded_optimizers_own_parameters_are_its_state_and_their_grads_gradients():
    """DeepSpeed ZeRO-1/2: the inner optimizer steps fp32 partitions that are not the model's parameters."""
    model, _, x = _model_and_optimizer()
    master = torch.zeros(sum(p.numel() for p in model.parameters()), requires_grad=True)
    inner = torch.optim.AdamW([master], lr=1e-3, foreach=True)

    def step() -> None:
        model(x).square().mean().backward()
        master.grad = torch.cat([p.grad.flatten() for p in model.parameters()])  # the fp32 gradient partition
        for p in model.parameters():
            p.grad = None
        inner.step()
        inner.zero_grad(set_to_none=True)

    step()
    got = measure_step(step, trainer=_Trainer(model))
    assert got.bytes["optimizer"] == 3 * master.nbytes + 4  # master, two moments, the step counter
    assert got.bytes["params"] == master.nbytes  # the model's fp32 parameters, as many elements


def test_the_measure_is_the_same_every_time_even_with_reference_cycles():
    """Tensors caught in reference cycles are freed by the garbage collector, whenever it runs: the meter pauses it
    over the step, so a cycle frees at the same moment (after the step) in every run."""
    model, opt, x = _model_and_optimizer()

    def step() -> None:
        a: list = [torch.ones(4096)]
        a.append(a)  # a cycle: only the collector frees it
        _step(model, opt, x)

    step()
    runs = [measure_step(step, trainer=_Trainer(model)) for _ in range(3)]
    assert len({(r.total, tuple(r.bytes.values())) for r in runs}) == 1


def test_a_free_on_another_thread_is_placed_where_this_thread_last_used_the_storage():
    """gloo's worker drops a collective's tensors a moment after the rank lets go, at a time scheduling decides; the
    meter places such a free right after the rank's last operator on the storage, so the peak is the same whether
    the worker lets go before or after the step's next allocations."""
    import threading
    import time

    model, _, x = _model_and_optimizer()

    def step(delay: float) -> None:
        held = [x * 2]  # 4 KiB, last used by the operator that made it
        worker = threading.Thread(target=lambda: (time.sleep(delay), held.clear()))
        worker.start()
        held_here = x * 3  # the step's next allocation: beside the first, or after it was freed
        worker.join()
        del held_here

    runs = [measure_step(lambda d=d: step(d), trainer=_Trainer(model)) for d in (0.0, 0.2, 0.0, 0.2)]
    assert len({r.total for r in runs}) == 1
    assert all(r.off_thread_frees == 1 for r in runs)


def test_on_an_accelerator_host_storages_are_counted_apart():
    """Offload keeps states in host memory while the rank's device is a GPU: those are not device memory. No GPU
    here, so the meter is told the device is CUDA (the one thing mocked): every storage of this CPU step is then a
    host storage, none in the categories, and the host figure is what the CPU step's total is."""
    model, opt, x = _model_and_optimizer()
    _step(model, opt, x)
    on_cpu = measure_step(lambda: _step(model, opt, x), trainer=_Trainer(model))
    as_gpu = measure_step(lambda: _step(model, opt, x), trainer=_Trainer(model), device_type="cuda")
    assert on_cpu.host == 0 and on_cpu.total > 0
    assert as_gpu.total == 0 and set(as_gpu.bytes.values()) == {0}
    assert as_gpu.host == on_cpu.total
