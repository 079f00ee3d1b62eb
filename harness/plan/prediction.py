"""The planner's prediction of one cell, typed: what `harness.plan.predict.predict` returns, what every record carries
under `predicted`, and what `harness plan --format json` prints per cell (beside the cell's run_id, spec and
refusals: harness.plan.predict.PlannedCell).

Field names, units and order are those the harness has always written (the record's `predicted` section):
memory in GiB = 2**30 bytes per rank at its peak, FLOPs per step over all ranks, collective bytes per step on one
rank, seconds per optimizer step on one rank. Every field is optional, so that a `predicted` section of any earlier
harness reads back (a field it did not write stays unset, and is not written again: dump with `to_dict`); unknown
fields (a newer harness's) are kept as they are.

Models on harness.core.typed.Typed: frozen and strict (an int stays an int, `device_memory_gib: 80` of a profile;
nothing is coerced); read with `Prediction.model_validate(data)` or `model_validate_json(bytes)`, write with Python's
json module from `to_dict()` (pydantic's own JSON formats floats differently, and the outputs must not change).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pydantic import ConfigDict

from harness.core.typed import Typed
from harness.scenario.spec import RunSpec

Number = int | float
"""a JSON number as it was written or computed: an int stays an int, a float a float"""


class _Frozen(Typed):
    """harness.core.typed.Typed (frozen, strict, keeping fields it does not know), where a computed value may be
    non-finite: the record's writer turns it into null (harness.results.store.sanitize)."""

    model_config = ConfigDict(**{**Typed.model_config, "allow_inf_nan": True})


class PredictedMemory(_Frozen):
    """Predicted device memory per rank at its peak (GiB, 2**30 B): the five parts add up to `total`."""

    params: Number | None = None
    """parameters this rank keeps between steps (GiB)"""
    grads: Number | None = None
    """gradients allocated at the peak (GiB)"""
    optimizer: Number | None = None
    """optimizer state (GiB)"""
    activations: Number | None = None
    """activations saved for backward and live at the peak (GiB)"""
    buffers: Number | None = None
    """transient buffers live at the peak (GiB)"""
    total: Number | None = None
    """their sum (GiB)"""


class PredictedTime(_Frozen):
    """The step time's breakdown (s per optimizer step on one rank; harness.plan.time): compute + recompute +
    optimizer + comm_exposed + other = step_time_s. Null: a rate the part needs is unknown."""

    compute: Number | None = None
    """matmuls, attention and elementwise work of forward and backward (s)"""
    recompute: Number | None = None
    """activation checkpointing's recomputed forward (s)"""
    optimizer: Number | None = None
    """the optimizer step (s)"""
    comm_exposed: Number | None = None
    """collective time not hidden behind compute (s)"""
    comm_total: Number | None = None
    """every collective's time, hidden or not (s)"""
    other: Number | None = None
    """per-op host overhead and the strategy's framework overhead (s)"""


class TimePrediction(_Frozen):
    """The step-time model's part of a prediction (harness.plan.time.predict_time), with the reasons of its nulls."""

    step_time_s: Number | None = None
    """one optimizer step on one rank (s); null: see time_null_reasons"""
    tokens_per_s_per_gpu: Number | None = None
    """tokens per second per GPU (tokens/s)"""
    mfu: Number | None = None
    """model FLOPs utilisation (fraction); null: peak unknown or step time unknown"""
    time_s: PredictedTime | None = None
    """the step time's breakdown (s)"""
    calibration: str | None = None
    """the rates' source: "calibrated <file> <date>" or "uncalibrated: profile figures (<sources>)" """
    time_null_reasons: dict[str, str] | None = None
    """step time field or part → why it is null"""


TIME_FIELDS: tuple[str, ...] = tuple(TimePrediction.model_fields)
"""the step-time model's fields of a Prediction, in order"""


