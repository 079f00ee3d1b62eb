"""Whether a cluster can place a cell at all, decided before anything launches.

A local cell's ranks are processes on this machine, which hosts only so many: the limit comes from its cores and
available memory (or the profile's `max_local_ranks`), and on a local GPU profile from the GPUs it shows (from
cores and memory when they cannot be counted). A SLURM
cell is one job of `nodes` nodes with the same number of tasks on each, at most `slurm.max_nodes` nodes when the
profile says. A cell beyond its cluster is `skipped` by the sweep with the reason and marked by `harness plan`:
launched, a 100000-rank cell started a process per rank until the machine gave out.

A local CPU cell's ranks also keep their tensors in this machine's memory: the planner's memory per rank times the
ranks is compared with what the host can spare (MemAvailable, read once), and a cell beyond it is skipped too
(`host_memory_refusal`; `--no-skip` runs it, as it runs a cell predicted not to fit its devices). Launched, a 1.3B
DDP cell of two ranks asked a 23 GiB host for 41 GiB: the host swaps, or the kernel kills some other process.

Why a module of its own: the sweep (harness.launch) and `harness plan` must refuse the same cells, and `plan`
imports no torch. Pure apart from reading this machine's cores, /proc/meminfo and CUDA_VISIBLE_DEVICES.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

from harness.scenario.cluster import Cluster
from harness.scenario.spec import RunSpec

if TYPE_CHECKING:
    from harness.plan.prediction import Prediction

RANKS_PER_CORE = 4
"""local CPU ranks one core may host: gloo ranks spend much of a step waiting on each other's collectives"""
MIN_LOCAL_RANKS = 8
"""the core-derived limit is never below this: a 2-core laptop still runs 4-rank hybrids, and tests run 8 ranks"""
RANK_RSS_GIB = 0.3
"""host memory one local CPU rank needs at least (GiB = 2**30): an interpreter with torch imported; the tiny
model's gloo ranks peak at 0.28-0.29 GiB RSS in the smoke sweep"""


@dataclass(frozen=True)
class Capacity:
    """The most ranks one cell may have on a cluster, and what sets that number."""

    ranks: int | None
    """None: not checked here (a SLURM profile without slurm.max_nodes leaves it to sbatch)"""
    source: str
    """where the limit comes from and how to change it: the end of a refusal's sentence"""
    unit: str = "rank"
    """what a cell needs, as said in a refusal: rank (local CPU), GPU (local GPU), node (SLURM)"""
    host_memory_gib: float | None = None
    """memory a local CPU cell's ranks may take between them (GiB = 2**30): this machine's MemAvailable when read;
    None: not checked (a GPU's memory is the profile's device_memory_gib, a SLURM node is not this machine)"""


def host_cores() -> int:
    """Cores this process may run on (its CPU affinity, as a container or `taskset` limits it)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def mem_available_gib() -> float | None:
    """MemAvailable of /proc/meminfo (GiB), or None where there is none."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024 / 2**30
    except (OSError, ValueError, IndexError):
        return None
    return None


def parse_visible_devices(value: str) -> list[int] | None:
    """CUDA_VISIBLE_DEVICES as GPU indices, or None when it names GPUs by UUID or MIG id (not counted)."""
    items = [x.strip() for x in value.split(",") if x.strip()]
    return [int(x) for x in items] if all(x.isdigit() for x in items) else None


def visible_gpus() -> list[int] | None:
    """The GPUs this machine shows, without importing torch: CUDA_VISIBLE_DEVICES when set, else one per entry of
    the NVIDIA driver's /proc/driver/nvidia/gpus; None when unknown (no driver directory, GPUs named by UUID).
    The sweep asks torch instead (harness.launch.local.launchers.local_gpus)."""
    env = os.environ.get("CUDA_VISIBLE_DEVICES")
    if env is not None:
        return parse_visible_devices(env)
    driver = Path("/proc/driver/nvidia/gpus")
    return list(range(len(list(driver.iterdir())))) if driver.is_dir() else None


def local_cpu_ranks(*, cores: int, mem_gib: float | None) -> Capacity:
    """What this machine can host without a profile's `max_local_ranks`: RANKS_PER_CORE per core (at least
    MIN_LOCAL_RANKS), and no more ranks than RANK_RSS_GIB each fit in the available memory."""
    by_cores = max(MIN_LOCAL_RANKS, RANKS_PER_CORE * cores)
    why = f"{RANKS_PER_CORE} per core x {cores} core{'s' * (cores != 1)}, at least {MIN_LOCAL_RANKS}"
    ranks = by_cores
    if mem_gib is not None:
        by_memory = int(mem_gib / RANK_RSS_GIB)
        why += f"; memory for {by_memory}: {mem_gib:.1f} GiB available, {RANK_RSS_GIB:g} GiB per rank"
        ranks = min(by_cores, by_memory)
    return Capacity(ranks, f"it hosts at most {ranks} ({why}); max_local_ranks in the cluster profile overrides")


