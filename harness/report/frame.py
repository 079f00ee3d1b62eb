"""Records → one pandas DataFrame, one row per record of any status; the cell table the report shows.

The columns are the cell's identity (from its spec), every quantity of the metric registry
(harness.results.metrics: a metric added there is a column here, in table.csv and table.parquet), and where it
ran. Every metric is copied as the record has it: a null (or a field the record lacks, such as a missing `comm`
or `predicted` section) stays NaN here and becomes "n/a" in the tables, never 0. A field of the wrong type was
read as null, with a warning, by harness.results.store.
"""

from __future__ import annotations

import math
import operator
import re
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from harness.core.catalogue import CATALOGUE
from harness.results.metrics import (
    MEMORY_CATEGORIES,
    METRICS,
    PREDICTED_PARTS,
    Metric,
    MetricReader,
    finite_number,
)
from harness.results.record import Record
from harness.results.store import iter_records
from harness.scenario.spec import PRECISIONS, STRATEGIES

# Spec fields besides (model, strategy, precision, gpus) that make two records different cells when they
# vary within a report (e.g. two micro-batch sizes); label → short form in row labels.
VARIANT_FIELDS: dict[str, str] = {
    "nodes": "nodes",
    "micro_batch": "mb",
    "seq_len": "seq",
    "grad_accum": "ga",
    "activation_checkpointing": "ac",
    "offload": "offload",
    "measure_steps": "steps",
}
"""NOTE: measure_steps makes two cells too: runs of 2 and of 5 timed steps are not runs of one cell (`harness tune`'s
rounds measure a candidate with fewer steps than its final round: each round's trials are cells of their own)"""
LAYOUT_SEP = " × "
"""between a strategy and its layout in the label the report shows: `fsdp2.full_shard × tp2 × pp2 (1f1b)`"""
LAYOUT_COLUMNS: tuple[str, ...] = ("tp", "pp", "pp_schedule", "microbatches", "sequence_parallel")
"""the record's spec fields of a cell's tensor/pipeline layout (harness.scenario.spec.LAYOUT_SETTINGS); a
record without them (written before layouts existed) ran tp 1, pp 1"""
CELL_KEYS = ("model", "strategy", "precision", "variant", "gpus")
"""`strategy` is the label with the layout (strategy_label), so two layouts of one strategy are two cells"""
ROW_KEYS = ("strategy", "precision", "variant")
PREDICTED_TIME_COLUMNS: tuple[str, ...] = tuple(f"predicted_{p}_s" for p in PREDICTED_PARTS)
TRACES_SEP = ";"
"""between the paths of a cell's traces in the `traces` column (table.csv)"""
MEASURED_TIME_COLUMNS: tuple[str, ...] = tuple(f"measured_{p}_s" for p in PREDICTED_PARTS)
"""the traced step's measured parts (trace: true), beside PREDICTED_TIME_COLUMNS"""
MEASURED_MEMORY_COLUMNS: tuple[str, ...] = ("memory_total_gib", *(f"memory_{c}_gib" for c in MEMORY_CATEGORIES))
"""the tensor memory measured at the peak of one untimed step (metrics.memory_gib), its total first, then by
category (GiB); NaN in records from before the measurement"""
PREDICTED_MEMORY_COLUMNS: tuple[str, ...] = tuple(f"predicted_memory_{c}_gib" for c in MEMORY_CATEGORIES)
"""the planner's predicted memory by category (predicted.memory_gib; its total is `predicted_memory_gib`)"""
PREDICTION_BAND = 0.15
"""the ± band around exact that the report counts a prediction within (and draws around the prediction figure's
diagonal): issue 16's accuracy target, MAPE <= 15 %"""

