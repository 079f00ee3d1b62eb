"""Cluster profiles and the dense peak-FLOPS table used for MFU.

A profile is named (`--cluster a100`) or given by path. A name is looked up in the project's own profiles first,
`scenarios/clusters/NAME.yaml` under the current directory (a site's edited copy), then in the profiles shipped
with the package (harness/scenario/clusters/, package data: `local`, `local-gpu`, `local-slurm`, `a100`, `h100`,
`h200`). Nothing here reaches outside the package by path.

Pure: no torch import.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness.core.errors import InputError, Problem, one_of, unknown
from harness.scenario.performance import Performance, parse_performance
from harness.scenario.schema import NAME_RE
from harness.scenario.yaml_file import load_yaml

SHIPPED_DIR = Path(__file__).resolve().parent / "clusters"
"""the profiles shipped with the package"""
PROJECT_DIR = Path("scenarios") / "clusters"
"""a project's own profiles, relative to the current directory; a name found there wins over a shipped one"""
EXECUTORS = ("local", "slurm")
DEVICES = ("cpu", "cuda")
CPU_ALLOCATORS = ("caching", "system")


@dataclass(frozen=True)
class Peak:
    """Dense (no sparsity) peak throughput of one device, TFLOPS per precision, with where each number comes from."""

    name: str
    match: tuple[str, ...]
    """substrings of torch.cuda.get_device_name() that identify the device (all must appear)"""
    tflops: dict[str, float]
    """precision → dense TFLOPS: fp32 (CUDA cores, TF32 off), tf32, bf16, fp16 (tensor cores)"""
    source: str


# source: vendor datasheets; dense numbers only (the datasheets' headline tensor numbers are 2:4 sparse, halve them)
# NOTE: first match wins: the NVL (PCIe-card, lower-clocked) parts come before the SXM entries whose match they also
# satisfy ("NVIDIA H200 NVL" contains "H200")
PEAKS: tuple[Peak, ...] = (
    Peak(
        "H200 NVL",
        ("H200", "NVL"),
        {"fp32": 60.0, "tf32": 417.5, "bf16": 835.5, "fp16": 835.5},
        # source: NVIDIA H200 Tensor Core GPU datasheet, H200 NVL column: FP32 60 TF; TF32 835, BF16/FP16 1,671 TF
        # with sparsity
        "NVIDIA H200 datasheet (NVL), sparse tensor figures halved",
    ),
    Peak(
        "H100 NVL",
        ("H100", "NVL"),
        {"fp32": 60.0, "tf32": 417.5, "bf16": 835.5, "fp16": 835.5},
        # source: NVIDIA H100 Tensor Core GPU datasheet, H100 NVL column: FP32 60 TF; TF32 835, BF16/FP16 1,671 TF
        # with sparsity
        "NVIDIA H100 datasheet (NVL), sparse tensor figures halved",
    ),
    Peak(
        "H200",
        ("H200",),
        {"fp32": 67.0, "tf32": 494.7, "bf16": 989.4, "fp16": 989.4},
        # source: NVIDIA H200 Tensor Core GPU datasheet (SXM): FP32 67 TF; TF32 989, BF16/FP16 1,979 TF with sparsity
        "NVIDIA H200 datasheet (SXM), sparse tensor figures halved",
    ),
    Peak(
        "H100 SXM",
        ("H100", "HBM3"),
        {"fp32": 67.0, "tf32": 494.7, "bf16": 989.4, "fp16": 989.4},
        # source: NVIDIA H100 datasheet, SXM5: FP32 67 TF; TF32 989, BF16/FP16 1,979 TF with sparsity
        "NVIDIA H100 datasheet (SXM5), sparse tensor figures halved",
    ),
    Peak(
        "H100 PCIe",
        ("H100", "PCIe"),
        {"fp32": 51.0, "tf32": 378.0, "bf16": 756.0, "fp16": 756.0},
        # source: NVIDIA H100 datasheet, PCIe: FP32 51 TF; TF32 756, BF16/FP16 1,513 TF with sparsity
        "NVIDIA H100 datasheet (PCIe), sparse tensor figures halved",
    ),
    Peak(
        "A100",
        ("A100",),
        {"fp32": 19.5, "tf32": 156.0, "bf16": 312.0, "fp16": 312.0},
        # source: NVIDIA A100 datasheet: FP32 19.5 TF; TF32 156, BF16/FP16 312 TF dense
        "NVIDIA A100 datasheet (dense)",
    ),
)


