"""Result records → one self-contained HTML page, a Markdown page, the table as CSV and Parquet, and each figure
as a PNG: `build_report`, which `harness report DIR… [-o OUT]` (harness.cli.report) calls.

Stages (harness.report.build): load (records → DataFrame, in parallel shares when there are many: .load) →
frame (cells, best strategy: .frame) → figures (matplotlib, PNG bytes, one module per figure: .figures) →
pages (one page model: .sections, .table; written as HTML and Markdown through Jinja2 templates: .render,
templates/). With many records and more than one CPU the work is spread over forked processes, and the output
is byte for byte the same as with one process (tests/unit/test_report_parallel.py). Nothing here imports
torch. Files that are not readable records are warnings, never a crash; a null metric stays null ("n/a"),
never 0. A sweep folder with a `harness tune` log (tune.json) adds its search section (harness.report.tune,
.search); a log that cannot be read is a warning too.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from harness.report.build import build_report, output_problem

__all__ = ["build_report", "output_problem"]


def __getattr__(name: str) -> Any:
    """`build_report` and `output_problem`, imported when first asked for: the package itself stays light, so
    `harness plan` can print through harness.report.plan without loading pandas and matplotlib."""
    if name in __all__:
        from harness.report import build

        return getattr(build, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
