"""Result records → one self-contained HTML page, a Markdown page, the table as CSV and Parquet, and each figure
as a PNG: `build_report`, which `harness report DIR… [-o OUT]` (harness.cli.report) calls.

Stages: frame (records → DataFrame, cells, best strategy) → figures (matplotlib, PNG bytes) → render
(HTML/Markdown). Nothing here imports torch. Files that are not readable records are warnings, never a crash;
a null metric stays null ("n/a"), never 0.
"""

from __future__ import annotations

import datetime as _dt
import os
import time
from pathlib import Path
from typing import Any

from harness.core.errors import InputError, Problem
from harness.report.figures import Figure, start_figures
from harness.report.frame import (
    FRACTIONAL_COLUMNS,
    SAMPLES_COLUMN,
    best_per_model_gpus,
    cell_table,
    figure_cells,
    records_frame,
    report_name,
)
from harness.report.render import html_page, markdown
from harness.results.fastload import iter_records

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


def build_report(dirs: list[str | Path] | tuple[str | Path, ...], out: str | Path | None = None) -> dict[str, Any]:
    """Write the report for every record under `dirs` into `out` (default reports/<sweep name or 'report'>).

    Returns {"out": Path | None, "name": str, "paths": {"html", "markdown", "csv", "parquet", "figures":
    {name: Path}}, "warnings": [str], "frame": DataFrame (one row per record), "cells": DataFrame (one row
    per cell shown), "best": DataFrame, "figures": [Figure], "timings_s": {stage: seconds}}. Stages:
    load = read + flatten; frame; tables = CSV/Parquet; figures = drawing, which with many cells runs in other
    processes while the tables are written, so it includes "tables"; write = PNG files, Markdown, HTML.
    With no readable record nothing is written and "out" is None. InputError when a dir does not exist or
    `out` is a file.
    """
    t0 = time.perf_counter()
    timings: dict[str, float] = {}
    dirs = [Path(d) for d in dirs]
    if not dirs:
        raise InputError("no result directories given")
    out_path = Path(out) if out is not None else None
    _check_inputs(dirs, out_path)
    # NOTE: records are parsed and flattened one at a time (never all held), so "load" includes the flattening
    warnings: list[str] = []
    df, more = records_frame(iter_records(*dirs, warnings=warnings))
    n_unreadable = len(warnings)
    warnings += more
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
    cells, more = cell_table(df)
    warnings += more
    best = best_per_model_gpus(cells, df)
    fc = figure_cells(cells)
    timings["frame"] = time.perf_counter() - t1
    t1 = time.perf_counter()
    collect_figures = start_figures(fc)  # NOTE: with many cells they draw in other processes while the tables
    df = df.assign(in_tables=df.index.isin(cells.index))  # are written here
    if out_path is None:
        out_path = Path("reports") / result["name"]
        _check_inputs([], out_path)
    out_path.mkdir(parents=True, exist_ok=True)
    paths: dict[str, Any] = _write_tables(df, out_path, warnings)
    timings["tables"] = time.perf_counter() - t1
    figures = collect_figures()
    timings["figures"] = time.perf_counter() - t1
    t1 = time.perf_counter()
    paths["figures"] = _write_figures(figures, out_path)
    ctx = {
        "name": result["name"],
        "dirs": dirs,
        "frame": df,
        "cells": cells,
        "best": best,
        "figures": figures,
        "warnings": warnings,
        "n_unreadable": n_unreadable,
        "generated_at": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
    }
    paths["markdown"] = out_path / "report.md"
    paths["markdown"].write_text(markdown(ctx))
    paths["html"] = out_path / "index.html"
    paths["html"].write_text(html_page(ctx))
    timings["write"] = time.perf_counter() - t1
    timings["total"] = time.perf_counter() - t0
    result.update(out=out_path, paths=paths, frame=df, cells=cells, best=best, figures=figures)
    return result
