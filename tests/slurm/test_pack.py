"""Packed sweeps (`harness sweep --pack`) on the real localhost SLURM cluster: cells of one job shape share one job
and run back to back in it, each in fresh processes with its own rendezvous and time limit; every cell still ends
with exactly the record it would have alone, made as it ends; a cancelled pack records every cell left cancelled.

The three sweeps of the module fixture run at once (two packs and one job array of two-task jobs share the
cluster's four task slots).
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from harness.cli import main
from harness.launch.slurm.pack import cell_started
from harness.results.payload import Payload
from tests.conftest import load_docs
from tests.slurm.conftest import manifest_cells, sacct_states, wait_for, write

pytestmark = pytest.mark.slurm

REPO = Path(__file__).resolve().parents[2]

SWEEPS_TIMEOUT_S = 420
"""the longest the three concurrent sweeps may take together"""

SAME_SHAPE = """\
    name: same
    matrix: {model: [tiny], strategy: [ddp, fsdp.full_shard, fsdp2.full_shard], precision: [fp32], gpus: [2]}
    settings: {warmup_steps: 2, measure_steps: 3, time_limit_s: 120}
"""
"""NOTE: 2-minute jobs: local-slurm's USR2 comes signal_delay_s (15 s) + up to 30 s before a job's limit, so a
1-minute unpacked cell could be ended after 15 s; beside the rest of `make test` the cells once took longer
(two of three ended `timeout` after 21.8 s)"""

FAULTS = """\
    name: faults
    matrix:  # the ok cell last: the pack goes on after a crash and a hang
      model: [tiny]
      strategy: [ddp]
      precision: [fp32]
      gpus: [2]
      inject: [{fault: crash, rank: 1, step: 1}]
      include:
        - {model: tiny, strategy: ddp, precision: fp32, gpus: 2, inject: {fault: hang, rank: 1, step: 2},
           time_limit_s: 30}
        - {model: tiny, strategy: ddp, precision: fp32, gpus: 2, inject: null}
        - {model: tiny, strategy: ddp, precision: fp32, gpus: 6, time_limit_s: 30}  # 3 nodes: sbatch refuses it
    # NOTE: only the hang needs a short limit; the crash and the ok cell get room for cold ranks on a loaded host
    # (the crash once ran past 30 s there and ended `timeout`)
    settings: {warmup_steps: 2, measure_steps: 3, time_limit_s: 120}
