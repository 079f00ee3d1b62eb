"""`harness compare BASELINE CANDIDATE`: per-cell regressions between two result sets.

The command only parses options, loads both sides (harness.compare.load) into a spec index each
(harness.compare.match), judges them (harness.compare.judge), prints and writes the chosen renderings
(harness.compare.render) and promotes (harness.compare.promote).

Exit codes: 0 no regression, 1 regression (or a missing cell with --fail-on-missing), 2 bad input.
"""

from __future__ import annotations

import contextlib
import functools
import gc
import multiprocessing
import os
import sys
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from pathlib import Path

import click

from harness.compare.comparison import Comparison
from harness.compare.judge import compare_indexed
from harness.compare.load import iter_side
from harness.compare.match import RunFile, SideIndex, spec_differences
from harness.compare.metrics import DEFAULT_THRESHOLD, THRESHOLD_METRICS, check_watch_deviation, parse_thresholds
from harness.compare.promote import check_promote_target, promote_baseline
from harness.compare.render import (
    BENCHMARK_FILES,
    FORMAT_FILES,
    render_benchmark,
    render_json,
    render_markdown,
    render_table,
)
from harness.compare.stats import DEFAULT_ALPHA, DEFAULT_MIN_RUNS
from harness.core.errors import InputError, Problem
from harness.results.record import Record
from harness.results.store import atomic_write_text, record_files, unwritable_reason


@contextlib.contextmanager
def gc_paused() -> Iterator[None]:
    """The cyclic garbage collector off for a while (back on after, if it was on).

    Comparing builds tens of thousands of containers that live until the end and hold no cycles: each automatic
    collection would only rescan them (a quarter of the run over 10,000 records)."""
    was_on = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_on:
            gc.enable()


format_option = click.option(
    "--format",
    "fmt",
    type=click.Choice(["table", "md", "json", "github-benchmark"]),
    default="table",
    show_default=True,
    help="What goes to stdout (and -o).",
)
"""`--format`, as `harness compare` and `harness history check` take it"""
direction_option = click.option(
    "--direction",
    type=click.Choice(sorted(BENCHMARK_FILES)),
    help="With --format github-benchmark: customSmallerIsBetter or customBiggerIsBetter entries.",
)


