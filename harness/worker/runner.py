"""The per-rank benchmark: init the process group, build + wrap the model, warm up, time each step.

`run` is one rank of one cell, started by harness.launch.entry (one process per rank, however the launcher started
it; a rank forked from a local sweep's warm interpreter is told so, and records it as env.prefork). Rank 0 writes
the cell's record; a rank that fails writes a fragment (status, traceback) that the launcher turns into the record
when rank 0 could not. The worker knows nothing of the launch stage: it reads its payload, measures and writes.
"""

from __future__ import annotations

import datetime
import os
import shutil
import socket
import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness.core import precisions
from harness.plan.flops import flops_per_step as model_flops_per_step
from harness.plan.flops import hardware_flops_per_step
from harness.plan.prediction import Prediction
from harness.results.payload import Payload, PayloadCluster
from harness.results.record import Fragment, Record, Status
from harness.results.store import claim_end, new_record, sanitize, sweep_dir, write_fragment, write_record
from harness.scenario.cluster import find_peak
from harness.scenario.spec import RunSpec
from harness.worker.devices import cuda_placement, node_major_problem
from harness.worker.heartbeat import Heartbeat
from harness.worker.meters import dynamo as dynamo_meter
from harness.worker.teardown import end_process_group
from harness.worker.versions import require_torch

# NOTE: torch and the strategies are imported inside run() and its phases: the submitit driver unpickles the entry
# point (harness.launch.entry, which imports this module) in every task, and `import harness.worker.runner` must
# stay cheap for it.


def node_name() -> str:
    """This rank's node: SLURM's name for it when under SLURM (several slurmd can share one host, and a host's
    name need not be its node name), else the hostname."""
    return os.environ.get("SLURMD_NODENAME") or socket.gethostname()


def report_failure(payload: Payload, rank: int, status: str, reason: str, extra: dict | None = None) -> None:
    """This rank's fragment: what ended it, written where the launcher looks when rank 0 wrote no record."""
    frag = {
        "rank": rank,
        "attempt": payload.attempt,
        "status": status,
        "reason": reason,
        "time": time.time(),
        "hostname": node_name(),
        **(extra or {}),
    }
    write_fragment(payload.results, payload.sweep, payload.run_id, Fragment.model_validate(sanitize(frag)))


def _process_start_time() -> float | None:
    """When this process started, on the time.time() clock, to the kernel's 10 ms tick.

    NOTE: not psutil's create_time(): it adds the start tick to the boot time, which /proc/stat gives in
    whole seconds, so every start time was off by the same fraction of a second (0.46 s on the CI machine:
    a forked rank appeared to take 0.46 s to reach its first line)."""
    try:
        fields = Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()
        started_after_boot = int(fields[19]) / os.sysconf("SC_CLK_TCK")  # field 22, starttime
        return time.time() - (time.clock_gettime(time.CLOCK_BOOTTIME) - started_after_boot)
    except (OSError, ValueError, IndexError, AttributeError):  # not Linux
        return None


def utilisation(
    spec: RunSpec,
    tflops_per_gpu: float,
    *,
    device_type: str,
    device_name: str | None,
    allow_tf32: bool,
    null_reasons: dict[str, str],
) -> tuple[float | None, float | None, float | None]:
    """(MFU, HFU, the dense peak TFLOPS they divide by) of a cell's achieved model TFLOPS per GPU; (None, None,
    None) with the reason added to null_reasons where the device's peak for the precision is unknown (CPU, a
    device not in harness.scenario.cluster.PEAKS). fp32 matmuls count against the TF32 peak when TF32 is allowed."""
    peak = find_peak(device_name) if device_type == "cuda" else None
    key = precisions.get(spec.precision).peak
    key = "tf32" if key == "fp32" and allow_tf32 else key
    if peak is None or key not in peak.tflops:
        null_reasons["mfu"] = (
            f"no dense peak FLOPS known for device {device_name!r} ({spec.precision}); "
            "see harness/scenario/cluster.py PEAKS"
        )
        null_reasons["hfu"] = null_reasons["mfu"]
        return None, None, None
    mfu = tflops_per_gpu / peak.tflops[key]
    # HFU counts what checkpointing recomputes too (model_budget.recompute_flops_per_token)
    return mfu, mfu * hardware_flops_per_step(spec) / model_flops_per_step(spec), peak.tflops[key]


