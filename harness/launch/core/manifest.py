"""The sweep's manifest and locks: `results/<sweep>/manifest.json` says which cells a sweep has, their job ids
and states; per-cell file locks keep two sweeps into the same folder from running the same cell twice.

Why a module of its own: the sweep writes the manifest as it goes, the SLURM backend follows and re-attaches to
jobs through it, and `harness status` and `harness history check --confirm` read it; all of them need one
definition of its states and one lock. The file has one type, `SweepManifest` (its header, cells, each cell's
runs and their states); `read_manifest` is its one reader, and `Manifest` writes it only through that type, by
named operations that the state machine (TRANSITIONS) checks.

A disk that fills mid-sweep must not leave a run `running` for ever: beside the manifest lies a reserve of spare
space (RESERVE, made when a sweep opens the manifest), which a manifest write the disk has no room for frees and
takes, so that the run the sweep stopped at is written `failed`, with what could not be written as its reason
(harness.launch.core.outcome.stopped_run).
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from harness.core.errors import InputError, Problem, one_of
from harness.results.record import Record
from harness.results.store import WriteFailed, atomic_write_json, sweep_dir, utc_now

STATES = ("pending", "submitted", "running", "done", "failed", "skipped", "cancelled")
"""a run's states: pending (not run yet), submitted (queued on SLURM), running, and how it ended"""

IN_FLIGHT = frozenset({"submitted", "running"})
"""the states of a run whose launch is under way (this sweep's, or a stale one left by a sweep that died or
detached)"""

_FROM_ANY = frozenset({"submitted", "running", "done", "failed", "skipped"})

TRANSITIONS: Mapping[str | None, frozenset[str]] = {
    "pending": _FROM_ANY,
    "done": _FROM_ANY,
    "failed": _FROM_ANY,
    "skipped": _FROM_ANY,
    "cancelled": _FROM_ANY,
    "submitted": _FROM_ANY | {"cancelled"},
    "running": _FROM_ANY | {"cancelled"},
    None: _FROM_ANY | {"cancelled"},
}
"""The state machine of a run: the states it may be written to, by the state the file holds. A sweep finds each
run as an earlier sweep left it (re-runs), and the moves are those the writers make (Manifest's operations):

  from any state   → done       `ended`: its ok record is there (`Sweep.prepare`; the record is the truth, also
                                over a `cancelled` whose rank wrote it after all), or its launch ended ok
                   → skipped    `skipped`: not launched (unsupported, cannot be placed, will not fit)
                   → running    `running`: launched locally (a re-run; `--force` re-runs a done run)
                   → submitted  `submitted`: submitted to SLURM (likewise)
                   → failed     `ended`: its launch failed, or sbatch refused its job (then nothing came first)
  in flight only   → cancelled  `ended`: a stop (Ctrl-C, SIGTERM) ended the launch under way
  to pending       never        `Manifest.open` creates a run pending when it has no entry, and nothing else writes it

In flight, a poll of SLURM (`polled`) moves a run between submitted and running both ways (a job requeued; a
packed cell is submitted until its turn in its running job) and writes the same state again (PENDING → REQUEUED,
RUNNING → COMPLETING). None: a run the file holds no state for (it was unreadable and started afresh, without the
entry): nothing to contradict but pending.
"""


@dataclass(frozen=True)
class PackPlace:
    """Where a packed cell (`harness sweep --pack`) runs in its job."""

    position: int
    """1-based: the cells before it in the pack run first"""
    of: int
    """cells in the pack"""


