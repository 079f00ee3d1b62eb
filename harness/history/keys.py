"""What a record is in the history: its cell (spec identity), machine, software, run id, time and values.

- **cell**: the spec's match key (RunSpec.match_key: canonical JSON, settings at their default left out), so a
  cell lines up across renamed sweeps exactly as `harness compare` lines it up. One normalisation first: an
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

import dataclasses
import datetime as dt
import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from harness.results.metrics import EXACT, STORED, Metric, MetricReader
from harness.results.record import Record
from harness.results.store import as_record
from harness.scenario.spec import LEGACY_GPUS_KEY, RunSpec, canonical_json

HISTORY_METRICS: tuple[Metric, ...] = STORED
"""what each run stores: the registry's judged metrics (harness.results.metrics: compare's, and TFLOPS per GPU),
same names, units and directions"""
HISTORY_METRICS_BY_NAME = {m.name: m for m in HISTORY_METRICS}
_READER = MetricReader(HISTORY_METRICS)
MACHINE_FIELDS = ("cluster", "device_type", "device_name", "device_count", "driver")
SOFTWARE_FIELDS = ("python", "torch", "cuda", "nccl", "deepspeed", "harness_sha")


_CORE = frozenset({"model", "model_config", "strategy", "precision", LEGACY_GPUS_KEY, "nodes", "gpus_per_node"})
"""the spec keys `cell_label`'s core names (the rest it lists when off their default)"""


def history_spec(spec: RunSpec) -> RunSpec:
    """The cell as the history keys it: an injected slowdown left out (it simulates a regression of that cell)."""
    inject = spec.settings.inject
    if isinstance(inject, Mapping) and inject.get("fault") == "slow":
        return dataclasses.replace(spec, settings=dataclasses.replace(spec.settings, inject=None))
    return spec


def cell_key(spec: RunSpec) -> str:
    """The cell's identity in the history (canonical JSON: its match key, a slowdown left out)."""
    return history_spec(spec).match_key


def cell_label(spec: RunSpec) -> str:
    """`model strategy precision gN`, plus the settings that differ from their default, in key order."""
    core = f"{spec.model} {spec.strategy} {spec.precision} g{spec.gpus}"
    ident = canonical_json(history_spec(spec).identity())
    extra = [
        f"{k}={json.dumps(ident[k], sort_keys=True, separators=(',', ':'))}" for k in sorted(ident) if k not in _CORE
    ]
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
    global _READER
    _READER = _READER.of(HISTORY_METRICS)
    return {m.name: v for m, v in zip(HISTORY_METRICS, _READER.values(rec)) if v is not None}


@dataclass
class Entry:
    """One record, as the history stores it."""

    uid: int
    run_id: str
    cell: str
    """cell key (canonical JSON)"""
    label: str
    """readable cell name"""
    spec: RunSpec
    """the cell as the history keys it (history_spec)"""
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
    spec = history_spec(rec.spec)
    time = epoch_s(rec.finished_at) or epoch_s(rec.started_at)
    if time is None:
        raise ValueError("no readable finished_at/started_at time")
    return Entry(
        uid=run_uid(rec),
        run_id=str(rec.run_id),
        cell=spec.match_key,
        label=cell_label(spec),
        spec=spec,
        machine=machine_of(rec),
        software=software_of(rec),
        time=time,
        status=str(rec.status),
        values=run_values(rec),
        origin=rec.origin,
    )


def is_exact(metric: Metric) -> bool:
    return metric.kind == EXACT
