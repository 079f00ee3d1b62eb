"""Where a cell's ranks sit and which link each of its process groups runs on: what the step-time model reads of a
cluster profile (`ClusterView`), frozen and hashable so that its caches key on it (a profile holds dicts: its
environment, its SLURM options). Pure, no torch.

A group's kind (`box_kind`, `mesh_group_kind`) is worked out from the mesh's arithmetic, never from a list of its
ranks: a group is a box of the mesh (rank 0 plus every combination of its dimensions' steps), so its size, its
first and last rank and the residues of its ranks modulo a node say where it lies, in memory and time that do not
grow with the ranks (listed, a plan at 1,048,576 GPUs peaked at 65 MiB, and one at a billion was OOM-killed: issue 48).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from harness.core.layout import Layout
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


def box_kind(steps: Sequence[tuple[int, int]], *, gpus_per_node: int, base: int = 0) -> str:
    """The kind of the group {base + Σ i·stride : 0 <= i < size for each (stride, size) of `steps`}, with
    `gpus_per_node` ranks a node: "self" (one rank), "intra" (one node), "inter" (one rank per node) or "mixed" —
    what harness.core.layout.group_kind says of the same ranks listed. The steps must be a mixed radix (each
    stride larger than the widest reach of the smaller ones, Σ (size - 1)·stride): a row-major mesh's dimensions
    are, so a group's sorted ranks are its steps counted in lexicographic order (innermost fastest)."""
    m = gpus_per_node
    dims = sorted((stride, size) for stride, size in steps if size > 1)
    if not dims:
        return "self"
    last = base + sum((size - 1) * stride for stride, size in dims)
    if base // m == last // m:
        return "intra"
    # NOTE: two ranks share a node only if two neighbours in sorted order do; the neighbours that carry into
    # dimension k lie `gap` apart and start where every dimension below k is at its end, k at any index but its
    # last, the ones above anywhere: they share a node when such a start's residue (mod m) + gap stays below m
    reach = 0
    for k, (stride, size) in enumerate(dims):
        gap = stride - reach
        if gap < m:
            start = base + reach
            # NOTE: the first start's residue is checked before the least of all of them is worked out
            if start % m + gap < m or _least_residue(start, steps=[(stride, size - 1), *dims[k + 1 :]], m=m) + gap < m:
                return "mixed"
        reach += (size - 1) * stride
    return "inter"


def _least_residue(start: int, *, steps: Sequence[tuple[int, int]], m: int) -> int:
    """The least of (start + Σ i·stride) mod m over 0 <= i < size for each (stride, size): the residues kept as the
    bits of an m-bit integer and each progression added by doubling (log2 size rotations), so that neither the
    ranks nor the residues are ever listed."""
    mask = (1 << m) - 1
    seen = 1 << (start % m)
    for stride, size in steps:
        step = stride % m
        # NOTE: residues repeat with period m / gcd(stride, m) <= m, so m terms reach every one
        size = min(size, m)
        block, length, offset, union = seen, 1, 0, 0  # `block`: the first `length` terms' residues
        while size:
            if size & 1:
                union |= _rotate(block, by=offset * step % m, m=m, mask=mask)
                offset += length
            size >>= 1
            if size:
                block |= _rotate(block, by=length * step % m, m=m, mask=mask)
                length *= 2
        seen = union
    return (seen & -seen).bit_length() - 1


def _rotate(bits: int, *, by: int, m: int, mask: int) -> int:
    """`bits` (a set of residues modulo m, as bits) with every residue moved up by `by` (0 <= by < m), modulo m."""
    return ((bits << by) | (bits >> (m - by))) & mask if by else bits


def mesh_group_kind(layout: Layout, *, rank: int, dims: tuple[str, ...]) -> str:
    """The kind (`box_kind`) of `rank`'s group over the mesh dimensions `dims`: the ranks that share every other
    coordinate with it (harness.core.layout.Layout.group, whose ranks are never listed here)."""
    sizes = dict(layout.mesh_dims)
    strides: dict[str, int] = {}
    stride = 1
    for name, size in reversed(layout.mesh_dims):  # NOTE: row-major: the last dimension is the innermost
        strides[name] = stride
        stride *= size
    coords = layout.coords(rank)
    base = rank - sum(coords[d] * strides[d] for d in dims)
    return box_kind([(strides[d], sizes[d]) for d in dims], gpus_per_node=layout.gpus_per_node, base=base)
