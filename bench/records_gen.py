"""Synthetic result records for the benches (bench_report.py, bench_compare.py): several nightly runs of one big
matrix, 8 model sizes × 11 strategies × 3 precisions × 5 GPU counts × 3 micro-batch sizes (3,960 cells), with
OOMs, errors and skips, MFU null for fp32, and a `comm`/`predicted` section on most records. Values are made up
(seeded), only their shape matters.
"""

from __future__ import annotations

import itertools
import json
import random
from pathlib import Path

from harness.core.zoo import ZOO
from harness.scenario.spec import PRECISIONS, STRATEGIES

MODELS = ("125m", "350m", "1.3b", "2.7b", "7b", "13b", "30b", "70b")
GPUS = (2, 4, 8, 16, 32)
MICRO_BATCHES = (2, 4, 8)


def synthetic_record(
    i: int, night: int, model: str, strategy: str, precision: str, gpus: int, mb: int, rng: random.Random
) -> dict:
    n_params = ZOO[model].n_params()
    # NOTE: the whole spec, as the harness writes it (harness.results.spec: core keys, then every setting)
    spec = {
        "model": model,
        "model_config": ZOO[model].to_dict(),
        "strategy": strategy,
        "precision": precision,
        "gpus": gpus,
        "nodes": max(1, gpus // 8),
        "gpus_per_node": min(gpus, 8),
        "micro_batch": mb,
        "seq_len": 2048,
        "grad_accum": 1,
        "warmup_steps": 5,
        "measure_steps": 20,
        "activation_checkpointing": "none",
        "compile": False,
        "offload": "none",
        "seed": 0,
        "lr": 0.001,
        "time_limit_s": 900.0,
        "inject": None,
        "tp": 1,
        "pp": 1,
        "pp_schedule": "1f1b",
        "microbatches": 0,
        "sequence_parallel": False,
        "trace": False,
        "checkpoint": False,
    }
    mem = n_params * 16 / 2**30 / (gpus if strategy in ("zero3", "fsdp.full_shard", "fsdp2.full_shard") else 1)
    mem += 0.4 * mb * n_params**0.5 / 1e4
    status, reason = "ok", None
    if mem > 79:
        status, reason = rng.choice(
            [
                ("oom", "CUDA out of memory. Tried to allocate 2.00 GiB"),
                ("skipped", f"predicted memory {mem:.1f} GiB exceeds capacity 79.1 GiB"),
            ]
        )
    elif rng.random() < 0.02:
        status, reason = rng.choice(
            [("error", "RuntimeError: NCCL error"), ("timeout", "time limit 900 s"), ("nan", "loss is nan at step 7")]
        )
    rec = {
        "schema_version": 1,
        "run_id": f"r{night}-{i:06d}",
        "sweep": f"nightly-{night}",
        "cluster": "h100",
        "status": status,
        "reason": reason,
        "failed_rank": 0 if status in ("oom", "error") else None,
        "spec": spec,
        "metrics": {},
        "env": {
            "device_name": "NVIDIA H100 80GB HBM3",
            "device_type": "cuda",
            "device_memory_gib": 79.1,
            "backend": "nccl",
        },
        "started_at": f"2026-11-{20 + night:02d}T01:00:00+00:00",
        "finished_at": f"2026-11-{20 + night:02d}T02:00:00+00:00",
    }
    if status != "ok":
        return rec
    tps = (
        6e14
        / (6 * n_params)
        * rng.uniform(0.3, 0.5)
        * (0.97 ** GPUS.index(gpus))
        * (0.35 if precision == "fp32" else 1.0)
    )
    step = mb * 2048 / tps
    samples = [step * rng.uniform(0.98, 1.06) for _ in range(20)]
    srt = sorted(samples)
    rec["metrics"] = {
        "step_time_s": {
            "median": srt[10],
            "p10": srt[2],
            "p90": srt[18],
            "mean": sum(samples) / 20,
            "samples": samples,
        },
        "tokens_per_s": tps * gpus,
        "tokens_per_s_per_gpu": tps,
        "tflops_per_gpu": tps * 6 * n_params / 1e12,
        "mfu": None if precision == "fp32" else tps * 6 * n_params / 989.4e12,
        "peak_memory_allocated_gib": mem,
        "peak_memory_reserved_gib": mem * 1.12,
        "n_params": n_params,
        "null_reasons": {"mfu": "no dense fp32 peak for this device"} if precision == "fp32" else {},
    }
    if rng.random() < 0.8:
        rec["comm"] = {
            "bytes_per_step": 6 * n_params,
            "calls_per_step": 100,
            "by_collective": {
                "all_gather": {"calls": 60, "bytes": 4 * n_params},
                "reduce_scatter": {"calls": 40, "bytes": 2 * n_params},
            },
        }
    if rng.random() < 0.5:
        rec["predicted"] = {"comm_bytes_per_step": 6 * n_params, "memory_gib": {"total": mem * 0.95}}
    return rec


CELLS = list(itertools.product(MODELS, STRATEGIES, PRECISIONS, GPUS, MICRO_BATCHES))
"""(model, strategy, precision, gpus, micro_batch) of every cell of the matrix"""


def iter_records(n: int, seed: int = 0):
    """The first `n` synthetic records, night after night: (folder name, record)."""
    rng = random.Random(seed)
    for i in range(n):
        night, cell = divmod(i, len(CELLS))
        yield f"nightly-{night}", synthetic_record(i, night, *CELLS[cell], rng)


def write_records(root: Path, n: int, seed: int = 0) -> None:
    """Write `n` synthetic records as <root>/nightly-<night>/<run_id>.json."""
    made: set[str] = set()
    for folder, rec in iter_records(n, seed):
        if folder not in made:
            (root / folder).mkdir(parents=True, exist_ok=True)
            made.add(folder)
        (root / folder / f"{rec['run_id']}.json").write_text(json.dumps(rec))
