"""What `harness plan` prints (harness.cli.plan), rendering only: the table of planned cells (by default one block per
(model, GPU count) with the columns that matter — memory per rank, fits, step time, tokens/s per GPU, MFU against the
precision's own peak and against bf16's, the rank; `--wide`: one row per cell with every column), the counts, the MFU
legend and where the step times came from (one line: a profile's sources are `harness show cluster NAME`'s), the
recommendation per (model, GPU count) (harness.plan.recommend), each cell as `--format json` prints it, the training
costs `--tokens` adds, and the projection table of `--project`. The numbers are the planner's (harness.plan.predict,
.recommend, .training, .projection).

Units: memory in GiB per rank (GiB = 2**30), TFLOP and GB (1e9 bytes) per step over all ranks, step time in ms.
Prose is wrapped to the width harness.cli.plan gives (the terminal's, or PIPE_WIDTH when stdout is not one); table rows
are not. It imports nothing of the report's build (pandas, matplotlib): `harness plan` stays light.
"""

from __future__ import annotations

import math
from typing import Any

from harness.core.text import KEEP, wrap
from harness.plan.calibration import Rates
from harness.plan.memory import DEVICE_RESERVE_GIB
from harness.plan.predict import BF16, usable_memory_gib
from harness.plan.prediction import PlannedCell, PredictedMemory, Prediction
from harness.plan.projection import ProjectedPoint, ProjectedRow
from harness.plan.recommend import (
    FASTEST_PREDICTED,
    RUNNER_UP,
    Group,
    Recommendations,
    Standing,
    cell_words,
    faster_words,
    group_name,
    no_recommendation_head,
    option_list,
    recommendation_head,
    runner_up_words,
    short_words,
    slower_words,
    standing_json,
)
from harness.plan.training import TrainingCost
from harness.results.spec import spec_to_json
from harness.scenario.cluster import Cluster, profile_path
from harness.scenario.spec import RunSpec


def _fmt(v: float | None, spec: str = "") -> str:
    """GiB with one decimal, or three significant digits below 1 (so the tiny model's cells read)."""
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "-"
    if spec:
        return format(v, spec)
    return format(v, ".1f") if v >= 1 or v == 0 else format(v, ".3g")


TIME_COLUMNS = ("ms/step", "tok/s/gpu", "MFU", "MFU bf16")
"""the step-time columns: MFU against the cell's own precision's dense peak, and against the device's bf16 dense peak
(the same figure for a bf16 cell; for fp32 it is the one that compares with bf16's)"""
FITS = {True: "yes", False: "NO", None: "?"}
"""the `fits` column: fits, predicted not to fit (the device's memory or this host's), unknown"""
STAR = "★"
"""the rank column's mark of the recommended cell"""
PIPE_WIDTH = 100
"""the width prose is wrapped to when stdout is no terminal (tests, pipes, files): deterministic"""
UNWRAPPED = 10**6
"""a width no line reaches: prose left on one line each"""


def _pct(v: float | None) -> str:
    return "-" if v is None else f"{v:.1%}"


def time_columns(pred: Prediction, mfu_bf16: float | None = None) -> list[str]:
    """The table's predicted step time (ms), tokens/s per GPU, MFU (the precision's own peak) and MFU against the
    bf16 dense peak of a planned cell; "-" where null."""
    step, tps = pred.step_time_s, pred.tokens_per_s_per_gpu
    return [
        "-" if step is None else _sig4(step * 1e3),
        "-" if tps is None else _sig4(tps),
        _pct(pred.mfu),
        _pct(mfu_bf16),
    ]


def _sig4(v: float) -> str:
    """Four significant digits below 1,000 and the whole number above, never an exponent: 11,790 ms reads 11790, not
    1.179e+04."""
    return f"{v:.0f}" if abs(v) >= 1000 else f"{v:.4g}"


def show_command(cluster: Cluster) -> str:
    """The command that prints the profile's figures with their full sources: by name when the name finds this
    profile, else by its path."""
    found = profile_path(cluster.name)
    same = found is not None and found.resolve() == _resolved(cluster.path)
    return f"harness show cluster {cluster.name if same else cluster.path}"


def _resolved(path: str) -> Any:
    from pathlib import Path

    return Path(path).expanduser().resolve()


