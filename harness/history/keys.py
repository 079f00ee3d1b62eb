"""What a record is in the history: its cell (spec identity), machine, software, run id, time and values.

- **cell**: harness.compare.match.spec_key of the spec (canonical JSON, settings at their default left out), so a
  cell lines up across renamed sweeps exactly as `harness compare` lines it up. Two normalisations first: the GPU
  count is keyed `gpus` whether the record says `gpus` or (records before the rename) `world_size`; and an
  injected `slow` fault is left out (it simulates a regression *of that cell*, so it must meet the cell's own
  history). Other injected faults stay part of the cell.
- **machine**: cluster profile, device type, name and count, driver (null where the record has none: records
  today carry no driver version).
- **software**: python, torch, CUDA, NCCL, DeepSpeed and the harness commit, from `env`.
- **uid**: a 63-bit digest of run_id and the launch's `attempt` (of run_id, started_at and finished_at for a record
  without one): adding the same record again finds it already there.
- **values**: one number per metric (harness.compare.metrics' list, plus TFLOPS per GPU), each a run-level value:
  the median step time, the throughput at it, the peak memory.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from harness.compare.match import spec_key
from harness.results.metrics import EXACT, STORED, Metric
from harness.results.record import Record
from harness.results.store import as_record
from harness.scenario.schema import LEGACY_GPUS_KEY

HISTORY_METRICS: tuple[Metric, ...] = STORED
"""what each run stores: the registry's judged metrics (harness.results.metrics: compare's, and TFLOPS per GPU),
same names, units and directions"""
HISTORY_METRICS_BY_NAME = {m.name: m for m in HISTORY_METRICS}
MACHINE_FIELDS = ("cluster", "device_type", "device_name", "device_count", "driver")
SOFTWARE_FIELDS = ("python", "torch", "cuda", "nccl", "deepspeed", "harness_sha")


def gpus_of(spec: Mapping[str, Any]) -> int | None:
    """The cell's GPU count: `spec.gpus`, or `spec.world_size` in records written before the rename."""
    for k in ("gpus", LEGACY_GPUS_KEY):
        v = spec.get(k)
        if isinstance(v, int) and not isinstance(v, bool):
            return v
    return None


def _is_slow_fault(inject: Any) -> bool:
    return isinstance(inject, Mapping) and inject.get("fault") == "slow"


def history_spec(spec: Mapping[str, Any]) -> dict[str, Any]:
    """The spec as the history keys it: the GPU count under `gpus`, an injected slowdown left out."""
    out = dict(spec)
    gpus = gpus_of(out)
    out.pop(LEGACY_GPUS_KEY, None)
    if gpus is not None:
        out["gpus"] = gpus
    if _is_slow_fault(out.get("inject")):
        out["inject"] = None
    return out


def cell_key(spec: Mapping[str, Any]) -> str:
    """The cell's identity in the history (canonical JSON)."""
    return spec_key(history_spec(spec))


def cell_label(spec: Mapping[str, Any], *, key: str | None = None) -> str:
    """`model strategy precision gN` (plus the settings that differ from their default, when any); `key`: the
    spec's cell_key, when already made."""
    core = f"{spec.get('model')} {spec.get('strategy')} {spec.get('precision')} g{gpus_of(spec)}"
    try:
        rest = json.loads(key if key is not None else cell_key(spec))
    except ValueError:
        return core
    skip = {"model", "model_config", "strategy", "precision", "gpus", "nodes", "gpus_per_node"}
    extra = [f"{k}={json.dumps(v, sort_keys=True, separators=(',', ':'))}" for k, v in rest.items() if k not in skip]
    return " ".join([core, *extra])


def machine_of(rec: Record) -> dict[str, Any]:
    env = rec.env
    return {
        "cluster": str(rec.cluster or ""),
        "device_type": env.device_type,
        "device_name": env.device_name,
        "device_count": env.device_count,
        "driver": _text(env.field("driver") or env.field("cuda_driver")),
    }


def _text(v: Any) -> str | None:
    return None if v is None else str(v)


def software_of(rec: Record) -> dict[str, Any]:
    env = rec.env
    return {
        "python": env.python,
        "torch": env.torch,
        "cuda": env.cuda,
        "nccl": env.nccl,
        "deepspeed": env.deepspeed,
        "harness_sha": env.harness_git_sha,
    }


def identity_key(fields: Mapping[str, Any]) -> str:
    """A dict of identity fields as one comparable string (machine, software)."""
    return json.dumps(dict(fields), sort_keys=True, separators=(",", ":"))


def run_uid(rec: Record) -> int:
    """63-bit identity of one run of one cell: the same record added twice has the same uid."""
    parts = (
        [str(rec.run_id), str(rec.attempt)]
        if rec.attempt
        else [str(rec.run_id), str(rec.started_at), str(rec.finished_at)]
    )
    digest = hashlib.blake2b("\x1f".join(parts).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") >> 1


def epoch_s(timestamp: Any) -> int | None:
    """ISO-8601 → Unix seconds (naive times read as UTC); None when absent or unreadable."""
    if not isinstance(timestamp, str) or not timestamp:
        return None
    try:
        t = dt.datetime.fromisoformat(timestamp.replace("Z", "+00:00"))
    except ValueError:
        return None
    if t.tzinfo is None:
        t = t.replace(tzinfo=dt.timezone.utc)
    return int(t.timestamp())


def iso(seconds: int) -> str:
    return dt.datetime.fromtimestamp(seconds, dt.timezone.utc).isoformat(timespec="seconds").replace("+00:00", "Z")


def run_values(rec: Record | Mapping[str, Any]) -> dict[str, float]:
    """metric name → value, for the metrics the record has (ok records only; others measured nothing)."""
    rec = as_record(rec)
    if not rec.ok:
        return {}
    out = {}
    for m in HISTORY_METRICS:
        v = m.value(rec)
        if v is not None:
            out[m.name] = v
    return out


@dataclass
class Entry:
    """One record, as the history stores it."""

    uid: int
    run_id: str
    cell: str
    """cell key (canonical JSON)"""
    label: str
    """readable cell name"""
    spec: dict[str, Any]
    machine: dict[str, Any]
    software: dict[str, Any]
    time: int
    """Unix seconds: when the run finished"""
    status: str
    values: dict[str, float] = field(default_factory=dict)
    origin: str = ""
    """the record's file (messages)"""


def entry_of(rec: Record | Mapping[str, Any]) -> Entry:
    """A record (typed, or its JSON document: the Python API takes both) as a history entry. ValueError when it has
    no usable time."""
    rec = as_record(rec)
    spec = rec.spec.as_dict()
    time = epoch_s(rec.finished_at) or epoch_s(rec.started_at)
    if time is None:
        raise ValueError("no readable finished_at/started_at time")
    key = cell_key(spec)
    return Entry(
        uid=run_uid(rec),
        run_id=str(rec.run_id),
        cell=key,
        label=cell_label(spec, key=key),
        spec=history_spec(spec),
        machine=machine_of(rec),
        software=software_of(rec),
        time=time,
        status=str(rec.status),
        values=run_values(rec),
        origin=rec.origin,
    )


def is_exact(metric: Metric) -> bool:
    return metric.kind == EXACT