@dataclass(frozen=True)
class RunEntry:
    """One run of a cell in the manifest: its state and what the launch knows of it (None: not known, and
    absent from the file)."""

    state: str | None = None
    """one of STATES"""
    updated_at: str | None = None
    """ISO-8601 UTC: the last change"""
    status: str | None = None
    """its record's status once it has one (ok, oom, error, …)"""
    reason: str | None = None
    """why it failed or was cancelled: its record's reason, first line (what could not be written, and why, when the
    sweep stopped on a full disk before the record was)"""
    attempt: str | None = None
    """the launch's attempt id: a record of another attempt does not stand for this one"""
    job_id: str | None = None
    """the local or SLURM job id (array jobs: <array>_<index>)"""
    slurm_state: str | None = None
    """SLURM's last seen state of its job (SLURM cells)"""
    nodes: str | None = None
    """SLURM's node list of its job (SLURM cells)"""
    pack: PackPlace | None = None

    def as_dict(self) -> dict[str, Any]:
        """The JSON form: the fields that are known, in order."""
        out: dict[str, Any] = {}
        for f in fields(RunEntry):
            v = getattr(self, f.name)
            if v is not None:
                out[f.name] = {"position": v.position, "of": v.of} if isinstance(v, PackPlace) else v
        return out


RUN_FIELDS = tuple(f.name for f in fields(RunEntry))


@dataclass(frozen=True)
class CellEntry(RunEntry):
    """A cell of the manifest: its first run's fields (as before repeats existed), and its k-th runs (k >= 2,
    `harness sweep --repeat K`) under `repeats`."""

    repeats: Mapping[int, RunEntry] = field(default_factory=dict)
    layout: str | None = None
    """the cell's layout (RunSpec.layout_tag: `tp2 sp`, `pp2 (1f1b)`), absent for plain data parallelism: cells
    that differ only in it share the rest of their run_id, so `harness status` shows it"""

    def runs(self) -> dict[int, RunEntry]:
        """The cell's runs by repeat index, in order: 1 is the cell's own entry."""
        first = RunEntry(**{name: getattr(self, name) for name in RUN_FIELDS})
        return {1: first, **dict(sorted(self.repeats.items()))}

    def as_dict(self) -> dict[str, Any]:
        out = super().as_dict()
        if self.layout:
            out["layout"] = self.layout
        if self.repeats:
            out["repeats"] = {str(k): run.as_dict() for k, run in self.repeats.items()}
        return out


@dataclass(frozen=True)
class SweepHeader:
    """What the manifest says of its sweep: the names of its scenario and cluster, their files' absolute paths and
    the `--set` overrides the scenario was read with (so that `harness history check --confirm` can re-run a cell
    of this sweep)."""

    sweep: str
    scenario: str
    """the scenario as given to `harness sweep`"""
    cluster: str
    """the cluster profile's name"""
    executor: str = "local"
    """local or slurm"""
    scenario_file: str | None = None
    cluster_file: str | None = None
    overrides: tuple[str, ...] = ()
    """`harness sweep --set KEY=VALUE`'s texts, as given (harness.scenario.schema.apply_overrides), in order; absent
    from the file when there are none (and in manifests written before they existed)"""

    def as_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for f in fields(self):
            v = getattr(self, f.name)
            if f.name == "overrides":
                if v:
                    out[f.name] = list(v)
            elif v is not None:
                out[f.name] = v
        return out


HEADER_FIELDS = tuple(f.name for f in fields(SweepHeader))


@dataclass(frozen=True)
class SweepManifest:
    """`results/<sweep>/manifest.json`: the header, the cells by run_id, and the most runs per cell any sweep
    into this folder asked for (`repeat`)."""

    header: SweepHeader
    cells: Mapping[str, CellEntry] = field(default_factory=dict)
    repeat: int = 1

    @property
    def sweep(self) -> str:
        return self.header.sweep

    @property
    def cluster(self) -> str:
        return self.header.cluster

    @property
    def executor(self) -> str:
        return self.header.executor

    def as_dict(self) -> dict[str, Any]:
        """The JSON form, as the file holds it."""
        return {
            **self.header.as_dict(),
            "cells": {run_id: cell.as_dict() for run_id, cell in self.cells.items()},
            "repeat": self.repeat,
        }


# --------------------------------------------------------------------------------------------------
# reading


def read_manifest(path: str | Path) -> SweepManifest:
    """The manifest at `path`; InputError (one line per problem: file, key path, value, what is allowed) when it
    is missing, not JSON, or not a manifest."""
    where = str(path)
    try:
        raw = json.loads(Path(path).read_text())
    except OSError as e:
        raise InputError([Problem(where, "", f"cannot read: {e.strerror or e}")]) from None
    except ValueError as e:
        raise InputError([Problem(where, "", f"not JSON: {e}")]) from None
    return manifest_of(raw, where=where)


