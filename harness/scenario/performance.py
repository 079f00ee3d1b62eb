"""A cluster profile's `performance:` block: achievable rates the step-time model uses when the cluster has no
calibration file (harness/plan/time.py, docs/time-model.md). Each figure carries its source, like the peak-FLOPS
table; a figure left null is unknown, and predictions that need it are null with the reason. Achievable means
measured on the hardware (maximum-achievable matmul FLOPS, nccl-tests bus bandwidth), never the datasheet peak.

Pure: no torch import.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from harness.core.errors import Problem, one_of, unknown

PERFORMANCE_KEYS = (
    "matmul_tflops",
    "memory_gbps",
    "intra_node",
    "inter_node",
    "collectives",
    "efficiency",
    "price_per_gpu_hour",
    "storage",
    "sources",
)
MATMUL_KEYS = ("fp32", "tf32", "bf16", "fp16")
LINK_KEYS = ("busbw_gbps", "latency_us", "hop_latency_us")
COLLECTIVE_MODELS = ("flat", "nccl-ring")
"""`performance.collectives`: flat (latency_us + bytes at busbw, whatever the group) or nccl-ring (NCCL's ring cost
model: a base latency plus one hop latency per ring step, and a group spanning nodes at the slower of NVLink and its
ranks' NICs; docs/time-model.md: profile figures)"""
EFFICIENCY_KEYS = ("attention", "attention_seq_half", "attention_head_dim_half")
"""`performance.efficiency`: the kernel-efficiency curves (harness.plan.calibration.kernels); absent: every matmul
and attention at the flat matmul rate"""
STORAGE_KEYS = ("write_gbps", "read_gbps")


@dataclass(frozen=True)
class LinkFigures:
    """One link's collective figures: nccl-tests bus bandwidth at large messages and the small-message latency."""

    busbw_gbps: float | None = None
    """bus bandwidth (GB/s, 1e9 B/s; nccl-tests convention), None = unknown"""
    latency_us: float | None = None
    """time of a tiny collective (us), None = unknown; under `collectives: nccl-ring` the base latency of a call"""
    hop_latency_us: float | None = None
    """under `collectives: nccl-ring`: the latency each ring step adds (us)"""


@dataclass(frozen=True)
class StorageFigures:
    """Where checkpoints go (the profile's checkpoint_dir): its sequential write and read bandwidth from one node."""

    write_gbps: float | None = None
    """bytes written per second by one node's ranks together, fsync included (GB/s, 1e9 B/s); None = unknown"""
    read_gbps: float | None = None
    """bytes read per second by one node (GB/s); None = unknown"""


@dataclass(frozen=True)
class Performance:
    """Achievable rates of one device and its links, with a source per figure."""

    matmul_tflops: dict[str, float | None] = field(default_factory=dict, hash=False)
    """precision (fp32 | tf32 | bf16 | fp16) → achievable dense matmul TFLOPS; missing or None = unknown"""
    memory_gbps: float | None = None
    """achievable memory bandwidth for elementwise and normalisation work (GB/s, 1e9 B/s)"""
    intra_node: LinkFigures = LinkFigures()
    """collectives among the GPUs of one node"""
    inter_node: LinkFigures = LinkFigures()
    """collectives across nodes (per GPU)"""
    collectives: str = "flat"
    """how a collective is priced from the link figures (`COLLECTIVE_MODELS`)"""
    efficiency: tuple[tuple[str, float], ...] = ()
    """kernel-efficiency parameters (`EFFICIENCY_KEYS` → value), sorted; empty: flat matmul rate"""
    price_per_gpu_hour: float | None = None
    """what one GPU-hour costs (the site's currency; `harness plan --tokens`), None = unknown"""
    storage: StorageFigures = StorageFigures()
    """the checkpoint folder's bandwidth (predicted.checkpoint_s)"""
    sources: dict[str, str] = field(default_factory=dict, hash=False)
    """figure name → where it comes from"""


def _number_or_null(v: Any) -> bool:
    return v is None or (isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0)


def _figures(
    doc: dict[str, Any], key: str, allowed: Sequence[str], shape: str, file: str, problems: list[Problem]
) -> dict[str, Any]:
    """`performance.<key>`: a mapping of known names to positive numbers or null; problems appended, {} when it is
    not a mapping."""
    raw = doc.get(key) or {}
    if not isinstance(raw, dict):
        problems.append(Problem(file, f"performance.{key}", f"must be {shape}"))
        return {}
    for k, v in raw.items():
        if k not in allowed:
            problems.append(unknown(file, f"performance.{key}.{k}", k, allowed))
        elif not _number_or_null(v):
            problems.append(Problem(file, f"performance.{key}.{k}", f"{v!r} is not a positive number or null"))
    return raw


def parse_performance(doc: Any, file: str, problems: list[Problem]) -> Performance:
    """The `performance:` block (absent: every figure unknown); problems are appended, the caller raises once."""
    if doc is None:
        return Performance()
    if not isinstance(doc, dict):
        problems.append(Problem(file, "performance", "must be a mapping"))
        return Performance()
    n0 = len(problems)
    for k in doc:
        if k not in PERFORMANCE_KEYS:
            problems.append(unknown(file, f"performance.{k}", k, PERFORMANCE_KEYS))
    matmul = _figures(doc, "matmul_tflops", MATMUL_KEYS, "a mapping of precision → TFLOPS", file, problems)
    for key in ("memory_gbps", "price_per_gpu_hour"):
        if not _number_or_null(doc.get(key)):
            problems.append(Problem(file, f"performance.{key}", f"{doc.get(key)!r} is not a positive number or null"))
    links = {}
    for name in ("intra_node", "inter_node"):
        raw = _figures(doc, name, LINK_KEYS, "a mapping (busbw_gbps, latency_us, hop_latency_us)", file, problems)
        links[name] = LinkFigures(
            busbw_gbps=raw.get("busbw_gbps"), latency_us=raw.get("latency_us"), hop_latency_us=raw.get("hop_latency_us")
        )
    collectives = doc.get("collectives", "flat")
    if collectives not in COLLECTIVE_MODELS:
        problems.append(Problem(file, "performance.collectives", one_of(collectives, COLLECTIVE_MODELS)))
    efficiency = _figures(doc, "efficiency", EFFICIENCY_KEYS, "a mapping of efficiency parameters", file, problems)
    storage = _figures(doc, "storage", STORAGE_KEYS, "a mapping (write_gbps, read_gbps)", file, problems)
    sources = doc.get("sources") or {}
    if not isinstance(sources, dict) or not all(isinstance(v, str) for v in sources.values()):
        problems.append(Problem(file, "performance.sources", "must map figure names to source strings"))
        sources = {}
    if len(problems) > n0:
        return Performance()
    return Performance(
        matmul_tflops={k: (None if v is None else float(v)) for k, v in matmul.items()},
        memory_gbps=None if doc.get("memory_gbps") is None else float(doc["memory_gbps"]),
        intra_node=links["intra_node"],
        inter_node=links["inter_node"],
        collectives=str(collectives),
        price_per_gpu_hour=None if doc.get("price_per_gpu_hour") is None else float(doc["price_per_gpu_hour"]),
        efficiency=tuple(sorted((k, float(v)) for k, v in efficiency.items() if v is not None)),
        storage=StorageFigures(
            **{k: None if storage.get(k) is None else float(storage[k]) for k in STORAGE_KEYS if k in storage}
        ),
        sources={str(k): v for k, v in sources.items()},
    )