@click.command("compare")
@click.argument("baseline", required=False, type=click.Path(path_type=Path))
@click.argument("candidate", required=False, type=click.Path(path_type=Path))
@click.option(
    "-B",
    "--baseline-dir",
    "more_baseline",
    multiple=True,
    type=click.Path(path_type=Path),
    help="Another baseline results dir (repeatable): a side may be several dirs.",
)
@click.option(
    "-C",
    "--candidate-dir",
    "more_candidate",
    multiple=True,
    type=click.Path(path_type=Path),
    help="Another candidate results dir (repeatable).",
)
@click.option(
    "--threshold",
    "threshold_args",
    multiple=True,
    metavar="[METRIC=]FRACTION",
    help=f"Change beyond which a metric counts (default {DEFAULT_THRESHOLD}); METRIC=FRACTION overrides "
    f"one metric ({', '.join(THRESHOLD_METRICS)}). Repeatable.",
)
@click.option(
    "--alpha",
    type=click.FloatRange(0, 1, min_open=True, max_open=True),
    default=DEFAULT_ALPHA,
    show_default=True,
    help="Significance level of the test on timing metrics (Welch t on the log run-level values, Holm-adjusted "
    "over the cells: the chance of any false alarm in the comparison).",
)
@click.option(
    "--min-runs",
    type=click.IntRange(min=2),
    default=DEFAULT_MIN_RUNS,
    show_default=True,
    help="Runs of a cell (ok records: `harness sweep --repeat K`, or several dirs per side) needed on each side "
    "before a timing change can fail; with fewer it is reported, not judged.",
)
@format_option
@direction_option
@click.option("-o", "--output", type=click.Path(path_type=Path), help="Also write the output to FILE (atomically).")
@click.option(
    "--output-dir",
    type=click.Path(path_type=Path),
    help="Also write every format: compare.txt, compare.md, compare.json, benchmark-smaller.json, "
    "benchmark-bigger.json.",
)
@click.option("--all", "all_rows", is_flag=True, help="List unchanged and n/a metrics too.")
@click.option(
    "--ignore-spec-key",
    multiple=True,
    metavar="KEY",
    help="Leave a top-level spec key out of matching (e.g. time_limit_s). Repeatable.",
)
@click.option(
    "--metric",
    "metric_names",
    multiple=True,
    metavar="NAME",
    help="Judge only these metrics (repeatable); 'exact' = the deterministic ones (collective bytes, "
    "predicted memory and bytes), for CI on machines whose timings mean nothing.",
)
@click.option(
    "--watch-deviation",
    type=float,
    metavar="PCT",
    help="Fail (exit 1) a cell whose time-model deviation (predicted.step_time_deviation: measured median / "
    "predicted − 1) grew in magnitude by more than PCT percentage points. Without it the deviation is shown, "
    "never a regression.",
)
@click.option("--fail-on-missing", is_flag=True, help="Exit 1 when a baseline cell is missing from the candidate.")
@click.option(
    "--promote", is_flag=True, help="Afterwards, replace BASELINE's records with CANDIDATE's if there is no regression."
)
@click.option(
    "--force", is_flag=True, help="With --promote: promote even with regressions, or when BASELINE does not exist yet."
)
@gc_paused()
def compare_command(
    baseline: Path | None,
    candidate: Path | None,
    more_baseline: tuple[Path, ...],
    more_candidate: tuple[Path, ...],
    threshold_args: tuple[str, ...],
    alpha: float,
    min_runs: int,
    fmt: str,
    direction: str | None,
    output: Path | None,
    output_dir: Path | None,
    all_rows: bool,
    ignore_spec_key: tuple[str, ...],
    metric_names: tuple[str, ...],
    watch_deviation: float | None,
    fail_on_missing: bool,
    promote: bool,
    force: bool,
) -> int:
    """Compare CANDIDATE results against BASELINE results, cell by cell (matched by spec).

    Exit 0 without regressions, 1 with any (a metric beyond its threshold and, for timing metrics, significant
    over at least --min-runs runs a side; a changed deterministic metric; or a cell ok in BASELINE that fails in
    CANDIDATE), 2 for bad input. Several records of one cell on a side are its runs (`harness sweep --repeat K`):
    timing is judged on their values, one per run; with fewer than --min-runs a side it is reported, not judged.
    """
    base_paths = ([baseline] if baseline else []) + list(more_baseline)
    cand_paths = ([candidate] if candidate else []) + list(more_candidate)
    check_usage(
        base_paths,
        cand_paths,
        one_side_given=(baseline is None) != (candidate is None),
        fmt=fmt,
        direction=direction,
        output_dir=output_dir,
        promote=promote,
        force=force,
    )
    check_outputs(output, output_dir)
    check_watch_deviation(watch_deviation)  # NOTE: before anything is loaded: a bad value is exit 2 at once
    if promote:
        check_promote_baseline(base_paths[0], sources=cand_paths, force=force)
    thresholds = parse_thresholds(threshold_args)
    bootstrap = promote and force and not base_paths[0].exists()
    # NOTE: each record is indexed by spec as it loads: only the one each cell uses stays in memory
    base, cand = load_sides(base_paths, cand_paths, ignore=ignore_spec_key, bootstrap=bootstrap)
    cmp = compare_indexed(
        base.index,
        cand.index,
        thresholds=thresholds,
        alpha=alpha,
        baseline_sources=[str(p) for p in base_paths],
        candidate_sources=[str(p) for p in cand_paths],
        metrics=metric_names or None,
        min_runs=min_runs,
        watch_deviation=watch_deviation,
    )
    cmp.warnings[:0] = base.notes + cand.notes
    if not cmp.matched and not (promote and force):
        raise InputError([_no_match_problem(cmp, base_paths, cand_paths)])
    write_outputs(
        cmp,
        fmt=fmt,
        direction=direction,
        output=output,
        output_dir=output_dir,
        all_rows=all_rows,
        fail_on_missing=fail_on_missing,
    )
    code = cmp.exit_code(fail_on_missing=fail_on_missing)
    if promote:
        promote_candidate(cmp, cand.index, base_paths[0], cand_paths=cand_paths, code=code, force=force)
    return code


