"""Step time of tensor- and pipeline-parallel cells (harness.core.layout; docs/time-model.md: layouts): each rank's
share of the matmuls, attention and head (÷ tp), TP's collectives from harness.plan.layouts' exact model, exposed;
a pipeline's step is m · the slowest rank's per-microbatch time + (pp − 1)/v · the mean one (the bubble), its
receives on the critical path, the data-parallel collectives and the optimizer after it.

Pure arithmetic, no torch; cached with functools.cache on the (frozen) cell, executor and rates.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import NamedTuple

from harness.core.layout import effective_microbatches, stage_blocks
from harness.plan import comm as cm
from harness.plan import layouts
from harness.plan.calibration import Rates, Unknown
from harness.plan.compute import OPS, RECOMPUTE_OPS, Compute, compute_kind, host_per_op, micro_step_compute
from harness.plan.flops import precision_mode
from harness.plan.links import POINT_TO_POINT, ClusterView, host_ranks, link_on
from harness.plan.overlap import Coll, fsdp_colls, fsdp_segments, simulate, unit_of
from harness.scenario.cluster import Cluster
from harness.scenario.spec import RunSpec

LAYOUT_ON_CPU = (
    "tensor and pipeline parallelism on a CPU host: the host work of DTensor's dispatch and of the pipeline schedule, "
    "which dominates a CPU step, is not calibrated"
)


def pipeline_weights(microbatches: int, pp: int, virtual: int) -> tuple[float, float]:
    """(weight of the slowest pipeline rank's per-microbatch time, weight of every rank's) in the step:
    step = m · T_max + (pp − 1) / v · mean(T), i.e. `microbatches` × the slowest rank's time plus the fill and drain
    bubble, (pp − 1) / v of a mean rank's per-microbatch time (GPipe and 1F1B: v = 1; interleaved 1F1B with v
    stages per rank). With equal ranks: (m + (pp − 1) / v) · T, a bubble fraction (pp − 1) / (v·m + pp − 1)."""
    return float(microbatches), (pp - 1) / (virtual * pp)


def bubble_fraction(microbatches: int, pp: int, virtual: int = 1) -> float:
    """The idle share of a balanced pipeline's step: (pp − 1) / (v·m + pp − 1)."""
    w_max, w_each = pipeline_weights(microbatches, pp, virtual)
    return w_each * pp / (w_max + w_each * pp)


class LayoutComm(NamedTuple):
    """A pipeline rank's collectives by role (seconds per step): harness.plan.layouts' exact ledger for that rank,
    each call priced on its group's link."""

    tp: float
    """tensor parallelism's per-forward collectives (all of the step's forwards and backwards)"""
    tp_step: float
    """once per step (sequence parallelism's norm-weight gradients)"""
    recv: float
    """the pipeline's receives (a send is asynchronous; the receiver waits for the transfer)"""
    send: float
    dp: tuple[tuple[Coll, float], ...]
    """data parallelism's calls, (call, calls per step)"""

    @property
    def total(self) -> float:
        return self.tp + self.tp_step + self.recv + self.send + sum(c.seconds * n for c, n in self.dp)


def layout_comm(spec: RunSpec, cluster: Cluster | ClusterView, rates: Rates, *, pp_rank: int = 0) -> LayoutComm:
    """The collectives of pipeline rank `pp_rank` (its first rank) by role, priced (raises Unknown)."""
    return layout_comm_on(spec, executor=cluster.executor, rates=rates, pp_rank=pp_rank)


@functools.cache
def layout_comm_on(spec: RunSpec, *, executor: str, rates: Rates, pp_rank: int) -> LayoutComm:
    """`layout_comm` from what it reads: the cell, the executor (its links), the rates and the pipeline rank."""
    items, _ = layouts.layout_collectives(spec, ddp_buckets=cm.ddp_buckets, pp_rank=pp_rank)
    by_role = {"tp": 0.0, "tp_step": 0.0, "recv": 0.0, "send": 0.0}
    dp: list[tuple[Coll, float]] = []
    for it in items:
        link = link_on(it.group, executor=executor)
        if it.collective in POINT_TO_POINT:
            sec = rates.p2p_s(link=link, nbytes=it.bytes_per_call, dtype=it.dtype)
        else:
            sec = rates.collective_s(it.collective, link=link, ranks=it.ranks, nbytes=it.bytes_per_call, dtype=it.dtype)
        if it.role == "dp":
            dp.append(
                (Coll(it.what, it.collective, it.bytes_per_call, it.ranks, sec, unit_of(it.what), "backward"), it.calls)
            )
        else:
            by_role[it.collective if it.role == "p2p" else it.role] += sec * it.calls
    return LayoutComm(dp=tuple(dp), **by_role)


