"""Sweep wall time on the localhost SLURM cluster, packed (`--pack`: one job per job shape, cells back to back)
against unpacked (one job-array task per cell), alternating, and the ratio of the medians.

    .venv/bin/python bench/bench_pack.py [--reps 3] [--cells 6] [--world 2]

Each run is a whole `harness sweep --cluster local-slurm` (a child process) into a fresh temporary results dir:
submission, queueing, the cells, and collecting every record. Brings the cluster up (scripts/slurm-local.sh, root)
when it is not, and down again at the end. Prints figures; asserts nothing (tests never time things).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

from harness.results.store import load_records

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "scripts" / "slurm-local.sh"
STRATEGIES = ("ddp", "fsdp.full_shard", "fsdp2.full_shard")


def scenario(cells: int, world: int) -> str:
    seeds = list(range((cells + len(STRATEGIES) - 1) // len(STRATEGIES)))
    # the matrix may overshoot `cells`; exclude the extra (strategy, seed) combinations from the end
    combos = [(s, seed) for seed in seeds for s in STRATEGIES]
    exclude = [{"strategy": s, "seed": seed} for s, seed in combos[cells:]]
    return textwrap.dedent(f"""\
        name: bench-pack
        matrix:
          model: [tiny]
          strategy: {json.dumps(list(STRATEGIES))}
          precision: [fp32]
          gpus: [{world}]
          seed: {json.dumps(seeds)}
          exclude: {json.dumps(exclude)}
        settings: {{warmup_steps: 2, measure_steps: 5, time_limit_s: 60}}
    """)


def run_sweep(scenario_path: Path, *, packed: bool) -> tuple[float, dict[str, int], int]:
    """(wall s, record statuses, distinct SLURM job ids) of one sweep into a fresh results dir."""
    with tempfile.TemporaryDirectory(prefix="bench-pack-") as tmp:
        cmd = [
            sys.executable,
            "-m",
            "harness.cli",
            "sweep",
            str(scenario_path),
            "--cluster",
            "local-slurm",
            "--results",
            tmp,
        ] + (["--pack"] if packed else [])
        t0 = time.perf_counter()
        proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True)
        wall = time.perf_counter() - t0
        if proc.returncode not in (0, 1):
            sys.exit(f"sweep failed (exit {proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
        statuses: dict[str, int] = {}
        jobs = set()
        for rec in load_records(Path(tmp) / "bench-pack")[0]:
            statuses[rec.status] = statuses.get(rec.status, 0) + 1
            jobs.add(rec.env.slurm_job_id)  # an array task is an allocation of its own
        # NOTE: the next run starts on an idle cluster: a packed sweep returns with its last record, while its job
        # may still be exiting
        _wait_idle()
        return wall, statuses, len(jobs)


def _wait_idle(timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        out = subprocess.run(["squeue", "-h", "-o", "%i"], capture_output=True, text=True).stdout
        if not out.strip():
            return
        time.sleep(0.5)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=3, help="runs per mode (alternating)")
    ap.add_argument("--cells", type=int, default=6, help="tiny cells in the sweep")
    ap.add_argument("--world", type=int, default=2, help="ranks per cell (2: one node; 4: both nodes)")
    args = ap.parse_args()

    os.environ.setdefault(
        "SLURM_CONF", str(Path(os.environ.get("HARNESS_SLURM_DIR", "/tmp/harness-slurm")) / "etc" / "slurm.conf")
    )
    was_up = subprocess.run([str(SCRIPT), "status"], capture_output=True).returncode == 0
    if not was_up:
        up = subprocess.run([str(SCRIPT), "up"], capture_output=True, text=True)
        if up.returncode != 0:
            sys.exit(f"cannot bring the localhost SLURM cluster up (exit {up.returncode}):\n{up.stderr}")
    try:
        with tempfile.TemporaryDirectory(prefix="bench-pack-scenario-") as tmp:
            path = Path(tmp) / "bench-pack.yaml"
            path.write_text(scenario(args.cells, args.world))
            print(
                f"{args.cells} tiny cells at world {args.world} (2 ranks per node), time_limit_s 60, on "
                f"local-slurm (2 nodes x 2 task slots, {os.cpu_count()} cores); {args.reps} runs per mode, "
                "alternating"
            )
            walls: dict[str, list[float]] = {"unpacked": [], "packed": []}
            for rep in range(args.reps):
                for mode in ("unpacked", "packed"):
                    wall, statuses, jobs = run_sweep(path, packed=mode == "packed")
                    walls[mode].append(wall)
                    print(
                        f"  run {rep + 1} {mode:8s} {wall:6.1f} s  {jobs} allocation{'s' if jobs != 1 else ''}  "
                        + ", ".join(f"{n} {s}" for s, n in sorted(statuses.items())),
                        flush=True,
                    )
    finally:
        if not was_up:
            subprocess.run([str(SCRIPT), "down"], capture_output=True)
    med = {mode: statistics.median(w) for mode, w in walls.items()}
    print(
        f"median sweep wall time: unpacked {med['unpacked']:.1f} s, packed {med['packed']:.1f} s; "
        f"packed / unpacked = {med['packed'] / med['unpacked']:.2f}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