def find_peak(device_name: str | None) -> Peak | None:
    """The table entry for a device name as torch reports it, or None (then MFU is null)."""
    if not device_name:
        return None
    for peak in PEAKS:
        if all(m in device_name for m in peak.match):
            return peak
    return None


SLURM_CHECK_PERIOD_S = 30
"""SLURM checks time limits about this often, so submitit's USR2 can come this much earlier than asked (s)"""
START_MARGIN_S = 15
"""start-up a task needs before submitit's USR2 handler is installed, with margin (s)"""


def min_job_minutes(signal_delay_s: int) -> int:
    """The shortest --time (min) at which USR2 cannot arrive before a task has started: a shorter limit sends it
    in the job's first seconds, and the task dies of the signal (docs/slurm.md)."""
    return math.ceil((signal_delay_s + SLURM_CHECK_PERIOD_S + START_MARGIN_S) / 60)


@dataclass(frozen=True)
class SlurmProfile:
    """A profile's `slurm:` block: how each cell's job is requested (sbatch options, through submitit).

    Every key is optional; None leaves the option to the site's default.
    """

    partition: str | None = None
    """--partition"""
    account: str | None = None
    """--account"""
    qos: str | None = None
    """--qos"""
    constraint: str | None = None
    """--constraint: node features, e.g. "h100&ib" """
    cpus_per_task: int | str | None = None
    """--cpus-per-task: CPU cores per rank (a rank is one task); "auto": the partition's CPUs per node divided by
    gpus_per_node (sinfo, at submission: harness.launch.slurm.resources.node_cpus_for), so a rank's host thread,
    NCCL's proxy thread, compile workers and CPU Adam do not share one core"""
    mem_per_node_gib: float | None = None
    """--mem per node, GiB (2**30; SLURM's G)"""
    time_limit_min: int | None = None
    """the longest --time a cell's job may ask for (min), e.g. the partition's MaxTime; a cell asks for
    ceil(settings.time_limit_s / 60), at least min_job_minutes(signal_delay_s), at most this"""
    max_nodes: int | None = None
    """the most nodes a cell's job may ask for, e.g. the partition's node count: a cell needing more is `skipped`
    before submission (harness.plan.placement); None leaves it to sbatch, which refuses what its partition lacks"""
    signal_delay_s: int = 90
    """submitit's USR2 warning comes this long before the limit (s), plus up to SLURM_CHECK_PERIOD_S"""
    setup: tuple[str, ...] = ()
    """shell lines run in the sbatch script before srun (module load, source .venv/bin/activate)"""
    distribution: str | None = "block"
    """--distribution: how tasks are laid onto nodes; block (the default) numbers ranks node by node, which the
    hybrid meshes assume (the worker checks it); None leaves it to the site"""
    exclusive: bool = False
    """--exclusive: no other job on the cell's nodes (measurements free of neighbours; costs whole nodes)"""
    additional_parameters: dict[str, Any] = field(default_factory=dict)
    """any other #SBATCH option, e.g. {reservation: name} (underscores become dashes)"""


SLURM_KEYS = (
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
)
CPUS_PER_TASK_AUTO = "auto"
"""slurm.cpus_per_task: derive it from the partition's nodes (CPUs per node / gpus_per_node)"""
DISTRIBUTIONS = ("block", "cyclic", "plane", "arbitrary")
"""--distribution's first (node) level; a value may add the socket and core levels after colons (block:block)"""
# sbatch options the harness sets per cell, and those a key of the `slurm:` block sets
SLURM_PER_CELL = (
    "nodes",
    "ntasks",
    "ntasks_per_node",
    "time",
    "signal",
    "array",
    "output",
    "error",
    "job_name",
    "gpus",
    "gpus_per_node",
    "gres",
    "open_mode",
)
SLURM_OWN_KEY = {
    "partition": "partition",
    "account": "account",
    "qos": "qos",
    "constraint": "constraint",
    "cpus_per_task": "cpus_per_task",
    "mem": "mem_per_node_gib",
    "distribution": "distribution",
    "exclusive": "exclusive",
}