def check_usage(
    base_paths: Sequence[Path],
    cand_paths: Sequence[Path],
    *,
    one_side_given: bool,
    fmt: str,
    direction: str | None,
    output_dir: Path | None,
    promote: bool,
    force: bool,
) -> None:
    """click.UsageError (exit 2, with the usage lines) for options that do not go together."""
    if one_side_given:
        raise click.UsageError("give both BASELINE and CANDIDATE (or neither, with -B/-C)")
    if not base_paths or not cand_paths:
        raise click.UsageError("need a baseline and a candidate: harness compare BASELINE CANDIDATE")
    if fmt == "github-benchmark" and direction is None and output_dir is None:
        raise click.UsageError(
            "--format github-benchmark writes one tool kind per file: add --direction "
            "smaller|bigger, or --output-dir DIR to write benchmark-smaller.json and "
            "benchmark-bigger.json"
        )
    if direction is not None and fmt != "github-benchmark":
        raise click.UsageError("--direction only applies to --format github-benchmark")
    if force and not promote:
        raise click.UsageError("--force only applies with --promote")
    if promote and len(base_paths) != 1:
        raise click.UsageError("--promote needs exactly one BASELINE directory to replace")


def check_promote_baseline(baseline: Path, *, sources: Sequence[Path], force: bool) -> None:
    """InputError (exit 2) before anything is loaded when --promote cannot replace `baseline`: absent without
    --force, or not a folder promote may write (harness.compare.promote)."""
    if not force and not baseline.exists():
        raise InputError(
            [
                Problem(
                    str(baseline),
                    "",
                    "baseline: no such directory; to make CANDIDATE the first baseline: --promote --force",
                )
            ]
        )
    check_promote_target(baseline, sources=sources)