IDENTITY_COLUMNS: tuple[str, ...] = (
    "sweep",
    "cluster",
    "run_id",
    "repeat",
    "status",
    "reason",
    "failed_rank",
    "model",
    "n_params",
    "strategy",
    "base_strategy",
    "layout",
    *LAYOUT_COLUMNS,
    "precision",
    "gpus",
    "variant",
    *VARIANT_FIELDS,
)
"""what the cell is, from its record's spec"""
TEXT_COLUMNS: dict[str, str] = {
    "mfu_null_reason": "mfu",
    "memory_measure": "device_memory_gib",
    "prediction_source": "step_time_deviation",
    "predicted_time_null_reason": "prediction_source",
    "traces": "measured_spread_s",
}
"""a text column of the table → the column it follows"""
PLACE_AFTER_LOSS = "loss"
"""where the columns of metrics the layout does not place go: after the loss, before where the record ran"""
_LAYOUT: tuple[str, ...] = (
    "tokens_per_s",
    "tokens_per_s_per_gpu",
    "tflops_per_gpu",
    "mfu",
    "step_time_median_s",
    "step_time_p10_s",
    "step_time_p90_s",
    "step_time_mean_s",
    "n_step_samples",
    "peak_memory_allocated_gib",
    "peak_memory_reserved_gib",
    "memory_fragmentation_gib",
    *MEASURED_MEMORY_COLUMNS,
    "predicted_memory_gib",
    *PREDICTED_MEMORY_COLUMNS,
    "memory_deviation",
    "device_memory_gib",
    "comm_bytes_per_step",
    "comm_calls_per_step",
    "predicted_comm_bytes_per_step",
    "predicted_step_time_s",
    *(f"predicted_{p}_s" for p in PREDICTED_PARTS),
    "predicted_comm_total_s",
    "step_time_deviation",
    "loss",
)
"""the order of the registry's columns in the table (the registry's order is compare's)"""
ENV_COLUMNS: tuple[str, ...] = (
    "device_name",
    "device_type",
    "backend",
    "harness_git_sha",
    "started_at",
    "finished_at",
    "path",
)
"""where and when it ran, and the record's file"""
METRIC_COLUMNS: dict[str, Metric] = {m.column: m for m in METRICS}
"""the registry's quantities by their column"""
_METRIC_READER = MetricReader(tuple(METRIC_COLUMNS.values()))


def _measurement_columns() -> tuple[str, ...]:
    """The registry's columns in the layout's order (a metric the layout does not name after the loss), with the
    text columns after the column each follows."""
    placed = [c for c in _LAYOUT if c in METRIC_COLUMNS]
    at = placed.index(PLACE_AFTER_LOSS) + 1
    placed[at:at] = [c for c in METRIC_COLUMNS if c not in placed]
    for text, after in TEXT_COLUMNS.items():
        placed.insert(placed.index(after) + 1, text)
    return tuple(placed)


# Scalar columns of the frame and of table.csv / table.parquet, in order. Units are in the names: _s seconds,
# _gib GiB (2**30 bytes), _bytes bytes; mfu is a fraction (0.412 = 41.2 %).
SCALAR_COLUMNS: tuple[str, ...] = (*IDENTITY_COLUMNS, *_measurement_columns(), *ENV_COLUMNS)
NUMERIC_COLUMNS: tuple[str, ...] = (
    "repeat",
    "failed_rank",
    "n_params",
    "gpus",
    "tp",
    "pp",
    "microbatches",
    "nodes",
    "micro_batch",
    "seq_len",
    "grad_accum",
    "measure_steps",
    *(c for c in SCALAR_COLUMNS if c in METRIC_COLUMNS),
)
FRACTIONAL_COLUMNS = frozenset(c for c, m in METRIC_COLUMNS.items() if m.fractional)
"""measured quantities that stay float in table.csv even when a value happens to be whole (152000.0 tok/s)"""
SAMPLES_COLUMN = "step_time_samples_s"
"""list of per-step times (s) per row; in the frame and table.parquet, not in table.csv"""
MEMORY_DEVICE = "device"
MEMORY_RSS = "cpu_process_rss"
"""values of the `memory_measure` column: what peak_memory_allocated_gib measured. On CUDA the allocator's peak
of tensor memory per GPU; on CPU the worker process's peak RSS (harness.worker.meters.memory), which holds the
interpreter, torch and every buffer, so it is not comparable with the planner's prediction of tensor bytes."""
COMM_PREFIX = "comm_bytes."
"""columns `comm_bytes.<collective>`: bytes per step of that collective type (comm.by_collective)"""

_NAME_SAFE = re.compile(r"[^A-Za-z0-9_.-]+")


def _memory_measure(rec: Record) -> str | None:
    """MEMORY_RSS when the record's peak_memory_allocated_gib is a CPU process's peak RSS (env.device_type cpu,
    or the worker's null reason for the reserved peak says so), MEMORY_DEVICE otherwise; None without a value."""
    if finite_number(rec.metrics.peak_memory_allocated_gib) is None:
        return None
    why = rec.metrics.null_reason("peak_memory_reserved_gib")
    if rec.env.device_type == "cpu" or (why is not None and "RSS" in why):
        return MEMORY_RSS
    return MEMORY_DEVICE


