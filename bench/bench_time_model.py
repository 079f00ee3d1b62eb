"""Accuracy of the step-time model on this machine: calibrate, sweep held-out cells, compare predicted with measured.

    .venv/bin/python bench/bench_time_model.py [--scenario scenarios/time-model-heldout.yaml] [--results DIR]
                                               [--skip-calibrate] [--quick-calibrate] [--cluster local] [--repeat K]

1. `harness calibrate --cluster local` (unless --skip-calibrate and the cluster has a calibration);
2. `harness sweep` of the held-out scenario (two custom models of >= 10M parameters that the calibration never ran,
   every strategy family, fp32 and bf16, 1, 2 and 4 ranks, seq 128) into DIR (a fresh temp dir by default; an
   existing DIR resumes: cells with an ok record are not rerun);
3. per ok cell: the prediction its record carries (`predicted.step_time_s`, made before the cell ran) against the
   measured median step time (with --repeat K, `harness sweep --repeat K`: the median over the cell's K runs of each
   run's median, as `harness compare` judges timing on runs, since this host's noise is mostly between runs; each
   run's own median signed error is printed too, to show how far one run alone would move the verdict); then the
   mean absolute percentage error, Spearman's rank correlation, and both per
   strategy family. The targets (issue 16): MAPE <= 15 %, Spearman >= 0.9. The machine's load average before and
   after is printed too: step times on a shared machine move with it. Prints figures; asserts nothing.
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

from harness.core.catalogue import CATALOGUE
from harness.plan.calibration import find_calibration
from harness.plan.predict import predict
from harness.plan.validation import spearman
from harness.results.spec import spec_from_json
from harness.results.store import load_records
from harness.scenario.cluster import load_cluster

REPO = Path(__file__).resolve().parents[1]


def mape(pred: list[float], meas: list[float]) -> float:
    return 100.0 * statistics.fmean(abs(p - m) / m for p, m in zip(pred, meas))


def load() -> str:
    return "load average " + ", ".join(f"{x:.2f}" for x in os.getloadavg()) + f" on {os.cpu_count()} CPUs"


def cpu_jiffies() -> tuple[int, int]:
    """(steal, total) CPU time of this machine so far, in jiffies (/proc/stat): steal is time the hypervisor gave to
    another guest while this one wanted to run, the noise no calibration can foresee."""
    try:
        with open("/proc/stat") as f:
            vals = [int(v) for v in f.readline().split()[1:]]
    except (OSError, ValueError):
        return 0, 0
    return (vals[7] if len(vals) > 7 else 0), sum(vals[:8])


def steal_since(start: tuple[int, int]) -> str:
    steal, total = (a - b for a, b in zip(cpu_jiffies(), start))
    return f"steal {100.0 * steal / total:.1f} % of CPU time" if total > 0 else "steal unknown"


def harness(*args: str) -> int:
    return subprocess.run([sys.executable, "-m", "harness.cli", *args]).returncode


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scenario", default=str(REPO / "scenarios" / "time-model-heldout.yaml"))
    ap.add_argument("--cluster", default="local")
    ap.add_argument("--results", default=None, help="results dir (default: a fresh temp dir)")
    ap.add_argument("--skip-calibrate", action="store_true", help="use the existing calibration")
    ap.add_argument("--quick-calibrate", action="store_true", help="harness calibrate --quick")
    ap.add_argument(
        "--recompute",
        action="store_true",
        help="compare today's model (harness.plan.predict with the current calibration) instead of the prediction "
        "each record carries from before its cell ran",
    )
    ap.add_argument(
        "--repeat", type=int, default=1, metavar="K", help="harness sweep --repeat K: judge each cell on its K runs"
    )
    args = ap.parse_args()
    cluster = load_cluster(args.cluster)
    print(f"start: {load()}", flush=True)
    t0, j0 = time.perf_counter(), cpu_jiffies()
    if not (args.skip_calibrate and find_calibration(cluster) is not None):
        rc = harness("calibrate", "--cluster", args.cluster, *(["--quick"] if args.quick_calibrate else []))
        if rc:
            sys.exit(f"harness calibrate failed (exit {rc})")
    t_cal = time.perf_counter() - t0
    results = Path(args.results or tempfile.mkdtemp(prefix="bench-time-model-"))
    print(f"calibration {t_cal:.0f} s ({steal_since(j0)}); sweeping into {results}; {load()}", flush=True)
    t1, j1 = time.perf_counter(), cpu_jiffies()
    harness("sweep", args.scenario, "--cluster", args.cluster, "--results", str(results), "--repeat", str(args.repeat))
    t_sweep = time.perf_counter() - t1
    sweep_steal = steal_since(j1)
    records = [{**rec.to_dict(), "_path": rec.path} for rec in load_records(results)[0]]  # as the files have them
    runs: dict[str, list[dict]] = {}  # run_id -> its ok runs' records, in run order
    for r in sorted(records, key=lambda r: (r["run_id"], r.get("repeat") or 1)):
        if args.recompute and r["status"] == "ok":
            r["predicted"] = predict(spec_from_json(r["spec"]), cluster).to_dict()
        pred = (r.get("predicted") or {}).get("step_time_s")
        if r["status"] != "ok" or not pred:
            why = "" if pred else f" no prediction: {(r.get('predicted') or {}).get('time_null_reasons')}"
            print(f"  (not compared: {r['run_id']} {r['status']} {r.get('reason') or ''}{why})")
            continue
        runs.setdefault(r["run_id"], []).append(r)
    rows = []
    for cell in runs.values():
        first = cell[0]
        s, pred = first["spec"], first["predicted"]["step_time_s"]
        per_run = {r.get("repeat") or 1: r["metrics"]["step_time_s"]["median"] for r in cell}  # run k -> median
        meas = statistics.median(per_run.values())
        parts_s = first["predicted"]["time_s"]
        rows.append((s["model"], s["strategy"], s["precision"], s["gpus"], pred, meas, parts_s, per_run))
    rows.sort(key=lambda x: (x[0], CATALOGUE[x[1]].family, x[1], x[2], x[3]))
    print(
        f"\n{'model':15} {'strategy':22} {'prec':4} {'gpus':>4} {'pred ms':>9} {'meas ms':>9} {'err':>7}  breakdown ms"
        + ("  | each run's median ms" if args.repeat > 1 else "")
    )
    for model, strat, prec, gpus, pred, meas, t, per_run in rows:
        parts = " ".join(f"{k[:4]} {t[k] * 1e3:.0f}" for k in ("compute", "optimizer", "comm_exposed", "other"))
        err = 100 * (pred / meas - 1)
        each = "  | " + " ".join(f"{m * 1e3:.1f}" for m in per_run.values()) if args.repeat > 1 else ""
        print(f"{model:15} {strat:22} {prec:4} {gpus:4d} {pred * 1e3:9.1f} {meas * 1e3:9.1f} {err:+6.1f}%  {parts}"
              + each)  # fmt: skip
    if not rows:
        sys.exit("no comparable cells")
    preds, meas_ = [x[4] for x in rows], [x[5] for x in rows]
    print(f"\n{len(rows)} cells: MAPE {mape(preds, meas_):.1f} % (target <= 15), Spearman {spearman(preds, meas_):.3f} "
          f"(target >= 0.9)")  # fmt: skip
    for fam in dict.fromkeys(CATALOGUE[x[1]].family for x in rows):
        sub = [x for x in rows if CATALOGUE[x[1]].family == fam]
        print(f"  {fam:6} {len(sub):3d} cells: MAPE {mape([x[4] for x in sub], [x[5] for x in sub]):.1f} %")
    for prec in ("fp32", "bf16"):
        sub = [x for x in rows if x[2] == prec]
        if sub:
            bias = 100.0 * statistics.median(x[4] / x[5] - 1 for x in sub)
            print(f"  {prec:6} {len(sub):3d} cells: MAPE {mape([x[4] for x in sub], [x[5] for x in sub]):.1f} %, "
                  f"median signed error {bias:+.1f} %")  # fmt: skip
    if args.repeat > 1:
        # the verdict one run alone would have given: each run's median signed error over the cells it measured
        by_run = {}
        for x in rows:
            for k, m in x[7].items():
                by_run.setdefault(k, []).append(x[4] / m - 1)
        alone = (f"run {k} {100.0 * statistics.median(v):+.1f} %" for k, v in sorted(by_run.items()))
        print("  one run alone, median signed error: " + ", ".join(alone))
    print(f"calibration {t_cal:.0f} s, sweep {t_sweep:.0f} s ({sweep_steal}); end: {load()}")


if __name__ == "__main__":
    main()
