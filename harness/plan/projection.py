"""Scale-out projection: every (model, strategy, layout, settings) of a scenario predicted at other GPU counts
(`harness plan SCENARIO --project 8,16,…,4096`), from the cluster's rates — its calibration, else its profile's
figures: matmul and memory rates, `gpus_per_node`, and the intra- and inter-node bus bandwidth and latency. A group
that spans nodes is priced at the inter-node figures (harness.plan.links.link_of), so a hybrid's replicate group, a
pipeline across nodes and any flat group beyond one node change rate where the cell outgrows a node.

A point is null with its reason when the model cannot say: the layout does not divide the GPU count, the strategy
cannot run there (a hybrid inside one node), or a rate is unknown (a profile without inter-node figures says so
for every point beyond one node). Pure arithmetic, no torch (docs/time-model.md: scale-out projection).

The document (`harness plan --project … --format json`) is the `Projection` model, and `read_projection` its one
reader (the report draws it: harness.report.projection): a file that is not one is an InputError naming the file,
the key and the value, never a traceback.
"""

from __future__ import annotations

import dataclasses
import math
import re
from pathlib import Path
from typing import Annotated

from pydantic import Field, ValidationError

from harness.core.errors import InputError, Problem
from harness.core.layout import layout_problems
from harness.core.typed import Typed
from harness.plan.calibration import Rates
from harness.plan.predict import predict
from harness.scenario.cluster import Cluster
from harness.scenario.schema import MAX_GPUS
from harness.scenario.spec import RunSpec

_RANGE = re.compile(r"^\s*(\d+)\s*\.\.\s*(\d+)\s*$")


def parse_gpus(text: str, *, option: str = "--project") -> list[int]:
    """GPU counts from `8,16,64` or `8..4096` (every power of two from 8 to 4096), ascending and distinct. Bad
    input raises InputError naming the option, the value and the allowed forms."""
    allowed = f"allowed: comma-separated GPU counts (8,16,64) or a doubling range (8..4096), each 1..{MAX_GPUS}"
    m = _RANGE.match(text)
    try:
        if m:
            lo, hi = int(m.group(1)), int(m.group(2))
            if lo < 1 or hi < lo:
                raise ValueError
            out = []
            g = lo
            while g <= hi:
                out.append(g)
                g *= 2
        else:
            out = [int(x) for x in text.split(",") if x.strip()]
        if not out or any(g < 1 or g > MAX_GPUS for g in out):
            raise ValueError
    except ValueError:
        raise InputError([Problem(option, "", f"{text!r} is not a list of GPU counts; {allowed}")]) from None
    return sorted(set(out))


def row_key(spec: RunSpec) -> RunSpec:
    """What a projected row is: the cell without its GPU count (and the node layout that follows from it)."""
    return dataclasses.replace(spec, gpus=0, nodes=0, gpus_per_node=0)


def at_gpus(spec: RunSpec, gpus: int, cluster: Cluster) -> RunSpec:
    """The same cell on `gpus` GPUs of `cluster` (nodes of its gpus_per_node)."""
    gpn = cluster.gpus_per_node
    return dataclasses.replace(spec, gpus=gpus, nodes=math.ceil(gpus / gpn), gpus_per_node=min(gpn, gpus))


def layout_label(spec: RunSpec) -> str:
    """`fsdp2.full_shard × tp4 × pp2 (1f1b)`: the strategy and its layout."""
    return " × ".join(p for p in (spec.strategy, spec.layout_tag) if p)


# --------------------------------------------------------------------------------------------------
# the document


_Frozen = Typed
"""the document's parts: harness.core.typed.Typed (frozen, strict, unknown fields kept)"""


class ProjectedPoint(_Frozen):
    """One projected GPU count of a row: its step time, or why it is null."""

    gpus: Annotated[int, Field(ge=1)]
    """GPUs (ranks) of the projected cell"""
    nodes: int | None = None
    """nodes of the profile's gpus_per_node they fill"""
    step_time_s: float | None = None
    """predicted time of one optimizer step (s); null: see reason"""
    tokens_per_s_per_gpu: float | None = None
    """predicted tokens per second per GPU (tokens/s)"""
    mfu: float | None = None
    """predicted model FLOPs utilisation (fraction)"""
    fits: bool | None = None
    """whether the cell fits the device memory; null: unknown"""
    reason: str | None = None
    """why the step time is null (the layout does not divide the GPUs, the strategy cannot run there, a rate is
    unknown), else null"""


class ProjectedSettings(_Frozen):
    """The row's settings (a cell's, without its GPU count)."""

    micro_batch: int | None = None
    seq_len: int | None = None
    grad_accum: int | None = None
    activation_checkpointing: str | None = None
    offload: str | None = None
    tp: int | None = None
    pp: int | None = None
    pp_schedule: str | None = None
    """null without a pipeline"""
    microbatches: int | None = None
    """null without a pipeline"""
    sequence_parallel: bool | None = None


class ProjectedRow(_Frozen):
    """One (model, strategy, layout, settings) of the scenario at every projected GPU count."""

    model: str
    strategy: str
    layout: str
    """the strategy and its tensor/pipeline layout (`layout_label`)"""
    precision: str
    settings: ProjectedSettings
    points: tuple[ProjectedPoint, ...]


class Projection(_Frozen):
    """`harness plan SCENARIO --project GPUS --format json`: every row at every GPU count of `gpus`."""

    cluster: str
    gpus_per_node: int
    gpus: tuple[int, ...]
    rates: str
    """the rates' source (harness.plan.calibration.Rates.source)"""
    rows: tuple[ProjectedRow, ...]


