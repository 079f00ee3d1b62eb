"""Issue 48 (items 1, 2 and 8): a planner and a launcher that protect the host.

1. `gpus: 1000000000` made `harness plan` list a billion ranks (OOM-killed, or a MemoryError traceback under an
   address-space limit; `harness sweep` said "planner failed" and went on). A GPU count above the limit is now an
   input error (exit 2, file, key path, value and the limit, one constant with `--project`'s), and the planner keeps
   no structure of the ranks' size: a cell at the largest accepted count plans in bounded memory.
2. A local CPU cell whose ranks need more memory than the host has available was launched (a 1.3B DDP cell of two
   ranks, 41 GiB, on a 23 GiB host): the sweep now skips it with predicted against available memory in its reason
   (--no-skip runs it), and `harness plan` marks it.
8. `plan --tokens` listed cells that do not fit beside the others: it now marks them, and says what the mark means.

The sweeps here never launch a rank: the launchers are tripwires (as in test_placement.py), so code without the
check fails the test instead of starting a 41 GiB cell on the machine that runs it.
"""

from __future__ import annotations

import json
import math
import resource
import subprocess
import sys
import textwrap
import tracemalloc
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from harness.cli import main
from harness.core.layout import Layout, group_kind
from harness.plan import placement
from harness.plan.predict import clear_caches, plan_cells
from harness.report.plan import format_costs, format_table
from harness.scenario.cluster import load_cluster
from harness.scenario.schema import parse_scenario

REPO = Path(__file__).resolve().parents[2]
STRATEGIES = ("ddp", "fsdp.full_shard", "fsdp.hybrid_shard", "fsdp2.full_shard", "fsdp2.hybrid_shard", "zero1", "zero3")
"""a flat world, a hybrid's shard and replicate groups, ZeRO-1's flat buffer and ZeRO-3's coordinator"""
LARGEST = 1 << 20
"""the largest GPU count the issue asks to plan (harness.scenario.schema.MAX_GPUS, asserted below)"""
AS_LIMIT = 4 * 2**30
"""the address-space limit the subprocesses run under (bytes): where the issue's MemoryError came from"""


def write(path: Path, text: str) -> Path:
    path.write_text(textwrap.dedent(text))
    return path


def harness_limited(*args: str | Path) -> subprocess.CompletedProcess:
    """`harness ARGS` in a child process whose address space is limited to AS_LIMIT."""

    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (AS_LIMIT, AS_LIMIT))

    return subprocess.run(
        [sys.executable, "-m", "harness.cli", *map(str, args)],
        capture_output=True,
        text=True,
        cwd=REPO,
        preexec_fn=limit,
        timeout=300,
    )


def every_kind_of_group(gpus: int) -> dict:
    """A scenario whose cells at `gpus` GPUs use every group the planner classifies: a flat world, a hybrid's shard
    and replicate groups, ZeRO-3's coordinator, tensor, pipeline and data-parallel groups of a layout."""
    cell = {"model": "tiny", "precision": "bf16", "gpus": gpus}
    return {
        "name": "huge",
        "matrix": {
            "model": ["tiny"],
            "strategy": list(STRATEGIES),
            "precision": ["bf16"],
            "gpus": [gpus],
            "tp": [1],
            "pp": [1],
            "include": [
                {**cell, "strategy": "fsdp2.full_shard", "tp": 2, "pp": 2},
                {**cell, "strategy": "ddp", "pp": 2},
                {**cell, "strategy": "fsdp2.hybrid_shard", "tp": 2},
            ],
        },
        "settings": {"micro_batch": 2},
    }


# ---- item 1: the GPU count ------------------------------------------------------------------------------------


def test_a_billion_gpus_is_exit_2_naming_the_key_and_the_limit_and_the_largest_count_plans(tmp_path):
    huge = write(tmp_path / "huge.yaml", "name: huge\nmatrix: {model: [tiny], strategy: [ddp], precision: [fp32], "
                                         "gpus: [1000000000]}\n")  # fmt: skip
    for command in (["plan", huge], ["sweep", huge, "--results", tmp_path / "results"]):
        out = harness_limited(*command)
        assert out.returncode == 2, out.stderr[-2000:]
        assert out.stderr == (
            f"error: {huge}: matrix.gpus[0]: 1000000000 is above the limit of 1048576 GPUs; allowed: an integer "
            "1..1048576\n"
        )
    assert not (tmp_path / "results").exists()  # nothing half-written
    largest = tmp_path / "largest.yaml"
    largest.write_text(json.dumps(every_kind_of_group(LARGEST)))
    for cluster in ("h100", "local"):
        out = harness_limited("plan", largest, "--cluster", cluster, "--format", "json")
        assert out.returncode == 0, out.stderr[-2000:]
        cells = json.loads(out.stdout)
        assert [c["spec"]["gpus"] for c in cells] == [LARGEST] * 10
        if cluster == "h100":  # every cell predicted, none refused: what the sweep would launch on a big enough one
            assert all(c["unsupported"] is None and c["comm_bytes_per_step"] > 0 for c in cells)