def _is_oom(e: BaseException) -> bool:
    import torch

    # NOTE: getattr: on a torch older than the minimum (no torch.OutOfMemoryError before 2.5) the failure writer
    # must still write the fragment that says so (harness.worker.versions)
    if isinstance(e, (getattr(torch, "OutOfMemoryError", MemoryError), MemoryError)):
        return True
    # host allocations fail as RuntimeError from the CPU allocator; CUDA's as "CUDA out of memory"
    return isinstance(e, RuntimeError) and ("out of memory" in str(e) or "can't allocate memory" in str(e))


def _is_slurm_time_limit(e: BaseException) -> bool:
    """submitit's USR2 handler ends a SLURM job at its time limit by raising this in rank 0's main thread."""
    return (
        os.environ.get("SUBMITIT_EXECUTOR") == "slurm"
        and type(e).__name__ == "UncompletedJobError"
        and "timed-out" in str(e)
    )


def run(
    payload: Payload,
    *,
    rank: int,
    world_size: int,
    local_rank: int,
    master_addr: str,
    master_port: int,
    forked: bool = False,
) -> Record | None:
    """Run one cell on this rank. Returns the record on rank 0 (also written to disk), else None.

    `forked`: this rank was forked from the sweep's warm interpreter (harness.launch.local.prefork) instead of
    started cold; recorded as env.prefork."""
    t_entry = time.time()
    allocator_used = _prepare_process(payload.cluster)
    import torch

    spec = _spec_of(payload, world_size)
    s = spec.settings

    # NOTE: the heartbeat says which rank stopped when none raised (an NCCL watchdog's abort, a SIGKILL): it beats
    # until this function leaves, after the process group is destroyed (harness.worker.heartbeat)
    heartbeat = Heartbeat(payload, rank=rank, hostname=node_name()).start()
    scratch = scratch_root(payload)
    try:
        # NOTE: inside the try from here on: a rank that cannot get its device or join the group (no CUDA, a
        # local rank beyond the GPUs there are, a rendezvous that fails, a torch older than the minimum) writes a
        # fragment saying so, instead of leaving the cell "crashed" with no reason
        require_torch(torch.__version__)
        device, backend = _join_process_group(
            payload.cluster,
            rank=rank,
            world_size=world_size,
            local_rank=local_rank,
            master_addr=master_addr,
            master_port=master_port,
        )
        if spec.nodes > 1:
            _check_node_major(spec)
        trainer, batches = build_trainer(
            spec, rank=rank, world_size=world_size, local_rank=local_rank, device=device, scratch=scratch
        )
        t_ready = time.time()
        heartbeat.phase("warmup")
        step = _step_fn(trainer, batches, _fault_injector(s.inject, rank=rank, device=device))
        warm_times, warm_losses = _warm_up(step, n=s.warmup_steps, device=device)
        heartbeat.phase("timed")
        timed = _timed_steps(step, n=s.measure_steps, device=device)
        # NOTE: the memory step before the counted one: once the comm meter has registered its collective kernels,
        # a dispatch mode over DTensor's collectives reaches a stale kernel of theirs (torch 2.13)
        heartbeat.phase("memory")
        tensor_memory = _tensor_memory_step(step, trainer=trainer, device=device)
        heartbeat.phase("counted")
        comm_summary = _counted_comm_step(step, spec=spec, device=device)
        heartbeat.phase("traced")
        traced = _traced_step(step, spec=spec, payload=payload, trainer=trainer, device=device, rank=rank)
        # NOTE: the checkpoint phase comes last (after the traced step): it trains on, so nothing measured follows it
        heartbeat.phase("checkpoint")
        ckpt = _checkpoint_phase(
            trainer,
            step,
            batches,
            spec=spec,
            payload=payload,
            topo=(rank, world_size, local_rank),
            device=device,
            steps_done=comm_summary["counted_step"] + _traced_steps(s.trace),  # the traced steps trained too
        )
        heartbeat.phase("aggregate")
        ranks = _aggregate_over_ranks(
            warm_losses + timed.losses,
            timed=timed,
            world_size=world_size,
            device=device,
            loss_ranks=getattr(trainer, "loss_ranks", None),
        )
        if rank != 0:
            return None
        heartbeat.phase("record")
        record = _measured_record(
            payload=payload,
            spec=spec,
            trainer=trainer,
            device=device,
            backend=backend,
            forked=forked,
            t_entry=t_entry,
            t_ready=t_ready,
            warm_times=warm_times,
            timed=timed,
            ranks=ranks,
            comm_summary=comm_summary,
            allocator=allocator_used,
            traced=traced,
            ckpt=ckpt,
            tensor_memory=tensor_memory,
        )
        return _file(payload, record)
    except BaseException as e:
        _write_failure(payload, rank, e)
        raise
    finally:
        end_process_group()  # destroyed, and gloo's worker threads left to finish before the process exits
        heartbeat.stop()
        if local_rank == 0 and scratch.exists():  # NOTE: after the group ends: no rank swaps any more
            shutil.rmtree(scratch, ignore_errors=True)


