"""Predicted step time of a cell before it runs: compute, recompute, optimizer, collectives and their overlap.

`predict_time(spec, cluster, rates)` prices one optimizer step of one rank from the model's own operations at the
rates of `harness.plan.calibration.Rates` (a calibration file, or the profile's `performance:` figures). The parts
come from the modules that hold each model (docs/time-model.md):

- **compute** and **recompute**: harness.plan.compute — every matmul at the calibrated throughput of its GEMM shape
  and layout, SDPA attention, the elementwise work as bytes at the calibrated bandwidth; activation checkpointing's
  second forward of each block inside the backward.
- **optimizer**: AdamW over this rank's parameters (calibrated per element and per tensor), plus the copies a
  ZeRO step makes between its fp32 master partition and the model dtype (harness.plan.compute).
- **other**: per-op host overhead × the op count (dominant for small models on CPU) and the strategy's framework
  overhead per step and per block (hooks, flattening, DeepSpeed's engine), calibrated per family at one rank (the
  catalogue entry's `framework_cost`).
- **comm**: every collective of harness.plan.comm's exact ledger, timed on the link its group runs on, and how much
  of it is exposed by the overlap rule the catalogue entry names (harness.plan.overlap). On a CPU host where the
  ranks occupy every core nothing overlaps.
- tensor- and pipeline-parallel cells: harness.plan.layout_time.

On a CPU host the ranks of a cell share its cores: compute, optimizer and host overhead are stretched by the
calibrated slowdown at the ranks on the host (else max(1, ranks on the host / cores)); the collectives were
calibrated under the same sharing.

The parts add up: step_time_s = compute + recompute + optimizer + comm_exposed + other. A part that needs an
unknown rate is null and so is the step time, with the reason. Pure arithmetic, no torch import; every result is a
function of frozen inputs (the RunSpec, the rates, what is read of the cluster), cached with functools.cache.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

from harness.core import precisions
from harness.core.catalogue import CATALOGUE
from harness.core.zoo import ModelConfig
from harness.plan import comm as cm
from harness.plan import compute, layout_time, overlap, runnable, wrap
from harness.plan.calibration import CalibrationMismatch, Rates, Unknown, rates_for
from harness.plan.comm import Zero3Config
from harness.plan.compute import compute_kind, micro_step_compute, optimizer_copy_bytes, optimizer_elements
from harness.plan.flops import flops_per_step
from harness.plan.layout_time import LAYOUT_ON_CPU, layout_parts
from harness.plan.links import ClusterView, host_ranks
from harness.plan.overlap import comm_times
from harness.plan.prediction import PredictedTime, Prediction, TimePrediction
from harness.scenario.cluster import Cluster, find_peak
from harness.scenario.spec import RunSpec

PARTS = ("compute", "recompute", "optimizer", "comm_exposed", "comm_total", "other")
"""the breakdown `time_s.*`; every part but comm_total adds up to the step time"""
SUMMED = ("compute", "recompute", "optimizer", "comm_exposed", "other")
"""the parts that add up to the step time"""


def predict_time(
    spec: RunSpec,
    cluster: Cluster | ClusterView,
    rates: Rates,
    *,
    overlap: bool = True,
    unsupported: str | None | runnable.Unasked = runnable.UNASKED,
) -> TimePrediction:
    """The predicted step time of `spec` and its breakdown (see the module docstring); nulls carry reasons.

    `unsupported` is the cell's RunSpec.unsupported_reason() where the caller has asked it (harness.plan.runnable),
    else it is asked here, once: a cell that cannot run has no step time, and only one that can reaches `cell_time`."""
    cannot_run = runnable.unsupported_reason(spec, unsupported)
    if cannot_run is not None:
        return null_prediction(f"the cell cannot run: {cannot_run}", rates.source)
    return cell_time(spec, view=ClusterView.of(cluster), rates=rates, overlap=overlap, zero3=cm.ZERO3)


@functools.cache
def cell_time(spec: RunSpec, *, view: ClusterView, rates: Rates, overlap: bool, zero3: Zero3Config) -> TimePrediction:
    """`predict_time` of a cell that can run, from everything it depends on: the cell, what is read of the cluster,
    the rates, whether collectives may overlap compute, and the ZeRO-3 coordinator's knobs its collectives are
    modelled with (harness.plan.comm.ZERO3)."""
    # NOTE: `zero3` is read below through harness.plan.comm.ZERO3 (CommCell.of): passed here so that the cache
    # cannot serve a prediction made with other knobs
    parts: dict[str, float | None] = dict.fromkeys(PARTS)
    reasons: dict[str, str] = {}
    why = unmodelled_reason(spec, unsupported=None)  # NOTE: only a cell that can run gets here (predict_time)
    if why is not None:
        reasons["step_time_s"] = why
    elif not spec.layout.is_default and rates.device == "cpu":
        reasons["step_time_s"] = LAYOUT_ON_CPU
    elif not spec.layout.is_default:
        try:
            step = layout_parts(spec, view, rates, overlap=overlap)
        except Unknown as e:
            reasons["step_time_s"] = str(e)
        else:
            parts.update(step.parts)
            if step.unknown is None:
                return _finish(spec, view, rates, parts, reasons)
            reasons["step_time_s"] = step.unknown
    else:
        _plain_parts(spec, view, rates, parts, reasons, overlap=overlap)
        return _finish(spec, view, rates, parts, reasons)
    return _timed(None, None, None, rates, parts, reasons)


def unmodelled_reason(spec: RunSpec, *, unsupported: str | None | runnable.Unasked = runnable.UNASKED) -> str | None:
    """Why this cell's step time is not predicted whatever the rates, or None; `unsupported` as `predict_time` takes
    it."""
    s = spec.settings
    cannot_run = runnable.unsupported_reason(spec, unsupported)
    if cannot_run is not None:
        return f"the cell cannot run: {cannot_run}"
    foreign = spec.model_config.unmodelled_time()
    if foreign is not None:
        return foreign
    if s.compile:
        return "torch.compile is not calibrated: the model prices eager execution only"
    if s.offload != "none":
        return "CPU offload: the host optimizer and host-device traffic are not calibrated"
    why = cm.no_comm_model_reason(spec, unsupported=None)  # the cell can run: asked above
    if why is not None:
        return f"no collective model: {why}"
    return None


def framework_blocks(spec: RunSpec) -> int | None:
    """The units a cell's per-block framework overhead is paid for: an FSDP cell's hooks and flat parameters are per
    wrap unit, so `wrap_blocks` other than 1 pays it per block unit (harness.plan.wrap; none for the whole model as
    one unit, whose root is in the fixed part); None (every block) otherwise."""
    if spec.settings.wrap_blocks == 1 or CATALOGUE[spec.strategy].family not in ("fsdp", "fsdp2"):
        return None
    return wrap.wrap_summary(spec.model_config, spec.settings.wrap_blocks)[2]


class StepCosts(NamedTuple):
    """What a cell's step costs besides its micro-steps' compute and its collectives: shared by every cell of the same
    model, strategy, precision and world on a host of the same ranks (micro-batch and sequence do not enter)."""

    c: float
    mem: float
    """the compute and memory slowdowns of the ranks sharing a host"""
    optimizer: float | None
    optimizer_reason: str
    dispatch: tuple[float, float] | None
    """(forward op, backward op) host overhead (s)"""
    framework: float | None
    """the strategy's framework overhead per micro-step (s)"""
    other_reason: str
    overlap: bool
    """whether the host leaves room for collectives beside compute (Rates.overlap)"""