def rates_words(source: str, cluster: Cluster) -> str:
    """The rates' source in a few words: a profile's figures are named, not quoted (their sources fill a page: the
    command that prints them follows); a calibration's file and date are short already."""
    cut = source.find("profile figures (")
    if cut < 0:
        return source
    return f"{source[:cut]}the {cluster.name} profile's figures (their sources: `{show_command(cluster)}`)"


def time_footer(cells: list[PlannedCell], cluster: Cluster | None = None) -> str:
    """The table's last line: where the rates came from (a profile's sources as the command that prints them), and
    why step times are null where they are."""
    sources = sorted({c.prediction.calibration or "" for c in cells if c.prediction.calibration})
    if cluster is not None:
        sources = sorted({rates_words(x, cluster) for x in sources})
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
    return ",".join(option_list(spec))


def _memory_columns(cell: PlannedCell) -> list[str]:
    p = cell.prediction
    m = p.memory_gib or PredictedMemory()
    return [_fmt(m.params), _fmt(m.grads), _fmt(m.optimizer), _fmt(m.activations), _fmt(m.buffers), _fmt(m.total)]


def rank_column(standing: Standing | None) -> str:
    """'1 ★' for the recommended cell, its rank for another that fits with the headroom, '-' for the rest."""
    if standing is None or standing.rank is None:
        return "-"
    return f"{standing.rank} {STAR}" if standing.recommended else str(standing.rank)


def table_row(cell: PlannedCell, standing: Standing | None = None) -> list[str]:
    """One cell's row of the wide table: every column, or (name, opts, why it is not predicted) for a cell that
    cannot run or be placed."""
    spec, p = cell.spec, cell.prediction
    name = f"{spec.model} {spec.strategy} {spec.precision} g{spec.gpus}"
    opts = cell_options(spec)
    if cell.unsupported:
        return [name, opts, f"unsupported: {cell.unsupported}"]
    if cell.cannot_place:
        return [name, opts, f"CANNOT PLACE (skipped): {cell.cannot_place}"]
    comm = p.comm_bytes_per_step
    return [
        name,
        opts,
        *_memory_columns(cell),
        FITS[cell.fits],
        p.peak_at or "",
        _fmt(p.cpu_memory_gib) if p.cpu_memory_gib else "-",
        _fmt((p.flops_per_step or 0.0) / 1e12, ".3g"),
        _fmt(None if comm is None else comm / 1e9, ".3g"),
        *time_columns(p, cell.mfu_bf16_peak),
        rank_column(standing),
    ]


WIDE_COLUMNS = (
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
    "rank",
)
"""`harness plan --wide`'s columns: every one"""


def _aligned(rows: list[list[str]], *, left: int, indent: str = "") -> list[str]:
    """Rows of equal length as columns two spaces apart, the first `left` left-aligned, the rest right-aligned."""
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return [
        indent + "  ".join(v.ljust(w) if i < left else v.rjust(w) for i, (v, w) in enumerate(zip(r, widths))).rstrip()
        for r in rows
    ]


def _head(cluster: Cluster) -> str:
    usable = usable_memory_gib(cluster)
    if usable is not None:
        reserve = f"reserve {DEVICE_RESERVE_GIB:g} GiB"
        memory = f"{cluster.device_memory_gib:g} GiB per device, {usable:g} GiB usable ({reserve})"
    elif cluster.executor == "local" and cluster.device == "cpu":
        memory = "the ranks share this host's memory (a cell whose ranks need more than it has available is NO)"
    else:
        memory = "device memory unknown (nothing is marked as not fitting)"
    return f"cluster {cluster.name}: " + memory


def _counts(cells: list[PlannedCell], cluster: Cluster) -> list[str]:
    """The counts line, and the host-memory line where a local cell needs more than this host has."""
    n_no = sum(1 for c in cells if c.fits is False)
    n_unsupported = sum(1 for c in cells if c.unsupported)
    n_unplaced = sum(1 for c in cells if c.cannot_place and not c.unsupported)
    lines = [
        f"{len(cells)} cells; {n_no} predicted not to fit (NO)"
        + (f", {n_unsupported} unsupported" if n_unsupported else "")
        + (f", {n_unplaced} more than cluster {cluster.name} can place (the sweep skips them)" if n_unplaced else "")
    ]
    host = [c.host_memory for c in cells if c.host_memory]
    if host:
        lines.append(
            f"host memory: {len(host)} cell(s) need more than this host has (the sweep skips them; --no-skip runs "
            f"them), e.g. {host[0]}"
        )
    return lines


