"""The results history at a year's scale: storage size and `harness history check` speed.

Builds a SQLite history of CELLS cells × NIGHTS nights (defaults 1,000 × 365: a nightly sweep of a large matrix
for a year) through the real `history add` path (records → entries → one transaction per night), then writes
one more night as CELLS record files and times `harness history check` on it: in this process (load + judge +
render) and as a fresh `harness` process (what a nightly job pays, interpreter start included). The values are
H100-like run-level numbers with lognormal run-to-run noise (σ 3–8% per cell, 0.5% outlier nights), 1% of the
cells shifting 1.3× somewhere in the year, and tonight 10 cells slowed 1.3×. Prints figures; asserts nothing.
Targets (issue 20): <= 200 MB, check of a 1,000-cell night <= 5 s.

    python bench/bench_history.py                      # 1,000 cells x 365 nights (a few minutes)
    python bench/bench_history.py --cells 100 --nights 60 --keep /tmp/h.db
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import datetime as dt
import io
import itertools
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from harness.cli import main  # noqa: E402
from harness.history.keys import entry_of  # noqa: E402
from harness.history.store import open_store  # noqa: E402
from harness.results.store import write_record  # noqa: E402

NIGHT0 = dt.datetime(2026, 1, 1, 2, 0, tzinfo=dt.timezone.utc)
STRATEGIES = (
    "ddp",
    "fsdp.full_shard",
    "fsdp.shard_grad_op",
    "fsdp.no_shard",
    "fsdp.hybrid_shard",
    "fsdp.hybrid_shard_zero2",
    "fsdp2.full_shard",
    "fsdp2.hybrid_shard",
    "zero1",
    "zero2",
    "zero3",
)


def template() -> dict:
    rec = json.loads((REPO / "docs" / "record-example.json").read_text())
    rec["cluster"] = "h100"
    rec["env"].update(
        device_type="cuda",
        device_name="NVIDIA H100 80GB HBM3",
        device_count=8,
        cuda="12.8",
        nccl="2.27.3",
        torch="2.13.0+cu128",
    )
    rec["env"].pop("deepspeed_config", None)
    return rec


def cell_specs(n: int, base: dict) -> list[dict]:
    out = []
    for strategy, precision, gpus, seq_len, micro_batch in itertools.product(
        STRATEGIES, ("fp32", "bf16", "fp16"), (8, 16, 32, 64), (1024, 2048, 4096, 8192), (1, 2, 4)
    ):
        spec = dict(base, strategy=strategy, precision=precision, gpus=gpus, seq_len=seq_len, micro_batch=micro_batch)
        spec["nodes"] = max(1, gpus // 8)
        spec["gpus_per_node"] = 8
        out.append(spec)
        if len(out) == n:
            return out
    raise SystemExit(f"at most {len(out)} distinct cells")


def night_records(tpl: dict, specs: list[dict], levels: np.ndarray, night: int, factors: np.ndarray) -> list[dict]:
    """One night: each cell's record with its step time levels[i] * factors[i]."""
    finished = NIGHT0 + dt.timedelta(days=night)
    out = []
    for i, spec in enumerate(specs):
        rec = copy.copy(tpl)
        step = float(levels[i] * factors[i])
        tokens = spec["micro_batch"] * spec["seq_len"] * spec["gpus"]
        flops = 6 * 1.3e9 * tokens
        rec["spec"] = spec
        rec["run_id"] = f"bench-{i:04d}"
        rec["attempt"] = f"{night:04d}{i:08x}"
        rec["finished_at"] = finished.isoformat(timespec="seconds")
        rec["started_at"] = rec["finished_at"]
        rec["env"] = dict(tpl["env"], harness_git_sha=f"{night:07x}")
        rec["metrics"] = {
            "step_time_s": {"median": step, "p10": step, "p90": step, "mean": step, "samples": [step]},
            "tokens_per_s": tokens / step,
            "tokens_per_s_per_gpu": tokens / step / spec["gpus"],
            "tflops_per_gpu": flops / step / spec["gpus"] / 1e12,
            "mfu": flops / step / spec["gpus"] / 989e12,
            "peak_memory_allocated_gib": 20.0 + i % 40,
            "peak_memory_reserved_gib": 22.0 + i % 40,
            "null_reasons": {},
        }
        rec["comm"] = {"bytes_per_step": 2.6e9 * (1 + i % 7), "calls_per_step": 10, "by_collective": {}, "by_group": {}}
        rec["predicted"] = {"memory_gib": {"total": 19.5 + i % 40}, "comm_bytes_per_step": 2.6e9 * (1 + i % 7)}
        out.append(rec)
    return out


def noise(rng: np.random.Generator, sigmas: np.ndarray) -> np.ndarray:
    y = rng.normal(0.0, sigmas)
    outliers = rng.random(len(sigmas)) < 0.005
    y[outliers] += np.log(rng.uniform(1.2, 2.0, int(outliers.sum())))
    return np.exp(y)