def test_an_include_above_the_limit_is_named_and_the_limit_itself_is_accepted():
    from harness.core.errors import InputError

    doc = {"name": "s", "matrix": {"model": ["tiny"], "strategy": ["ddp"], "precision": ["fp32"], "gpus": [LARGEST],
                                   "include": [{"gpus": LARGEST + 1}]}}  # fmt: skip
    with pytest.raises(InputError) as raised:
        parse_scenario(doc, "s.yaml")
    assert [str(p) for p in raised.value.problems] == [
        "s.yaml: matrix.include[0].gpus: 1048577 is above the limit of 1048576 GPUs; allowed: an integer 1..1048576"
    ]
    del doc["matrix"]["include"]
    (spec,) = parse_scenario(doc, "s.yaml").expand(gpus_per_node=8)
    assert spec.gpus == LARGEST


def test_the_scenario_and_project_limits_are_one_constant(tmp_path, capsys):
    from harness.plan import projection
    from harness.scenario import schema

    assert schema.MAX_GPUS == LARGEST and projection.MAX_GPUS is schema.MAX_GPUS
    path = write(tmp_path / "s.yaml", "name: s\nmatrix: {model: [tiny], strategy: [ddp], precision: [fp32], "
                                      "gpus: [8]}\n")  # fmt: skip
    assert main(["plan", str(path), "--project", f"8,{LARGEST + 1}"]) == 2
    assert f"each 1..{schema.MAX_GPUS}" in capsys.readouterr().err
    assert main(["plan", str(path), "--project", f"8,{LARGEST}", "--cluster", "h100"]) == 0


def test_planning_the_largest_cells_keeps_no_structure_of_the_ranks_size():
    """tracemalloc's peak while every kind of group is planned at 1,048,576 GPUs: one list of the ranks alone is
    8 MiB of pointers (the code before listed the world's ranks in several places: a 65 MiB peak)."""
    cluster = load_cluster("h100")
    peaks = {}
    for gpus in (64, LARGEST):
        specs = parse_scenario(every_kind_of_group(gpus), "huge.yaml").expand(gpus_per_node=cluster.gpus_per_node)
        clear_caches()
        tracemalloc.start()
        try:
            cells = plan_cells(specs, cluster, cap=placement.Capacity(None, "not checked here"))
            peaks[gpus] = tracemalloc.get_traced_memory()[1] / 2**20
        finally:
            tracemalloc.stop()
        assert len(cells) == 10 and all(c.prediction.comm_bytes_per_step for c in cells)
    assert peaks[LARGEST] < 4.0, peaks


@settings(max_examples=300, deadline=None)
@given(
    dp=st.integers(1, 6),
    tp=st.sampled_from([1, 2, 4]),
    pp=st.integers(1, 3),
    gpus_per_node=st.integers(1, 9),
    hybrid=st.booleans(),
    data=st.data(),
)
def test_a_groups_kind_from_arithmetic_is_the_kind_of_its_ranks_listed(dp, tp, pp, gpus_per_node, hybrid, data):
    """harness.plan.links: the kind of any rank's group over any mesh dimensions, never listing its ranks, is what
    harness.core.layout.group_kind says of the ranks Layout.group lists (the planner's classification before)."""
    from harness.plan.links import box_kind, mesh_group_kind

    lay = Layout(gpus=dp * tp * pp, degrees=(("tp", tp), ("pp", pp)), gpus_per_node=gpus_per_node, hybrid=hybrid)
    if hybrid and lay.dp % lay.dp_shard:
        return  # a mesh that does not multiply out to the world: validation refuses it before any group is asked
    names = [name for name, _ in lay.mesh_dims]
    dims = tuple(data.draw(st.lists(st.sampled_from(names), unique=True, max_size=len(names))))
    rank = data.draw(st.integers(0, lay.gpus - 1))
    assert mesh_group_kind(lay, rank=rank, dims=dims) == group_kind(lay.group(rank, dims), gpus_per_node)
    assert box_kind([(1, lay.gpus)], gpus_per_node=gpus_per_node) == group_kind(list(range(lay.gpus)), gpus_per_node)


