"""The record contract: one JSON record per cell, written atomically; loading records back.

Record contract v1 (later versions add fields, never rename these):

    schema_version   int, 1
    run_id           str, digest of the spec (harness.scenario.schema.RunSpec.run_id)
    sweep            str, scenario name
    cluster          str, cluster profile name
    status           ok | oom | timeout | error | nan | crashed | cancelled | skipped
    reason           str | null, why the status is not ok (or a note)
    failed_rank      int | null
    spec             {model, model_config, strategy, precision, world_size, nodes, gpus_per_node,
                      micro_batch, seq_len, grad_accum, warmup_steps, measure_steps, ...}
    metrics          {step_time_s: {median, p10, p90, mean, samples}, tokens_per_s, tokens_per_s_per_gpu,
                      tflops_per_gpu, mfu, peak_memory_allocated_gib, peak_memory_reserved_gib,
                      loss, losses, n_params, flops_per_step, compile_s, startup_s,
                      dynamo: {frames, graphs, graph_breaks, frames_in_measured_steps},
                      null_reasons: {metric: why it is null}}
    env              {torch, cuda, nccl, deepspeed, python, device_type, device_name, backend, hostnames,
                      harness_git_sha, slurm_job_id, ...}
    started_at, finished_at   ISO-8601 UTC
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

SCHEMA_VERSION = 1
STATUSES = ("ok", "oom", "timeout", "error", "nan", "crashed", "cancelled", "skipped")
GIB = 2**30


def utc_now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")


def sweep_dir(results: str | Path, sweep: str) -> Path:
    return Path(results) / sweep


def record_path(results: str | Path, sweep: str, run_id: str) -> Path:
    return sweep_dir(results, sweep) / f"{run_id}.json"


def atomic_write_text(path: str | Path, text: str) -> None:
    """Write a file so readers see the old one or the whole new one, never a torn one (temp + fsync + rename,
    then fsync of the directory so the rename survives a crash)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        dfd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise


def atomic_write_json(path: str | Path, obj: Any) -> None:
    """`atomic_write_text` of indented JSON (NaN refused: JSON has none)."""
    atomic_write_text(path, json.dumps(obj, indent=2, allow_nan=False) + "\n")


def new_record(*, spec: dict[str, Any], run_id: str, sweep: str, cluster: str, status: str,
               reason: str | None = None, failed_rank: int | None = None) -> dict[str, Any]:
    """A record skeleton: statuses other than ok carry a reason; metrics stay empty until measured."""
    if status not in STATUSES:
        raise ValueError(f"status {status!r} is not one of {', '.join(STATUSES)}")
    now = utc_now()
    return {
        "schema_version": SCHEMA_VERSION,
        "run_id": run_id,
        "sweep": sweep,
        "cluster": cluster,
        "status": status,
        "reason": reason,
        "failed_rank": failed_rank,
        "spec": spec,
        "metrics": {},
        "env": {},
        "started_at": now,
        "finished_at": now,
    }


def sanitize(obj: Any) -> Any:
    """JSON-safe copy: NaN/inf become null (JSON has no NaN; a non-finite loss is status `nan`, not a number)."""
    if isinstance(obj, float):
        return obj if obj == obj and obj not in (float("inf"), float("-inf")) else None
    if isinstance(obj, dict):
        return {str(k): sanitize(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [sanitize(v) for v in obj]
    return obj


def write_record(results: str | Path, record: dict[str, Any]) -> Path:
    path = record_path(results, record["sweep"], record["run_id"])
    atomic_write_json(path, sanitize(record))
    return path


def read_record(path: str | Path) -> dict[str, Any]:
    """Parse one record; ValueError (with the reason) when it is not a readable v1 record."""
    try:
        rec = json.loads(Path(path).read_text())
    except (OSError, UnicodeDecodeError) as e:
        raise ValueError(f"unreadable: {e}") from None
    except json.JSONDecodeError as e:
        raise ValueError(f"not valid JSON (truncated or corrupt?): {e}") from None
    if not isinstance(rec, dict):
        raise ValueError("not a JSON object")
    version = rec.get("schema_version")
    if version != SCHEMA_VERSION:
        raise ValueError(f"unknown schema_version {version!r}; this harness reads version {SCHEMA_VERSION}")
    missing = [k for k in ("run_id", "status", "spec") if k not in rec]
    if missing:
        raise ValueError(f"missing keys: {', '.join(missing)}")
    if rec["status"] not in STATUSES:
        raise ValueError(f"status {rec['status']!r} is not one of {', '.join(STATUSES)}")
    return rec


def iter_record_files(*dirs: str | Path) -> Iterator[Path]:
    """Record files under the given dirs (recursively), skipping hidden/temp files and the sweep manifest."""
    for d in dirs:
        d = Path(d)
        if d.is_file():
            yield d
            continue
        for p in sorted(d.rglob("*.json")):
            if any(part.startswith(".") for part in p.relative_to(d).parts) or p.name == "manifest.json":
                continue
            yield p


def load_records(*dirs: str | Path) -> tuple[list[dict[str, Any]], list[str]]:
    """(records, warnings): every readable record; each unreadable/partial/unknown-schema file is a warning."""
    records, warnings = [], []
    for p in iter_record_files(*dirs):
        try:
            rec = read_record(p)
        except ValueError as e:
            warnings.append(f"{p}: {e}")
            continue
        rec.setdefault("_path", str(p))
        records.append(rec)
    return records, warnings
