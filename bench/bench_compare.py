"""How long `harness compare` takes over big result sets: writes N synthetic records (bench/records_gen.py) as a
baseline and a candidate, then times each stage in this process (load, match, judge, render, write) and the
whole command in a child process (wall and peak RSS). Median of --runs. Prints figures; asserts nothing about
speed.

    .venv/bin/python bench/bench_compare.py [--records 10000] [--runs 3] [--differences] [--keep]
    .venv/bin/python bench/bench_compare.py --records 100000 --runs 1 --no-stages   # the memory check
    .venv/bin/python bench/bench_compare.py --records 2000 --differences --write-sets DIR   # sets only

The candidate is an identical copy of the baseline, or with --differences one with seeded changes on ~15% of
the cells (slower, faster, noisy, too few samples, more memory, one more byte, newly failing, newly fixed,
null MFU, another torch, a note; missing, added and rerun cells; one corrupt file), so every verdict, state and
warning shows up.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from records_gen import iter_records  # bench/records_gen.py: the synthetic records, shared with bench_report.py

from harness.compare.judge import compare
from harness.compare.load import load_side
from harness.compare.match import cell_labels, index_by_spec
from harness.compare.render import (
    BENCHMARK_FILES,
    FORMAT_FILES,
    render_benchmark,
    render_json,
    render_markdown,
    render_table,
)
from harness.core.errors import Problem
from harness.results.store import atomic_write_text

# --------------------------------------------------------------------------------------------------
# the candidate set


def _set_samples(rec: dict, samples: list[float]) -> None:
    """New step-time samples; the step-time statistics follow them, and the throughput-like metrics follow
    the median."""
    m = rec["metrics"]
    st = m["step_time_s"]
    srt = sorted(samples)
    factor = statistics.median(srt) / st["median"]
    st.update(
        samples=samples,
        median=statistics.median(srt),
        p10=srt[len(srt) // 10],
        p90=srt[-1 - len(srt) // 10],
        mean=sum(samples) / len(samples),
    )
    for k in ("tokens_per_s", "tokens_per_s_per_gpu", "tflops_per_gpu", "mfu"):
        if m.get(k) is not None:
            m[k] = m[k] / factor


def _scale_time(rec: dict, factor: float, *, keep: int | None = None) -> None:
    """Every step `factor` times as long; keep only the first `keep` samples."""
    _set_samples(rec, [s * factor for s in rec["metrics"]["step_time_s"]["samples"]][:keep])


def _noisy(rec: dict, rng: random.Random) -> None:
    """Samples spread far wider than a threshold (the median moves by chance)."""
    _set_samples(rec, [s * rng.uniform(0.6, 1.6) for s in rec["metrics"]["step_time_s"]["samples"]])


def candidate_records(n: int, seed: int = 0, *, differences: bool) -> list[tuple[str, dict]]:
    """(folder, record) of the candidate set: the baseline's records, with seeded changes when `differences`."""
    out = []
    rng = random.Random(seed + 1)
    template = None  # the metrics of an ok record, given to a newly fixed one
    for folder, rec in iter_records(n, seed):
        if not differences:
            out.append((folder, rec))
            continue
        rec = copy.deepcopy(rec)
        ok = rec["status"] == "ok"
        r = rng.random()
        if ok:
            template = copy.deepcopy(rec["metrics"])
        if not ok:
            if r < 0.3 and template is not None:
                rec.update(status="ok", reason=None, failed_rank=None, metrics=copy.deepcopy(template))
            out.append((folder, rec))
            continue
        if r < 0.02:
            continue  # missing
        if r < 0.04:
            _scale_time(rec, 1.2)
        elif r < 0.06:
            _scale_time(rec, 0.8)
        elif r < 0.07:
            _scale_time(rec, 1.2, keep=3)
        elif r < 0.08:
            _noisy(rec, rng)
        elif r < 0.09:
            rec["metrics"]["peak_memory_allocated_gib"] *= 1.1
        elif r < 0.10 and "comm" in rec:
            rec["comm"]["bytes_per_step"] += 1
        elif r < 0.11:
            rec.update(status="error", reason="RuntimeError: NCCL error\nrank 3 hung", failed_rank=3, metrics={})
        elif r < 0.12:
            rec["metrics"]["mfu"] = None
            rec["metrics"]["null_reasons"] = {"mfu": "no dense peak FLOPS known for this device"}
        elif r < 0.13:
            rec["env"]["torch"] = "2.14.0+cu130"
        elif r < 0.14:
            rec["reason"] = "recompiled at step 3 (timed as step time)"
        elif r < 0.15:
            _scale_time(rec, 1.02)
        elif r < 0.155:
            added = copy.deepcopy(rec)
            added["spec"]["micro_batch"] = 16
            added["run_id"] += "-mb16"
            out.append((folder, added))
        elif r < 0.16:
            rerun = copy.deepcopy(rec)
            rerun["finished_at"] = rerun["finished_at"].replace("T02:", "T05:")
            _scale_time(rerun, 1.5)
            out.append(("rerun", rerun))
        out.append((folder, rec))
    return out


def write_set(root: Path, records: list[tuple[str, dict]], *, corrupt: bool = False) -> None:
    for folder, rec in records:
        (root / folder).mkdir(parents=True, exist_ok=True)
        (root / folder / f"{rec['run_id']}.json").write_text(json.dumps(rec))
    if corrupt:
        (root / "broken.json").write_text('{"schema_version": 1, "run_id": "cut-short"')


def write_sets(root: Path, n: int, *, differences: bool) -> tuple[Path, Path]:
    base, cand = root / "base", root / "cand"
    write_set(base, list(iter_records(n)))
    if differences:
        write_set(cand, candidate_records(n, differences=True), corrupt=True)
    else:
        shutil.copytree(base, cand)
    return base, cand


