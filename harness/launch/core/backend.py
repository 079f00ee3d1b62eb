"""What a backend is to the sweep: the interface between `harness.launch.sweep` (which picks one backend per sweep
and runs its rounds) and the backends (harness.launch.local.backend, harness.launch.slurm.backend), which run one
round of cells each in their own way — locally one after another, on SLURM all submitted at once, then waited for.

Why a module of its own: the backends know nothing of the sweep's module (nor of each other); this is all they
know of it. The sweep's `Sweep` is a `SweepRound` by its shape.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from harness.core.progress import Progress
from harness.launch.core.folder import SweepFolder
from harness.launch.core.manifest import Manifest
from harness.results.payload import Payload
from harness.results.record import Record
from harness.scenario.cluster import Cluster
from harness.scenario.spec import RunSpec


@dataclass(frozen=True)
class Round:
    """Where a round sits in its sweep: run `k` of every cell, the `index`-th (0-based) of the sweep's `count`
    rounds. `repeated`: the sweep numbers its runs (more than one round, or an `--append`ed run k >= 2)."""

    k: int
    index: int
    count: int
    repeated: bool


@dataclass(frozen=True)
class RoundEnd:
    """What a round (or a sweep's rounds) ended with."""

    records: list[Record] = field(default_factory=list)
    """the runs' records, in the order of the cells"""
    in_flight: int = 0
    """cells left running on SLURM (--no-wait): the sweep stops after this round"""


class SweepRound(Protocol):
    """What every backend shares, for one round: the cluster, the folder and the round's manifest view, the cells'
    locks, the skip decisions (`prepare`) and the filing of a run's record."""

    @property
    def cluster(self) -> Cluster: ...

    @property
    def folder(self) -> SweepFolder: ...

    @property
    def manifest(self) -> Manifest:
        """the view of this round's runs (Manifest.for_repeat)"""
        ...

    @property
    def echo(self) -> Callable[[str], None]:
        """prints a line (above the status line, on a terminal)"""
        ...

    @property
    def progress(self) -> Progress | None:
        """the sweep's status line: each run that ends is counted on it (`advance`; `timed=False` for one that took
        no time: recorded already, skipped), so that it shows done/total and an ETA on a terminal"""
        ...

    @property
    def jobs(self) -> Path:
        """submitit's folder (job logs, pickles)"""
        ...

    def lock(self, spec: RunSpec, *, blocking: bool = False) -> AbstractContextManager[bool]:
        """The cell's lock, held while this sweep is responsible for the cell; False: another sweep holds it."""
        ...

    def prepare(self, spec: RunSpec, *, tag: str) -> tuple[Record | None, Payload | None]:
        """(record, None) for a run that needs no launch (recorded ok, skipped), (None, payload) for one that does,
        (None, None) for a skipped cell's run k >= 2; the manifest says which."""
        ...

    def record_of_other_sweep(self, spec: RunSpec, *, tag: str) -> Record | None:
        """Wait until the sweep holding the cell's lock lets go; its record of this run, or None."""
        ...

    def file(self, rec: Record) -> Record:
        """The run's record filed where the sweep folder keeps this round's runs (SweepFolder.file)."""
        ...


class Backend(Protocol):
    """One sweep's way of running its cells, picked once by the sweep from the profile's executor."""

    def session(self, sweep: SweepRound, specs: Sequence[RunSpec]) -> AbstractContextManager[object]:
        """What lives as long as the sweep, around all of its rounds (the local warm zygote)."""
        ...

    def run_round(self, sweep: SweepRound, specs: Sequence[RunSpec], *, at: Round) -> RoundEnd:
        """Every cell's run of one round, each ending in one record (or left in flight, --no-wait)."""
        ...
