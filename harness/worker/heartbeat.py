"""Each rank's heartbeat: a daemon thread that rewrites `.fragments/<run_id>/beat<k>.json` every BEAT_S seconds with
the rank's phase, so the launcher can tell which rank stopped when no rank raised.

Why: a rank that fails with a Python exception writes a fragment (harness.worker.runner), but on NCCL the usual
failures raise nothing: a rank killed (SIGKILL, a segfault, the OOM killer) leaves the others blocked in
`torch.cuda.synchronize`, and the NCCL watchdog then aborts them after pg_timeout_s, again without an exception. A
thread's beat stops exactly when its process dies or freezes, whatever the cause; the main thread only names the
phase it enters (no work inside the timed steps). harness.launch.core.outcome reads the beats: the launchers end a
cell whose rank stopped beating, and attribute it.
"""

from __future__ import annotations

import os
import threading
import time

from harness.results.payload import Payload
from harness.results.record import Beat
from harness.results.store import write_beat

BEAT_S = 1.0
"""seconds between beats"""


class Heartbeat:
    """This rank's beat thread; `phase(name)` as the rank enters each phase, `stop()` when it leaves the benchmark.
    A beat that cannot be written (a full disk) is skipped: the heartbeat never fails the rank."""

    def __init__(self, payload: Payload, *, rank: int, hostname: str, interval_s: float = BEAT_S):
        self.payload, self.rank, self.hostname, self.interval_s = payload, rank, hostname, interval_s
        self._phase, self._since = "setup", time.time()
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"harness-heartbeat-rank{rank}", daemon=True)

    def start(self) -> Heartbeat:
        self._write()
        self._thread.start()
        return self

    def phase(self, name: str) -> None:
        """The rank enters phase `name` (written at the next beat)."""
        self._phase, self._since = name, time.time()

    def stop(self) -> None:
        """The rank leaves the benchmark (returned or raised): a last beat that says so; the thread ends."""
        self._stopped.set()
        self._thread.join(timeout=2 * self.interval_s)
        self._phase, self._since = "ended", time.time()
        self._write(ended=True)

    def _run(self) -> None:
        while not self._stopped.wait(self.interval_s):
            self._write()

    def _write(self, *, ended: bool = False) -> None:
        p = self.payload
        beat = Beat(
            rank=self.rank,
            attempt=p.attempt,
            pid=os.getpid(),
            hostname=self.hostname,
            phase=self._phase,
            phase_since=self._since,
            time=time.time(),
            ended=ended,
        )
        try:
            write_beat(p.results, p.sweep, p.run_id, beat)
        except OSError:
            pass