SCRATCH_DIR = ".scratch"
"""the folder of the sweep's results that holds each run's temporary files (`scratch_root`)"""


def scratch_root(payload: Payload) -> Path:
    """This run's folder for temporary files (an `offload: nvme` cell's default swap folder):
    `<results>/<sweep>/.scratch/<run_id>.<attempt>`, removed when the run ends."""
    return sweep_dir(payload.results, payload.sweep) / SCRATCH_DIR / f"{payload.run_id}.{payload.attempt or 'manual'}"


# --------------------------------------------------------------------------------------------------
# the phases of run(), in order


def rank_device(cluster: PayloadCluster, *, local_rank: int) -> tuple[Any, str, str]:
    """(device, backend, LOCAL_RANK to export) of the rank with `local_rank` on its node: cuda:<index> (set as
    current) and nccl on a CUDA profile, where the index and LOCAL_RANK follow harness.worker.devices; cpu, gloo and
    the local rank otherwise."""
    import torch

    if cluster.device != "cuda":
        return torch.device("cpu"), "gloo", str(local_rank)
    if not torch.cuda.is_available():
        raise RuntimeError(
            f"cluster profile {cluster.name!r} says cuda, but torch.cuda.is_available() "
            f"is False here (torch {torch.__version__}, host {node_name()})"
        )
    placement = cuda_placement(
        local_rank,
        device_count=torch.cuda.device_count(),
        visible_devices=os.environ.get("CUDA_VISIBLE_DEVICES"),
        host=node_name(),
    )
    device = torch.device("cuda", placement.index)
    torch.cuda.set_device(device)
    return device, "nccl", placement.local_rank


def _join_process_group(
    cluster: PayloadCluster, *, rank: int, world_size: int, local_rank: int, master_addr: str, master_port: int
) -> tuple[Any, str]:
    """(device, backend): this rank's device (cuda:<index> or cpu), set as current, and the world process group
    joined (nccl on CUDA, gloo on CPU) with the cluster's watchdog timeout on every group made later too."""
    import torch.distributed as dist

    device, backend, exported_local_rank = rank_device(cluster, local_rank=local_rank)
    # NOTE: LOCAL_RANK names this rank's device as this process numbers them (cuda:0 under a one-GPU binding), not
    # the SLURM local id: DeepSpeed's engine and zero.Init set their device from it (harness.worker.devices)
    os.environ.update(
        MASTER_ADDR=master_addr,
        MASTER_PORT=str(master_port),
        RANK=str(rank),
        WORLD_SIZE=str(world_size),
        LOCAL_RANK=exported_local_rank,
    )
    timeout = datetime.timedelta(seconds=float(cluster.pg_timeout_s))
    # NOTE: groups created later (device meshes, hybrid sub-groups, DeepSpeed's groups) take their timeout
    # from these module globals, not from the world group: set them so the watchdog covers every group.
    import torch.distributed.distributed_c10d as c10d

    c10d.default_pg_timeout = timeout
    c10d.default_pg_nccl_timeout = timeout
    dist.init_process_group(
        backend=backend,
        rank=rank,
        world_size=world_size,
        timeout=timeout,
        device_id=device if backend == "nccl" else None,
    )
    return device, backend


