"""The measuring processes of `harness calibrate`, each started by harness.calibrate.run with the cluster profile's
environment (locally OMP_NUM_THREADS=1, as every rank runs) and set up as the profile makes a sweep's rank (threads,
allocator, device). Two roles:

- `compute`: one process on one device measures the device (harness.calibrate.device), the collectives of a
  one-rank group and the host's sharing at one rank (harness.calibrate.group), the checkpoint folder's bandwidth
  (harness.calibrate.storage), then each strategy family's framework overhead (harness.calibrate.framework); it
  writes the calibration file without the merge's fields.
- `collectives`: one rank of a group of N (RANK/WORLD_SIZE/MASTER_* from the launcher) measures the host's sharing
  and the collectives' curves; rank 0 writes them (a `CollectivesPart`).

Both write through the file's typed models (harness.plan.calibration.file), atomically.

    python -m harness.calibrate.process compute --cluster PROFILE --out FILE [--quick] [--storage-dir DIR]
    python -m harness.calibrate.process collectives --cluster PROFILE --out FILE [--quick] [--link intra|inter]
"""

from __future__ import annotations

import argparse
import os
import socket
import sys
import time
from pathlib import Path

import torch

from harness.calibrate.device import (
    measure_attention,
    measure_dispatch,
    measure_elementwise,
    measure_gemm,
    measure_optimizer,
)
from harness.calibrate.framework import measure_framework
from harness.calibrate.group import init_group, measure_collectives, measure_sharing
from harness.calibrate.in_step import measure_in_step
from harness.calibrate.storage import measure_storage
from harness.plan.calibration.file import (
    FORMAT,
    Calibration,
    CollectivesPart,
    Compute,
    Fingerprint,
    write_calibration,
)
from harness.plan.calibration.find import Found, host_fingerprint
from harness.plan.calibration.rates import CalibratedRates
from harness.scenario.cluster import Cluster, load_cluster
from harness.worker.devices import cuda_placement
from harness.worker.env import silence_collective_renames
from harness.worker.teardown import end_process_group


def fingerprint(device: torch.device, *, backend: str, cpu_allocator: str) -> Fingerprint:
    """This host's fingerprint with the device's, the backend's and the process's settings."""
    cuda = device.type == "cuda"
    return Fingerprint(
        **host_fingerprint().to_dict(),
        device=device.type,
        device_name=torch.cuda.get_device_name(device) if cuda else None,
        device_count=torch.cuda.device_count() if cuda else None,
        backend=backend,
        threads_per_rank=torch.get_num_threads(),
        torch_full=torch.__version__,
        cpu_allocator=cpu_allocator,
    )


def process_setup(cluster_path: str) -> tuple[Cluster, torch.device]:
    """This calibration process as the profile makes a sweep's rank: its threads, its allocator, its device. Returns
    the profile (read once) and the device."""
    from harness.worker import allocator

    if "OMP_NUM_THREADS" in os.environ:
        torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))
    cluster = load_cluster(cluster_path)
    allocator.apply(cluster.cpu_allocator, cluster.device)
    if cluster.device == "cuda":
        if not torch.cuda.is_available():
            raise RuntimeError(f"profile {cluster.name!r} says cuda, but torch.cuda.is_available() is False here")
        placement = cuda_placement(
            int(os.environ.get("LOCAL_RANK", os.environ.get("RANK", "0"))),
            device_count=torch.cuda.device_count(),
            visible_devices=os.environ.get("CUDA_VISIBLE_DEVICES"),
            host=os.environ.get("SLURMD_NODENAME") or socket.gethostname(),
        )
        # NOTE: LOCAL_RANK then names the device as this process numbers them (the worker's rule)
        os.environ["LOCAL_RANK"] = placement.local_rank
        torch.cuda.set_device(placement.index)
        return cluster, torch.device("cuda", placement.index)
    return cluster, torch.device("cpu")


def run_compute(cluster_path: str, out: Path, *, quick: bool, storage_dir: Path | None = None) -> None:
    """The `compute` role: the device, the one-rank group, the storage at `storage_dir` (default: the profile's
    checkpoint_dir, else `out`'s folder), the framework overheads; writes the file's device part."""
    cluster, device = process_setup(cluster_path)
    t0 = time.perf_counter()
    measured = Compute(
        gemm=measure_gemm(device, quick=quick),
        elementwise=measure_elementwise(device),
        attention=measure_attention(device, quick=quick),
        dispatch=measure_dispatch(device),
        optimizer=measure_optimizer(device),
    )
    init_group(device, rank=0, world=1)
    comm = measure_collectives(link="self", device=device, quick=True)
    sharing = [measure_sharing(device)]
    backend = "nccl" if device.type == "cuda" else "gloo"
    part = Calibration(
        format=FORMAT,
        cluster=cluster.name,
        fingerprint=fingerprint(device, backend=backend, cpu_allocator=cluster.cpu_allocator),
        compute=measured,
        comm=comm,
        sharing=sharing,
        storage=measure_storage(storage_dir or Path(cluster.checkpoint_dir or out.resolve().parent), quick=quick),
    )
    in_step = measure_in_step(CalibratedRates(Found(Path("(this calibration)"), part, None)), device)
    measured = measured.model_copy(update={"in_step": in_step})
    part = part.model_copy(update={"compute": measured})
    framework = measure_framework(cluster, part, device, quick=quick)
    compute = measured.model_copy(update={"framework": framework})
    elapsed = time.perf_counter() - t0
    write_calibration(out, part.model_copy(update={"compute": compute, "compute_s": elapsed}))


def run_collectives(cluster_path: str, out: Path, *, quick: bool, link: str) -> None:
    """The `collectives` role: this rank of the launcher's group; rank 0 writes the group's part."""
    import torch.distributed as dist

    _, device = process_setup(cluster_path)
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    init_group(device, rank=rank, world=world)
    shared = measure_sharing(device)
    curves = measure_collectives(link=link, device=device, quick=quick)
    if rank == 0:
        write_calibration(out, CollectivesPart(comm=curves, sharing=[shared] if link == "intra" else []))
    dist.barrier()
    end_process_group()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m harness.calibrate.process", description=__doc__.splitlines()[0])
    ap.add_argument("role", choices=["compute", "collectives"])
    ap.add_argument("--cluster", required=True, help="cluster profile path")
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--quick", action="store_true", help="a smaller grid (tests)")
    ap.add_argument("--link", default="intra", help="collectives: the link the group spans (intra | inter)")
    ap.add_argument("--storage-dir", type=Path, help="compute: the folder whose write/read bandwidth is measured")
    args = ap.parse_args(argv)
    silence_collective_renames()
    if args.role == "compute":
        run_compute(args.cluster, args.out, quick=args.quick, storage_dir=args.storage_dir)
    else:
        run_collectives(args.cluster, args.out, quick=args.quick, link=args.link)
    return 0


if __name__ == "__main__":
    sys.exit(main())