def capacity(
    cluster: Cluster,
    *,
    gpus: Callable[[], list[int] | None] = visible_gpus,
    cores: Callable[[], int] = host_cores,
    mem_gib: Callable[[], float | None] = mem_available_gib,
) -> Capacity:
    """The cluster's limit on one cell. `gpus`, `cores`, `mem_gib` read this machine (only a local profile asks):
    the sweep passes torch's view of the GPUs, tests a machine of their own."""
    if cluster.executor == "slurm":
        n = cluster.slurm.max_nodes
        if n is None:
            return Capacity(None, "slurm.max_nodes unset: sbatch refuses a job larger than its partition", "node")
        return Capacity(
            n * cluster.gpus_per_node, f"the profile allows at most {n} (slurm.max_nodes in {cluster.path})"
        )
    override = cluster.max_local_ranks
    if cluster.device == "cuda":
        listed = gpus()
        env = os.environ.get("CUDA_VISIBLE_DEVICES")
        shown = "CUDA_VISIBLE_DEVICES unset" if env is None else f"CUDA_VISIBLE_DEVICES={env!r}"
        if listed is not None and (override is None or len(listed) <= override):
            return Capacity(len(listed), f"{len(listed)} visible ({shown})", "GPU")
        if override is None:  # NOTE: GPUs that cannot be counted: every rank is still a process on this machine
            return local_cpu_ranks(cores=cores(), mem_gib=mem_gib())
        return Capacity(override, f"the profile allows at most {override} (max_local_ranks in {cluster.path})", "GPU")
    # NOTE: a CPU profile's ranks keep their tensors in host memory: read once, for the ranks' limit and for
    # host_memory_refusal alike
    host = mem_gib()
    if override is None:
        return replace(local_cpu_ranks(cores=cores(), mem_gib=host), host_memory_gib=host)
    source = f"the profile allows at most {override} (max_local_ranks in {cluster.path})"
    return Capacity(override, source, "rank", host_memory_gib=host)


def placement_refusal(spec: RunSpec, cluster: Cluster, cap: Capacity) -> str | None:
    """Why `cluster` cannot place this cell (the reason of its `skipped` record), or None."""
    if cluster.executor == "slurm":
        if spec.gpus % spec.gpus_per_node:
            return (
                f"gpus {spec.gpus} is not a multiple of {spec.gpus_per_node} ranks per node: a SLURM "
                "job runs the same number of tasks on each of its nodes"
            )
        if cap.ranks is not None and spec.gpus > cap.ranks:
            return f"needs {spec.nodes} nodes of {spec.gpus_per_node} tasks; {cap.source}"
        return None
    if cap.ranks is None or spec.gpus <= cap.ranks:
        return None
    return f"needs {spec.gpus} {cap.unit}{'s' * (spec.gpus != 1)} on this machine; {cap.source}"


def host_gib_per_rank(predicted: Prediction) -> float | None:
    """Host memory one local CPU rank takes (GiB): its predicted peak (device and offloaded parts: both are this
    machine's memory on a CPU profile) plus RANK_RSS_GIB for the interpreter and torch; None where the planner
    predicts no memory (a cell that cannot run)."""
    mem = predicted.memory_gib
    if mem is None or mem.total is None:
        return None
    return float(mem.total) + float(predicted.cpu_memory_gib or 0.0) + RANK_RSS_GIB


def host_memory_refusal(spec: RunSpec, *, predicted: Prediction | None, cap: Capacity) -> str | None:
    """Why this machine cannot hold the cell's ranks (every one of a local CPU cell is a process here), or None:
    the planner's memory per rank (`host_gib_per_rank`) times the ranks, against `cap.host_memory_gib`. The sweep
    skips such a cell unless --no-skip; `harness plan` marks it."""
    avail = cap.host_memory_gib
    per_rank = None if predicted is None else host_gib_per_rank(predicted)
    if avail is None or per_rank is None or spec.gpus * per_rank <= avail:
        return None
    ranks = spec.gpus
    return (
        f"{ranks} rank{'s' * (ranks != 1)} x {per_rank:.1f} GiB = {ranks * per_rank:.1f} GiB of host memory "
        f"({per_rank - RANK_RSS_GIB:.1f} GiB predicted per rank + {RANK_RSS_GIB:g} GiB for the interpreter and torch) "
        f"> {avail:.1f} GiB available (MemAvailable)"
    )
