"""SLURM profiles (no cluster needed): the `slurm:` block's validation, its translation into submitit parameters
(harness.launch.slurm.jobs), the time limit of a cell's job, and how cells are split into packs."""

from __future__ import annotations

import textwrap

import pytest
import yaml

from harness.core.errors import InputError
from harness.launch.slurm.jobs import executor_parameters, job_minutes, split_packs
from harness.scenario.cluster import SHIPPED_DIR, available_clusters, load_cluster, min_job_minutes, parse_cluster
from harness.scenario.schema import load_yaml


def profile(slurm: str, **top) -> dict:
    """A GPU profile document with the given `slurm:` block (YAML)."""
    return {
        "name": "p",
        "executor": "slurm",
        "device": "cuda",
        "gpus_per_node": 8,
        **top,
        "slurm": yaml.safe_load(textwrap.dedent(slurm)),
    }


@pytest.mark.parametrize("name", available_clusters())
def test_every_shipped_profile_loads(name):
    cluster = load_cluster(name)
    if cluster.executor == "slurm":
        executor_parameters(cluster, nodes=1, tasks_per_node=cluster.gpus_per_node, timeout_min=15)


def test_gpu_profiles_are_placeholders_a_user_edits():
    for name in ("a100", "h100", "h200"):
        raw = load_yaml(SHIPPED_DIR / f"{name}.yaml")
        assert set(raw["slurm"]) == {
            "partition",
            "account",
            "qos",
            "constraint",
            "cpus_per_task",
            "mem_per_node_gib",
            "time_limit_min",
            "max_nodes",
            "signal_delay_s",
            "setup",
            "distribution",
            "exclusive",
            "additional_parameters",
        }
        # issue 32: a benchmark's job asks for cores per rank derived from the node and block distribution
        assert (raw["slurm"]["cpus_per_task"], raw["slurm"]["distribution"], raw["slurm"]["exclusive"]) == (
            "auto",
            "block",
            False,
        )
        assert "EDIT" in (SHIPPED_DIR / f"{name}.yaml").read_text()


def test_every_problem_in_a_slurm_block_is_reported_once():
    doc = profile("""
        partiton: gpu
        cpus_per_task: 0
        mem_per_node_gib: -1
        distribution: round_robin
        exclusive: yes please
        time_limit_min: 2
        signal_delay_s: 90
        setup: module load cuda
        additional_parameters: {time: 10, mem: 4G, exclusive: true, reservation: [a]}
    """)
    with pytest.raises(InputError) as raised:
        parse_cluster(doc, "p.yaml")
    lines = [str(p) for p in raised.value.problems]
    assert lines == [
        "p.yaml: slurm.partiton: unknown key; allowed: partition, account, qos, constraint, cpus_per_task, "
        "mem_per_node_gib, time_limit_min, max_nodes, signal_delay_s, setup, distribution, exclusive, "
        "additional_parameters (did you mean 'partition'?)",
        "p.yaml: slurm.cpus_per_task: 0 is not a positive integer or 'auto'",
        "p.yaml: slurm.distribution: 'round_robin' is not one of block, cyclic, plane, arbitrary",
        "p.yaml: slurm.exclusive: 'yes please' must be true or false",
        "p.yaml: slurm.mem_per_node_gib: -1 is not a positive number",
        "p.yaml: slurm.time_limit_min: 2 min leaves no time before submitit's USR2 (signal_delay_s 90 + up to 30 s "
        "of SLURM's check period + start-up): at least 3",
        "p.yaml: slurm.setup: must be a list of shell lines (strings)",
        "p.yaml: slurm.additional_parameters.time: set by the harness for each cell (nodes, tasks, GPUs, time "
        "limit, signal, logs); not settable here",
        "p.yaml: slurm.additional_parameters.mem: use slurm.mem_per_node_gib instead",
        "p.yaml: slurm.additional_parameters.exclusive: use slurm.exclusive instead",
        "p.yaml: slurm.additional_parameters.reservation: ['a'] must be a string, number or true",
    ]