def _check_node_major(spec: RunSpec) -> None:
    """RuntimeError when a multi-node cell's ranks are not numbered node by node (harness.worker.devices); one
    all_gather of the node names, before anything is built."""
    import torch.distributed as dist

    hosts: list[str | None] = [None] * spec.gpus
    dist.all_gather_object(hosts, node_name())
    problem = node_major_problem([str(h) for h in hosts], gpus_per_node=spec.gpus_per_node)
    if problem is not None:
        raise RuntimeError(problem)


def build_trainer(
    spec: RunSpec, *, rank: int, world_size: int, local_rank: int, device: Any, scratch: Path | None = None
) -> tuple[Any, list]:
    """(trainer, micro-batches): the cell's model wrapped by its strategy, and this rank's synthetic batch of each
    micro step (the same every step)."""
    import torch

    from harness.worker.factory_models import cell_batch
    from harness.worker.strategies import family
    from harness.worker.strategies.base import Topology

    s = spec.settings
    # NOTE: the dispatcher records unsupported cells as `skipped` without launching them; reaching
    # here with one is a launcher bug, so it fails loudly instead of measuring something else
    unsupported = spec.unsupported_reason(device.type)
    if unsupported:
        raise RuntimeError(f"launched an unsupported cell: {unsupported}")
    topo = Topology(
        rank=rank,
        world_size=world_size,
        local_rank=local_rank,
        gpus_per_node=spec.gpus_per_node,
        device=device,
        scratch=scratch,
    )
    torch.manual_seed(s.seed)
    trainer = family(spec.strategy).setup(spec, topo=topo)
    batches = [
        cell_batch(
            spec.model_config,
            seed=s.seed,
            # NOTE: the rows of this rank's data-parallel replica: its tensor- and pipeline-parallel peers train on the
            # same rows (the rank itself without a layout)
            rank=spec.layout.dp_rank(rank),
            micro_batch=s.micro_batch,
            seq_len=s.seq_len,
            micro_step=i,
            device=device,
        )
        for i in range(s.grad_accum)
    ]
    return trainer, batches


def _fault_injector(inject: dict | None, *, rank: int, device: Any) -> Any:
    from harness.worker.faults import FaultInjector

    return FaultInjector(inject, rank=rank, device=device)


def _warm_up(step, *, n: int, device: Any) -> tuple[list[float], list]:
    """(times, losses) of the warmup steps: not measured, but kept (compile time, losses)."""
    from harness.worker.meters.timing import time_steps

    return time_steps(step, n=n, device=device)


@dataclass
class _Timed:
    """This rank's measured steps: their times (s) and losses, its memory peaks over them, and dynamo's counters
    before and after them."""

    times: list[float]
    losses: list
    mem: dict
    dynamo_warm: dict
    dynamo: dict


def _timed_steps(step, *, n: int, device: Any) -> _Timed:
    """The measured steps, after a barrier and a reset of the memory peaks."""
    import torch.distributed as dist

    from harness.worker.meters.memory import MemoryMeter
    from harness.worker.meters.timing import time_steps

    meter = MemoryMeter(device)
    dist.barrier()
    meter.reset()
    dynamo_warm = dynamo_meter.snapshot()
    times, losses = time_steps(step, n=n, device=device)
    mem = meter.read()
    dynamo = dynamo_meter.snapshot()
    return _Timed(times=times, losses=losses, mem=mem, dynamo_warm=dynamo_warm, dynamo=dynamo)


def _counted_comm_step(step, *, spec: RunSpec, device: Any) -> dict:
    """The comm summary of one more step, with every collective counted and timed."""
    from harness.worker.meters.comm import CommMeter
    from harness.worker.meters.timing import time_steps

    s = spec.settings
    # NOTE: collectives are counted (and timed one by one) over one more step after the timed ones, as
    # steady as they were: the timed steps never run the meter. (Not the last warmup step: DDP broadcasts
    # its rebuilt bucket order in step 2.) Its loss is not among the recorded losses.
    # NOTE: tensor parallelism issues collectives inside DTensor's dispatch, which only the meter's dispatch mode sees
    comm = CommMeter(timed=True, device=device, dtensor=s.tp > 1).install()
    with comm.measure():
        counted_times, _ = time_steps(step, n=1, device=device)
    comm.uninstall()
    comm_summary = comm.summary(steps=1, gpus_per_node=spec.gpus_per_node)
    comm_summary["counted_step"] = s.warmup_steps + s.measure_steps + 2  # after the memory step
    comm_summary["counted_step_time_s"] = counted_times[0]
    return comm_summary


