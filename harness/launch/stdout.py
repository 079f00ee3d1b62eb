"""Keeping a command's standard output its own while it runs cells: `harness history check --confirm` and
`harness tune --format json` print one document on stdout, and the cells they run must not write into it."""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator


@contextlib.contextmanager
def stdout_to_stderr() -> Iterator[None]:
    """Everything written to standard output in the block goes to standard error instead: Python's sys.stdout and
    file descriptor 1, which the re-runs' forked ranks inherit and libraries write to (DeepSpeed's logger prints
    "Setting accelerator to CPU" to stdout when it is first imported). stdout is the command's output, one JSON
    document with --format json, and must stay that alone."""
    sys.stdout.flush()
    saved = os.dup(1)
    try:
        os.dup2(2, 1)
        with contextlib.redirect_stdout(sys.stderr):
            yield
    finally:
        sys.stderr.flush()
        os.dup2(saved, 1)
        os.close(saved)
