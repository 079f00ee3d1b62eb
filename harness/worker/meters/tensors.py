"""Tensor memory by category over one untimed step, on any device: storage-level accounting.

Why not torch's MemTracker (torch.distributed._tools.mem_tracker): it sees only the storages created under it or
registered with it, and files them by when they were made (forward → activation, backward → temporary). DDP's
gradient buckets exist before the step and are reached only through `param.grad`; DeepSpeed's fp32 partitions are
an inner optimizer's parameters; FSDP's all-gather outputs are made in the forward but are communication buffers.
The planner (harness.plan.memory) names each of those, so this meter files every storage by what it *is*:

    params       a storage of one of the model's parameters (local shard or replica) at the step's start
    optimizer    a storage of a torch optimizer's state, or of an optimizer parameter that is not the model's
                 (DeepSpeed's fp32 master partition)
    grads        a storage some parameter's `.grad` uses when an optimizer steps (its view's whole storage: DDP's
                 bucket), model's or optimizer's
    activations  created by the forward (or by a checkpointed block's recompute inside backward), and never an
                 operand of a collective
    buffers      everything else: collectives' inputs and outputs (gathered parameters, reduce-scatter outputs
                 before they become gradients, reduce buckets), backward's temporaries, tables kept between steps

A storage's category is the strongest it ever gets (in that order, params first); the peak is found by replaying
every allocation, free and resize of the step in order, and split by the categories of the storages live at it.
Storages alive before the step (found by the garbage collector's view of Python tensors, and ones first met during
the step without being created in it, like DDP's buckets) count from its start.

What this does not see: memory an operator allocates and frees inside itself (a kernel's workspace), and storages
held only by C++ that the step never touches. On CUDA the allocator's peaks (harness.worker.meters.memory) see
those; `memory_fragmentation_gib` is the reserved peak above this meter's total.
"""

from __future__ import annotations

import gc
import threading
import time
import weakref
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch._subclasses.fake_tensor import FakeTensor as _FAKE
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

CATEGORIES: tuple[str, ...] = ("params", "grads", "optimizer", "activations", "buffers")
"""the planner's names (harness.plan.memory.Memory), in the record's order"""
_STRENGTH = {"params": 5, "optimizer": 4, "grads": 3, "comm": 2, "activations": 1, "buffers": 0}
"""which category wins when a storage is seen as two ('comm' files as buffers)"""

GIB = 2**30


def _storages(t: torch.Tensor) -> list[torch.UntypedStorage]:
    """The storages holding `t`'s bytes: a plain tensor's own, a wrapper subclass's inner tensors' (DTensor's local
    shard, a waited collective's result)."""
    if type(t) is torch.Tensor or type(t) is torch.nn.Parameter:
        return [] if t.is_meta else [t.untyped_storage()]
    if hasattr(t, "__tensor_flatten__"):
        names, _ = t.__tensor_flatten__()
        inner = (getattr(t, n) for n in names)
        return [s for i in inner if isinstance(i, torch.Tensor) for s in _storages(i)]
    try:
        return [] if t.is_meta else [t.untyped_storage()]
    except (RuntimeError, NotImplementedError):  # a subclass without storage of its own and no flatten
        return []


@dataclass
class _Storage:
    sid: int
    nbytes: int
    category: str = "buffers"
    created: bool = False  # made during the step (else: alive before it)
    origin: str = ""  # the operator that made it, or the phase it was met in
    last_use: int = 0  # events logged when an operator on the measured thread last touched it
    host: bool = False  # in host memory while the rank's device is an accelerator (offload): not device memory


def _in_backward() -> bool:
    """Whether autograd's engine is running a backward on this thread (what torch's ModTracker asks too)."""
    return torch._C._current_graph_task_id() != -1


def _upgrade(info: _Storage, category: str) -> None:
    """File a storage under `category` if that is stronger than what it is filed under (_STRENGTH)."""
    if _STRENGTH[category] > _STRENGTH[info.category]:
        info.category = category