def layout_label(
    tp: float | None, pp: float | None, schedule: str | None, microbatches: float | None, sequence_parallel: bool
) -> str:
    """'' for no tensor or pipeline parallelism, else 'tp2', 'tp2+sp' (sequence parallel), 'pp2 (1f1b)',
    'pp4 (gpipe, 8 microbatches)' or both joined by LAYOUT_SEP: 'tp2 × pp2 (1f1b)'. The pipeline knobs count
    only with pp > 1 and sequence parallelism only with tp > 1, as harness.scenario.spec.RunSpec resets them."""
    parts = []
    if tp is not None and tp > 1:
        parts.append(f"tp{tp:g}" + ("+sp" if sequence_parallel else ""))
    if pp is not None and pp > 1:
        more = f", {microbatches:g} microbatches" if microbatches else ""
        parts.append(f"pp{pp:g} ({schedule or '1f1b'}{more})")
    return LAYOUT_SEP.join(parts)


def strategy_label(strategy: str | None, layout: str) -> str | None:
    """The strategy as the report shows it: the record's name, plus its layout when it has one."""
    if strategy is None or not layout:
        return strategy
    return f"{strategy}{LAYOUT_SEP}{layout}"


def base_strategy(label: str) -> str:
    """The record's strategy name of a strategy label (strategy_label's inverse)."""
    return label.split(LAYOUT_SEP, 1)[0]


def _num(value: Any) -> float | None:
    return None if value is None else finite_number(value)


def _flatten(rec: Record) -> tuple[dict[str, Any], dict[str, float]]:
    """One record → (scalar row, {collective: bytes per step})."""
    spec, s = rec.spec, rec.spec.settings
    tp, pp = _num(s.tp), _num(s.pp)
    schedule = s.pp_schedule if s.pp > 1 else None
    sp = s.sequence_parallel and s.tp > 1
    layout = layout_label(tp, pp, schedule, _num(s.microbatches), sp)
    predicted = rec.predicted
    row: dict[str, Any] = {
        "sweep": rec.sweep,
        "cluster": rec.cluster,
        "run_id": rec.run_id,
        "repeat": _num(rec.repeat_index),
        "status": rec.status,
        "reason": rec.reason,
        "failed_rank": _num(rec.failed_rank),
        "model": spec.model,
        "n_params": _num(rec.metrics.n_params),
        "strategy": strategy_label(spec.strategy, layout),
        "base_strategy": spec.strategy,
        "layout": layout,
        "tp": tp,
        "pp": pp,
        "pp_schedule": schedule,
        "microbatches": _num(s.microbatches) if s.pp > 1 else None,
        "sequence_parallel": sp if s.tp > 1 else None,
        "precision": spec.precision,
        "gpus": _num(spec.gpus),
        "nodes": _num(spec.nodes),
        "micro_batch": _num(s.micro_batch),
        "seq_len": _num(s.seq_len),
        "grad_accum": _num(s.grad_accum),
        "activation_checkpointing": s.activation_checkpointing,
        "offload": s.offload,
        "measure_steps": _num(s.measure_steps),
        **dict(zip(METRIC_COLUMNS, _METRIC_READER.values(rec))),
        "mfu_null_reason": rec.metrics.null_reason("mfu"),
        "memory_measure": _memory_measure(rec),
        "prediction_source": None if predicted is None else predicted.calibration,
        "predicted_time_null_reason": (
            None if predicted is None else (predicted.time_null_reasons or {}).get("step_time_s")
        ),
        "traces": _traces(rec),
        "device_name": rec.env.device_name,
        "device_type": rec.env.device_type,
        "backend": rec.env.backend,
        "harness_git_sha": rec.env.harness_git_sha,
        "started_at": rec.started_at,
        "finished_at": rec.finished_at,
        "path": rec.path or "?",
        SAMPLES_COLUMN: rec.metrics.step_time_s.finite_samples() if rec.metrics.step_time_s is not None else [],
    }
    by_coll = {}
    for name, c in ((rec.comm.by_collective if rec.comm is not None else None) or {}).items():
        b = finite_number(c.bytes)
        if b is not None:
            by_coll[_NAME_SAFE.sub("_", str(name))] = b
    return row, by_coll


def _traces(rec: Record) -> str | None:
    """The record's traces (artifacts.traces) as paths where this reader finds them (beside the record file),
    joined by TRACES_SEP; None when the cell was not traced."""
    traces = rec.artifacts.traces if rec.artifacts is not None else None
    if not traces:
        return None
    folder = Path(rec.path).parent if rec.path else Path()
    return TRACES_SEP.join(str(folder / t) for t in traces)


