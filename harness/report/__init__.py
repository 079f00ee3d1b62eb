"""Result records → one self-contained HTML page, a Markdown page, the table as CSV and Parquet, and each figure
as a PNG: `build_report`, which `harness report DIR… [-o OUT]` (harness.cli.report) calls.

Stages: frame (records → DataFrame, cells, best strategy) → figures (matplotlib, PNG bytes) → the page (one
page model: harness.report.sections, .table; written as HTML and Markdown through Jinja2 templates: .render,
templates/). With many records and more than one CPU the work is spread over forked processes: shares of
the record files are read and flattened in parallel, and the figures draw in a pool from the moment the cell
table exists, while this process builds the best-strategy table, the CSV/Parquet tables and the page text (and
then, with fewer than four workers, draws the lightest figure itself: figures.DRAWN_HERE); the output is byte for
byte the same as with one process (tests/unit/test_report_parallel.py). Nothing here imports
torch. Files that are not readable records are warnings, never a crash;
a null metric stays null ("n/a"), never 0. A sweep folder with a `harness tune` log (tune.json) adds its search
section (harness.report.tune); a log that cannot be read is a warning too.
"""

from __future__ import annotations

import datetime as _dt
import multiprocessing
import os
import sys
import time
from collections.abc import Iterator
from concurrent.futures import Future, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path
from typing import Any

import pandas as pd

from harness.core.errors import InputError, Problem
from harness.report.figures import Figure, close_pool, start_figures, usable_cpus
from harness.report.frame import (
    FRACTIONAL_COLUMNS,
    SAMPLES_COLUMN,
    FlatRecords,
    best_per_model_gpus,
    cell_table,
    figure_cells,
    flatten_records,
    frame_from_flat,
    prediction_accuracy,
    report_name,
)
from harness.report.projection import projection_figure
from harness.report.render import prepare_html, prepare_markdown
from harness.report.sections import ReportData, build_page
from harness.report.trends import trends_figure
from harness.report.tune import is_tune_log, read_tune_logs, tune_figure, tune_figure_names
from harness.results.fastload import read_file, record_files
from harness.results.store import read_record

__all__ = ["build_report", "output_problem"]


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


def _integers_as_int(df):
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


PARALLEL_LOAD_MIN_FILES = 2000
"""with at least this many record files (and Linux, and more than one CPU) other processes read and flatten
consecutive shares of them while this one reads the first"""
MAX_LOAD_PROCESSES = 4


def _records_of(files: list[str], warnings: list[str]) -> Iterator[dict[str, Any]]:
    """The records of `files` (a slice of fastload.record_files' list), one at a time, with the warnings
    fastload.iter_records(*dirs) gives for those files. NOTE: a folder (or a dangling link) named like a record,
    which the walk lists as one, fails fastload.read_file's open; it is read as store.read_record reads it
    (fastload's messages are read_record's), so it fails with the same warning as through iter_records."""
    for path in files:
        try:
            rec = read_file(path)
        except ValueError as e:
            why = str(e)
            if not os.path.isfile(path):  # NOTE: rare (a folder named like a record): read_record's own words
                try:
                    rec = dict(read_record(path))
                except ValueError as e2:
                    why = str(e2)
                else:
                    why = ""
            if why:
                warnings.append(f"{path}: {why}")
                continue
        rec.setdefault("_path", path)
        yield rec


def _read_share(files: list[str]) -> tuple[FlatRecords, list[str], list[str]]:
    """Read and flatten one share of the record files (in any process): (flattened records, warnings on files
    that are not readable records, warnings on fields of the wrong type)."""
    unreadable: list[str] = []
    wrong: list[str] = []
    return flatten_records(_records_of(files, unreadable), wrong), unreadable, wrong


def _share_read(
    future: Future | None, share: list[str], broken: list[bool]
) -> tuple[FlatRecords, list[str], list[str]]:
    """What another process read of `share`, or, when it could not (none started, or it died: killed, out of
    memory; `broken` then says so), the share read here."""
    if future is not None:
        try:
            return future.result()
        except BrokenProcessPool:
            broken[0] = True
    return _read_share(share)


def _load(dirs: list[Path]) -> tuple[pd.DataFrame, list[str], int]:
    """(frame of every record under `dirs`, warnings, how many of them are on unreadable files, which come
    first). Each record is parsed and flattened as it is read, never all held. With many files the shares are
    read in parallel, forked processes flattening the later ones (the flattened fields are what comes back);
    the frame and the warnings, in file order, are the same either way, and a share whose process fails is
    read here."""
    # NOTE: the walk leaves tune logs out (store.NOT_RECORDS); a tune.json given itself is one too, not a record
    files = [f for f in record_files(*dirs) if not is_tune_log(f)]
    n = min(usable_cpus(), MAX_LOAD_PROCESSES) if sys.platform == "linux" else 1
    if len(files) < PARALLEL_LOAD_MIN_FILES:
        n = 1
    bounds = [len(files) * i // n for i in range(n + 1)]
    shares = [files[a:b] for a, b in zip(bounds, bounds[1:])]
    pool = None
    futures: list[Future | None] = [None] * (n - 1)
    if n > 1:
        try:
            pool = ProcessPoolExecutor(max_workers=n - 1, mp_context=multiprocessing.get_context("fork"))
            futures = [pool.submit(_read_share, share) for share in shares[1:]]
        except (OSError, ValueError, RuntimeError, ImportError):  # NOTE: BrokenProcessPool is a RuntimeError
            pass  # no processes (no fork, no semaphores in a sandbox): every share is read here
    broken = [False]
    try:
        read = [_read_share(shares[0])]
        read += [_share_read(future, share, broken) for future, share in zip(futures, shares[1:])]
    finally:
        if pool is not None:
            close_pool(pool, broken=broken[0])
    unreadable = [w for _, u, _ in read for w in u]
    df, more = frame_from_flat([flat for flat, _, _ in read], [w for _, _, wrong in read for w in wrong])
    return df, unreadable + more, len(unreadable)


def _write_tables(df, out: Path, warnings: list[str]) -> dict[str, Path]:
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


def build_report(
    dirs: list[str | Path] | tuple[str | Path, ...],
    out: str | Path | None = None,
    *,
    trends: dict[str, Any] | None = None,
    projection: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Write the report for every record under `dirs` into `out` (default reports/<sweep name or 'report'>).
    `trends` (harness.history.trends.trend_series' data, `harness report --history`) adds the trends figure and
    table; `projection` (harness.report.projection.read_projection's document, `harness report --projection`) the
    projected scaling figure with the measured cells on their lines. Each `harness tune` log (tune.json) under
    `dirs` adds a search section: its funnel, its figure (in "figures", drawn after the others) and its measured
    candidates ranked; an unreadable log or one of another version is a warning.

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
    df, warnings, n_unreadable = _load(paths_in)
    tune_logs = read_tune_logs(paths_in, warnings=warnings)
    timings["load"] = time.perf_counter() - t0
    result: dict[str, Any] = {
        "out": None,
        "name": report_name(df),
        "paths": {},
        "warnings": warnings,
        "frame": df,
        "cells": None,
        "best": None,
        "figures": [],
        "timings_s": timings,
    }
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
    best = best_per_model_gpus(cells, df)
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
    )
    page = build_page(data)
    finish_markdown, finish_html = prepare_markdown(page), prepare_html(page)
    timings["render"] = time.perf_counter() - t1
    figures = collect_figures()
    if trends is not None:
        figures.append(trends_figure(trends))
    if projection is not None:
        figures.append(projection_figure(projection, fc))
    figures += [tune_figure(log, name=name) for log, name in tune]
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
