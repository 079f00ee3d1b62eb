"""`build_report`: result records → the report's files (index.html, report.md, table.csv, table.parquet, a PNG
per figure), in stages: load (harness.report.load) → frame (cells, figure cells) → the figures start drawing
(harness.report.figures, with many cells in other processes) → while they draw: the best-strategy table, the
CSV/Parquet tables, the page text (harness.report.sections, .render) → the figures join the pages → write.
"""

from __future__ import annotations

import datetime as _dt
import gc
import os
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import pandas as pd

from harness.core.errors import InputError, Problem
from harness.plan.projection import Projection
from harness.report.figures import Figure, start_figures
from harness.report.frame import (
    FRACTIONAL_COLUMNS,
    SAMPLES_COLUMN,
    best_per_model_gpus,
    cell_table,
    figure_cells,
    prediction_accuracy,
    report_name,
)
from harness.report.load import load_records
from harness.report.projection import projection_figure
from harness.report.render import prepare_html, prepare_markdown
from harness.report.repredict import stale_predictions
from harness.report.sections import ReportData, build_page
from harness.report.trends import trends_figure
from harness.report.tune import read_tune_logs, tune_figure, tune_figure_names
from harness.tune.log import TuneLog


def output_problem(out: Path) -> str | None:
    """Why the report cannot be written to `out`, or None: checked before any record is read, so a bad `-o`
    is one line and exit 2, not a traceback after the work. `out` may not exist yet: then its nearest existing
    parent must be a folder we may create entries in."""
    if out.exists():
        if not out.is_dir():
            return "output path exists and is not a directory"
        if not os.access(out, os.W_OK | os.X_OK):
            return "output directory is not writable (permission denied or a read-only file system)"
        return None
    parent = out.parent
    while not parent.exists() and parent != parent.parent:
        parent = parent.parent
    if not parent.is_dir():
        return f"cannot create the output directory: {parent} is a file, not a directory"
    if not os.access(parent, os.W_OK | os.X_OK):
        return f"cannot create the output directory: {parent} is not writable"
    return None


def _check_inputs(dirs: list[Path], out: Path | None) -> None:
    problems = [Problem(str(d), "", "no such file or directory") for d in dirs if not d.exists()]
    why = output_problem(out) if out is not None else None
    if why:
        problems.append(Problem(str(out), "", why))
    if problems:
        raise InputError(problems)


def _integers_as_int(df: pd.DataFrame) -> pd.DataFrame:
    """Columns whose values are all whole numbers (GPU counts, bytes, ranks) as nullable Int64, so the files say
    `4`, not `4.0`; nulls stay empty. The in-memory frame keeps float64 for plotting."""
    out = df.copy()
    for col in out.columns:
        s = out[col]
        if s.dtype == "float64" and s.notna().any() and col not in FRACTIONAL_COLUMNS:
            v = s.dropna()
            if ((v % 1) == 0).all() and (v.abs() < 2**53).all():
                out[col] = s.astype("Int64")
    return out


def _write_tables(df: pd.DataFrame, out: Path, warnings: list[str]) -> dict[str, Path]:
    paths = {"csv": out / "table.csv"}
    df = _integers_as_int(df)
    df.drop(columns=[SAMPLES_COLUMN]).to_csv(paths["csv"], index=False)
    try:
        import pyarrow  # noqa: F401  (pandas' parquet engine; optional)
    except ImportError:
        warnings.append("table.parquet not written: pyarrow is not installed (pip install pyarrow)")
        (out / "table.parquet").unlink(missing_ok=True)
        return paths
    paths["parquet"] = out / "table.parquet"
    df.to_parquet(paths["parquet"], index=False)
    return paths


def _page_text(data: ReportData) -> tuple[Callable[[list[Figure]], str], Callable[[list[Figure]], str]]:
    """The page's Markdown and HTML text but the figures (each a function of the drawn figures, which the page
    takes last)."""
    # NOTE: the page is some 100,000 small objects, which set off full garbage collections; frozen, what exists
    # already (the imported modules and the frames: at 10,000 records some 120,000 objects and 270,000 values in
    # object columns) is left out of them (bench_report's records: 0.64 → 0.42 s of CPU for the page)
    gc.freeze()
    try:
        page = build_page(data)
        return prepare_markdown(page), prepare_html(page)
    finally:
        gc.unfreeze()


def _write_figures(figures: list[Figure], out: Path) -> dict[str, Path]:
    paths = {}
    for f in figures:
        path = out / f"{f.name}.png"
        if f.png is None:
            path.unlink(missing_ok=True)  # a stale figure from an earlier report would contradict the note
            continue
        path.write_bytes(f.png)
        paths[f.name] = path
    return paths


def _more_figures(
    fc: pd.DataFrame,
    tune: tuple[tuple[TuneLog, str], ...],
    *,
    trends: dict[str, Any] | None,
    projection: Projection | None,
) -> list[Figure]:
    """The figures beyond the registered ones, drawn after them: trends, projection, one per tune log."""
    figures = []
    if trends is not None:
        figures.append(trends_figure(trends))
    if projection is not None:
        figures.append(projection_figure(projection, fc))
    return figures + [tune_figure(log, name=name) for log, name in tune]