def manifest_of(raw: Any, *, where: str) -> SweepManifest:
    """A manifest's JSON form as its type; InputError listing every problem."""
    problems: list[Problem] = []
    if not isinstance(raw, Mapping):
        raise InputError([Problem(where, "", f"{type(raw).__name__} is not a manifest (a JSON object)")])
    header = _header_of(raw, where=where, problems=problems)
    cells: dict[str, CellEntry] = {}
    raw_cells = raw.get("cells", {})
    if not isinstance(raw_cells, Mapping):
        problems.append(Problem(where, "cells", f"{raw_cells!r} is not an object of cells by run_id"))
        raw_cells = {}
    for run_id, cell in raw_cells.items():
        cells[run_id] = _cell_of(cell, where=where, path=f"cells.{run_id}", problems=problems)
    repeat = raw.get("repeat", 1)
    if isinstance(repeat, bool) or not isinstance(repeat, int) or repeat < 1:
        problems.append(Problem(where, "repeat", f"{repeat!r} is not a whole number >= 1"))
        repeat = 1
    if problems:
        raise InputError(problems)
    assert header is not None  # NOTE: a missing header field is a problem above
    return SweepManifest(header=header, cells=cells, repeat=repeat)


def _text(raw: Mapping[str, Any], key: str, *, where: str, path: str, problems: list[Problem]) -> str | None:
    v = raw.get(key)
    if v is None or isinstance(v, str):
        return v
    if key == "job_id" and isinstance(v, int) and not isinstance(v, bool):
        return str(v)
    problems.append(Problem(where, f"{path}.{key}".lstrip("."), f"{v!r} is not a string"))
    return None


def _header_of(raw: Mapping[str, Any], *, where: str, problems: list[Problem]) -> SweepHeader | None:
    values: dict[str, Any] = {
        name: _text(raw, name, where=where, path="", problems=problems) for name in HEADER_FIELDS if name != "overrides"
    }
    overrides = raw.get("overrides", [])
    if isinstance(overrides, list) and all(isinstance(o, str) for o in overrides):
        values["overrides"] = tuple(overrides)
    else:
        problems.append(Problem(where, "overrides", f"{overrides!r} is not a list of KEY=VALUE strings"))
    missing = [name for name in ("sweep", "scenario", "cluster") if values[name] is None]
    problems.extend(
        Problem(where, name, "missing: a manifest names its sweep, scenario and cluster") for name in missing
    )
    if missing:
        return None
    return SweepHeader(**{k: v for k, v in values.items() if v is not None})


def _run_of(raw: Any, *, where: str, path: str, problems: list[Problem]) -> RunEntry:
    if not isinstance(raw, Mapping):
        problems.append(Problem(where, path, f"{raw!r} is not a run (an object)"))
        return RunEntry()
    values: dict[str, Any] = {
        name: _text(raw, name, where=where, path=path, problems=problems) for name in RUN_FIELDS if name != "pack"
    }
    if values["state"] is not None and values["state"] not in STATES:
        problems.append(Problem(where, f"{path}.state", one_of(values["state"], STATES)))
    pack = raw.get("pack")
    if pack is not None:
        ok = isinstance(pack, Mapping) and all(
            isinstance(pack.get(k), int) and not isinstance(pack.get(k), bool) for k in ("position", "of")
        )
        if ok:
            values["pack"] = PackPlace(position=pack["position"], of=pack["of"])
        else:
            problems.append(Problem(where, f"{path}.pack", f"{pack!r} is not {{position, of}} (whole numbers)"))
    return RunEntry(**values)


