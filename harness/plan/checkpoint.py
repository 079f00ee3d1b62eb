"""Predicted checkpoint size and save time of a `checkpoint: true` cell (predicted.checkpoint_bytes, checkpoint_s):
what each strategy's checkpoint holds, from the memory model's per-parameter state (harness.plan.memory), and the
time to write it at the checkpoint folder's bandwidth (harness.plan.calibration's rates: a calibration's measured
storage, else the profile's `performance.storage`, else null with the reason).

What each format holds (harness.worker.strategies' save_checkpoint), per parameter:
- ddp (rank 0's torch.save): the fp32 parameters (autocast keeps them fp32) and AdamW's two fp32 moments: 12 B;
- fsdp.*, fsdp2.* (DCP, sharded; a hybrid's replicas are written once): the fp32 sharded parameters (mixed precision
  keeps them fp32) and the two moments: 12 B, whatever the precision;
- zero1, zero2 (DeepSpeed): dp rank 0's module state in the precision the module holds (4 B fp32, 2 B bf16/fp16)
  and every rank's partition of the fp32 master copy and the two moments (12 B): 14 or 16 B;
- zero3: ZeRO-3's module state holds placeholders; the partitions of master and moments: 12 B.

DDP and ZeRO are predicted as those tensor bytes: their framing (torch.save's zip records, DeepSpeed's pickled
client state and its zero_to_fp32.py) is a few kB, which the measured `metrics.checkpoint.bytes` includes. DCP's is
not small (issue 48: +14.5% on the smoke model): every item of the state dict — each rank's chunk of each parameter
and moment, each optimizer step count, each of AdamW's param-group settings — is its own torch.save zip archive
(about 1.5 kB of records and 64-byte alignment), and the coordinator pickles a `.metadata` beside the shards that
names every chunk, its shape and its place in a file (about 250 B per chunk). So a DCP cell's prediction is
everything DCP writes, byte for byte (`dcp_bytes`: the parameter inventory's chunks and items, DCP's de-duplication
of replicated items over the ranks, the zip layout of each item, and the protocol-4 pickle of the metadata), but the
checkpoint folder's own path, which the metadata also holds (`storage_meta.checkpoint_id`: each path component, its
length and 3 bytes) and which the planner does not know. Measured against real FSDP1/FSDP2 checkpoints of torch
2.13 (full, grad-op, no-shard and hybrid sharding, 1, 2 and 4 ranks, fp32, bf16 and fp16): equal to the byte, with
the folder (`tests/dist/test_checkpoint.py`). Tensor- and pipeline-parallel layouts keep the tensor bytes. Pure,
no torch.

Units: bytes; seconds; bandwidths in GB/s (1e9 B/s).
"""

from __future__ import annotations

import dataclasses
import functools
import heapq
import math
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from pathlib import Path, PurePath
from typing import Any

from harness.core import precisions
from harness.core.catalogue import CATALOGUE
from harness.plan.calibration import Rates, Unknown
from harness.scenario.spec import RunSpec

FP32_STATE_BYTES = 4 + 8
"""bytes per parameter of fp32 parameters (or DeepSpeed's fp32 master copy) and AdamW's two fp32 moments"""


@functools.cache
def checkpoint_bytes(spec: RunSpec) -> int:
    """Bytes the cell's checkpoint holds, every rank's files together (B): DCP's files but the folder's path
    (`dcp_bytes`) for FSDP and FSDP2 without a tensor or pipeline layout, else the tensor bytes."""
    if _is_dcp(spec):
        return dcp_bytes(spec)
    return tensor_bytes(spec)


@functools.cache
def tensor_bytes(spec: RunSpec) -> int:
    """Tensor bytes the cell's checkpoint holds, every rank's files together (B)."""
    n = spec.model_config.n_params()
    total = FP32_STATE_BYTES * n
    if CATALOGUE[spec.strategy].family == "zero" and spec.strategy != "zero3":
        total += (
            precisions.get(spec.precision).element_bytes * n
        )  # dp rank 0's module state dict, in the module's precision
    return total