def format_table(
    cells: list[PlannedCell],
    cluster: Cluster,
    *,
    recs: Recommendations | None = None,
    wide: bool = False,
    width: int = PIPE_WIDTH,
    peak: str | None = None,
) -> str:
    """`harness plan`'s table: a head line, the cells, the counts, what the MFU columns divide by, and where the step
    times came from (one line: a profile's sources are `harness show cluster`'s).

    By default the columns that matter, one block per (model, GPU count) — the settings its cells share in its head,
    each row the strategy, precision and the settings that differ: predicted memory per rank, fits, ms/step,
    tokens/s per GPU, both MFUs and the rank (`recs`: harness.plan.recommend). `wide`: one row per cell with every
    column (memory parts, the peak's moment, host memory, FLOPs, collective bytes). `peak`: the bf16 dense peak's
    words for the MFU legend. Prose lines are wrapped to `width` (not `wide`: its rows are wider than any terminal);
    table rows are not."""
    standings: list[Standing | None] = list(recs.standings) if recs is not None else [None] * len(cells)
    width = UNWRAPPED if wide else width  # NOTE: the wide table is wider than any terminal: its prose is not wrapped
    head = _head(cluster) + (
        "; memory in GiB per rank at its peak (grads: those allocated then), FLOPs per step over all ranks"
        if wide
        else "; GiB: predicted memory per rank at its peak"
    )
    lines = wrap(head, width)
    lines += _wide_rows(cells, standings) if wide else _grouped_rows(cells, standings, width=width)
    lines += _counts(cells, cluster)
    legend = (
        "MFU: model FLOPs/s over the precision's own dense peak; MFU bf16: over the device's bf16 dense peak"
        + (f" ({peak})" if peak else "")
        + ", for every precision, so cells of different precisions compare"
    )
    if recs is not None:
        legend += f"; rank: by predicted tok/s/gpu among the cells that fit with {recs.headroom_gib:g} GiB headroom"
        legend += f", {STAR} the recommended one"
    if not wide:
        legend += "; --wide: every column (memory parts, FLOPs, collective bytes)"
    lines += wrap(legend, width)
    lines += wrap(time_footer(cells, cluster), width)  # NOTE: never inside a word: a calibration's path stays whole
    return "\n".join(lines)


def _wide_rows(cells: list[PlannedCell], standings: list[Standing | None]) -> list[str]:
    """The wide table's header and rows (a cell that cannot run or be placed: name, opts and why)."""
    cols = list(WIDE_COLUMNS)
    rows = [table_row(c, s) for c, s in zip(cells, standings)]
    full = [r for r in rows if len(r) == len(cols)]
    widths = [
        max([len(cols[i])] + [len(r[i]) for r in full] + [len(r[i]) for r in rows if len(r) < len(cols) and i < 2])
        for i in range(len(cols))
    ]
    lines = ["  ".join(c.ljust(w) if i < 2 else c.rjust(w) for i, (c, w) in enumerate(zip(cols, widths)))]
    for r in rows:
        if len(r) < len(cols):
            lines.append("  ".join([r[0].ljust(widths[0]), r[1].ljust(widths[1]), r[2]]))
        else:
            lines.append("  ".join(v.ljust(w) if i < 2 else v.rjust(w) for i, (v, w) in enumerate(zip(r, widths))))
    return lines


COMPACT_COLUMNS = ("cell", "GiB", "fits", *TIME_COLUMNS, "rank")
"""the default table's columns (a `cpu GiB` column joins them where a cell offloads to host memory)"""