def test_profile_to_submitit_parameters():
    doc = profile(
        """
        partition: gpu
        account: proj
        qos: high
        constraint: h100
        cpus_per_task: 12
        mem_per_node_gib: 800
        signal_delay_s: 120
        setup: [module load cuda/12.4]
        exclusive: true
        additional_parameters: {reservation: bench}
    """,
        env={"NCCL_DEBUG": "WARN"},
    )
    cluster = parse_cluster(doc, "p.yaml")
    assert executor_parameters(cluster, nodes=2, tasks_per_node=8, timeout_min=15) == {
        "nodes": 2,
        "tasks_per_node": 8,
        "timeout_min": 15,
        "gpus_per_node": 8,
        "cpus_per_task": 12,
        "mem_gb": 800,
        "slurm_partition": "gpu",
        "slurm_account": "proj",
        "slurm_qos": "high",
        "slurm_constraint": "h100",
        "slurm_signal_delay_s": 120,
        "slurm_setup": ["module load cuda/12.4"],
        "slurm_additional_parameters": {"distribution": "block", "exclusive": True, "reservation": "bench"},
    }
    cpu = load_cluster("local-slurm")  # ranks, not GPUs: nothing asked of SLURM's gres
    assert "gpus_per_node" not in executor_parameters(cpu, nodes=1, tasks_per_node=2, timeout_min=1)


@pytest.mark.parametrize(
    "time_limit_s,signal_delay_s,cap,minutes",
    [
        (60, 15, None, 1),  # ceil(60 / 60)
        (61, 15, None, 2),
        (60, 90, None, 3),  # USR2 90 s (+30 s) before the end needs 3 minutes
        (900, 90, None, 15),
        (7200, 90, 60, 60),  # the profile's time_limit_min caps it
    ],
)
def test_a_cells_job_time_limit(time_limit_s, signal_delay_s, cap, minutes):
    from harness.scenario.cluster import SlurmProfile

    slurm = SlurmProfile(signal_delay_s=signal_delay_s, time_limit_min=cap)
    assert job_minutes(time_limit_s, slurm) == minutes
    assert min_job_minutes(signal_delay_s) <= minutes


@pytest.mark.parametrize(
    "minutes,cap,packs",
    [
        ([1, 1, 1, 1, 1, 1], 30, [[0, 1, 2, 3, 4, 5]]),  # one job for six 1-minute cells
        ([15, 15, 15], 30, [[0, 1], [2]]),  # the cap splits; nothing is truncated
        ([30, 1, 29, 2], 30, [[0], [1, 2], [3]]),  # in order: a pack never reorders cells
        ([15, 15, 15], None, [[0, 1, 2]]),  # no cap
    ],
)
def test_packs_fit_the_profiles_time_limit(minutes, cap, packs):
    assert split_packs(minutes, cap) == packs
    assert all(cap is None or sum(minutes[i] for i in p) <= cap for p in packs)


def test_pack_needs_a_slurm_profile(tmp_path, capsys):
    from harness.cli import main

    scenario = tmp_path / "s.yaml"
    scenario.write_text("name: s\nmatrix: {model: [tiny], strategy: [ddp], precision: [fp32], gpus: [2]}\n")
    assert main(["sweep", str(scenario), "--results", str(tmp_path / "results"), "--pack"]) == 2
    assert capsys.readouterr().err == (
        "error: --pack: needs a SLURM profile; 'local' runs cells locally, as children of the sweep\n"
    )
    assert not (tmp_path / "results").exists()


@pytest.mark.parametrize("cpus, gpus, per_rank", [(112, 8, 14), (128, 8, 16), (96, 4, 24), (2, 2, 1), (4, 8, 1)])
def test_auto_cores_per_rank_share_the_node_evenly(cpus, gpus, per_rank):
    from harness.launch.slurm.resources import cpus_per_rank

    assert cpus_per_rank(cpus, gpus) == per_rank


def test_auto_cores_per_rank_come_from_the_nodes_cpus():
    cluster = parse_cluster(profile("cpus_per_task: auto"), "p.yaml")  # gpus_per_node 8
    assert executor_parameters(cluster, nodes=1, tasks_per_node=8, timeout_min=5, node_cpus=112)["cpus_per_task"] == 14
    # sinfo did not say: left to the site, never a guess
    assert "cpus_per_task" not in executor_parameters(cluster, nodes=1, tasks_per_node=8, timeout_min=5)


def test_distribution_can_be_left_to_the_site():
    cluster = parse_cluster(profile("distribution: null"), "p.yaml")
    assert "slurm_additional_parameters" not in executor_parameters(cluster, nodes=1, tasks_per_node=2, timeout_min=5)