def _cell_of(raw: Any, *, where: str, path: str, problems: list[Problem]) -> CellEntry:
    first = _run_of(raw, where=where, path=path, problems=problems)
    repeats: dict[int, RunEntry] = {}
    raw_repeats = raw.get("repeats") if isinstance(raw, Mapping) else None
    if raw_repeats is not None and not isinstance(raw_repeats, Mapping):
        problems.append(Problem(where, f"{path}.repeats", f"{raw_repeats!r} is not an object of runs by number"))
    elif raw_repeats:
        for k, run in raw_repeats.items():
            if not (isinstance(k, str) and k.isdigit() and int(k) >= 2):
                problems.append(Problem(where, f"{path}.repeats.{k}", "not a run number >= 2"))
                continue
            repeats[int(k)] = _run_of(run, where=where, path=f"{path}.repeats.{k}", problems=problems)
    layout = _text(raw, "layout", where=where, path=path, problems=problems) if isinstance(raw, Mapping) else None
    return CellEntry(**{name: getattr(first, name) for name in RUN_FIELDS}, repeats=repeats, layout=layout)


# --------------------------------------------------------------------------------------------------
# writing


@contextmanager
def file_lock(path: Path, *, blocking: bool = True) -> Iterator[bool]:
    """An exclusive flock on `path` (created if missing); yields False when non-blocking and already held."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)  # NOTE: the umask decides who else may lock it
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
    """A sweep's handle on its manifest: each cell's state (pending/running/done/failed/skipped/cancelled, and
    submitted: queued on SLURM), status, job id and attempt (SLURM cells also slurm_state and nodes). Every
    update re-reads the file under a lock, so concurrent sweeps into the same dir interleave their updates
    instead of overwriting each other's.

    The writers say what happened to a run through its operations (`submitted`, `running`, `job`, `polled`,
    `ended`, `skipped`), never with free-form fields; each state they write must be one TRANSITIONS allows after
    the file's, or it raises (check_transition).

    Repeats (`harness sweep --repeat K`): a cell's first run is the cell's own entry, as without repeats; its
    k-th run (k >= 2) is `cells[run_id].repeats[k]`, with the same fields. `for_repeat(k)` is a view whose
    operations and `data` address the k-th runs by run_id, so a backend that knows nothing of repeats (SLURM's) follows
    one round of them unchanged."""

    path: Path
    header: SweepHeader
    """what this sweep writes into the header at every update"""
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
        layouts: Mapping[str, str] | None = None,
        scenario_file: str | None = None,
        cluster_file: str | None = None,
        repeats: Sequence[int] = (1,),
        overrides: Sequence[str] = (),
    ) -> Manifest:
        """The sweep's manifest, created or updated: each of `run_ids` gets an entry for each run in `repeats`
        (pending until it is run), and `repeat` records the highest run any sweep into this folder asked for. The
        header is this sweep's, `overrides` (its `--set`) included: the last sweep into a folder names them."""
        header = SweepHeader(
            sweep=sweep,
            scenario=scenario,
            cluster=cluster,
            executor=executor,
            scenario_file=scenario_file,
            cluster_file=cluster_file,
            overrides=tuple(overrides),
        )
        m = cls(sweep_dir(results, sweep) / "manifest.json", header)
        with m._locked() as update:
            now = utc_now()
            cells = dict(update.manifest.cells)
            for run_id in run_ids or []:
                cell = cells.get(run_id) or CellEntry(state="pending", updated_at=now)
                missing = {k: RunEntry(state="pending", updated_at=now) for k in repeats if k >= 2}
                layout = (layouts or {}).get(run_id) or cell.layout
                cells[run_id] = replace(
                    cell, repeats=dict(sorted({**missing, **cell.repeats}.items())), layout=layout or None
                )
            # NOTE: the most runs per cell any sweep into this dir asked for (a later sweep without --repeat does
            # not make the earlier repeats look missing)
            update.manifest = replace(update.manifest, cells=cells, repeat=max(update.manifest.repeat, *repeats))
        keep_reserve(m.path.parent, reserve_bytes(m.path))
        return m

    def for_repeat(self, repeat: int) -> Manifest:
        """This manifest as seen by the k-th run of every cell (see the class docstring)."""
        return Manifest(self.path, self.header, repeat)

    @contextmanager
    def _locked(self) -> Iterator[_Update]:
        """The manifest under the lock, this handle's header in it, for one update; written back (atomically) when
        the block ends. An unreadable or torn file starts afresh, as a new manifest. A write the disk has no room for
        is made again in the space of the folder's reserve (RESERVE), once; WriteFailed when it fails still."""
        with file_lock(self.path.with_name(".manifest.lock")):
            current = SweepManifest(header=self.header)
            if self.path.exists():
                try:
                    current = manifest_of(json.loads(self.path.read_text()), where=str(self.path))
                except (OSError, ValueError):  # NOTE: InputError is a ValueError: a manifest that is not one
                    pass
            header = replace(
                self.header,
                scenario_file=self.header.scenario_file or current.header.scenario_file,
                cluster_file=self.header.cluster_file or current.header.cluster_file,
            )
            update = _Update(replace(current, header=header))
            yield update
            doc = update.manifest.as_dict()
            try:
                atomic_write_json(self.path, doc)
            except WriteFailed as e:
                # NOTE: a full disk: the reserve's space takes this write (a run's end, the sweep's last word on it)
                if e.errno not in (errno.ENOSPC, errno.EDQUOT) or not release_reserve(self.path.parent):
                    raise
                atomic_write_json(self.path, doc)

    # ---- what happens to a run: the writers' operations (the states they may write: TRANSITIONS)

    def submitted(self, run_id: str, *, attempt: str | None, job_id: str, pack: PackPlace | None = None) -> None:
        """Queued on SLURM as `job_id` (<array>_<index> for an array task) under `attempt`, not yet seen running;
        `pack`: its place in a packed job (None leaves the field as it was)."""
        place = {} if pack is None else {"pack": {"position": pack.position, "of": pack.of}}
        self._write(
            run_id,
            state="submitted",
            status=None,
            reason=None,
            attempt=attempt,
            job_id=job_id,
            slurm_state="PENDING",
            nodes="",
            **place,
        )

    def running(self, run_id: str, *, attempt: str | None = None) -> None:
        """Its ranks run: a local cell launched under `attempt`, or a packed cell whose turn came (attempt None: as
        submitted)."""
        extra = {} if attempt is None else {"attempt": attempt}
        self._write(run_id, state="running", status=None, reason=None, **extra)

    def job(self, run_id: str, *, job_id: str) -> None:
        """A local run's job id, once its job exists (its state stays running)."""
        self._write(run_id, job_id=job_id)

    def polled(self, run_id: str, *, slurm_state: str, nodes: str, state: str | None) -> None:
        """What a poll of SLURM saw of the run's job (sacct's state, its node list); `state`: the run's state in flight
        (submitted or running), None once the job ended (its state comes with its record: `ended`)."""
        self._write(run_id, slurm_state=slurm_state, nodes=nodes, **({} if state is None else {"state": state}))

    def ended(self, run_id: str, rec: Record, *, attempt: str | None = None) -> None:
        """The run has its record, just made or found already there (or, when the sweep stopped on a write that
        failed, the record it could not write): the state `cell_state` gives it, its status and, unless it is done or
        skipped, its reason's first line; `attempt`: the launch the record is of (None: unchanged)."""
        extra = {} if attempt is None else {"attempt": attempt}
        state = cell_state(rec)
        reason = reason_line(rec.reason) if state in ("failed", "cancelled") else None
        self._write(run_id, state=state, status=rec.status, reason=reason, **extra)

    def skipped(self, run_id: str) -> None:
        """Not launched (unsupported, more than the cluster can place, predicted not to fit): `Sweep.prepare`."""
        self._write(run_id, state="skipped", status="skipped", reason=None)

    def _write(self, run_id: str, **changes: Any) -> None:
        """Record what is now known of a cell's run (this view's run): RunEntry fields by name (`pack` as
        {position, of}), and the time of the change. A `state` is checked against the file's (check_transition)."""
        unknown = sorted(set(changes) - (set(RUN_FIELDS) - {"updated_at"}))
        if unknown:
            raise TypeError(f"Manifest: not a field a run has: {', '.join(unknown)}")
        with self._locked() as update:
            cells = dict(update.manifest.cells)
            cell = cells.get(run_id, CellEntry())
            run = cell.runs().get(self.repeat, RunEntry())
            known = {**run.as_dict(), **changes, "updated_at": utc_now()}
            problems: list[Problem] = []
            path = f"cells.{run_id}" + (f".repeats.{self.repeat}" if self.repeat > 1 else "")
            merged = _run_of(
                {k: v for k, v in known.items() if v is not None}, where=str(self.path), path=path, problems=problems
            )
            if problems:
                raise InputError(problems)
            if "state" in changes:
                check_transition(run.state, merged.state, where=f"{self.path}: {path}")
            if self.repeat > 1:
                cells[run_id] = replace(cell, repeats={**cell.repeats, self.repeat: merged})
            else:
                cells[run_id] = replace(cell, **{name: getattr(merged, name) for name in RUN_FIELDS})
            update.manifest = replace(update.manifest, cells=cells)

    @property
    def data(self) -> SweepManifest:
        """The manifest as the file holds it now; a view for run k >= 2 holds each cell's k-th run as the cell
        (cells without one left out). InputError when the file is not a manifest."""
        data = read_manifest(self.path)
        if self.repeat > 1:
            runs = {run_id: c.repeats.get(self.repeat) for run_id, c in data.cells.items()}
            cells = {
                run_id: CellEntry(**{name: getattr(run, name) for name in RUN_FIELDS})
                for run_id, run in runs.items()
                if run is not None
            }
            data = replace(data, cells=cells)
        return data


@dataclass
class _Update:
    """The manifest being updated under the lock (a `_locked` block replaces it)."""

    manifest: SweepManifest


def check_transition(before: str | None, after: str | None, *, where: str) -> None:
    """Refuse a state TRANSITIONS does not allow after `before`: a writer's bug, not the user's input, so a
    RuntimeError naming both states and the run (`where`)."""
    if after not in TRANSITIONS[before]:
        allowed = ", ".join(s for s in STATES if s in TRANSITIONS[before])
        raise RuntimeError(
            f"{where}: a run cannot go from {before or 'no state'} to {after} (from {before or 'no state'}: {allowed})"
        )


REASON_CHARS = 300
"""the most of a record's reason a manifest keeps (its first line; the record has all of it)"""


def reason_line(reason: str | None) -> str | None:
    """The first line of a reason, at most REASON_CHARS long, as the manifest keeps it."""
    if not reason or not reason.strip():
        return None
    line = reason.strip().splitlines()[0]
    return line if len(line) <= REASON_CHARS else line[: REASON_CHARS - 1] + "…"


RESERVE = ".manifest.reserve"
"""a file of spare space beside the manifest (hidden from every reader): when the disk fills mid-sweep, removing it
lets the manifest say how the run it was at ended, instead of leaving the run `running`"""
RESERVE_MIN_BYTES = 64 * 2**10
"""the smallest reserve (B); it is at least twice the manifest, whose rewrite it has to hold"""


def reserve_bytes(manifest: Path) -> int:
    """The reserve's size for this manifest (B)."""
    try:
        size = manifest.stat().st_size
    except OSError:
        size = 0
    return max(RESERVE_MIN_BYTES, 2 * size)


def keep_reserve(folder: Path, size: int) -> None:
    """Make the reserve in `folder` at least `size` bytes, allocated on the disk (posix_fallocate: a sparse file
    would free nothing); where there is no room for it, there is none (the next sweep into the folder tries again)."""
    path = folder / RESERVE
    try:
        if path.stat().st_size >= size:
            return
    except FileNotFoundError:
        pass
    except OSError:
        return
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o666)
    except OSError:
        return
    try:
        if hasattr(os, "posix_fallocate"):
            os.posix_fallocate(fd, 0, size)
        else:  # NOTE: macOS has no posix_fallocate: the bytes are written
            os.pwrite(fd, b"\0" * size, 0)
    except OSError:
        path.unlink(missing_ok=True)
    finally:
        os.close(fd)


def release_reserve(folder: Path) -> bool:
    """Remove the reserve in `folder`, freeing its space; False when there was none."""
    try:
        (folder / RESERVE).unlink()
    except OSError:
        return False
    return True


def cell_state(rec: Record) -> str:
    """The manifest state of a cell that has its record (the one mapping from a record's status to a state)."""
    return {"ok": "done", "skipped": "skipped", "cancelled": "cancelled"}.get(rec.status, "failed")
