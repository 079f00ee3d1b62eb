"""What a cell's SLURM job asks of a node besides its GPUs: cores per rank for `slurm.cpus_per_task: auto`, from the
partition's nodes as sinfo reports them.

Why a module of its own: it is the one place the sweep asks SLURM about its nodes' size (harness.launch.slurm.jobs
and harness.calibrate.run submit with it); the profile only says `auto` (harness.scenario.cluster).
"""

from __future__ import annotations

import functools
import subprocess

from harness.scenario.cluster import CPUS_PER_TASK_AUTO, Cluster

SINFO_TIMEOUT_S = 30
"""how long the check before a sweep, `harness status` and the node-size query wait for SLURM's answer (s)"""


def cpus_per_rank(cpus_per_node: int, gpus_per_node: int) -> int:
    """Cores per rank when a node's CPUs are shared evenly by its GPUs' ranks (at least 1)."""
    return max(1, cpus_per_node // max(1, gpus_per_node))


@functools.cache
def partition_cpus_per_node(partition: str | None) -> int | None:
    """The fewest CPUs a node of `partition` (the default partition: None) has, as sinfo reports them (%c), or
    None when sinfo does not say (then --cpus-per-task is left to the site)."""
    cmd = ["sinfo", "--noheader", "--format=%c"] + ([f"--partition={partition}"] if partition else [])
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=SINFO_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired):
        return None
    counts = [int(x.rstrip("+")) for x in out.stdout.split() if x.rstrip("+").isdigit()]
    return min(counts) if out.returncode == 0 and counts else None


def node_cpus_for(cluster: Cluster) -> int | None:
    """What executor_parameters needs for slurm.cpus_per_task "auto": the partition's CPUs per node (sinfo, once
    per partition); None when the profile does not ask for auto or sinfo does not say."""
    if cluster.slurm.cpus_per_task != CPUS_PER_TASK_AUTO:
        return None
    return partition_cpus_per_node(cluster.slurm.partition)
