"""What the profiler costs: each traced cell's traced step against its timed steps (issue 33).

    .venv/bin/python bench/bench_trace_cost.py [--scenario scenarios/trace-cost.yaml] [--results DIR] [--repeat N]

Sweeps the scenario (every cell `trace: true`; a fresh temp dir by default, an existing DIR resumes) N times, then
prints per cell and run: the timed steps' median, p10 and p90, the traced step (`metrics.time_s.step`: the median
of the traced steps, whose parts the record carries), their ratio, whether the traced step lies inside p10–p90,
the same for the untraced steps run either side of the traced ones (their median), the profiler's cost (traced /
untraced median), and every traced step as a ratio to the timed median. Then: how many cells were inside (traced,
and untraced: the host's drift alone), the ratios' median and range, and the profiler cost's. The load average
before and after is printed: a loaded host moves both. Prints figures; asserts nothing (no timed assertions in
tests: tests/dist/test_trace.py prints the same comparison for its cell).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from harness.results.store import load_records

REPO = Path(__file__).resolve().parents[1]


def load() -> str:
    return "load average " + ", ".join(f"{x:.2f}" for x in os.getloadavg()) + f" on {os.cpu_count()} CPUs"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scenario", default=str(REPO / "scenarios" / "trace-cost.yaml"))
    ap.add_argument("--cluster", default="local")
    ap.add_argument("--results", default=None, help="results dir (default: a fresh temp dir)")
    ap.add_argument("--repeat", type=int, default=1, help="runs of each cell (harness sweep --repeat)")
    args = ap.parse_args()
    results = Path(args.results or tempfile.mkdtemp(prefix="bench-trace-cost-"))
    print(f"start: {load()}; sweeping into {results}", flush=True)
    t0 = time.perf_counter()
    cmd = [sys.executable, "-m", "harness.cli", "sweep", args.scenario, "--cluster", args.cluster]
    cmd += ["--results", str(results), "--repeat", str(args.repeat)]
    rc = subprocess.run(cmd).returncode
    print(f"sweep exit {rc}, {time.perf_counter() - t0:.0f} s; end: {load()}")
    rows = []
    records, warnings = load_records(results)
    for w in warnings:
        print(f"warning: {w}")
    for rec in sorted(records, key=lambda r: (r.spec.model, r.spec.strategy, r.path or "")):
        t, timed = rec.metrics.time_s, rec.metrics.step_time_s
        if rec.status != "ok" or t is None or t.step is None or timed is None or not timed.median:
            print(f"{rec.run_id}: {rec.status} {rec.reason or 'no traced step'}")
            continue
        ratio = t.step / timed.median
        inside = timed.p10 <= t.step <= timed.p90
        each = " ".join(f"{s / timed.median:.2f}" for s in (t.steps or [t.step]))
        plain = statistics.median(t.untraced_steps) if t.untraced_steps else None
        plain_inside = plain is not None and timed.p10 <= plain <= timed.p90
        rows.append((ratio, inside, plain_inside, t.profiler_cost))
        untraced = (
            f"untraced {plain / timed.median:5.2f}x {'inside' if plain_inside else 'OUTSIDE'}  "
            f"profiler {t.profiler_cost:5.2f}x  "
            if plain is not None and t.profiler_cost is not None
            else ""
        )
        print(
            f"{rec.spec.model:>9} {rec.spec.strategy:<18} timed median {timed.median * 1e3:8.1f} ms "
            f"(p10 {timed.p10 * 1e3:8.1f}, p90 {timed.p90 * 1e3:8.1f})  traced {t.step * 1e3:8.1f} ms  "
            f"{ratio:5.2f}x  {'inside' if inside else 'OUTSIDE'}  {untraced}each traced step: {each}"
        )
    if rows:
        ratios = [r[0] for r in rows]
        costs = [r[3] for r in rows if r[3] is not None]
        print(
            f"inside p10–p90: traced {sum(r[1] for r in rows)} of {len(rows)}, their untraced neighbours "
            f"{sum(r[2] for r in rows)} of {len(rows)}; traced / timed median: median {statistics.median(ratios):.2f}, "
            f"range {min(ratios):.2f}–{max(ratios):.2f}"
        )
        if costs:
            print(
                f"profiler cost (traced / untraced neighbours): median {statistics.median(costs):.2f}, "
                f"range {min(costs):.2f}–{max(costs):.2f}, above 1 in {sum(c > 1 for c in costs)} of {len(costs)}"
            )


if __name__ == "__main__":
    main()
