"""Every cell ends in a truthful record: injected faults on real gloo ranks, through the real sweep path
(submitit's local executor), each with its status and failing rank, and the sweep goes on."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from harness.cli import main
from tests.conftest import load_docs

pytestmark = pytest.mark.dist

REPO = Path(__file__).resolve().parents[2]
FAST_CLUSTER = """\
name: local-fast-watchdog
description: local CPU with a 10 s collective watchdog, for fault tests
executor: local
device: cpu
gpus_per_node: 2
pg_timeout_s: 10
env: {OMP_NUM_THREADS: "1"}
"""


def write(path: Path, text: str) -> Path:
    path.write_text(textwrap.dedent(text))
    return path


@pytest.fixture(scope="module")
def fault_sweep(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("faults")
    cluster = write(tmp / "cluster.yaml", FAST_CLUSTER)
    scenario = write(
        tmp / "faults.yaml",
        """\
        name: faults
        matrix:
          model: [tiny]
          strategy: [ddp]
          precision: [fp32]
          gpus: [2]
          inject:
            - {fault: exception, rank: 1, step: 3}
            - {fault: oom, rank: 1, step: 2}
            - {fault: nan, rank: 0, step: 3}
            - {fault: crash, rank: 1, step: 3}
            - {fault: hang, rank: 1, step: 3}
            - null
          include:
            - {model: tiny, strategy: fsdp.hybrid_shard, precision: fp32, gpus: 4,
               inject: {fault: hang, rank: 3, step: 2}}
        settings: {warmup_steps: 2, measure_steps: 3, time_limit_s: 120}
    """,
    )
    results = tmp / "results"
    t0 = time.time()
    code = main(["sweep", str(scenario), "--cluster", str(cluster), "--results", str(results)])
    wall = time.time() - t0
    records, warnings = load_docs(results)
    by_fault = {(r["spec"]["strategy"], (r["spec"].get("inject") or {}).get("fault")): r for r in records}
    return {"code": code, "records": by_fault, "warnings": warnings, "wall": wall, "results": results}


def test_sweep_went_on_and_flagged_failure(fault_sweep):
    assert fault_sweep["code"] == 1  # some cells failed
    assert len(fault_sweep["records"]) == 7 and not fault_sweep["warnings"]
    clean = fault_sweep["records"][("ddp", None)]
    assert clean["status"] == "ok" and clean["metrics"]["loss"] < clean["metrics"]["losses"][0]


@pytest.mark.parametrize(
    "fault,status,rank,needle",
    [
        ("exception", "error", 1, "injected exception"),
        ("oom", "oom", 1, "allocate"),
        ("nan", "nan", 0, "not finite at step 3"),
        ("crash", "crashed", 1, "rank 1"),
        ("hang", "timeout", 1, "rank 1"),
    ],
)
def test_injected_fault_has_status_rank_and_reason(fault_sweep, fault, status, rank, needle):
    rec = fault_sweep["records"][("ddp", fault)]
    assert rec["status"] == status, rec["reason"]
    assert rec["failed_rank"] == rank
    assert needle in rec["reason"]
    if fault == "oom":  # memory at failure, from the failing rank
        assert next(f for f in rec["failures"] if f["rank"] == 1)["memory_rss_gib"] > 0.1


def test_error_record_carries_the_traceback(fault_sweep):
    rec = fault_sweep["records"][("ddp", "exception")]
    tb = next(f["traceback"] for f in rec["failures"] if f["rank"] == 1)
    assert "RuntimeError: injected exception" in tb and "harness/worker/runner.py" in tb
    # the reason alone says what and where (issue 31: a bare "AssertionError:" told nothing)
    assert re.fullmatch(
        r"RuntimeError: injected exception \(rank 1, step \d\) \(raised at harness/worker/faults\.py:\d+ in \w+\)",
        next(f["reason"] for f in rec["failures"] if f["rank"] == 1),
    ), rec["failures"]


def test_hang_in_a_hybrid_subgroup_hits_the_watchdog(fault_sweep):
    # the profile's 10 s watchdog applies to the hybrid's sub-groups too, not only the world group
    rec = fault_sweep["records"][("fsdp.hybrid_shard", "hang")]
    assert rec["status"] == "timeout" and rec["failed_rank"] == 3
    assert "collective" in rec["reason"]


def test_no_worker_outlives_its_cell(fault_sweep):
    out = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True).stdout
    assert str(fault_sweep["results"]) not in out


# ---- interrupted, resumed, and concurrent sweeps -------------------------------------------------------

THREE_CELLS = """\
    name: {name}
    matrix: {{model: [tiny], strategy: [ddp, fsdp.full_shard, zero1], precision: [fp32], gpus: [2]}}
    settings: {{warmup_steps: 2, measure_steps: 2}}