@dataclass
class StepMemory:
    """One rank's peak of live tensor bytes over the step, and the bytes of each category at it."""

    bytes: dict[str, int]
    total: int
    phase: str
    host: int = 0  # the peak of host-memory storages while the device is an accelerator (offload)
    seconds: float = 0.0  # the measured step's wall time under the meter
    off_thread_frees: int = 0  # frees on another thread (TensorMemoryMeter.off_thread_frees)


@dataclass
class _Log:
    base: dict[int, int] = field(default_factory=dict)  # sid → bytes at the step's start
    events: list[tuple[int, int]] = field(default_factory=list)  # (sid, +/- bytes) in order
    phases: list[str] = field(default_factory=list)  # the phase each event happened in
    late: list[tuple[int, int, int]] = field(default_factory=list)
    """(position, sid, -bytes): a free on another thread, placed after the events[:position] (see `freed`)"""

    def replay(self) -> list[tuple[int, int, str]]:
        """Every event in order, (sid, +/- bytes, phase), the frees of other threads at their places."""
        late = sorted(self.late)
        out: list[tuple[int, int, str]] = []
        j = 0
        for i, ((sid, delta), phase) in enumerate(zip(self.events, self.phases, strict=True)):
            while j < len(late) and late[j][0] <= i:
                out.append((late[j][1], late[j][2], phase))
                j += 1
            out.append((sid, delta, phase))
        last = self.phases[-1] if self.phases else "start"
        out += [(sid, delta, last) for _, sid, delta in late[j:]]
        return out