def _positive_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v >= 1


def parse_slurm(doc: Any, file: str, problems: list[Problem]) -> SlurmProfile:
    """The `slurm:` block, every problem appended to `problems` (the caller raises once)."""
    if doc is None:
        return SlurmProfile()
    if not isinstance(doc, dict):
        problems.append(Problem(file, "slurm", "must be a mapping"))
        return SlurmProfile()
    n0 = len(problems)
    for k in doc:
        if k not in SLURM_KEYS:
            problems.append(unknown(file, f"slurm.{k}", k, SLURM_KEYS))
    for k in ("partition", "account", "qos", "constraint"):
        v = doc.get(k)
        if v is not None and (not isinstance(v, str) or not v.strip()):
            problems.append(Problem(file, f"slurm.{k}", f"{v!r} must be a non-empty string or null"))
    for k in ("cpus_per_task", "time_limit_min", "max_nodes"):
        v = doc.get(k)
        if v is not None and not _positive_int(v) and not (k == "cpus_per_task" and v == CPUS_PER_TASK_AUTO):
            also = f" or {CPUS_PER_TASK_AUTO!r}" if k == "cpus_per_task" else ""
            problems.append(Problem(file, f"slurm.{k}", f"{v!r} is not a positive integer{also}"))
    dist = doc.get("distribution", "block")
    if dist is not None and (not isinstance(dist, str) or dist.split(":")[0] not in DISTRIBUTIONS):
        problems.append(Problem(file, "slurm.distribution", one_of(dist, DISTRIBUTIONS)))
    if not isinstance(doc.get("exclusive", False), bool):
        problems.append(Problem(file, "slurm.exclusive", f"{doc.get('exclusive')!r} must be true or false"))
    mem = doc.get("mem_per_node_gib")
    if mem is not None and (not isinstance(mem, (int, float)) or isinstance(mem, bool) or mem <= 0):
        problems.append(Problem(file, "slurm.mem_per_node_gib", f"{mem!r} is not a positive number"))
    delay = doc.get("signal_delay_s", 90)
    if not isinstance(delay, int) or isinstance(delay, bool) or delay < 0:
        problems.append(Problem(file, "slurm.signal_delay_s", f"{delay!r} is not a whole number of seconds >= 0"))
    elif _positive_int(doc.get("time_limit_min")) and doc["time_limit_min"] < min_job_minutes(delay):
        problems.append(
            Problem(
                file,
                "slurm.time_limit_min",
                f"{doc['time_limit_min']} min leaves no time before submitit's USR2 (signal_delay_s "
                f"{delay} + up to {SLURM_CHECK_PERIOD_S} s of SLURM's check period + start-up): "
                f"at least {min_job_minutes(delay)}",
            )
        )
    setup = doc.get("setup") or []
    if not isinstance(setup, list) or not all(isinstance(line, str) for line in setup):
        problems.append(Problem(file, "slurm.setup", "must be a list of shell lines (strings)"))
    extra = doc.get("additional_parameters") or {}
    if not isinstance(extra, dict):
        problems.append(Problem(file, "slurm.additional_parameters", "must be a mapping of sbatch options"))
        extra = {}
    for k, v in extra.items():
        where = f"slurm.additional_parameters.{k}"
        norm = str(k).replace("-", "_")
        if norm in SLURM_PER_CELL:
            problems.append(
                Problem(
                    file,
                    where,
                    "set by the harness for each cell (nodes, tasks, GPUs, time "
                    "limit, signal, logs); not settable here",
                )
            )
        elif norm in SLURM_OWN_KEY:
            problems.append(Problem(file, where, f"use slurm.{SLURM_OWN_KEY[norm]} instead"))
        elif not isinstance(v, (str, int, float, bool)):
            problems.append(Problem(file, where, f"{v!r} must be a string, number or true"))
    if len(problems) > n0:
        return SlurmProfile()
    return SlurmProfile(
        partition=doc.get("partition"),
        account=doc.get("account"),
        qos=doc.get("qos"),
        constraint=doc.get("constraint"),
        cpus_per_task=doc.get("cpus_per_task"),
        mem_per_node_gib=doc.get("mem_per_node_gib"),
        time_limit_min=doc.get("time_limit_min"),
        max_nodes=doc.get("max_nodes"),
        signal_delay_s=delay,
        setup=tuple(setup),
        distribution=dist,
        exclusive=doc.get("exclusive", False),
        additional_parameters=dict(extra),
    )


