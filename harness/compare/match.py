"""Matching baseline and candidate cells: by their `spec` (canonical JSON), never by folder, file name or sweep
name, so a renamed sweep or a re-organised results tree still lines up.

Also the readable label of each matched key and the spec differences that explain a near miss.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from harness.compare.metrics import METRICS
from harness.results.metrics import MetricReader
from harness.results.record import Record
from harness.results.spec import spec_to_json
from harness.scenario.spec import RunSpec, canonical_json

_READER = MetricReader(METRICS)


def run_values(rec: Record) -> RunValues:
    """compare's metrics of one ok run (those it has), read as it is indexed (NOTE: a module's reader, not the
    index's: the index is pickled from a forked child, a reader's path functions are not)."""
    global _READER
    _READER = _READER.of(METRICS)
    return {m.name: v for m, v in zip(METRICS, _READER.values(rec)) if v is not None}


def spec_key(spec: RunSpec, *, ignore: Iterable[str] = ()) -> str:
    """The match key of a cell: its RunSpec.match_key (canonical JSON of the spec without the settings at their
    default, so a setting added later still matches records written before it existed), minus `ignore`d top-level
    keys."""
    ignore = tuple(ignore)
    return spec.key_without(ignore) if ignore else spec.match_key


@dataclass(frozen=True)
class RunFile:
    """Where one ok run came from, and what names it (what `compare --promote` copies into a baseline)."""

    path: str | None
    """its file (None: a record not read from a file)"""
    sweep: str | None
    run_id: str
    repeat: int
    """which run of its cell (1: the first)"""
    spec: RunSpec

    @classmethod
    def of(cls, rec: Record) -> RunFile:
        return cls(rec.path, rec.sweep, rec.run_id, rec.repeat_index, rec.spec)


RunValues = dict[str, float]
"""one ok run's value per metric (its median step time, the throughput at it, its peak memory, …)"""


class SideIndex:
    """One side's records by match key, fed one record at a time. Of several records with one spec (the runs of
    `harness sweep --repeat`, sweeps in several dirs, a rerun) the one finished last is the cell's record (its
    status, exact metrics, environment), and every ok one is a run: its metric values are kept (`runs`), which
    is what timing is judged on. Only the chosen record is kept whole, so memory grows with the cells and runs,
    not with the records. A record seen twice (the same launch `attempt`, e.g. a copy in another dir) is one
    run, with a warning."""

    def __init__(self, *, side: str, ignore: Iterable[str] = ()) -> None:
        self.side = side
        self.ignore = tuple(ignore)
        self.records = 0
        """records added, including skipped ones"""
        self.chosen: dict[str, Record] = {}
        self._latest: dict[str, str] = {}  # key → finished_at of the chosen record
        self._skipped: list[str] = []
        self.runs: dict[str, list[RunValues]] = {}
        """key → the values of each ok run of the cell"""
        self.failed_runs: dict[str, list[str]] = {}
        """key → the status of each run that was not ok (and not skipped)"""
        self.run_files: dict[str, list[RunFile]] = {}
        """key → where each ok run came from: what --promote copies"""
        self._attempts: set[tuple[str, str, Any]] = set()
        self._copies: list[str] = []

    def add(self, rec: Record) -> None:
        self.records += 1
        key = spec_key(rec.spec, ignore=self.ignore)
        if rec.attempt:
            ident = (key, str(rec.attempt), rec.repeat)
            if ident in self._attempts:
                self._copies.append(f"{self.side}: {rec.origin} is a copy of a run already read; counted once")
                return
            self._attempts.add(ident)
        if rec.status == "ok":
            self.runs.setdefault(key, []).append(run_values(rec))
            self.run_files.setdefault(key, []).append(RunFile.of(rec))
        elif rec.status != "skipped":
            self.failed_runs.setdefault(key, []).append(str(rec.status))
        finished = str(rec.finished_at or "")
        # NOTE: >= as a stable sort by finish time would have it: of equal finish times the last one added wins
        if key not in self._latest or finished >= self._latest[key]:
            self.chosen[key] = rec
            self._latest[key] = finished

    def add_all(self, records: Iterable[Record]) -> SideIndex:
        for rec in records:
            self.add(rec)
        return self

    def warnings(self) -> list[str]:
        """Skipped records and copies of one run. Several runs of one spec are no warning: they are what timing
        is judged on (each cell says how many it had)."""
        return list(self._skipped) + list(self._copies)


def index_by_spec(
    records: Iterable[Record], *, side: str, ignore: Iterable[str], warnings_out: list[str]
) -> dict[str, Record]:
    """key → record; of several records with one spec the one finished last wins (a rerun), with a warning."""
    index = SideIndex(side=side, ignore=ignore).add_all(records)
    warnings_out.extend(index.warnings())
    return index.chosen


def _short(value: Any) -> str:
    if isinstance(value, (dict, list)):
        return json.dumps(value, sort_keys=True, separators=(",", ":"))
    return str(value)


def cell_labels(specs: Mapping[str, RunSpec]) -> dict[str, str]:
    """key → label; cells sharing `model strategy precision gN` get the spec keys that differ among them."""
    core = {k: f"{s.model} {s.strategy} {s.precision} g{s.gpus}" for k, s in specs.items()}
    groups: dict[str, list[str]] = {}
    for k, name in core.items():
        groups.setdefault(name, []).append(k)
    labels: dict[str, str] = {}
    for name, keys in groups.items():
        if len(keys) == 1:
            labels[keys[0]] = name
            continue
        flat = {k: spec_to_json(specs[k]) for k in keys}
        all_keys = sorted({sk for k in keys for sk in flat[k]})
        differing = [sk for sk in all_keys if len({_short(canonical_json(flat[k].get(sk))) for k in keys}) > 1]
        for k in keys:
            extra = " ".join(f"{sk}={_short(flat[k].get(sk))}" for sk in differing)
            labels[k] = f"{name} {extra}".strip()
    if len(set(labels.values())) < len(labels):  # cannot happen for distinct canonical specs; be safe anyway
        labels = {k: f"{v} #{i}" for i, (k, v) in enumerate(sorted(labels.items(), key=lambda kv: kv[1]))}
    return labels


def spec_differences(a: RunSpec, b: RunSpec) -> list[str]:
    """`key: a → b` for every top-level spec key whose value differs."""
    fa, fb = spec_to_json(a), spec_to_json(b)
    out = []
    for k in sorted(set(fa) | set(fb)):
        va, vb = canonical_json(fa.get(k)), canonical_json(fb.get(k))
        if va != vb:
            out.append(f"{k}: {_short(fa.get(k, '<absent>'))} → {_short(fb.get(k, '<absent>'))}")
    return out
