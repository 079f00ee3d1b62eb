"""harness.core.markdown: the escaping report.md and compare.md share, on the strings that break naive escaping.

Each expectation is the exact Markdown text; the comments say how GitHub renders it.
"""

from __future__ import annotations

import re

import pytest

from harness.core import markdown as md


@pytest.mark.parametrize(
    ("text", "escaped"),
    [
        ("plain text · ★ — ok", "plain text · ★ — ok"),
        ("a | b", "a \\| b"),  # renders "a | b", one cell
        ("C:\\dir\\file", "C:\\\\dir\\\\file"),  # renders "C:\dir\file"
        ("ends in a backslash\\", "ends in a backslash\\\\"),  # cannot escape the cell's closing pipe
        ("\\|", "\\\\\\|"),  # renders "\|": the backslash does not eat the escape
        ("line one\nline two", "line one line two"),
        ("crlf\r\nend", "crlf end"),  # one space, not two
        ("cr\rend", "cr end"),
        ("\n\n", "  "),
        ("<absent> → 5", "&lt;absent> → 5"),  # not an HTML tag GitHub would drop
        ("<details>", "&lt;details>"),
        ("a & b", "a &amp; b"),
        ("&lt; stays literal", "&amp;lt; stays literal"),  # renders "&lt;", not "<"
        ("**bold** ★ `code` fsdp.full_shard", "**bold** ★ `code` fsdp.full_shard"),  # Markdown the callers mean
    ],
)
def test_escape(text, escaped):
    assert md.escape(text) == escaped


def test_escape_takes_any_value():
    assert md.escape(3) == "3" and md.escape(None) == "None" and md.escape(0.5) == "0.5"


def test_table_keeps_its_columns_and_lines():
    text = md.table(["name", "value | unit"], [["a|b", "1\n2"], ["<x>", "\\"]], right={1})
    assert text == ("| name | value \\| unit |\n|---|---:|\n| a\\|b | 1 2 |\n| &lt;x> | \\\\ |")
    for line in text.splitlines():
        # every row splits into exactly two cells on unescaped pipes (GFM's rule)
        assert len(re.split(r"(?<!\\)\|", re.sub(r"\\\\", "", line))[1:-1]) == 2


def test_table_without_rows_is_header_and_rule():
    assert md.table(["a", "b", "c"], [], right={0, 2}) == "| a | b | c |\n|---:|---|---:|"


def test_markdown_text_is_escaped_once():
    """A table, or authored text marked Markdown, is written as it is: escaping it again would show its
    backslashes (the report's Markdown template escapes every value it writes)."""
    table = md.table(["a|b"], [["x|y"]])
    assert isinstance(table, md.Markdown) and md.escape(table) == table == "| a\\|b |\n|---|\n| x\\|y |"
    assert md.escape(md.Markdown("mean |predicted − measured| & <b>")) == "mean |predicted − measured| & <b>"
    assert md.escape("mean |x|") == "mean \\|x\\|"  # a plain str is escaped