def _grouped_rows(cells: list[PlannedCell], standings: list[Standing | None], *, width: int = UNWRAPPED) -> list[str]:
    """The default table: per (model, GPU count), a head line with the settings its cells share, then one row per
    cell with the columns that matter; every block aligned alike. A cell that cannot run says why in place of its
    numbers; one that does not fit in `width` columns is numbered, and said in full below its block."""
    groups: dict[tuple[str, int], list[int]] = {}
    for i, c in enumerate(cells):
        groups.setdefault((c.spec.model, c.spec.gpus), []).append(i)
    offload = any(c.prediction.cpu_memory_gib for c in cells if not c.unsupported)
    header = [*COMPACT_COLUMNS[:3], *(["cpu GiB"] if offload else []), *COMPACT_COLUMNS[3:]]
    blocks: list[tuple[str, list[tuple[list[str], str | None]]]] = []
    for (model, gpus), members in groups.items():
        opts = {i: option_list(cells[i].spec) for i in members}
        common = [o for o in opts[members[0]] if all(o in opts[i] for i in members)]
        title = group_name(model, gpus) + (f", every cell {' '.join(common)}" if common else "")
        rows: list[tuple[list[str], str | None]] = []
        for i in members:
            c, spec = cells[i], cells[i].spec
            label = " ".join([spec.strategy, spec.precision, *(o for o in opts[i] if o not in common)])
            if c.unsupported or c.cannot_place:
                why = f"unsupported: {c.unsupported}" if c.unsupported else f"CANNOT PLACE (skipped): {c.cannot_place}"
                rows.append(([label], why))
                continue
            p = c.prediction
            total = p.memory_gib.total if p.memory_gib is not None else None
            cpu = [_fmt(p.cpu_memory_gib) if p.cpu_memory_gib else "-"] if offload else []
            columns = [label, _fmt(total), FITS[c.fits], *cpu, *time_columns(p, c.mfu_bf16_peak)]
            rows.append(([*columns, rank_column(standings[i])], None))
        blocks.append((title, rows))
    full = [header] + [r for _, rows in blocks for r, why in rows if why is None]
    widths = [max(len(r[k]) for r in full) for k in range(len(header))]
    widths[0] = max([widths[0]] + [len(r[0]) for _, rows in blocks for r, _ in rows])

    def line(r: list[str]) -> str:
        return "  " + "  ".join(v.ljust(w) if k == 0 else v.rjust(w) for k, (v, w) in enumerate(zip(r, widths)))

    lines = []
    for title, rows in blocks:
        lines += [title, line(header)]
        notes: dict[str, int] = {}
        for r, said in rows:
            row = f"  {r[0].ljust(widths[0])}  {said}" if said is not None else line(r)
            if said is not None and len(row) > width:
                # NOTE: a reason too long for the terminal goes below the block, numbered, each distinct one once
                kind, _, reason = said.partition(": ")
                n = notes.setdefault(reason, len(notes) + 1)
                row = f"  {r[0].ljust(widths[0])}  {kind} [{n}]"
            lines.append(row)
        for reason, n in notes.items():
            lines += wrap(f"[{n}] {reason}", width, indent="  ")
    return lines


def planned_cell_json(
    cell: PlannedCell, standing: Standing | None = None, *, headroom_gib: float | None = None
) -> dict[str, Any]:
    """One cell as `harness plan --format json` prints it: run_id, spec, cannot_place, unsupported, then the
    prediction's fields, the MFU against the bf16 dense peak, and — with its `standing` (harness.plan.recommend) —
    whether it is recommended, its rank, why (`rank_note`), the memory it leaves and what the published runs say of
    its family's predictions."""
    pred = cell.prediction.to_dict()
    if (
        cell.mfu_bf16_peak is None
        and cell.mfu_bf16_peak_null_reason
        and isinstance(pred.get("time_null_reasons"), dict)
    ):
        pred["time_null_reasons"] = {**pred["time_null_reasons"], "mfu_bf16_peak": cell.mfu_bf16_peak_null_reason}
    doc = {
        "run_id": cell.spec.run_id,
        "spec": spec_to_json(cell.spec),
        "cannot_place": cell.cannot_place,
        "unsupported": cell.unsupported,
        # NOTE: only when set, so every other cell's document reads as before
        **({"host_memory": cell.host_memory} if cell.host_memory else {}),
        **pred,
        "mfu_bf16_peak": cell.mfu_bf16_peak,
    }
    if standing is not None:
        doc.update(standing_json(standing, headroom_gib=headroom_gib if headroom_gib is not None else 0.0))
    return doc


def cost_name(spec: RunSpec) -> str:
    """A cell as the training-cost table names it."""
    s = spec.settings
    name = f"{spec.model} {spec.strategy} {spec.precision} g{spec.gpus} mb{s.micro_batch}x{s.seq_len}"
    name += "" if s.activation_checkpointing == "none" else f" ac={s.activation_checkpointing}"
    return name + (f" {spec.layout_tag}" if spec.layout_tag else "")