EXPECTED = "a `harness plan SCENARIO --project GPUS --format json` document"
_KINDS = {
    "int": "an integer",
    "float": "a number",
    "string": "a string",
    "bool": "true or false",
    "list": "a list",
    "tuple": "a list",
    "dict": "a mapping",
    "model": "a mapping",
}


def _dotted(loc: tuple[int | str, ...]) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def validation_problems(error: ValidationError, *, file: str, expected: str) -> list[Problem]:
    """Pydantic's errors as the harness's Problem lines: the file, the dotted key path, the value and what is
    allowed; the keys an object lacks on one line."""
    problems: list[Problem] = []
    lacking: dict[str, list[str]] = {}
    for e in error.errors():
        loc, kind, value = tuple(e["loc"]), e["type"], e.get("input")
        if kind == "missing":
            lacking.setdefault(_dotted(loc[:-1]), []).append(str(loc[-1]))
        elif kind == "json_invalid":
            problems.append(Problem(file, "", f"not JSON: {e['msg']}"))
        elif kind == "model_type" and not loc:
            problems.append(Problem(file, "", f"is a {type(value).__name__}, not {expected}"))
        elif kind.endswith("_type") and kind[: -len("_type")] in _KINDS:
            problems.append(
                Problem(file, _dotted(loc), f"{value!r} is not {_KINDS[kind[: -len('_type')]]} ({expected})")
            )
        else:
            problems.append(Problem(file, _dotted(loc), f"{value!r}: {e['msg']} ({expected})"))
    for where, keys in lacking.items():
        problems.append(Problem(file, where, f"lacks {', '.join(keys)} ({expected})"))
    return problems


def read_projection(path: Path) -> Projection:
    """The projection document at `path` (`harness plan --project … --format json`); InputError naming the file,
    the key, the value and what is wrong when it is not one."""
    where = str(path)
    try:
        raw = Path(path).read_bytes()
    except OSError as e:
        raise InputError([Problem(where, "", f"cannot read it: {e.strerror or e}")]) from None
    try:
        return Projection.model_validate_json(raw)
    except ValidationError as e:
        raise InputError(validation_problems(e, file=where, expected=EXPECTED)) from None


# --------------------------------------------------------------------------------------------------
# projecting


def point(spec: RunSpec, gpus: int, cluster: Cluster, rates: Rates) -> ProjectedPoint:
    """One projected point: step time, tokens/s per GPU, MFU, whether it fits, or why it is null."""
    s = spec.settings
    nodes = math.ceil(gpus / cluster.gpus_per_node)
    problems = layout_problems(
        gpus=gpus,
        degrees=dict(s.degrees),
        cfg=spec.model_config,
        schedule=s.pp_schedule,
        microbatches=s.microbatches,
        micro_batch=s.micro_batch,
        grad_accum=s.grad_accum,
        seq_len=s.seq_len,
        sequence_parallel=s.sequence_parallel,
        virtual_stages=s.pp_virtual_stages,
    )
    if problems:
        return _null_point(gpus, nodes, problems[0][1])
    cell = at_gpus(spec, gpus, cluster)
    why = cell.unsupported_reason(cluster.device)
    if why is not None:
        return _null_point(gpus, nodes, f"cannot run: {why}")
    pred = predict(cell, cluster, rates=rates)
    reason = None
    if pred.step_time_s is None:
        reason = (pred.time_null_reasons or {}).get("step_time_s", "unknown")
    return ProjectedPoint(
        gpus=gpus,
        nodes=nodes,
        step_time_s=pred.step_time_s,
        tokens_per_s_per_gpu=pred.tokens_per_s_per_gpu,
        mfu=pred.mfu,
        fits=pred.fits,
        reason=reason,
    )


def _null_point(gpus: int, nodes: int, reason: str) -> ProjectedPoint:
    return ProjectedPoint(
        gpus=gpus, nodes=nodes, step_time_s=None, tokens_per_s_per_gpu=None, mfu=None, fits=None, reason=reason
    )


def project(specs: list[RunSpec], cluster: Cluster, gpus: list[int], *, rates: Rates) -> list[ProjectedRow]:
    """One row per distinct cell of `specs` without its GPU count, in scenario order, each with a point per GPU
    count of `gpus`."""
    rows: dict[RunSpec, ProjectedRow] = {}
    for spec in specs:
        key = row_key(spec)
        if key in rows:
            continue
        s = spec.settings
        rows[key] = ProjectedRow(
            model=spec.model,
            strategy=spec.strategy,
            layout=layout_label(spec),
            precision=spec.precision,
            settings=ProjectedSettings(
                micro_batch=s.micro_batch,
                seq_len=s.seq_len,
                grad_accum=s.grad_accum,
                activation_checkpointing=s.activation_checkpointing,
                offload=s.offload,
                tp=s.tp,
                pp=s.pp,
                pp_schedule=s.pp_schedule if s.pp > 1 else None,
                microbatches=s.microbatches if s.pp > 1 else None,
                sequence_parallel=s.sequence_parallel,
            ),
            points=tuple(point(spec, g, cluster, rates) for g in gpus),
        )
    return list(rows.values())


def projection_document(rows: list[ProjectedRow], cluster: Cluster, gpus: list[int], rates: Rates) -> Projection:
    """`harness plan --project … --format json`."""
    return Projection(
        cluster=cluster.name,
        gpus_per_node=cluster.gpus_per_node,
        gpus=tuple(gpus),
        rates=rates.source,
        rows=tuple(rows),
    )
