"""`harness history check --confirm K`: the cells a check flags re-run K times and judged again on those runs alone,
so that only a regression that persists fails (a first run that was a one-off does not).

Each flagged cell is re-run from its sweep: the scenario and cluster its results dir's manifest names, the runs
written into that results dir as `harness sweep --repeat` would write them. Everything that could stop a re-run
(no manifest, a scenario file gone or edited since, a profile no longer named) is checked for every sweep before
the first one starts.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from harness.core.errors import InputError, Problem
from harness.history.judge import check_entries
from harness.history.keys import Entry, entry_of
from harness.history.store import HistoryStore
from harness.history.verdicts import CellVerdict, HistoryCheck, Rules
from harness.launch.stdout import stdout_to_stderr
from harness.results.store import record_path

if TYPE_CHECKING:
    from harness.scenario.cluster import Cluster
    from harness.scenario.schema import Scenario


def confirm(
    store: HistoryStore, check: HistoryCheck, *, times: int, rules: Rules, echo: Callable[[str], None]
) -> HistoryCheck:
    """Re-run each flagged cell `times` times and judge it again on those runs alone; a cell whose re-runs are
    not a regression any more is not failing (its first run was a one-off). The other cells are as judged.
    `echo` takes the progress lines (stderr: stdout is the check's output)."""
    from harness.launch.sweep import run_sweep

    flagged = [c for c in check.cells if c.regressed]
    by_sweep: dict[Path, list[CellVerdict]] = {}
    for c in flagged:
        by_sweep.setdefault(sweep_of(c), []).append(c)
    plans = [(cs, what_to_rerun(m, {c.run_id for c in cs})) for m, cs in by_sweep.items()]  # all checked first
    new: list[Entry] = []
    for cells, (scenario, cluster, root) in plans:
        echo(f"--confirm: re-running {len(cells)} flagged cell(s) {times} time(s): {', '.join(c.label for c in cells)}")
        with stdout_to_stderr():
            result = run_sweep(
                scenario,
                cluster,
                results=root,
                only={c.run_id for c in cells},
                repeat=times,
                append=True,
                echo=echo,
            )
        for rec in result.records:
            try:
                path = record_path(root, rec.sweep or "", rec.run_id, repeat=rec.repeat_index)
                new.append(entry_of(rec if rec.path else rec.at(str(path))))
            except ValueError as e:
                check.warnings.append(f"--confirm: a re-run's record is unusable: {e}")
    again = check_entries(store, new, rules=rules, sources=check.sources, records=len(new))
    redone = {c.key: c for c in again.cells}
    cells = []
    for c in check.cells:
        if not c.regressed:
            cells.append(c)
            continue
        r = redone.get(c.key)
        if r is None:  # NOTE: no re-run came back (skipped now?): the first verdict stands
            c.notes.append("--confirm: no re-run of this cell came back; the first run's verdict stands")
            cells.append(c)
            continue
        first = [m.metric for m in c.regressions] or ["newly failing"]
        r.confirm = {"runs": times, "first": first, "persisted": r.regressed}
        r.notes.append(f"--confirm: judged on {times} re-run(s) (their median), not on the first run")
        cells.append(r)
    check.cells = cells
    return check


def sweep_of(cell: CellVerdict) -> Path:
    """The manifest of the sweep whose record flagged `cell`: beside the record, as `harness sweep` lays it out."""
    origin = Path(cell.entry.origin) if cell.entry is not None else None
    manifest = origin.parent / "manifest.json" if origin is not None else None
    if manifest is None or not manifest.is_file():
        raise InputError(
            [
                Problem(
                    str(origin or cell.label),
                    "--confirm",
                    f"no sweep manifest beside this record ({manifest}): --confirm re-runs cells of a results dir "
                    "written by `harness sweep`",
                )
            ]
        )
    return manifest


def what_to_rerun(manifest: Path, run_ids: set[str]) -> tuple[Scenario, Cluster, Path]:
    """(scenario, cluster, results root) of the sweep whose manifest this is, the scenario read with the `--set`
    overrides the manifest records (without them its cells would be others); InputError naming what is missing or
    no longer matches (an edited scenario file, a renamed profile)."""
    from harness.launch.core.manifest import read_manifest
    from harness.scenario.cluster import load_cluster
    from harness.scenario.schema import load_scenario

    header = read_manifest(manifest).header
    where = str(manifest)
    scenario_file = header.scenario_file or header.scenario
    cluster_ref = header.cluster_file or header.cluster
    problems = []
    if not scenario_file or not Path(scenario_file).is_file():
        problems.append(
            Problem(where, "scenario", f"the sweep's scenario file {scenario_file!r} is not there to re-run it from")
        )
    if not cluster_ref:
        problems.append(Problem(where, "cluster", "names no cluster profile to re-run on"))
    if problems:
        raise InputError(problems)
    scenario = load_scenario(scenario_file, overrides=header.overrides)
    cluster = load_cluster(cluster_ref)
    if scenario.name != header.sweep:
        raise InputError(
            [Problem(where, "scenario", f"{scenario_file} is now sweep {scenario.name!r}, not {header.sweep!r}")]
        )
    known = {s.run_id for s in scenario.expand(gpus_per_node=cluster.gpus_per_node)}
    gone = sorted(run_ids - known)
    if gone:
        given = f" with --set {' --set '.join(header.overrides)}" if header.overrides else ""
        raise InputError(
            [
                Problem(
                    where,
                    "scenario",
                    f"cell(s) {', '.join(gone)} are not in {scenario_file}{given} any more (edited since the sweep, "
                    "or swept with other --set overrides into the same folder?)",
                )
            ]
        )
    return scenario, cluster, manifest.parent.parent
