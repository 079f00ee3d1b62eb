"""The uncalibrated GPU model against published training throughputs (validation/*.csv).

    .venv/bin/python bench/bench_gpu_validation.py [--csv validation/llm_foundry.csv] [--rows] [--figure DIR]

Every published run is priced with its profile's figures (what `harness plan --cluster <profile>` does without a
calibration) and compared with the published tokens/s per GPU. Prints per table (fitted: the A100 tables,
harness.plan.validation.FIT_TABLES; held out: every other) the rows, MAPE, median signed error, worst |error| and
Spearman's rank correlation, the same for the long-sequence (>= 16k) and multi-node (>= 16 GPUs) rows of the fitted
tables, and the five worst rows; `--rows` prints every row; `--figure DIR` draws predicted against published per
table (log-log, ±15% band) into DIR/gpu-validation.png. Asserts nothing (tests/unit/test_gpu_validation.py bounds
the in-sample figures).
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from harness.plan.validation import FIT_TABLES, Checked, Errors, errors_of, predict_published, read_published

REPO = Path(__file__).resolve().parents[1]


def line(name: str, e: Errors) -> str:
    return (
        f"{name:<34} {e.priced:>3}/{e.rows:<3} MAPE {e.mape:6.1%}  median {e.median:+6.1%}  "
        f"worst {e.worst:6.1%}  Spearman {e.spearman:5.3f}"
    )


def describe(c: Checked) -> str:
    r = c.run
    err = "   null" if c.error is None else f"{c.error:+7.1%}"
    pred = "-" if c.predicted is None else f"{c.predicted:9.0f}"
    return (
        f"{r.table:<18} {r.model:<9} {r.strategy:<18} gpus {r.gpus:>3} seq {r.seq_len:>5} mb {r.micro_batch:>3} "
        f"ga {r.grad_accum:>2} ac {r.activation_checkpointing:<4} published {r.tokens_per_s_per_gpu:>8.0f} "
        f"predicted {pred:>9} {err}" + (f"  ({c.reason})" if c.reason else "")
    )


def figure(checked: list[Checked], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    tables = sorted({c.run.table for c in checked}, key=lambda t: (t not in FIT_TABLES, t))
    fig, axes = plt.subplots(1, len(tables), figsize=(4.2 * len(tables), 4.2), squeeze=False)
    for ax, table in zip(axes[0], tables):
        rows = [c for c in checked if c.run.table == table and c.predicted is not None]
        xs = [c.run.tokens_per_s_per_gpu for c in rows]
        ys = [c.predicted for c in rows]
        lo, hi = min(xs + ys) / 1.5, max(xs + ys) * 1.5
        ax.fill_between([lo, hi], [lo * 0.85, hi * 0.85], [lo * 1.15, hi * 1.15], color="0.9", label="±15%")
        ax.plot([lo, hi], [lo, hi], color="0.5", lw=0.8)
        long = [c.run.seq_len >= 16384 for c in rows]
        multi = [c.run.gpus >= 16 for c in rows]
        colours = ["tab:red" if lg else "tab:green" if m else "tab:blue" for lg, m in zip(long, multi)]
        ax.scatter(xs, ys, s=14, c=colours)
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlim(lo, hi)
        ax.set_ylim(lo, hi)
        e = errors_of([c for c in checked if c.run.table == table])
        kind = "fitted" if table in FIT_TABLES else "held out"
        ax.set_title(f"{table} ({kind})\nMAPE {e.mape:.1%}, Spearman {e.spearman:.2f}", fontsize=9)
        ax.set_xlabel("published tokens/s per GPU")
        ax.set_ylabel("predicted tokens/s per GPU")
    axes[0][0].legend(loc="upper left", fontsize=8)
    fig.text(0.01, 0.01, "red: seq >= 16k; green: >= 16 GPUs; blue: the rest", fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--csv", default=str(REPO / "validation" / "llm_foundry.csv"))
    ap.add_argument("--rows", action="store_true", help="print every row")
    ap.add_argument("--figure", metavar="DIR", help="draw DIR/gpu-validation.png")
    args = ap.parse_args()
    t0 = time.perf_counter()
    checked = [predict_published(r) for r in read_published(args.csv)]
    elapsed = time.perf_counter() - t0
    if args.rows:
        for c in checked:
            print(describe(c))
        print()
    tables = sorted({c.run.table for c in checked}, key=lambda t: (t not in FIT_TABLES, t))
    fitted = [c for c in checked if c.run.table in FIT_TABLES]
    for table in tables:
        kind = "fitted" if table in FIT_TABLES else "held out"
        print(line(f"{table} ({kind})", errors_of([c for c in checked if c.run.table == table])))
    print(line("fitted: all A100 rows", errors_of(fitted)))
    print(line("fitted: seq >= 16k", errors_of([c for c in fitted if c.run.seq_len >= 16384])))
    print(line("fitted: >= 16 GPUs", errors_of([c for c in fitted if c.run.gpus >= 16])))
    held = [c for c in checked if c.run.table not in FIT_TABLES]
    if held:
        print(line("held out: all", errors_of(held)))
    print("\nfive worst fitted rows:")
    for c in sorted(fitted, key=lambda c: -abs(c.error if c.error is not None else 9.0))[:5]:
        print("  " + describe(c))
    if held:
        print("five worst held-out rows:")
        for c in sorted(held, key=lambda c: -abs(c.error if c.error is not None else 9.0))[:5]:
            print("  " + describe(c))
    print(f"\n{len(checked)} rows priced in {elapsed:.2f} s")
    if args.figure:
        out = Path(args.figure) / "gpu-validation.png"
        figure(checked, out)
        print(f"figure: {out}")


if __name__ == "__main__":
    main()
