"""Predicted per-rank memory, FLOPs and communication for every cell, launching nothing (`harness plan`, whose
command is harness.cli.plan, prints `format_table(plan_cells(...))`).

`predict(spec, cluster)` is what the sweep dispatcher calls to skip cells that cannot fit (the `reason`
sentence goes into the `skipped` record) and what every record carries under `predicted`.
No torch import on this path.
"""

from __future__ import annotations

import gc
import math
from typing import Any

from harness.plan import comm as cm
from harness.plan import memory as mb
from harness.plan import time as tm
from harness.plan.calibration import Rates
from harness.plan.placement import Capacity, capacity, placement_refusal
from harness.plan.time import TIME_COLUMNS, time_columns, time_footer, time_prediction
from harness.scenario.cluster import Cluster
from harness.scenario.schema import RunSpec

PARTS = ("params", "grads", "optimizer", "activations", "buffers")


def _comm_bytes_per_step(spec: RunSpec) -> float | None:
    """Predicted collective bytes per step (harness.plan.comm's `predict_comm(spec)["bytes_per_step"]`, from its
    cached ledger: no summary per cell), or None where no accounting model exists."""
    return cm.ledger_bytes(spec)


def clear_caches() -> None:
    """Forget everything the planner's modules remember between cells (comm's ledgers, memory's and time's
    per-model structures and predictions): what a fresh process starts from."""
    cm.clear_caches()
    mb.clear_caches()
    tm.clear_caches()


def usable_memory_gib(cluster: Cluster) -> float | None:
    """Device memory a rank's tensors can use (GiB): the profile's capacity minus the CUDA context/NCCL reserve."""
    if cluster.device_memory_gib is None:
        return None
    return cluster.device_memory_gib - mb.DEVICE_RESERVE_GIB


def predict(spec: RunSpec, cluster: Cluster, *, rates: Rates | None = None) -> dict[str, Any]:
    """Predicted memory (GiB per rank), FLOPs per step (global) and whether the cell fits.

    `memory_gib` holds the five parts live at the rank's peak (they add up to `total`); `peak_at` names
    the moment of the step it falls in and `grads_after_backward_gib` the gradients' full size, which
    strategies that free gradients between steps do not hold at an earlier peak. `cpu_memory_gib` is host
    memory per rank for offload. `fits` is None when the cluster's device memory is unknown; `reason` is
    the one-line breakdown used in a `skipped` record when the cell does not fit, else None.
    `hardware_flops_per_step` adds activation checkpointing's recompute (HFU) to `flops_per_step` (MFU).
    The step-time fields (`step_time_s`, `tokens_per_s_per_gpu`, `mfu`, `time_s`, `calibration`,
    `time_null_reasons`) are harness.plan.time's, at `rates` (default: the cluster's calibration or profile).
    """
    mem = mb.memory(spec)
    gib = mem.gib()
    usable = usable_memory_gib(cluster)
    fits = None if usable is None else gib["total"] <= usable
    reason = None
    if fits is False:
        parts = " + ".join(f"{k} {gib[k]:.1f}" for k in PARTS)
        reason = (
            f"predicted {gib['total']:.1f} GiB per rank ({parts}) > {usable:.1f} GiB usable "
            f"({cluster.device_memory_gib:.1f} GiB device memory - {mb.DEVICE_RESERVE_GIB:.1f} GiB "
            "CUDA context/NCCL reserve)"
        )
    return {
        "memory_gib": {k: round(v, 6) for k, v in gib.items()},
        "peak_at": mem.window,
        "grads_after_backward_gib": round(mem.grads_after_backward / mb.GIB, 6),
        "cpu_memory_gib": round(mem.cpu / mb.GIB, 6),
        "device_memory_gib": cluster.device_memory_gib,
        "fits": fits,
        "flops_per_step": mb.flops_per_step(spec),
        "hardware_flops_per_step": mb.hardware_flops_per_step(spec),
        "comm_bytes_per_step": _comm_bytes_per_step(spec),
        "reason": reason,
        "notes": dict(mem.notes),
        **time_prediction(spec, cluster, rates=rates),
    }


def plan_cells(
    specs: list[RunSpec], cluster: Cluster, *, cap: Capacity | None = None, rates: Rates | None = None
) -> list[dict[str, Any]]:
    """One JSON-able object per cell, in order. Unsupported cells carry `unsupported` (the reason) and no
    prediction; the others carry predict()'s fields. `cannot_place` is why the cluster cannot place the cell (the
    sweep skips it: harness.plan.placement; `cap` defaults to this machine's view of the cluster), else None."""
    cap = capacity(cluster) if cap is None else cap
    # NOTE: planning allocates about a hundred objects per cell that live to the end (the cells, the caches); the
    # cyclic collector's passes over them took a quarter of a 10,000-cell plan, and none of them is in a cycle
    # that needs it. Reference counting still frees everything else.
    collecting = gc.isenabled()
    gc.disable()
    try:
        return _plan_cells(specs, cluster, cap=cap, rates=rates)
    finally:
        if collecting:
            gc.enable()


