"""The report's figures, each registered by its own module with its place in the report and its cost.

A figure module decorates its drawing function with `register(name, order=…, cost=…)`; the package imports
every figure module, so `figure_makers()` has them all, in report order. The cost is what the scheduler
(harness.report.figures.schedule) orders and shares the work by: nothing lists the figures by hand.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import pandas as pd

from harness.report.figures.base import Figure

Draw = Callable[[pd.DataFrame], Figure]
"""figure cells (harness.report.frame.figure_cells) → the figure"""


@dataclass(frozen=True)
class FigureMaker:
    """One registered figure."""

    name: str
    """its `Figure.name`: the file stem of its PNG"""
    draw: Draw
    order: int
    """its place in the report: the figures are listed by it, smallest first"""
    cost: float
    """CPU seconds to draw it from bench_report's 10,000 records on the 2-CPU development machine (bench_report
    --figure-times; the two prediction figures measured on those records with predictions added): only the
    ratios matter, for scheduling (heaviest first; the lightest may be drawn by the report's own process)"""


_MAKERS: dict[str, FigureMaker] = {}


def register(name: str, *, order: int, cost: float) -> Callable[[Draw], Draw]:
    """Decorator: register the decorated function as the figure `name`. Two figures with one name or one order
    are a programming error (ValueError at import)."""

    def add(draw: Draw) -> Draw:
        clash = [m.name for m in _MAKERS.values() if m.name == name or m.order == order]
        if clash:
            raise ValueError(f"figure {name!r} (order {order}) clashes with the registered {clash[0]!r}")
        _MAKERS[name] = FigureMaker(name=name, draw=draw, order=order, cost=cost)
        return draw

    return add


def figure_makers() -> tuple[FigureMaker, ...]:
    """Every registered figure, in report order."""
    return tuple(sorted(_MAKERS.values(), key=lambda m: m.order))


def figure_maker(name: str) -> FigureMaker:
    """The registered figure `name` (KeyError when there is none)."""
    return _MAKERS[name]


def heaviest_first(makers: tuple[FigureMaker, ...]) -> list[FigureMaker]:
    """`makers` by cost, the heaviest first; equal costs in report order."""
    return sorted(makers, key=lambda m: (-m.cost, m.order))