@functools.cache
def step_costs(
    cfg: ModelConfig,
    *,
    strategy: str,
    precision: str,
    gpus: int,
    gpus_per_node: int,
    on_host: int,
    rates: Rates,
    blocks: int | None = None,
) -> StepCosts:
    """`StepCosts` from exactly what they read: the model, strategy and precision, the world, the ranks on a host and
    the rates; `blocks` the units the framework's per-block overhead is paid for (`framework_blocks`; None: every
    block)."""
    c, mem = rates.share(compute_kind(precision), ranks=on_host), rates.share("memory", ranks=on_host)
    opt: float | None = None
    opt_reason = other_reason = ""
    dispatch: tuple[float, float] | None = None
    framework: float | None = None
    elements, tensors = optimizer_elements(cfg, strategy=strategy, gpus=gpus, gpus_per_node=gpus_per_node)
    try:
        opt = rates.share("optimizer", ranks=on_host) * rates.optimizer_s(elements=elements, tensors=tensors)
        copies = optimizer_copy_bytes(strategy, precision, elements)
        if copies:
            opt += mem * rates.elementwise_s("float32", copies, op_bytes=4.0 * elements)
    except Unknown as e:
        opt, opt_reason = None, str(e)
    try:
        dispatch = compute.host_per_op(rates, precision)
        units = cfg.n_layers if blocks is None else blocks
        framework = rates.framework_s(strategy, precision, blocks=units, elements=elements)
    except Unknown as e:
        dispatch, other_reason = None, str(e)
    return StepCosts(c, mem, opt, opt_reason, dispatch, framework, other_reason, rates.overlap(ranks_on_host=on_host))


