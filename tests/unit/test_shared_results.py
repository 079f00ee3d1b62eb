"""Records, manifests, figures were written 0600 (issue 48, item 6): every atomic write went through
tempfile.mkstemp, whose file is its owner's alone, so on a results file system a team shares (as SLURM teams do)
nobody else could read them. Every file the harness writes now gets what the umask leaves of 0o666, and every
folder what it leaves of 0o777, as any program's files.

Each test runs under an explicit umask — 022 (the usual: group- and world-readable) and 002 (a team's: group-
writable too, so a teammate's re-run can take a cell's lock) — and looks at the mode of every file and folder the
harness wrote: a sweep's (records, the manifest, its lock and reserve, the cells' locks, fragments, heartbeats,
end claims, payload files) and the read side's (`plan --figure`, `report`, `compare` outputs and a promoted baseline,
calibration files).
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from harness.cli import main
from harness.results.record import Beat, Fragment
from harness.results.store import (
    atomic_write_json,
    claim_end,
    new_record,
    write_beat,
    write_fragment,
    write_record,
)

REPO = Path(__file__).resolve().parents[2]
SCENARIO = """\
name: shared
matrix: {model: [tiny], strategy: [ddp], precision: [fp32], gpus: [2]}
settings: {warmup_steps: 2, measure_steps: 2}
"""


@pytest.fixture(params=[0o022, 0o002], ids=["umask-022", "umask-002"])
def umask(request):
    old = os.umask(request.param)
    try:
        yield request.param
    finally:
        os.umask(old)


def modes(root: Path) -> dict[str, str]:
    """{path under root: its permission bits, octal} of everything under `root` (root itself left out)."""
    return {str(p.relative_to(root)): oct(stat.S_IMODE(p.stat().st_mode)) for p in sorted(root.rglob("*"))}


def expected(root: Path, umask: int) -> dict[str, str]:
    """What every entry under `root` should have under `umask`."""
    return {str(p.relative_to(root)): oct((0o777 if p.is_dir() else 0o666) & ~umask) for p in sorted(root.rglob("*"))}


@pytest.fixture
def rank_stand_in(monkeypatch):
    """The cell's ranks, standing in for real ones (the modes of what they write are what is tested, not a
    measurement): rank 1 leaves a fragment, both a heartbeat, rank 0 claims the cell's end and writes its record,
    through the same store functions harness.worker.runner and .heartbeat call."""
    from harness.launch.core.outcome import finalize

    def launch(payload, *, cluster, folder, time_limit_s, on_submit=None):
        results, sweep, run_id, attempt = payload.results, payload.sweep, payload.run_id, payload.attempt
        for rank in (0, 1):
            beat = Beat(rank=rank, attempt=attempt, pid=1, hostname="h", phase="p", phase_since=0.0, time=0.0)
            write_beat(results, sweep, run_id, beat)
        write_fragment(results, sweep, run_id, Fragment(rank=1, attempt=attempt, status="error", reason="r", time=0.0))
        assert claim_end(results, sweep, run_id, attempt=attempt)
        write_record(
            results,
            new_record(spec=payload.spec, run_id=run_id, sweep=sweep, cluster="local", status="ok", attempt=attempt),
        )
        # the payload file a SLURM job carries (SlurmSweep._submitted writes it so)
        atomic_write_json(Path(results) / sweep / ".payloads" / f"{run_id}.json", payload.to_dict())
        return finalize(payload, elapsed_s=1.0, time_limit_s=time_limit_s)

    monkeypatch.setattr("harness.launch.local.backend.launch_submitit", launch)
    monkeypatch.setenv("HARNESS_NO_PREFORK", "1")


def test_what_a_sweep_writes_is_readable_by_the_group(tmp_path, umask, rank_stand_in):
    scenario = tmp_path / "shared.yaml"
    scenario.write_text(SCENARIO)
    results = tmp_path / "results"
    assert main(["sweep", str(scenario), "--results", str(results)]) == 0
    got = modes(results)
    names = set(got)
    for name in ("shared/manifest.json", "shared/.manifest.lock", "shared/.manifest.reserve", "shared/.locks"):
        assert name in names
    assert any(n.startswith("shared/tiny-ddp-fp32-g2-") and n.endswith(".json") for n in names)
    for kind in ("rank1.json", "beat0.json", "beat1.json", "end."):
        assert any(n.startswith("shared/.fragments/") and kind in n for n in names), kind
    assert any(n.startswith("shared/.payloads/") for n in names)
    assert got == expected(results, umask)


def test_what_the_read_side_writes_is_readable_by_the_group(tmp_path, umask, capsys):
    from harness.plan.calibration import Calibration, example_calibration, write_calibration
    from tests.unit.test_compare import cells, write_set

    base = write_set(tmp_path / "in" / "base", cells().values())
    cand = write_set(tmp_path / "in" / "cand", cells().values())
    out = tmp_path / "out"
    smoke = REPO / "scenarios" / "smoke.yaml"
    plan = ["plan", str(smoke), "--cluster", "h200", "--project", "1,2", "--format", "json"]
    assert main([*plan, "--figure", str(out / "figures" / "projection.png")]) == 0
    assert main(["report", str(REPO / "tests" / "fixtures" / "records"), "-o", str(out / "report")]) == 0
    assert main(["compare", str(base), str(cand), "--output-dir", str(out / "compare"), "-o", str(out / "c.md")]) == 0
    assert main(["compare", str(out / "baseline"), str(cand), "--promote", "--force"]) == 0
    write_calibration(out / "local.calibration.json", Calibration.model_validate(example_calibration("local")))
    capsys.readouterr()
    got = modes(out)
    for name in (
        "figures/projection.png",
        "report/index.html",
        "report/table.csv",
        "compare/compare.json",
        "c.md",
        "baseline",
        "local.calibration.json",
    ):
        assert name in got, name
    assert any(n.startswith("baseline/") and n.endswith(".json") for n in got)
    assert got == expected(out, umask)
