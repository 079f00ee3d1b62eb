"""Collective accounting: every c10d collective this process issues, with dtype, bytes and group.

A kernel is registered for the `c10d` ops through `torch.library` at the Autograd dispatch key. Every
collective — from Python (`torch.distributed.*`, DeepSpeed), from DDP's C++ reducer, from FSDP1/FSDP2 —
goes through these ops, on any thread, so one hook sees all of them once. The kernel appends a small
tuple to a list and redispatches below Autograd: no synchronisation, no tensor reads.

The worker counts over one untimed step after the timed ones: the timed steps never run the kernel. In
that step the meter also times each collective in isolation — device sync, issue, wait, device sync — so
that `summary` can give algbw (bytes / time) and busbw (algbw × the nccl-tests factor for the group size:
all_reduce 2(n−1)/n; all_gather, reduce_scatter, all_to_all (n−1)/n; broadcast, reduce, send/recv 1).
Serialising the collectives changes no count: the same calls, in the same order.

Bytes follow the nccl-tests convention, per rank: the buffer for all_reduce / broadcast / reduce, the
(whole) output for all_gather, the (whole) input for reduce_scatter, the input for all_to_all, the tensor
for send/recv; barrier counts a call and 0 bytes.

The functional collectives (`_c10d_functional`: what DTensor's redistributions, tensor parallelism and loss parallel
issue) call the process group without passing through the `c10d` ops, so they are hooked too, the same way; they name
their group by its registered name. Point-to-point sends and receives (pipeline parallelism), and ops issued inside a
non-fast-path `_coalescing_manager` block (NCCL launches those together at `_end_coalescing`), are counted but not
timed one by one: waiting on a send inside the hook, before the peer has posted its receive, would stall the pipeline
(and gloo's send work cannot be waited on twice).

DTensor (tensor parallelism) issues some functional collectives from inside its own dispatch — implicit
redistributions, loss parallel's cross-entropy — where the dispatcher has already passed the Autograd key, so no
kernel registered there sees them. For such cells (`dtensor=True`) the counting window also runs a dispatch mode that
lets DTensor desugar its ops (returning NotImplemented for them, as torch's CommDebugMode does) and counts the
functional collectives that reach it without having passed through the Autograd-key kernel (a thread-local flag says
which did), so nothing is counted twice.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable
from contextlib import contextmanager
from typing import Any, cast

import torch
import torch.distributed as dist
from torch.utils._python_dispatch import TorchDispatchMode


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


def _first(ts) -> torch.Tensor:
    while isinstance(ts, (list, tuple)):
        ts = ts[0]
    return ts


def _sum_bytes(ts) -> int:
    if isinstance(ts, (list, tuple)):
        return sum(_sum_bytes(t) for t in ts)
    return _nbytes(ts)


# op name → (collective name, bytes(args), index of the ProcessGroup argument)
_OPS: dict[str, tuple[str, Callable[[tuple], int], int]] = {
    "allreduce_": ("all_reduce", lambda a: _sum_bytes(a[0]), 1),
    "allreduce_coalesced_": ("all_reduce", lambda a: _sum_bytes(a[0]), 1),
    "allgather_": ("all_gather", lambda a: _sum_bytes(a[0]), 2),
    "_allgather_base_": ("all_gather", lambda a: _nbytes(a[0]), 2),
    "allgather_coalesced_": ("all_gather", lambda a: _sum_bytes(a[0]), 2),
    "allgather_into_tensor_coalesced_": ("all_gather", lambda a: _sum_bytes(a[0]), 2),
    "reduce_scatter_": ("reduce_scatter", lambda a: _sum_bytes(a[1]), 2),
    "_reduce_scatter_base_": ("reduce_scatter", lambda a: _nbytes(a[1]), 2),
    "reduce_scatter_tensor_coalesced_": ("reduce_scatter", lambda a: _sum_bytes(a[1]), 2),
    "broadcast_": ("broadcast", lambda a: _sum_bytes(a[0]), 1),
    "reduce_": ("reduce", lambda a: _sum_bytes(a[0]), 1),
    "alltoall_": ("all_to_all", lambda a: _sum_bytes(a[1]), 2),
    "alltoall_base_": ("all_to_all", lambda a: _nbytes(a[1]), 2),
    "send": ("send", lambda a: _sum_bytes(a[0]), 1),
    "recv_": ("recv", lambda a: _sum_bytes(a[0]), 1),
    "recv_any_source_": ("recv", lambda a: _sum_bytes(a[0]), 1),
    "gather_": ("gather", lambda a: _sum_bytes(a[1]), 2),
    "scatter_": ("scatter", lambda a: _sum_bytes(a[0]), 2),
    "barrier": ("barrier", lambda a: 0, 1),
}


# the functional collectives (torch.ops._c10d_functional), whose last positional argument names the group
_FUNCTIONAL_OPS: dict[str, tuple[str, Callable[[tuple], int], int]] = {
    "all_reduce": ("all_reduce", lambda a: _nbytes(a[0]), 2),
    "all_reduce_": ("all_reduce", lambda a: _nbytes(a[0]), 2),
    "all_reduce_coalesced": ("all_reduce", lambda a: _sum_bytes(a[0]), 2),
    "all_gather_into_tensor": ("all_gather", lambda a: _nbytes(a[0]) * a[1], 2),
    "all_gather_into_tensor_out": ("all_gather", lambda a: _nbytes(a[0]) * a[1], 2),
    "all_gather_into_tensor_coalesced": ("all_gather", lambda a: _sum_bytes(a[0]) * a[1], 2),
    "reduce_scatter_tensor": ("reduce_scatter", lambda a: _nbytes(a[0]), 3),
    "reduce_scatter_tensor_coalesced": ("reduce_scatter", lambda a: _sum_bytes(a[0]), 3),
    "all_to_all_single": ("all_to_all", lambda a: _nbytes(a[0]), 3),
    "broadcast": ("broadcast", lambda a: _nbytes(a[0]), 2),
    "broadcast_": ("broadcast", lambda a: _nbytes(a[0]), 2),
}
_NAMESPACES = (("c10d", _OPS), ("_c10d_functional", _FUNCTIONAL_OPS))
_P2P = frozenset({"send", "recv"})
"""collectives the timed count does not wait on (see the module docstring)"""


def _dtype_of(op: str, args: tuple) -> str:
    t = _first(
        args[1]
        if op
        in (
            "reduce_scatter_",
            "_reduce_scatter_base_",
            "reduce_scatter_tensor_coalesced_",
            "alltoall_",
            "alltoall_base_",
            "gather_",
        )
        else args[0]
    )
    return str(t.dtype).removeprefix("torch.")


BUS_FACTORS: dict[str, Callable[[int], float]] = {
    "all_reduce": lambda n: 2 * (n - 1) / n,
    "all_gather": lambda n: (n - 1) / n,
    "reduce_scatter": lambda n: (n - 1) / n,
    "all_to_all": lambda n: (n - 1) / n,
    "broadcast": lambda n: 1.0,
    "reduce": lambda n: 1.0,
    "send": lambda n: 1.0,
    "recv": lambda n: 1.0,
}
"""busbw / algbw per collective for a group of n ranks (nccl-tests, doc/PERFORMANCE.md)"""


def _sync(device: torch.device | None) -> None:
    if device is not None and device.type == "cuda":
        torch.cuda.synchronize(device)


def _wait(out: Any) -> None:
    work = out[-1] if isinstance(out, (tuple, list)) else out
    if isinstance(work, torch.ScriptObject):
        work = torch._C._distributed_c10d.Work.unbox(work)
    if hasattr(work, "wait"):
        work.wait()
        return
    for t in out if isinstance(out, (tuple, list)) else [out]:  # a functional collective's pending result(s)
        if isinstance(t, torch.Tensor):
            torch.ops._c10d_functional.wait_tensor(t)


class CommMeter:
    """Counts collectives while `active`. Install once per process; `measure()` opens a counting window.
    With `timed`, each collective is also timed in isolation (synchronously: for an untimed step only)."""

    def __init__(self, *, timed: bool = False, device: torch.device | None = None, dtensor: bool = False) -> None:
        self.events: list[tuple[str, str, int, Any, float | None]] = []
        self.timed, self.device = timed, device
        self.active = False
        self._libs: list[torch.library.Library] = []
        self._lock = threading.Lock()
        self.dtensor = dtensor
        """also count the collectives DTensor issues inside its dispatch (tensor-parallel cells)"""
        self._in_kernel = threading.local()

    def install(self) -> CommMeter:
        if self._libs:
            return self
        for namespace, ops in _NAMESPACES:
            lib = torch.library.Library(namespace, "IMPL")  # noqa: TOR901 - registering kernels for an existing namespace
            for name, (coll, size_fn, pg_index) in ops.items():
                packet = getattr(getattr(torch.ops, namespace), name, None)
                if packet is None:
                    continue
                lib.impl(name, self._kernel(name, packet.default, coll, size_fn, pg_index), "Autograd")
            self._libs.append(lib)
        return self

    def uninstall(self) -> None:
        for lib in self._libs:
            lib._destroy()
        self._libs = []

    def _kernel(self, name: str, op, coll: str, size_fn, pg_index: int):
        def below_autograd(*args, **kwargs):
            self._in_kernel.depth = getattr(self._in_kernel, "depth", 0) + 1
            try:
                with torch._C._AutoDispatchBelowAutograd():
                    return op(*args, **kwargs)
            finally:
                self._in_kernel.depth -= 1

        def kernel(*args, **kwargs):
            if not self.active:
                return below_autograd(*args, **kwargs)
            return self._count(name, below_autograd, coll, size_fn, pg_index, args, kwargs)

        return kernel

    def _count(self, name: str, call, coll: str, size_fn, pg_index: int, args: tuple, kwargs: dict):
        """Issue one collective through `call`, recording (and, when timed, timing) it."""
        what = (coll, _dtype_of(name, args), size_fn(args), args[pg_index])
        timed = self.timed and coll not in _P2P and not _coalescing(args[pg_index])
        if timed:
            _sync(self.device)
            t0 = time.perf_counter()
        out = call(*args, **kwargs)
        seconds = None
        if timed:
            _wait(out)
            _sync(self.device)
            seconds = time.perf_counter() - t0
        with self._lock:
            self.events.append((*what, seconds))
        return out

    def in_kernel(self) -> bool:
        """Whether this thread is inside one of the Autograd-key kernels (the collective is being counted there)."""
        return getattr(self._in_kernel, "depth", 0) > 0

    @contextmanager
    def measure(self):
        with self._lock:
            self.events.clear()
        self.active = True
        mode = _DTensorCollectives(self) if self.dtensor else contextlib.nullcontext()
        try:
            with mode:
                yield self
        finally:
            self.active = False

    def summary(self, *, steps: int, gpus_per_node: int) -> dict:
        """Per-step totals, by collective and by group kind (intra-node / inter-node / mixed)."""
        by_coll: dict[str, dict[str, Any]] = {}
        by_group: dict[str, dict] = {}
        groups: dict[str, dict] = {}
        total_calls = total_bytes = 0
        timing: dict[str, list[float]] = {}  # collective → [seconds, bytes, bus bytes]
        for coll, dtype, nbytes, pg, seconds in self.events:
            ranks, kind = _group_info(pg, gpus_per_node)
            if seconds is not None and coll in BUS_FACTORS and len(ranks) > 1:
                t = timing.setdefault(coll, [0.0, 0.0, 0.0])
                t[0] += seconds
                t[1] += nbytes
                t[2] += nbytes * BUS_FACTORS[coll](len(ranks))
            c = by_coll.setdefault(coll, {"calls": 0, "bytes": 0, "dtypes": {}})
            c["calls"] += 1
            c["bytes"] += nbytes
            c["dtypes"][dtype] = c["dtypes"].get(dtype, 0) + nbytes
            g = by_group.setdefault(kind, {"calls": 0, "bytes": 0})
            g["calls"] += 1
            g["bytes"] += nbytes
            gname = f"{kind}:{','.join(map(str, ranks))}" if ranks else kind
            gg = groups.setdefault(gname, {"ranks": ranks, "kind": kind, "calls": 0, "bytes": 0})
            gg["calls"] += 1
            gg["bytes"] += nbytes
            total_calls += 1
            total_bytes += nbytes
        for name, c in by_coll.items():
            if name in timing and timing[name][0] > 0:
                secs, timed_bytes, bus = timing[name]
                c["time_s"] = secs / steps
                c["algbw_gbps"] = timed_bytes / secs / 1e9
                c["busbw_gbps"] = bus / secs / 1e9
            c["dtype"] = max(c["dtypes"], key=c["dtypes"].get) if c["dtypes"] else None
            for k in ("calls", "bytes"):
                c[k] = c[k] / steps
            c["dtypes"] = {d: b / steps for d, b in c["dtypes"].items()}
        for g in list(by_group.values()) + list(groups.values()):
            g["calls"] /= steps
            g["bytes"] /= steps
        timed = sum(t[0] for t in timing.values())
        return {
            "time_s_per_step": timed / steps if self.timed else None,
            "bytes_per_step": total_bytes / steps,
            "calls_per_step": total_calls / steps,
            "by_collective": by_coll,
            "by_group": by_group,
            "groups": list(groups.values()),
            "measured_steps": steps,
        }


def _coalescing(pg: Any) -> bool:
    """Whether `pg` is inside a `_coalescing_manager` block that issues its ops one by one (the non-fast path: NCCL
    queues them and launches them together at `_end_coalescing`). Such an op is counted but not timed: timed alone it
    measured its queueing (~0 s, an absurd bandwidth), and waiting on its work before the block ends could block.
    The block's own time is not split among its ops; the summary's bandwidths leave them out."""
    state = getattr(dist.distributed_c10d._world, "pg_coalesce_state", None)
    if not state:
        return False
    if isinstance(pg, torch.ScriptObject):
        try:
            pg = torch._C._distributed_c10d.ProcessGroup.unbox(pg)
        except Exception:  # noqa: BLE001 - not a process group
            return False
    return pg in state


def _group_info(pg: Any, gpus_per_node: int) -> tuple[list[int], str]:
    """Global ranks of a process group and whether they sit in one node (intra) or one per node (inter)."""
    try:
        if isinstance(pg, str):  # a functional collective names its group
            pg = dist.distributed_c10d._resolve_process_group(cast(Any, pg))
        if isinstance(pg, torch.ScriptObject):  # the op sees the boxed TorchScript form of the group
            pg = torch._C._distributed_c10d.ProcessGroup.unbox(pg)
        ranks = sorted(dist.get_process_group_ranks(pg))
    except Exception:  # noqa: BLE001 - a group the Python registry does not know
        return [], "unknown"
    nodes = {r // gpus_per_node for r in ranks}
    if len(ranks) == 1:
        return ranks, "self"
    if len(nodes) == 1:
        return ranks, "intra"
    if len(nodes) == len(ranks):
        return ranks, "inter"
    return ranks, "mixed"


_FUNCTIONAL_BY_OP = {
    getattr(torch.ops._c10d_functional, name).default: (name, *spec)
    for name, spec in _FUNCTIONAL_OPS.items()
    if hasattr(torch.ops._c10d_functional, name)
}


class _DTensorCollectives(TorchDispatchMode):
    """Counts the functional collectives DTensor issues inside its dispatch (see the module docstring)."""

    def __init__(self, meter: CommMeter) -> None:
        super().__init__()
        self.meter = meter

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if isinstance(func, torch._ops.HigherOrderOperator):
            return func(*args, **kwargs)
        from torch.distributed.tensor import DTensor

        if any(issubclass(t, DTensor) for t in types):
            return NotImplemented  # let DTensor desugar into local ops and collectives, which come back here
        entry = _FUNCTIONAL_BY_OP.get(func)
        if entry is None or self.meter.in_kernel():
            return func(*args, **kwargs)
        name, coll, size_fn, pg_index = entry
        return self.meter._count(name, func, coll, size_fn, pg_index, args, kwargs)