def _variant_labels(df: pd.DataFrame) -> pd.Series:
    """'mb=4 seq=2048' from the variant fields that take more than one value within one (model, strategy,
    precision, GPU count), else ''. A field that only changes with the GPU count or the strategy (hybrid
    strategies on 2 nodes, the rest on 1) is not a second configuration of a cell, so it is left out."""
    keys = ["model", "strategy", "precision", "gpus"]
    grouped = df.assign(**{k: df[k].astype(object).where(df[k].notna(), "?") for k in keys}).groupby(keys)
    parts = []
    for field, short in VARIANT_FIELDS.items():
        if grouped[field].nunique(dropna=False).max() <= 1:
            continue
        col = df[field]
        if field == "activation_checkpointing":
            parts.append(col.map({"none": "no-ac", "full": "ac", "selective": "sac"}).fillna(f"{short}=?"))
        else:
            shown = col.map(
                lambda v: (
                    "?"
                    if v is None or (isinstance(v, float) and math.isnan(v))
                    else (f"{v:g}" if isinstance(v, float) else str(v))
                )
            )
            parts.append(short + "=" + shown)
    if not parts:
        return pd.Series("", index=df.index, dtype=object)
    out = parts[0]
    for p in parts[1:]:
        out = out + " " + p
    return out.astype(object)


def records_frame(records: Iterable[Record]) -> tuple[pd.DataFrame, list[str]]:
    """One row per record (columns SCALAR_COLUMNS, SAMPLES_COLUMN, `comm_bytes.<collective>`), + warnings.

    `records` may be a generator (harness.results.store.iter_records): each record is flattened into the columns
    as it comes and then dropped, so only the fields the report uses are ever held for all records."""
    warnings: list[str] = []
    return frame_from_flat([flatten_records(records, warnings)], warnings)


FlatRecords = tuple[dict[str, list[Any]], list[dict[str, float]]]
"""records flattened (flatten_records): column → one value per record, and {collective: bytes per step} per
record"""


def flatten_records(records: Iterable[Record], warnings: list[str]) -> FlatRecords:
    """The first half of records_frame, which can run in another process (the result pickles): each record's
    fields into plain lists, one record at a time. (`warnings`: where the frame's own warnings go; a field of the
    wrong type was already one, from the reader.)"""
    names = [*SCALAR_COLUMNS, SAMPLES_COLUMN]
    flattened: list[str] = []
    in_order: Callable[[dict[str, Any]], tuple[Any, ...]] | None = None
    rows: list[tuple[Any, ...]] = []
    comm = []
    for rec in records:
        row, by_coll = _flatten(rec)
        if in_order is None:  # NOTE: every row has the same keys (_flatten's)
            flattened = [c for c in names if c in row]
            in_order = operator.itemgetter(*flattened)
        rows.append(in_order(row))
        comm.append(by_coll)
    # NOTE: one tuple per record, turned into columns at the end (a column append per field was a fifth of the load);
    # the columns the frame derives later (`variant`) start as nulls
    columns = dict(zip(flattened, map(list, zip(*rows)))) if rows else {c: [] for c in flattened}
    return {c: columns[c] if c in columns else [None] * len(rows) for c in names}, comm


def frame_from_flat(parts: list[FlatRecords], warnings: list[str]) -> tuple[pd.DataFrame, list[str]]:
    """The second half of records_frame: the frame of records flattened in consecutive parts (in order, e.g. by
    several processes), + `warnings` (the parts' flattening warnings, in order) with the frame's own appended.
    The parts are emptied as they are joined."""
    names = [*SCALAR_COLUMNS, SAMPLES_COLUMN]
    columns, comm = parts[0]
    for more_columns, more_comm in parts[1:]:
        for c in names:
            columns[c] += more_columns.pop(c)
        comm += more_comm
        more_comm.clear()
    numeric = set(NUMERIC_COLUMNS)
    df = pd.DataFrame(
        {c: _floats(columns.pop(c)) if c in numeric else pd.Series(columns.pop(c), dtype=object) for c in names},
        columns=names,
    )
    df["variant"] = _variant_labels(df) if len(df) else pd.Series(dtype=object)
    colls = sorted({k for d in comm for k in d}, key=collective_sort_key)
    if colls:
        cdf = pd.DataFrame(comm, columns=colls, index=df.index, dtype="float64")
        cdf.columns = [COMM_PREFIX + c for c in colls]
        df = pd.concat([df, cdf], axis=1)
    return df, warnings


