"""Error types. Bad user input is an `InputError` (CLI exit code 2); the environment failing is RuntimeError."""

from __future__ import annotations

import difflib
from collections.abc import Iterable
from dataclasses import dataclass


@dataclass(frozen=True)
class Problem:
    """One thing wrong with an input file: where (file, dotted key path) and what."""

    file: str
    path: str
    message: str

    def __str__(self) -> str:
        where = f"{self.file}: {self.path}" if self.path else self.file
        return f"{where}: {self.message}"


class InputError(ValueError):
    """Every problem found in the user's input, raised once after collecting all of them."""

    def __init__(self, problems: Iterable[Problem] | str):
        if isinstance(problems, str):
            problems = [Problem("", "", problems)]
        self.problems = list(problems)
        super().__init__("\n".join(str(p) for p in self.problems))


def did_you_mean(value: object, allowed: Iterable[str]) -> str:
    """' (did you mean 'x'?)' when a close match exists, else ''."""
    if not isinstance(value, str):
        return ""
    close = difflib.get_close_matches(value, list(allowed), n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else ""


def one_of(value: object, allowed: Iterable[str]) -> str:
    allowed = list(allowed)
    return f"{value!r} is not one of {', '.join(allowed)}{did_you_mean(value, allowed)}"


def unknown(file: str, path: str, key: object, allowed: Iterable[str], *, what: str = "key") -> Problem:
    """`file: path: unknown key; allowed: a, b, c (did you mean 'b'?)`."""
    allowed = list(allowed)
    return Problem(file, path, f"unknown {what}; allowed: {', '.join(allowed)}{did_you_mean(key, allowed)}")
