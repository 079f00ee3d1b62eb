"""How long `harness report` takes over many records: writes N synthetic records into a temp dir, builds the
report, prints the wall time per stage. Prints figures; asserts nothing about speed.

    .venv/bin/python bench/bench_report.py [--records 10000] [--repeat 3] [--keep]

With --repeat N the report is built N times over the same records and the median of each stage is printed
too. Peak RSS: of this process (records, frame, tables, HTML) and of the largest other process (children: the
processes that read shares of the records, and those that draw the figures). --serial reads every record and
draws every figure in this process (the paths a small report or a one-CPU machine takes), to compare with.
--figure-times then draws each figure once more here, one after the other, and prints its CPU seconds beside
the cost it is registered with (harness.report.figures.registry: what the figures are scheduled by; the per-stage
times only show when the last one finished).

The synthetic set (bench/records_gen.py) looks like several nightly runs of one big matrix: 8 model sizes × 11
strategies × 3 precisions × 5 GPU counts × 3 micro-batch sizes, with OOMs, errors and skips, MFU null for fp32,
and a `comm`/`predicted` section on most records. Values are made up (seeded), only their shape matters here.
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import statistics
import tempfile
import time
from pathlib import Path

from records_gen import write_records  # bench/records_gen.py: the synthetic records, shared with bench_compare.py

from harness.report import build_report, load
from harness.report.figures import figure_makers, schedule
from harness.report.frame import figure_cells


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=10_000)
    parser.add_argument("--repeat", type=int, default=1, help="build the report this many times (median printed)")
    parser.add_argument("--keep", action="store_true", help="keep the temp dir and print its path")
    parser.add_argument("--serial", action="store_true", help="no other processes: read and draw in this one")
    parser.add_argument("--figure-times", action="store_true", help="CPU seconds of each figure, drawn serially")
    args = parser.parse_args()
    if args.serial:
        load.PARALLEL_LOAD_MIN_FILES = schedule.PARALLEL_MIN_CELLS = 2**62
    root = Path(tempfile.mkdtemp(prefix="bench-report-"))
    try:
        t = time.perf_counter()
        write_records(root / "results", args.records)
        print(f"wrote {args.records} synthetic records in {time.perf_counter() - t:.2f} s")
        walls: list[float] = []
        stages: dict[str, list[float]] = {}
        for _ in range(args.repeat):
            shutil.rmtree(root / "report", ignore_errors=True)
            kids = resource.getrusage(resource.RUSAGE_CHILDREN)
            t, cpu = time.perf_counter(), time.process_time()
            result = build_report([root / "results"], out=root / "report")
            wall, cpu = time.perf_counter() - t, time.process_time() - cpu
            now = resource.getrusage(resource.RUSAGE_CHILDREN)
            cpu_kids = now.ru_utime + now.ru_stime - kids.ru_utime - kids.ru_stime
            walls.append(wall)
            for k, v in result["timings_s"].items():
                stages.setdefault(k, []).append(v)
            per_stage = ", ".join(f"{k} {v:.2f} s" for k, v in result["timings_s"].items() if k != "total")
            print(
                f"report over {len(result['frame'])} records ({len(result['cells'])} cells, "
                f"{sum(f.png is not None for f in result['figures'])} figures): {wall:.2f} s wall ({per_stage}); "
                f"CPU {cpu:.2f} s in this process + {cpu_kids:.2f} s in other processes"
            )
        if args.repeat > 1:
            medians = ", ".join(f"{k} {statistics.median(v):.2f} s" for k, v in stages.items() if k != "total")
            print(f"median of {args.repeat}: {statistics.median(walls):.2f} s wall ({medians})")
        rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # NOTE: KiB on Linux
        rss_child = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 2**20
        print(f"peak RSS: {rss:.2f} GiB this process, {rss_child:.2f} GiB largest other process")
        print(f"machine load average over the last minute: {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")
        print(
            f"index.html {result['paths']['html'].stat().st_size / 2**20:.2f} MiB, "
            f"report.md {result['paths']['markdown'].stat().st_size / 2**10:.0f} KiB, "
            f"{len(result['warnings'])} warning(s)"
        )
        if args.figure_times:
            fc = figure_cells(result["cells"])
            times = []
            for maker in figure_makers():
                cpu = time.process_time()
                drawn = maker.draw(fc).png is not None
                spent = time.process_time() - cpu
                times.append(f"{maker.name} {spent:.2f} s{'' if drawn else ' (no data)'} (cost {maker.cost:g})")
            print(f"figures drawn one by one here ({len(fc)} figure cells), CPU: " + ", ".join(times))
        if args.keep:
            print(f"kept: {root}")
    finally:
        if not args.keep:
            shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