def _plain_parts(
    spec: RunSpec,
    view: ClusterView,
    rates: Rates,
    parts: dict[str, float | None],
    reasons: dict[str, str],
    *,
    overlap: bool,
) -> None:
    """Fill the parts of a cell without tensor or pipeline parallelism (or the reasons they are null)."""
    A = spec.settings.grad_accum
    on_host = host_ranks(spec.gpus, spec.gpus_per_node, executor=view.executor)
    st = step_costs(
        spec.model_config,
        strategy=spec.strategy,
        precision=spec.precision,
        gpus=spec.gpus,
        gpus_per_node=spec.gpus_per_node,
        on_host=on_host,
        rates=rates,
        blocks=framework_blocks(spec),
    )
    c, mem = st.c, st.mem
    comp: compute.Compute | None = None
    try:
        comp = micro_step_compute(spec, rates)
        plain, re = comp.total - comp.recompute, comp.recompute
        parts["compute"] = A * (c * (plain - comp.elementwise) + mem * comp.elementwise)
        parts["recompute"] = A * (c * (re - comp.recompute_elementwise) + mem * comp.recompute_elementwise)
    except Unknown as e:
        reasons["compute"] = str(e)
    if st.optimizer is None:
        reasons["optimizer"] = st.optimizer_reason
    else:
        parts["optimizer"] = st.optimizer
    if st.dispatch is None or st.framework is None:
        reasons["other"] = st.other_reason
    elif comp is not None:
        fwd_op, bwd_op = st.dispatch
        plain_ops = comp.ops_bwd - comp.recompute_ops
        host = A * (comp.ops_fwd * fwd_op + plain_ops * bwd_op)
        parts["other"] = c * (host + A * st.framework)
        recompute = parts["recompute"]
        if recompute is not None:
            parts["recompute"] = recompute + c * A * comp.recompute_ops * bwd_op
    if comp is not None:
        try:
            total, exposed, _ = comm_times(spec, view, rates, comp, overlap=overlap and st.overlap)
            parts["comm_total"], parts["comm_exposed"] = total, exposed
        except Unknown as e:
            reasons["comm"] = str(e)


def _finish(
    spec: RunSpec, view: ClusterView, rates: Rates, parts: dict[str, float | None], reasons: dict[str, str]
) -> TimePrediction:
    """The step time from its parts, tokens/s per GPU and MFU (or why they are null)."""
    summed = [parts[k] for k in SUMMED]
    if any(v is None for v in summed):
        reasons["step_time_s"] = next(iter(reasons.values()), "a part is unknown")
        return _timed(None, None, None, rates, parts, reasons)
    step = float(sum(v for v in summed if v is not None))
    tokens = spec.tokens_per_step / spec.gpus / step
    peak, why_not = mfu_peak(view.device, view.description, rates.device_name, spec.precision)
    mfu = None
    if peak is None:
        reasons["mfu"] = why_not or "peak unknown"
    else:
        mfu = flops_per_step(spec) / spec.gpus / step / (peak * 1e12)
    return _timed(step, tokens, mfu, rates, parts, reasons)


def _timed(
    step: float | None,
    tokens: float | None,
    mfu: float | None,
    rates: Rates,
    parts: dict[str, float | None],
    reasons: dict[str, str],
) -> TimePrediction:
    return TimePrediction(
        step_time_s=step,
        tokens_per_s_per_gpu=tokens,
        mfu=mfu,
        time_s=PredictedTime(**parts),
        calibration=rates.source,
        time_null_reasons=reasons,
    )


@functools.cache
def mfu_peak(device: str, description: str, device_name: str | None, precision: str) -> tuple[float | None, str | None]:
    """(the dense peak TFLOPS MFU divides by, or None and why): of the rates' GPU, else the profile's description."""
    if device != "cuda":
        return None, "no dense peak FLOPS for a CPU device (harness/scenario/cluster.py PEAKS)"
    name = device_name or description
    peak = find_peak(name)
    key = precisions.get(precision).peak
    if peak is None or key not in peak.tflops:
        return None, f"no dense peak FLOPS known for {name!r} ({precision}); see harness/scenario/cluster.py"
    return peak.tflops[key], None


def clear_caches() -> None:
    """Forget every prediction and shared structure of the step-time model (tests compare cold and warm ones)."""
    for f in (cell_time, step_costs, mfu_peak):
        f.cache_clear()
    compute.clear_caches()
    overlap.clear_caches()
    layout_time.clear_caches()


def describe(pred: Prediction | TimePrediction) -> str:
    """One line: the step time and its parts, or why it is null."""
    if pred.step_time_s is None:
        return f"step time unknown: {(pred.time_null_reasons or {}).get('step_time_s')}"
    t = pred.time_s.to_dict() if pred.time_s is not None else {}
    parts = ", ".join(f"{k} {t[k] * 1e3:.1f}" for k in PARTS if t.get(k) is not None)
    return f"{pred.step_time_s * 1e3:.1f} ms/step ({parts} ms)"


def null_prediction(reason: str, calibration: str) -> TimePrediction:
    """The time fields of a cell whose step time is not predicted, with the reason."""
    return TimePrediction(
        step_time_s=None,
        tokens_per_s_per_gpu=None,
        mfu=None,
        time_s=PredictedTime(**dict.fromkeys(PARTS)),
        calibration=calibration,
        time_null_reasons={"step_time_s": reason},
    )


def time_prediction(
    spec: RunSpec,
    cluster: Cluster,
    *,
    rates: Rates | None = None,
    unsupported: str | None | runnable.Unasked = runnable.UNASKED,
) -> TimePrediction:
    """The time fields `predict` adds to a cell's prediction: the cluster's rates (its calibration file, else its
    profile figures) priced by `predict_time` (`unsupported` as it takes it). A calibration of another machine makes
    them null with the reason here (the sweep goes on); `harness plan` refuses it up front (exit 2)."""
    if rates is None:
        try:
            rates = rates_for(cluster)
        except CalibrationMismatch as e:
            return null_prediction(str(e.problems[0]), "refused: " + str(e.problems[0].file))
    return predict_time(spec, cluster, rates, unsupported=unsupported)