def _tensor_memory_step(step, *, trainer: Any, device: Any) -> dict | None:
    """One more step with every tensor storage accounted by category (harness.worker.meters.tensors); rank 0 gets
    the record's metrics.memory_gib, the other ranks None."""
    from harness.worker.meters.tensors import measure_step, over_ranks

    return over_ranks(measure_step(step, trainer=trainer, device_type=device.type))


def _traced_step(step, *, spec: RunSpec, payload: Payload, trainer: Any, device: Any, rank: int) -> Any:
    """`trace: true`: TRACED_STEPS more steps under the profiler, after the counted one, between untraced
    neighbours (harness.worker.meters.profile); rank 0 gets the traces' breakdown, the other ranks (and every rank of an
    untraced cell) None."""
    if not spec.settings.trace:
        return None
    from harness.results.store import sweep_dir
    from harness.worker.meters.profile import traced_step

    return traced_step(
        step,
        trainer=trainer,
        device=device,
        sweep_dir=sweep_dir(payload.results, payload.sweep),
        run_id=payload.run_id,
        rank=rank,
        world_size=spec.gpus,
        compiled=spec.settings.compile,
        checkpointing=spec.settings.checkpointing,
    )


def _spec_of(payload: Payload, world_size: int) -> RunSpec:
    """The payload's cell, checked against the ranks it was launched with."""
    spec = payload.spec
    if spec.gpus != world_size:
        raise RuntimeError(f"launched with {world_size} ranks for a world_size {spec.gpus} cell")
    return spec


def _file(payload: Payload, record: Record) -> Record:
    """Rank 0: write the cell's record, unless the launcher claimed the cell's end first; return the record."""
    # NOTE: the launcher may be cancelling this cell (Ctrl-C): whoever claims first says how it ended
    if claim_end(payload.results, payload.sweep, payload.run_id, attempt=payload.attempt):
        write_record(payload.results, record)
    return record


def _prepare_process(cluster: Any) -> str:
    """This rank's process before torch does anything: the profile's environment (without overriding what the
    launcher set), torch's thread count, the quieted collective renames and the CPU allocator. Returns the
    allocator in use."""
    for k, v in cluster.env.items():
        os.environ.setdefault(k, str(v))
    import torch

    if "OMP_NUM_THREADS" in os.environ:
        torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))
    from harness.worker import allocator
    from harness.worker.env import silence_collective_renames

    silence_collective_renames()  # FSDP's and DeepSpeed's calls: a FutureWarning per collective in the rank logs
    return allocator.apply(cluster.cpu_allocator or "caching", cluster.device)


def _traced_steps(trace: bool) -> int:
    """How many steps the traced phase trained (harness.worker.meters.profile.PHASE_STEPS when traced: the traced
    steps and their untraced neighbours)."""
    if not trace:
        return 0
    from harness.worker.meters.profile import PHASE_STEPS

    return PHASE_STEPS


def _checkpoint_phase(
    trainer, step, batches, *, spec: RunSpec, payload: Payload, topo: tuple[int, int, int], device: Any, steps_done: int
) -> Any:
    """The checkpoint phase (harness.worker.checkpoint): save, reload into a fresh trainer built like this one, train
    on; its outcome, the same on every rank (None when the cell does not checkpoint). `topo`: (rank, world size,
    local rank)."""
    if not spec.settings.checkpoint:
        return None
    from harness.worker.checkpoint import run_checkpoint

    rank, world_size, local_rank = topo

    def fresh() -> tuple[Any, Any]:
        new, _ = build_trainer(
            spec, rank=rank, world_size=world_size, local_rank=local_rank, device=device, scratch=scratch_root(payload)
        )
        return new, lambda: new.step(batches)

    return run_checkpoint(
        trainer, step, spec=spec, payload=payload, rank=rank, device=device, steps_done=steps_done, fresh=fresh
    )


