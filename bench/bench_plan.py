"""How fast `harness plan` predicts a big matrix, cold (a fresh process, imports included) and warm.

The matrix: 9 zoo models × 11 strategies × {fp32, bf16} × gpus {1, 2, 4, …, 128} × activation checkpointing
{none, full} × micro_batch {1, 2} × seq_len {1024, 2048} = 12,672 cells on a cluster profile; `--cells N` (default
10,000, the issue's target: <= 3 s cold) plans the first N.

- **cold**: `--repeat` (default 3) fresh interpreters, each doing what `harness plan SCENARIO --cluster NAME` does —
  import the command's modules, load the profile, read and expand the scenario file, load the rates, predict every
  cell, recommend, render the table and the recommendation (or `--json`: the JSON document) to stdout — timed
  from the parent around the whole process (interpreter start included). Printed: the median wall time and each
  run's phases as the child measured them.
- **cli**: once, the real `python -m harness.cli plan FILE --cluster NAME` over the whole 12,672-cell file (more than
  `--cells`: there is no flag to cut a scenario), for reference.
- **warm**: in this process, the same planning again after one pass (every cache filled): median of `--repeat`.

By default the cluster gets a synthetic calibration (harness.plan.calibration.example_calibration, in a temp
HARNESS_CALIBRATION_DIR) so that every cell's step time is priced in full, overlap simulation included;
`--profile-figures` plans with the profile's own sourced figures instead (every runnable cell priced: issue 30).
Prints figures and the load average; asserts nothing.

    .venv/bin/python bench/bench_plan.py [--cluster h100] [--cells 10000] [--repeat 3] [--json] [--profile-figures]
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

REPO = Path(__file__).resolve().parents[1]
GPUS = [1, 2, 4, 8, 16, 32, 64, 128]


def big_scenario() -> dict:
    from harness.core.catalogue import STRATEGIES
    from harness.core.zoo import ZOO

    return {
        "name": "bench-plan",
        "matrix": {
            "model": list(ZOO),
            "strategy": list(STRATEGIES),
            "precision": ["fp32", "bf16"],
            "gpus": GPUS,
            "activation_checkpointing": ["none", "full"],
            "micro_batch": [1, 2],
            "seq_len": [1024, 2048],
        },
    }


def plan_text(cells: list, cluster, *, as_json: bool) -> str:
    """What `harness plan` prints of planned cells (harness.cli.plan.plan_command): the recommendation made, then the
    JSON document, or the table and the recommendation."""
    from harness.plan.recommend import recommend
    from harness.report.plan import format_recommendations, format_table, planned_cell_json

    recs = recommend(cells, cluster=cluster)
    if as_json:
        docs = [planned_cell_json(c, s, headroom_gib=recs.headroom_gib) for c, s in zip(cells, recs.standings)]
        return json.dumps(docs, indent=2, allow_nan=False)
    return format_table(cells, cluster, recs=recs) + "\n\n" + format_recommendations(cells, recs)


def inner(args: argparse.Namespace) -> None:
    """One cold run, as `harness plan` does it (harness.cli.plan.plan_command: its cyclic GC off, and frozen at exit),
    but over the first N cells."""
    import atexit
    import gc

    gc.disable()
    atexit.register(gc.freeze)
    t0 = time.perf_counter()
    from harness.plan.calibration import rates_for
    from harness.plan.predict import plan_cells
    from harness.scenario.cluster import load_cluster
    from harness.scenario.schema import load_scenario

    t1 = time.perf_counter()
    cluster = load_cluster(args.cluster)
    specs = load_scenario(args.scenario).expand(gpus_per_node=cluster.gpus_per_node)[: args.cells]
    t2 = time.perf_counter()
    rates = rates_for(cluster)
    cells = plan_cells(specs, cluster, rates=rates)
    t3 = time.perf_counter()
    text = plan_text(cells, cluster, as_json=args.json)
    sys.stdout.write(text + "\n")
    sys.stdout.flush()
    t4 = time.perf_counter()
    timed = sum(1 for c in cells if c.prediction.step_time_s is not None)
    phases = {"imports": t1 - t0, "expand": t2 - t1, "plan": t3 - t2, "render": t4 - t3, "cells": len(cells)}
    print(json.dumps({**phases, "timed": timed, "cpu_s": time.process_time()}), file=sys.stderr)


def load() -> str:
    return "load average " + ", ".join(f"{x:.2f}" for x in os.getloadavg()) + f" on {os.cpu_count()} CPUs"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cluster", default="h100")
    parser.add_argument("--cells", type=int, default=10_000, help="plan only the first N cells")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--json", action="store_true", help="render the JSON document (`--format json`)")
    parser.add_argument("--profile-figures", action="store_true", help="no synthetic calibration")
    parser.add_argument("--no-cli", action="store_true", help="skip the real CLI run over the whole file")
    parser.add_argument("--inner", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--scenario", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.inner:
        inner(args)
        return

    import yaml

    from harness.plan.calibration import CALIBRATION_DIR_ENV, SUFFIX, example_calibration
    from harness.scenario.cluster import load_cluster

    cluster = load_cluster(args.cluster)
    tmp = Path(tempfile.mkdtemp(prefix="bench-plan-"))
    env = dict(os.environ)
    if not args.profile_figures:
        env[CALIBRATION_DIR_ENV] = os.environ[CALIBRATION_DIR_ENV] = str(tmp)
        cal = example_calibration(cluster.name, device=cluster.device, tflops=400 if cluster.device == "cuda" else 0.05)
        (tmp / f"{cluster.name}{SUFFIX}").write_text(json.dumps(cal))
    else:
        env[CALIBRATION_DIR_ENV] = os.environ[CALIBRATION_DIR_ENV] = str(tmp / "none")
    scenario = tmp / "bench-plan.yaml"
    scenario.write_text(yaml.safe_dump(big_scenario(), sort_keys=False))
    print(f"cluster {cluster.name}, {args.cells} cells, {'json' if args.json else 'table'}; {load()}")

    base = [sys.executable, str(Path(__file__).resolve()), "--inner", "--scenario", str(scenario)]
    base += ["--cluster", args.cluster, "--cells", str(args.cells)] + (["--json"] if args.json else [])
    walls = []
    for _ in range(args.repeat):
        t = time.perf_counter()
        p = subprocess.run(base, env=env, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        wall = time.perf_counter() - t
        if p.returncode:
            sys.exit(p.stderr)
        ph = json.loads(p.stderr.strip().splitlines()[-1])
        walls.append(wall)
        print(
            f"  cold run: {wall:.2f} s wall (imports {ph['imports']:.2f}, expand {ph['expand']:.2f}, plan "
            f"{ph['plan']:.2f}, render {ph['render']:.2f}; CPU {ph['cpu_s']:.2f} s); {ph['cells']} cells, "
            f"{ph['timed']} with a predicted step time"
        )
    print(f"cold: median {statistics.median(walls):.2f} s over {len(walls)} fresh processes (target <= 3 s)")

    if not args.no_cli:
        cmd = [sys.executable, "-m", "harness.cli", "plan", str(scenario), "--cluster", args.cluster]
        cmd += ["--format", "json"] if args.json else []
        t = time.perf_counter()
        p = subprocess.run(cmd, env=env, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        wall = time.perf_counter() - t
        print(f"cli: `harness plan` over all 12,672 cells: {wall:.2f} s wall (exit {p.returncode})")

    from harness.plan.calibration import rates_for
    from harness.plan.predict import plan_cells
    from harness.scenario.schema import load_scenario

    specs = load_scenario(str(scenario)).expand(gpus_per_node=cluster.gpus_per_node)[: args.cells]
    warm = []
    for r in range(args.repeat + 1):
        t = time.perf_counter()
        cells = plan_cells(specs, cluster, rates=rates_for(cluster))
        text = plan_text(cells, cluster, as_json=args.json)
        if r:  # the first pass fills the caches
            warm.append(time.perf_counter() - t)
    size = f"{len(text) / 1e6:.1f} MB"
    print(f"warm: median {statistics.median(warm):.2f} s over {len(warm)} (plan_cells + render, {size})")
    print(f"end: {load()}")


if __name__ == "__main__":
    main()
