"""The sweep: every cell of a scenario, each ending in exactly one record. Local cells run one after another
(harness.launch.local); SLURM cells are all submitted at once, as job arrays or packs, then finalized as they end
(harness.launch.slurm). Around them the sweep skips cells that need no run (an ok record exists, unsupported,
predicted not to fit), keeps the manifest, and holds each cell's lock so that two sweeps never run the same cell.

**Repeats** (`repeat=K`): every cell runs K times, in rounds — run 1 of every cell, then run 2 of every cell, … —
so that the runs of one cell are spread over the sweep and sample the noise *between* runs (another job on the
node, clocks, thermal state), which is what `harness compare` then judges on. Each run is its own record: the k-th
has `repeat: k` and the file `<run_id>.r<k>.json` (the first keeps `<run_id>.json` and no field, so sweeps without
repeats, their baselines and histories are as before). On SLURM the rounds are submitted in order, each once the
previous one has ended. A run k >= 2 is launched with its own results root, `<sweep>/.repeats/r<k>/` (hidden from
every reader), where the backends write its record, fragments and markers exactly as for a first run, without
knowing of repeats; the sweep then files the record under its repeat's name. Re-running a sweep runs only the
runs without an ok record.

Why a module of its own: this is the only place that knows about every backend; the backends share launch/core
and know nothing of each other or of the sweep.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from contextlib import ExitStack, nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

from harness.core.errors import InputError, Problem
from harness.launch.core.manifest import Manifest, file_lock
from harness.launch.core.outcome import FAILED, describe, skipped_record
from harness.launch.core.payload import make_payload, predict
from harness.launch.local import prefork
from harness.launch.local.launchers import launch_submitit, local_gpus
from harness.launch.slurm.jobs import SlurmSweep, preflight
from harness.plan.placement import Capacity, capacity, placement_refusal
from harness.results.schema import Record
from harness.results.store import check_writable_dir, read_record, record_path, sweep_dir, write_record
from harness.scenario.cluster import Cluster
from harness.scenario.schema import RunSpec, Scenario
from harness.worker.env import git_sha


@dataclass
class SweepResult:
    records: list[Record]
    results_dir: Path
    wall_s: float
    in_flight: int = 0
    """cells left running on SLURM by a detached (--no-wait) sweep"""

    @property
    def failed(self) -> list[Record]:
        return [r for r in self.records if r["status"] in FAILED]


MAX_REPEAT = 100
"""the most runs per cell `--repeat` takes (a typo such as 10**9 is refused, not started)"""


def check_repeat(repeat: object, *, option: str = "--repeat") -> int:
    """`repeat` as a run count in 1..MAX_REPEAT; InputError (exit 2) naming the option otherwise."""
    if isinstance(repeat, bool) or not isinstance(repeat, int) or not 1 <= repeat <= MAX_REPEAT:
        raise InputError(
            [Problem(option, "", f"{repeat!r} is not a whole number of runs per cell from 1 to {MAX_REPEAT}")]
        )
    return repeat


def staging_root(results: str | Path, sweep: str, repeat: int) -> Path:
    """Where the backends write a run k >= 2 (its record, fragments, markers) before the sweep files its record:
    a results root of its own, hidden under the sweep's folder. Run 1 uses `results` itself."""
    if repeat <= 1:
        return Path(results)
    return sweep_dir(results, sweep) / ".repeats" / f"r{repeat}"


def file_repeat(rec: Record, *, results: str | Path, repeat: int) -> Record:
    """A run k >= 2's record, from where its backend wrote it, to its own name beside the cell's first record
    (with `repeat: k`); run 1's is returned as it is."""
    if repeat <= 1:
        return rec
    filed = cast(Record, {**rec, "repeat": repeat})
    write_record(results, filed)
    staged = record_path(staging_root(results, rec["sweep"], repeat), rec["sweep"], rec["run_id"])
    staged.unlink(missing_ok=True)
    return filed


def _staged_ok(results: str | Path, sweep: str, run_id: str, repeat: int) -> Record | None:
    """A run k >= 2 that ended ok but whose record was not filed yet (the sweep stopped in between): filed now."""
    if repeat <= 1:
        return None
    try:
        rec = read_record(record_path(staging_root(results, sweep, repeat), sweep, run_id))
    except ValueError:
        return None
    return file_repeat(rec, results=results, repeat=repeat) if rec["status"] == "ok" else None