def main_(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cells", type=int, default=1000)
    ap.add_argument("--nights", type=int, default=365)
    ap.add_argument("--keep", type=Path, help="build the history here (kept) instead of a temporary file")
    args = ap.parse_args(argv)
    rng = np.random.default_rng(20)
    tpl = template()
    specs = cell_specs(args.cells, tpl["spec"])
    levels = 0.1 * np.exp(rng.uniform(-1, 2, args.cells))  # 37 ms .. 740 ms
    sigmas = rng.uniform(0.03, 0.08, args.cells)
    shifted = rng.choice(args.cells, size=max(1, args.cells // 100), replace=False)
    shift_night = rng.integers(1, args.nights, size=len(shifted))
    tmp = Path(tempfile.mkdtemp(prefix="bench-history-"))
    db = args.keep or tmp / "history.db"
    if db.exists():
        raise SystemExit(f"{db} exists")

    add_s = []
    t_build = time.perf_counter()
    for night in range(args.nights):
        factors = noise(rng, sigmas)
        for c, at in zip(shifted, shift_night):
            if night >= at:
                factors[c] *= 1.3
        entries = [entry_of(r) for r in night_records(tpl, specs, levels, night, factors)]
        t0 = time.perf_counter()
        with open_store(str(db), create=True) as store:
            store.add(entries, label=f"commit-{night:04d}", source="bench")
        add_s.append(time.perf_counter() - t0)
        if night % 50 == 0 or night == args.nights - 1:
            print(f"  night {night + 1}/{args.nights}: add {add_s[-1]:.2f} s", flush=True)
    build_s = time.perf_counter() - t_build
    with open_store(str(db), create=True) as store:
        counts = store.counts()
        store.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchall()
    size = db.stat().st_size + sum(p.stat().st_size for p in db.parent.glob(db.name + "-*"))

    # tonight: one more night as record files, 10 cells slowed 1.3x
    factors = noise(rng, sigmas)
    factors[shifted] *= 1.3
    slowed = rng.choice(np.setdiff1d(np.arange(args.cells), shifted), size=min(10, args.cells), replace=False)
    factors[slowed] *= 1.3
    tonight = tmp / "tonight"
    for rec in night_records(tpl, specs, levels, args.nights, factors):
        write_record(tonight, rec)

    runs, cpu = [], []
    for _ in range(3):
        out = io.StringIO()
        t0, c0 = time.perf_counter(), time.process_time()
        with contextlib.redirect_stdout(out):
            code = main(["history", "check", "--db", str(db), str(tonight), "--format", "json"])
        runs.append(time.perf_counter() - t0)
        cpu.append(time.process_time() - c0)
    doc = json.loads(out.getvalue())
    flagged = sorted({c["label"] for c in doc["cells"] if any(m["verdict"] == "regression" for m in c["metrics"])})
    cli_wall, cli_cpu = [], []
    for _ in range(3):
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        t0 = time.perf_counter()
        proc = subprocess.run(
            [sys.executable, "-m", "harness.cli", "history", "check", "--db", str(db), str(tonight)],
            capture_output=True,
            text=True,
            cwd=REPO,
            env={**os.environ, "PYTHONPATH": str(REPO)},
        )
        cli_wall.append(time.perf_counter() - t0)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        cli_cpu.append(after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime)

    print()
    print(f"history: {args.cells} cells x {args.nights} nights = {counts['runs']:,} runs, {counts['values']:,} values")
    print(f"  SQLite file: {size / 1e6:.1f} MB ({size / counts['runs']:.0f} B per run)   target <= 200 MB")
    print(
        f"  building it: {build_s:.0f} s; one night's add (1 transaction, {args.cells} records): "
        f"median {np.median(add_s):.2f} s, max {max(add_s):.2f} s"
    )
    print(
        f"check of a {args.cells}-cell night (target <= 5 s): a fresh `harness history check` process "
        f"{min(cli_wall):.2f} s wall, {min(cli_cpu):.2f} s CPU (best of 3); in-process, --format json: "
        f"{min(runs):.2f} s wall, {min(cpu):.2f} s CPU; load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores"
    )
    print(
        f"  exit {code} (process: {proc.returncode}); {len(flagged)} cell(s) flagged; the 10 slowed 1.3x: "
        f"{sum(specs_label(specs[i]) in flagged for i in slowed)} flagged; cells shifted earlier in the year and "
        f"flagged tonight: {sum(specs_label(specs[i]) in flagged for i in shifted)} of {len(shifted)}"
    )
    others = [f for f in flagged if f not in {specs_label(specs[i]) for i in (*slowed, *shifted)}]
    print(f"  other cells flagged (outlier nights: {len(others)} of {args.cells - len(slowed) - len(shifted)})")
    if args.keep is None:
        db.unlink()


def specs_label(spec: dict) -> str:
    from harness.history.keys import cell_label
    from harness.results.spec import spec_from_json

    return cell_label(spec_from_json(spec))


if __name__ == "__main__":
    main_()
