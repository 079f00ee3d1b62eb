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
    return Errors(
        rows=len(checked),
        priced=len(ok),
        mape=statistics.fmean(abs(e) for e in errs),
        median=statistics.median(errs),
        worst=max(abs(e) for e in errs),
        spearman=spearman(pred, [c.run.tokens_per_s_per_gpu for c in ok]) if len(ok) > 1 else math.nan,
    )