def existing_ok(results: str | Path, sweep: str, run_id: str, *, repeat: int = 1) -> bool:
    try:
        if read_record(record_path(results, sweep, run_id, repeat=repeat))["status"] == "ok":
            return True
    except ValueError:
        pass
    return _staged_ok(results, sweep, run_id, repeat) is not None


def runs_recorded(results: str | Path, sweep: str, run_id: str) -> int:
    """The highest run index with a record file for this cell (0: none)."""
    folder = sweep_dir(results, sweep)
    found = [1] if record_path(results, sweep, run_id).exists() else []
    for p in folder.glob(f"{run_id}.r*.json"):
        k = p.name[len(run_id) + 2 : -len(".json")]
        if k.isdigit():
            found.append(int(k))
    return max(found, default=0)


def run_sweep(
    scenario: Scenario,
    cluster: Cluster,
    *,
    results: str | Path,
    force: bool = False,
    no_skip: bool = False,
    only: set[str] | None = None,
    no_wait: bool = False,
    pack: bool = False,
    echo: Callable[[str], None] = print,
    repeat: int = 1,
    append: bool = False,
) -> SweepResult:
    """Run every cell of a scenario, each ending in one record: locally one after another; on SLURM all
    submitted at once (job arrays, or with `pack` one job per job shape running its cells back to back), then
    each finalized as it ends — or left running with `no_wait`.

    `repeat` K: every cell K times, in rounds (see the module docstring); with `no_wait` the sweep returns after
    the first round it left running, and a re-run goes on from there. `append`: K *more* runs of each cell,
    numbered after the highest run any of them has recorded (`history check --confirm`); the records returned
    are then only the new runs'."""
    t0 = time.time()
    repeat = check_repeat(repeat)
    results = Path(results)
    specs = scenario.expand(gpus_per_node=cluster.gpus_per_node)
    if only is not None:
        specs = [s for s in specs if s.run_id in only]
    first = 1 + (max((runs_recorded(results, scenario.name, s.run_id) for s in specs), default=0) if append else 0)
    rounds = list(range(first, first + repeat))
    # NOTE: before anything is written or launched: an unwritable results dir is one line (InputError), not a
    # traceback from the manifest's lock
    check_writable_dir(sweep_dir(results, scenario.name), option="--results")
    # what the cluster can place (harness.plan.placement): read once, before the first cell
    cap = capacity(cluster, gpus=local_gpus)
    if cluster.executor == "slurm":
        preflight(cluster)  # NOTE: before the manifest: a cluster that cannot take jobs leaves nothing behind
    elif no_wait or pack:
        raise ValueError(
            f"{'no_wait' if no_wait else 'pack'} needs a SLURM profile: local cells run as children of the sweep"
        )
    sha = git_sha()
    manifest = Manifest.open(
        results,
        scenario.name,
        scenario=scenario.path,
        cluster=cluster.name,
        executor=cluster.executor,
        run_ids=[s.run_id for s in specs],
        scenario_file=str(Path(scenario.path).resolve()),
        cluster_file=str(Path(cluster.path).resolve()) if cluster.path else None,
        repeats=rounds,
    )
    folder = sweep_dir(results, scenario.name) / ".submitit"
    locks = sweep_dir(results, scenario.name) / ".locks"
    sweep: dict[str, Any] = dict(
        scenario=scenario,
        cluster=cluster,
        results=results,
        force=force,
        no_skip=no_skip,
        manifest=manifest,
        sha=sha,
        echo=echo,
        capacity=cap,
    )
    repeated = len(rounds) > 1 or rounds[0] > 1
    if cluster.executor == "slurm":
        on_slurm: list[Record] = []
        in_flight = 0
        for k in rounds:
            if repeated:
                echo(f"run {k} of each cell ({len(specs)} cells)")
            got, in_flight = _run_on_slurm(
                specs,
                folder=folder,
                locks=locks,
                no_wait=no_wait,
                pack=pack,
                repeat=k,
                **{**sweep, "manifest": manifest.for_repeat(k)},
            )
            on_slurm += got
            if in_flight:  # NOTE: --no-wait: the next round starts once this one has ended (a re-run goes on)
                if k != rounds[-1]:
                    echo(f"runs {k + 1}..{rounds[-1]} are submitted once run {k} has ended: re-run the sweep then")
                break
        return SweepResult(
            records=on_slurm,
            results_dir=sweep_dir(results, scenario.name),
            wall_s=time.time() - t0,
            in_flight=in_flight,
        )
    records: list[Record] = []
    # ranks of local CPU cells fork from one warm interpreter instead of importing torch each
    # (harness.launch.local.prefork)
    with (
        prefork.zygote(cluster.env, label=str(sweep_dir(results, scenario.name)))
        if cluster.device == "cpu"
        else nullcontext()
    ):
        total = len(specs) * len(rounds)
        for r, k in enumerate(rounds):
            for i, spec in enumerate(specs, 1):
                tag = f"[{r * len(specs) + i}/{total}] {spec.run_id}" + (f" run {k}" if repeated else "")
                with file_lock(locks / f"{spec.run_id}.lock", blocking=False) as mine:
                    if not mine:
                        rec = _record_of_other_sweep(
                            spec, tag=tag, locks=locks, results=results, sweep=scenario.name, echo=echo, repeat=k
                        )
                        if rec is not None:
                            records.append(rec)
                            continue
                    one = _run_cell(
                        spec, tag=tag, folder=folder, repeat=k, **{**sweep, "manifest": manifest.for_repeat(k)}
                    )
                    if one is not None:
                        records.append(one)
    return SweepResult(records=records, results_dir=sweep_dir(results, scenario.name), wall_s=time.time() - t0)