def _floats(values: list[Any]) -> np.ndarray | pd.Series:
    """A numeric column: its values are finite numbers or None (the flattening made them so), None as NaN; anything
    else the coercing way (a value that is no number as NaN)."""
    try:
        return np.array(values, dtype="float64")
    except (TypeError, ValueError):
        return pd.to_numeric(pd.Series(values, dtype=object), errors="coerce").astype("float64")


_COLLECTIVE_ORDER = ("all_gather", "reduce_scatter", "all_reduce", "broadcast", "all_to_all", "send", "recv")


def collective_sort_key(name: str) -> tuple[int, str]:
    return (_COLLECTIVE_ORDER.index(name) if name in _COLLECTIVE_ORDER else len(_COLLECTIVE_ORDER), name)


def collective_columns(df: pd.DataFrame) -> list[str]:
    return [c for c in df.columns if c.startswith(COMM_PREFIX)]


def load_frame(*dirs: str | Path) -> tuple[pd.DataFrame, list[str]]:
    """Every record under `dirs` (recursively) as a frame, read one at a time (harness.results.store);
    unreadable/partial/unknown-schema files and wrong-typed fields → warnings (first), then the frame's own."""
    warnings: list[str] = []
    df, more = records_frame(iter_records(*dirs, warnings=warnings))
    return df, warnings + more


def _order(values: pd.Series, known: tuple[str, ...]) -> pd.Series:
    """Rank of each value in `known`; unknown values after the known ones (then by name)."""
    rank = {v: i for i, v in enumerate(known)}
    return values.map(lambda v: rank.get(v, len(known)))


def model_order(df: pd.DataFrame) -> list[str]:
    """Models smallest first (by metrics.n_params, else the zoo's count for that name), then by name."""
    from harness.core.zoo import ZOO

    sizes = df.groupby("model")["n_params"].max()

    def key(m: str) -> tuple[float, str]:
        n = sizes.get(m)
        if n is None or math.isnan(n):
            n = ZOO[m].n_params() if m in ZOO else math.inf
        return (n, m)

    return sorted(df["model"].dropna().unique(), key=key)


def sort_cells(df: pd.DataFrame) -> pd.DataFrame:
    """Report order: model by size, strategy as harness.scenario.spec.STRATEGIES (then its layouts), precision,
    variant, GPU count."""
    models = {m: i for i, m in enumerate(model_order(df))}
    keyed = df.assign(
        _m=df["model"].map(models), _s=_order(df["base_strategy"], STRATEGIES), _p=_order(df["precision"], PRECISIONS)
    )
    # NOTE: by the variant fields themselves, not the label, so mb=8 comes before mb=16; a strategy's layouts
    # follow it (plain first), by degree
    keyed = keyed.sort_values(
        ["_m", "_s", "base_strategy", "tp", "pp", "strategy", "_p", "precision", *VARIANT_FIELDS, "gpus"], kind="stable"
    )
    return keyed.drop(columns=["_m", "_s", "_p"])


def cell_table(df: pd.DataFrame) -> tuple[pd.DataFrame, list[str]]:
    """One row per cell (model, strategy, precision, variant, GPU count), in report order, + warnings.
    The index is the frame's, so `df.index.isin(cells.index)` marks the records shown.

    Several records of one cell (a rerun, or the same sweep in two result dirs) → the one that finished
    last is shown, and a warning says how many were set aside.
    """
    placed = df.dropna(subset=["model", "strategy", "precision", "gpus"])
    placed = placed.assign(_fin=placed["finished_at"].fillna(""))
    placed = placed.sort_values("_fin", kind="stable")
    dup = placed.duplicated(list(CELL_KEYS), keep="last")
    # NOTE: the runs of a `harness sweep --repeat` (same sweep and cell, other repeat numbers) are runs, not
    # reruns: the leader test uses every one of them
    rerun = dup & placed.duplicated([*CELL_KEYS, "sweep", "repeat"], keep="last")
    runs = dup & ~rerun
    warnings = []
    if rerun.any():
        n_cells = placed[rerun].drop_duplicates(list(CELL_KEYS)).shape[0]
        warnings.append(
            f"{int(rerun.sum())} older record(s) of {n_cells} cell(s) set aside: several records of "
            "one cell (same model, strategy, precision, configuration, GPU count); the one that "
            "finished last is shown (all are in table.csv)"
        )
    if runs.any():
        n_cells = placed[runs].drop_duplicates(list(CELL_KEYS)).shape[0]
        warnings.append(
            f"{n_cells} cell(s) were measured more than once (harness sweep --repeat; {int(runs.sum())} earlier "
            "run(s)): the tables show each cell's last run, the best-strategy test uses every run (all are in "
            "table.csv)"
        )
    cells = placed[~dup].drop(columns=["_fin"])
    return sort_cells(cells), warnings  # NOTE: keeps the frame's index, so rows map back to records


