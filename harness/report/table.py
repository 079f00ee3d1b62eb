"""The report's tables as data: built once per table (harness.report.sections), written into index.html and
report.md by the templates (harness/report/templates/, harness.report.render).

A table is its columns and its rows of cells. A cell is its text as the reader sees it (formatted by
harness.report.formats; the pages escape it, each in its own way) with what a page may add: a hover text, a
second line, a mark after it, bold. HTML-only parts (classes, hover texts, second lines) are left out of the
Markdown, which has no place for them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple


class Cell(NamedTuple):
    """One cell of a table. A NamedTuple, not a frozen dataclass: a report of 4,000 cells makes some 100,000 of
    them, and a tuple is made in a third of the time (and of strings only, the garbage collector skips it)."""

    text: str
    """as shown; NA ("n/a", harness.report.formats) is a null value, greyed in the HTML"""
    title: str = ""
    """hover text (HTML)"""
    cls: str = ""
    """HTML class, instead of its column's (the template adds `na` to a null value's, except with a `note`)"""
    note: str = ""
    """a second, smaller line under the text (HTML; the Markdown shows the text alone)"""
    mark: str = ""
    """a mark after the text, on both pages (★, ≈)"""
    strong: bool = False
    """bold in the Markdown (the HTML styles it by its class)"""
    links: tuple[tuple[str, str], ...] = ()
    """(text, href) links written after the text, on both pages (a traced cell's traces)"""

    def markdown(self) -> str:
        """Its Markdown, not escaped yet (the emphasis and the mark add nothing that escaping changes; a link's
        href is a path the harness made, without `|`, `&`, `<` or spaces)."""
        text = f"**{self.text}**" if self.strong else self.text
        text = f"{text} {self.mark}" if self.mark else text
        if self.links:
            text = " ".join([text, *(f"[{t}]({h})" for t, h in self.links)]).strip()
        return text


@dataclass(frozen=True)
class Column:
    label: str
    right: bool = False
    """a number: right-aligned (HTML class `num`: also tabular figures, no wrapping)"""
    cls: str = ""
    """HTML class of its cells when it is not `right`: `reason` (monospace, wrapped), `lbl` (the sticky row
    label), or `num` for a column laid out as a number in the HTML but left-aligned in the Markdown"""
    head_cls: str = ""
    """HTML class of its header in a grouped table (`m`, `rss`, `lbl`)"""
    long_text: bool = False
    """free text (a failure reason, a note): each page clips it to its own length (harness.report.render)"""

    @property
    def html_class(self) -> str:
        return "num" if self.right else self.cls


@dataclass(frozen=True)
class Group:
    """A header over `span` consecutive columns (a GPU count over its metrics)."""

    label: str
    span: int


@dataclass(frozen=True)
class Table:
    columns: tuple[Column, ...]
    rows: tuple[tuple[Cell, ...], ...]
    groups: tuple[Group, ...] = ()
    """headers over the columns after the first (HTML only: the Markdown tables have no groups)"""
    cls: str = ""
    """HTML class of the table (`cells`: a model table)"""


def text_cells(texts: list[str] | tuple[str, ...]) -> tuple[Cell, ...]:
    """A row of plain cells."""
    return tuple(Cell(t) for t in texts)