def format_costs(
    cells: list[PlannedCell],
    costs: list[TrainingCost],
    *,
    tokens: float,
    recs: Recommendations | None = None,
    wide: bool = True,
    width: int = UNWRAPPED,
) -> str:
    """The table `--tokens` adds below the plan: one row per cell with a step time, its `fits` column as the plan's.
    A cell predicted not to fit is marked NO and said so below: its days are those of a run that cannot start. Not
    `wide`: only the cells that fit (with the headroom, given `recs`) are listed, how many were left out is said, and
    the notes are wrapped to `width`."""
    rows = [("cell", "fits", "days", "GPU-hours", "cost")]
    unfit = left_out = 0
    standings = list(recs.standings) if recs is not None else [None] * len(cells)
    for c, t, st in zip(cells, costs, standings):
        if t.days is None or t.gpu_hours is None:
            continue
        fits = c.fits is True and (st is None or st.over_gib is None or st.over_gib <= 1e-9)
        if not wide and not fits:
            left_out += 1
            continue
        cost = "-" if t.cost is None else f"{t.cost:,.0f}"
        unfit += c.fits is False
        rows.append((cost_name(c.spec), FITS[c.fits], f"{t.days:,.1f}", f"{t.gpu_hours:,.0f}", cost))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = [f"training {tokens:.4g} tokens at the predicted tokens/s per GPU:"]
    lines += ["  ".join(v.ljust(w) if i == 0 else v.rjust(w) for i, (v, w) in enumerate(zip(r, widths))) for r in rows]
    width = UNWRAPPED if wide else width  # NOTE: as the table's: `--wide` prose is not wrapped
    if unfit:
        lines += wrap(
            f"NO: {unfit} cell(s) predicted not to fit in memory (the plan's fits column): none can run as planned, "
            "so their days and GPU-hours are no option (more GPUs, more sharding or activation checkpointing may fit)",
            width,
        )
    if left_out:
        headroom = f" with {recs.headroom_gib:g} GiB headroom" if recs is not None else ""
        lines += wrap(f"left out: {left_out} cell(s) that do not fit{headroom} (--wide lists them)", width)
    why = next((t.reason for t in costs if t.days is not None and t.reason), None)
    if why:
        lines += wrap(f"cost: null: {why}", width)
    return "\n".join(lines)


def format_recommendations(
    cells: list[PlannedCell],
    recs: Recommendations,
    *,
    costs: list[TrainingCost] | None = None,
    tokens: float | None = None,
    width: int = PIPE_WIDTH,
) -> str:
    """The plan's answer (harness.plan.recommend), one block per (model, GPU count): the recommended cell with its
    predicted tokens/s per GPU, step time, both MFUs, memory and what it leaves, days and cost for `--tokens`; the
    runner-up and by how much it is slower; the cells predicted faster that do not fit, and by how much; the cells
    that fit without a predicted step time; and the prediction's error as the published runs give it per family."""
    asked = (
        f" ({recs.headroom_from})"
        if recs.headroom_from
        else ""
        if recs.asked_headroom_gib is not None
        else " (the CUDA context/NCCL reserve; --headroom GIB for more)"
    )
    lines = wrap(
        f"recommendation per model and GPU count: {FASTEST_PREDICTED} with {recs.headroom_gib:g} GiB of device "
        f"memory left free{asked}",
        width,
    )
    why = {g.why_none for g in recs.groups}
    if len(recs.groups) > 1 and all(g.winner is None and not g.unpriced for g in recs.groups) and len(why) == 1:
        # NOTE: one reason for every group (a profile without device memory): said once, not once per group
        lines += wrap(f"no recommendation for any of the {len(recs.groups)} (model, GPU count): {why.pop()}", width)
        return "\n".join(lines)
    for g in recs.groups:
        lines += _group_block(cells, recs, g, costs=costs, tokens=tokens, width=width)
    return "\n".join(lines)


