"""What `harness plan` prints (harness.cli.plan), rendering only: the table of planned cells (a head line, one row
per cell: memory per rank, fit, FLOPs, collectives, step time; the counts and where the step times came from), each
cell as `--format json` prints it, the training costs `--tokens` adds, and the projection table of `--project`. The
numbers are the planner's (harness.plan.predict, .training, .projection).

Units: memory in GiB per rank (GiB = 2**30), TFLOP and GB (1e9 bytes) per step over all ranks, step time in ms.
It imports nothing of the report's build (pandas, matplotlib): `harness plan` stays light.
"""

from __future__ import annotations

import math
from typing import Any

from harness.plan.calibration import Rates
from harness.plan.memory import DEVICE_RESERVE_GIB
from harness.plan.predict import usable_memory_gib
from harness.plan.prediction import PlannedCell, PredictedMemory, Prediction
from harness.plan.projection import ProjectedPoint, ProjectedRow
from harness.plan.training import TrainingCost
from harness.results.spec import spec_to_json
from harness.scenario.cluster import Cluster
from harness.scenario.spec import RunSpec


def _fmt(v: float | None, spec: str = "") -> str:
    """GiB with one decimal, or three significant digits below 1 (so the tiny model's cells read)."""
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "-"
    if spec:
        return format(v, spec)
    return format(v, ".1f") if v >= 1 or v == 0 else format(v, ".3g")


TIME_COLUMNS = ("ms/step", "tok/s/gpu", "MFU")
FITS = {True: "yes", False: "NO", None: "?"}
"""the `fits` column: fits, predicted not to fit (the device's memory or this host's), unknown"""


def time_columns(pred: Prediction) -> list[str]:
    """The table's predicted step time (ms), tokens/s per GPU and MFU of a planned cell; "-" where null."""
    step, tps, mfu = pred.step_time_s, pred.tokens_per_s_per_gpu, pred.mfu
    return [
        "-" if step is None else f"{step * 1e3:.4g}",
        "-" if tps is None else f"{tps:.4g}",
        "-" if mfu is None else f"{mfu:.1%}",
    ]


def time_footer(cells: list[PlannedCell]) -> str:
    """The table's last line: where the rates came from, and why step times are null where they are."""
    sources = sorted({c.prediction.calibration or "" for c in cells if c.prediction.calibration})
    null: dict[str, int] = {}
    for c in cells:
        if c.prediction.step_time_s is None and not c.unsupported:
            why = (c.prediction.time_null_reasons or {}).get("step_time_s", "unknown")
            null[why] = null.get(why, 0) + 1
    line = "step time: " + ("; ".join(sources) or "no rates")
    if null:
        line += "; null for " + "; ".join(f"{n} cell(s): {why}" for why, n in sorted(null.items(), key=lambda x: -x[1]))
    return line


def cell_options(spec: RunSpec) -> str:
    """The table's `opts` column: checkpointing, offload, layout, the checkpoint phase, and micro-batch × sequence."""
    s = spec.settings
    ac = s.activation_checkpointing
    return ",".join(
        o
        for o in (
            (f"ac={ac}" if ac != "none" else ""),
            (f"offload={s.offload}" if s.offload != "none" else ""),
            (f"tp{s.tp}" + (" sp" if s.sequence_parallel else "") if s.tp > 1 else ""),
            (f"pp{s.pp}:{s.pp_schedule}" if s.pp > 1 else ""),
            ("ckpt" if s.checkpoint else ""),
            f"mb{s.micro_batch}x{s.seq_len}",
        )
        if o
    )


def table_row(cell: PlannedCell) -> list[str]:
    """One cell's row: every column, or (name, opts, why it is not predicted) for a cell that cannot run or be
    placed."""
    spec, p = cell.spec, cell.prediction
    name = f"{spec.model} {spec.strategy} {spec.precision} g{spec.gpus}"
    opts = cell_options(spec)
    if cell.unsupported:
        return [name, opts, f"unsupported: {cell.unsupported}"]
    if cell.cannot_place:
        return [name, opts, f"CANNOT PLACE (skipped): {cell.cannot_place}"]
    m = p.memory_gib or PredictedMemory()
    fits = FITS[cell.fits]
    comm = p.comm_bytes_per_step
    return [
        name,
        opts,
        _fmt(m.params),
        _fmt(m.grads),
        _fmt(m.optimizer),
        _fmt(m.activations),
        _fmt(m.buffers),
        _fmt(m.total),
        fits,
        p.peak_at or "",
        _fmt(p.cpu_memory_gib) if p.cpu_memory_gib else "-",
        _fmt((p.flops_per_step or 0.0) / 1e12, ".3g"),
        _fmt(None if comm is None else comm / 1e9, ".3g"),
        *time_columns(p),
    ]