@dataclass
class _OverRanks:
    """What every rank measured, combined (outside the timed region)."""

    per_rank_losses: Any
    """tensor (rank, step) of every warmup and measured step's loss"""
    losses: list[float]
    """each step's loss, the mean over ranks"""
    step_times: Any
    """tensor of each measured step's time (s), the max over ranks: a step ends when its slowest rank ends"""
    peaks: Any
    """tensor [peak allocated GiB, peak reserved GiB, frames dynamo compiled in the measured steps, allocator
    retries in the measured steps], max over ranks (-1: not measured)"""
    hosts: list[str | None]


def _aggregate_over_ranks(
    step_losses: list, *, timed: _Timed, world_size: int, device: Any, loss_ranks: list[int] | None = None
) -> _OverRanks:
    """`loss_ranks`: the ranks whose losses count (a pipeline's last stage; the others return a placeholder), every
    rank when None."""
    import torch
    import torch.distributed as dist

    local = torch.stack([loss.float().reshape(()) for loss in step_losses]).to(device)
    per_rank = [torch.empty_like(local) for _ in range(world_size)]
    dist.all_gather(per_rank, local)
    per_rank_losses = torch.stack(per_rank).cpu()  # (rank, step)
    all_losses = (per_rank_losses if loss_ranks is None else per_rank_losses[loss_ranks]).double().mean(0).tolist()
    step_times = torch.tensor(timed.times, dtype=torch.float64, device=device)
    dist.all_reduce(step_times, op=dist.ReduceOp.MAX)  # a step ends when its slowest rank ends
    # max over ranks of: peak allocated, peak reserved, frames dynamo compiled in the measured steps (a
    # recompilation on any rank stalls every rank's step), the allocator's retries (a rank that retried stalls them too;
    # rank 0's alone hid the others' before issue 32)
    mem = timed.mem
    peaks = torch.tensor(
        [
            mem["peak_memory_allocated_gib"] or -1.0,
            mem["peak_memory_reserved_gib"] or -1.0,
            timed.dynamo["frames"] - timed.dynamo_warm["frames"],
            -1 if mem["alloc_retries"] is None else mem["alloc_retries"],
        ],
        dtype=torch.float64,
        device=device,
    )
    dist.all_reduce(peaks, op=dist.ReduceOp.MAX)
    hosts: list[str | None] = [None] * world_size
    dist.all_gather_object(hosts, node_name())
    return _OverRanks(
        per_rank_losses=per_rank_losses, losses=all_losses, step_times=step_times, peaks=peaks, hosts=hosts
    )


