"""harness.plan.placement: a cell the cluster cannot place — more ranks than this machine hosts, more GPUs than it
shows, more nodes than a SLURM profile allows — is refused before anything launches: `plan` marks it, `sweep`
records it `skipped` with the reason and goes on, `run --cell` says so. (Issue 15, item 1: a `gpus: [2, 100000]`
sweep started 100000 ranks per cell.)

The sweeps here replace the launchers by a tripwire that fails the test: on code without the check the cell
would be launched, and a 100000-rank launch is a process storm, not a test failure.
"""

from __future__ import annotations

import json
import os
import stat
import textwrap
from pathlib import Path

import pytest

from harness.cli import main
from harness.core.errors import InputError
from harness.plan.placement import (
    MIN_LOCAL_RANKS,
    RANKS_PER_CORE,
    Capacity,
    capacity,
    local_cpu_ranks,
    placement_refusal,
)
from harness.scenario.cluster import load_cluster, parse_cluster
from tests.conftest import make_spec


def write(path: Path, text: str) -> Path:
    path.write_text(textwrap.dedent(text))
    return path


def scenario(tmp_path: Path, gpus: list[int], *, name: str = "big") -> Path:
    return write(
        tmp_path / f"{name}.yaml",
        f"""\
        name: {name}
        matrix: {{model: [tiny], strategy: [ddp], precision: [fp32], gpus: {gpus}}}
        settings: {{warmup_steps: 2, measure_steps: 2}}
        """,
    )


@pytest.fixture
def no_launch(monkeypatch):
    """Every launcher replaced by a tripwire (see the module's docstring); no warm zygote either."""

    def launched(*args, **kwargs):
        raise AssertionError("a cell the cluster cannot place was launched")

    monkeypatch.setattr("harness.launch.local.backend.launch_submitit", launched)
    monkeypatch.setattr("harness.launch.local.launchers.launch_foreground", launched)
    monkeypatch.setenv("HARNESS_NO_PREFORK", "1")


# ---- the limits --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "cores, mem_gib, ranks",
    [
        (2, None, MIN_LOCAL_RANKS),  # the floor
        (2, 100.0, MIN_LOCAL_RANKS),
        (16, None, 16 * RANKS_PER_CORE),
        (16, 100.0, 64),
        (16, 3.0, 10),  # memory: 3.0 GiB / 0.3 GiB per rank
        (2, 0.5, 1),
    ],
)
def test_the_local_limit_comes_from_cores_and_memory(cores, mem_gib, ranks):
    cap = local_cpu_ranks(cores=cores, mem_gib=mem_gib)
    assert cap.ranks == ranks
    assert "max_local_ranks" in cap.source


def test_this_machine_never_hosts_100000_ranks():
    cap = capacity(load_cluster("local"))
    assert cap.ranks is not None and 1 <= cap.ranks < 100000
    assert cap.ranks <= max(MIN_LOCAL_RANKS, RANKS_PER_CORE * (os.cpu_count() or 1))


def test_a_profile_sets_the_local_limit(tmp_path):
    profile = write(tmp_path / "tight.yaml", "name: tight\nexecutor: local\ndevice: cpu\nmax_local_ranks: 2\n")
    cluster = load_cluster(str(profile))
    cap = capacity(cluster, cores=lambda: 1000, mem_gib=lambda: 1000.0)
    assert cap == Capacity(2, f"the profile allows at most 2 (max_local_ranks in {profile})", "rank", 1000.0)
    assert placement_refusal(make_spec(strategy="ddp", gpus=2), cluster, cap) is None
    assert placement_refusal(make_spec(strategy="ddp", gpus=3), cluster, cap) == (
        f"needs 3 ranks on this machine; the profile allows at most 2 (max_local_ranks in {profile})"
    )