def _record_of_other_sweep(
    spec: RunSpec,
    *,
    tag: str,
    locks: Path,
    results: Path,
    sweep: str,
    echo: Callable[[str], None],
    repeat: int = 1,
) -> Record | None:
    """Wait until the sweep that holds the cell's lock lets go; its record of this run, or None when it left
    none."""
    echo(f"{tag}  running in another sweep; waiting for its record")
    with file_lock(locks / f"{spec.run_id}.lock"):
        pass
    try:
        rec = read_record(record_path(results, sweep, spec.run_id, repeat=repeat))
    except ValueError:
        return None
    echo(f"{tag}  {describe(rec)}  (recorded by the other sweep)")
    return rec


def _prepare_cell(
    spec: RunSpec,
    *,
    tag: str,
    scenario: Scenario,
    cluster: Cluster,
    results: Path,
    force: bool,
    no_skip: bool,
    manifest: Manifest,
    sha: str | None,
    echo: Callable[[str], None],
    capacity: Capacity,
    repeat: int = 1,
) -> tuple[Record | None, dict | None]:
    """(record, None) for a run that needs no launch (an ok record exists, or the cell is skipped: unsupported,
    more than the cluster can place, predicted not to fit), else (None, payload). A skipped cell has one record,
    its first run's: its runs k >= 2 are (None, None)."""
    if not force and existing_ok(results, scenario.name, spec.run_id, repeat=repeat):
        echo(f"{tag}  ok (already recorded; --force reruns)")
        manifest.set(spec.run_id, state="done", status="ok")
        return read_record(record_path(results, scenario.name, spec.run_id, repeat=repeat)), None
    predicted = predict(spec, cluster)
    reason = spec.unsupported_reason(cluster.device)
    if reason is None:
        reason = placement_refusal(spec, cluster, capacity)
    if reason is None and predicted is not None and predicted.get("fits") is False and not no_skip:
        reason = f"predicted not to fit: {predicted.get('reason')} (--no-skip runs it)"
    if reason is not None:
        manifest.set(spec.run_id, state="skipped", status="skipped")
        if repeat > 1:
            echo(f"{tag}  skipped (as its first run)")
            return None, None
        rec = skipped_record(
            spec, sweep=scenario.name, cluster=cluster, results=results, reason=reason, predicted=predicted
        )
        echo(f"{tag}  skipped: {reason}")
        return rec, None
    root = staging_root(results, scenario.name, repeat)
    return None, make_payload(spec, sweep=scenario.name, cluster=cluster, results=root, sha=sha, predicted=predicted)


def _run_cell(
    spec: RunSpec,
    *,
    tag: str,
    scenario: Scenario,
    cluster: Cluster,
    results: Path,
    force: bool,
    no_skip: bool,
    manifest: Manifest,
    folder: Path,
    sha: str | None,
    echo: Callable[[str], None],
    capacity: Capacity,
    repeat: int = 1,
) -> Record | None:
    """One run of one local cell: its record (None: a skipped cell's run k >= 2, which has none)."""
    rec, payload = _prepare_cell(
        spec,
        tag=tag,
        scenario=scenario,
        cluster=cluster,
        results=results,
        force=force,
        no_skip=no_skip,
        manifest=manifest,
        sha=sha,
        echo=echo,
        capacity=capacity,
        repeat=repeat,
    )
    if rec is not None or payload is None:
        return rec
    manifest.set(spec.run_id, state="running", status=None, attempt=payload["attempt"])
    c0 = time.time()
    try:
        rec = launch_submitit(
            payload,
            cluster=cluster,
            folder=folder,
            time_limit_s=spec.settings.time_limit_s,
            on_submit=lambda job: manifest.set(spec.run_id, job_id=str(job.job_id)),
        )
    except KeyboardInterrupt:
        manifest.set(spec.run_id, state="cancelled", status="cancelled")
        echo(f"{tag}  cancelled (interrupted; re-run the sweep to resume)")
        raise
    rec = file_repeat(rec, results=results, repeat=repeat)
    manifest.set(spec.run_id, state="done" if rec["status"] == "ok" else "failed", status=rec["status"])
    echo(f"{tag}  {describe(rec)}  ({time.time() - c0:.1f} s)")
    return rec