class TensorMemoryMeter(TorchDispatchMode):
    """Use as `with meter.measure(model, extra): step()`; then `meter.result()`.

    `extra`: {category: tensors} a strategy declares that the rules above cannot find (DeepSpeed ZeRO-3's parameter
    partitions, which are attributes of the parameters, not the parameters)."""

    def __init__(self, device_type: str = "cpu") -> None:
        from torch.utils.weak import WeakIdKeyDictionary

        super().__init__()
        self.device_type = device_type
        """the rank's device: on an accelerator, storages in host memory (offload) are counted apart"""
        self._by_key = WeakIdKeyDictionary()  # storage → its _Storage, without keeping the storage alive
        self._orig_resize: Callable[..., Any] = torch.UntypedStorage.resize_
        self._info: dict[int, _Storage] = {}
        self._log = _Log()
        self._next = 0
        self._refs: list[weakref.ref] = []
        self._recompute = 0
        self._in_opt = 0
        self._thread = threading.get_ident()
        self.off_thread_frees = 0
        """storages whose last reference died on another thread (a collective's worker): their free's moment depends
        on timing, so the peak may differ between runs"""
        self._optimizers: list[torch.optim.Optimizer] = []

    # ---- storages

    def _is_host(self, st: torch.UntypedStorage) -> bool:
        return self.device_type != "cpu" and st.device.type == "cpu"

    def _key(self, st: torch.UntypedStorage) -> _Storage | None:
        return self._by_key.get(st)

    def _track(self, st: torch.UntypedStorage, *, created: bool, category: str | None = None) -> _Storage:
        info = self._key(st)
        if info is None:
            info = _Storage(sid=self._next, nbytes=st.nbytes(), created=created, host=self._is_host(st))
            self._next += 1
            self._info[info.sid] = info
            self._by_key[st] = info
            if created:
                self._event(info.sid, info.nbytes)
            else:  # alive before the step: from its start
                self._log.base[info.sid] = info.nbytes

            def freed(_ref: Any, info: _Storage = info) -> None:
                if not info.nbytes:
                    return
                if threading.get_ident() == self._thread:
                    self._event(info.sid, -info.nbytes)
                else:
                    # NOTE: a collective's worker thread dropped the last reference, a moment after the measured
                    # thread let go, at a time that depends on scheduling: placed right after the measured thread's
                    # last operator on it, so the replay (and the peak) is the same every run
                    self.off_thread_frees += 1
                    self._log.late.append((info.last_use, info.sid, -info.nbytes))
                info.nbytes = 0

            self._refs.append(weakref.ref(st, freed))
        if category is not None:
            _upgrade(info, category)
        return info

    def _event(self, sid: int, delta: int) -> None:
        self._log.events.append((sid, delta))
        self._log.phases.append(self._now())

    def _now(self) -> str:
        """The step's phase at this moment: optimizer, backward (a recompute inside it too) or forward."""
        if self._in_opt:
            return "optimizer"
        return "backward" if _in_backward() else "forward"

    def _tag(self, tensors: Iterable[Any], category: str) -> None:
        for t in tensors:
            if isinstance(t, torch.Tensor):
                for st in _storages(t):
                    self._track(st, created=False, category=category)

    # ---- the step's moments

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        from torch.distributed.tensor import DTensor

        if any(t is DTensor for t in types):
            return NotImplemented  # DTensor desugars to local ops first; they come back through this mode
        out = func(*args, **(kwargs or {}))
        if any(isinstance(t, _FAKE) for t in tree_leaves(out)):
            # NOTE: a compile inside the measured step (dynamo recompiling under this mode) runs on fake tensors,
            # whose sizes may be symbolic (unpicklable when the ranks gather the peaks): no memory of the step
            return out
        # NOTE: every operand of a collective is a communication buffer unless it is a state (a reduce bucket, a
        # gradient shard), except a functional collective's in the forward: that is tensor and sequence parallelism
        # (DTensor's redistribute), whose gathered or reduced output is what the layer goes on with and saves for
        # backward. FSDP and DeepSpeed gather parameters with the in-place c10d ops, in the forward too.
        functional = func.namespace in ("_c10d_functional", "c10d_functional")
        comm = (func.namespace == "c10d" or functional) and not (functional and self._phase_category() == "activations")
        if comm:
            self._tag(tree_leaves((args, kwargs)), "comm")
        self._used(tree_leaves((args, kwargs)))  # the operands before its outputs are made, the outputs after
        for t in tree_leaves(out):
            if isinstance(t, torch.Tensor) and not t.is_meta:
                for st in _storages(t):
                    known = self._key(st) is not None
                    info = self._track(st, created=True, category="comm" if comm else None)
                    if not known:
                        info.origin = f"{self._now()}:{func.__name__}"
                        if self._phase_category() == "activations":
                            _upgrade(info, "activations")
        self._used(tree_leaves(out))
        return out

    def _used(self, leaves: Iterable[Any]) -> None:
        """Mark the storages an operator on the measured thread touched (their frees elsewhere go here)."""
        now = len(self._log.events)
        for t in leaves:
            if isinstance(t, torch.Tensor) and not t.is_meta:
                for st in _storages(t):
                    info = self._key(st)
                    if info is not None:
                        info.last_use = now

    def _phase_category(self) -> str:
        if self._in_opt:
            return "buffers"
        if _in_backward() and not self._recompute:
            return "buffers"
        return "activations"

    def _resize(self, st: Any, size: int) -> None:
        """UntypedStorage.resize_, which no dispatch mode sees: FSDP frees and refills its gathered parameters so."""
        if st.device.type == "meta" or not isinstance(size, int):
            # NOTE: a compile inside the measured step traces FSDP2's resizes on fake (meta) storages, whose sizes
            # may be symbolic: not memory, and a symbolic size would make the peaks unpicklable when ranks gather
            # them (CI once failed so: "Can't pickle local object 'WeakValueDictionary...'", a ShapeEnv's)
            self._orig_resize(st, size)
            return
        before = st.nbytes()
        self._orig_resize(st, size)
        info = self._key(st)
        if info is None:  # alive before the step, at its size before this resize
            info = self._track(st, created=False)
            info.nbytes = self._log.base[info.sid] = before
        after = st.nbytes()
        if after != info.nbytes:
            self._event(info.sid, after - info.nbytes)
            info.nbytes = after

    def _inventory(self, model: torch.nn.Module, extra: dict[str, list]) -> None:
        """Every storage alive at the step's start, filed."""
        # NOTE: type(), not isinstance(): isinstance reads `__class__`, which deprecated module proxies (torch's
        # `distributed.reduce_op`) answer with a FutureWarning
        alive = gc.get_objects()
        optimizers = [o for o in alive if issubclass(type(o), torch.optim.Optimizer)]
        tensors = [o for o in alive if issubclass(type(o), torch.Tensor)]
        del alive
        params = list(model.parameters())
        self._tag(params, "params")
        self._tag((p.grad for p in params if p.grad is not None), "grads")
        self._optimizers = optimizers
        model_params = {id(p) for p in params}
        for opt in optimizers:
            self._tag((v for state in opt.state.values() for v in state.values()), "optimizer")
            others = [p for g in opt.param_groups for p in g["params"] if id(p) not in model_params]
            self._tag(others, "optimizer")
            self._tag((p.grad for p in others if p.grad is not None), "grads")
        for category, found in extra.items():
            self._tag(found, category)
        self._tag(tensors, "buffers")

    def _gathered(self, module: torch.nn.Module) -> None:
        """After a module's forward (before the strategy's own post-forward hook frees anything): a parameter of it
        whose storage the step made is a gathered parameter (FSDP2's unsharded parameters, ZeRO-3's gathered ones,
        however the all-gather produced it): a communication buffer, not an activation."""
        for p in module.parameters(recurse=False):
            for st in _storages(p):
                info = self._key(st)
                if info is not None and info.created:
                    _upgrade(info, "comm")

    def _grads_now(self) -> None:
        """At an optimizer step: every gradient in place is a gradient (DDP's bucket views' whole storages)."""
        for opt in self._optimizers:
            self._tag((p.grad for g in opt.param_groups for p in g["params"] if p.grad is not None), "grads")

    def measure(self, model: torch.nn.Module, extra: dict[str, list] | None = None) -> _Measuring:
        return _Measuring(self, model, extra or {})

    # ---- the replay

    def live_at_peak(self) -> list[tuple[int, str, str]]:
        """(bytes, category, origin) of every storage live at the peak, largest first: what to look at when a
        category differs from the plan."""
        events = self._log.replay()
        live = self._live_at(events, self._peak(events)[0])
        rows = [(n, self._info[sid].category, self._info[sid].origin) for sid, n in live.items() if n]
        return sorted(rows, reverse=True)

    def _live_at(self, events: list[tuple[int, int, str]], at: int) -> dict[int, int]:
        """sid → bytes of every storage after events[: at + 1] (at -1: the step's start)."""
        live = dict(self._log.base)
        for sid, delta, _ in events[: at + 1]:
            live[sid] = live.get(sid, 0) + delta
        return live

    def _peak(self, events: list[tuple[int, int, str]], *, host: bool = False) -> tuple[int, int]:
        """(index of the event that reached the peak, -1 for the start; the peak's bytes), over the device's storages
        (or, `host`, over the host's while the device is an accelerator)."""
        mine = {sid for sid, info in self._info.items() if info.host == host}
        total = peak = sum(n for sid, n in self._log.base.items() if sid in mine)
        at = -1
        for i, (sid, delta, _) in enumerate(events):
            if sid not in mine:
                continue
            total += delta
            if total > peak:
                peak, at = total, i
        return at, peak

    def result(self) -> StepMemory:
        """The peak over the step and its split by category."""
        name = {c: ("buffers" if c == "comm" else c) for c in _STRENGTH}
        events = self._log.replay()
        at, peak = self._peak(events)
        live = self._live_at(events, at)
        split = dict.fromkeys(CATEGORIES, 0)
        for sid, nbytes in live.items():
            if not self._info[sid].host:
                split[name[self._info[sid].category]] += nbytes
        phase = events[at][2] if at >= 0 else "start"
        _, host = self._peak(events, host=True)
        return StepMemory(bytes=split, total=peak, phase=phase, host=host)


