"""Where a cell's ranks sit and which link each of its process groups runs on: what the step-time model reads of a
cluster profile (`ClusterView`), frozen and hashable so that its caches key on it (a profile holds dicts: its
environment, its SLURM options). Pure, no torch.
"""

from __future__ import annotations

from dataclasses import dataclass

from harness.scenario.cluster import Cluster
from harness.scenario.spec import RunSpec

POINT_TO_POINT = ("send", "recv")
"""a pipeline's transfers between neighbouring stages (harness.plan.layouts), priced by `Rates.p2p_s`"""


@dataclass(frozen=True)
class ClusterView:
    """Exactly what the step-time model reads of a cluster profile."""

    executor: str
    """local (every rank of a cell on this host, simulated nodes share it) or slurm (a node's ranks share one)"""
    device: str
    """cpu or cuda: MFU needs a GPU's peak"""
    description: str
    """the profile's description: names the GPU when the rates do not (MFU's peak)"""

    @classmethod
    def of(cls, cluster: Cluster | ClusterView) -> ClusterView:
        if isinstance(cluster, ClusterView):
            return cluster
        return cls(executor=cluster.executor, device=cluster.device, description=cluster.description)


def host_ranks(gpus: int, gpus_per_node: int, *, executor: str) -> int:
    """Ranks of a cell that share one host: all of them on a local profile, a node's on SLURM."""
    return gpus if executor == "local" else min(gpus, gpus_per_node)


def ranks_on_host(spec: RunSpec, cluster: Cluster | ClusterView) -> int:
    """Ranks of the cell that share one host (`host_ranks`)."""
    return host_ranks(spec.gpus, spec.gpus_per_node, executor=cluster.executor)


def link_of(kind: str, cluster: Cluster | ClusterView) -> str:
    """The link a group kind runs on in `cluster` (`link_on`)."""
    return link_on(kind, executor=cluster.executor)


def link_on(kind: str, *, executor: str) -> str:
    """The link a group kind runs on: "self" (one rank), "intra" (one host or node), "inter" (one rank per node,
    across nodes) or "mixed" (several ranks on each of several nodes: NCCL's rings cross every node through all its
    NICs at once; a calibration prices it as "inter"). A local profile's simulated nodes share one host."""
    if kind == "self":
        return "self"
    if executor == "local" or kind == "intra":
        return "intra"
    return "mixed" if kind == "mixed" else "inter"
