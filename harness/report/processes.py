"""The report's other processes (forked, Linux): how many CPUs it may use, and how a pool of them is shut down
even when one died. Used by the parallel record loading (harness.report.load) and the figure pool
(harness.report.figures.schedule)."""

from __future__ import annotations

import os
from concurrent.futures import ProcessPoolExecutor


def usable_cpus() -> int:
    """CPUs this process may run on (its affinity mask, which a container or taskset narrows), else the count."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def close_pool(pool: ProcessPoolExecutor, *, broken: bool) -> None:
    """Shut a pool down; after a worker died, first SIGKILL the others. A broken pool's surviving worker may be
    blocked writing its result into a pipe nobody reads any more, and a SIGTERM does not end it when it inherited
    a Python handler for SIGTERM (a sweep run earlier in the same process installs one): waiting for it would
    hang the report forever."""
    if broken:
        for proc in list((getattr(pool, "_processes", None) or {}).values()):
            proc.kill()
    pool.shutdown(wait=not broken, cancel_futures=True)