@functools.cache
def node_bytes(spec: RunSpec) -> int:
    """The most bytes one node writes (B): the save ends when the slowest node's writes end. DDP's rank 0 writes
    all of it; sharded formats split it over the ranks (a hybrid's replicas once: DCP spreads the deduplicated
    shards over the ranks), ZeRO-1/2 add dp rank 0's module state on the first node."""
    if _is_dcp(spec):
        if not _exact(spec):  # NOTE: the ranks' shares of the items, evenly
            return -(-_files_bytes(spec) // max(spec.nodes, 1)) + dcp_metadata_bytes(spec)
        files, per_node = _dcp_plan(spec).files, max(spec.gpus_per_node, 1)
        nodes_bytes = [sum(files[k : k + per_node]) for k in range(0, len(files), per_node)]
        nodes_bytes[0] += dcp_metadata_bytes(spec)  # NOTE: the coordinator (rank 0) writes .metadata
        return max(nodes_bytes)
    total, nodes = checkpoint_bytes(spec), max(spec.nodes, 1)
    family = CATALOGUE[spec.strategy].family
    if family == "ddp":
        return total
    n = spec.model_config.n_params()
    if family == "zero" and spec.strategy != "zero3":
        module = precisions.get(spec.precision).element_bytes * n
        return module + (total - module) // nodes
    return -(-total // nodes)


def checkpoint_prediction(spec: RunSpec, rates: Rates) -> dict[str, object]:
    """predicted.checkpoint_bytes, checkpoint_s (the save: the slowest node's bytes at the write bandwidth) and,
    where checkpoint_s is null, checkpoint_null_reasons."""
    out: dict[str, object] = {"checkpoint_bytes": checkpoint_bytes(spec)}
    try:
        out["checkpoint_s"] = rates.storage_s(node_bytes(spec), op="write")
    except Unknown as e:
        out["checkpoint_s"] = None
        out["checkpoint_null_reasons"] = {"checkpoint_s": str(e)}
    return out


# --------------------------------------------------------------------------------------------------
# DCP (FSDP1, FSDP2): what torch.distributed.checkpoint writes, byte for byte

DCP_FAMILIES = frozenset({"fsdp", "fsdp2"})
"""the catalogue families whose checkpoint is DCP's (harness.worker.strategies.dcp)"""
ADAMW_GROUP_KEYS: tuple[str, ...] = (
    "lr",
    "betas",
    "eps",
    "weight_decay",
    "amsgrad",
    "maximize",
    "foreach",
    "capturable",
    "differentiable",
    "fused",
    "decoupled_weight_decay",
    "params",
)
"""torch.optim.AdamW's param-group keys in its state dict (torch 2.13), each one item of DCP's checkpoint"""
SCALER_KEYS: tuple[str, ...] = ("scale", "growth_factor", "backoff_factor", "growth_interval", "_growth_tracker")
"""the (Sharded)GradScaler's state-dict keys, saved beside the training state with fp16"""
_STORAGE_NAMES = {
    "float32": "FloatStorage",
    "bfloat16": "BFloat16Storage",
    "float16": "HalfStorage",
    "int64": "LongStorage",
}
_ELEMENT_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2, "int64": 8}
_ZIP_ALIGNMENT = 64
"""torch.save aligns every record's data to 64 bytes (its `.storage_alignment` record)"""
_TENSOR_RECORDS = (
    "archive/data.pkl",
    "archive/.format_version",
    "archive/.storage_alignment",
    "archive/byteorder",
    "archive/data/0",
    "archive/version",
    "archive/.data/serialization_id",
)
"""a torch.save archive of one tensor: its records, in order (a non-tensor object has no data/0)"""
_FIXED_RECORD_BYTES = {
    "archive/.format_version": 1,
    "archive/.storage_alignment": 2,
    "archive/byteorder": 6,
    "archive/version": 2,
    "archive/.data/serialization_id": 40,
}
_SMALL_VALUE_PICKLE = 12
"""a param-group setting's or a scaler field's pickle (protocol 2: a float, bool, None, int, two floats): at most
55 bytes all fit one alignment slot, so any such length gives the archive's size"""
_METADATA_MODULE = "torch.distributed.checkpoint.metadata"
_FILESYSTEM_MODULE = "torch.distributed.checkpoint.filesystem"
_DCP_VERSION = "1.0.0"
_SAVE_ID_CHARS = 36
"""the save's uuid4, as text"""


def _is_dcp(spec: RunSpec) -> bool:
    return CATALOGUE[spec.strategy].family in DCP_FAMILIES and spec.layout.is_default


def _zip_bytes(records: Sequence[tuple[str, int]]) -> int:
    """A torch.save archive's size (B) from its records (name, bytes): each local header (30 B and the name) with
    an extra field (4 B and padding) that starts the data on a 64-byte boundary, the data, a 16-byte data
    descriptor; then the central directory (46 B and the name per record), the zip64 end record and locator (56 + 20)
    and the end record (22). NOTE: records under 4 GiB (zip64 extras beyond that are not counted)."""
    at = 0
    for name, size in records:
        start = -(-(at + 30 + len(name) + 4) // _ZIP_ALIGNMENT) * _ZIP_ALIGNMENT
        at = start + size + 16
    return at + sum(46 + len(name) for name, _ in records) + 56 + 20 + 22


def _p2_int(v: int) -> int:
    """Bytes of an int in a protocol-2 pickle (BININT1, BININT2, BININT, LONG1)."""
    if 0 <= v < 256:
        return 2
    if 0 <= v < 65536:
        return 3
    if -(2**31) <= v < 2**31:
        return 5
    return 2 + (v.bit_length() + 8) // 8


def _p2_tuple(inner: int, n: int) -> int:
    """Bytes of a tuple of `n` items whose own bytes are `inner`, memoized (BINPUT) unless empty."""
    if n == 0:
        return 1
    return inner + (1 if n <= 3 else 2) + 2


def _tensor_pickle_bytes(shape: tuple[int, ...], dtype: str) -> int:
    """torch.save's data.pkl of one contiguous tensor (protocol 2): `_rebuild_tensor_v2` of its storage (a persistent
    id: storage class, key '0', 'cpu', numel), offset 0, size, stride, requires_grad False, an empty OrderedDict."""
    strides = [math.prod(shape[i + 1 :]) for i in range(len(shape))]
    rebuild, storage, ordered_dict = 33, 1 + len("torch\n") + len(_STORAGE_NAMES[dtype]) + 1, 25
    persistent_id = 1 + 12 + 2 + storage + 2 + 6 + 2 + 8 + 2 + _p2_int(math.prod(shape)) + 1 + 2
    size = _p2_tuple(sum(map(_p2_int, shape)), len(shape))
    stride = _p2_tuple(sum(map(_p2_int, strides)), len(shape))
    rebuild_args = 1 + persistent_id + 1 + _p2_int(0) + size + stride + 1 + ordered_dict + 2 + 1 + 1 + 2 + 1 + 2
    return 2 + rebuild + 2 + rebuild_args + 1 + 2 + 1


@functools.cache
def _tensor_item_bytes(shape: tuple[int, ...], dtype: str) -> int:
    """One tensor chunk as DCP writes it: a torch.save archive (B)."""
    sizes = {
        **_FIXED_RECORD_BYTES,
        "archive/data.pkl": _tensor_pickle_bytes(shape, dtype),
        "archive/data/0": math.prod(shape) * _ELEMENT_BYTES[dtype],
    }
    return _zip_bytes([(name, sizes[name]) for name in _TENSOR_RECORDS])


def _object_item_bytes(pickled: int) -> int:
    """One non-tensor item (a param-group setting) as DCP writes it: torch.save of the object, whose pickle is
    `pickled` bytes (B)."""
    sizes = {**_FIXED_RECORD_BYTES, "archive/data.pkl": pickled}
    return _zip_bytes([(name, sizes[name]) for name in _TENSOR_RECORDS if name != "archive/data/0"])


def _names_pickle_bytes(names: Sequence[str]) -> int:
    """The pickle (protocol 2) of a list of strings, each memoized: the param group's `params`, its parameters'
    names."""
    n = 2 + 1 + 2 + (2 * -(-len(names) // 1000) if len(names) > 1 else len(names)) + 1
    return n + sum(5 + len(s.encode()) + (2 if i < 256 else 5) for i, s in enumerate(names, 1))


@dataclass(frozen=True)
class _Entry:
    """One key of the flattened state dict DCP saves (`model.<param>`, `optimizer.state.<param>.exp_avg`, …)."""

    fqn: str
    kind: str
    """sharded (split over the shard group along dim 0), replicated (the same on every rank) or object"""
    shape: tuple[int, ...] = ()
    dtype: str = "float32"
    pickled: int = 0
    """an object's pickle (B)"""
    path: tuple[int | tuple[Any, ...], ...] = ()
    """the key path the planner keeps for it (`planner_data`): each component's identity in the pickle (equal
    identities are one object, which the pickle writes once and refers to after), or an int"""


@functools.cache
def _dcp_entries(spec: RunSpec, *, shard: int) -> tuple[_Entry, ...]:
    """The flattened state dict harness.worker.strategies.dcp saves, in its order: the model's parameters, AdamW's
    state per parameter (FSDP1 sorts it by name; FSDP2 keeps the parameters' order), the param group's settings,
    the step count, and with fp16 the loss scaler's fields."""
    params = spec.model_config.parameter_inventory()
    fsdp1 = CATALOGUE[spec.strategy].family == "fsdp" and shard > 1
    owner = _fsdp1_first_shard_owner(params, shard) if fsdp1 else {}
    out = [_Entry(f"model.{p.name}", "sharded", p.shape, path=(("model",), ("fresh", p.name))) for p in params]
    for p in sorted(params, key=lambda q: q.name) if fsdp1 else params:
        for key in ("step", "exp_avg", "exp_avg_sq"):
            # NOTE: FSDP1 builds each unit's per-parameter state from its flat parameter: a key object per unit (the
            # step's per rank whose shard holds the parameter's start); FSDP2 and NO_SHARD keep torch's own keys
            who = (key, p.unit, owner[p.name] if key == "step" else 0) if fsdp1 else (key,)
            path: tuple[int | tuple[Any, ...], ...] = (("optimizer",), ("state",), ("param", p.name), who)
            if key == "step":
                out.append(_Entry(f"optimizer.state.{p.name}.step", "replicated", (), path=path))
            else:
                out.append(_Entry(f"optimizer.state.{p.name}.{key}", "sharded", p.shape, path=path))
    for key in ADAMW_GROUP_KEYS:
        pickled = _names_pickle_bytes([p.name for p in params]) if key == "params" else _SMALL_VALUE_PICKLE
        path = (("optimizer",), ("param_groups",), 0, ("fresh", key))
        out.append(_Entry(f"optimizer.param_groups.0.{key}", "object", pickled=pickled, path=path))
    out.append(_Entry("step", "replicated", (), "int64", path=(("step",),)))
    if precisions.get(spec.precision).loss_scaling:
        for key in SCALER_KEYS:
            out.append(
                _Entry(f"scaler.{key}", "object", pickled=_SMALL_VALUE_PICKLE, path=(("scaler",), ("fresh", key)))
            )
    return tuple(out)


def _fsdp1_first_shard_owner(params: Sequence[Any], shard: int) -> dict[str, int]:
    """FSDP1 (use_orig_params): each wrapping unit's flat parameter — every parameter's start aligned to 16 bytes
    (4 fp32 elements), the whole padded to `shard` equal parts — and which part holds each parameter's start."""
    starts: dict[str, tuple[str, int]] = {}
    totals: dict[str, int] = {}
    for p in params:
        at = -(-totals.get(p.unit, 0) // 4) * 4
        starts[p.name] = (p.unit, at)
        totals[p.unit] = at + p.numel
    return {name: at // (-(-totals[unit] // shard)) for name, (unit, at) in starts.items()}


def _chunk(dim0: int, shard: int, index: int) -> tuple[int, int]:
    """torch.chunk's split of `dim0` rows in `shard` parts: part `index`'s (first row, rows); (dim0, 0) when empty."""
    size = -(-dim0 // shard) if dim0 else 0
    first = min(index * size, dim0)
    return first, min(first + size, dim0) - first


@dataclass(frozen=True)
class _Item:
    """One write item of a rank's plan: an entry's chunk (or the whole replicated tensor, or the object)."""

    entry: _Entry
    offsets: tuple[int, ...] | None
    sizes: tuple[int, ...]
    nbytes: int
    """the tensor's bytes; DCP's de-duplication counts an object as 1"""

    @property
    def key(self) -> tuple[str, tuple[int, ...] | None]:
        return self.entry.fqn, self.offsets

    @functools.cached_property
    def length(self) -> int:
        """Its bytes in the rank's file (B)."""
        if self.entry.kind == "object":
            return _object_item_bytes(self.entry.pickled)
        return _tensor_item_bytes(self.sizes, self.entry.dtype)


def _rank_items(entries: Sequence[_Entry], *, rank: int, shard: int) -> list[_Item]:
    """A rank's plan before de-duplication, in the state dict's order (a sharded entry's empty chunk is no item)."""
    out = []
    for e in entries:
        if e.kind == "object":
            out.append(_Item(e, None, (), 1))
        elif e.kind == "replicated":
            out.append(_Item(e, (0,) * len(e.shape), e.shape, math.prod(e.shape) * _ELEMENT_BYTES[e.dtype]))
        else:
            first, rows = _chunk(e.shape[0], shard, rank % shard)
            if rows:
                sizes = (rows, *e.shape[1:])
                offsets = (first,) + (0,) * (len(e.shape) - 1)
                out.append(_Item(e, offsets, sizes, math.prod(sizes) * _ELEMENT_BYTES[e.dtype]))
    return out


def _deduplicate(plans: list[list[_Item]]) -> list[list[_Item]]:
    """DCP's `dedup_save_plans` (save_to_lowest_rank False): items in order of first appearance (rank 0's plan, then
    each next rank's new items); an item several plans hold goes to the one with the fewest bytes planned so far
    (the lowest rank on a tie), whose total grows by its bytes (an object: 1)."""
    holders: dict[tuple, list[int]] = {}
    first: dict[tuple, _Item] = {}
    for r, items in enumerate(plans):
        for it in items:
            holders.setdefault(it.key, []).append(r)
            first.setdefault(it.key, it)
    planned = [0] * len(plans)
    keep: dict[tuple, int] = {}
    heaps: dict[tuple[int, ...], list[tuple[int, int]]] = {}
    for key, ranks in holders.items():
        if len(ranks) == 1:
            chosen = ranks[0]
        else:
            # NOTE: the same rank sets recur (every rank, a shard's replicas): a heap per set, stale entries skipped
            heap = heaps.get(tuple(ranks))
            if heap is None:
                heap = heaps[tuple(ranks)] = sorted((planned[r], r) for r in ranks)  # NOTE: a sorted list is a heap
            while heap[0][0] != planned[heap[0][1]]:
                heapq.heapreplace(heap, (planned[heap[0][1]], heap[0][1]))
            chosen = heap[0][1]
        planned[chosen] += first[key].nbytes or 1
        keep[key] = chosen
        if len(ranks) > 1:
            heapq.heapreplace(heaps[tuple(ranks)], (planned[chosen], chosen))
    return [[it for it in items if keep[it.key] == r] for r, items in enumerate(plans)]


@dataclass(frozen=True)
class _DCPPlan:
    entries: tuple[_Entry, ...]
    plans: tuple[tuple[_Item, ...], ...]
    """each rank's items after de-duplication, in plan order"""
    placed: tuple[tuple[str, _Item, int], ...]
    """storage_data's order: (file, item, offset in the file), rank by rank, each rank's as written"""
    files: tuple[int, ...]
    """each rank's `__<rank>_0.distcp` (B; 0: a rank that writes nothing)"""


@functools.cache
def _dcp_plan(spec: RunSpec) -> _DCPPlan:
    """Every rank's items and file of the cell's DCP checkpoint."""
    shard = _shard(spec)
    entries = _dcp_entries(spec, shard=shard)
    plans = _deduplicate([_rank_items(entries, rank=r, shard=shard) for r in range(spec.gpus)])
    files, placed = [], []
    for r, items in enumerate(plans):
        name, at = f"__{r}_0.distcp", 0
        # NOTE: a rank writes its objects first, then its tensors, each in plan order
        for it in [i for i in items if i.entry.kind == "object"] + [i for i in items if i.entry.kind != "object"]:
            placed.append((name, it, at))
            at += it.length
        files.append(at)
    return _DCPPlan(entries, tuple(map(tuple, plans)), tuple(placed), tuple(files))


EXACT_PLAN_ITEMS = 25_000
"""the most items (ranks × state-dict keys) a cell's DCP checkpoint is followed item by item for (about a second:
a 70B model on 8 ranks); a larger cell's metadata is estimated (`dcp_metadata_bytes`), its files still exact"""


def _shard(spec: RunSpec) -> int:
    return spec.layout.dp_shard if CATALOGUE[spec.strategy].shards else 1


def _exact(spec: RunSpec) -> bool:
    return spec.gpus * len(_dcp_entries(spec, shard=_shard(spec))) <= EXACT_PLAN_ITEMS


@functools.cache
def dcp_metadata_bytes(spec: RunSpec, *, folder: str | None = None) -> int:
    """The `.metadata` file of the cell's DCP checkpoint (B), with the folder's path when `folder` is given. Beyond
    EXACT_PLAN_ITEMS, an estimate: the metadata of the same cell on fewer ranks, at two rank counts, is a fixed part
    and a part per chunk (each chunk's place, about 250 B), extended to this cell's chunks."""
    if _exact(spec):
        return _metadata_bytes(_dcp_plan(spec), world=spec.gpus, folder=folder)
    per_node = spec.gpus_per_node if spec.layout.hybrid else 1
    most = max(per_node, EXACT_PLAN_ITEMS // len(_dcp_entries(spec, shard=_shard(spec))) // per_node * per_node)
    small, large = (_fewer_ranks(spec, gpus) for gpus in (max(per_node, most // 2 // per_node * per_node), most))
    at_large = dcp_metadata_bytes(large, folder=folder)
    if _chunks(large) == _chunks(small):  # NOTE: a hybrid's chunks do not grow with its replicas
        return at_large
    per_chunk = (at_large - dcp_metadata_bytes(small, folder=folder)) / (_chunks(large) - _chunks(small))
    return round(at_large + per_chunk * (_chunks(spec) - _chunks(large)))


def _fewer_ranks(spec: RunSpec, gpus: int) -> RunSpec:
    """The cell on `gpus` ranks, its nodes as many as they fill."""
    per_node = min(spec.gpus_per_node, gpus)
    return dataclasses.replace(spec, gpus=gpus, nodes=-(-gpus // spec.gpus_per_node), gpus_per_node=per_node)


def _chunk_rows(dim0: int, shard: int) -> list[tuple[int, int]]:
    """The non-empty parts torch.chunk splits `dim0` rows into over `shard` ranks: (rows, how many parts)."""
    if dim0 == 0:
        return []
    size = -(-dim0 // shard)
    full, rest = divmod(dim0, size)
    return [(size, full)] + ([(rest, 1)] if rest else [])


def _chunks(spec: RunSpec) -> int:
    """The distinct items of the cell's checkpoint: each sharded key's non-empty chunks, each other key once."""
    shard = _shard(spec)
    return sum(
        sum(n for _, n in _chunk_rows(e.shape[0], shard)) if e.kind == "sharded" else 1
        for e in _dcp_entries(spec, shard=shard)
    )


@functools.cache
def _files_bytes(spec: RunSpec) -> int:
    """Every rank's `.distcp` together (B): each distinct item once, as DCP's de-duplication writes it."""
    if _exact(spec):
        return sum(_dcp_plan(spec).files)
    shard, total = _shard(spec), 0
    for e in _dcp_entries(spec, shard=shard):
        if e.kind == "object":
            total += _object_item_bytes(e.pickled)
        elif e.kind == "replicated":
            total += _tensor_item_bytes(e.shape, e.dtype)
        else:
            total += sum(
                n * _tensor_item_bytes((rows, *e.shape[1:]), e.dtype) for rows, n in _chunk_rows(e.shape[0], shard)
            )
    return total


def dcp_bytes(spec: RunSpec, *, folder: str | None = None) -> int:
    """Bytes of the cell's DCP checkpoint (FSDP, FSDP2), every rank's file and the metadata (B). The metadata also
    holds the checkpoint folder's path (DCP's `checkpoint_id`): counted when `folder` is given (the path the worker
    passed: harness.worker.checkpoint.checkpoint_root), else left out."""
    return _files_bytes(spec) + dcp_metadata_bytes(spec, folder=folder)


# -- the metadata: a protocol-4 pickle, measured as CPython's pickler writes it

_FRAME_TARGET = 64 * 1024
"""a protocol-4 frame ends at the first object boundary at or beyond 64 KiB"""


class _Pickle4:
    """Counts the bytes of a protocol-4 pickle (CPython's pickler) of an object graph described call by call: every
    object's opcodes, the memo (an object seen before is a 2-byte reference below memo index 256, 5 above: the
    identity passed as `key` says which objects are one), containers batched by 1,000, and 9-byte frame headers
    (a frame ends after the save that takes it to 64 KiB)."""

    def __init__(self) -> None:
        self.total, self.frame, self.memo = 2, 0, 0  # NOTE: the PROTO opcode stands outside the frames
        self.ids: dict[Hashable, int] = {}

    def _w(self, n: int) -> None:
        self.frame += n

    def _done(self) -> None:
        """The end of one object's save: the frame is committed at or beyond its target size."""
        if self.frame >= _FRAME_TARGET:
            self._commit()

    def _commit(self) -> None:
        self.total += self.frame + (9 if self.frame >= 4 else 0)
        self.frame = 0

    def finish(self) -> int:
        self._w(1)  # STOP
        self._commit()
        return self.total

    def _memoize(self, key: Hashable | None) -> None:
        self._w(1)
        if key is not None:
            self.ids[key] = self.memo
        self.memo += 1

    def seen(self, key: Hashable | None) -> bool:
        """A reference to the object `key` when it was pickled before (True), else False."""
        if key is None or key not in self.ids:
            return False
        self._w(2 if self.ids[key] < 256 else 5)
        self._done()
        return True

    def string(self, s: str, key: Hashable | None = None) -> None:
        if self.seen(key):
            return
        n = len(s.encode())
        self._w(2 + n if n < 256 else 5 + n if n < 2**32 else 9 + n)
        self._memoize(key)
        self._done()

    def integer(self, v: int) -> None:
        self._w(
            2
            if 0 <= v < 256
            else 3
            if 0 <= v < 65536
            else 5
            if -(2**31) <= v < 2**31
            else 2 + (v.bit_length() + 8) // 8
        )
        self._done()

    def atom(self) -> None:
        """None, True or False."""
        self._w(1)
        self._done()

    def glob(self, module: str, name: str, *, module_key: Hashable | None = None) -> None:
        """A class, function or constant by reference (STACK_GLOBAL); its module's name is one object per module
        unless `module_key` says which."""
        if self.seen(("global", module, name)):
            return
        self.string(module, key=module_key or ("module", module))
        self.string(name)
        self._w(1)
        self._memoize(("global", module, name))
        self._done()

    def tuple_of(self, items: Sequence[Any], save: Callable[[Any], None], key: Hashable | None = None) -> None:
        if not items:
            self._w(1)
        else:
            self._w(1 if len(items) > 3 else 0)  # MARK
            for it in items:
                save(it)
            self._w(1)  # TUPLEn or TUPLE
            self._memoize(key)
        self._done()

    def _batched(self, items: Sequence[Any], save: Callable[[Any], None]) -> None:
        if len(items) == 1:
            save(items[0])
            self._w(1)  # APPEND / SETITEM
            return
        for k in range(0, len(items), 1000):
            self._w(1)  # MARK
            for it in items[k : k + 1000]:
                save(it)
            self._w(1)  # APPENDS / SETITEMS

    def list_of(self, items: Sequence[Any], save: Callable[[Any], None]) -> None:
        self._w(1)
        self._memoize(None)
        self._batched(items, save)
        self._done()

    def dict_of(self, items: Sequence[Any], save: Callable[[Any], None]) -> None:
        self._w(1)
        self._memoize(None)
        self._batched(items, save)
        self._done()

    def attributes(self, pairs: Sequence[tuple[str, Callable[[], None]]]) -> None:
        """An object's `__dict__` as its state: attribute names are interned, one object each."""

        def item(pair: tuple[str, Callable[[], None]]) -> None:
            self.string(pair[0], key=("attribute", pair[0]))
            pair[1]()

        self.dict_of(pairs, item)

    def new(self, module: str, name: str, state: Callable[[], None] | None = None) -> None:
        """An object rebuilt by `cls.__new__` (NEWOBJ), then its state (BUILD)."""
        self.glob(module, name)
        self._w(1)  # EMPTY_TUPLE: __new__'s arguments
        self._done()
        self._w(1)  # NEWOBJ
        self._memoize(None)
        if state is not None:
            state()
            self._w(1)  # BUILD
        self._done()

    def reduced(self, module: str, name: str, args: Callable[[], None], key: Hashable | None = None) -> None:
        """An object rebuilt by calling `module.name(*args)` (REDUCE); `args` pickles the argument tuple."""
        if self.seen(key):
            return
        self.glob(module, name)
        args()
        self._w(1)  # REDUCE
        self._memoize(key)
        self._done()


def _metadata_bytes(plan: _DCPPlan, *, world: int, folder: str | None) -> int:
    """DCP's Metadata as its coordinator pickles it (`_MetadataWriter`): its bytes."""
    return _MetadataWriter(plan, world=world, folder=folder).write()


class _MetadataWriter:
    """DCP's Metadata as its coordinator pickles it: state_dict_metadata (per key: its properties, size and chunks),
    planner_data (per key: its path), storage_data (per chunk: its index and where it lies), storage_meta (the
    folder, the save's id) and the version; one method per part, in the pickle's order.

    Which strings are one object decides their bytes (a reference or the text again): the keys of
    state_dict_metadata are the item names of the plan that holds each key first — rank 0's own objects, every other
    rank's a copy it sent — and planner_data's keys are the last rank's (torch merges the ranks' planner data with a
    ChainMap, whose keys come from the last map) while its paths are rank 0's."""

    def __init__(self, plan: _DCPPlan, *, world: int, folder: str | None):
        self.p = _Pickle4()
        self.plan, self.world, self.folder = plan, world, folder
        self.first_rank: dict[str, int] = {}
        self.chunks: dict[str, list[_Item]] = {}
        self.chunk_index: dict[tuple, int] = {}
        for r, items in enumerate(plan.plans):
            for it in items:
                self.first_rank.setdefault(it.entry.fqn, r)
                held = self.chunks.setdefault(it.entry.fqn, [])
                self.chunk_index[it.key] = len(held)
                held.append(it)

    def write(self) -> int:
        p, md = self.p, _METADATA_MODULE
        p.new(
            md,
            "Metadata",
            lambda: p.attributes(
                [
                    ("state_dict_metadata", self.state_dict_metadata),
                    ("planner_data", self.planner_data),
                    ("storage_data", self.storage_data),
                    ("storage_meta", self.storage_meta),
                    ("version", lambda: p.string(_DCP_VERSION)),
                ]
            ),
        )
        return p.finish()

    @staticmethod
    def name_key(rank: int, fqn: str) -> Hashable:
        # NOTE: rank 0's top-level "step" key is the interned literal its paths use too (torch's optimizer state key)
        return ("path", ("step",)) if rank == 0 and fqn == "step" else ("name", rank, fqn)

    def size(self, dims: tuple[int, ...]) -> None:
        p = self.p
        p.reduced("torch", "Size", lambda: p.tuple_of([dims], lambda d: p.tuple_of(d, p.integer)))

    def properties(self, dtype: str) -> None:
        """TensorProperties: its state is a tuple (dtype, layout, requires_grad, memory format, pin_memory)."""
        p, md = self.p, _METADATA_MODULE

        def field(name: str) -> None:
            if name == "dtype":  # NOTE: a global of torch, whose module name is another object than torch.Size's
                p.glob("torch", dtype, module_key=("module", "torch dtypes"))
            elif name == "layout":
                p.reduced(
                    "torch.serialization", "_get_layout", lambda: p.tuple_of(["torch.strided"], p.string), key=name
                )
            elif name == "memory_format":
                p.reduced(md, "_MEM_FORMAT_ENCODING", lambda: p.tuple_of([0], p.integer), key=name)
            else:
                p.atom()  # False

        fields = ("dtype", "layout", "requires_grad", "memory_format", "pin_memory")
        p.new(md, "TensorProperties", lambda: p.tuple_of(fields, field))

    def state_dict_metadata(self) -> None:
        p, md, size = self.p, _METADATA_MODULE, self.size

        def entry(fqn: str) -> None:
            p.string(fqn, key=self.name_key(self.first_rank[fqn], fqn))
            held = self.chunks[fqn]
            e = held[0].entry
            if e.kind == "object":
                p.new(md, "BytesStorageMetadata")
                return

            def chunk(it: _Item) -> None:
                offsets, sizes = it.offsets or (), it.sizes
                p.new(
                    md,
                    "ChunkStorageMetadata",
                    lambda: p.attributes([("offsets", lambda: size(offsets)), ("sizes", lambda: size(sizes))]),
                )

            p.new(
                md,
                "TensorStorageMetadata",
                lambda: p.attributes(
                    [
                        ("properties", lambda: self.properties(e.dtype)),
                        ("size", lambda: size(e.shape)),
                        ("chunks", lambda: p.list_of(held, chunk)),
                    ]
                ),
            )

        p.dict_of(list(self.chunks), entry)

    def planner_data(self) -> None:
        p = self.p

        def entry(e: _Entry) -> None:
            p.string(e.fqn, key=self.name_key(self.world - 1, e.fqn))

            def component(c: int | tuple[Any, ...]) -> None:
                if isinstance(c, int):
                    p.integer(c)
                else:
                    text = str(c[1]) if c[0] in ("fresh", "param") else str(c[0])
                    p.string(text, key=None if c[0] == "fresh" else ("path", c))

            p.tuple_of(e.path, component)

        p.dict_of(self.plan.entries, entry)

    def storage_data(self) -> None:
        p, md = self.p, _METADATA_MODULE

        def entry(row: tuple[str, _Item, int]) -> None:
            file, it, at = row
            e = it.entry
            fields: list[tuple[str, Callable[[], None]]] = [("fqn", lambda: p.string(e.fqn))]
            if e.kind == "object":
                fields.append(("index", p.atom))
            else:
                fields += [
                    ("index", lambda: p.integer(self.chunk_index[it.key])),
                    ("offset", lambda: self.size(it.offsets or ())),
                ]
            p.new(md, "MetadataIndex", lambda: p.attributes(fields))
            where = [
                ("relative_path", lambda: p.string(file, key=("file", file))),
                ("offset", lambda: p.integer(at)),
                ("length", lambda: p.integer(it.length)),
            ]
            p.new(_FILESYSTEM_MODULE, "_StorageInfo", lambda: p.attributes(where))

        p.dict_of(self.plan.placed, entry)

    def storage_meta(self) -> None:
        p, folder = self.p, self.folder

        def checkpoint_id() -> None:
            if folder is None:  # NOTE: left out: the planner does not know the folder
                return
            parts = PurePath(folder).parts
            cls = type(Path(folder))
            p.reduced(cls.__module__, cls.__qualname__, lambda: p.tuple_of(parts, p.string))

        p.new(
            _METADATA_MODULE,
            "StorageMeta",
            lambda: p.attributes(
                [
                    ("checkpoint_id", checkpoint_id),
                    ("save_id", lambda: p.string("-" * _SAVE_ID_CHARS)),
                    ("load_id", p.atom),
                    ("modules", lambda: p.list_of([], p.integer)),
                ]
            ),
        )
