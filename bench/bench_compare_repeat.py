"""`harness compare` of two `--repeat 3` sweeps of the same commit, T times (issue 20: exit 0 in at least 19 of 20
trials). Each trial sweeps the reduced scenario (scenarios/repeat-bench.yaml: 6 cells) twice, each sweep with every
cell run 3 times in rounds, then runs `harness compare FIRST SECOND` as a fresh process and records its exit code
and the cells it flagged. Prints every trial's line, the count of exit 0, the run-to-run spread the sweeps saw
(per cell: the relative range of its 3 runs' median step times) and the machine's load; asserts nothing.

    python bench/bench_compare_repeat.py                         # 20 trials (about 30 min on a 2-core machine)
    python bench/bench_compare_repeat.py --trials 1 --repeat 3   # one trial, to see that it works
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
HARNESS = [sys.executable, "-m", "harness.cli"]


def sweep(scenario: Path, results: Path, repeat: int) -> float:
    t0 = time.time()
    proc = subprocess.run(
        [*HARNESS, "sweep", str(scenario), "--results", str(results), "--repeat", str(repeat)],
        cwd=REPO,
        capture_output=True,
        text=True,
    )
    if proc.returncode not in (0, 1):
        sys.exit(f"sweep failed (exit {proc.returncode}):\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}")
    return time.time() - t0


def compare(base: Path, cand: Path) -> tuple[int, dict]:
    proc = subprocess.run(
        [*HARNESS, "compare", str(base), str(cand), "--format", "json"], cwd=REPO, capture_output=True, text=True
    )
    try:
        doc = json.loads(proc.stdout)
    except json.JSONDecodeError:
        sys.exit(f"compare gave no JSON (exit {proc.returncode}):\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}")
    return proc.returncode, doc


def spreads(doc: dict, side: str) -> list[float]:
    """Per cell: (max − min) / median of its runs' median step times on one side (from the records)."""
    from harness.results.store import load_records

    records, _ = load_records(*doc[side]["sources"])
    by_cell: dict[str, list[float]] = {}
    for r in records:
        step = r.metrics.step_time_s
        if r.ok and step is not None and step.median is not None:
            by_cell.setdefault(r.run_id, []).append(float(step.median))
    return [(max(v) - min(v)) / statistics.median(v) for v in by_cell.values() if len(v) > 1]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--trials", type=int, default=20)
    ap.add_argument("--repeat", type=int, default=3, help="runs per cell in each sweep")
    ap.add_argument("--scenario", type=Path, default=REPO / "scenarios" / "repeat-bench.yaml")
    ap.add_argument("--keep", type=Path, help="keep the sweeps here instead of a temporary folder")
    args = ap.parse_args()
    sys.path.insert(0, str(REPO))
    root = args.keep or Path(tempfile.mkdtemp(prefix="bench-compare-repeat-"))
    codes: list[int] = []
    spread: list[float] = []
    loads: list[float] = []
    t_start = time.time()
    try:
        for t in range(1, args.trials + 1):
            a, b = root / f"t{t:02d}-a", root / f"t{t:02d}-b"
            wall = sweep(args.scenario, a, args.repeat) + sweep(args.scenario, b, args.repeat)
            loads.append(os.getloadavg()[0])
            code, doc = compare(a, b)
            codes.append(code)
            spread += spreads(doc, "baseline") + spreads(doc, "candidate")
            flagged = [c["label"] for c in doc["cells"] if c["regressed"]]
            s = doc["summary"]
            print(
                f"trial {t:2d}: exit {code}  {s['regressions']} cell(s) regressed {flagged or ''}  "
                f"{s['not_significant_cells']} not significant, {s['improvements']} improved  "
                f"(sweeps {wall:.0f} s, load {loads[-1]:.1f})",
                flush=True,
            )
    finally:
        if args.keep is None:
            shutil.rmtree(root, ignore_errors=True)
    print()
    print(f"exit 0 in {codes.count(0)} of {len(codes)} trials (target: at least 19 of 20); exit codes {codes}")
    if spread:
        q = statistics.quantiles(spread, n=10) if len(spread) > 1 else [spread[0]] * 9
        print(
            f"run-to-run range of a cell's {args.repeat} run medians: median {statistics.median(spread) * 100:.1f}%, "
            f"p90 {q[-1] * 100:.1f}%, max {max(spread) * 100:.1f}% (over {len(spread)} cell-sweeps)"
        )
    print(f"wall {time.time() - t_start:.0f} s; load average (1 min) median {statistics.median(loads):.1f}")


if __name__ == "__main__":
    main()
