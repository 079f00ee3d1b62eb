"""How the report's tables write numbers and text: formatted here and only here.

A null is "n/a" (NA: the record has no value), "—" (ABSENT) means the cell is not in the results at all. Units:
tokens/s per GPU, MFU in % of dense peak FLOPS, step times in ms (the values come in seconds), memory in GiB
(2**30 bytes), collective bytes per step in binary units (KiB/MiB/GiB).
"""

from __future__ import annotations

import math
from typing import Any

NA = "n/a"
ABSENT = "—"


def is_null(v: Any) -> bool:
    return v is None or (isinstance(v, float) and math.isnan(v))


def fmt_tokens(v: Any) -> str:
    return NA if is_null(v) else (f"{v:,.0f}" if abs(v) >= 100 else f"{v:.3g}")


def fmt_pct(v: Any) -> str:
    """a fraction as a percentage: 0.412 → 41.2%"""
    return NA if is_null(v) else f"{100.0 * v:.1f}%"


def fmt_signed_pct(v: Any) -> str:
    return NA if is_null(v) else f"{100.0 * v:+.1f}%"


def fmt_ms(v: Any) -> str:
    """seconds in milliseconds, three significant figures or more"""
    if is_null(v):
        return NA
    ms = 1e3 * v
    return f"{ms:,.0f}" if ms >= 100 else (f"{ms:.1f}" if ms >= 10 else f"{ms:.2f}")


def fmt_gib(v: Any) -> str:
    if is_null(v):
        return NA
    return f"{v:.1f}" if v >= 10 else (f"{v:.2f}" if v >= 1 else f"{v:.3g}")


def fmt_bytes(v: Any) -> str:
    if is_null(v):
        return NA
    for div, unit in ((2**30, "GiB"), (2**20, "MiB"), (2**10, "KiB")):
        if v >= div:
            return f"{v / div:.3g} {unit}"
    return f"{v:.0f} B"


def fmt_text(v: Any) -> str:
    return NA if is_null(v) else str(v)


def fmt_int(v: Any) -> str:
    return NA if is_null(v) else f"{v:.0f}"


def fmt_p(v: Any) -> str:
    """a p-value, or ABSENT where no test was made"""
    return ABSENT if is_null(v) else f"{v:.3g}"


def gpus_label(g: float) -> str:
    return f"{g:.0f} GPU" + ("" if g == 1 else "s")


def shorten(text: Any, limit: int, *, one_line: bool = True) -> str:
    """`text` (fmt_text of it) in at most `limit` characters, cut with "…"; with `one_line`, every run of
    whitespace (line breaks included) is one space, else only the ends are stripped."""
    s = " ".join(fmt_text(text).split()) if one_line else fmt_text(text).strip()
    return s if len(s) <= limit else s[: limit - 1] + "…"