def build_report(
    dirs: list[str | Path] | tuple[str | Path, ...],
    out: str | Path | None = None,
    *,
    trends: dict[str, Any] | None = None,
    projection: Projection | None = None,
    noise: Mapping[tuple[str, str, str | None], tuple[float, int]] | None = None,
    repredict: bool = False,
) -> dict[str, Any]:
    """Write the report for every record under `dirs` into `out` (default reports/<sweep name or 'report'>).
    `trends` (harness.history.trends.trend_series' data, `harness report --history`) adds the trends figure and
    table; `projection` (harness.plan.projection.read_projection's document, `harness report --projection`) the
    projected scaling figure with the measured cells on their lines. Each `harness tune` log (tune.json) under
    `dirs` adds a search section: its funnel, its figure (in "figures", drawn after the others) and its measured
    candidates ranked; an unreadable log or one of another version is a warning. `noise` (harness.history.noise.
    cell_noise's data, `harness report --history`) is each cell's between-run noise, a basis for the best-strategy
    table's verdicts where a cell was not measured MIN_RUNS times (harness.report.leader). `repredict`: every
    record's cell predicted again at its cluster's current rates (harness.report.repredict); without it, a warning
    names the records whose predictions came from other rates than their cluster's current ones.

    Returns {"out": Path | None, "name": str, "paths": {"html", "markdown", "csv", "parquet", "figures":
    {name: Path}}, "warnings": [str], "frame": DataFrame (one row per record), "cells": DataFrame (one row
    per cell shown), "best": DataFrame, "figures": [Figure], "timings_s": {stage: seconds}}. Stages, in order:
    load = read + flatten; frame = the cell table and the figure cells, after which the figures start drawing
    (with many cells in other processes); best = the best-strategy table, tables = CSV/Parquet, render = the
    HTML/Markdown text but the figures, all three while the figures draw; figures = from their start until the
    last is drawn, so it includes best, tables and render; write = PNG files, Markdown, HTML.
    With no readable record nothing is written and "out" is None. InputError when a dir does not exist or
    `out` is a file.
    """
    t0 = time.perf_counter()
    timings: dict[str, float] = {}
    paths_in = [Path(d) for d in dirs]
    if not paths_in:
        raise InputError("no result directories given")
    out_path = Path(out) if out is not None else None
    _check_inputs(paths_in, out_path)
    df, warnings, n_unreadable = load_records(paths_in, repredict=repredict)
    if not repredict and not df.empty:
        warnings += stale_predictions(zip(df["cluster"].tolist(), df["prediction_source"].tolist()))
    tune_logs = read_tune_logs(paths_in, warnings=warnings)
    timings["load"] = time.perf_counter() - t0
    result: dict[str, Any] = dict(out=None, name=report_name(df), paths={}, warnings=warnings, frame=df)
    result.update(cells=None, best=None, figures=[], timings_s=timings)
    if df.empty:
        return result
    t1 = time.perf_counter()
    if out_path is None:
        out_path = Path("reports") / result["name"]
        _check_inputs([], out_path)
    cells, more = cell_table(df)
    warnings += more
    fc = figure_cells(cells)
    collect_figures = start_figures(fc)
    # NOTE: with many cells the figures now draw in other processes; everything up to collect_figures() runs
    # beside them and must not need them
    t2 = time.perf_counter()
    timings["frame"] = t2 - t1
    best = best_per_model_gpus(cells, df, noise=noise)
    timings["best"] = time.perf_counter() - t2
    t1 = time.perf_counter()
    df = df.assign(in_tables=df.index.isin(cells.index))
    out_path.mkdir(parents=True, exist_ok=True)
    paths: dict[str, Any] = _write_tables(df, out_path, warnings)
    timings["tables"] = time.perf_counter() - t1
    t1 = time.perf_counter()
    tune = tuple(zip(tune_logs, tune_figure_names(tune_logs)))
    data = ReportData(
        name=result["name"],
        dirs=tuple(paths_in),
        frame=df,
        cells=cells,
        best=best,
        warnings=tuple(warnings),
        n_unreadable=n_unreadable,
        trends=trends,
        tune=tune,
        prediction_accuracy=prediction_accuracy(cells),
        generated_at=_dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        out=out_path,
    )
    finish_markdown, finish_html = _page_text(data)
    timings["render"] = time.perf_counter() - t1
    figures = collect_figures() + _more_figures(fc, tune, trends=trends, projection=projection)
    timings["figures"] = time.perf_counter() - t2
    t1 = time.perf_counter()
    paths["figures"] = _write_figures(figures, out_path)
    paths["markdown"] = out_path / "report.md"
    paths["markdown"].write_text(finish_markdown(figures))
    paths["html"] = out_path / "index.html"
    paths["html"].write_text(finish_html(figures))
    timings["write"] = time.perf_counter() - t1
    timings["total"] = time.perf_counter() - t0
    result.update(out=out_path, paths=paths, frame=df, cells=cells, best=best, figures=figures)
    return result