def _measured_record(
    *,
    payload: Payload,
    spec: RunSpec,
    trainer: Any,
    device: Any,
    backend: str,
    forked: bool,
    t_entry: float,
    t_ready: float,
    warm_times: list[float],
    timed: _Timed,
    ranks: _OverRanks,
    comm_summary: dict,
    allocator: str,
    traced: Any = None,
    ckpt: Any = None,
    tensor_memory: dict | None = None,
) -> Record:
    """Rank 0: the cell's record — its env, metrics, comm and status (nan when a loss is not finite) — from what
    the ranks measured; with the checkpoint phase's outcome `ckpt` where the cell checkpointed."""
    import torch

    from harness.worker.meters.timing import summarize

    s = spec.settings
    env = _env(
        payload, trainer=trainer, device=device, backend=backend, forked=forked, ranks=ranks, allocator=allocator
    )
    summary = summarize(ranks.step_times.tolist())
    metrics = _metrics(spec, summary=summary, env=env, timed=timed, ranks=ranks, warm_times=warm_times)
    metrics["memory_gib"] = tensor_memory
    reserved = metrics["peak_memory_reserved_gib"]
    if tensor_memory is not None and reserved is not None and device.type == "cuda":
        metrics["memory_fragmentation_gib"] = reserved - tensor_memory["total"]
    else:
        metrics["memory_fragmentation_gib"] = None
        metrics["null_reasons"]["memory_fragmentation_gib"] = "CPU: there is no caching allocator"
    metrics["setup_s"] = t_ready - t_entry
    start = _process_start_time()
    metrics["startup_s"] = None if start is None else t_ready - start
    if start is None:
        metrics["null_reasons"]["startup_s"] = "process start time unavailable (/proc/self/stat)"
    fields: dict[str, Any] = {"attempt": payload.attempt}
    if payload.predicted is not None:
        fields["predicted"] = payload.predicted.with_deviations(
            comm_bytes=comm_summary["bytes_per_step"], median_s=summary["median"]
        )
    fields["comm"] = comm_summary
    if traced is not None:  # trace: true (harness.worker.meters.profile.Traced)
        metrics["time_s"] = traced.time_s
        fields["artifacts"] = {"traces": traced.traces}
    else:
        metrics["null_reasons"]["time_s"] = "trace is off for this cell (settings.trace)"
    if getattr(trainer, "layout_info", None) is not None:  # a tensor- or pipeline-parallel layout
        fields["layout"] = trainer.layout_info
    status: Status = "ok"
    reason, failed_rank = None, None
    recompiled = int(ranks.peaks[2])
    if recompiled > 0:
        reason = (
            f"torch.compile compiled {recompiled} frame(s) during the measured steps "
            "(recompilation): those steps' times include compile time; raise warmup_steps "
            "or look for the changing guard with TORCH_LOGS=recompiles"
        )
    bad = (~torch.isfinite(ranks.per_rank_losses)).nonzero().tolist()  # [rank, step] pairs
    if bad:
        failed_rank, first = min(bad, key=lambda rs: (rs[1], rs[0]))
        status = "nan"
        reason = (
            f"loss is not finite at step {first + 1} "
            f"({'warmup' if first < s.warmup_steps else 'measured'}), first on rank {failed_rank}"
        )
    started = datetime.datetime.fromtimestamp(t_entry, datetime.UTC).isoformat(timespec="seconds")
    record = new_record(
        spec=payload.spec,
        run_id=payload.run_id,
        sweep=payload.sweep,
        cluster=payload.cluster.name,
        status=status,
        reason=reason,
        failed_rank=failed_rank,
        metrics=sanitize(metrics),
        env=sanitize(env),
        started_at=started,
        finished_at=datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        **{k: v if isinstance(v, Prediction) else sanitize(v) for k, v in fields.items()},
    )
    if ckpt is None:
        return record
    from harness.worker.checkpoint import into_record

    return into_record(record, ckpt)


def _env(
    payload: Payload,
    *,
    trainer: Any,
    device: Any,
    backend: str,
    forked: bool,
    ranks: _OverRanks,
    allocator: str,
) -> dict[str, Any]:
    """Where the cell ran, as rank 0 saw it, and every rank's host."""
    from harness.worker import env as envmod

    env = envmod.capture(device.type)
    env["prefork"] = forked  # forked from the sweep's warm interpreter, not started cold
    env["cpu_allocator"] = allocator  # what this rank's malloc does with freed memory (harness.worker.allocator)
    if getattr(trainer, "config", None) is not None:
        env["deepspeed_config"] = trainer.config
    model = getattr(trainer, "model", None)
    model = getattr(model, "module", model)  # DDP's and DeepSpeed's engine hold the model as .module
    inner = getattr(model, "inner", None)  # implementation: transformers
    env["model_class"] = None if inner is None else f"{type(inner).__module__}.{type(inner).__name__}"
    env.update(
        backend=backend,
        hostnames=sorted({h for h in ranks.hosts if h is not None}),
        harness_git_sha=payload.git_sha,
    )
    if payload.job_id is not None:  # under SLURM: submitit's id (<array>_<index> for array tasks)
        env.update(slurm_job_id=payload.job_id, slurm_restart_count=int(os.environ.get("SLURM_RESTART_COUNT", "0")))
    return env