"""


def sweep_cmd(scenario: Path, results: Path, *extra: str) -> list[str]:
    return [
        sys.executable,
        "-m",
        "harness.cli",
        "sweep",
        str(scenario),
        "--cluster",
        "local-slurm",
        "--results",
        str(results),
        *extra,
    ]


@pytest.fixture(scope="module")
def sweeps(slurm_cluster, tmp_path_factory, slurm_timings) -> dict:
    """The same three cells packed and unpacked, and a pack with a crash and a hang, as three concurrent sweeps."""
    tmp = tmp_path_factory.mktemp("pack")
    same, faults = write(tmp / "same.yaml", SAME_SHAPE), write(tmp / "faults.yaml", FAULTS)
    runs = {
        "packed": sweep_cmd(same, tmp / "packed", "--pack"),
        "unpacked": sweep_cmd(same, tmp / "unpacked"),
        "faults": sweep_cmd(faults, tmp / "faults", "--pack"),
    }
    t0 = time.perf_counter()
    procs = {}
    for name, cmd in runs.items():
        with (tmp / f"{name}.log").open("w") as out:
            procs[name] = subprocess.Popen(cmd, cwd=REPO, stdout=out, stderr=subprocess.STDOUT)
    try:
        for proc in procs.values():
            proc.wait(timeout=max(1.0, SWEEPS_TIMEOUT_S - (time.perf_counter() - t0)))
    except subprocess.TimeoutExpired:
        pytest.fail(
            f"the sweeps took over {SWEEPS_TIMEOUT_S} s:\n" + "\n".join((tmp / f"{n}.log").read_text() for n in runs),
            pytrace=False,
        )
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                proc.kill()
    slurm_timings["pack sweeps (3 packed, 3 unpacked, 3 packed faults)"] = time.perf_counter() - t0
    out = {}
    for name in runs:
        records, warnings = load_docs(tmp / name)
        sweep = "faults" if name == "faults" else "same"
        out[name] = {
            "code": procs[name].returncode,
            "output": (tmp / f"{name}.log").read_text(),
            "records": {r["run_id"]: r for r in records},
            "warnings": warnings,
            "manifest": manifest_cells(tmp / name, sweep),
            "dir": tmp / name / sweep,
        }
    return out


def test_a_pack_of_same_shaped_cells_is_one_job_and_ends_ok(sweeps):
    packed = sweeps["packed"]
    assert packed["code"] == 0, packed["output"]
    recs = packed["records"]
    assert len(recs) == 3 and not packed["warnings"]
    assert {r["status"] for r in recs.values()} == {"ok"}
    (job_id,) = {r["env"]["slurm_job_id"] for r in recs.values()}
    assert "_" not in job_id  # one plain job, not an array
    assert sorted(r["env"]["slurm_pack"]["position"] for r in recs.values()) == [1, 2, 3]
    assert all(
        r["env"]["slurm_pack"] == {"job_id": job_id, "position": r["env"]["slurm_pack"]["position"], "of": 3}
        for r in recs.values()
    )
    assert {c["job_id"] for c in packed["manifest"].values()} == {job_id}
    assert {c["state"] for c in packed["manifest"].values()} == {"done"}
    # the job asks for the sum of what the cells would ask for alone (2 min each)
    submission = (packed["dir"] / ".submitit" / f"{job_id}_submission.sh").read_text()
    assert "#SBATCH --time=6\n" in submission and "#SBATCH --ntasks-per-node=2\n" in submission
    # each cell is recorded as it ends, not all three when the job does
    progress = [line for line in packed["output"].splitlines() if line.startswith("  slurm: ")]
    assert any(", 1 ended" in line for line in progress) and any(", 2 ended" in line for line in progress), progress


def test_packed_records_equal_the_unpacked_ones(sweeps):
    packed, unpacked = sweeps["packed"]["records"], sweeps["unpacked"]["records"]
    assert sweeps["unpacked"]["code"] == 0, sweeps["unpacked"]["output"]
    assert set(packed) == set(unpacked) and len(packed) == 3
    for run_id, p in packed.items():
        u = unpacked[run_id]
        assert p["spec"] == u["spec"] and p["status"] == u["status"] == "ok"
        assert p["comm"]["bytes_per_step"] == u["comm"]["bytes_per_step"] > 0
        assert p["comm"]["calls_per_step"] == u["comm"]["calls_per_step"]
        assert p["metrics"]["losses"] == u["metrics"]["losses"]  # same model, batches and ranks: bit for bit
        assert p["metrics"]["loss"] < p["metrics"]["losses"][0]
        assert "slurm_pack" not in u["env"]
    assert len({r["env"]["slurm_job_id"] for r in unpacked.values()}) == 3  # one array task per cell


def test_a_crash_and_a_hang_in_a_pack_are_recorded_and_the_pack_goes_on(sweeps):
    faults = sweeps["faults"]
    assert faults["code"] == 1, faults["output"]  # some cells failed
    by_fault = {
        (r["spec"].get("inject") or {}).get("fault"): r for r in faults["records"].values() if r["spec"]["gpus"] == 2
    }
    assert set(by_fault) == {"crash", "hang", None} and len(faults["records"]) == 4 and not faults["warnings"]
    assert len({r["env"]["slurm_job_id"] for r in by_fault.values()}) == 1  # one job
    crash, hang, ok = by_fault["crash"], by_fault["hang"], by_fault[None]
    # as locally: the peers saw rank 1's connection close
    assert crash["status"] == "crashed" and crash["failed_rank"] == 1, crash["reason"]
    assert "rank 1 died without raising an exception" in crash["reason"]
    # the task ended the cell at its own limit (the job's --time is 5 min): the local launcher's verdict
    assert hang["status"] == "timeout", hang["reason"]
    assert hang["reason"] == "the cell exceeded its time limit of 30 s"
    assert ok["status"] == "ok" and ok["env"]["slurm_pack"]["position"] == 3, ok["reason"]
    # after a crash and a hang in the same job, the same training as the clean pack's ddp cell (its time limit
    # differs, nothing else)
    ddp = next(r for r in sweeps["packed"]["records"].values() if r["spec"]["strategy"] == "ddp")
    assert ok["metrics"]["losses"] == ddp["metrics"]["losses"]
    assert ok["comm"]["bytes_per_step"] == ddp["comm"]["bytes_per_step"]
    (refused,) = [r for r in faults["records"].values() if r["spec"]["gpus"] == 6]
    assert refused["status"] == "error" and refused["env"]["slurm_job_id"] is None
    assert refused["reason"].startswith("sbatch refused the packed job (3 nodes x 2 tasks, 1 min): ")
    assert "sbatch: error:" in refused["reason"]
    # no rank outlived its cell (the pack's tasks may still be exiting: the sweep does not wait for them)
    ps = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True).stdout.splitlines()
    assert not [line for line in ps if "harness.launch.entry" in line and any(r in line for r in faults["records"])]


# ---- detached, status, cancelled, picked up --------------------------------------------------------------------

SPLIT = """\
    name: split
    matrix:  # 15-minute cells: two fill the profile's 30-minute cap, so the third is a second pack
      model: [tiny]
      strategy: [ddp]
      precision: [fp32]
      gpus: [2]
      inject: [{fault: hang, rank: 1, step: 2}, null]
      include: [{model: tiny, strategy: fsdp.full_shard, precision: fp32, gpus: 2}]
    settings: {warmup_steps: 2, measure_steps: 3}
