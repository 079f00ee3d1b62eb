"""Published training throughputs as ground truth for GPU predictions (validation/*.csv, docs/time-model.md:
validation against published results).

There is no GPU to measure on, so the step-time model's GPU rates are checked against published runs: one row per
run (its source and table, the cluster profile that stands for its hardware, the model's dimensions, strategy,
precision, GPUs, sequence, micro-batch, accumulation, checkpointing and the published tokens/s per GPU).
`PublishedRun` is the file's one typed model and `read_published` its one reader; `predict_published` prices a row
with the profile's figures exactly as `harness plan --cluster <profile>` would price the same cell, and
`table_errors` gives the figures the bench prints and the unit test bounds (MAPE, Spearman, signed errors).

Which rows the kernel efficiencies were fitted on is part of the contract: the A100 tables only
(`FIT_TABLES`); every other table is held out.
"""

from __future__ import annotations

import csv
import functools
import math
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import ConfigDict, ValidationError

from harness.core.errors import InputError, Problem
from harness.core.typed import Typed, problems_of
from harness.core.zoo import ModelConfig
from harness.plan.calibration import rates_for
from harness.plan.time import predict_time
from harness.scenario.cluster import Cluster, load_cluster
from harness.scenario.spec import RunSpec, Settings

FIT_TABLES = ("A100 80GB", "A100 40GB")
"""the tables the kernel-efficiency curves were chosen and fitted on (in-sample); every other one is held out"""