class _Measuring:
    """The context of one measured step: the dispatch mode, the resize patch, the module and optimizer hooks."""

    def __init__(self, meter: TensorMemoryMeter, model: torch.nn.Module, extra: dict[str, list]):
        self.meter, self.model, self.extra = meter, model, extra
        self._handles: list[Any] = []

    def __enter__(self) -> TensorMemoryMeter:
        from torch.nn.modules.module import register_module_forward_hook, register_module_forward_pre_hook
        from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook

        m = self.meter
        m._inventory(self.model, self.extra)

        def pre(module, args):
            if _in_backward():
                m._recompute += 1

        def post(module, args, out):
            if _in_backward():
                m._recompute -= 1
            m._gathered(module)

        def opt_pre(opt, args, kwargs):
            m._grads_now()
            m._in_opt += 1

        def opt_post(opt, args, kwargs):
            m._in_opt -= 1

        self._handles = [
            register_module_forward_pre_hook(pre),
            # NOTE: always_call: a checkpointed block's recompute stops early by raising once it has what backward
            # needs (non-reentrant checkpoint's early stop), past the module's forward hooks
            register_module_forward_hook(post, always_call=True),
            register_optimizer_step_pre_hook(opt_pre),
            register_optimizer_step_post_hook(opt_post),
        ]
        # NOTE: UntypedStorage.resize_ is patched on the class for the step (no dispatch mode sees it) and put back
        # on the way out, whatever the step raised
        torch.UntypedStorage.resize_ = lambda st, size: m._resize(st, size)  # type: ignore[method-assign,assignment]
        m.__enter__()
        return m

    def __exit__(self, *exc: Any) -> None:
        m = self.meter
        try:
            m.__exit__(*exc)
        finally:
            torch.UntypedStorage.resize_ = m._orig_resize  # type: ignore[method-assign]
            for h in self._handles:
                h.remove()