def _plan_cells(specs: list[RunSpec], cluster: Cluster, *, cap: Capacity, rates: Rates | None) -> list[dict[str, Any]]:
    cells = []
    for spec in specs:
        cell: dict[str, Any] = {"run_id": spec.run_id, "spec": spec.to_dict()}
        cell["cannot_place"] = placement_refusal(spec, cluster, cap)
        why = spec.unsupported_reason()
        if why is not None:
            cell.update(
                {
                    "unsupported": why,
                    "memory_gib": None,
                    "peak_at": None,
                    "grads_after_backward_gib": None,
                    "cpu_memory_gib": None,
                    "device_memory_gib": cluster.device_memory_gib,
                    "fits": None,
                    "flops_per_step": mb.flops_per_step(spec),
                    "hardware_flops_per_step": None,
                    "comm_bytes_per_step": None,
                    "reason": None,
                    **time_prediction(spec, cluster, rates=rates),
                }
            )
        else:
            cell["unsupported"] = None
            cell.update(predict(spec, cluster, rates=rates))
        cells.append(cell)
    return cells


# --------------------------------------------------------------------------------------------------
# table


def _fmt(v: float | None, spec: str = "") -> str:
    """GiB with one decimal, or three significant digits below 1 (so the tiny model's cells read)."""
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "-"
    if spec:
        return format(v, spec)
    return format(v, ".1f") if v >= 1 or v == 0 else format(v, ".3g")


def format_table(cells: list[dict[str, Any]], cluster: Cluster) -> str:
    usable = usable_memory_gib(cluster)
    head = (
        f"cluster {cluster.name}: "
        + (
            f"{cluster.device_memory_gib:g} GiB per device, {usable:g} GiB usable "
            f"(reserve {mb.DEVICE_RESERVE_GIB:g} GiB)"
            if usable is not None
            else "device memory unknown (nothing is marked as not fitting)"
        )
        + "; memory in GiB per rank at its peak (grads: those allocated then), FLOPs per step over all ranks"
    )
    cols = [
        "cell",
        "opts",
        "params",
        "grads",
        "optim",
        "act",
        "buf",
        "total",
        "fits",
        "peak at",
        "cpu",
        "TFLOP/step",
        "comm GB",
        *TIME_COLUMNS,
    ]
    rows = []
    for c in cells:
        s = c["spec"]
        name = f"{s['model']} {s['strategy']} {s['precision']} g{s['gpus']}"
        ac = s["activation_checkpointing"]
        opts = ",".join(
            o
            for o in (
                (f"ac={ac}" if ac != "none" else ""),
                (f"offload={s['offload']}" if s["offload"] != "none" else ""),
                (f"tp{s['tp']}" + (" sp" if s.get("sequence_parallel") else "") if s.get("tp", 1) > 1 else ""),
                (f"pp{s['pp']}:{s['pp_schedule']}" if s.get("pp", 1) > 1 else ""),
                f"mb{s['micro_batch']}x{s['seq_len']}",
            )
            if o
        )
        if c["unsupported"]:
            rows.append([name, opts, f"unsupported: {c['unsupported']}"])
            continue
        if c["cannot_place"]:
            rows.append([name, opts, f"CANNOT PLACE (skipped): {c['cannot_place']}"])
            continue
        m = c["memory_gib"]
        fits = {True: "yes", False: "NO", None: "?"}[c["fits"]]
        comm = c["comm_bytes_per_step"]
        rows.append(
            [
                name,
                opts,
                _fmt(m["params"]),
                _fmt(m["grads"]),
                _fmt(m["optimizer"]),
                _fmt(m["activations"]),
                _fmt(m["buffers"]),
                _fmt(m["total"]),
                fits,
                c["peak_at"],
                _fmt(c["cpu_memory_gib"]) if c["cpu_memory_gib"] else "-",
                _fmt(c["flops_per_step"] / 1e12, ".3g"),
                _fmt(None if comm is None else comm / 1e9, ".3g"),
                *time_columns(c),
            ]
        )
    full = [r for r in rows if len(r) == len(cols)]
    widths = [
        max([len(cols[i])] + [len(r[i]) for r in full] + [len(r[i]) for r in rows if len(r) < len(cols) and i < 2])
        for i in range(len(cols))
    ]
    lines = [head, "  ".join(c.ljust(w) if i < 2 else c.rjust(w) for i, (c, w) in enumerate(zip(cols, widths)))]
    for r in rows:
        if len(r) < len(cols):
            lines.append("  ".join([r[0].ljust(widths[0]), r[1].ljust(widths[1]), r[2]]))
        else:
            lines.append("  ".join(v.ljust(w) if i < 2 else v.rjust(w) for i, (v, w) in enumerate(zip(r, widths))))
    n_no = sum(1 for c in cells if c["fits"] is False)
    n_unsupported = sum(1 for c in cells if c["unsupported"])
    n_unplaced = sum(1 for c in cells if c["cannot_place"] and not c["unsupported"])
    lines.append(
        f"{len(cells)} cells; {n_no} predicted not to fit (NO)"
        + (f", {n_unsupported} unsupported" if n_unsupported else "")
        + (f", {n_unplaced} more than cluster {cluster.name} can place (the sweep skips them)" if n_unplaced else "")
    )
    lines.append(time_footer(cells))
    return "\n".join(lines)