def write_outputs(
    cmp: Comparison,
    *,
    fmt: str,
    direction: str | None,
    output: Path | None,
    output_dir: Path | None,
    all_rows: bool,
    fail_on_missing: bool,
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
    click.echo(text, nl=False)
    if output is not None:
        atomic_write_text(output, text)
    if output_dir is not None:
        jobs = [(name, output_dir / filename) for name, filename in [*FORMAT_FILES.items(), *BENCHMARK_FILES.items()]]
        _write_all(jobs, rendered, done=set(texts), big=len(cmp.cells) >= PARALLEL_WRITE_MIN_CELLS)
    for w in cmp.warnings:
        click.echo(f"warning: {w}", err=True)


def promote_candidate(
    cmp: Comparison, cand: SideIndex, baseline: Path, *, cand_paths: Sequence[Path], code: int, force: bool
) -> None:
    """--promote: the candidate's records become the baseline when the comparison passed (`code` 0) or --force;
    otherwise the baseline stays and stderr says why."""
    if code != 0 and not force:
        click.echo(
            f"not promoted: the comparison failed (exit {code}); baseline {baseline} is "
            "unchanged (--force promotes anyway)",
            err=True,
        )
        return
    # NOTE: every ok run of a cell (its repeats), so the baseline keeps what timing is judged on
    chosen: list[RunFile | Record] = []
    for c in cmp.cells:
        if c.candidate is None:
            continue
        runs = cand.run_files.get(c.key) if c.candidate.ok else None
        chosen += runs if runs else [c.candidate]
    dest = promote_baseline(chosen, baseline, sources=[str(p) for p in cand_paths])
    click.echo(
        f"promoted {len(chosen)} candidate record(s) of {sum(c.candidate is not None for c in cmp.cells)} "
        f"cell(s) to baseline {dest}" + (" (forced)" if code else ""),
        err=True,
    )


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


PARALLEL_LOAD_MIN_FILES = 2000
"""with at least this many candidate record files (and Linux), the candidate side loads in a forked child while
this process loads the baseline"""


@dataclass(frozen=True)
class LoadedSide:
    """One side read and indexed by spec."""

    index: SideIndex
    problems: list[Problem]
    """what is wrong with its input (exit 2, every problem of both sides at once)"""
    notes: list[str]
    """warnings, printed after the output"""


def _load_side(paths: Sequence[Path], *, side: str, ignore: Sequence[str]) -> LoadedSide:
    """One side read and indexed, with its problems and notes."""
    index = SideIndex(side=side, ignore=ignore)
    problems: list[Problem] = []
    notes: list[str] = []
    index.add_all(iter_side(paths, side=side, problems=problems, notes=notes))
    return LoadedSide(index, problems, notes)


def load_sides(
    base_paths: Sequence[Path], cand_paths: Sequence[Path], *, ignore: Sequence[str], bootstrap: bool
) -> tuple[LoadedSide, LoadedSide]:
    """(baseline, candidate) read and indexed; InputError with the problems of both sides. `bootstrap` (--promote
    --force onto a baseline that does not exist yet): the baseline is empty."""
    base, cand = _read_sides(base_paths, cand_paths, ignore=ignore, bootstrap=bootstrap)
    if base.problems or cand.problems:
        raise InputError(base.problems + cand.problems)
    return base, cand


def _read_sides(
    base_paths: Sequence[Path], cand_paths: Sequence[Path], *, ignore: Sequence[str], bootstrap: bool
) -> tuple[LoadedSide, LoadedSide]:
    """(baseline, candidate), each as `_load_side` gives it. Reading and indexing is most of a big compare's time
    and the sides are independent: with many files the candidate is read in a forked child (it hands back its
    index) while this process reads the baseline. A child's process that fails reads the candidate here (the
    same result)."""
    empty = LoadedSide(SideIndex(side="baseline", ignore=ignore), [], [])
    big = sys.platform == "linux" and not bootstrap
    if big:
        big = len(record_files(*[p for p in cand_paths if p.exists()])) >= PARALLEL_LOAD_MIN_FILES
    pool = future = None
    if big:
        try:
            pool = ProcessPoolExecutor(max_workers=1, mp_context=multiprocessing.get_context("fork"))
            future = pool.submit(_load_side, cand_paths, side="candidate", ignore=ignore)
        except (OSError, ValueError, RuntimeError, ImportError):
            future = None
    cand: LoadedSide | None = None
    try:
        base = empty if bootstrap else _load_side(base_paths, side="baseline", ignore=ignore)
        if future is not None:
            try:
                cand = future.result()
            except BrokenProcessPool:  # the child died (killed, out of memory): read it here
                cand = None
        if cand is None:
            cand = _load_side(cand_paths, side="candidate", ignore=ignore)
    finally:
        if pool is not None:
            if future is None or not future.done() or future.exception() is not None:
                for proc in list((getattr(pool, "_processes", None) or {}).values()):
                    proc.kill()  # NOTE: an interrupted or failed load: a child still reading is not waited for
            pool.shutdown(wait=True, cancel_futures=True)  # reaped: its peak memory counts as this command's
    return base, cand


PARALLEL_WRITE_MIN_CELLS = 500
"""with --output-dir and at least this many cells, the JSON files are rendered in a forked child"""
_CHILD_RENDERS = ("json", *BENCHMARK_FILES)


def _write_all(jobs: list[tuple[str, Path]], rendered: Callable[[str], str], *, done: set[str], big: bool) -> None:
    """Write every output file of --output-dir. With many cells the JSON renderings (compare.json and the two
    github-benchmark files, half of the rendering time) are made and written by a forked child while this process
    renders the text ones; the bytes are the same either way, and a child that cannot start or fails leaves its
    files to this process."""
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


def _no_match_problem(cmp: Comparison, base_paths: Sequence[Path], cand_paths: Sequence[Path]) -> Problem:
    hint = ""
    if cmp.missing and cmp.added:
        diffs = min((spec_differences(m.spec, a.spec) for m in cmp.missing for a in cmp.added), key=len)
        hint = f"; the closest pair differs in {'; '.join(diffs[:4])} (--ignore-spec-key KEY matches across it)"
    return Problem(
        ", ".join(map(str, cand_paths)),
        "",
        f"no cell matches a baseline cell ({', '.join(map(str, base_paths))}) by spec{hint}; to make "
        "this candidate the new baseline anyway: --promote --force",
    )