_NOISE_KEYS = ("run_id", "cluster", "device_name")
"""what a history's noise is looked up by (harness.history.noise.NoiseKey)"""


def _text_or_none(v: Any) -> str | None:
    return None if v is None or (isinstance(v, float) and math.isnan(v)) else str(v)


def _runs_by_cell(frame: pd.DataFrame | None) -> dict[tuple, list[float]] | None:
    """CELL_KEYS → tokens/s/GPU of every ok record of that cell (all its runs), from the whole frame."""
    if frame is None:
        return None
    ok = frame[(frame["status"] == "ok") & frame["tokens_per_s_per_gpu"].notna()]
    ok = ok.dropna(subset=["model", "strategy", "precision", "gpus"])
    # NOTE: one pass over plain lists, not a groupby (a Series per cell: 0.4 s at 4,000 cells); same keys and order
    runs: dict[tuple, list[float]] = {}
    keys = zip(*(ok[k].tolist() for k in CELL_KEYS))
    for key, tps in zip(keys, ok["tokens_per_s_per_gpu"].astype(float).tolist()):
        runs.setdefault(key, []).append(tps)
    return runs


def best_per_model_gpus(
    cells: pd.DataFrame,
    frame: pd.DataFrame | None = None,
    *,
    noise: Mapping[tuple[str, str, str | None], tuple[float, int]] | None = None,
) -> pd.DataFrame:
    """Fastest cell per (model, GPU count) among status ok with a tokens/s/GPU, + the best other strategy,
    and whether the lead is more than noise (harness.report.leader: on every run of both cells in `frame` — one
    row per record — when each was measured at least MIN_RUNS times, else on `noise`, each cell's between-run noise
    from a results history keyed by (run_id, cluster, device name), else not judged). A strategy is its label with
    the layout (`fsdp2.full_shard × tp2` and `fsdp2.full_shard` are two strategies here): a tensor- or
    pipeline-parallel layout can be the best, and the plain strategy its runner-up.

    A cell's value is the median tokens/s/GPU of its runs (one run: that run's), as `harness tune` ranks its
    finalists; only cells measured alike compete: those with the group's most timed steps (`measure_steps`). The
    others — `harness tune`'s shorter rounds, a sweep's shorter cells — are counted (`n_shorter`), not compared: a
    short screening run is not evidence against a longer, repeated one (harness.report.leader.contenders).

    Columns: model, gpus, strategy, precision, variant, tokens_per_s_per_gpu (the median of its runs), mfu,
    runner_up, runner_up_tokens_per_s_per_gpu, margin (fraction faster than the runner-up), distinguishable (bool;
    NaN without a runner-up or when not judged), p_value, basis (harness.report.leader.BASES), verdict (text), n_ok,
    n_cells, measure_steps (the steps the contest's cells were timed with), n_shorter. Groups where nothing ran ok
    have strategy None.
    """
    from harness.report.leader import NOT_JUDGED, Contest, Noise, contenders, leader_verdicts, run_value

    runs = _runs_by_cell(frame)
    # NOTE: one pass over plain lists (a pandas filter and sort per group was 0.9 s at 10,000 records); the
    # groups in order of first appearance and the leaders in stable descending order, as groupby(sort=False) and
    # sort_values(ascending=False, kind="stable") give them
    col = {
        c: cells[c].tolist()
        for c in (*CELL_KEYS, "status", "tokens_per_s_per_gpu", "mfu", "measure_steps", *_NOISE_KEYS)
    }
    groups: dict[tuple, list[int]] = {}
    for i, key in enumerate(zip(col["model"], col["gpus"])):
        groups.setdefault(key, []).append(i)
    tps = col["tokens_per_s_per_gpu"]

    def cell_runs(i: int) -> list[float]:
        mine = [float(tps[i])]
        return mine if runs is None else runs.get(tuple(col[k][i] for k in CELL_KEYS), mine)

    def cell_noise(i: int) -> Noise | None:
        run_id, cluster, device = (_text_or_none(col[k][i]) for k in _NOISE_KEYS)
        found = None if noise is None or run_id is None or cluster is None else noise.get((run_id, cluster, device))
        return None if found is None else Noise(sigma=found[0], n=found[1])

    out, contests, contested = [], [], []
    for (model, gpus), rows in groups.items():
        ok = [i for i in rows if col["status"][i] == "ok" and not pd.isna(tps[i])]
        value = {i: run_value(cell_runs(i), fallback=float(tps[i])) for i in ok}
        steps, alike = contenders([col["measure_steps"][i] for i in ok])
        compared = [ok[k] for k in alike]
        row, best, ru = _group_row(model, gpus, rows, col, compared, value=value)
        alike_set = set(compared)
        shorter = [i for i in ok if i not in alike_set]
        row.update(measure_steps=steps, n_shorter=len(shorter))
        if best is not None and ru is None and any(col["strategy"][i] != col["strategy"][best] for i in shorter):
            # NOTE: other strategies ran ok, but only with fewer steps: no runner-up, and no crown over them
            row.update(basis=NOT_JUDGED, verdict=f"other strategies measured with fewer than {steps:g} steps only")
        if best is not None and ru is not None:
            contests.append(
                Contest(
                    leader_runs=cell_runs(best),
                    runner_runs=cell_runs(ru),
                    leader_noise=cell_noise(best),
                    runner_noise=cell_noise(ru),
                )
            )
            contested.append(row)
        out.append(row)
    for row, v in zip(contested, leader_verdicts(contests)):
        row.update(distinguishable=v.distinguishable, p_value=v.p, basis=v.basis, verdict=v.text())
    return pd.DataFrame(out, columns=BEST_COLUMNS)