def _group_block(
    cells: list[PlannedCell],
    recs: Recommendations,
    g: Group,
    *,
    costs: list[TrainingCost] | None,
    tokens: float | None,
    width: int,
) -> list[str]:
    if g.winner is None:
        lines = wrap(no_recommendation_head(g.model, g.gpus, g.why_none or "nothing fits"), width)
        if g.unpriced:
            lines += _unpriced_lines(cells, g, width)
        return lines
    w = cells[g.winner]
    st = recs.standings[g.winner]
    p = w.prediction
    lines = wrap(recommendation_head(g.model, g.gpus, _name(w), basis=FASTEST_PREDICTED), width)
    total = p.memory_gib.total if p.memory_gib is not None else None
    mfu = f"MFU {_pct(p.mfu)} of {w.spec.precision}'s dense peak"
    if w.spec.precision != BF16:
        mfu += f", {_pct(w.mfu_bf16_peak)} of bf16's"
    facts = (
        f"predicted {p.tokens_per_s_per_gpu:,.0f} tok/s/GPU, {(p.step_time_s or 0) * 1e3:,.0f} ms/step, {mfu}; "
        f"{_fmt(total)} GiB per rank, {_fmt(st.memory_left_gib)} GiB of {p.device_memory_gib:g} left free "
        f"({recs.headroom_gib:g} GiB headroom asked)"
    )
    lines += wrap(facts, width, indent="  ")
    if costs is not None and tokens is not None:
        t = costs[g.winner]
        if t.days is not None and t.gpu_hours is not None:
            cost = (
                f"cost {t.cost:,.0f}" if t.cost is not None else "cost unknown: the profile has no price_per_gpu_hour"
            )
            text = f"{tokens:.4g} tokens: {t.days:,.1f} days on {g.gpus} GPUs, {t.gpu_hours:,.0f} GPU-hours, {cost}"
            lines += wrap(text, width, indent="  ")
    best = p.tokens_per_s_per_gpu or 0.0
    margin = None
    if g.runner_up is not None:
        r = cells[g.runner_up]
        margin = best / (r.prediction.tokens_per_s_per_gpu or best) - 1.0
        lines += wrap(runner_up_words(_name(r), slower_words(margin)), width, indent="  ")
    else:
        text = f"{RUNNER_UP}: none: no other strategy fits with {recs.headroom_gib:g} GiB headroom"
        if g.next_ranked is not None:
            n = cells[g.next_ranked]
            text += f"; next: {_name(n)}, {slower_words(best / (n.prediction.tokens_per_s_per_gpu or best) - 1.0)}"
        lines += wrap(text, width, indent="  ")
    if g.faster_unfit:
        shown = []
        for i in g.faster_unfit[:3]:
            c, over = cells[i], recs.standings[i].over_gib
            gain = (c.prediction.tokens_per_s_per_gpu or 0.0) / best - 1.0 if best else 0.0
            short = short_words(max(over, 0.0)) if over is not None else "does not fit this host's memory"
            shown.append(f"{_name(c)}, {faster_words(gain)}, {short}")
        more = len(g.faster_unfit) - len(shown)
        text = "faster, but does not fit: " + "; ".join(shown) + (f"; and {more} more" if more > 0 else "")
        lines += wrap(text, width, indent="  ")
    if g.unpriced:
        lines += _unpriced_lines(cells, g, width)
    lines += wrap(_uncertainty(cells, recs, g, margin), width, indent="  ")
    return lines


def _name(cell: PlannedCell) -> str:
    """A cell's words for a wrapped line: never split across two lines."""
    return cell_words(cell).replace(" ", KEEP)


def _unpriced_lines(cells: list[PlannedCell], g: Group, width: int) -> list[str]:
    reasons = sorted(
        {(cells[i].prediction.time_null_reasons or {}).get("step_time_s") or "unknown" for i in g.unpriced}
    )
    text = (
        f"not ranked: {len(g.unpriced)} cell(s) that fit have no predicted step time and may be faster; measure them "
        f"(harness tune): {'; '.join(reasons)}"
    )
    return wrap(text, width, indent="  ")


def _uncertainty(cells: list[PlannedCell], recs: Recommendations, g: Group, margin: float | None) -> str:
    """What the published runs say of the recommended cell's and the runner-up's predictions, and whether the gap
    between them is inside that error."""
    assert g.winner is not None
    picks = [(g.winner, "recommended")] + ([(g.runner_up, "runner-up")] if g.runner_up is not None else [])
    said: dict[str, list[str]] = {}
    checks = []
    for i, role in picks:
        check = recs.standings[i].check
        if check is None:
            continue
        if check.figures() not in said:
            checks.append(check)
        said.setdefault(check.figures(), []).append(f"{role} ({check.family} {check.precision})")
    text = "uncertainty: " + "; ".join(f"{' and '.join(roles)}: {words}" for words, roles in said.items())

    if margin is not None:
        unchecked = [c.family for c in checks if c.runs == 0 or c.mape is None]
        mapes = [c.mape for c in checks if c.mape is not None]
        gap = f"{margin:.1%}"
        if unchecked:
            text += (
                f". The {gap} between them rests on a time model no published run checks ({', '.join(unchecked)}): "
                "a prediction to measure (harness tune), not a measurement"
            )
        elif mapes and margin < max(mapes):
            text += f". The {gap} between them is inside that error: measure both before choosing (harness tune)"
    return text


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
