"""What `harness compare` writes: the chosen rendering to stdout (and -o), every format to --output-dir, then the
warnings to stderr; and, before anything is loaded, the check that those files can be written.

With --output-dir and many cells compare.json (the largest rendering: at bench_compare's 10,000 records 0.46 s, against
0.37 s for the table, the Markdown and the two github-benchmark files together) is made and written by a forked child
while this process renders the others; the bytes are the same either way, and a child that cannot start or fails
leaves its file to this process.
"""

from __future__ import annotations

import functools
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Protocol

from harness.compare.comparison import Comparison
from harness.compare.render import (
    BENCHMARK_FILES,
    FORMAT_FILES,
    render_benchmark,
    render_json,
    render_markdown,
    render_table,
)
from harness.core.errors import InputError, Problem
from harness.results.store import atomic_write_text, unwritable_reason

PARALLEL_WRITE_MIN_CELLS = 500
"""with --output-dir and at least this many cells, compare.json is rendered in a forked child"""
_CHILD_RENDERS = ("json",)


class Echo(Protocol):
    """How a read-side command prints (click.echo is one): `message` to stdout, or to stderr with `err`, with a
    newline unless `nl` is false."""

    def __call__(self, message: str, *, nl: bool = True, err: bool = False) -> None: ...


def check_outputs(output: Path | None, output_dir: Path | None) -> None:
    """InputError (exit 2, one line each) for an -o file or --output-dir that cannot be written, before anything is
    loaded or compared: found after the work, it was a traceback."""
    problems: list[Problem] = []
    if output is not None:
        why = "is a directory; -o names a file" if output.is_dir() else unwritable_reason(output.parent)
        if why is not None:
            problems.append(Problem(str(output), "-o", why))
    if output_dir is not None and (why := unwritable_reason(output_dir)) is not None:
        problems.append(Problem(str(output_dir), "--output-dir", why))
    if problems:
        raise InputError(problems)


def write_outputs(
    cmp: Comparison,
    *,
    fmt: str,
    direction: str | None,
    output: Path | None,
    output_dir: Path | None,
    all_rows: bool,
    fail_on_missing: bool,
    echo: Echo,
) -> None:
    """The chosen rendering to stdout (and -o), every format to --output-dir, then the warnings to stderr; each
    rendering made once wherever it goes."""
    renderers: dict[str, Callable[[], str]] = {
        "table": lambda: render_table(cmp, all_rows=all_rows, fail_on_missing=fail_on_missing),
        "md": lambda: render_markdown(cmp, all_rows=all_rows, fail_on_missing=fail_on_missing),
        "json": lambda: render_json(cmp, fail_on_missing=fail_on_missing),
        **{d: functools.partial(render_benchmark, cmp, d) for d in BENCHMARK_FILES},
    }
    texts: dict[str, str] = {}

    def rendered(name: str) -> str:
        """A rendering (a format, or a github-benchmark direction), made once wherever it goes."""
        if name not in texts:
            texts[name] = renderers[name]()
        return texts[name]

    text = rendered(direction or "table") if fmt == "github-benchmark" else rendered(fmt)
    echo(text, nl=False)
    if output is not None:
        atomic_write_text(output, text)
    if output_dir is not None:
        jobs = [(name, output_dir / filename) for name, filename in [*FORMAT_FILES.items(), *BENCHMARK_FILES.items()]]
        _write_all(jobs, rendered, done=set(texts), big=len(cmp.cells) >= PARALLEL_WRITE_MIN_CELLS)
    for w in cmp.warnings:
        echo(f"warning: {w}", err=True)


def _write_all(jobs: list[tuple[str, Path]], rendered: Callable[[str], str], *, done: set[str], big: bool) -> None:
    """Write every output file of --output-dir; with `big`, compare.json in a forked child (the module docstring)."""
    theirs = [(n, p) for n, p in jobs if n in _CHILD_RENDERS and n not in done]
    child: int | None = None
    if big and theirs and sys.platform == "linux":
        sys.stdout.flush()
        sys.stderr.flush()
        try:
            child = os.fork()
        except OSError:
            child = None  # no fork here (a sandbox, no memory): everything below, in this process
        if child == 0:  # the child: its files, then out without running the parent's exit handlers
            code = 1
            try:
                for name, path in theirs:
                    atomic_write_text(path, rendered(name))
                code = 0
            finally:
                os._exit(code)
    for name, path in jobs:
        if not (child and (name, path) in theirs):
            atomic_write_text(path, rendered(name))
    if child:
        _, status = os.waitpid(child, 0)
        if status != 0:  # the child failed (killed, an error): the same files, written here
            for name, path in theirs:
                atomic_write_text(path, rendered(name))
