"""The report's figures (matplotlib, Agg backend), each rendered once to PNG bytes.

One module per figure (scaling, heatmap, memory, comm, step_time, prediction, time_breakdown, checkpoint), each
registering its drawing function with its place in the report and its cost (`registry`); `base` is what they share (the
`Figure`, the strategy style, labels, which models and panels are drawn), `layout` how panels are drawn and
placed, `schedule` who draws which figure (in parallel for a big report). Importing this package registers
every figure.
"""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")  # NOTE: before pyplot is imported (by the modules below); the report never opens a window

# NOTE: each figure module registers its figure on import; the order of these imports does not matter (each
# figure gives its place in the report)
from harness.report.figures import (  # noqa: E402
    checkpoint,
    comm,
    heatmap,
    memory,
    prediction,
    scaling,
    step_time,
    time_breakdown,
)
from harness.report.figures.base import (  # noqa: E402
    LAYOUT_MARKERS,
    PRECISION_FILL,
    PRECISION_LINESTYLE,
    STRATEGY_STYLE,
    Figure,
    no_data,
    ordered_strategies,
    png_bytes,
    style,
)
from harness.report.figures.registry import FigureMaker, figure_makers  # noqa: E402
from harness.report.figures.schedule import all_figures, start_figures  # noqa: E402

__all__ = [
    "LAYOUT_MARKERS",
    "PRECISION_FILL",
    "PRECISION_LINESTYLE",
    "STRATEGY_STYLE",
    "Figure",
    "FigureMaker",
    "all_figures",
    "checkpoint",
    "comm",
    "figure_makers",
    "heatmap",
    "memory",
    "no_data",
    "ordered_strategies",
    "png_bytes",
    "prediction",
    "scaling",
    "start_figures",
    "step_time",
    "style",
    "time_breakdown",
]