class RankTime(NamedTuple):
    """One pipeline rank's (or a tensor-parallel rank's) busy seconds, per microbatch or per micro-step."""

    compute: float
    recompute: float
    other: float
    comm: float
    """tensor parallelism's collectives and the pipeline's receives: exposed, on the critical path"""

    @property
    def total(self) -> float:
        return self.compute + self.recompute + self.other + self.comm


def stage_time(spec: RunSpec, rates: Rates, comp: Compute, *, pp_rank: int, c: float, mem: float) -> RankTime:
    """Busy seconds of one microbatch (one micro-step without a pipeline) on a rank holding `stages`, no comm:
    its blocks, the embedding's gradient on the first stage, the head, final norm and loss on the last."""
    lay = spec.layout
    stages = lay.stages_of(pp_rank)
    split = stage_blocks(spec.model_config.n_layers, lay.n_stages)
    nb = sum(len(split[st]) for st in stages)
    first, last = 0 in stages, lay.n_stages - 1 in stages
    ew = nb * comp.block_elementwise
    plain = nb * (comp.block_fwd + comp.block_bwd)
    if last:
        plain += comp.root_fwd + comp.root_bwd_head
    if first:
        plain += comp.root_bwd_embedding
    if first and last:
        ew += comp.root_elementwise
    elif last or first:  # NOTE: the root's elementwise work split as its compute is: first stage the embedding's
        root_plain = comp.root_fwd + comp.root_bwd_head + comp.root_bwd_embedding
        share = (comp.root_bwd_embedding if first else comp.root_fwd + comp.root_bwd_head) / root_plain
        ew += comp.root_elementwise * share
    rec, rec_ew = nb * comp.block_recompute, nb * comp.block_recompute_elementwise
    fwd_op, bwd_op = host_per_op(rates, spec.precision)
    mode = precision_mode(spec.strategy, spec.precision)
    ops_f, ops_b = OPS[mode]["block"]
    blk_f, blk_b = (
        (ops_f, ops_b)
        if spec.settings.activation_checkpointing == "none"
        else RECOMPUTE_OPS[(mode, spec.settings.activation_checkpointing)]
    )
    rec_ops = nb * (blk_f + blk_b - ops_f - ops_b)
    host = nb * (blk_f * fwd_op + blk_b * bwd_op) - rec_ops * bwd_op
    if last:
        host += comp.root_ops[0] * fwd_op + comp.root_ops[1] * bwd_op
    framework = rates.framework_s(spec.strategy, spec.precision, blocks=nb, elements=layout_elements(spec, pp_rank)[0])
    return RankTime(
        compute=c * (plain - ew) + mem * ew,
        recompute=c * (rec - rec_ew) + mem * rec_ew + c * rec_ops * bwd_op,
        other=c * (host + framework),
        comm=0.0,
    )


@functools.cache
def layout_elements(spec: RunSpec, pp_rank: int = 0) -> tuple[float, int]:
    """(elements this pipeline rank's AdamW updates, parameter tensors): its stages' FSDP2 shards (DDP: whole)."""
    lay = spec.layout
    elements = sum(layouts.local_stage_params(spec, stage=st)["sharded"] for st in lay.stages_of(pp_rank))
    tensors = sum(
        len(ps) for st in lay.stages_of(pp_rank) for ps in layouts.stage_units(spec.model_config, lay, st).values()
    )
    return float(elements), tensors


@dataclass(frozen=True)
class LayoutTime:
    """A tensor- or pipeline-parallel cell's step: the parts (s per step, harness.plan.time.PARTS), and under a pipeline
    what the parts do not show: each pipeline rank's busy seconds per microbatch (compute, recompute, host overhead,
    TP collectives and receives), the microbatches, and the bubble's seconds."""

    parts: dict[str, float | None]
    unknown: str | None = None
    """the rate the step lacks when a part is null (the other parts are priced)"""
    rank_s: tuple[float, ...] | None = None
    microbatches: int | None = None
    bubble_s: float | None = None


def layout_parts(spec: RunSpec, cluster: Cluster | ClusterView, rates: Rates, *, overlap: bool) -> LayoutTime:
    """The step of a tensor- or pipeline-parallel cell (raises Unknown; docs/time-model.md: layouts)."""
    if spec.layout.pp == 1:
        return _tensor_parallel_step(spec, executor=cluster.executor, rates=rates, overlap=overlap)
    return _pipeline_step(spec, executor=cluster.executor, rates=rates)


