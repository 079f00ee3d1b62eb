"""Which CUDA device a rank uses, and what LOCAL_RANK must say for it: one pure function for the worker's ranks and
for `harness calibrate`'s processes (harness.calibrate.process).

Why one function: the scheduler decides what a task sees. With `--gpus-per-task=1` or `--gpu-bind` each task sees
one GPU (CUDA_VISIBLE_DEVICES lists one index, and torch calls it cuda:0) while SLURM_LOCALID is still 0..7; with
the node's GPUs visible to every task, local rank k is cuda:k. DeepSpeed's engine and `deepspeed.zero.Init` call
`set_device(int(os.environ["LOCAL_RANK"]))` themselves, so LOCAL_RANK must name the same device the rank chose:
the SLURM local id there gave "invalid device ordinal" on ranks 1..7 of every ZeRO cell under a one-GPU binding.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class CudaPlacement:
    """A rank's CUDA device, as this process numbers the devices it sees."""

    index: int
    """cuda:<index>, counted among the devices this process sees (CUDA_VISIBLE_DEVICES renumbers them from 0)"""
    local_rank: str
    """what the LOCAL_RANK environment variable must say: the same index (DeepSpeed sets its device from it)"""


def cuda_placement(local_rank: int, *, device_count: int, visible_devices: str | None, host: str) -> CudaPlacement:
    """The device of the rank with `local_rank` on its node (SLURM_LOCALID, torchrun's LOCAL_RANK), when this
    process sees `device_count` CUDA devices (torch.cuda.device_count(): the entries of CUDA_VISIBLE_DEVICES when
    set): cuda:<local rank> when the task sees the node's GPUs, cuda:0 when the scheduler bound the task to its one
    GPU. RuntimeError naming the host and CUDA_VISIBLE_DEVICES otherwise (a binding of several GPUs per task that
    does not show this rank its own, or no GPU at all)."""
    if device_count < 1:
        raise RuntimeError(
            f"local rank {local_rank} needs a CUDA device, but host {host} has none visible "
            f"(CUDA_VISIBLE_DEVICES={visible_devices!r})"
        )
    if local_rank < device_count:
        index = local_rank
    elif device_count == 1:
        index = 0
    else:
        raise RuntimeError(
            f"local rank {local_rank} needs cuda:{local_rank}, but host {host} has {device_count} CUDA "
            f"device(s) visible (CUDA_VISIBLE_DEVICES={visible_devices!r}); bind one GPU per task "
            "(--gpus-per-task=1) or show every task the node's GPUs"
        )
    return CudaPlacement(index=index, local_rank=str(index))


def node_major_problem(hosts: list[str], *, gpus_per_node: int) -> str | None:
    """Why the ranks are not numbered node by node (rank = node * gpus_per_node + local), or None when they are:
    each block of gpus_per_node consecutive ranks must be on one host. The hybrid meshes (replicate across nodes,
    shard within one) and the intra/inter-node split of the collectives assume it; SLURM gives it with
    --distribution=block (the profiles' default), not with cyclic. `hosts`: each rank's node, by rank. (Locally
    several simulated nodes share one host: that is allowed.)"""
    for start in range(0, len(hosts), gpus_per_node):
        block = hosts[start : start + gpus_per_node]
        if len(set(block)) > 1:
            spread = ", ".join(f"rank {start + i} on {h}" for i, h in enumerate(block))
            return (
                f"ranks are not numbered node by node: ranks {start}..{start + len(block) - 1} should share a node "
                f"({gpus_per_node} per node) but run on {len(set(block))} ({spread}); ask SLURM for "
                "--distribution=block (slurm.distribution in the cluster profile)"
            )
    return None