# --------------------------------------------------------------------------------------------------
# timing


def _timed(fn: Callable[[], object], times: dict[str, float], stage: str):
    t = time.perf_counter()
    out = fn()
    times[stage] = times.get(stage, 0.0) + time.perf_counter() - t
    return out


def stage_times(base: Path, cand: Path, out: Path) -> dict[str, float]:
    """One comparison in this process, stage by stage, the way `harness compare --output-dir` does it. The
    match stage is timed on its own (index_by_spec, cell_labels) and subtracted from compare(), which does it
    again first: `judge` is compare() minus match."""
    t: dict[str, float] = {}
    problems: list[Problem] = []
    notes: list[str] = []

    def load():
        return (
            load_side([base], side="baseline", problems=problems, notes=notes),
            load_side([cand], side="candidate", problems=problems, notes=notes),
        )

    b, c = _timed(load, t, "load")

    def match():
        w: list[str] = []
        bi = index_by_spec(b, side="baseline", ignore=(), warnings_out=w)
        ci = index_by_spec(c, side="candidate", ignore=(), warnings_out=w)
        return cell_labels({**{k: r.spec for k, r in bi.items()}, **{k: r.spec for k, r in ci.items()}})

    _timed(match, t, "match")
    cmp = _timed(lambda: compare(b, c, baseline_sources=[str(base)], candidate_sources=[str(cand)]), t, "judge")
    t["judge"] -= t["match"]
    cmp.warnings[:0] = notes
    texts = _timed(
        lambda: {
            FORMAT_FILES["table"]: render_table(cmp),
            FORMAT_FILES["md"]: render_markdown(cmp),
            FORMAT_FILES["json"]: render_json(cmp),
            **{f: render_benchmark(cmp, d) for d, f in BENCHMARK_FILES.items()},
        },
        t,
        "render",
    )
    _timed(lambda: [atomic_write_text(out / name, text) for name, text in texts.items()], t, "write")
    t["total"] = sum(t.values())
    return t


_CHILD = """
import os, resource, sys
from harness.cli import main
code = main(sys.argv[1:])
with open('/proc/self/status') as f:  # VmHWM: this process's own peak (ru_maxrss would count the bench's)
    peak = int(next(line.split()[1] for line in f if line.startswith('VmHWM:')))
kids = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss  # the largest of the processes it forked (KiB)
with open(os.environ['BENCH_PEAK_FILE'], 'w') as f:
    f.write(str(max(peak, kids)))
sys.exit(code)
"""


def command_run(base: Path, cand: Path, out: Path) -> tuple[float, float, int]:
    """`harness compare BASE CAND --output-dir OUT` in a child process: (wall s, peak RSS GiB, exit code); the peak
    is the largest of the command's process and the processes it forked (the candidate's reader, the JSON
    writer)."""
    peak_file = out.with_name(out.name + ".peak")
    cmd = [sys.executable, "-c", _CHILD, "compare", str(base), str(cand), "--output-dir", str(out)]
    t = time.perf_counter()
    # NOTE: run from the temp dir: `python -c` puts the cwd first on sys.path, so the harness imported is the one
    # this bench imports (PYTHONPATH=<another checkout> times that one)
    code = subprocess.run(
        cmd,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        cwd=out.parent,
        env={**os.environ, "BENCH_PEAK_FILE": str(peak_file)},
    ).returncode
    wall = time.perf_counter() - t
    return wall, int(peak_file.read_text()) * 1024 / 2**30, code


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=10_000, help="records per side")
    parser.add_argument("--runs", type=int, default=3, help="runs of each measurement; medians are printed")
    parser.add_argument("--differences", action="store_true", help="a candidate with seeded changes")
    parser.add_argument("--no-stages", action="store_true", help="only the command in a child process")
    parser.add_argument("--write-sets", type=Path, metavar="DIR", help="write DIR/base and DIR/cand, time nothing")
    parser.add_argument("--keep", action="store_true", help="keep the temp dir and print its path")
    args = parser.parse_args()
    if args.write_sets:
        base, cand = write_sets(args.write_sets, args.records, differences=args.differences)
        print(f"wrote {base} and {cand}")
        return
    root = Path(tempfile.mkdtemp(prefix="bench-compare-"))
    try:
        t = time.perf_counter()
        base, cand = write_sets(root, args.records, differences=args.differences)
        print(
            f"wrote 2 x {args.records} synthetic records in {time.perf_counter() - t:.1f} s "
            f"({'with differences' if args.differences else 'identical copies'})"
        )
        runs: list[dict[str, float]] = []
        for i in range(args.runs):
            if not args.no_stages:
                stages = stage_times(base, cand, root / f"stages-{i}")
            wall, rss, code = command_run(base, cand, root / f"out-{i}")
            runs.append({**({} if args.no_stages else stages), "command": wall, "rss": rss})
            print(f"run {i + 1}: command {wall:.2f} s wall, peak RSS {rss:.2f} GiB, exit {code}", flush=True)
        med = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
        if not args.no_stages:
            stages = ", ".join(f"{k} {med[k]:.2f} s" for k in ("load", "match", "judge", "render", "write"))
            print(f"in process (median of {args.runs}): {stages}; total {med['total']:.2f} s")
        print(
            f"harness compare --output-dir (median of {args.runs}): {med['command']:.2f} s wall, "
            f"peak RSS {med['rss']:.2f} GiB"
        )
        print(f"machine load average over the last minute: {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")
        if args.keep:
            print(f"kept: {root}")
    finally:
        if not args.keep:
            shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