def _tensor_parallel_step(spec: RunSpec, *, executor: str, rates: Rates, overlap: bool) -> LayoutTime:
    """Tensor parallelism without a pipeline: one rank's micro-steps, TP's collectives exposed, FSDP2's beside the
    compute."""
    s = spec.settings
    R = host_ranks(spec.gpus, spec.gpus_per_node, executor=executor)
    c, mem = rates.share(compute_kind(spec.precision), ranks=R), rates.share("memory", ranks=R)
    A = s.grad_accum
    comp = micro_step_compute(spec, rates)
    own = stage_time(spec, rates, comp, pp_rank=0, c=c, mem=mem)
    lc = layout_comm_on(spec, executor=executor, rates=rates, pp_rank=0)
    elements, tensors = layout_elements(spec)
    dp_total = sum(co.seconds * n for co, n in lc.dp)
    dp_exposed = dp_total
    if overlap and dp_total and rates.overlap(ranks_on_host=R):
        # FSDP2 over the tensor-parallel shards: gathers one unit ahead and reduce-scatters after each unit's
        # backward, as without tensor parallelism, beside the compute (TP's collectives are not compute)
        L = spec.model_config.n_layers
        segs = [c * x for x in fsdp_segments(comp, L, A)]
        end = simulate(segs, fsdp_colls(lc.dp, n_layers=L, grad_accum=A))
        dp_exposed = max(0.0, min(dp_total, end - sum(segs)))
    parts: dict[str, float | None] = {
        "compute": A * own.compute,
        "recompute": A * own.recompute,
        "optimizer": None,
        "comm_exposed": lc.tp + lc.tp_step + dp_exposed,
        "comm_total": lc.total,
        "other": A * own.other,
    }
    try:
        parts["optimizer"] = rates.share("optimizer", ranks=R) * rates.optimizer_s(elements=elements, tensors=tensors)
    except Unknown as e:  # NOTE: the other parts stand, the step is null
        return LayoutTime(parts=parts, unknown=str(e))
    return LayoutTime(parts=parts)


def _pipeline_step(spec: RunSpec, *, executor: str, rates: Rates) -> LayoutTime:
    """A pipeline: m · the slowest rank's per-microbatch time + the bubble, its receives on the critical path, the
    data-parallel collectives and the optimizer after it."""
    s, lay = spec.settings, spec.layout
    R = host_ranks(spec.gpus, spec.gpus_per_node, executor=executor)
    c, mem = rates.share(compute_kind(spec.precision), ranks=R), rates.share("memory", ranks=R)
    opt_share = rates.share("optimizer", ranks=R)
    m = effective_microbatches(s.microbatches, lay.pp)
    comp = micro_step_compute(spec, rates, batch=s.micro_batch // m)
    ranks: list[RankTime] = []
    after: list[tuple[float, float]] = []
    for r in range(lay.pp):
        lc = layout_comm_on(spec, executor=executor, rates=rates, pp_rank=r)
        own = stage_time(spec, rates, comp, pp_rank=r, c=c, mem=mem)
        ranks.append(own._replace(comm=(lc.tp + lc.recv) / m))
        elements, tensors = layout_elements(spec, r)
        opt = opt_share * rates.optimizer_s(elements=elements, tensors=tensors)
        after.append((lc.tp_step + sum(co.seconds * n for co, n in lc.dp), opt))
    w_max, w_each = pipeline_weights(m, lay.pp, lay.stages_per_rank)
    slow = max(ranks, key=lambda t: t.total)

    def weighted(field: str) -> float:
        return w_max * getattr(slow, field) + w_each * sum(getattr(t, field) for t in ranks)

    dp, opt = max(after, key=lambda x: x[0] + x[1])
    # NOTE: nothing of a pipeline's communication overlaps here: TP's and the receives are on the critical path,
    # data parallelism's run before the first forward and after the last backward (docs/time-model.md)
    comm = weighted("comm") + dp
    parts: dict[str, float | None] = {
        "compute": weighted("compute"),
        "recompute": weighted("recompute"),
        "optimizer": opt,
        "comm_exposed": comm,
        "comm_total": comm,
        "other": weighted("other"),
    }
    bubble = w_each * sum(t.total for t in ranks)
    return LayoutTime(parts=parts, rank_s=tuple(t.total for t in ranks), microbatches=m, bubble_s=bubble)


def clear_caches() -> None:
    """Forget every layout cell's priced collectives and optimizer size (tests compare cold and warm predictions)."""
    for f in (layout_comm_on, layout_elements):
        f.cache_clear()