"""


def sweep_proc(scenario: Path, results: Path) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "harness.cli", "sweep", str(scenario), "--results", str(results)],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def test_interrupted_sweep_resumes_to_exactly_one_record_per_cell(tmp_path):
    # the second cell runs long enough (300 steps) to be interrupted mid-way: forked ranks start in well
    # under a second, so a 7-step cell would be over before the signal
    long_second = THREE_CELLS.format(name="resume").replace(
        "gpus: [2]}", "gpus: [2],\n             include: [{strategy: fsdp.full_shard, measure_steps: 300}]}"
    )
    scenario = write(tmp_path / "s.yaml", long_second)
    results = tmp_path / "results"
    proc = sweep_proc(scenario, results)
    manifest = results / "resume" / "manifest.json"
    deadline = time.time() + 120
    while time.time() < deadline:  # wait until the second cell is running
        if manifest.exists():
            cells = json.loads(manifest.read_text())["cells"]
            if sum(c.get("state") == "done" for c in cells.values()) >= 1 and any(
                c.get("state") == "running" for c in cells.values()
            ):
                break
        time.sleep(0.2)
    else:
        proc.kill()
        pytest.fail("the sweep never reached its second cell")
    time.sleep(1.5)
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 130, out
    cells = json.loads(manifest.read_text())["cells"]
    assert "running" not in {c["state"] for c in cells.values()}, cells
    assert sorted(c["state"] for c in cells.values()) == ["cancelled", "done", "pending"]
    ps = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True).stdout
    assert str(results) not in ps  # the interrupted cell's ranks are gone

    assert main(["sweep", str(scenario), "--results", str(results)]) == 0
    records, warnings = load_docs(results)
    assert not warnings
    assert sorted(r["spec"]["strategy"] for r in records) == ["ddp", "fsdp.full_shard", "zero1"]
    assert all(r["status"] == "ok" for r in records)
    cells = json.loads(manifest.read_text())["cells"]
    assert [c["state"] for c in cells.values()] == ["done"] * 3


def test_two_sweeps_into_one_results_dir(tmp_path):
    """The same scenario launched twice at once: each cell runs once, ends with one record, manifest intact."""
    scenario = write(tmp_path / "s.yaml", THREE_CELLS.format(name="twice"))
    results = tmp_path / "results"
    a, b = sweep_proc(scenario, results), sweep_proc(scenario, results)
    outs = [p.communicate(timeout=600)[0] for p in (a, b)]
    assert a.returncode == 0 and b.returncode == 0, outs
    records, warnings = load_docs(results)
    assert not warnings and len(records) == 3 and all(r["status"] == "ok" for r in records)
    assert sum(o.count("another sweep") for o in outs) >= 1  # one of them waited instead of rerunning
    cells = json.loads((results / "twice" / "manifest.json").read_text())["cells"]
    assert len(cells) == 3 and all(c["state"] == "done" for c in cells.values())
    assert not list((results / "twice").glob(".*.tmp"))
    assert os.listdir(results) == ["twice"]


# ---- a rank that cannot get its device --------------------------------------------------------------------


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="needs a machine without CUDA")
def test_a_gpu_profile_without_cuda_is_an_error_with_the_reason(tmp_path):
    """Before the device and the process group were inside the worker's fragment-writing handler, this cell was
    `crashed: the ranks exited without a record or an exception`; now every rank says why."""
    from tests.conftest import make_spec, run_cell

    rec = run_cell(
        make_spec(strategy="ddp", precision="bf16", warmup_steps=2, measure_steps=2),
        tmp_path / "r",
        cluster="local-gpu",
    )
    assert rec["status"] == "error" and rec["failed_rank"] in (0, 1)  # both fail at once; the first to say so
    assert "cluster profile 'local-gpu' says cuda, but torch.cuda.is_available() is False" in rec["reason"]
    assert {f["rank"] for f in rec["failures"]} == {0, 1}


def _terminal_sigint() -> None:
    """In the child, before exec: SIGINT as a shell's foreground job has it (default, not blocked, not ignored),
    whatever the test process's own mask and disposition are at that moment (both are inherited across exec)."""
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def test_ctrl_c_in_a_terminal_prints_no_traceback_and_resumes(tmp_path):
    """A terminal's Ctrl-C goes to the whole foreground process group — the sweep, submitit's local job
    controller and its tasks — not just to the sweep: everything it prints is the sweep's clean lines (no
    KeyboardInterrupt traceback from the job's processes), it exits 130, and a re-run resumes."""
    scenario = write(
        tmp_path / "s.yaml",
        """\
        name: ctrlc
        matrix: {model: [tiny], strategy: [ddp], precision: [fp32], gpus: [2],
                 include: [{model: tiny, strategy: fsdp.full_shard, precision: fp32, gpus: 2, measure_steps: 300}]}
        settings: {warmup_steps: 2, measure_steps: 2}
        """,
    )
    results = tmp_path / "results"
    proc = subprocess.Popen(
        [sys.executable, "-m", "harness.cli", "sweep", str(scenario), "--results", str(results)],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # its own process group, as a shell gives a foreground job
        preexec_fn=_terminal_sigint,
    )
    manifest = results / "ctrlc" / "manifest.json"
    deadline = time.time() + 120
    while time.time() < deadline:  # wait until the second (long) cell is running
        if manifest.exists():
            states = [c.get("state") for c in json.loads(manifest.read_text())["cells"].values()]
            if states == ["done", "running"]:
                break
        time.sleep(0.2)
    else:
        os.killpg(proc.pid, signal.SIGKILL)
        pytest.fail("the sweep never reached its second cell")
    time.sleep(1.5)  # the job's controller and ranks are up
    os.killpg(proc.pid, signal.SIGINT)  # what a terminal does on Ctrl-C
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, out + err
    assert re.search(r"\] tiny-fsdp\.full_shard\S*  cancelled: .*\(interrupted; re-run the sweep to resume\)", out), out
    assert "Traceback" not in out + err and "KeyboardInterrupt" not in out + err, err
    cells = json.loads(manifest.read_text())["cells"]
    assert [c["state"] for c in cells.values()] == ["done", "cancelled"]
    first = {r["spec"]["strategy"]: r for r in load_docs(results)[0]}
    assert first["fsdp.full_shard"]["status"] == "cancelled"

    again = subprocess.run(
        [sys.executable, "-m", "harness.cli", "sweep", str(scenario), "--results", str(results)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert again.returncode == 0, again.stdout + again.stderr
    assert "ok (already recorded; --force reruns)" in again.stdout  # the done cell is not rerun
    records = {r["spec"]["strategy"]: r for r in load_docs(results)[0]}
    assert records["ddp"]["attempt"] == first["ddp"]["attempt"]
    assert records["fsdp.full_shard"]["status"] == "ok"
    assert [c["state"] for c in json.loads(manifest.read_text())["cells"].values()] == ["done", "done"]


@pytest.mark.parametrize("delay_s", [0.0, 1.0, 2.0])
def test_ctrl_c_early_in_a_cell_gives_one_truth(tmp_path, delay_s):
    """Ctrl-C in the first seconds of a short cell (issue 31: the ranks bypassed SIGTERM, finished, and recorded
    `ok` while the manifest, `status` and the console said `cancelled`). Whichever way the race goes at each delay,
    record, manifest, `harness status` and the console agree, and a re-run resumes (an ok cell is not re-run)."""
    scenario = write(
        tmp_path / "s.yaml",
        """\
        name: early
        matrix: {model: [tiny], strategy: [ddp], precision: [fp32], gpus: [2]}
        settings: {warmup_steps: 2, measure_steps: 3}
        """,
    )
    results = tmp_path / "results"
    proc = subprocess.Popen(
        [sys.executable, "-m", "harness.cli", "sweep", str(scenario), "--results", str(results)],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
        preexec_fn=_terminal_sigint,
    )
    manifest = results / "early" / "manifest.json"
    deadline = time.time() + 120
    while time.time() < deadline:  # the cell's job is starting
        if manifest.exists() and [c.get("state") for c in json.loads(manifest.read_text())["cells"].values()] == [
            "running"
        ]:
            break
        time.sleep(0.02)
    else:
        os.killpg(proc.pid, signal.SIGKILL)
        pytest.fail("the sweep never started its cell")
    time.sleep(delay_s)
    os.killpg(proc.pid, signal.SIGINT)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, out + err
    records = load_docs(results)[0]
    assert len(records) == 1, out
    status = records[0]["status"]
    assert status in ("ok", "cancelled"), records[0].get("reason")
    print(f"Ctrl-C {delay_s} s into the cell: {status}")
    (cell,) = json.loads(manifest.read_text())["cells"].values()
    assert (cell["state"], cell["status"]) == ("done" if status == "ok" else "cancelled", status)
    line = next(x for x in out.splitlines() if "] tiny-ddp-fp32-g2" in x)
    assert f"  {status}" in line and "(interrupted" in line, out
    assert ("cancelled" in line) == (status == "cancelled"), out
    shown = subprocess.run(
        [sys.executable, "-m", "harness.cli", "status", str(results)], cwd=REPO, capture_output=True, text=True
    ).stdout
    assert re.search(rf"^  {cell['state']}\s+{status}\s+tiny-ddp-fp32-g2", shown, re.M), shown
    again = subprocess.run(
        [sys.executable, "-m", "harness.cli", "sweep", str(scenario), "--results", str(results)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert again.returncode == 0, again.stdout + again.stderr
    after = load_docs(results)[0]
    assert len(after) == 1 and after[0]["status"] == "ok"
    assert (after[0]["attempt"] == records[0]["attempt"]) == (status == "ok")  # an ok cell is not re-run


def test_a_cell_the_machine_cannot_host_is_skipped_and_the_rest_runs(tmp_path):
    """`gpus: [2, 100000]` on the local profile: the 100000-rank cell is `skipped` with the reason before anything
    launches (it used to start a process per rank), the 2-rank cell runs. tests/unit/test_placement.py has the
    same refusal with the launcher replaced by a tripwire; this is the real sweep path."""
    scenario = write(
        tmp_path / "s.yaml",
        """\
        name: huge
        matrix: {model: [tiny], strategy: [ddp], precision: [fp32], gpus: [2, 100000]}
        settings: {warmup_steps: 2, measure_steps: 2}
        """,
    )
    results = tmp_path / "results"
    proc = sweep_proc(scenario, results)
    out, _ = proc.communicate(timeout=300)
    assert proc.returncode == 0, out
    records = {r["spec"]["gpus"]: r for r in load_docs(results)[0]}
    assert (records[2]["status"], records[100000]["status"]) == ("ok", "skipped"), out
    assert records[100000]["reason"].startswith("needs 100000 ranks on this machine; it hosts at most ")
    cells = json.loads((results / "huge" / "manifest.json").read_text())["cells"]
    assert sorted(c["state"] for c in cells.values()) == ["done", "skipped"]
    jobs = list((results / "huge" / ".submitit").glob("*_submitted.pkl"))
    assert len(jobs) == 1  # one job: the 2-rank cell's
    assert sorted(p.name.split("_")[1] for p in (results / "huge" / ".submitit").glob("*_log.out")) == ["0", "1"]
