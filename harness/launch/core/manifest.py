"""The sweep's manifest and locks: `results/<sweep>/manifest.json` says which cells a sweep has, their job ids
and states; per-cell file locks keep two sweeps into the same folder from running the same cell twice.

Why a module of its own: the sweep writes the manifest as it goes, the SLURM backend follows and re-attaches to
jobs through it, and `harness status` reads it; all of them need one definition of its states and one lock.
"""

from __future__ import annotations

import fcntl
import json
import os
from collections.abc import Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness.results.record import Record
from harness.results.store import atomic_write_json, sweep_dir, utc_now


@contextmanager
def file_lock(path: Path, *, blocking: bool = True):
    """An exclusive flock on `path` (created if missing); yields False when non-blocking and already held."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | (0 if blocking else fcntl.LOCK_NB))
        except BlockingIOError:
            yield False
            return
        try:
            yield True
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)


@dataclass
class Manifest:
    """`results/<sweep>/manifest.json`: each cell's state (pending/running/done/failed/skipped/cancelled, and
    submitted: queued on SLURM), status, job id and attempt (SLURM cells also slurm_state and nodes). Every
    update re-reads the file under a lock, so concurrent sweeps into the same dir interleave their updates
    instead of overwriting each other's.

    Repeats (`harness sweep --repeat K`): a cell's first run is the cell's own entry, as without repeats; its
    k-th run (k >= 2) is `cells[run_id].repeats["k"]`, with the same fields. `for_repeat(k)` is a view whose
    `set` and `data` address the k-th runs by run_id, so a backend that knows nothing of repeats (SLURM's) follows
    one round of them unchanged. The header also names the scenario and cluster files (absolute paths), so that
    `harness history check --confirm` can re-run a cell of this sweep."""

    path: Path
    header: dict[str, Any] = field(default_factory=dict)
    repeat: int = 1
    """the run of each cell this view addresses (1: the cell's own entry)"""

    @classmethod
    def open(
        cls,
        results: str | Path,
        sweep: str,
        *,
        scenario: str,
        cluster: str,
        executor: str = "local",
        run_ids: list[str] | None = None,
        scenario_file: str | None = None,
        cluster_file: str | None = None,
        repeats: Sequence[int] = (1,),
    ) -> Manifest:
        """The sweep's manifest, created or updated: each of `run_ids` gets an entry for each run in `repeats`
        (pending until it is run), and `repeat` records the highest run any sweep into this folder asked for."""
        header: dict[str, Any] = {"sweep": sweep, "scenario": scenario, "cluster": cluster, "executor": executor}
        if scenario_file is not None:
            header["scenario_file"] = scenario_file
        if cluster_file is not None:
            header["cluster_file"] = cluster_file
        m = cls(sweep_dir(results, sweep) / "manifest.json", header)
        with m._locked() as data:
            # NOTE: the most runs per cell any sweep into this dir asked for (a later sweep without --repeat does
            # not make the earlier repeats look missing)
            data["repeat"] = max(int(data.get("repeat") or 1), *repeats)
            for run_id in run_ids or []:
                cell = data["cells"].setdefault(run_id, {"state": "pending", "updated_at": utc_now()})
                for k in repeats:
                    if k >= 2:
                        runs = cell.setdefault("repeats", {})
                        runs.setdefault(str(k), {"state": "pending", "updated_at": utc_now()})
        return m

    def for_repeat(self, repeat: int) -> Manifest:
        """This manifest as seen by the k-th run of every cell (see the class docstring)."""
        return Manifest(self.path, self.header, repeat)

    @contextmanager
    def _locked(self):
        with file_lock(self.path.with_name(".manifest.lock")):
            data: dict[str, Any] = {}
            if self.path.exists():
                try:
                    data = json.loads(self.path.read_text())
                except (OSError, json.JSONDecodeError):
                    data = {}
            data.update(self.header)
            data.setdefault("cells", {})
            yield data
            atomic_write_json(self.path, data)

    def set(self, run_id: str, **fields: Any) -> None:
        with self._locked() as data:
            cell = data["cells"].setdefault(run_id, {})
            if self.repeat > 1:
                cell = cell.setdefault("repeats", {}).setdefault(str(self.repeat), {})
            cell.update(fields, updated_at=utc_now())

    @property
    def data(self) -> dict[str, Any]:
        data = json.loads(self.path.read_text())
        if self.repeat > 1:
            runs = {k: (c.get("repeats") or {}).get(str(self.repeat)) for k, c in data.get("cells", {}).items()}
            data["cells"] = {k: c for k, c in runs.items() if c is not None}
        return data


def cell_runs(cell: dict[str, Any]) -> dict[int, dict[str, Any]]:
    """A manifest cell's runs by repeat index: 1 is the cell's own entry, k >= 2 its `repeats` (`harness status`)."""
    runs: dict[int, dict[str, Any]] = {1: cell}
    for k, c in (cell.get("repeats") or {}).items():
        if str(k).isdigit() and isinstance(c, dict):
            runs[int(k)] = c
    return dict(sorted(runs.items()))


def cell_state(rec: Record) -> str:
    """The manifest state of a cell that has its record."""
    return {"ok": "done", "skipped": "skipped", "cancelled": "cancelled"}.get(rec.status, "failed")