def _metrics(
    spec: RunSpec, *, summary: dict, env: dict[str, Any], timed: _Timed, ranks: _OverRanks, warm_times: list[float]
) -> dict[str, Any]:
    """The measured numbers of the cell (harness.results.record.Metrics), from the slowest rank's step times."""
    s = spec.settings
    mem, dynamo, peaks = timed.mem, timed.dynamo, ranks.peaks
    tokens = spec.tokens_per_step
    flops_per_step = spec.model_config.flops_per_token(s.seq_len) * tokens
    tflops_per_gpu = flops_per_step / spec.gpus / summary["median"] / 1e12
    null_reasons = dict(mem["null_reasons"])
    mfu, hfu, peak_tflops = utilisation(
        spec,
        tflops_per_gpu,
        device_type=env["device_type"],
        device_name=env["device_name"],
        allow_tf32=env["allow_tf32"],
        null_reasons=null_reasons,
    )
    if s.compile:
        # the first step traces and compiles; what it took beyond a steady step is the compile cost
        compile_s = max(0.0, warm_times[0] - summary["median"])
    else:
        compile_s = None
        null_reasons["compile_s"] = "compile is off for this cell"
    return {
        "step_time_s": summary,
        "tokens_per_s": tokens / summary["median"],
        "tokens_per_s_per_gpu": tokens / summary["median"] / spec.gpus,
        "tflops_per_gpu": tflops_per_gpu,
        "mfu": mfu,
        "hfu": hfu,
        "mfu_peak_tflops": peak_tflops,
        "peak_memory_allocated_gib": None if peaks[0] < 0 else float(peaks[0]),
        "peak_memory_reserved_gib": None if peaks[1] < 0 else float(peaks[1]),
        "memory_gib": None,  # NOTE: filled by the caller (the memory step's tensor bytes), here for the field order
        "memory_fragmentation_gib": None,
        "alloc_retries": None if peaks[3] < 0 else int(peaks[3]),
        "loss": ranks.losses[-1],
        "losses": ranks.losses,
        "n_params": spec.model_config.n_params(),
        "flops_per_step": flops_per_step,
        "tokens_per_step": tokens,
        "setup_s": None,  # NOTE: filled by the caller; here for the field order of the record
        "warmup_step_times_s": warm_times,
        "compile_s": compile_s,
        "startup_s": None,
        "dynamo": dict(dynamo, frames_in_measured_steps=int(peaks[2])),
        "null_reasons": null_reasons,
    }


def _write_failure(payload: Payload, rank: int, e: BaseException) -> None:
    """This rank's fragment for the exception that ends it (oom, a SLURM time limit, or error), with its traceback
    and, for an oom, the memory in use."""
    import torch

    status = "oom" if _is_oom(e) else "timeout" if _is_slurm_time_limit(e) else "error"
    extra: dict[str, Any] = {"traceback": traceback.format_exc(limit=30)}
    if status == "oom":
        if torch.cuda.is_available():
            extra["memory_allocated_gib"] = torch.cuda.memory_allocated() / 2**30
            extra["memory_reserved_gib"] = torch.cuda.memory_reserved() / 2**30
        else:
            from harness.worker.meters.memory import rss_bytes

            extra["memory_rss_gib"] = (rss_bytes() or 0) / 2**30
    report_failure(payload, rank, status, failure_reason(e), extra)


def failure_reason(e: BaseException) -> str:
    """What ended a rank, in one line a reader can act on: the exception, its message (or "no message": an empty
    `AssertionError` inside torch once was the whole reason) and where it was raised (file:line in function; paths
    from the package, e.g. torch/distributed/tensor/placement_types.py)."""
    message = str(e).strip() or "no message"
    frames = traceback.extract_tb(e.__traceback__)
    where = ""
    if frames:
        last = frames[-1]
        parts = Path(last.filename).parts
        for anchor in ("site-packages", "dist-packages"):
            if anchor in parts:
                parts = parts[parts.index(anchor) + 1 :]
                break
        else:
            parts = parts[-3:]
        line = f":{last.lineno}" if last.lineno else ""  # NOTE: None for some frames (a C call's caller)
        where = f" (raised at {'/'.join(parts)}{line} in {last.name})"
    return f"{type(e).__name__}: {message}"[:1800] + where


def _step_fn(trainer, batches, injector):
    """The callable the worker times: the trainer's step, with the fault injector in front only when armed."""
    if injector.fault is None:
        return lambda: trainer.step(batches)
    count = 0

    def step():
        nonlocal count
        count += 1
        injector.before_step(count, trainer.model)
        loss = trainer.step(batches)
        injector.after_step(count)
        return loss

    return step