@settings(max_examples=300, deadline=None)
@given(
    sizes=st.lists(st.integers(1, 5), min_size=1, max_size=4),
    gpus_per_node=st.integers(1, 12),
    data=st.data(),
)
def test_any_box_of_a_mixed_radix_has_the_kind_of_its_ranks_listed(sizes, gpus_per_node, data):
    """box_kind over any subset of a row-major mesh's dimensions, from any rank: groups beside a node boundary
    (ranks 3 and 4 of 4-rank nodes are one per node), strides below and above a node."""
    from harness.plan.links import box_kind

    strides = [math.prod(sizes[i + 1 :]) for i in range(len(sizes))]
    picked = data.draw(st.lists(st.sampled_from(range(len(sizes))), unique=True))
    base = sum(data.draw(st.integers(0, sizes[i] - 1)) * strides[i] for i in range(len(sizes)) if i not in picked)
    ranks = [base]
    for i in picked:
        ranks = [r + k * strides[i] for r in ranks for k in range(sizes[i])]
    steps = [(strides[i], sizes[i]) for i in picked]
    assert box_kind(steps, gpus_per_node=gpus_per_node, base=base) == group_kind(sorted(ranks), gpus_per_node)


# ---- item 2: a local CPU cell beyond the host's memory --------------------------------------------------------


class Launched(Exception):
    """What the tripwire launcher raises: the cell would have started ranks."""


@pytest.fixture
def no_launch(monkeypatch):
    def launched(payload, **kwargs):
        raise Launched(payload.run_id)

    monkeypatch.setattr("harness.launch.local.backend.launch_submitit", launched)
    monkeypatch.setattr("harness.launch.local.launchers.launch_foreground", launched)
    monkeypatch.setenv("HARNESS_NO_PREFORK", "1")


@pytest.fixture
def host_of_16_gib(monkeypatch):
    """The sweep's view of this machine: 16 GiB available (MemAvailable), 2 cores."""
    real = placement.capacity

    def capacity(cluster, **kwargs):
        return real(cluster, **{**kwargs, "mem_gib": lambda: 16.0, "cores": lambda: 2})

    monkeypatch.setattr("harness.launch.sweep.capacity", capacity)


B13 = "name: b13\nmatrix: {model: [1.3b], strategy: [ddp], precision: [fp32], gpus: [2]}\n"
B13_REASON = (
    "2 ranks x 25.4 GiB = 50.7 GiB of host memory (25.1 GiB predicted per rank + 0.3 GiB for the interpreter and "
    "torch) > 16.0 GiB available (MemAvailable)"
)


def test_a_local_sweep_skips_a_cell_beyond_the_hosts_memory_and_no_skip_runs_it(
    tmp_path, no_launch, host_of_16_gib, capsys
):
    path, results = write(tmp_path / "b13.yaml", B13), tmp_path / "results"
    assert main(["sweep", str(path), "--results", str(results)]) == 1  # nothing ran: every cell skipped
    (rec,) = [json.loads(p.read_text()) for p in (results / "b13").glob("1.3b-*.json")]
    reason = f"predicted not to fit this host: {B13_REASON} (--no-skip runs it)"
    assert (rec["status"], rec["reason"]) == ("skipped", reason)
    assert rec["predicted"]["memory_gib"]["total"] == pytest.approx(25.1, abs=0.05)  # the peak: foreach AdamW's step
    assert f"skipped: {reason}" in capsys.readouterr().out
    with pytest.raises(Launched, match="1.3b-ddp-fp32-g2"):
        main(["sweep", str(path), "--results", str(tmp_path / "again"), "--no-skip"])


def test_the_host_check_takes_the_ranks_and_the_profile_as_they_are():
    from harness.plan.placement import host_memory_refusal
    from harness.plan.predict import predict
    from tests.conftest import make_spec

    local = load_cluster("local")
    cap = placement.capacity(local, cores=lambda: 2, mem_gib=lambda: 16.0)
    assert cap.host_memory_gib == 16.0
    tiny = make_spec(strategy="ddp", gpus=8)  # 8 x 0.3 GiB: fits
    assert host_memory_refusal(tiny, predicted=predict(tiny, local), cap=cap) is None
    big = make_spec(strategy="ddp", model="1.3b", gpus=2)
    assert host_memory_refusal(big, predicted=predict(big, local), cap=cap) == B13_REASON
    sharded = make_spec(strategy="fsdp2.full_shard", model="1.3b", gpus=8)  # 8 x ~2.6 GiB: more ranks, still over
    assert host_memory_refusal(sharded, predicted=predict(sharded, local), cap=cap).startswith("8 ranks x ")
    # a GPU's memory is its profile's device_memory_gib, a SLURM node is not this machine: no host check there
    for name in ("h100", "local-gpu", "local-slurm"):
        other = placement.capacity(load_cluster(name), gpus=lambda: [0, 1], cores=lambda: 2, mem_gib=lambda: 16.0)
        assert other.host_memory_gib is None, name