class PublishedRun(Typed):
    """One published training run (a row of validation/<source>.csv)."""

    model_config = ConfigDict(frozen=True, strict=False, extra="forbid", allow_inf_nan=False)

    source: str
    """where it is published: repository@commit and file, or paper and table"""
    table: str
    """the table within the source (errors are reported per table)"""
    profile: str
    """the harness cluster profile that stands for its hardware (a100, a100-40gb, h100, …)"""
    model: str
    d_model: int
    n_layers: int
    n_heads: int
    ffn: int
    """SwiGLU width with the run's MLP parameters and FLOPs (MPT's expansion-4 GELU MLP: 8·d/3)"""
    vocab: int
    strategy: str
    """the harness strategy of the run's sharding (FULL_SHARD: fsdp.full_shard, SHARD_GRAD_OP: fsdp.shard_grad_op)"""
    published_precision: str
    """the precision as published (amp_bf16/DEFAULT, bf16/PURE)"""
    precision: str
    gpus: int
    seq_len: int
    """tokens per sequence"""
    micro_batch: int
    """sequences per GPU per micro-step"""
    grad_accum: int
    activation_checkpointing: str
    tokens_per_s_per_gpu: float
    """the published throughput (tokens/s per GPU)"""
    published_mfu: float | None = None
    """the published model FLOPs utilisation (fraction), where published"""

    def spec(self, *, gpus_per_node: int) -> RunSpec:
        """The harness cell this run corresponds to."""
        cfg = ModelConfig(
            d_model=self.d_model, n_layers=self.n_layers, n_heads=self.n_heads, ffn=self.ffn, vocab=self.vocab
        )
        return RunSpec(
            model=self.model,
            model_config=cfg,
            strategy=self.strategy,
            precision=self.precision,
            gpus=self.gpus,
            nodes=-(-self.gpus // gpus_per_node),
            gpus_per_node=gpus_per_node,
            settings=Settings(
                micro_batch=self.micro_batch,
                seq_len=self.seq_len,
                grad_accum=self.grad_accum,
                activation_checkpointing=self.activation_checkpointing,
            ),
        )


def read_published(path: str | Path) -> list[PublishedRun]:
    """Every row of a published-results CSV; a bad row is an InputError naming the file, the row and the field."""
    p = Path(path)
    problems: list[Problem] = []
    rows: list[PublishedRun] = []
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as e:
        raise InputError([Problem(str(p), "", f"cannot be read: {e.strerror}")]) from None
    for i, raw in enumerate(csv.DictReader(text.splitlines()), start=2):
        doc = {k: (None if v == "" else v) for k, v in raw.items()}
        try:
            rows.append(PublishedRun.model_validate(doc))
        except ValidationError as e:
            problems.extend(problems_of(e, file=f"{p}:{i}"))
    if problems:
        raise InputError(problems)
    return rows


@functools.cache
def _profile(name: str) -> Cluster:
    return load_cluster(name)


@dataclass(frozen=True)
class Checked:
    """One published run and the model's prediction of it."""

    run: PublishedRun
    predicted: float | None
    """tokens/s per GPU, None when the model cannot price the cell"""
    reason: str | None
    """why predicted is None"""

    @property
    def error(self) -> float | None:
        """signed relative error (predicted / published − 1)"""
        return None if self.predicted is None else self.predicted / self.run.tokens_per_s_per_gpu - 1.0


def predict_published(run: PublishedRun) -> Checked:
    """The run priced with its profile's figures (`harness plan --cluster <profile>`'s rates)."""
    cluster = _profile(run.profile)
    pred = predict_time(run.spec(gpus_per_node=cluster.gpus_per_node), cluster, rates_for(cluster))
    reasons = pred.time_null_reasons or {}
    return Checked(run, pred.tokens_per_s_per_gpu, reasons.get("step_time_s"))


def spearman(a: list[float], b: list[float]) -> float:
    """Spearman's rank correlation of two equally long lists (nan when one is constant): scipy's."""
    import warnings

    from scipy.stats import spearmanr  # NOTE: here, not at the top: scipy.stats costs about a second to import

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # a constant side: nan, as documented, without scipy's warning
        return float(spearmanr(a, b).statistic)


@dataclass(frozen=True)
class Errors:
    """A set of checked rows' figures."""

    rows: int
    priced: int
    mape: float
    """mean |predicted / published − 1|"""
    median: float
    """median signed error"""
    worst: float
    """largest |error|"""
    spearman: float


def errors_of(checked: list[Checked]) -> Errors:
    """The figures of `checked` (over the rows the model priced)."""
    ok = [c for c in checked if c.error is not None]
    errs = [c.error for c in ok if c.error is not None]
    if not errs:
        return Errors(len(checked), 0, math.nan, math.nan, math.nan, math.nan)
    pred = [c.predicted for c in ok if c.predicted is not None]
    mape, median, worst = error_figures(errs)
    return Errors(
        rows=len(checked),
        priced=len(ok),
        mape=mape,
        median=median,
        worst=worst,
        spearman=spearman(pred, [c.run.tokens_per_s_per_gpu for c in ok]) if len(ok) > 1 else math.nan,
    )


def error_figures(errs: list[float]) -> tuple[float, float, float]:
    """(mean |error|, median signed error, largest |error|) of a non-empty list of errors."""
    return statistics.fmean(abs(e) for e in errs), statistics.median(errs), max(abs(e) for e in errs)


# ---- what the published runs say of a plan's cells (`harness plan`'s uncertainty, `harness show cluster`) ----------

VALIDATION_DIR = Path(__file__).resolve().parents[2] / "validation"
"""the published runs committed beside the package (a source checkout's validation/*.csv); an installed wheel has
none, and then every check says so"""
LAYOUT_FAMILY = "TP/PP layout"
"""the family of every tensor- or pipeline-parallel cell: harness.plan.layout_time prices them, and no published row
has such a layout"""
FAMILY_NAMES: dict[tuple[str, str], str] = {
    ("ddp", "flat"): "DDP",
    ("fsdp1", "flat"): "FSDP",
    ("fsdp1", "hybrid"): "FSDP hybrid",
    ("fsdp2", "flat"): "FSDP2",
    ("fsdp2", "hybrid"): "FSDP2 hybrid",
    ("zero12", "flat"): "ZeRO-1/2",
    ("zero3", "flat"): "ZeRO-3",
}
"""(the catalogue's collective model, its mesh) → the family's name; a strategy not here is a family of its own"""


def time_model_family(spec: RunSpec) -> str:
    """The family of cells whose step time the same parts of the model price: the catalogue entry's collective model
    (which also decides its overlap rule and framework cost) on its mesh, and every TP/PP layout apart.

    NOTE: why this key, and not the strategy or the catalogue's `family`: a published run checks the compute model
    (shared by all) together with one collective ledger and overlap rule on one mesh. An FSDP FULL_SHARD run says
    something of SHARD_GRAD_OP (the same ledger, one gather fewer) but nothing of FSDP2's ledger, of a hybrid mesh's
    inter-node replication, of ZeRO-3's coordinator, or of a tensor-parallel layout."""
    if not spec.layout.is_default:
        return LAYOUT_FAMILY
    from harness.core.catalogue import CATALOGUE

    entry = CATALOGUE.get(spec.strategy)
    if entry is None:
        return spec.strategy
    return FAMILY_NAMES.get((entry.comm_model, entry.mesh), spec.strategy)


@dataclass(frozen=True)
class FamilyCheck:
    """How the uncalibrated GPU model did on the published runs of one family at one precision: on the runs of the
    plan's profile when there are any, else on every profile's. Errors are predicted / published tokens/s per GPU − 1
    (+: the model predicts faster than published)."""

    family: str
    precision: str
    profile: str
    """the plan's profile"""
    runs: int
    """published runs the figures rest on (0: none checks this family at this precision)"""
    profiles: tuple[str, ...] = ()
    """the profiles those runs stand for (the plan's own only, when it has any)"""
    held_out: int = 0
    """of `runs`, those held out of the kernel-efficiency fit (FIT_TABLES): out-of-sample"""
    mape: float | None = None
    """mean |error| (fraction)"""
    median: float | None = None
    """median signed error (fraction)"""
    worst: float | None = None
    """the largest |error| (fraction)"""
    sources: tuple[str, ...] = ()
    """where the runs are published"""
    reason: str | None = None
    """why there is no figure"""

    def text(self) -> str:
        """One line: 'FSDP bf16: MAPE 9.8% (median +2.4%, worst 45.8%) over 70 published h100 runs, held out of the
        fit', or why there is no figure."""
        if self.runs == 0:
            return self.figures()
        return f"{self.family} {self.precision}: {self.figures()}"

    def figures(self) -> str:
        """The figures without the family's name ('MAPE 9.8% (…) over 70 published h100 runs, held out of the
        fit'), or why there are none."""
        if self.runs == 0 or self.mape is None or self.median is None or self.worst is None:
            return self.reason or f"no published GPU run checks {self.family}'s time model at {self.precision}"
        where = self.profile if self.profiles == (self.profile,) else ", ".join(self.profiles)
        if self.held_out == self.runs:
            fit = "held out of the fit"
        elif self.held_out == 0:
            fit = "in-sample: the kernel efficiencies were fitted on them"
        else:
            fit = f"{self.held_out} held out of the fit"
        other = "" if self.profiles == (self.profile,) else f" (none on {self.profile})"
        return (
            f"MAPE {self.mape:.1%} (median {self.median:+.1%}, worst {self.worst:.1%}) over {self.runs} published "
            f"{where} runs{other}, {fit}"
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "family": self.family,
            "precision": self.precision,
            "published_runs": self.runs,
            "profiles": list(self.profiles),
            "held_out": self.held_out,
            "mape": self.mape,
            "median_error": self.median,
            "worst_error": self.worst,
            "sources": list(self.sources),
            "text": self.text(),
        }


def _stamps(folder: Path) -> tuple[tuple[str, int, int], ...]:
    """(path, mtime, size) of every CSV in `folder`, sorted: what makes a cached reading stale."""
    out = []
    for p in sorted(folder.glob("*.csv")):
        try:
            st = p.stat()
        except OSError:
            continue
        out.append((str(p), st.st_mtime_ns, st.st_size))
    return tuple(out)


@functools.cache
def _runs(stamps: tuple[tuple[str, int, int], ...]) -> tuple[tuple[str, PublishedRun], ...]:
    """(family, run) of every published run in the files `stamps` name, cached on their versions."""
    out = []
    for path, _, _ in stamps:
        for run in read_published(path):
            spec = run.spec(gpus_per_node=_profile(run.profile).gpus_per_node)
            out.append((time_model_family(spec), run))
    return tuple(out)


def family_check(family: str, precision: str, profile: str, *, folder: Path = VALIDATION_DIR) -> FamilyCheck:
    """What the published runs in `folder` say of `family` at `precision` for a plan on `profile` (FamilyCheck)."""
    stamps = _stamps(folder)
    if not stamps:
        why = f"no published runs here ({folder}/*.csv: a source checkout's), so no error can be given"
        return FamilyCheck(family, precision, profile, 0, reason=why)
    return _family_check(family, precision, profile, stamps)


@functools.cache
def _family_check(family: str, precision: str, profile: str, stamps: tuple[tuple[str, int, int], ...]) -> FamilyCheck:
    # NOTE: only the rows the answer rests on are priced (all 209 rows: 0.2 s of a plan)
    runs = [r for f, r in _runs(stamps) if f == family and r.precision == precision]
    runs = [r for r in runs if r.profile == profile] or runs
    rows = [(r.profile, predict_published(r)) for r in runs]
    priced = [c for _, c in rows if c.error is not None]
    if not priced:
        why = f"no published GPU run checks {family}'s time model at {precision}"
        if rows:
            why = f"the model prices none of the {len(rows)} published {family} runs at {precision}"
        return FamilyCheck(family, precision, profile, 0, reason=why)
    mape, median, worst = error_figures([c.error for c in priced if c.error is not None])
    return FamilyCheck(
        family,
        precision,
        profile,
        runs=len(priced),
        profiles=tuple(sorted({p for p, _ in rows})),
        held_out=sum(c.run.table not in FIT_TABLES for c in priced),
        mape=mape,
        median=median,
        worst=worst,
        sources=tuple(sorted({c.run.source for c in priced})),
    )
