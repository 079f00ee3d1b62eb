"""Durable baseline promotion (`harness compare --promote`): the candidate's records replace the baseline's in
one swap, so a crash or a full disk leaves either the old baseline or the new one, never a mix.

Every file is fsynced before the swap (renameat2 RENAME_EXCHANGE where the filesystem has it, else two renames),
and a `.promoted.json` beside the records says where they came from. `check_promote_baseline` refuses a baseline
that cannot be replaced before anything is loaded; `promote_candidate` decides, after the comparison, what is
promoted (every ok run of each candidate cell) and says so on stderr.
"""

from __future__ import annotations

import ctypes
import errno
import hashlib
import os
import shutil
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from harness.compare.match import RunFile, SideIndex, spec_key
from harness.core.errors import InputError, Problem
from harness.results.record import Record
from harness.results.store import atomic_write_json, create_new_dir, record_files, record_name, record_or_none, utc_now

if TYPE_CHECKING:
    from harness.compare.comparison import Comparison
    from harness.compare.outputs import Echo

PROMOTED_FILE = ".promoted.json"
"""provenance written into a promoted baseline (hidden, so record loading skips it)"""


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _copy_durably(src: Path, dest: Path) -> None:
    dest.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(src, dest)
    with open(dest, "rb+") as f:
        os.fsync(f.fileno())


def _exchange(a: Path, b: Path) -> bool:
    """Atomically swap two directories (Linux renameat2 RENAME_EXCHANGE); False where unsupported (NFS…)."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        renameat2 = ctypes.CDLL(None, use_errno=True).renameat2
    except (OSError, AttributeError):
        return False
    at_fdcwd, rename_exchange = -100, 2
    if renameat2(at_fdcwd, os.fsencode(a), at_fdcwd, os.fsencode(b), rename_exchange) == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.ENOSYS, errno.EINVAL, errno.EOPNOTSUPP, errno.EPERM):
        return False
    raise OSError(err, os.strerror(err), str(a))


def _keep_files(baseline: Path) -> list[Path]:
    """Files of an old baseline that are not records (README, .gitattributes): carried into the new one.
    Not carried: records, sweep manifests, the old provenance, temp files, anything under a hidden dir."""
    records = {Path(p).resolve() for p in record_files(baseline)}
    keep = []
    for p in sorted(baseline.rglob("*")):
        if not p.is_file() or p.resolve() in records or p.name in (PROMOTED_FILE, "manifest.json"):
            continue
        if p.name.endswith(".tmp") or any(part.startswith(".") for part in p.relative_to(baseline).parts[:-1]):
            continue  # temp files; hidden dirs (a sweep's .fragments/)
        keep.append(p)
    return keep


def _safe_name(value: Any, fallback: str) -> str:
    text = str(value or "")
    return text if text and Path(text).name == text and text not in (".", "..") else fallback


def check_promote_target(baseline_dir: str | Path, *, sources: Sequence[str | Path]) -> None:
    """InputError when `baseline_dir` is not a directory or overlaps a candidate source (promotion would
    delete the records it copies)."""
    b = Path(baseline_dir).resolve()
    if b.exists() and not b.is_dir():
        raise InputError([Problem(str(baseline_dir), "", "baseline to promote into is not a directory")])
    for src in sources:
        s = Path(src).resolve()
        if s == b or b in s.parents or s in b.parents:
            raise InputError([Problem(str(baseline_dir), "", f"promote: baseline and candidate {src} overlap")])


def check_promote_baseline(baseline: Path, *, sources: Sequence[Path], force: bool) -> None:
    """InputError (exit 2) before anything is loaded when --promote cannot replace `baseline`: absent without
    --force, or not a folder promote may write (`check_promote_target`)."""
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


def promote_candidate(
    cmp: Comparison,
    cand: SideIndex,
    baseline: Path,
    *,
    cand_paths: Sequence[Path],
    code: int,
    force: bool,
    echo: Echo,
) -> None:
    """--promote: the candidate's records become the baseline when the comparison passed (`code` 0) or --force;
    otherwise the baseline stays and stderr says why."""
    if code != 0 and not force:
        echo(
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
    echo(
        f"promoted {len(chosen)} candidate record(s) of {sum(c.candidate is not None for c in cmp.cells)} "
        f"cell(s) to baseline {dest}" + (" (forced)" if code else ""),
        err=True,
    )


def promote_baseline(
    records: Sequence[Record | RunFile], baseline_dir: str | Path, *, sources: Sequence[str] = ()
) -> Path:
    """Make `records` the baseline: write them (original bytes when a record has a file) into a staging dir
    beside `baseline_dir` as `<sweep>/<run_id>.json` (a repeat k >= 2: `<run_id>.r<k>.json`; several runs of one
    cell under one name, from several dirs: the next free `.r<k>` name), carry over non-record files, then swap
    the staging dir in
    (atomic exchange where the filesystem allows; else two renames, during which the path is briefly absent but
    never holds a mix of old and new records). Returns the baseline dir."""
    baseline_dir = Path(baseline_dir).absolute()
    check_promote_target(baseline_dir, sources=sources)
    baseline_dir.parent.mkdir(parents=True, exist_ok=True)
    # NOTE: not tempfile.mkdtemp, whose 0700 folder would become the baseline, closed to the rest of a team
    staging = create_new_dir(baseline_dir.parent, prefix=f".{baseline_dir.name}.promote-")
    try:
        if baseline_dir.exists():
            for p in _keep_files(baseline_dir):
                _copy_durably(p, staging / p.relative_to(baseline_dir))
        written = set()
        shas: set[str] = set()
        for item in records:
            run = RunFile.of(item) if isinstance(item, Record) else item
            digest = hashlib.sha256(spec_key(run.spec).encode()).hexdigest()[:10]
            sweep = _safe_name(run.sweep, "records")
            stem = _safe_name(run.run_id, f"cell-{digest}")
            k = run.repeat
            rel = Path(sweep, record_name(stem, k))
            while rel in written:  # NOTE: runs of one cell from several dirs: each keeps its bytes, a name of its own
                k += 1
                rel = Path(sweep, record_name(stem, k))
            written.add(rel)
            if run.path and Path(run.path).is_file():
                _copy_durably(Path(run.path), staging / rel)
                rec = item if isinstance(item, Record) else record_or_none(run.path)
            elif isinstance(item, Record):
                rec = item
                atomic_write_json(staging / rel, item.to_dict())
            else:
                continue
            if rec is not None and rec.env.harness_git_sha:
                shas.add(rec.env.harness_git_sha)
        atomic_write_json(
            staging / PROMOTED_FILE,
            {
                "promoted_at": utc_now(),
                "sources": list(sources),
                "records": len(records),
                "harness_git_sha": sorted(shas),
            },
        )
        for d in sorted({p.parent for p in staging.rglob("*")} | {staging}, key=lambda p: -len(p.parts)):
            _fsync_dir(d)
        if not baseline_dir.exists():
            os.rename(staging, baseline_dir)
        elif _exchange(staging, baseline_dir):
            shutil.rmtree(staging)  # now holds the old baseline
        else:
            old = staging.with_name(staging.name + ".old")
            os.rename(baseline_dir, old)
            os.rename(staging, baseline_dir)
            shutil.rmtree(old)
        _fsync_dir(baseline_dir.parent)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return baseline_dir
