"""The history's tables as types: one frozen dataclass per table row, and the metric columns of `runs`.

harness.history.store reads and writes rows only through these: a row's columns are its fields (in order), so a
query and the type it fills cannot drift apart. What a record *is* (its cell, machine, software, values) is
harness.history.keys' `Entry`; the rows here are how an entry is stored and what a read gives back.

The metric columns of `runs` follow the registry (harness.history.keys.HISTORY_METRICS): one nullable column per
metric, named after it (`comm.bytes_per_step` → `comm_bytes_per_step`). A metric added to the registry needs no
code here: `metric_columns` derives its column, and the store adds it to an older database when it opens it for
writing.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Mapping
from dataclasses import astuple, dataclass, field, fields
from types import MappingProxyType
from typing import Any

from harness.compare.metrics import Metric
from harness.history import keys
from harness.history.keys import Entry, identity_key


@dataclass(frozen=True, slots=True)
class Machine:
    """A row of `machines`: where a run was measured (null where the record does not say)."""

    cluster: str
    """the cluster profile's name"""
    device_type: str | None
    """cuda, cpu, …"""
    device_name: str | None
    device_count: int | None
    """devices on the node"""
    driver: str | None
    """driver version (records carry none today)"""

    @classmethod
    def of(cls, values: Mapping[str, Any]) -> Machine:
        """From an entry's machine fields (harness.history.keys.machine_of)."""
        given: dict[str, Any] = {f.name: values.get(f.name) for f in fields(cls)}
        return cls(**given)

    def as_dict(self) -> dict[str, Any]:
        """The fields in order, as `history show --format json` writes them."""
        return dict(zip(MACHINE_COLUMNS, astuple(self)))

    @property
    def key(self) -> str:
        """The row's unique key: its fields as canonical JSON."""
        return identity_key(self.as_dict())


@dataclass(frozen=True, slots=True)
class Software:
    """A row of `software`: the stack a run used (null where the record does not say)."""

    python: str | None
    torch: str | None
    cuda: str | None
    nccl: str | None
    deepspeed: str | None
    harness_sha: str | None
    """the harness commit (the record's env.harness_git_sha)"""

    @classmethod
    def of(cls, values: Mapping[str, Any]) -> Software:
        """From an entry's software fields (harness.history.keys.software_of)."""
        return cls(**{f.name: values.get(f.name) for f in fields(cls)})

    def as_dict(self) -> dict[str, Any]:
        return dict(zip(SOFTWARE_COLUMNS, astuple(self)))

    @property
    def key(self) -> str:
        return identity_key(self.as_dict())


MACHINE_COLUMNS = tuple(f.name for f in fields(Machine))
"""`machines`' columns after id and key (harness.history.keys.MACHINE_FIELDS, in order)"""
SOFTWARE_COLUMNS = tuple(f.name for f in fields(Software))
"""`software`'s columns after id and key (harness.history.keys.SOFTWARE_FIELDS, in order)"""


@dataclass(frozen=True)
class CellRow:
    """A row of `cells` to store: one cell of the matrix, as first seen."""

    key: str
    """canonical spec JSON (harness.history.keys.cell_key): unique"""
    label: str
    """readable name: `model strategy precision gN` and the settings off their default"""
    run_id: str
    """the run id it was first stored under"""
    model: str | None
    strategy: str | None
    precision: str | None
    gpus: int | None

    @classmethod
    def of(cls, entry: Entry) -> CellRow:
        spec = entry.spec
        return cls(
            key=entry.cell,
            label=entry.label,
            run_id=entry.run_id,
            model=spec.model,
            strategy=spec.strategy,
            precision=spec.precision,
            gpus=spec.gpus,
        )


CELL_COLUMNS = tuple(f.name for f in fields(CellRow) if f.name != "key")
"""`cells`' columns after id and key"""


@dataclass(frozen=True)
class Cell(CellRow):
    """A stored row of `cells`, with its id."""

    id: int


@dataclass(frozen=True)
class MetricColumn:
    """A row of `metrics`: a metric, the column of `runs` that holds it, its unit and good direction."""

    name: str
    column_name: str
    unit: str
    lower_is_better: bool

    def as_row(self) -> tuple[Any, ...]:
        return (self.name, self.column_name, self.unit, int(self.lower_is_better))


METRIC_COLUMNS = tuple(f.name for f in fields(MetricColumn))


@dataclass(frozen=True)
class Batch:
    """A row of `batches`: one `history add` that stored something."""

    added_at: int
    """Unix seconds"""
    label: str | None
    """`history add --label`"""
    source: str
    """the results dirs added"""
    runs: int
    """runs it stored"""


BATCH_COLUMNS = tuple(f.name for f in fields(Batch))


@dataclass(frozen=True, slots=True)
class StoredRun:
    """A row of `runs` as written: one record, its identities by row id, and its metric values."""

    uid: int
    """63-bit identity of the record (harness.history.keys.run_uid): unique, so adds are idempotent"""
    cell: int
    machine: int
    software: int
    batch: int
    time: int
    """Unix seconds: when the run finished"""
    status: str
    values: Mapping[str, float] = field(default_factory=dict)
    """metric name → value; a metric it lacks is null"""

    def as_row(self, metrics: tuple[str, ...]) -> tuple[Any, ...]:
        """The row's values in RUN_COLUMNS order, then one per metric of `metrics` (names)."""
        return (self.uid, self.cell, self.machine, self.software, self.batch, self.time, self.status) + tuple(
            self.values.get(name) for name in metrics
        )


RUN_COLUMNS = tuple(f.name for f in fields(StoredRun) if f.name != "values")
"""`runs`' columns after id, before the metric columns"""


@dataclass(frozen=True, slots=True)
class Run:
    """One stored run as the judge and `history show` read it: the `runs` row with its batch's label and its
    machine and software rows."""

    id: int
    uid: int
    time: int
    """Unix seconds (the record's finished_at)"""
    status: str
    label: str | None
    """the label given to `history add`"""
    machine: Machine
    software: Software
    values: Mapping[str, float] = field(default_factory=dict)
    """metric name → value, for the metrics the run has (null values left out)"""


# --------------------------------------------------------------------------------------------------
# the metric columns of `runs`

_IDENTIFIER = re.compile(r"^[a-z][a-z0-9_]*$")


def column_of(metric_name: str) -> str:
    """The column of `runs` that holds a metric: its name with dots as underscores."""
    return metric_name.replace(".", "_")


@functools.cache
def metric_columns(metrics: tuple[Metric, ...]) -> Mapping[str, str]:
    """metric name → its column in `runs`, for a registry of metrics. RuntimeError (a harness bug, not input) for
    a name that makes no plain SQL identifier, or two metrics (or a metric and a fixed column) on one column."""
    out: dict[str, str] = {}
    taken = {"id", *RUN_COLUMNS}
    for m in metrics:
        col = column_of(m.name)
        if not _IDENTIFIER.match(col) or col in taken:
            raise RuntimeError(f"history metric {m.name!r}: column {col!r} is not a free plain SQL identifier")
        taken.add(col)
        out[m.name] = col
    return MappingProxyType(out)


def registry_columns() -> Mapping[str, str]:
    """metric name → column for every metric the history stores today (keys.HISTORY_METRICS, read at call time)."""
    return metric_columns(keys.HISTORY_METRICS)


def registry_rows() -> list[MetricColumn]:
    """The `metrics` table's rows for the registry's metrics."""
    columns = registry_columns()
    return [MetricColumn(m.name, columns[m.name], m.unit, m.lower_is_better) for m in keys.HISTORY_METRICS]
