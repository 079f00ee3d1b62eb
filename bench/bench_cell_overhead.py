"""Where a local cell's wall time goes, per strategy family: launch (driver → worker processes), process
start → worker entry (interpreter + imports), entry → first step (process group, model build, strategy
setup), the timed steps, and the rest (teardown, record, driver polling). Median of --reps runs each.

    .venv/bin/python bench/bench_cell_overhead.py [--reps 3] [--launcher submitit|foreground]

Each strategy runs with ranks forked from the sweep's warm zygote (harness.launch.local.prefork, what local CPU sweeps
do) and with ranks started cold (HARNESS_NO_PREFORK), alternating, so the two are measured under the same load.

Prints one table; nothing is asserted (speed is measured here, never in tests).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from harness.launch.core.payload import make_payload  # noqa: E402
from harness.launch.local import prefork  # noqa: E402
from harness.launch.local.launchers import launch_foreground, launch_submitit  # noqa: E402
from harness.scenario.cluster import load_cluster  # noqa: E402
from harness.scenario.schema import parse_scenario  # noqa: E402

STRATEGIES = ["ddp", "fsdp.full_shard", "fsdp2.full_shard", "zero2", "zero3"]


MEASURE_STEPS = 5


def cell(strategy: str):
    doc = {
        "name": "bench",
        "matrix": {"model": ["tiny"], "strategy": [strategy], "precision": ["fp32"], "gpus": [2]},
        "settings": {"warmup_steps": 2, "measure_steps": MEASURE_STEPS},
    }
    (spec,) = parse_scenario(doc, "bench").expand(gpus_per_node=2)
    return spec


def run_once(strategy: str, launcher: str, warm: bool) -> dict[str, float]:
    if warm:
        os.environ.pop(prefork.OFF_ENV, None)
    else:
        os.environ[prefork.OFF_ENV] = "1"
    cluster = load_cluster("local")
    spec = cell(strategy)
    with tempfile.TemporaryDirectory() as tmp:
        payload = make_payload(
            spec, sweep="bench", cluster=cluster, results=Path(tmp) / "results", sha=None, predicted=None
        )
        t0 = time.time()
        if launcher == "submitit":
            rec = launch_submitit(payload, cluster=cluster, folder=Path(tmp) / "jobs", time_limit_s=300)
        else:
            rec = launch_foreground(payload, time_limit_s=300, stream=False)
        wall = time.time() - t0
    if rec.status != "ok":
        raise SystemExit(f"{strategy}: {rec.status}: {rec.reason}")
    m = rec.metrics.to_dict()  # NOTE: as the file has it
    steps = sum(m["warmup_step_times_s"]) + sum(m["step_time_s"]["samples"])
    startup, setup = m["startup_s"], m["setup_s"]
    return {
        "wall": wall,
        "imports": startup - setup,
        "setup": setup,
        "steps": steps,
        "rest": wall - startup - steps,
        "step_ms": 1e3 * m["step_time_s"]["median"],
    }


def main() -> None:
    global MEASURE_STEPS
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--launcher", choices=["submitit", "foreground"], default="submitit")
    ap.add_argument("--strategy", nargs="*", default=STRATEGIES)
    ap.add_argument("--measure-steps", type=int, default=MEASURE_STEPS)
    a = ap.parse_args()
    MEASURE_STEPS = a.measure_steps
    modes = [("warm", True), ("cold", False)]
    rows = {(s, m): [] for s in a.strategy for m, _ in modes}
    with prefork.zygote(load_cluster("local").env):
        run_once(a.strategy[0], a.launcher, True)  # the zygote's own imports are paid once, by the sweep
        for _ in range(a.reps):  # interleaved, so load drift hits every strategy and mode alike
            for s in a.strategy:
                for m, warm in modes:
                    rows[(s, m)].append(run_once(s, a.launcher, warm))
    cols = ["wall", "imports", "setup", "steps", "rest", "step_ms"]
    print(f"launcher {a.launcher}, tiny fp32 world 2, 2 warmup + {MEASURE_STEPS} measured steps, median of {a.reps}")
    print(f"{'strategy':<18}{'ranks':>6}" + "".join(f"{c:>9}" for c in cols) + f"{'cold/warm':>11}")
    med = {k: {c: statistics.median(r[c] for r in runs) for c in cols} for k, runs in rows.items()}
    for (s, m), v in med.items():
        ratio = f"{med[(s, 'cold')]['wall'] / med[(s, 'warm')]['wall']:>11.2f}" if m == "cold" else ""
        print(f"{s:<18}{m:>6}" + "".join(f"{v[c]:>9.2f}" for c in cols) + ratio)
    for m, _ in modes:
        print(f"{m}: sum of medians {sum(v['wall'] for (s, mm), v in med.items() if mm == m):.1f} s")
    print(
        "'imports' = process start → worker entry, 'setup' = entry → first step (torch imports land here when "
        "cold), 'steps' = warmup + measured, 'rest' = launch + teardown + record + polling, all s; 'step_ms' = "
        "the record's median step time, which forking must not change"
    )


if __name__ == "__main__":
    main()