@dataclass(frozen=True)
class Cluster:
    """A cluster profile: where cells run and what the devices are."""

    name: str
    path: str
    executor: str = "local"
    """local (submitit LocalExecutor on this machine) or slurm"""
    device: str = "cpu"
    """cpu (gloo) or cuda (nccl)"""
    gpus_per_node: int = 2
    """ranks per node; locally, ranks per simulated node (hybrids group ranks by it)"""
    device_memory_gib: float | None = None
    """memory per device (GiB = 2**30); None = unknown"""
    pg_timeout_s: float = 300.0
    """process-group (collective watchdog) timeout, applied to every group (s)"""
    max_local_ranks: int | None = None
    """local profiles: the most ranks (processes) one cell may start on this machine; None derives it from the
    machine's cores and available memory (CPU) or its visible GPUs (harness.plan.placement)"""
    description: str = ""
    env: dict[str, str] = field(default_factory=dict)
    """environment variables set in every rank (NCCL_* and friends)"""
    cpu_allocator: str = "caching"
    """CPU ranks (and the calibration): 'caching' keeps freed memory in the process, as PyTorch's CUDA allocator
    does on a GPU; 'system' leaves glibc's defaults (harness.worker.allocator)"""
    checkpoint_dir: str | None = None
    """where `checkpoint: true` cells write their checkpoints (an absolute path; on SLURM a file system every node
    shares); None: a temp folder under the sweep's results folder. Each cell's is deleted after it is measured"""
    slurm: SlurmProfile = field(default_factory=SlurmProfile)
    """how cells' jobs are requested when executor is slurm (partition, account, time limits, ...)"""
    performance: Performance = field(default_factory=Performance)
    """achievable rates (with sources) the step-time model uses without a calibration file (harness.plan.time)"""

    @property
    def backend(self) -> str:
        return "nccl" if self.device == "cuda" else "gloo"


CLUSTER_KEYS = (
    "name",
    "description",
    "executor",
    "device",
    "gpus_per_node",
    "device_memory_gib",
    "pg_timeout_s",
    "max_local_ranks",
    "env",
    "cpu_allocator",
    "checkpoint_dir",
    "slurm",
    "performance",
)