def format_table(cells: list[PlannedCell], cluster: Cluster) -> str:
    """`harness plan`'s table: a head line, one row per cell, the counts and where the step times came from."""
    usable = usable_memory_gib(cluster)
    if usable is not None:
        reserve = f"reserve {DEVICE_RESERVE_GIB:g} GiB"
        memory = f"{cluster.device_memory_gib:g} GiB per device, {usable:g} GiB usable ({reserve})"
    elif cluster.executor == "local" and cluster.device == "cpu":
        memory = "the ranks share this host's memory (a cell whose ranks need more than it has available is NO)"
    else:
        memory = "device memory unknown (nothing is marked as not fitting)"
    head = (
        f"cluster {cluster.name}: "
        + memory
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
    rows = [table_row(c) for c in cells]
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
    n_no = sum(1 for c in cells if c.fits is False)
    n_unsupported = sum(1 for c in cells if c.unsupported)
    n_unplaced = sum(1 for c in cells if c.cannot_place and not c.unsupported)
    lines.append(
        f"{len(cells)} cells; {n_no} predicted not to fit (NO)"
        + (f", {n_unsupported} unsupported" if n_unsupported else "")
        + (f", {n_unplaced} more than cluster {cluster.name} can place (the sweep skips them)" if n_unplaced else "")
    )
    host = [c.host_memory for c in cells if c.host_memory]
    if host:
        lines.append(
            f"host memory: {len(host)} cell(s) need more than this host has (the sweep skips them; --no-skip runs "
            f"them), e.g. {host[0]}"
        )
    lines.append(time_footer(cells))
    return "\n".join(lines)


def planned_cell_json(cell: PlannedCell) -> dict[str, Any]:
    """One cell as `harness plan --format json` prints it: run_id, spec, cannot_place, unsupported, then the
    prediction's fields."""
    return {
        "run_id": cell.spec.run_id,
        "spec": spec_to_json(cell.spec),
        "cannot_place": cell.cannot_place,
        "unsupported": cell.unsupported,
        # NOTE: only when set, so every other cell's document reads as before
        **({"host_memory": cell.host_memory} if cell.host_memory else {}),
        **cell.prediction.to_dict(),
    }


def format_costs(cells: list[PlannedCell], costs: list[TrainingCost], *, tokens: float) -> str:
    """The table `--tokens` adds below the plan: one row per cell with a step time, its `fits` column as the plan's.
    A cell predicted not to fit is marked NO and said so below: its days are those of a run that cannot start."""
    rows = [("cell", "fits", "days", "GPU-hours", "cost")]
    unfit = 0
    for c, t in zip(cells, costs):
        if t.days is None or t.gpu_hours is None:
            continue
        s = c.spec
        name = f"{s.model} {s.strategy} {s.precision} g{s.gpus} mb{s.settings.micro_batch}x{s.settings.seq_len}"
        name += "" if s.settings.activation_checkpointing == "none" else f" ac={s.settings.activation_checkpointing}"
        name += f" {c.spec.layout_tag}" if c.spec.layout_tag else ""
        cost = "-" if t.cost is None else f"{t.cost:,.0f}"
        unfit += c.fits is False
        rows.append((name, FITS[c.fits], f"{t.days:,.1f}", f"{t.gpu_hours:,.0f}", cost))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = [f"training {tokens:.4g} tokens at the predicted tokens/s per GPU:"]
    lines += ["  ".join(v.ljust(w) if i == 0 else v.rjust(w) for i, (v, w) in enumerate(zip(r, widths))) for r in rows]
    if unfit:
        lines.append(
            f"NO: {unfit} cell(s) predicted not to fit in memory (the plan's fits column): none can run as planned, "
            "so their days and GPU-hours are no option (more GPUs, more sharding or activation checkpointing may fit)"
        )
    why = next((t.reason for t in costs if t.days is not None and t.reason), None)
    if why:
        lines.append(f"cost: null: {why}")
    return "\n".join(lines)


def format_projection(rows: list[ProjectedRow], cluster: Cluster, gpus: list[int], rates: Rates) -> str:
    """The projection as a text table: per row, ms/step and tokens/s per GPU at each GPU count; `-` for null (the
    reasons are listed below, numbered), `!` after a value whose cell does not fit in the device's memory."""
    reasons: dict[str, int] = {}

    def cell(p: ProjectedPoint) -> str:
        if p.step_time_s is None or p.tokens_per_s_per_gpu is None:
            n = reasons.setdefault(p.reason or "unknown", len(reasons) + 1)
            return f"-[{n}]"
        mark = "!" if p.fits is False else ""
        return f"{p.step_time_s * 1e3:.4g}/{p.tokens_per_s_per_gpu:.4g}{mark}"

    head = ["model", "strategy", "prec", "settings", *[f"{g} GPUs" for g in gpus]]
    body = []
    for r in rows:
        s = r.settings
        opts = f"mb{s.micro_batch}x{s.seq_len}" + (f" ga{s.grad_accum}" if (s.grad_accum or 1) > 1 else "")
        if s.activation_checkpointing not in (None, "none"):
            opts += f" ac={s.activation_checkpointing}"
        body.append([r.model, r.layout, r.precision, opts, *[cell(p) for p in r.points]])
    widths = [max(len(x[i]) for x in [head, *body]) for i in range(len(head))]
    lines = [
        f"cluster {cluster.name} ({cluster.gpus_per_node} GPUs per node): predicted ms/step / tokens/s per GPU at "
        f"each GPU count (`!`: does not fit the device memory); rates: {rates.source}",
        "  ".join(h.ljust(w) if i < 4 else h.rjust(w) for i, (h, w) in enumerate(zip(head, widths))),
    ]
    for b in body:
        lines.append("  ".join(v.ljust(w) if i < 4 else v.rjust(w) for i, (v, w) in enumerate(zip(b, widths))))
    for why, n in reasons.items():
        lines.append(f"[{n}] {why}")
    return "\n".join(lines)
