"""`harness compare`'s flow, from the command's options to its exit code: refuse what cannot work before anything
is loaded (options that do not go together, outputs that cannot be written, a baseline --promote cannot replace),
load both sides (harness.compare.sides), judge them (harness.compare.judge), write the renderings
(harness.compare.outputs), promote (harness.compare.promote).

Exit codes: 0 no regression, 1 regression (or a missing cell with --fail-on-missing), 2 bad input (a record file
that cannot be read, on either side, too: harness.compare.load).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from harness.compare.comparison import Comparison
from harness.compare.judge import compare_indexed
from harness.compare.match import spec_differences
from harness.compare.metrics import check_watch_deviation, parse_thresholds
from harness.compare.outputs import Echo, check_outputs, write_outputs
from harness.compare.promote import check_promote_baseline, promote_candidate
from harness.compare.sides import load_sides
from harness.core.collector import gc_paused
from harness.core.errors import InputError, Problem


class OptionConflict(ValueError):
    """Options that do not go together; the command shows it as a usage error (its usage lines, exit 2)."""


@gc_paused()
def compare_results(
    baseline: Path | None,
    candidate: Path | None,
    *,
    more_baseline: Sequence[Path],
    more_candidate: Sequence[Path],
    threshold_args: Sequence[str],
    alpha: float,
    min_runs: int,
    fmt: str,
    direction: str | None,
    output: Path | None,
    output_dir: Path | None,
    all_rows: bool,
    ignore_spec_key: Sequence[str],
    metric_names: Sequence[str],
    watch_deviation: float | None,
    fail_on_missing: bool,
    promote: bool,
    force: bool,
    echo: Echo,
) -> int:
    """Compare the candidate side (`candidate` and `more_candidate`) against the baseline side, print and write the
    renderings, promote with `promote`; returns the exit code. The options are `harness compare`'s."""
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
        echo=echo,
    )
    code = cmp.exit_code(fail_on_missing=fail_on_missing)
    if promote:
        promote_candidate(cmp, cand.index, base_paths[0], cand_paths=cand_paths, code=code, force=force, echo=echo)
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
    """OptionConflict for options that do not go together."""
    if one_side_given:
        raise OptionConflict("give both BASELINE and CANDIDATE (or neither, with -B/-C)")
    if not base_paths or not cand_paths:
        raise OptionConflict("need a baseline and a candidate: harness compare BASELINE CANDIDATE")
    if fmt == "github-benchmark" and direction is None and output_dir is None:
        raise OptionConflict(
            "--format github-benchmark writes one tool kind per file: add --direction "
            "smaller|bigger, or --output-dir DIR to write benchmark-smaller.json and "
            "benchmark-bigger.json"
        )
    if direction is not None and fmt != "github-benchmark":
        raise OptionConflict("--direction only applies to --format github-benchmark")
    if force and not promote:
        raise OptionConflict("--force only applies with --promote")
    if promote and len(base_paths) != 1:
        raise OptionConflict("--promote needs exactly one BASELINE directory to replace")


def _no_match_problem(cmp: Comparison, base_paths: Sequence[Path], cand_paths: Sequence[Path]) -> Problem:
    """No cell of the candidate matches one of the baseline: the closest pair's differences, and how to go on."""
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