class Prediction(_Frozen):
    """What the planner predicts for a cell (harness.plan.predict.predict), and what a record carries under
    `predicted` (the worker adds the two deviations once it has measured)."""

    memory_gib: PredictedMemory | None = None
    """device memory per rank at its peak (GiB); null for a cell that cannot run"""
    peak_at: str | None = None
    """the moment of the step the peak falls in (harness.plan.memory.WINDOWS)"""
    grads_after_backward_gib: Number | None = None
    """the gradients' full size per rank once backward is done (GiB)"""
    cpu_memory_gib: Number | None = None
    """host memory per rank under CPU offload (GiB)"""
    device_memory_gib: Number | None = None
    """the profile's device memory (GiB); null: unknown"""
    fits: bool | None = None
    """whether the total fits the usable device memory; null: capacity unknown"""
    flops_per_step: Number | None = None
    """model FLOPs per optimizer step over all ranks (FLOP): the MFU numerator"""
    hardware_flops_per_step: Number | None = None
    """flops_per_step plus activation checkpointing's recompute (FLOP): the HFU numerator"""
    comm_bytes_per_step: Number | None = None
    """collective bytes per step on one rank (B); null: no collective model for the cell"""
    reason: str | None = None
    """the one-line breakdown when the cell does not fit (a `skipped` record's reason), else null"""
    notes: dict[str, str] | None = None
    """memory part → how it was counted"""
    step_time_s: Number | None = None
    """one optimizer step on one rank (s); null: see time_null_reasons"""
    tokens_per_s_per_gpu: Number | None = None
    """tokens per second per GPU (tokens/s)"""
    mfu: Number | None = None
    """model FLOPs utilisation (fraction); null: peak unknown or step time unknown"""
    time_s: PredictedTime | None = None
    """the step time's breakdown (s)"""
    calibration: str | None = None
    """the rates' source: "calibrated <file> <date>" or "uncalibrated: profile figures (<sources>)" """
    time_null_reasons: dict[str, str] | None = None
    """step time field or part → why it is null"""
    comm_deviation: Number | None = None
    """measured / predicted collective bytes − 1 (fraction; 0.0: exact), added by the worker"""
    step_time_deviation: Number | None = None
    """measured median step time / predicted − 1 (fraction; 0.0: exact), added by the worker"""
    checkpoint_bytes: Number | None = None
    """`checkpoint: true` cells: tensor bytes of the strategy's checkpoint, all ranks (B; harness.plan.checkpoint)"""
    checkpoint_s: Number | None = None
    """`checkpoint: true` cells: the save at the checkpoint folder's write bandwidth (s); null: see
    checkpoint_null_reasons"""
    checkpoint_null_reasons: dict[str, str] | None = None
    """checkpoint field → why it is null"""
    checkpoint_bytes_deviation: Number | None = None
    """measured checkpoint bytes / predicted − 1 (fraction; the format's framing), added by the worker"""

    def with_deviations(self, *, comm_bytes: float | None, median_s: float | None) -> Prediction:
        """This prediction with how a measurement compares: measured / predicted − 1 for collective bytes and step
        time (where both sides have them); the worker adds them, `harness report --repredict` again."""
        update: dict[str, float] = {}
        if self.comm_bytes_per_step and comm_bytes is not None:
            update["comm_deviation"] = comm_bytes / self.comm_bytes_per_step - 1.0
        if self.step_time_s and median_s is not None:
            update["step_time_deviation"] = median_s / self.step_time_s - 1.0
        return self.model_copy(update=update) if update else self

    @classmethod
    def of(cls, fields: dict[str, Any], time: TimePrediction) -> Prediction:
        """The memory, FLOP and collective `fields` (as keyword arguments) with the step-time model's `time`."""
        return cls(**fields, **{k: getattr(time, k) for k in time.model_fields_set})

    def time(self) -> TimePrediction:
        """The step-time model's part of this prediction."""
        return TimePrediction(**{k: getattr(self, k) for k in TIME_FIELDS if k in self.model_fields_set})


@dataclass(frozen=True)
class PlannedCell:
    """One cell of `harness plan` (harness.plan.predict.plan_cells): the cell, why the cluster cannot place it or why
    it cannot run at all, and its prediction."""

    spec: RunSpec
    cannot_place: str | None
    """why the cluster cannot place the cell (the sweep skips it: harness.plan.placement), else None"""
    unsupported: str | None
    """why the cell cannot run (RunSpec.unsupported_reason); its prediction then has FLOPs and time fields only"""
    prediction: Prediction
    host_memory: str | None = None
    """why this machine's memory cannot hold the ranks of a local CPU cell (the sweep skips it unless --no-skip:
    harness.plan.placement.host_memory_refusal), else None"""
    mfu_bf16_peak: float | None = None
    """the predicted model FLOPs per second over the device's bf16 dense peak (fraction): the prediction's `mfu`
    divides by its own precision's peak (fp32's is 15 times lower on an H100), this one by the same peak for every
    precision, so cells of different precisions compare; None: see mfu_bf16_peak_null_reason"""
    mfu_bf16_peak_null_reason: str | None = None
    """why mfu_bf16_peak is None (no predicted step time, no bf16 peak known for the device), else None"""

    @property
    def fits(self) -> bool | None:
        """Whether the cell fits where it would run: False when its ranks are predicted beyond their device's memory
        or this host's (`host_memory`), None when neither is known."""
        return False if self.host_memory else self.prediction.fits