def test_plan_marks_a_cell_beyond_the_hosts_memory():
    local = load_cluster("local")
    doc = {"name": "b13", "matrix": {"model": ["tiny", "1.3b"], "strategy": ["ddp"], "precision": ["fp32"],
                                     "gpus": [2]}}  # fmt: skip
    specs = parse_scenario(doc, "b13.yaml").expand(gpus_per_node=local.gpus_per_node)
    cells = plan_cells(specs, local, cap=placement.capacity(local, cores=lambda: 2, mem_gib=lambda: 16.0))
    assert [(c.fits, c.host_memory, c.cannot_place) for c in cells] == [(None, None, None), (False, B13_REASON, None)]
    lines = format_table(cells, local, wide=True).splitlines()
    assert lines[0].startswith("cluster local: the ranks share this host's memory (a cell whose ranks need more than")
    fits = lines[1].split().index("fits") + 3  # NOTE: a cell's name is four words where the header's is one
    assert [x.split()[fits] for x in lines[2:4]] == ["?", "NO"]
    assert lines[4] == "2 cells; 1 predicted not to fit (NO)"
    assert lines[5] == (
        "host memory: 1 cell(s) need more than this host has (the sweep skips them; --no-skip runs them), e.g. "
        + B13_REASON
    )


# ---- item 8: plan --tokens ------------------------------------------------------------------------------------


def test_plan_tokens_marks_the_cells_that_do_not_fit(tmp_path, capsys):
    path = write(tmp_path / "t.yaml", "name: t\nmatrix: {model: [70b], strategy: [fsdp.full_shard], "
                                      "precision: [bf16], gpus: [8, 64]}\n")  # fmt: skip
    assert main(["plan", str(path), "--cluster", "h100", "--tokens", "1T", "--wide"]) == 0
    out = capsys.readouterr().out.splitlines()
    table = out[out.index("training 1e+12 tokens at the predicted tokens/s per GPU:") + 1 :]
    assert table[0].split() == ["cell", "fits", "days", "GPU-hours", "cost"]
    assert table[1].split()[:6] == ["70b", "fsdp.full_shard", "bf16", "g8", "mb2x64", "NO"]
    assert table[2].split()[:6] == ["70b", "fsdp.full_shard", "bf16", "g64", "mb2x64", "yes"]
    assert table[3] == (
        "NO: 1 cell(s) predicted not to fit in memory (the plan's fits column): none can run as planned, so their "
        "days and GPU-hours are no option (more GPUs, more sharding or activation checkpointing may fit)"
    )


def test_the_tokens_table_says_nothing_of_fitting_when_every_cell_fits():
    cluster = load_cluster("h100")
    doc = {"name": "t", "matrix": {"model": ["7b"], "strategy": ["fsdp.full_shard"], "precision": ["bf16"],
                                   "gpus": [8]}}  # fmt: skip
    from harness.plan.training import training_cost

    cells = plan_cells(parse_scenario(doc, "t.yaml").expand(gpus_per_node=8), cluster)
    costs = [training_cost(c, tokens=1e12, price_per_gpu_hour=2.0, profile="h100") for c in cells]
    lines = format_costs(cells, costs, tokens=1e12).splitlines()
    assert len(lines) == 3 and lines[2].split()[5] == "yes"


def test_harness_run_refuses_a_cell_beyond_the_hosts_memory_and_no_skip_runs_it(
    tmp_path, no_launch, monkeypatch, capsys
):
    """`harness run --cell` starts its ranks on this machine whatever the profile: the same host check, the same
    override."""
    real = placement.capacity
    monkeypatch.setattr(
        placement,
        "capacity",
        lambda cluster, **kw: real(cluster, **{**kw, "mem_gib": lambda: 16.0, "cores": lambda: 2}),
    )
    path, results = write(tmp_path / "b13.yaml", B13), tmp_path / "results"
    assert main(["run", str(path), "--cell", "1.3b", "--results", str(results)]) == 1  # ran nothing
    (rec,) = [json.loads(p.read_text()) for p in (results / "b13").glob("1.3b-*.json")]
    assert (rec["status"], rec["reason"]) == (
        "skipped",
        f"predicted not to fit this host: {B13_REASON} (--no-skip runs it)",
    )
    with pytest.raises(Launched, match="1.3b-ddp-fp32-g2"):
        main(["run", str(path), "--cell", "1.3b", "--results", str(tmp_path / "again"), "--no-skip"])