def parse_cluster(doc: Any, file: str) -> Cluster:
    problems: list[Problem] = []
    if not isinstance(doc, dict):
        raise InputError([Problem(file, "", "a cluster profile must be a mapping")])
    for k in doc:
        if k not in CLUSTER_KEYS:
            problems.append(unknown(file, str(k), k, CLUSTER_KEYS))
    name = doc.get("name", Path(file).stem)
    if not isinstance(name, str) or not NAME_RE.match(name):
        problems.append(Problem(file, "name", f"{name!r} must match {NAME_RE.pattern}"))
    if doc.get("executor", "local") not in EXECUTORS:
        problems.append(Problem(file, "executor", one_of(doc.get("executor"), EXECUTORS)))
    if doc.get("device", "cpu") not in DEVICES:
        problems.append(Problem(file, "device", one_of(doc.get("device"), DEVICES)))
    gpn = doc.get("gpus_per_node", 2)
    if not isinstance(gpn, int) or isinstance(gpn, bool) or gpn < 1:
        problems.append(Problem(file, "gpus_per_node", f"{gpn!r} is not a positive integer"))
    for k in ("device_memory_gib", "pg_timeout_s"):
        v = doc.get(k)
        if v is not None and (not isinstance(v, (int, float)) or isinstance(v, bool) or v <= 0):
            problems.append(Problem(file, k, f"{v!r} is not a positive number"))
    max_local = doc.get("max_local_ranks")
    if max_local is not None and not _positive_int(max_local):
        problems.append(Problem(file, "max_local_ranks", f"{max_local!r} is not a positive integer"))
    elif max_local is not None and doc.get("executor", "local") == "slurm":
        problems.append(
            Problem(
                file,
                "max_local_ranks",
                "only for executor: local (a SLURM profile limits a cell by slurm.max_nodes x gpus_per_node)",
            )
        )
    if doc.get("cpu_allocator", "caching") not in CPU_ALLOCATORS:
        problems.append(Problem(file, "cpu_allocator", one_of(doc.get("cpu_allocator"), CPU_ALLOCATORS)))
    ckpt_dir = doc.get("checkpoint_dir")
    if ckpt_dir is not None and (not isinstance(ckpt_dir, str) or not Path(ckpt_dir).expanduser().is_absolute()):
        problems.append(
            Problem(file, "checkpoint_dir", f"{ckpt_dir!r} is not an absolute path (a folder every node can reach)")
        )
    if doc.get("env") is not None and not isinstance(doc.get("env"), dict):
        problems.append(Problem(file, "env", "must be a mapping"))
    slurm = parse_slurm(doc.get("slurm"), file, problems)
    performance = parse_performance(doc.get("performance"), file, problems)
    env = doc.get("env") or {}
    if isinstance(env, dict):
        for k, v in env.items():
            if not isinstance(v, (str, int, float)) or isinstance(v, bool):
                problems.append(Problem(file, f"env.{k}", f"{v!r} must be a string or number"))
    if problems:
        raise InputError(problems)
    return Cluster(
        name=name,
        path=file,
        executor=doc.get("executor", "local"),
        device=doc.get("device", "cpu"),
        gpus_per_node=gpn,
        device_memory_gib=doc.get("device_memory_gib"),
        pg_timeout_s=float(doc.get("pg_timeout_s", 300.0)),
        max_local_ranks=max_local,
        description=doc.get("description", "") or "",
        env={str(k): str(v) for k, v in env.items()},
        cpu_allocator=doc.get("cpu_allocator", "caching"),
        checkpoint_dir=None if ckpt_dir is None else str(Path(ckpt_dir).expanduser()),
        slurm=slurm,
        performance=performance,
    )


def cluster_dirs() -> tuple[Path, ...]:
    """Where profile names are looked up, first match wins: the project's, then the shipped ones."""
    return (PROJECT_DIR, SHIPPED_DIR)


def available_clusters() -> list[str]:
    return sorted({p.stem for d in cluster_dirs() for p in d.glob("*.yaml")})


def profile_path(name: str) -> Path | None:
    """The file of the profile called `name` (cluster_dirs' first match), or None."""
    return next((p for d in cluster_dirs() if (p := d / f"{name}.yaml").is_file()), None)


def load_cluster(name_or_path: str) -> Cluster:
    """A profile by name (the project's scenarios/clusters/NAME.yaml, else the shipped one) or by path: a value
    ending in .yaml or .yml, or with a folder in it (`./site/h100`, `~/h100`: a name has none), whose file may leave
    out its .yaml."""
    p = Path(name_or_path).expanduser()
    if p.suffix in (".yaml", ".yml"):
        return parse_cluster(load_yaml(p), str(p))
    if is_path(name_or_path):
        tried = [p, *(p.with_name(p.name + suffix) for suffix in (".yaml", ".yml"))]
        found = next((t for t in tried if t.is_file()), None)
        if found is None:
            raise InputError(
                [Problem("--cluster", "", f"{name_or_path}: no such profile file ({', '.join(map(str, tried))})")]
            )
        return parse_cluster(load_yaml(found), str(found))
    named = profile_path(name_or_path)
    if named is None:
        raise InputError([Problem("--cluster", "", one_of(name_or_path, available_clusters()))])
    return parse_cluster(load_yaml(named), str(named))


def is_path(name_or_path: str) -> bool:
    """Whether a `--cluster` value is a path rather than a profile's name: a name (NAME_RE) has no folder in it."""
    return "/" in name_or_path or os.sep in name_or_path or name_or_path.startswith("~")
