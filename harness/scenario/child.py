"""A worker module run as the planner's child interpreter (`python -m harness.worker.…`): what the planner reads of a
module it did not write comes back as JSON, so the planner's own process never imports torch or the user's code."""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

from harness.core.errors import InputError, Problem


def child_json(module: str, *args: str, stdin: str, where: str, what: str) -> dict[str, Any]:
    """Run `python -m MODULE ARGS` with `stdin`; the JSON it printed, or InputError at `where` saying `what` failed
    and the child's last line of error (the module's own message: an import error, the factory's exception)."""
    done = subprocess.run(
        [sys.executable, "-m", module, *args], input=stdin, capture_output=True, text=True, timeout=600
    )
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["(no output)"])[-1]
        raise InputError([Problem(where, "", f"{what}: {last}")])
    return dict(json.loads(done.stdout))
