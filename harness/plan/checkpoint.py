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
Only tensor bytes: each format adds its own framing (torch.save's zip records, DCP's metadata, DeepSpeed's pickled
client state and its zero_to_fp32.py), which the measured `metrics.checkpoint.bytes` includes. Pure, no torch.

Units: bytes; seconds; bandwidths in GB/s (1e9 B/s).
"""

from __future__ import annotations

import functools

from harness.core import precisions
from harness.core.catalogue import CATALOGUE
from harness.plan.calibration import Rates, Unknown
from harness.scenario.spec import RunSpec

FP32_STATE_BYTES = 4 + 8
"""bytes per parameter of fp32 parameters (or DeepSpeed's fp32 master copy) and AdamW's two fp32 moments"""


@functools.cache
def checkpoint_bytes(spec: RunSpec) -> int:
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
