"""Whether a cell can run, asked once per cell: `RunSpec.unsupported_reason()` without a device (the planner's
question; the sweep asks again with the cluster's device before it launches).

The predict path (harness.plan.predict: `plan_cells`, `predict`) asks it and hands the answer down to the step-time
and collective models as their `unsupported` argument (the reason, or None for a cell that can run), so none of them
asks again. A model called on its own (a test, the validation, the calibration, `harness tune`) is handed nothing,
`UNASKED`, and asks the cell once itself.
"""

from __future__ import annotations

import enum
from typing import Final

from harness.scenario.spec import RunSpec


class Unasked(enum.Enum):
    """The type of `UNASKED` (a one-member enum, so that `str | None | Unasked` says "an answer, or none handed")."""

    UNASKED = "unasked"


UNASKED: Final = Unasked.UNASKED
"""the default of every `unsupported` argument: no answer handed down, the callee asks the cell"""


def unsupported_reason(spec: RunSpec, unsupported: str | None | Unasked) -> str | None:
    """Why `spec` cannot run, or None: the answer handed down, or the cell's own where none was."""
    return spec.unsupported_reason() if isinstance(unsupported, Unasked) else unsupported