"""


def test_a_cancelled_pack_records_every_cell_left_cancelled(slurm_cluster, tmp_path, capsys):
    scenario = write(tmp_path / "split.yaml", SPLIT)
    results = tmp_path / "results"
    args = ["sweep", str(scenario), "--cluster", "local-slurm", "--results", str(results), "--pack"]

    assert main([*args, "--no-wait"]) == 0
    out = capsys.readouterr().out
    assert "detached from 3 cells on SLURM" in out, out
    cells = manifest_cells(results, "split")
    payloads = {
        r: Payload.model_validate_json((results / "split" / ".payloads" / f"{r}.json").read_bytes()) for r in cells
    }
    key = {r: (p.spec.strategy, (p.spec.settings.inject or {}).get("fault")) for r, p in payloads.items()}
    run_id = {k: r for r, k in key.items()}
    hang, waiting, alone = run_id[("ddp", "hang")], run_id[("ddp", None)], run_id[("fsdp.full_shard", None)]
    assert cells[hang]["job_id"] == cells[waiting]["job_id"] != cells[alone]["job_id"]
    assert (cells[hang]["pack"], cells[waiting]["pack"], cells[alone]["pack"]) == (
        {"position": 1, "of": 2},
        {"position": 2, "of": 2},
        {"position": 1, "of": 1},
    )
    folder = results / "split" / ".submitit"
    for r, minutes in ((hang, 30), (alone, 15)):
        assert f"#SBATCH --time={minutes}\n" in (folder / f"{cells[r]['job_id']}_submission.sh").read_text()

    # the first cell runs (it hangs); the second waits for its turn
    wait_for(lambda: cell_started(payloads[hang]), timeout_s=90, what="the first cell of the pack to start")

    def status_lines() -> dict[str, str]:
        assert main(["status", str(results / "split")]) == 0
        lines = capsys.readouterr().out.splitlines()
        return {r: next(line for line in lines if r in line) for r in (hang, waiting)}

    # NOTE: sacct may still say PENDING for a moment after the job started
    lines = wait_for(
        lambda: (ls := status_lines())[hang].split()[0] == "running" and ls,
        timeout_s=30,
        what="harness status to show the first cell running",
    )
    assert "(pack 1/2)" in lines[hang] and "SLURM RUNNING" in lines[hang], lines
    assert lines[waiting].split()[0] == "pending" and "(pack 2/2)" in lines[waiting], lines
    assert "waiting for its turn in the pack" in lines[waiting], lines
    job_id = cells[hang]["job_id"]
    subprocess.run(["scancel", job_id], check=True)

    assert main(args) == 1  # re-attaches and collects; the cancelled cells count as failed
    out = capsys.readouterr().out
    assert out.count("re-attached to SLURM job") == 3 and "submitted:" not in out, out
    records = {r["run_id"]: r for r in load_docs(results)[0]}
    assert records[hang]["status"] == "cancelled", records[hang]["reason"]
    assert "was cancelled" in records[hang]["reason"] and "while this cell ran" in records[hang]["reason"]
    assert records[waiting]["status"] == "cancelled", records[waiting]["reason"]
    assert "before this cell ran" in records[waiting]["reason"]
    assert records[alone]["status"] == "ok" and records[alone]["env"]["slurm_pack"]["of"] == 1
    for r in (hang, waiting):
        assert records[r]["env"]["slurm_job_id"] == job_id
    cells = manifest_cells(results, "split")
    assert {r: c["state"] for r, c in cells.items()} == {hang: "cancelled", waiting: "cancelled", alone: "done"}
    assert sacct_states(job_id)[-1].startswith("CANCELLED")
