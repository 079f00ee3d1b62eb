"""A status line for long work on a terminal: `sweep smoke: 3/25 runs, 1m05s elapsed, ETA 8m00s · tiny zero2 bf16 g2`.

`harness sweep`, `tune` and `calibrate` run for minutes to hours, and print a line only when a cell or a part ends.
On a terminal, a `Progress` keeps one more line at the bottom, rewritten in place (`\\r`): what is done of how many,
the time since it started, and an ETA. Not on a terminal (a CI log, a pipe, a test's captured output) it prints
nothing at all, so logs stay as they were.

Why here, in core: the sweep (launch), calibrate and tune use it, and it needs nothing of any stage.

The rules:

- **The ETA** is the mean wall seconds per item so far times the items left: each item that did work (`advance()`)
  counts the time since the item before it ended; an item that took none (`advance(timed=False)`: a cell already
  recorded ok, or skipped) counts towards done but not towards the mean, so a re-run that skips fifty cells in a
  second does not promise the rest in a second. The mean of wall-clock intervals is right for cells that run one
  after another (each interval is a cell) and for SLURM's, which run side by side (the intervals are the throughput).
  Until one item that did work has ended, the line says `ETA unknown`.
- **Lines printed while it shows** go above it: an `echo` passed through `above(echo)` clears the status line,
  prints its line, and draws the status line again below it. Every line a sweep prints goes through that.
- **Nested work** (a tune's batch is a sweep) shares the one line: each `Progress` in force adds its part, outermost
  first, joined by ` | `; the line is cut at the terminal's width (a wrapped line could not be rewritten in place).
- **It is redrawn when something happens** (an item starts or ends, a line is printed, the SLURM wait loop's tick),
  not by a clock: no thread, because the sweep forks processes, and a fork beside a thread that holds a lock
  deadlocks. A local cell's minutes pass with the elapsed time standing still until it ends.
- Only spaces and `\\r`, no escape codes: a dumb terminal shows it as well.
"""

from __future__ import annotations

import shutil
import sys
import time
from collections.abc import Callable
from typing import TextIO

Echo = Callable[[str], None]


class _StatusLine:
    """The one status line of a stream: the progresses in force on it, outermost first, and what it shows now."""

    def __init__(self, stream: TextIO):
        self.stream = stream
        self.parts: list[Progress] = []
        self.shown = ""

    def text(self) -> str:
        line = " | ".join(p.text() for p in self.parts)
        width = max(20, shutil.get_terminal_size().columns - 1)
        return line if len(line) <= width else line[: width - 1] + "…"

    def draw(self) -> None:
        """Show the line as it is now (nothing written when it has not changed)."""
        text = self.text() if self.parts else ""
        if text == self.shown:
            return
        pad = " " * max(0, len(self.shown) - len(text))
        self.stream.write(f"\r{text}{pad}")
        self.stream.flush()
        self.shown = text

    def clear(self) -> None:
        """Take the line away, the cursor at the start of its row (for a line to be printed there)."""
        if self.shown:
            self.stream.write("\r" + " " * len(self.shown) + "\r")
            self.stream.flush()
            self.shown = ""


_LINES: dict[int, _StatusLine] = {}
"""the status line of each stream a Progress draws on, by id (a stream has one line, whoever draws it)"""


def is_terminal(stream: TextIO) -> bool:
    """Whether `stream` is a terminal that a status line can be drawn on (its isatty(); a closed or odd stream is
    not)."""
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError, OSError):
        return False


class Progress:
    """`what: done/total unit, elapsed, ETA` on `stream`'s status line while in a `with` block, when the stream is a
    terminal (else nothing). `total` None: a count without a total (and no ETA); `approx`: the total is an estimate,
    shown as `~N`. `clock`: seconds, monotonic (a test's own)."""

    def __init__(
        self,
        what: str,
        total: int | None,
        *,
        unit: str = "cells",
        approx: bool = False,
        stream: TextIO | None = None,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.what, self.total, self.unit, self.approx = what, total, unit, approx
        self.clock = clock
        self.stream = stream if stream is not None else sys.stdout
        self.live = is_terminal(self.stream)
        self.done = 0
        self.timed = 0
        """items that did work (`advance()`), whose intervals make the mean"""
        self.timed_s = 0.0
        """the sum of their intervals (s)"""
        self.current = ""
        self.started = self.last = clock()

    # ---- in force

    @property
    def _line(self) -> _StatusLine:
        key = id(self.stream)
        line = _LINES.get(key)
        if line is None or line.stream is not self.stream:
            line = _LINES[key] = _StatusLine(self.stream)
        return line

    def __enter__(self) -> Progress:
        self.started = self.last = self.clock()
        if self.live:
            self._line.parts.append(self)
            self._line.draw()
        return self

    def __exit__(self, *exc: object) -> None:
        if not self.live:
            return
        line = self._line
        if self in line.parts:
            line.parts.remove(self)
        line.clear()
        if line.parts:
            line.draw()
        else:
            _LINES.pop(id(self.stream), None)

    # ---- what happened

    def advance(self, n: int = 1, *, timed: bool = True) -> None:
        """`n` more items done; `timed`: they did work, and the time since the last item ended is theirs (the ETA's
        mean); untimed ones (found done, skipped) took none."""
        now = self.clock()
        if timed:
            self.timed += n
            self.timed_s += now - self.last
        self.done += n
        self.last = now
        self.current = ""
        self.draw()

    def doing(self, what: str) -> None:
        """Name the item under way (shown after the counts until it is done)."""
        self.current = what
        self.draw()

    def grow(self, total: int) -> None:
        """A new estimate of the total (a tune's search learns how many trials it needs as it goes)."""
        self.total = total
        self.draw()

    def draw(self) -> None:
        """Redraw the status line (a loop that waits calls it on its tick, so the elapsed time moves)."""
        if self.live and self in self._line.parts:
            self._line.draw()

    def above(self, echo: Echo) -> Echo:
        """`echo` printing its lines above the status line (cleared, the line printed, drawn again); `echo` itself
        when the stream is no terminal, or when it already does (a nested progress's)."""
        if not self.live or getattr(echo, "_status_line", None) is self._line:
            return echo
        line = self._line

        def above(text: str) -> None:
            line.clear()
            echo(text)
            line.draw()

        above._status_line = line  # type: ignore[attr-defined]
        return above

    # ---- what it shows

    def eta_s(self) -> float | None:
        """Seconds left: the mean seconds of an item that did work times the items left; None before one has
        ended, or without a total."""
        if self.total is None or not self.timed:
            return None
        return self.timed_s / self.timed * max(0, self.total - self.done)

    def text(self) -> str:
        """`what: done/total unit, elapsed, ETA · current`."""
        total = "" if self.total is None else f"/{'~' if self.approx else ''}{self.total}"
        eta = self.eta_s()
        parts = [f"{self.what}: {self.done}{total} {self.unit}", f"{duration(self.clock() - self.started)} elapsed"]
        if self.total is not None:
            parts.append("ETA unknown" if eta is None else f"ETA {duration(eta)}")
        return ", ".join(parts) + (f" · {self.current}" if self.current else "")


def duration(seconds: float) -> str:
    """A duration for reading at a glance: 45s, 3m05s, 2h07m (rounded down to the unit shown)."""
    s = max(0, int(seconds))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{s % 3600 // 60:02d}m"
