"""Predicted per-rank memory, FLOPs and communication for every cell, launching nothing (`harness plan`, whose
command is harness.cli.plan, prints harness.report.plan's `format_table(plan_cells(...))`).

`predict(spec, cluster)` is what the sweep dispatcher calls to skip cells that cannot fit (the `reason`
sentence goes into the `skipped` record) and what every record carries under `predicted`.
No torch import on this path.
"""

from __future__ import annotations

import gc

from harness.plan import calibration as cal
from harness.plan import checkpoint as ck
from harness.plan import comm as cm
from harness.plan import flops, runnable
from harness.plan import memory as mb
from harness.plan import time as tm
from harness.plan.calibration import Rates
from harness.plan.placement import Capacity, capacity, host_memory_refusal, placement_refusal
from harness.plan.prediction import PlannedCell, PredictedMemory, Prediction
from harness.plan.time import time_prediction
from harness.scenario.cluster import Cluster, find_peak
from harness.scenario.spec import RunSpec

PARTS = ("params", "grads", "optimizer", "activations", "buffers")


def clear_caches() -> None:
    """Forget everything the planner's modules remember between cells (the rates read from files, comm's ledgers,
    memory's and time's per-model structures and predictions): what a fresh process starts from."""
    cal.clear_caches()
    cm.clear_caches()
    mb.clear_caches()
    tm.clear_caches()


def usable_memory_gib(cluster: Cluster) -> float | None:
    """Device memory a rank's tensors can use (GiB): the profile's capacity minus the CUDA context/NCCL reserve."""
    if cluster.device_memory_gib is None:
        return None
    return cluster.device_memory_gib - mb.DEVICE_RESERVE_GIB


def predict(
    spec: RunSpec,
    cluster: Cluster,
    *,
    rates: Rates | None = None,
    unsupported: str | None | runnable.Unasked = runnable.UNASKED,
) -> Prediction:
    """Predicted memory (GiB per rank), FLOPs per step (global) and whether the cell fits.

    `memory_gib` holds the five parts live at the rank's peak (they add up to `total`); `peak_at` names
    the moment of the step it falls in and `grads_after_backward_gib` the gradients' full size, which
    strategies that free gradients between steps do not hold at an earlier peak. `cpu_memory_gib` is host
    memory per rank for offload. `fits` is None when the cluster's device memory is unknown; `reason` is
    the one-line breakdown used in a `skipped` record when the cell does not fit, else None.
    `hardware_flops_per_step` adds activation checkpointing's recompute (HFU) to `flops_per_step` (MFU).
    `comm_bytes_per_step` is harness.plan.comm's (None where no collective model applies). The step-time fields
    (`step_time_s`, `tokens_per_s_per_gpu`, `mfu`, `time_s`, `calibration`, `time_null_reasons`) are
    harness.plan.time's, at `rates` (default: the cluster's calibration or profile). Whether the cell can run is
    asked once, here or by the caller that hands it down as `unsupported` (`plan_cells`; harness.plan.runnable), and
    handed to the collective and step-time models.
    """
    cannot_run = runnable.unsupported_reason(spec, unsupported)
    mem = mb.memory(spec, device=cluster.device)
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
    fields = {
        "memory_gib": PredictedMemory(**{k: round(v, 6) for k, v in gib.items()}),
        "peak_at": mem.window,
        "grads_after_backward_gib": round(mem.grads_after_backward / mb.GIB, 6),
        "cpu_memory_gib": round(mem.cpu / mb.GIB, 6),
        "device_memory_gib": cluster.device_memory_gib,
        "fits": fits,
        "flops_per_step": flops.flops_per_step(spec),
        "hardware_flops_per_step": flops.hardware_flops_per_step(spec),
        "comm_bytes_per_step": cm.ledger_bytes(spec, unsupported=cannot_run),
        "reason": reason,
        "notes": dict(mem.notes),
    }
    if spec.settings.checkpoint:  # NOTE: only then, so every other cell's prediction reads as before
        fields.update(_checkpoint_fields(spec, cluster, rates))
    return Prediction.of(fields, time_prediction(spec, cluster, rates=rates, unsupported=cannot_run))


def _checkpoint_fields(spec: RunSpec, cluster: Cluster, rates: Rates | None) -> dict[str, object]:
    """predicted.checkpoint_bytes and checkpoint_s (harness.plan.checkpoint) at the cluster's rates."""
    if rates is None:
        try:
            rates = cal.rates_for(cluster)
        except cal.CalibrationMismatch as e:
            return {
                "checkpoint_bytes": ck.checkpoint_bytes(spec),
                "checkpoint_s": None,
                "checkpoint_null_reasons": {"checkpoint_s": str(e.problems[0])},
            }
    return ck.checkpoint_prediction(spec, rates)


