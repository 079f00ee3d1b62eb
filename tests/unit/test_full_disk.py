"""A disk that fills mid-sweep (issue 48, item 3): `OSError: [Errno 28] No space left on device` was a traceback
from harness.results.store.atomic_write_bytes, exit 1, and `harness status` showed the cell `running` forever.

Now: one `error:` line naming the file (exit 1, no traceback); the cell `failed` in its manifest with what could
not be written (the manifest's reserve holds that last write), and a record of it where one fits; nothing lost (no
half record, no temp file, the records written before read back byte for byte); and a re-run after space is freed
completes the sweep.

The disk is a real one: a 2 MiB tmpfs mounted for each test (skipped, saying why, where mounting is refused), filled
by a file until the kernel says ENOSPC. The cells' launcher is a stand-in (the one fake here), because a cell that
fills the disk at a chosen moment cannot be made with real ranks: it does what a rank and the launcher do at a
cell's end — rank 0 writes an ok record (`harness.worker.runner`'s write_record), or the disk is filled and the
launcher composes the record itself (outcome.finalize, the real one, which then meets the full disk).
"""

from __future__ import annotations

import errno
import json
import os
import subprocess
import uuid
from pathlib import Path

import pytest

from harness.cli import main
from harness.launch.core.manifest import RESERVE, Manifest, read_manifest
from harness.launch.core.outcome import finalize
from harness.results.payload import Payload
from harness.results.store import WriteFailed, atomic_write_bytes, new_record, read_record, write_record

SCENARIO = """\
name: full
matrix: {model: [tiny], strategy: [ddp, fsdp.full_shard], precision: [fp32], gpus: [2]}
settings: {warmup_steps: 2, measure_steps: 2}
"""


@pytest.fixture
def disk(tmp_path):
    """A fresh 2 MiB tmpfs, unmounted afterwards."""
    where = tmp_path / f"disk-{uuid.uuid4().hex[:8]}"
    where.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(where)], capture_output=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here (needs root in a VM): {done.stderr.decode().strip()}")
    try:
        yield where
    finally:
        if subprocess.run(["umount", str(where)], capture_output=True).returncode != 0:
            subprocess.run(["umount", "-l", str(where)], capture_output=True)


def fill(disk: Path) -> Path:
    """Fill `disk` to the last byte it takes; the filler's path (removing it frees the space)."""
    filler = disk / "filler"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    try:
        for chunk in (2**16, 2**12, 2**8, 1):
            while True:
                try:
                    os.write(fd, b"\0" * chunk)
                except OSError as e:
                    assert e.errno == errno.ENOSPC, e
                    break
    finally:
        os.close(fd)
    return filler


def temp_files(root: Path) -> list[Path]:
    return [p for p in root.rglob("*") if p.name.endswith(".tmp")]


def test_a_write_the_disk_has_no_room_for_leaves_the_old_file_whole_and_no_temp(disk):
    path = disk / "results" / "r.json"
    atomic_write_bytes(path, b'{"old": true}\n')
    fill(disk)
    with pytest.raises(WriteFailed) as e:
        atomic_write_bytes(path, b'{"new": true}\n' * 1000)
    assert e.value.errno == errno.ENOSPC
    assert str(e.value) == f"{path}: cannot write: No space left on device"
    assert path.read_bytes() == b'{"old": true}\n'
    assert temp_files(disk) == []


