"""Both sides of a comparison read (harness.compare.load) and indexed by spec (harness.compare.match.SideIndex),
with every problem of both sides raised at once.

Reading and indexing is most of a big compare's time and the sides are independent: with many candidate files
(and Linux) the candidate is read in a forked child, which hands back its index, while this process reads the
baseline. A child that fails leaves the candidate to this process (the same result).
"""

from __future__ import annotations

import multiprocessing
import sys
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from pathlib import Path

from harness.compare.load import iter_side
from harness.compare.match import SideIndex
from harness.core.errors import InputError, Problem
from harness.results.store import record_files

PARALLEL_LOAD_MIN_FILES = 2000
"""with at least this many candidate record files (and Linux), the candidate side loads in a forked child while
this process loads the baseline"""


@dataclass(frozen=True)
class LoadedSide:
    """One side read and indexed by spec."""

    index: SideIndex
    problems: list[Problem]
    """what is wrong with its input (exit 2, every problem of both sides at once)"""
    notes: list[str]
    """warnings, printed after the output"""


def load_side(paths: Sequence[Path], *, side: str, ignore: Sequence[str]) -> LoadedSide:
    """One side read and indexed, with its problems and notes. NOTE: each record is indexed as it loads, so only
    the one each cell uses stays in memory."""
    index = SideIndex(side=side, ignore=ignore)
    problems: list[Problem] = []
    notes: list[str] = []
    index.add_all(iter_side(paths, side=side, problems=problems, notes=notes, refuse_unreadable=True))
    return LoadedSide(index, problems, notes)


def load_sides(
    base_paths: Sequence[Path], cand_paths: Sequence[Path], *, ignore: Sequence[str], bootstrap: bool
) -> tuple[LoadedSide, LoadedSide]:
    """(baseline, candidate) read and indexed; InputError with the problems of both sides. `bootstrap` (--promote
    --force onto a baseline that does not exist yet): the baseline is empty."""
    base, cand = _read_sides(base_paths, cand_paths, ignore=ignore, bootstrap=bootstrap)
    if base.problems or cand.problems:
        raise InputError(base.problems + cand.problems)
    return base, cand


def _read_sides(
    base_paths: Sequence[Path], cand_paths: Sequence[Path], *, ignore: Sequence[str], bootstrap: bool
) -> tuple[LoadedSide, LoadedSide]:
    """(baseline, candidate), each as `load_side` gives it; the candidate in a forked child when it has at least
    PARALLEL_LOAD_MIN_FILES record files (the module docstring)."""
    empty = LoadedSide(SideIndex(side="baseline", ignore=ignore), [], [])
    big = sys.platform == "linux" and not bootstrap
    if big:
        big = len(record_files(*[p for p in cand_paths if p.exists()])) >= PARALLEL_LOAD_MIN_FILES
    pool = future = None
    if big:
        try:
            pool = ProcessPoolExecutor(max_workers=1, mp_context=multiprocessing.get_context("fork"))
            future = pool.submit(load_side, cand_paths, side="candidate", ignore=ignore)
        except (OSError, ValueError, RuntimeError, ImportError):
            future = None
    cand: LoadedSide | None = None
    try:
        base = empty if bootstrap else load_side(base_paths, side="baseline", ignore=ignore)
        if future is not None:
            try:
                cand = future.result()
            except BrokenProcessPool:  # the child died (killed, out of memory): read it here
                cand = None
        if cand is None:
            cand = load_side(cand_paths, side="candidate", ignore=ignore)
    finally:
        if pool is not None:
            if future is None or not future.done() or future.exception() is not None:
                for proc in list((getattr(pool, "_processes", None) or {}).values()):
                    proc.kill()  # NOTE: an interrupted or failed load: a child still reading is not waited for
            pool.shutdown(wait=True, cancel_futures=True)  # reaped: its peak memory counts as this command's
    return base, cand