def unsupported_prediction(
    spec: RunSpec,
    cluster: Cluster,
    *,
    rates: Rates | None = None,
    unsupported: str | None | runnable.Unasked = runnable.UNASKED,
) -> Prediction:
    """What `harness plan` shows of a cell that cannot run: its model FLOPs and its (null) step time, nothing of
    memory or collectives; `unsupported` (why it cannot run) as `predict` takes it."""
    fields = dict.fromkeys(
        ("memory_gib", "peak_at", "grads_after_backward_gib", "cpu_memory_gib", "device_memory_gib", "fits")
    )
    fields.update(
        device_memory_gib=cluster.device_memory_gib,
        flops_per_step=flops.flops_per_step(spec),
        hardware_flops_per_step=None,
        comm_bytes_per_step=None,
        reason=None,
    )
    return Prediction.of(fields, time_prediction(spec, cluster, rates=rates, unsupported=unsupported))


BF16 = "bf16"
"""the precision whose dense peak every plan cell's second MFU divides by (harness.core.precisions)"""


def bf16_peak_tflops(cluster: Cluster, rates: Rates | None) -> tuple[float | None, str]:
    """(the device's bf16 dense peak in TFLOPS, the table entry's name and source), or (None, why): the peak the
    prediction's MFU divides by for a bf16 cell (harness.plan.time.mfu_peak: the rates' GPU, else the profile's
    description)."""
    device_name = rates.device_name if rates is not None else None
    peak, why = tm.mfu_peak(cluster.device, cluster.description, device_name, BF16)
    if peak is None:
        return None, why or "no bf16 dense peak known"
    found = find_peak(device_name or cluster.description)
    return peak, (f"{found.name}: {found.source}" if found is not None else "")


def bf16_peak_mfu(
    spec: RunSpec, pred: Prediction, cluster: Cluster, rates: Rates | None
) -> tuple[float | None, str | None]:
    """(the cell's predicted MFU against the device's bf16 dense peak, None) or (None, why): model FLOPs per step
    per GPU over the predicted step time, over `bf16_peak_tflops`. For a bf16 cell it equals the prediction's `mfu`."""
    if pred.step_time_s is None or not pred.step_time_s > 0:
        return None, "no predicted step time"
    if pred.flops_per_step is None:
        return None, "no model FLOPs"
    peak, why = bf16_peak_tflops(cluster, rates)
    if peak is None:
        return None, why
    return pred.flops_per_step / spec.gpus / pred.step_time_s / (peak * 1e12), None


def _rates_or_none(cluster: Cluster) -> Rates | None:
    """The cluster's rates as `predict` resolves them, or None where a calibration of another machine is refused
    (then no step time is predicted either)."""
    try:
        return cal.rates_for(cluster)
    except cal.CalibrationMismatch:
        return None


def plan_cells(
    specs: list[RunSpec], cluster: Cluster, *, cap: Capacity | None = None, rates: Rates | None = None
) -> list[PlannedCell]:
    """One planned cell per spec, in order. Unsupported cells carry `unsupported` (the reason) and no memory or
    collective prediction; the others predict()'s fields. `cannot_place` is why the cluster cannot place the cell
    (the sweep skips it: harness.plan.placement; `cap` defaults to this machine's view of the cluster), else None;
    `host_memory` why this machine cannot hold a local CPU cell's ranks (the sweep skips it unless --no-skip);
    `mfu_bf16_peak` the MFU against the device's bf16 dense peak (`bf16_peak_mfu`)."""
    cap = capacity(cluster) if cap is None else cap
    seen = rates if rates is not None else _rates_or_none(cluster)  # NOTE: the GPU whose bf16 peak the MFU uses
    # NOTE: planning allocates about a hundred objects per cell that live to the end (the cells, the caches); the
    # cyclic collector's passes over them took a quarter of a 10,000-cell plan, and none of them is in a cycle
    # that needs it. Reference counting still frees everything else.
    collecting = gc.isenabled()
    gc.disable()
    try:
        cells = []
        for spec in specs:
            why = spec.unsupported_reason()  # NOTE: the one time the cell is asked: the models are handed the answer
            pred = (
                predict(spec, cluster, rates=rates, unsupported=None)
                if why is None
                else unsupported_prediction(spec, cluster, rates=rates, unsupported=why)
            )
            placed = placement_refusal(spec, cluster, cap)
            host = host_memory_refusal(spec, predicted=pred, cap=cap) if why is None and placed is None else None
            mfu, no_mfu = bf16_peak_mfu(spec, pred, cluster, seen)
            cells.append(PlannedCell(spec, placed, why, pred, host, mfu, no_mfu))
        return cells
    finally:
        if collecting:
            gc.enable()