@pytest.fixture
def launcher(monkeypatch):
    """The stand-in for the local launcher (see the module docstring). `fill_on` holds the cells (by strategy) that
    fill the disk; the others end with rank 0's ok record."""

    class Launcher:
        fill_on: set[str] = set()
        disk: Path | None = None
        launched: list[str] = []

        def __call__(self, payload: Payload, *, cluster, folder, time_limit_s, on_submit=None):
            self.launched.append(payload.spec.strategy)
            if payload.spec.strategy in self.fill_on:
                assert self.disk is not None
                fill(self.disk)
            else:
                rec = new_record(
                    spec=payload.spec,
                    run_id=payload.run_id,
                    sweep=payload.sweep,
                    cluster=payload.cluster.name,
                    status="ok",
                    attempt=payload.attempt,
                )
                write_record(payload.results, rec)
            return finalize(payload, elapsed_s=1.0, time_limit_s=time_limit_s)

    fake = Launcher()
    monkeypatch.setattr("harness.launch.local.backend.launch_submitit", fake)
    monkeypatch.setenv("HARNESS_NO_PREFORK", "1")
    return fake


def test_a_disk_that_fills_mid_sweep_fails_the_cell_in_its_manifest_and_a_rerun_completes(
    disk, tmp_path, launcher, capsys
):
    scenario = tmp_path / "full.yaml"
    scenario.write_text(SCENARIO)
    results = disk / "results"
    launcher.disk, launcher.fill_on = disk, {"fsdp.full_shard"}

    assert main(["sweep", str(scenario), "--results", str(results)]) == 1
    out, err = capsys.readouterr()
    assert "Traceback" not in out + err
    folder = results / "full"
    (ok_path,) = folder.glob("tiny-ddp-*.json")
    manifest = read_manifest(folder / "manifest.json")
    (failed_run,) = [run_id for run_id in manifest.cells if run_id.startswith("tiny-fsdp")]
    record_file = folder / f"{failed_run}.json"
    why = f"could not write {record_file}: No space left on device (the sweep stopped here; re-run it to resume)"
    assert err.strip().splitlines() == [
        f"error: {record_file}: cannot write: No space left on device; free space "
        "(or quota) and re-run the same command to go on from there"
    ]
    # the manifest: the cell that filled the disk failed with the reason, never left running
    states = {run_id: (c.state, c.status, c.reason) for run_id, c in manifest.cells.items()}
    assert states == {ok_path.stem: ("done", "ok", None), failed_run: ("failed", "error", why)}
    assert not (folder / RESERVE).exists()  # spent on that last word
    # its record, written in what the reserve freed: whole, and saying the same
    rec = read_record(record_file)
    assert (rec.status, rec.reason) == ("error", why)
    # nothing lost: the record before reads back, no temp file anywhere
    ok_bytes = ok_path.read_bytes()
    assert read_record(ok_path).status == "ok"
    assert temp_files(disk) == []
    assert main(["status", str(results)]) == 0
    status = capsys.readouterr().out.splitlines()
    assert f"  failed    error     {failed_run}  job -  ({why})" in status
    assert not any(line.split()[0] == "running" for line in status[1:])

    # space freed: the re-run runs only the failed cell, and completes
    (disk / "filler").unlink()
    launcher.fill_on = set()
    launcher.launched.clear()
    assert main(["sweep", str(scenario), "--results", str(results)]) == 0
    assert launcher.launched == ["fsdp.full_shard"]
    assert ok_path.read_bytes() == ok_bytes
    assert read_record(record_file).status == "ok"
    manifest = read_manifest(folder / "manifest.json")
    assert {run_id: (c.state, c.reason) for run_id, c in manifest.cells.items()} == {
        ok_path.stem: ("done", None),
        failed_run: ("done", None),
    }
    assert (folder / RESERVE).stat().st_size >= 64 * 2**10  # made again for the next full disk
    assert temp_files(disk) == []


def test_a_disk_full_before_the_sweep_is_one_line_and_leaves_nothing_half_written(disk, tmp_path, launcher, capsys):
    scenario = tmp_path / "full.yaml"
    scenario.write_text(SCENARIO)
    fill(disk)
    assert main(["sweep", str(scenario), "--results", str(disk / "results")]) == 1
    out, err = capsys.readouterr()
    assert "Traceback" not in out + err and launcher.launched == []
    manifest = disk / "results" / "full" / "manifest.json"
    assert err.strip().splitlines() == [
        f"error: {manifest}: cannot write: No space left on device; free space "
        "(or quota) and re-run the same command to go on from there"
    ]
    assert not manifest.exists() and temp_files(disk) == []


