"""Every record under the report's folders → one DataFrame, read in parallel shares when there are many files.

Each record is parsed and flattened as it is read, never all held. With many files and more than one CPU,
forked processes read and flatten consecutive shares of them while this one reads the first; the frame and the
warnings, in file order, are the same either way (tests/unit/test_report_parallel.py), and a share whose process
fails is read here. Files that are not readable records are warnings, never a crash.
"""

from __future__ import annotations

import multiprocessing
import sys
from collections.abc import Iterator
from concurrent.futures import Future, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path

import pandas as pd

from harness.core.collector import gc_paused
from harness.report.frame import FlatRecords, flatten_records, frame_from_flat
from harness.report.processes import close_pool, usable_cpus
from harness.report.repredict import repredicted
from harness.report.tune import is_tune_log
from harness.results.record import Record
from harness.results.store import read_record, record_files

PARALLEL_LOAD_MIN_FILES = 2000
"""with at least this many record files (and Linux, and more than one CPU) other processes read and flatten
consecutive shares of them while this one reads the first"""
MAX_LOAD_PROCESSES = 4


def records_of(files: list[str], warnings: list[str], fields: list[str]) -> Iterator[Record]:
    """The records of `files` (a slice of store.record_files' list), one at a time, with the warnings
    store.iter_records(*dirs) gives for those files: unreadable files to `warnings`, wrong-typed fields to
    `fields`."""
    for path in files:
        try:
            yield read_record(path, warnings=fields)
        except ValueError as e:
            warnings.append(f"{path}: {e}")


def read_share(files: list[str], repredict: bool = False) -> tuple[FlatRecords, list[str], list[str]]:
    """Read and flatten one share of the record files (in any process): (flattened records, warnings on files
    that are not readable records, warnings on fields of the wrong type). `repredict`: each record's cell
    predicted again at its cluster's current rates first (harness.report.repredict)."""
    unreadable: list[str] = []
    wrong: list[str] = []
    records = records_of(files, unreadable, wrong)
    if repredict:
        records = (repredicted(r) for r in records)
    with gc_paused():  # NOTE: each record is freed by its reference count as soon as it is flattened
        return flatten_records(records, wrong), unreadable, wrong


def _share_read(
    future: Future | None, share: list[str], broken: list[bool], repredict: bool
) -> tuple[FlatRecords, list[str], list[str]]:
    """What another process read of `share`, or, when it could not (none started, or it died: killed, out of
    memory; `broken` then says so), the share read here."""
    if future is not None:
        try:
            return future.result()
        except BrokenProcessPool:
            broken[0] = True
    return read_share(share, repredict)


def load_records(dirs: list[Path], *, repredict: bool = False) -> tuple[pd.DataFrame, list[str], int]:
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
            futures = [pool.submit(read_share, share, repredict) for share in shares[1:]]
        except (OSError, ValueError, RuntimeError, ImportError):  # NOTE: BrokenProcessPool is a RuntimeError
            pass  # no processes (no fork, no semaphores in a sandbox): every share is read here
    broken = [False]
    try:
        read = [read_share(shares[0], repredict)]
        read += [_share_read(future, share, broken, repredict) for future, share in zip(futures, shares[1:])]
    finally:
        if pool is not None:
            close_pool(pool, broken=broken[0])
    unreadable = [w for _, u, _ in read for w in u]
    df, more = frame_from_flat([flat for flat, _, _ in read], [w for _, _, wrong in read for w in wrong])
    return df, unreadable + more, len(unreadable)