def test_a_local_gpu_profile_counts_the_visible_gpus(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")
    cluster = load_cluster("local-gpu")
    cap = capacity(cluster)
    assert cap.ranks == 2
    assert placement_refusal(make_spec(strategy="ddp", gpus=4), cluster, cap) == (
        "needs 4 GPUs on this machine; 2 visible (CUDA_VISIBLE_DEVICES='0,1')"
    )
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "GPU-5f3c2a1e-0000-0000-0000-000000000000")
    uncounted = capacity(cluster, cores=lambda: 2, mem_gib=lambda: None)  # named by UUID: the host's limit
    assert (uncounted.ranks, uncounted.unit) == (MIN_LOCAL_RANKS, "rank")


def slurm_profile(tmp_path: Path, *, max_nodes: int | None) -> Path:
    return write(
        tmp_path / "tiny-slurm.yaml",
        f"""\
        name: tiny-slurm
        executor: slurm
        device: cuda
        gpus_per_node: 8
        slurm: {{partition: gpu, max_nodes: {"null" if max_nodes is None else max_nodes}}}
        """,
    )


def test_a_slurm_profile_places_at_most_max_nodes_x_gpus_per_node(tmp_path):
    cluster = load_cluster(str(slurm_profile(tmp_path, max_nodes=2)))
    cap = capacity(cluster)
    assert cap.ranks == 16
    spec = make_spec(strategy="ddp", gpus=24, gpus_per_node=8)
    assert placement_refusal(spec, cluster, cap) == (
        f"needs 3 nodes of 8 tasks; the profile allows at most 2 (slurm.max_nodes in {cluster.path})"
    )
    assert placement_refusal(make_spec(strategy="ddp", gpus=16, gpus_per_node=8), cluster, cap) is None
    uneven = make_spec(strategy="ddp", gpus=12, gpus_per_node=8)
    assert "not a multiple of 8 ranks per node" in (placement_refusal(uneven, cluster, cap) or "")
    unbounded = load_cluster(str(slurm_profile(tmp_path, max_nodes=None)))
    assert placement_refusal(spec, unbounded, capacity(unbounded)) is None  # left to sbatch


@pytest.mark.parametrize(
    "doc, line",
    [
        ({"max_local_ranks": 0}, "p.yaml: max_local_ranks: 0 is not a positive integer"),
        ({"max_local_ranks": "8"}, "p.yaml: max_local_ranks: '8' is not a positive integer"),
        ({"max_local_ranks": True}, "p.yaml: max_local_ranks: True is not a positive integer"),
        (
            {"executor": "slurm", "max_local_ranks": 8},
            "p.yaml: max_local_ranks: only for executor: local (a SLURM profile limits a cell by slurm.max_nodes x "
            "gpus_per_node)",
        ),
        ({"executor": "slurm", "slurm": {"max_nodes": 0}}, "p.yaml: slurm.max_nodes: 0 is not a positive integer"),
        ({"executor": "slurm", "slurm": {"max_nodes": 2.5}}, "p.yaml: slurm.max_nodes: 2.5 is not a positive integer"),
    ],
)
def test_bad_limits_in_a_profile_are_input_errors(doc, line):
    with pytest.raises(InputError) as raised:
        parse_cluster({"name": "p", **doc}, "p.yaml")
    assert [str(p) for p in raised.value.problems] == [line]


# ---- plan, sweep, run ----------------------------------------------------------------------------------------


def test_plan_marks_the_cells_it_cannot_place(tmp_path, capsys):
    path = scenario(tmp_path, [2, 100000])
    assert main(["plan", str(path), "--wide"]) == 0
    out = capsys.readouterr().out
    (line,) = [x for x in out.splitlines() if "g100000" in x]
    assert "CANNOT PLACE (skipped): needs 100000 ranks on this machine; it hosts at most" in line
    (summary,) = [x for x in out.splitlines() if x.startswith("2 cells; ")]
    assert summary.endswith(", 1 more than cluster local can place (the sweep skips them)")
    assert main(["plan", str(path), "--format", "json"]) == 0
    cells = {c["spec"]["gpus"]: c for c in json.loads(capsys.readouterr().out)}
    assert cells[2]["cannot_place"] is None
    assert cells[100000]["cannot_place"].startswith("needs 100000 ranks on this machine; it hosts at most ")
    assert cells[100000]["memory_gib"] is not None  # still predicted: the plan says what it would need