BEST_COLUMNS: tuple[str, ...] = (
    "model",
    "gpus",
    "strategy",
    "precision",
    "variant",
    "tokens_per_s_per_gpu",
    "mfu",
    "runner_up",
    "runner_up_precision",
    "runner_up_tokens_per_s_per_gpu",
    "margin",
    "distinguishable",
    "p_value",
    "basis",
    "verdict",
    "n_ok",
    "n_cells",
    "statuses",
    "measure_steps",
    "n_shorter",
)
"""best_per_model_gpus' columns, in order"""


def _group_row(
    model: Any,
    gpus: Any,
    rows: list[int],
    col: dict[str, list[Any]],
    compared: list[int],
    *,
    value: Mapping[int, float],
) -> tuple[dict[str, Any], int | None, int | None]:
    """(the best-strategy row of one (model, GPU count) of the cells `rows` (indices into `col`'s lists), its
    leader, its runner-up: the fastest ok cell of another strategy), among the cells `compared` (ok, measured
    alike) by `value` (each cell's median over its runs); leader and runner-up None where there is none."""
    row: dict[str, Any] = {
        "model": model,
        "gpus": gpus,
        "n_ok": sum(1 for i in rows if col["status"][i] == "ok" and not pd.isna(col["tokens_per_s_per_gpu"][i])),
        "n_cells": len(rows),
        "statuses": dict(Counter(col["status"][i] for i in rows)),
    }
    if not compared:
        return row, None, None
    ranked = sorted(compared, key=lambda i: -value[i])
    best = ranked[0]
    row.update(
        strategy=col["strategy"][best],
        precision=col["precision"][best],
        variant=col["variant"][best],
        tokens_per_s_per_gpu=value[best],
        mfu=col["mfu"][best],
    )
    others = [i for i in ranked if col["strategy"][i] != col["strategy"][best]]
    if not others:
        return row, best, None
    ru = others[0]
    row.update(
        runner_up=col["strategy"][ru],
        runner_up_precision=col["precision"][ru],
        runner_up_tokens_per_s_per_gpu=value[ru],
        margin=value[best] / value[ru] - 1.0,
    )
    return row, best, ru


def figure_cells(cells: pd.DataFrame) -> pd.DataFrame:
    """One cell per (model, strategy, precision, GPU count) for the figures: when a report has several
    configurations (variants) of a cell, the fastest that ran ok stands for it (else the latest record)."""
    ranked = cells.assign(_ok=(cells["status"] == "ok").astype(int), _t=cells["tokens_per_s_per_gpu"].fillna(-math.inf))
    ranked = ranked.sort_values(["_ok", "_t"], kind="stable")
    keep = ~ranked.duplicated(["model", "strategy", "precision", "gpus"], keep="last")
    return sort_cells(ranked[keep].drop(columns=["_ok", "_t"])).reset_index(drop=True)


