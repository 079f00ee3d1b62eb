"""Measured tensor memory beside the plan's, per category, for every ok cell of a device check (bench/gpu_check.sh,
each sweep part).

    python bench/gpu_check_memory.py RESULTS

Per ok record under RESULTS: `metrics.memory_gib` (the tensor bytes the worker measured at the peak of one untimed
step, on the rank with the largest peak, harness.results.record.TensorMemory) beside `predicted.memory_gib`, for
params, grads, optimizer, activations, buffers and the total: "measured / predicted (deviation)", the deviation
being predicted / measured - 1; then where the measured peak fell (rank, phase) and where the plan puts it, and
`metrics.memory_fragmentation_gib` (the allocator's peak reserved minus the tensors' peak; null on CPU). A value
a record lacks (a record from before the worker measured it, a cell without a plan) prints as `-`. GiB = 2**30 B.
Prints a Markdown table.
"""

from __future__ import annotations

import sys

from harness.results.record import Record
from harness.results.store import load_records

CATEGORIES = ("params", "grads", "optimizer", "activations", "buffers", "total")


def gib(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def pair(measured: float | None, predicted: float | None) -> str:
    """'measured / predicted (deviation)'; the deviation only where both are there and the measured one is not 0."""
    text = f"{gib(measured)} / {gib(predicted)}"
    if measured and predicted is not None:
        text += f" ({predicted / measured - 1:+.0%})"
    return text


def row(rec: Record) -> str:
    measured = rec.metrics.memory_gib
    predicted = rec.predicted.memory_gib if rec.predicted is not None else None
    cells = [
        pair(
            getattr(measured, c) if measured is not None else None,
            getattr(predicted, c) if predicted is not None else None,
        )
        for c in CATEGORIES
    ]
    # offload's host side: the meter's host-memory peak beside the plan's host bytes per rank
    cells.append(
        pair(
            measured.host if measured is not None else None,
            rec.predicted.cpu_memory_gib if rec.predicted is not None else None,
        )
    )
    where = f"rank {measured.rank} {measured.phase}" if measured is not None else "-"
    plan_peak = (rec.predicted.peak_at if rec.predicted is not None else None) or "-"
    return (
        f"| {rec.run_id[:-11]} ac={rec.spec.settings.activation_checkpointing}"
        + (" traced" if rec.spec.settings.trace else "")
        + " | "
        + " | ".join(cells)
        + f" | {where} | {plan_peak} | {gib(rec.metrics.memory_fragmentation_gib)} |"
    )


def main(results: str) -> None:
    records, _ = load_records(results)
    ok = sorted((r for r in records if r.status == "ok"), key=lambda r: r.run_id)
    print("\ntensor memory by category, measured / predicted GiB (predicted / measured - 1), ok cells")
    print("| cell | " + " | ".join(CATEGORIES) + " | host | measured peak | planned peak | fragmentation GiB |")
    print("|---" * (len(CATEGORIES) + 5) + "|")
    for rec in ok:
        print(row(rec))
    if not ok:
        print("| no cell ran ok |" + " |" * (len(CATEGORIES) + 4))


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    main(sys.argv[1])
