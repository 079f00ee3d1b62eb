"""Does `harness tune` find the grid's best while measuring a fraction of it? (issue 17)

    .venv/bin/python bench/bench_tune.py [--scenario scenarios/tune-bench.yaml] [--results DIR] [--seeds 5]
                                         [--grid-repeat 3] [--cluster local] [--uncalibrated]

1. `harness sweep SCENARIO --repeat 3` measures the whole grid (112 cells of scenarios/tune-bench.yaml, each run 3
   times, in rounds: the noise between runs is what a best is judged on) into DIR/grid; its wall time is the
   grid's measurement time (kept in DIR/grid.wall, so an existing DIR resumes without re-measuring);
2. `harness tune SCENARIO --seed S` for each seed, into DIR/tune-S (a fresh search each: no record is shared with
   the grid or another seed); its wall time, start to end of the command, is the tune's. `--uncalibrated`: each
   seed's search starts as on a fresh clone, with no calibration (an empty HARNESS_CALIBRATION_DIR of its own,
   DIR/cal-S), so its wall time includes the quick calibration `harness tune` makes first;
3. per seed and (model, gpus) group: the winner's throughput as the grid measured it (median of its 3 runs) against
   the grid's best cell's, and `harness compare`'s run-level test between their grid runs. The target: within 5%
   of the best, or not distinguishable from it (p >= 0.05), in every run, with each tune taking <= 20% of the
   grid's time. Also the time model's rank correlation on the grid, and where the grid's best stood in the
   predicted order. Prints figures; asserts nothing. A quiet machine: each run's timing is the figure.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from harness.compare.stats import run_level_p
from harness.results.store import load_records
from harness.tune.log import check_tune_log

REPO = Path(__file__).resolve().parents[1]
METRIC = "tokens_per_s_per_gpu"


def harness(*args: str, capture: bool = False, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "harness.cli", *args], capture_output=capture, text=True, env=env)


def load() -> str:
    return "load average " + ", ".join(f"{x:.2f}" for x in os.getloadavg()) + f" on {os.cpu_count()} CPUs"


def spearman(a: list[float], b: list[float]) -> float:
    from scipy.stats import spearmanr

    return float(spearmanr(a, b).statistic)


def grid_cells(folder: Path) -> dict[str, dict]:
    """run_id → {spec, runs (the metric per ok run), predicted (tokens/s/GPU or None)}."""
    records, _ = load_records(folder)
    cells: dict[str, dict] = {}
    for r in records:
        c = cells.setdefault(r.run_id, {"spec": r.spec, "runs": [], "predicted": None})
        if r.ok and r.metrics.tokens_per_s_per_gpu:
            c["runs"].append(r.metrics.tokens_per_s_per_gpu)
        c["predicted"] = (r.predicted.tokens_per_s_per_gpu if r.predicted else None) or c["predicted"]
    return cells


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scenario", default=str(REPO / "scenarios" / "tune-bench.yaml"))
    ap.add_argument("--cluster", default="local")
    ap.add_argument("--results", default=None, help="results dir (default: a fresh temp dir); an existing one resumes")
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("--grid-repeat", type=int, default=3)
    ap.add_argument("--uncalibrated", action="store_true", help="each search starts with no calibration")
    a = ap.parse_args()
    root = Path(a.results or tempfile.mkdtemp(prefix="bench-tune-"))
    root.mkdir(parents=True, exist_ok=True)
    print(f"bench_tune: {a.scenario} on {a.cluster}; results in {root}; start: {load()}", flush=True)

    wall_file = root / "grid.wall"
    if wall_file.exists():
        grid_s = float(wall_file.read_text())
        print(f"grid: measured before in {grid_s:.0f} s (delete {wall_file} to re-measure)")
    else:
        t0 = time.time()
        rc = harness(
            "sweep", a.scenario, "--cluster", a.cluster, "--results", str(root / "grid"), "--repeat", str(a.grid_repeat)
        ).returncode
        grid_s = time.time() - t0
        if rc not in (0, 1):
            sys.exit(f"grid sweep exited {rc}")
        wall_file.write_text(f"{grid_s:.3f}\n")
        print(f"grid: {grid_s:.0f} s; end: {load()}", flush=True)
    (sweep,) = [p for p in (root / "grid").iterdir() if p.is_dir()]
    cells = grid_cells(sweep)
    groups: dict[tuple[str, int], dict[str, dict]] = {}
    for rid, c in cells.items():
        if len(c["runs"]) >= 2:
            groups.setdefault((c["spec"].model, c["spec"].gpus), {})[rid] = c
    best = {}
    for key, cs in sorted(groups.items()):
        rid = max(cs, key=lambda r: statistics.median(cs[r]["runs"]))
        best[key] = rid
        pred = [(r, c["predicted"]) for r, c in cs.items() if c["predicted"]]
        rho = spearman([p for _, p in pred], [statistics.median(cs[r]["runs"]) for r, _ in pred]) if pred else None
        order = sorted(pred, key=lambda x: -x[1])
        at = next((i for i, (r, _) in enumerate(order, 1) if r == rid), None)
        spread = statistics.median(
            (max(c["runs"]) - min(c["runs"])) / statistics.median(c["runs"]) for c in cs.values()
        )
        print(
            f"grid {key[0]} on {key[1]} GPUs: {len(cs)} cells measured ok; best {rid} "
            f"{statistics.median(cs[rid]['runs']):,.0f} tok/s/GPU; time model Spearman "
            f"{rho if rho is None else f'{rho:.3f}'} over {len(pred)} predicted; the best is #{at} predicted; "
            f"median spread of a cell's runs {spread:.1%}"
        )

    rows, fractions, passes = [], [], 0
    for seed in range(a.seeds):
        env = None
        if a.uncalibrated:
            (root / f"cal-{seed}").mkdir(exist_ok=True)
            env = dict(os.environ, HARNESS_CALIBRATION_DIR=str(root / f"cal-{seed}"))
        t0 = time.time()
        p = harness(
            "tune", a.scenario, "--cluster", a.cluster, "--results", str(root / f"tune-{seed}"), "--seed", str(seed),
            "--format", "json", capture=True, env=env,
        )  # fmt: skip
        tune_s = time.time() - t0
        if p.returncode not in (0, 1):
            sys.exit(f"tune seed {seed} exited {p.returncode}: {p.stderr[-2000:]}")
        log = check_tune_log(json.loads(p.stdout))
        fractions.append(tune_s / grid_s)
        cal = log.calibration
        made = f"quick calibration {cal.seconds:.0f} s, " if cal and cal.made_by_tune and cal.seconds else ""
        measured = sum(c.was_run() for g in log.groups for c in g.candidates)
        total = sum(len(g.candidates) for g in log.groups)
        print(f"tune seed {seed}: {made}{measured} of {total} candidates measured; calibration "
              f"{cal.path if cal and cal.path else (cal.note if cal else 'n/a')}")  # fmt: skip
        for g in log.groups:
            key = (g.model, g.gpus)
            cs, b = groups[key], best[key]
            w = g.winner
            if w is None or w not in cs:
                rows.append((seed, key, "no winner", None, None, None, g.verdict, log.trials, tune_s, False))
                continue
            vw, vb = cs[w]["runs"], cs[b]["runs"]
            ratio = statistics.median(vw) / statistics.median(vb)
            pv = 1.0 if w == b else run_level_p(vw, vb)
            rank = 1 + sum(statistics.median(c["runs"]) > statistics.median(vw) for c in cs.values())
            ok = ratio >= 0.95 or pv >= 0.05
            passes += ok
            label = g.label_of("winner")
            rows.append((seed, key, label, rank, ratio, pv, g.verdict, log.trials, tune_s, ok))
        print(f"tune seed {seed}: {tune_s:.0f} s ({tune_s / grid_s:.1%} of the grid), {log.trials} trials; "
              f"{load()}", flush=True)  # fmt: skip

    print()
    print("| seed | model, GPUs | winner | grid rank | vs grid best | p vs best | verdict | trials | tune s | pass |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for seed, key, label, rank, ratio, pv, verdict, trials, tune_s, ok in rows:
        shown = f"{ratio:.3f}" if ratio is not None else "n/a"
        pshown = f"{pv:.3g}" if pv is not None else "n/a"
        print(f"| {seed} | {key[0]}, {key[1]} | {label} | {rank} | {shown} | {pshown} | {verdict} | {trials} | "
              f"{tune_s:.0f} | {'yes' if ok else 'NO'} |")  # fmt: skip
    print()
    print(
        f"{passes} of {len(rows)} searches found the best or a cell within 5% of it / not distinguishable from it; "
        f"tune time / grid time: median {statistics.median(fractions):.1%}, max {max(fractions):.1%} "
        f"(target <= 20%); grid {grid_s:.0f} s"
    )


if __name__ == "__main__":
    main()