def report_name(df: pd.DataFrame) -> str:
    """The sweep name when every record shares one, else 'report' (safe as a folder name)."""
    sweeps = df["sweep"].unique() if len(df) else []
    if len(sweeps) == 1 and sweeps[0]:
        name = _NAME_SAFE.sub("_", str(sweeps[0])).strip("._")
        if name:
            return name
    return "report"


def predicted_cells(fc: pd.DataFrame) -> pd.DataFrame:
    """The cells that ran ok with both a measured and a predicted step time."""
    pred, meas = fc["predicted_step_time_s"], fc["step_time_median_s"]
    return fc[(fc["status"] == "ok") & (pred > 0) & (meas > 0)]


def prediction_accuracy(fc: pd.DataFrame) -> dict[str, Any]:
    """{cells, mape, spearman, within_band, by_family: {family: (cells, mape)}} over the cells with both step times:
    the mean absolute percentage error of the prediction (fraction), Spearman's rank correlation (None under 3
    cells or without spread) and the share within ±PREDICTION_BAND."""
    data = predicted_cells(fc)
    pred = data["predicted_step_time_s"].to_numpy(dtype=float)
    meas = data["step_time_median_s"].to_numpy(dtype=float)
    err = np.abs(pred - meas) / meas
    rho = None
    if len(data) >= 3:
        rp, rm = pd.Series(pred).rank().to_numpy(), pd.Series(meas).rank().to_numpy()
        if rp.std() > 0 and rm.std() > 0:
            rho = float(np.corrcoef(rp, rm)[0, 1])
    # the catalogue's family (ddp, fsdp, fsdp2, zero); a strategy it does not know stands for itself
    fam = data["base_strategy"].map(lambda b: CATALOGUE[b].family if b in CATALOGUE else str(b))
    by_family = {f: (int(m.sum()), float(err[m].mean())) for f in sorted(set(fam)) for m in [(fam == f).to_numpy()]}
    return {
        "cells": len(data),
        "mape": float(err.mean()) if len(err) else None,
        "spearman": rho,
        "within_band": float((err <= PREDICTION_BAND).mean()) if len(err) else None,
        "by_family": by_family,
        **part_accuracy(fc),
    }


def in_timed_band(traced: Any, p10: Any, p90: Any) -> Any:
    """Whether a traced step lies in the timed steps' p10–p90 (inclusive): for numbers or for columns alike."""
    return (p10 <= traced) & (traced <= p90)


def part_accuracy(fc: pd.DataFrame) -> dict[str, Any]:
    """{traced_cells, in_band, by_part: {part: (mean |predicted − measured|, mean predicted − measured)}}: each
    part's error over the ok cells with a prediction and a traced step (trace: true), as a fraction of the measured
    traced step (a part's own size can be 0: recompute without checkpointing). A part either side lacks is left out
    per cell. `in_band`: how many of those cells traced a step inside their timed steps' p10–p90; `untraced`: of
    those with untraced neighbours (records before them have none), how many, and how many of those neighbours'
    medians lie inside the same band (the host's drift alone, without the profiler); `profiler_cost`: the median
    and range of their traced / untraced ratios."""
    ok = fc[(fc["status"] == "ok") & (fc["measured_step_s"] > 0) & (fc["predicted_step_time_s"] > 0)]
    step = ok["measured_step_s"].to_numpy(dtype=float)
    in_band = int(in_timed_band(ok["measured_step_s"], ok["step_time_p10_s"], ok["step_time_p90_s"]).sum())
    # NOTE: a neighbour-less record's NaN compares False: it counts in neither
    untraced = {
        "cells": int(ok["untraced_step_s"].notna().sum()),
        "in_band": int(in_timed_band(ok["untraced_step_s"], ok["step_time_p10_s"], ok["step_time_p90_s"]).sum()),
    }
    cost = ok["profiler_cost"].dropna().to_numpy(dtype=float)
    profiler_cost = (float(np.median(cost)), float(cost.min()), float(cost.max())) if len(cost) else None
    by_part: dict[str, tuple[float, float]] = {}
    for part in (*PREDICTED_PARTS, "comm_total"):
        diff = (ok[f"predicted_{part}_s"].to_numpy(dtype=float) - ok[f"measured_{part}_s"].to_numpy(dtype=float)) / step
        diff = diff[~np.isnan(diff)]
        if len(diff):
            by_part[part] = (float(np.abs(diff).mean()), float(diff.mean()))
    return {
        "traced_cells": len(ok),
        "in_band": in_band,
        "untraced": untraced,
        "profiler_cost": profiler_cost,
        "by_part": by_part,
    }
