"""The report's pages: the one `Page` (harness.report.sections) written as a self-contained HTML page and as a
GitHub-flavoured Markdown page, through the Jinja2 templates in harness/report/templates/.

Escaping, one kind per page, applied by the environment to every value a template writes: HTML by html.escape
(quote=True: autoescape with the bytes the page always had; markupsafe's own escape writes quotes as &#34;),
Markdown by harness.core.markdown.escape (the escaping `harness compare` uses). Each page is written in two
steps, so that its text is ready while the figures draw: `prepare_*` renders everything but the figures, and
the function it returns adds them.
"""

from __future__ import annotations

import base64
import functools
import html
from collections.abc import Callable
from typing import Any

import jinja2
from markupsafe import Markup

from harness.core import markdown as md
from harness.report.figures import Figure
from harness.report.formats import NA, shorten
from harness.report.sections import Page
from harness.report.table import Table

MAX_MD_FAILED_ROWS = 200
"""failed (and noted) cells listed in report.md at most; index.html lists all"""
MAX_MD_WARNINGS = 50
MAX_REASON_MD = 300
"""characters of a failure reason or note in report.md (one line)"""
MAX_REASON_HTML = 2000
"""characters of a failure reason or note in index.html (its line breaks kept)"""
MAX_MD_BYTES = 900 * 2**10
"""report.md larger than this drops its per-model tables ($GITHUB_STEP_SUMMARY takes at most 1 MiB)"""


def _html_value(value: Any) -> Any:
    """Every value an HTML template writes, escaped as html.escape(quote=True) does: autoescape's markupsafe
    escapes `& < >` as it does, and only quotes differ (&#34; &#39; against &quot; &#x27;), so a text with a
    quote is escaped here and the rest (most values: numbers) is left to markupsafe's faster escape."""
    if isinstance(value, str) and not isinstance(value, Markup) and ('"' in value or "'" in value):
        return Markup(html.escape(value, quote=True))
    return value


def _wbr(label: str) -> Markup:
    """A header that may wrap after each `/` (tok/s/GPU)."""
    return Markup(html.escape(label, quote=True)).replace("/", Markup("/<wbr>"))


def _base64(png: bytes) -> Markup:
    return Markup(base64.b64encode(png).decode("ascii"))


def _md_table(t: Table, limit: int | None = None) -> md.Markdown:
    """`t` as a pipe table (its first `limit` rows): the cells' Markdown (bold, marks), free text on one line of
    at most MAX_REASON_MD characters, each escaped."""
    rows = [
        [
            shorten(cell.text, MAX_REASON_MD) if column.long_text else cell.markdown()
            for cell, column in zip(row, t.columns)
        ]
        for row in t.rows[:limit]
    ]
    return md.table([c.label for c in t.columns], rows, right={i for i, c in enumerate(t.columns) if c.right})


@functools.cache
def _templates() -> tuple[Any, Any]:
    """(the HTML template's module, the Markdown template's module): their macros."""
    loader = jinja2.PackageLoader("harness.report", "templates")
    common: dict[str, Any] = dict(loader=loader, trim_blocks=True, lstrip_blocks=True, keep_trailing_newline=True)
    html_env = jinja2.Environment(autoescape=True, finalize=_html_value, **common)
    html_env.filters.update(wbr=_wbr, base64=_base64, long_text=lambda s: shorten(s, MAX_REASON_HTML, one_line=False))
    html_env.globals.update(zip=zip, NA=NA)
    md_env = jinja2.Environment(autoescape=False, finalize=md.escape, **common)  # NOTE: Markdown: escaped by finalize
    md_env.filters.update(md_table=_md_table, markdown=md.Markdown, shorten=shorten)
    md_env.globals.update(max_warnings=MAX_MD_WARNINGS, max_rows=MAX_MD_FAILED_ROWS, max_kib=MAX_MD_BYTES // 2**10)
    return html_env.get_template("report.html.j2").module, md_env.get_template("report.md.j2").module


def prepare_html(page: Page) -> Callable[[list[Figure]], str]:
    """index.html in two steps: every table now; the returned function adds the figures (the body's
    data-figures count, the inline PNGs, the search figures in their sections) and gives the page."""
    templates = _templates()[0]
    head, top, models, tail = templates.head(page), templates.top(page), templates.models(page), templates.tail(page)

    def finish(figures: list[Figure]) -> str:
        n_drawn = sum(f.png is not None for f in figures)
        return str(templates.page(head, top, models, tail, page.search, figures, n_drawn))

    return finish


def prepare_markdown(page: Page) -> Callable[[list[Figure]], str]:
    """report.md in two steps, as prepare_html: everything but the figures' list now; the returned function
    adds that list and gives the page, without the per-model tables when it would not fit GitHub's 1 MiB
    step-summary limit (MAX_MD_BYTES)."""
    templates = _templates()[1]
    top, models, tail = (md.Markdown(t) for t in (templates.top(page), templates.models(page), templates.tail(page)))

    def finish(figures: list[Figure]) -> str:
        text = templates.page(top, models, tail, page.search, figures)
        if len(text.encode()) > MAX_MD_BYTES:
            text = templates.page(top, md.Markdown(templates.models_left_out()), tail, page.search, figures)
        return text.removesuffix("\n")  # NOTE: the blank line after the last block

    return finish