def test_a_local_sweep_skips_a_cell_the_machine_cannot_host_without_launching(tmp_path, no_launch, capsys):
    results = tmp_path / "results"
    assert main(["sweep", str(scenario(tmp_path, [100000])), "--results", str(results)]) == 1  # nothing ran
    out = capsys.readouterr().out
    (rec,) = [json.loads(p.read_text()) for p in (results / "big").glob("tiny-*.json")]
    assert rec["status"] == "skipped" and rec["spec"]["gpus"] == 100000
    assert rec["reason"].startswith("needs 100000 ranks on this machine; it hosts at most ")
    assert f"skipped: {rec['reason']}" in out and "done in" in out and "1 skipped" in out
    cells = json.loads((results / "big" / "manifest.json").read_text())["cells"]
    assert [c["state"] for c in cells.values()] == ["skipped"]
    assert not (results / "big" / ".submitit").exists()  # no job was ever submitted


def test_a_profiles_max_local_ranks_skips_bigger_cells(tmp_path, no_launch):
    profile = write(tmp_path / "tight.yaml", "name: tight\nexecutor: local\ndevice: cpu\nmax_local_ranks: 2\n")
    results = tmp_path / "results"
    code = main(["sweep", str(scenario(tmp_path, [3])), "--cluster", str(profile), "--results", str(results)])
    assert code == 1  # every cell skipped: nothing ran
    (rec,) = [json.loads(p.read_text()) for p in (results / "big").glob("tiny-*.json")]
    assert (rec["status"], rec["reason"]) == (
        "skipped",
        f"needs 3 ranks on this machine; the profile allows at most 2 (max_local_ranks in {profile})",
    )


def test_run_cell_refuses_a_cell_the_machine_cannot_host(tmp_path, no_launch, capsys):
    path = scenario(tmp_path, [2, 100000])
    code = main(["run", str(path), "--cell", "tiny-ddp-fp32-g100000", "--results", str(tmp_path / "results")])
    assert code == 1  # as for an unsupported cell: a skipped record, nothing launched (nothing ran: exit 1)
    out = capsys.readouterr().out
    assert "skipped: needs 100000 ranks on this machine" in out


def test_a_slurm_sweep_skips_a_cell_beyond_max_nodes_without_sbatch(tmp_path, monkeypatch, capsys):
    """No SLURM client here: the preflight (sinfo) is replaced; `sbatch` is a script that leaves a mark, so a
    submission would be seen (and refused, so that code without the check fails instead of waiting)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    marker = tmp_path / "sbatch-called"
    sbatch = write(bin_dir / "sbatch", f"#!/bin/sh\ntouch {marker}\necho 'sbatch: error: fake' >&2\nexit 1\n")
    sbatch.chmod(sbatch.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setattr("harness.launch.sweep.preflight", lambda cluster: None)
    profile = slurm_profile(tmp_path, max_nodes=2)
    results = tmp_path / "results"
    path = scenario(tmp_path, [24, 100000])
    assert main(["sweep", str(path), "--cluster", str(profile), "--results", str(results)]) == 1  # nothing ran
    records = sorted(
        (json.loads(p.read_text()) for p in (results / "big").glob("tiny-*.json")), key=lambda r: r["spec"]["gpus"]
    )
    assert [(r["spec"]["gpus"], r["status"]) for r in records] == [(24, "skipped"), (100000, "skipped")]
    assert records[0]["reason"] == (
        f"needs 3 nodes of 8 tasks; the profile allows at most 2 (slurm.max_nodes in {profile})"
    )
    assert records[1]["reason"].startswith("needs 12500 nodes of 8 tasks; ")
    assert not marker.exists()  # sbatch never ran
    cells = json.loads((results / "big" / "manifest.json").read_text())["cells"]
    assert [c["state"] for c in cells.values()] == ["skipped", "skipped"]
