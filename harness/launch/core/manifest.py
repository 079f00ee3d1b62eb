"""The sweep's manifest and locks: `results/<sweep>/manifest.json` says which cells a sweep has, their job ids
and states; per-cell file locks keep two sweeps into the same folder from running the same cell twice.

Why a module of its own: the sweep writes the manifest as it goes, the SLURM backend follows and re-attaches to
jobs through it, and `harness status` reads it; all of them need one definition of its states and one lock.
"""

from __future__ import annotations

import fcntl
import json
import os
from collections.abc import Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

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
    instead of overwriting each other's."""

    path: Path
    header: dict[str, Any] = field(default_factory=dict)

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
    ) -> Manifest:
        m = cls(
            sweep_dir(results, sweep) / "manifest.json",
            {"sweep": sweep, "scenario": scenario, "cluster": cluster, "executor": executor},
        )
        with m._locked() as data:
            for run_id in run_ids or []:
                data["cells"].setdefault(run_id, {"state": "pending", "updated_at": utc_now()})
        return m

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
            cell.update(fields, updated_at=utc_now())

    @property
    def data(self) -> dict[str, Any]:
        return json.loads(self.path.read_text())


def cell_state(rec: Mapping[str, Any]) -> str:
    """The manifest state of a cell that has its record."""
    return {"ok": "done", "skipped": "skipped", "cancelled": "cancelled"}.get(rec["status"], "failed")