def _run_on_slurm(
    specs: list[RunSpec],
    *,
    scenario: Scenario,
    results: Path,
    locks: Path,
    echo: Callable[[str], None],
    repeat: int = 1,
    **sweep: Any,
) -> tuple[list[Record], int]:
    """(records, cells left in flight) of run `repeat` of every cell, through _slurm_round; a cell another sweep
    was handling is taken from its record, or, when that sweep let go without one (it detached), in a second
    round."""
    tags = {s.run_id: f"[{i}/{len(specs)}] {s.run_id}" for i, s in enumerate(specs, 1)}
    records: dict[str, Record] = {}
    in_flight = 0
    todo = specs
    for _ in range(2):
        busy, left = _slurm_round(
            todo,
            tags=tags,
            records=records,
            scenario=scenario,
            results=results,
            locks=locks,
            echo=echo,
            repeat=repeat,
            **sweep,
        )
        in_flight += left
        todo = []
        for spec in busy:
            rec = _record_of_other_sweep(
                spec,
                tag=tags[spec.run_id],
                locks=locks,
                results=results,
                sweep=scenario.name,
                echo=echo,
                repeat=repeat,
            )
            if rec is None:
                todo.append(spec)
            else:
                records[spec.run_id] = rec
        if not todo:
            break
    for spec in todo:
        echo(f"{tags[spec.run_id]}  left to another sweep (no record yet); re-run to collect it")
    return [records[s.run_id] for s in specs if s.run_id in records], in_flight


def _slurm_round(
    specs: list[RunSpec],
    *,
    tags: dict[str, str],
    records: dict[str, Record],
    scenario: Scenario,
    cluster: Cluster,
    results: Path,
    force: bool,
    no_skip: bool,
    no_wait: bool,
    pack: bool,
    manifest: Manifest,
    folder: Path,
    locks: Path,
    sha: str | None,
    echo: Callable[[str], None],
    capacity: Capacity,
    repeat: int = 1,
) -> tuple[list[RunSpec], int]:
    """Re-attach to the jobs an earlier sweep left queued or running, submit every other cell that needs a run
    (job arrays; with `pack`, one job per pack of same-shaped cells), then finalize each as it ends — unless
    `no_wait`. Fills `records`; returns the cells another sweep holds and how many cells were left in flight."""
    busy: list[RunSpec] = []
    with ExitStack() as held:  # each cell's lock, for as long as this sweep is responsible for the cell
        flight = SlurmSweep(cluster, folder=folder, manifest=manifest, echo=echo)
        to_submit = []
        for spec in specs:
            tag = tags[spec.run_id]
            if not held.enter_context(file_lock(locks / f"{spec.run_id}.lock", blocking=False)):
                busy.append(spec)
                continue
            if flight.reattach(spec.run_id, tag=tag):
                continue
            rec, payload = _prepare_cell(
                spec,
                tag=tag,
                scenario=scenario,
                cluster=cluster,
                results=results,
                force=force,
                no_skip=no_skip,
                manifest=manifest,
                sha=sha,
                echo=echo,
                capacity=capacity,
                repeat=repeat,
            )
            if rec is not None:
                records[spec.run_id] = rec
            elif payload is not None:
                to_submit.append((payload, tag))
        try:
            ended = flight.submit(to_submit, pack=pack)
            if not no_wait:
                ended.update(flight.wait())
            records.update({k: file_repeat(r, results=results, repeat=repeat) for k, r in ended.items()})
        except KeyboardInterrupt:
            # NOTE: an interrupted sweep cancels its jobs and records them cancelled, as the local path does (a
            # re-run resubmits them); detaching is what --no-wait is for
            flight.cancel_all(reason="the sweep was interrupted")
            raise
        return busy, flight.detach() if no_wait else 0