def measure_step(step: Callable[[], Any], *, trainer: Any, device_type: str = "cpu") -> StepMemory:
    """One more training step under the meter, after the timed and counted ones (its cost touches no timed step);
    `trainer.memory_extra()` where a strategy declares states the rules cannot find."""
    model = trainer.model
    extra = trainer.memory_extra() if hasattr(trainer, "memory_extra") else {}
    meter = TensorMemoryMeter(device_type)
    # NOTE: the garbage collector paused over the step, after a collection: tensors caught in reference cycles (a
    # pipeline schedule's) are then freed at the same moment in every run, not whenever a collection happens to run
    gc.collect()
    gc.disable()
    t0 = time.perf_counter()
    try:
        with meter.measure(model, extra):
            step()
    finally:
        gc.enable()
    result = meter.result()
    result.seconds = time.perf_counter() - t0
    result.off_thread_frees = meter.off_thread_frees
    return result


def over_ranks(mine: StepMemory) -> dict[str, Any] | None:
    """Every rank's peak gathered; on rank 0 the record's `metrics.memory_gib` (the largest rank's breakdown, by
    category in GiB, with every rank's total), elsewhere None."""
    import torch.distributed as dist

    peaks: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(peaks, (mine.bytes, mine.total, mine.phase, mine.seconds, mine.off_thread_frees, mine.host))
    if dist.get_rank() != 0:
        return None
    rank = max(range(len(peaks)), key=lambda r: (peaks[r][1], -r))
    split, total, phase, _, _, _ = peaks[rank]
    return {
        **{c: split[c] / GIB for c in CATEGORIES},
        "total": total / GIB,
        "rank": rank,
        "phase": phase,
        "per_rank_total": [p[1] / GIB for p in peaks],
        "meter_s": max(p[3] for p in peaks),
        "off_thread_frees": sum(p[4] for p in peaks),
        "host": max(p[5] for p in peaks) / GIB,
    }
