"""How fast `harness plan` predicts a big matrix: a 12,672-cell scenario (9 zoo models × 11 strategies × {fp32,
bf16} × gpus {1, 2, 4, …, 128} × activation checkpointing {none, full} × micro_batch {1, 2} × seq_len {1024,
2048}) on a cluster profile: times expansion, `plan_cells` (every prediction: memory, FLOPs, collectives, step
time) and the table or JSON. Prints cells/s and CPU seconds; asserts nothing (the issue's target: 10,000 cells in
<= 3 s).

    .venv/bin/python bench/bench_plan.py [--cluster h100] [--cells N] [--repeat 3] [--json] [--profile-figures]

By default the cluster gets a synthetic calibration (harness.plan.calibration.example_calibration, in a temp
HARNESS_CALIBRATION_DIR) so that every cell's step time is priced in full, overlap simulation included;
`--profile-figures` plans with the profile's own figures instead (most GPU step times are then null early).
`--cells N` plans the first N cells. Later repeats see the caches warm (printed as `warm`).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from pathlib import Path

from harness.core.catalogue import STRATEGIES
from harness.core.zoo import ZOO
from harness.plan.calibration import rates_for
from harness.plan.predict import format_table, plan_cells
from harness.scenario.cluster import load_cluster
from harness.scenario.schema import parse_scenario

GPUS = [1, 2, 4, 8, 16, 32, 64, 128]


def big_scenario() -> dict:
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cluster", default="h100")
    parser.add_argument("--cells", type=int, default=None, help="plan only the first N cells")
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--json", action="store_true", help="also serialise the cells (as `--format json` does)")
    parser.add_argument("--profile-figures", action="store_true", help="no synthetic calibration")
    args = parser.parse_args()
    cluster = load_cluster(args.cluster)
    if not args.profile_figures:
        from harness.plan.calibration import CALIBRATION_DIR_ENV, SUFFIX, example_calibration

        tmp = Path(tempfile.mkdtemp(prefix="bench-plan-"))
        os.environ[CALIBRATION_DIR_ENV] = str(tmp)
        cal = example_calibration(cluster.name, device=cluster.device, tflops=400 if cluster.device == "cuda" else 0.05)
        (tmp / f"{cluster.name}{SUFFIX}").write_text(json.dumps(cal))
    t = time.perf_counter()
    specs = parse_scenario(big_scenario(), "bench-plan.yaml").expand(gpus_per_node=cluster.gpus_per_node)
    expand_s = time.perf_counter() - t
    if args.cells:
        specs = specs[: args.cells]
    print(f"{len(specs)} cells on cluster {cluster.name}; expansion {expand_s:.2f} s")
    walls = []
    for r in range(args.repeat):
        t, cpu = time.perf_counter(), time.process_time()
        cells = plan_cells(specs, cluster, rates=rates_for(cluster))  # as `harness plan` does
        plan_s = time.perf_counter() - t
        t2 = time.perf_counter()
        text = json.dumps(cells, allow_nan=False) if args.json else format_table(cells, cluster)
        out_s = time.perf_counter() - t2
        cpu = time.process_time() - cpu
        walls.append(plan_s + out_s)
        timed = sum(1 for c in cells if c.get("step_time_s") is not None)
        print(
            f"{'cold' if r == 0 else 'warm'}: plan_cells {plan_s:.2f} s ({len(cells) / plan_s:,.0f} cells/s), "
            f"{'json' if args.json else 'table'} {out_s:.2f} s ({len(text) / 1e6:.1f} MB); CPU {cpu:.2f} s; "
            f"{len(cells) / (plan_s + out_s):,.0f} cells/s overall; {timed} cells with a predicted step time"
        )
    if args.repeat > 1:
        print(f"median over {args.repeat}: {statistics.median(walls):.2f} s")


if __name__ == "__main__":
    main()
