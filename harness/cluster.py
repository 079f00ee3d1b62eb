"""Cluster profiles (scenarios/clusters/*.yaml) and the dense peak-FLOPS table used for MFU.

Pure: no torch import.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness.errors import InputError, Problem, did_you_mean, one_of
from harness.scenario import NAME_RE, load_yaml

CLUSTERS_DIR = Path(__file__).resolve().parent.parent / "scenarios" / "clusters"
EXECUTORS = ("local", "slurm")
DEVICES = ("cpu", "cuda")


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
PEAKS: tuple[Peak, ...] = (
    Peak("H200", ("H200",), {"fp32": 67.0, "tf32": 494.7, "bf16": 989.4, "fp16": 989.4},
         # source: NVIDIA H200 Tensor Core GPU datasheet (SXM): FP32 67 TF; TF32 989, BF16/FP16 1,979 TF with sparsity
         "NVIDIA H200 datasheet (SXM), sparse tensor figures halved"),
    Peak("H100 SXM", ("H100", "HBM3"), {"fp32": 67.0, "tf32": 494.7, "bf16": 989.4, "fp16": 989.4},
         # source: NVIDIA H100 datasheet, SXM5: FP32 67 TF; TF32 989, BF16/FP16 1,979 TF with sparsity
         "NVIDIA H100 datasheet (SXM5), sparse tensor figures halved"),
    Peak("H100 PCIe", ("H100", "PCIe"), {"fp32": 51.0, "tf32": 378.0, "bf16": 756.0, "fp16": 756.0},
         # source: NVIDIA H100 datasheet, PCIe: FP32 51 TF; TF32 756, BF16/FP16 1,513 TF with sparsity
         "NVIDIA H100 datasheet (PCIe), sparse tensor figures halved"),
    Peak("A100", ("A100",), {"fp32": 19.5, "tf32": 156.0, "bf16": 312.0, "fp16": 312.0},
         # source: NVIDIA A100 datasheet: FP32 19.5 TF; TF32 156, BF16/FP16 312 TF dense
         "NVIDIA A100 datasheet (dense)"),
)


def find_peak(device_name: str | None) -> Peak | None:
    """The table entry for a device name as torch reports it, or None (then MFU is null)."""
    if not device_name:
        return None
    for peak in PEAKS:
        if all(m in device_name for m in peak.match):
            return peak
    return None


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
    description: str = ""
    env: dict[str, str] = field(default_factory=dict)
    """environment variables set in every rank (NCCL_* and friends)"""
    slurm: dict[str, Any] = field(default_factory=dict)
    """SLURM executor parameters (partition, account, qos, ...); used when executor is slurm"""

    @property
    def backend(self) -> str:
        return "nccl" if self.device == "cuda" else "gloo"


CLUSTER_KEYS = ("name", "description", "executor", "device", "gpus_per_node", "device_memory_gib",
                "pg_timeout_s", "env", "slurm")


def parse_cluster(doc: Any, file: str) -> Cluster:
    problems: list[Problem] = []
    if not isinstance(doc, dict):
        raise InputError([Problem(file, "", "a cluster profile must be a mapping")])
    for k in doc:
        if k not in CLUSTER_KEYS:
            problems.append(Problem(file, str(k), f"unknown key; allowed: {', '.join(CLUSTER_KEYS)}"
                                    f"{did_you_mean(k, CLUSTER_KEYS)}"))
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
    for k in ("env", "slurm"):
        v = doc.get(k)
        if v is not None and not isinstance(v, dict):
            problems.append(Problem(file, k, "must be a mapping"))
    env = doc.get("env") or {}
    if isinstance(env, dict):
        for k, v in env.items():
            if not isinstance(v, (str, int, float)) or isinstance(v, bool):
                problems.append(Problem(file, f"env.{k}", f"{v!r} must be a string or number"))
    if problems:
        raise InputError(problems)
    return Cluster(
        name=name, path=file, executor=doc.get("executor", "local"), device=doc.get("device", "cpu"),
        gpus_per_node=gpn, device_memory_gib=doc.get("device_memory_gib"),
        pg_timeout_s=float(doc.get("pg_timeout_s", 300.0)), description=doc.get("description", "") or "",
        env={str(k): str(v) for k, v in env.items()}, slurm=dict(doc.get("slurm") or {}),
    )


def available_clusters() -> list[str]:
    return sorted(p.stem for p in CLUSTERS_DIR.glob("*.yaml"))


def load_cluster(name_or_path: str) -> Cluster:
    """A profile by name (scenarios/clusters/NAME.yaml) or by path."""
    p = Path(name_or_path)
    if p.suffix not in (".yaml", ".yml"):
        p = CLUSTERS_DIR / f"{name_or_path}.yaml"
        if not p.exists():
            names = available_clusters()
            raise InputError([Problem("--cluster", "", one_of(name_or_path, names))])
    return parse_cluster(load_yaml(p), str(p))
