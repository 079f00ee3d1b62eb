"""GitHub-flavoured Markdown text: escaping one line of inline text, and pipe tables.

Shared by `harness report` (report.md) and `harness compare` (compare.md, $GITHUB_STEP_SUMMARY), whose cells
and list items carry arbitrary text from records: failure reasons with tracebacks, spec values, file paths.
Escaping keeps such text on one line and inside its table column, and shows it as written:

- `\\` → `\\\\` first, so a backslash in the text can never escape the pipe or character after it;
- `|` → `\\|`, so the table keeps its columns;
- line breaks (`\\r\\n`, `\\r`, `\\n`) → one space each, so a cell or list item stays on its line;
- `&` → `&amp;` and `<` → `&lt;`, so `<absent>` or `<stdin>` is not taken for an HTML tag (GitHub would drop
  it) and `&lt;` in the text is not taken for an entity.

Other Markdown (`**bold**`, `` `code` ``, `_`) is left alone on purpose: callers put emphasis into cells
(`**ok** ★`), and names such as `fsdp.full_shard` must stay readable in the raw file.

Text that is Markdown already — a pipe table from `table`, or authored prose written as it is — is a `Markdown`,
which `escape` returns unchanged (as markupsafe's Markup is to HTML escaping): the report's Markdown template
escapes every value it writes with `escape`, and a finished table or authored text passes through once.
Pure: no imports beyond the standard library.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Sequence
from typing import Any

_LINE_BREAKS = ("\r\n", "\r", "\n")


class Markdown(str):
    """A str that is Markdown already: `escape` leaves it as it is."""

    __slots__ = ()


def escape(text: Any) -> str:
    """`text` (str() of it) as one line of inline Markdown that renders as written, also inside a table cell;
    a `Markdown` as it is."""
    if isinstance(text, Markdown):
        return text
    out = str(text).replace("\\", "\\\\").replace("|", "\\|").replace("&", "&amp;").replace("<", "&lt;")
    for brk in _LINE_BREAKS:  # NOTE: \r\n before its parts, so it becomes one space, not two
        out = out.replace(brk, " ")
    return out


def table(header: Sequence[Any], rows: Iterable[Sequence[Any]], *, right: Collection[int] = frozenset()) -> Markdown:
    """A pipe table (no trailing newline); every header and cell escaped; columns in `right` right-aligned."""
    lines = [
        "| " + " | ".join(escape(h) for h in header) + " |",
        "|" + "|".join("---:" if i in right else "---" for i in range(len(header))) + "|",
    ]
    lines += ["| " + " | ".join(escape(c) for c in row) + " |" for row in rows]
    return Markdown("\n".join(lines))
