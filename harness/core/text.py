"""Prose wrapped for a terminal: never inside a word, at a hyphen, or between a number and its unit, so names,
commands, paths and figures stay whole (`harness plan`'s notes, `harness show`'s sources). Pure, no I/O.
"""

from __future__ import annotations

import re
import textwrap

NUMBER_UNIT = re.compile(r"(\d) (?=GiB|GB|ms|days|GPUs|GPU-hours|tok/s|tokens|published)")
KEEP = "\x00"
"""a space that textwrap does not break at (a number stays with its unit), put back after wrapping"""


def wrap(text: str, width: int, *, indent: str = "", more: str = "    ") -> list[str]:
    """`text` wrapped to `width` (never inside a word, at a hyphen, or between a number and its unit: names,
    commands and figures stay whole)."""
    lines = textwrap.wrap(
        NUMBER_UNIT.sub(lambda m: m.group(1) + KEEP, text),
        width=max(width, 40),
        initial_indent=indent,
        subsequent_indent=indent + more,
        break_long_words=False,
        break_on_hyphens=False,
    )
    return [line.replace(KEEP, " ") for line in lines] or [indent]
