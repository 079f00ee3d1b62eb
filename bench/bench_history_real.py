"""The results history on real runs of this machine (issue 20): N sweeps of this commit are added to a history
(`harness history add`), then two more are checked (`harness history check --confirm K`, as `make nightly` runs it:
no cell should be flagged), then two sweeps with a real slowdown injected into one cell (`inject: {fault: slow,
factor: F}`, through a scenario override written beside the history: an include entry that merges into exactly that
cell; the scenario file itself is not edited) are checked: that cell, and only it, should be flagged. Each checked
night is added after its check, as `make nightly` does. Prints each cell's between-run noise over the history, each
check's exit code and flagged cells (before and after the re-runs of `--confirm`), the slowed cell's values against
its history, wall times and the machine's load; asserts nothing.

    python bench/bench_history_real.py                                   # smoke.yaml, 10 nights (about 25 min)
    python bench/bench_history_real.py --scenario S.yaml --nights 5      # a small one, to see that it works
    python bench/bench_history_real.py --cell "ddp fp32" --factor 1.3 --keep /tmp/hist

A --keep folder resumes: the history nights already swept and added there are not swept again.

`--cell` picks the slowed cell: a run_id, or words that its label (`tiny ddp fp32 g2`) contains; by default the
cell whose step time was quietest over the history nights (a slowdown is only detectable where it stands out of
the cell's own run-to-run noise: the table printed says how far each cell's noise lets it see). `--rank 0` slows
one rank only (default: every rank; the fault's extra work follows a reference step time of each rank, so a
slowdown on every rank does not compound). `--confirm 0` judges on the first runs alone.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from harness.scenario.cluster import load_cluster  # noqa: E402
from harness.scenario.schema import Scenario, load_scenario  # noqa: E402

HARNESS = [sys.executable, "-m", "harness.cli"]


def harness(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([*HARNESS, *args], cwd=REPO, capture_output=True, text=True)


def sweep(scenario: Path, results: Path, cluster: str) -> float:
    t0 = time.time()
    proc = harness("sweep", str(scenario), "--cluster", cluster, "--results", str(results))
    if proc.returncode not in (0, 1):
        sys.exit(f"sweep failed (exit {proc.returncode}):\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}")
    return time.time() - t0


def add(db: str, results: Path, label: str) -> None:
    proc = harness("history", "add", "--db", db, str(results), "--label", label)
    if proc.returncode:
        sys.exit(f"history add failed (exit {proc.returncode}): {proc.stderr[-2000:]}")


def check(db: str, results: Path, confirm: int) -> tuple[int, dict, float]:
    t0 = time.time()
    proc = harness("history", "check", "--db", db, str(results), "--format", "json", "--confirm", str(confirm))
    wall = time.time() - t0
    try:
        return proc.returncode, json.loads(proc.stdout), wall
    except json.JSONDecodeError:
        sys.exit(f"history check gave no JSON (exit {proc.returncode}): {proc.stderr[-2000:]}")


def cell_noise(nights: list[Path]) -> dict[str, tuple[float, float]]:
    """run_id → (σ of its step time's between-run noise over `nights`, as `history check` estimates it; median
    step time in s)."""
    from harness.history.metric_judge import noise_sigma
    from harness.results.store import load_records

    series: dict[str, list[float]] = {}
    for night in nights:
        records, _ = load_records(night)
        for r in records:
            step = r.metrics.step_time_s
            if r.ok and r.repeat_index == 1 and step is not None and step.median is not None:
                series.setdefault(r.run_id, []).append(float(step.median))
    return {
        run_id: (noise_sigma([math.log(v) for v in values]), statistics.median(values))
        for run_id, values in series.items()
        if len(values) >= 3
    }


def pick_cells(
    scenario: Scenario, gpus_per_node: int, wanted: str | None, noise: dict[str, tuple[float, float]]
) -> list[tuple[dict, str, str]]:
    """(matrix combination, run_id, label) of the cells that may be slowed: those `wanted` matches, or every cell
    of `noise`, quietest first."""
    found = []
    for combo in scenario.cells:
        (spec,) = dataclasses.replace(scenario, cells=(combo,)).expand(gpus_per_node=gpus_per_node)
        label = f"{spec.model} {spec.strategy} {spec.precision} g{spec.gpus}"
        if wanted is None or spec.run_id == wanted or all(w in label.split() for w in wanted.split()):
            found.append((combo, spec.run_id, label))
    if wanted is None:
        found = sorted((f for f in found if f[1] in noise), key=lambda f: noise[f[1]][0])
    if not found:
        sys.exit(f"--cell {wanted!r}: no cell of {scenario.path} matches")
    return found


def slowed_scenario(path: Path, out: Path, combo: dict, inject: dict, gpus_per_node: int) -> tuple[Path, str] | None:
    """`path` with one more include entry that merges `inject` into exactly the cell `combo` (written to `out`);
    (the new file, the slowed cell's run_id). None when the override would add or change any other cell (a cell
    that an include entry of the scenario adds cannot be merged into: it is a cell of its own)."""
    doc = yaml.safe_load(path.read_text())
    doc["matrix"].setdefault("include", []).append({**combo, "inject": inject})
    out.write_text(yaml.safe_dump(doc, sort_keys=False))
    before = {s.run_id for s in load_scenario(path).expand(gpus_per_node=gpus_per_node)}
    after = load_scenario(out).expand(gpus_per_node=gpus_per_node)
    slowed = [s for s in after if s.settings.inject == inject]
    others = {s.run_id for s in after if s.settings.inject != inject}
    if len(slowed) != 1 or len(after) != len(before) or not others <= before:
        return None
    return out, slowed[0].run_id


def flagged(doc: dict) -> list[str]:
    return [c["label"] for c in doc["cells"] if any(m["verdict"] == "regression" for m in c["metrics"])]


def flagged_first(doc: dict) -> list[str]:
    """The cells flagged on their first run: those `--confirm` re-ran, and any flagged without re-runs."""
    return [c["label"] for c in doc["cells"] if c.get("confirm")] + [
        label for label in flagged(doc) if not any(c["label"] == label and c.get("confirm") for c in doc["cells"])
    ]


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--scenario", type=Path, default=REPO / "scenarios" / "smoke.yaml")
    ap.add_argument("--cluster", default="local")
    ap.add_argument("--nights", type=int, default=10, help="sweeps added to the history before the checked ones")
    ap.add_argument("--cell", help="the cell to slow: a run_id or words of its label (default: the quietest cell)")
    ap.add_argument("--confirm", type=int, default=3, help="history check --confirm K, as make nightly (0: off)")
    ap.add_argument("--factor", type=float, default=1.3, help="the injected slowdown")
    ap.add_argument("--rank", type=int, help="slow only this rank (default: every rank)")
    ap.add_argument("--keep", type=Path, help="keep the history and sweeps here instead of a temporary folder")
    return ap.parse_args()


def build_history(args: argparse.Namespace, root: Path, db: str, label: str, walls: list, loads: list) -> None:
    """The `--nights` nights of the unchanged scenario, swept and added (a --keep folder resumes)."""
    for n in range(1, args.nights + 1):
        results = root / f"night{n:02d}"
        if (root / f"night{n:02d}.added").exists():  # NOTE: a --keep folder resumes: this night is in the history
            print(f"night {n:2d}: already swept and added", flush=True)
            continue
        walls.append(sweep(args.scenario, results, args.cluster))
        loads.append(os.getloadavg()[0])
        add(db, results, label)
        (root / f"night{n:02d}.added").touch()
        print(f"night {n:2d}: swept in {walls[-1]:.0f} s, added (load {loads[-1]:.1f})", flush=True)


def print_noise(noise: dict, labels: dict[str, str], nights: int) -> None:
    print(f"\nstep time's between-run noise σ over {nights} nights (history check's band: ±k·σ, k 4, wider")
    print("while the history is short; the smallest step it sees on one night is about that band):")
    for run_id, (sigma, median) in sorted(noise.items(), key=lambda kv: kv[1][0]):
        print(f"    {labels.get(run_id, run_id):40s} σ {sigma * 100:5.1f}%  median step {median * 1e3:7.2f} ms")


def choose_slowed(args: argparse.Namespace, scenario, cluster, root: Path, noise: dict) -> tuple[Path, str, str]:
    """(the slowed scenario file, the slowed cell's run_id, its label): the first cell an override can slow."""
    inject = {"fault": "slow", "factor": args.factor} | ({} if args.rank is None else {"rank": args.rank})
    for combo, _, cell_label in pick_cells(scenario, cluster.gpus_per_node, args.cell, noise):
        slowed = slowed_scenario(args.scenario, root / args.scenario.name, combo, inject, cluster.gpus_per_node)
        if slowed is not None:
            return slowed[0], slowed[1], cell_label
        print(f"  ({cell_label}: an include entry's cell, which an override cannot merge into; next)")
    sys.exit(f"no cell of {args.scenario} can be slowed by an override (a cell of the base matrix can)")


def print_step_time(c: dict) -> None:
    """One judged cell's step-time row, with its evidence."""
    st = next((m for m in c["metrics"] if m["metric"] == "step_time_s"), None)
    if not (st and st["value"] is not None and st["reference"] is not None):
        return
    sig = "-" if st["sigmas"] is None else f"{st['sigmas']:+.1f}σ"
    confirmed = ""
    if c.get("confirm"):
        confirmed = f"; --confirm re-runs: {'persisted' if c['confirm']['persisted'] else 'not confirmed'}"
    print(
        f"    {c['label']}: step time {st['value'] * 1e3:.2f} ms vs history median "
        f"{st['reference'] * 1e3:.2f} ms ({(st['change'] or 0) * 100:+.1f}%), noise σ "
        f"{(st['noise'] or 0) * 100:.1f}% over {st['n_history']} runs, {sig}, margin "
        f"{(st['margin'] or 0) * 100:.1f}%: {st['verdict']}" + (f" ({st['cause']})" if st["cause"] else "") + confirmed
    )


def checked_nights(
    args: argparse.Namespace, root: Path, db: str, label: str, slowed: tuple[Path, str, str], walls: list, loads: list
) -> list[tuple[int, str, int, dict]]:
    """Two nights of the same commit, then two with the slowed cell: each swept, checked, then added."""
    slow_file, slow_id, cell_label = slowed
    checks = []
    for n, (what, file) in enumerate(
        [("same commit", args.scenario)] * 2 + [(f"slow x{args.factor} in {cell_label}", slow_file)] * 2,
        start=args.nights + 1,
    ):
        results = root / f"night{n:02d}"
        if (root / f"night{n:02d}.added").exists():  # NOTE: resumed: checked and added before
            print(f"night {n:2d} ({what}): already checked and added", flush=True)
            continue
        walls.append(sweep(file, results, args.cluster))
        loads.append(os.getloadavg()[0])
        code, doc, wall = check(db, results, args.confirm)
        add(db, results, label + ("-slow" if file == slow_file else ""))
        (root / f"night{n:02d}.added").touch()
        checks.append((n, what, code, doc))
        names, first = flagged(doc), flagged_first(doc)
        print(
            f"night {n:2d} ({what}): history check exit {code} in {wall:.1f} s; flagged {len(names)} of "
            f"{len(doc['cells'])} cells: {', '.join(names) or '-'}; on the first run: {', '.join(first) or '-'} "
            f"(load {loads[-1]:.1f})",
            flush=True,
        )
        for c in doc["cells"]:
            if c["run_id"] == slow_id or c["label"] in names or c["label"] in first:
                print_step_time(c)
    return checks


def print_summary(checks: list, cell_label: str, factor: float) -> None:
    same_docs = [doc for n, what, code, doc in checks if what == "same commit"]
    slow = [flagged(doc) for n, what, code, doc in checks if what != "same commit"]
    print(
        f"same commit: {sum(len(flagged(d)) for d in same_docs)} cell(s) flagged over {len(same_docs)} checks "
        f"(expected 0); on the first run {sum(len(flagged_first(d)) for d in same_docs)} (this run's checks only)"
    )
    hit = [cell_label in " ".join(f) for f in slow]
    others = sum(len([x for x in f if not x.startswith(cell_label)]) for f in slow)
    print(
        f"slowed x{factor}: {cell_label} flagged on {sum(hit)} of {len(slow)} nights; other cells flagged: "
        f"{others} (expected: the slowed cell, and only it)"
    )


def main() -> None:
    args = parse_args()
    cluster = load_cluster(args.cluster)
    scenario = load_scenario(args.scenario)
    root = args.keep or Path(tempfile.mkdtemp(prefix="bench-history-real-"))
    root.mkdir(parents=True, exist_ok=True)
    db = str(root / "history.sqlite")
    sha = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True).stdout
    label = sha.strip() or "this-commit"
    specs = scenario.expand(gpus_per_node=cluster.gpus_per_node)
    print(f"{args.scenario} ({len(specs)} cells) on {cluster.name}; history {db}; --confirm {args.confirm}")
    t_start = time.time()
    walls: list[float] = []
    loads: list[float] = []
    try:
        build_history(args, root, db, label, walls, loads)
        noise = cell_noise([root / f"night{n:02d}" for n in range(1, args.nights + 1)])
        print_noise(noise, {s.run_id: f"{s.model} {s.strategy} {s.precision} g{s.gpus}" for s in specs}, args.nights)
        slowed = choose_slowed(args, scenario, cluster, root, noise)
        print(f"slowed cell: {slowed[2]} x{args.factor}\n")
        checks = checked_nights(args, root, db, label, slowed, walls, loads)
        print()
        print_summary(checks, slowed[2], args.factor)
        print(
            f"sweeps: median {statistics.median(walls or [0]):.0f} s; load average (1 min) median "
            f"{statistics.median(loads or [0]):.1f}; wall {time.time() - t_start:.0f} s"
        )
    finally:
        if args.keep is None:
            shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
