"""The end of a rank's process group: destroyed, then gloo's worker threads left to finish before the process exits.

Why (observed on the 2-core development host, torch 2.13.0+cpu): a two-rank gloo process that ends right after a
collective aborted at interpreter exit in about one run in six ("terminate called without an active exception",
SIGABRT, after its results were written). The core dump shows why. gloo runs each collective on one of its
`pt_gloo_runloop` threads; once the collective is done that thread releases the work, and the work's last reference
to a tensor created in Python drops the tensor's Python object, which takes the GIL. On a loaded host the thread can
be descheduled between completing the work (which wakes the rank's main thread) and releasing it (the reading the
measurements below support: giving it a few milliseconds ends the aborts); when it runs again the interpreter is
finalising, the GIL cannot be taken, the thread is unwound through a `noexcept` destructor, and the C++ runtime
aborts the process. `destroy_process_group` does not join these threads (the backend lives on until the process
ends), so nothing else waits for them.

`end_process_group` destroys the group and then sleeps in short steps (the GIL released) until every gloo worker
thread of this process has been seen asleep in two consecutive looks, at most `SETTLE_MAX_S`. A thread that
waits for the GIL takes it while the main thread sleeps; a thread that is runnable shows as running in
/proc/self/task/<tid>/stat. Measured on the test that showed it (tests/dist/test_trace.py's two-rank overlap
test, 2026-12-04, quiet host): with a plain `destroy_process_group` 6 aborts in 34 runs, with `end_process_group`
none in 40. Where /proc is not there (macOS) it sleeps `SETTLE_MAX_S / 10` once. A group nothing else holds is
joined by `destroy_process_group` itself (its threads are gone); DDP and FSDP hold theirs, so in a rank they are
not.

A rank that still aborts at exit has written its record first: the dispatch goes by the record (docs/slurm.md).
"""

from __future__ import annotations

import os
import time
from pathlib import Path

GLOO_WORKER = "pt_gloo_runloop"
"""the name torch gives ProcessGroupGloo's worker threads (c10::setThreadName)"""
SETTLE_MAX_S = 0.5
SETTLE_STEP_S = 0.002


def gloo_worker_states(task_dir: Path = Path("/proc/self/task")) -> list[str] | None:
    """Each gloo worker thread's scheduler state in this process ('R' running or runnable, 'S' asleep, ...); None
    where the process's threads cannot be read (no /proc)."""
    try:
        tids = os.listdir(task_dir)
    except OSError:
        return None
    states = []
    for tid in tids:
        try:
            if (task_dir / tid / "comm").read_text().strip() != GLOO_WORKER:
                continue
            stat = (task_dir / tid / "stat").read_text()
        except OSError:  # the thread ended between the listing and the read
            continue
        states.append(stat[stat.rindex(")") + 2])  # the field after the parenthesised name
    return states


def settle(*, max_s: float = SETTLE_MAX_S, step_s: float = SETTLE_STEP_S) -> float:
    """Sleep until every gloo worker thread has been asleep in two consecutive looks, `step_s` apart (at most
    `max_s`); returns the seconds slept."""
    t0 = time.perf_counter()
    if gloo_worker_states() is None:
        time.sleep(max_s / 10)
        return time.perf_counter() - t0
    quiet = 0
    while quiet < 2 and time.perf_counter() - t0 < max_s:
        time.sleep(step_s)
        states = gloo_worker_states() or []
        quiet = quiet + 1 if all(s != "R" for s in states) else 0
    return time.perf_counter() - t0


def end_process_group() -> float:
    """Destroy the default process group (when there is one) and let gloo's worker threads finish; returns the
    seconds spent settling."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()
    return settle()
