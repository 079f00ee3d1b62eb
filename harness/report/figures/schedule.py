"""Drawing every registered figure, in parallel when the report is big.

Rendering is most of a big report's time and the figures are independent, so with many cells they are drawn in
forked processes (one per CPU: the children inherit the imported modules, no start-up) while the report's own
process goes on with its part (the best-strategy table, the CSV/Parquet tables, the HTML/Markdown text). Who
draws what follows from the registered costs (harness.report.figures.registry): list scheduling, heaviest first,
onto the workers and the report's own process, which joins once its part is done (CALLER_WORK_COST later), so
that all finish together rather than a worker drawing alone at the end. The PNG bytes are the same whoever draws
them, so any failure of the processes falls back to drawing here.
"""

from __future__ import annotations

import gc
import multiprocessing
import sys
from collections.abc import Callable
from concurrent.futures import Future, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool

import pandas as pd

from harness.core.collector import gc_paused
from harness.report.figures.base import Figure
from harness.report.figures.registry import FigureMaker, figure_maker, figure_makers, heaviest_first
from harness.report.processes import close_pool, usable_cpus

PARALLEL_MIN_CELLS = 300
"""with at least this many cells (and Linux, and more than one CPU) the figures render in forked processes"""
CALLER_WORK_COST = 1.5
"""the report's own work while the figures draw (best-strategy table, CSV/Parquet tables, page text), in the
units of FigureMaker.cost (CPU seconds at bench_report's 10,000 records)"""


def share_out(makers: tuple[FigureMaker, ...], workers: int) -> tuple[list[FigureMaker], list[FigureMaker]]:
    """(the figures for the pool, heaviest first; those the report's own process draws once its own work is
    done). Each figure, heaviest first, goes to whoever would be free first: a worker (the pool hands out work
    in that order) or the report's process, busy for CALLER_WORK_COST first; a tie goes to a worker."""
    loads = [0.0] * workers + [CALLER_WORK_COST]
    pooled: list[FigureMaker] = []
    here: list[FigureMaker] = []
    for maker in heaviest_first(makers):
        free = loads.index(min(loads))
        loads[free] += maker.cost
        (here if free == workers else pooled).append(maker)
    return pooled, here


def draw_registered(name: str, fc: pd.DataFrame) -> Figure:
    """The registered figure `name` drawn from `fc`: what a pool worker runs (only the name is sent; the worker,
    forked, has the registry as it was). The collector waits until the figure is drawn: matplotlib's artists make
    cycles, but few enough in one figure to leave for one collection at its end (5 % of the drawing's CPU)."""
    with gc_paused():
        return figure_maker(name).draw(fc)


def _draw_here(makers: tuple[FigureMaker, ...], fc: pd.DataFrame) -> Callable[[], list[Figure]]:
    return lambda: [m.draw(fc) for m in makers]


def start_figures(fc: pd.DataFrame, *, workers: int | None = None) -> Callable[[], list[Figure]]:
    """Start drawing every registered figure from the figure cells (frame.figure_cells); the returned function
    draws the report process's share (share_out), waits for the others and gives them all in report order.

    With fewer than PARALLEL_MIN_CELLS cells (or one CPU, or not Linux) everything is drawn here when the
    returned function is called. A pool that cannot start (no fork, no semaphores in a sandbox) draws everything
    here, and a worker that dies (killed, out of memory) has its figures drawn here, with the same bytes. A
    figure's own error is raised as in a serial run.
    """
    makers = figure_makers()
    if workers is None:
        big = len(fc) >= PARALLEL_MIN_CELLS and sys.platform == "linux"
        workers = min(len(makers), usable_cpus()) if big else 1
    if workers <= 1:
        return _draw_here(makers, fc)
    pooled, here = share_out(makers, workers)
    pool = None
    try:
        pool = ProcessPoolExecutor(max_workers=workers, mp_context=multiprocessing.get_context("fork"))
        # NOTE: the workers fork at the first submit; frozen, the objects they inherit (the frame, the imported
        # modules) are left out of their garbage collections, which otherwise walk them again and again while
        # matplotlib makes and drops its artists
        gc.freeze()
        futures = {m.name: pool.submit(draw_registered, m.name, fc) for m in pooled}
    except (OSError, ValueError, RuntimeError, ImportError):  # NOTE: BrokenProcessPool is a RuntimeError
        if pool is not None:
            close_pool(pool, broken=True)
        return _draw_here(makers, fc)
    finally:
        gc.unfreeze()
    return lambda: _collect(pool, futures, makers, here, fc)


def _collect(
    pool: ProcessPoolExecutor,
    futures: dict[str, Future],
    makers: tuple[FigureMaker, ...],
    here: list[FigureMaker],
    fc: pd.DataFrame,
) -> list[Figure]:
    """Draw `here`'s figures in this process, then take the pool's, in report order; a figure whose worker died
    is drawn here."""
    figures = []
    broken = False
    try:
        drawn_here = {m.name: m.draw(fc) for m in here}
        for m in makers:
            if m.name in drawn_here:
                figures.append(drawn_here[m.name])
                continue
            try:
                figures.append(futures[m.name].result())
            except BrokenProcessPool:  # a worker died (killed, out of memory): draw it here (same bytes)
                broken = True
                figures.append(m.draw(fc))
    finally:
        close_pool(pool, broken=broken)
    return figures


def all_figures(fc: pd.DataFrame, *, workers: int | None = None) -> list[Figure]:
    """Every registered figure, in report order, from the figure cells (frame.figure_cells)."""
    return start_figures(fc, workers=workers)()