def test_a_slurm_cell_the_disk_has_no_room_for_is_failed_in_the_manifest_not_left_submitted(disk, tmp_path):
    """SLURM's filing of a cell whose job ended (SlurmSweep._record) meets the full disk: the cell is recorded failed
    and no longer followed, and the error goes up (the backend then detaches from the others). No SLURM here: the
    job has ended already, and what is filed is only files."""
    from harness.launch.core.payload import make_payload
    from harness.launch.slurm.jobs import SlurmSweep
    from harness.scenario.cluster import load_cluster
    from tests.conftest import make_spec

    profile = tmp_path / "tiny-slurm.yaml"
    profile.write_text("name: tiny-slurm\nexecutor: slurm\ndevice: cuda\ngpus_per_node: 2\nslurm: {partition: gpu}\n")
    cluster = load_cluster(str(profile))
    spec = make_spec(strategy="ddp")
    results = disk / "results"
    manifest = Manifest.open(results, "s", scenario="s.yaml", cluster=cluster.name, run_ids=[spec.run_id])
    payload = make_payload(spec, sweep="s", cluster=cluster, results=results, sha=None, predicted=None)
    manifest.submitted(spec.run_id, attempt=payload.attempt, job_id="7_0")
    lines: list[str] = []
    flight = SlurmSweep(cluster, folder=results / "s" / ".submitit", manifest=manifest, echo=lines.append)
    fill(disk)
    with pytest.raises(WriteFailed):
        flight._record(payload, "[1/1] cell", ended=("timeout", "the job hit its time limit"), log_tail="")
    run = read_manifest(manifest.path).cells[spec.run_id]
    assert (run.state, run.status) == ("failed", "error")
    assert run.reason is not None and run.reason.startswith(f"could not write {results / 's' / spec.run_id}.json: ")
    assert lines == [f"[1/1] cell  error: {run.reason}"[: len("[1/1] cell  error: ") + 160]]
    assert spec.run_id not in flight.cells and temp_files(disk) == []
    json.loads(manifest.path.read_text())  # whole


REPO = Path(__file__).resolve().parents[2]
NO_ROOM = "cannot write: No space left on device; free space (or quota) and re-run the same command to go on from there"


def test_each_commands_write_on_a_full_disk_is_one_line_and_exit_1(disk, tmp_path, capsys):
    """What `plan --figure`, `compare -o` and `report -o` write, on a disk with no room: exit 1 (the environment
    stopped the work part-way: docs/exit-codes.md), one line naming the file or folder, no traceback, and the files
    written atomically left as they were."""
    from tests.unit.test_compare import cells, write_set

    base = write_set(tmp_path / "base", cells().values())
    cand = write_set(tmp_path / "cand", cells().values())
    png, md = disk / "p.png", disk / "c.md"
    md.write_text("the last comparison\n")
    fill(disk)
    smoke = REPO / "scenarios" / "smoke.yaml"
    runs = {
        png: ["plan", str(smoke), "--cluster", "h200", "--project", "1,2", "--format", "json", "--figure", str(png)],
        md: ["compare", str(base), str(cand), "--format", "md", "-o", str(md)],
        disk / "report": ["report", str(REPO / "tests" / "fixtures" / "records"), "-o", str(disk / "report")],
    }
    for named, argv in runs.items():
        capsys.readouterr()
        assert main(argv) == 1, argv[0]
        err = capsys.readouterr().err
        assert "Traceback" not in err
        assert [line for line in err.splitlines() if line.startswith("error:")] == [f"error: {named}: {NO_ROOM}"]
    assert not png.exists() and md.read_text() == "the last comparison\n"
    assert temp_files(disk) == []
