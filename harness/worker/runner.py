"""The per-rank benchmark: init the process group, build + wrap the model, warm up, time each step.

Launched one process per rank, either by submitit (`submitit_entry`, sweeps) or by the foreground
launcher (`python -m harness.worker.runner PAYLOAD.json` with torchrun-style RANK/WORLD_SIZE/... variables).
Rank 0 writes the cell's record; a rank that fails writes a fragment (status, traceback) that the
dispatcher turns into the record when rank 0 could not.
"""

from __future__ import annotations

import datetime
import json
import math
import os
import random
import socket
import sys
import time
import traceback
from pathlib import Path
from typing import Any

from harness.launch.local import prefork
from harness.scenario.cluster import find_peak
from harness.worker.meters import dynamo as dynamo_meter
from harness.plan.memory import flops_per_step as model_flops_per_step, hardware_flops_per_step
from harness.results.store import atomic_write_json, new_record, sanitize, sweep_dir, write_record
from harness.scenario.schema import RunSpec

# NOTE: torch and the strategies are imported inside run(): the submitit driver unpickles this module
# in every task, and `import harness.worker.runner` must stay cheap for it.


def fragment_dir(results: str | Path, sweep: str, run_id: str) -> Path:
    return sweep_dir(results, sweep) / ".fragments" / run_id


def node_name() -> str:
    """This rank's node: SLURM's name for it when under SLURM (several slurmd can share one host, and a host's
    name need not be its node name), else the hostname."""
    return os.environ.get("SLURMD_NODENAME") or socket.gethostname()


def write_fragment(payload: dict, rank: int, status: str, reason: str, extra: dict | None = None) -> None:
    frag = {"rank": rank, "attempt": payload.get("attempt"), "status": status, "reason": reason, "time": time.time(),
            "hostname": node_name(), **(extra or {})}
    atomic_write_json(fragment_dir(payload["results"], payload["sweep"], payload["run_id"]) / f"rank{rank}.json",
                      sanitize(frag))


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


def cuda_index(local_rank: int, visible: int) -> int:
    """This rank's CUDA device: cuda:<local rank> when the task sees the node's GPUs, cuda:0 when the scheduler
    bound the task to its one GPU (--gpus-per-task=1, --gpu-bind); an error that says why otherwise."""
    if local_rank < visible:
        return local_rank
    if visible == 1:
        return 0
    raise RuntimeError(f"local rank {local_rank} needs cuda:{local_rank}, but host {node_name()} has {visible} CUDA "
                       f"device(s) visible (CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES')!r})")


def utilisation(spec: RunSpec, tflops_per_gpu: float, *, device_type: str, device_name: str | None,
                allow_tf32: bool, null_reasons: dict[str, str]) -> tuple[float | None, float | None, float | None]:
    """(MFU, HFU, the dense peak TFLOPS they divide by) of a cell's achieved model TFLOPS per GPU; (None, None,
    None) with the reason added to null_reasons where the device's peak for the precision is unknown (CPU, a
    device not in harness.scenario.cluster.PEAKS). fp32 matmuls count against the TF32 peak when TF32 is allowed."""
    peak = find_peak(device_name) if device_type == "cuda" else None
    key = spec.precision if spec.precision != "fp32" else ("tf32" if allow_tf32 else "fp32")
    if peak is None or key not in peak.tflops:
        null_reasons["mfu"] = (f"no dense peak FLOPS known for device {device_name!r} ({spec.precision}); "
                               "see harness/scenario/cluster.py PEAKS")
        null_reasons["hfu"] = null_reasons["mfu"]
        return None, None, None
    mfu = tflops_per_gpu / peak.tflops[key]
    # HFU counts what checkpointing recomputes too (model_budget.recompute_flops_per_token)
    return mfu, mfu * hardware_flops_per_step(spec) / model_flops_per_step(spec), peak.tflops[key]


def _is_oom(e: BaseException) -> bool:
    import torch

    if isinstance(e, (torch.OutOfMemoryError, MemoryError)):
        return True
    # host allocations fail as RuntimeError from the CPU allocator; CUDA's as "CUDA out of memory"
    return isinstance(e, RuntimeError) and ("out of memory" in str(e) or "can't allocate memory" in str(e))


def _is_slurm_time_limit(e: BaseException) -> bool:
    """submitit's USR2 handler ends a SLURM job at its time limit by raising this in rank 0's main thread."""
    return (os.environ.get("SUBMITIT_EXECUTOR") == "slurm" and type(e).__name__ == "UncompletedJobError"
            and "timed-out" in str(e))


def run(payload: dict[str, Any], *, rank: int, world_size: int, local_rank: int, master_addr: str,
        master_port: int) -> dict | None:
    """Run one cell on this rank. Returns the record on rank 0 (also written to disk), else None."""
    t_entry = time.time()
    cluster = payload["cluster"]
    for k, v in cluster.get("env", {}).items():
        os.environ.setdefault(k, str(v))
    import torch
    import torch.distributed as dist

    if "OMP_NUM_THREADS" in os.environ:
        torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))

    from harness.worker import env as envmod
    from harness.worker.faults import FaultInjector
    from harness.worker.meters.comm import CommMeter
    from harness.worker.meters.memory import MemoryMeter
    from harness.worker.meters.timing import summarize, synchronize, time_steps
    from harness.worker.models import synthetic_batch
    from harness.worker.strategies import family
    from harness.worker.strategies.base import Topology

    spec = RunSpec.from_dict(payload["spec"])
    s = spec.settings
    if spec.world_size != world_size:
        raise RuntimeError(f"launched with {world_size} ranks for a world_size {spec.world_size} cell")
    record = new_record(spec=spec.to_dict(), run_id=payload["run_id"], sweep=payload["sweep"],
                        cluster=cluster["name"], status="ok")
    record["attempt"] = payload.get("attempt")
    record["started_at"] = datetime.datetime.fromtimestamp(t_entry, datetime.timezone.utc).isoformat(timespec="seconds")
    if payload.get("predicted") is not None:
        record["predicted"] = payload["predicted"]

    try:
        # NOTE: inside the try from here on: a rank that cannot get its device or join the group (no CUDA, a
        # local rank beyond the GPUs there are, a rendezvous that fails) writes a fragment saying so, instead of
        # leaving the cell "crashed" with no reason
        if cluster["device"] == "cuda":
            if not torch.cuda.is_available():
                raise RuntimeError(f"cluster profile {cluster['name']!r} says cuda, but torch.cuda.is_available() "
                                   f"is False here (torch {torch.__version__}, host {node_name()})")
            device = torch.device("cuda", cuda_index(local_rank, torch.cuda.device_count()))
            torch.cuda.set_device(device)
            backend = "nccl"
        else:
            device = torch.device("cpu")
            backend = "gloo"
        os.environ.update(MASTER_ADDR=master_addr, MASTER_PORT=str(master_port), RANK=str(rank),
                          WORLD_SIZE=str(world_size), LOCAL_RANK=str(local_rank))
        timeout = datetime.timedelta(seconds=float(cluster.get("pg_timeout_s", 300)))
        # NOTE: groups created later (device meshes, hybrid sub-groups, DeepSpeed's groups) take their timeout
        # from these module globals, not from the world group: set them so the watchdog covers every group.
        import torch.distributed.distributed_c10d as c10d

        c10d.default_pg_timeout = timeout
        c10d.default_pg_nccl_timeout = timeout
        dist.init_process_group(backend=backend, rank=rank, world_size=world_size, timeout=timeout,
                                device_id=device if backend == "nccl" else None)
        # NOTE: the dispatcher records unsupported cells as `skipped` without launching them; reaching
        # here with one is a launcher bug, so it fails loudly instead of measuring something else
        unsupported = spec.unsupported_reason(device.type)
        if unsupported:
            raise RuntimeError(f"launched an unsupported cell: {unsupported}")
        topo = Topology(rank=rank, world_size=world_size, local_rank=local_rank,
                        gpus_per_node=spec.gpus_per_node, device=device)
        torch.manual_seed(s.seed)
        trainer = family(spec.strategy).setup(spec, topo=topo)
        batches = [synthetic_batch(spec.model_config, seed=s.seed, rank=rank, micro_batch=s.micro_batch,
                                   seq_len=s.seq_len, micro_step=i, device=device) for i in range(s.grad_accum)]
        t_ready = time.time()
        step = _step_fn(trainer, batches, FaultInjector(s.inject, rank=rank, device=device))
        warm_times, warm_losses = time_steps(step, n=s.warmup_steps, device=device)
        meter = MemoryMeter(device)
        dist.barrier()
        meter.reset()
        dynamo_warm = dynamo_meter.snapshot()
        times, losses = time_steps(step, n=s.measure_steps, device=device)
        mem = meter.read()
        dynamo = dynamo_meter.snapshot()
        # NOTE: collectives are counted (and timed one by one) over one more step after the timed ones, as
        # steady as they were: the timed steps never run the meter. (Not the last warmup step: DDP broadcasts
        # its rebuilt bucket order in step 2.) Its loss is not among the recorded losses.
        comm = CommMeter(timed=True, device=device).install()
        with comm.measure():
            counted_times, _ = time_steps(step, n=1, device=device)
        comm.uninstall()
        comm_summary = comm.summary(steps=1, gpus_per_node=spec.gpus_per_node)
        comm_summary["counted_step"] = s.warmup_steps + s.measure_steps + 1
        comm_summary["counted_step_time_s"] = counted_times[0]

        # ---- aggregation over ranks (outside the timed region) ----
        local = torch.stack([l.float().reshape(()) for l in warm_losses + losses]).to(device)
        per_rank = [torch.empty_like(local) for _ in range(world_size)]
        dist.all_gather(per_rank, local)
        per_rank_losses = torch.stack(per_rank).cpu()  # (rank, step)
        all_losses = per_rank_losses.double().mean(0).tolist()
        step_times = torch.tensor(times, dtype=torch.float64, device=device)
        dist.all_reduce(step_times, op=dist.ReduceOp.MAX)  # a step ends when its slowest rank ends
        # max over ranks of: peak allocated, peak reserved, frames dynamo compiled in the measured steps (a
        # recompilation on any rank stalls every rank's step)
        peaks = torch.tensor([mem["peak_memory_allocated_gib"] or -1.0, mem["peak_memory_reserved_gib"] or -1.0,
                              dynamo["frames"] - dynamo_warm["frames"]], dtype=torch.float64, device=device)
        dist.all_reduce(peaks, op=dist.ReduceOp.MAX)
        hosts: list[str | None] = [None] * world_size
        dist.all_gather_object(hosts, node_name())
        if rank != 0:
            return None

        env = envmod.capture(device.type)
        env["prefork"] = prefork.FORKED  # forked from the sweep's warm interpreter, not started cold
        if getattr(trainer, "config", None) is not None:
            env["deepspeed_config"] = trainer.config
        env.update(backend=backend, hostnames=sorted(set(hosts)), harness_git_sha=payload.get("git_sha"))
        if payload.get("job_id") is not None:  # under SLURM: submitit's id (<array>_<index> for array tasks)
            env.update(slurm_job_id=payload["job_id"],
                       slurm_restart_count=int(os.environ.get("SLURM_RESTART_COUNT", "0")))
        samples = step_times.tolist()
        summary = summarize(samples)
        tokens = spec.tokens_per_step
        flops_per_step = spec.model_config.flops_per_token(s.seq_len) * tokens
        tflops_per_gpu = flops_per_step / world_size / summary["median"] / 1e12
        null_reasons = dict(mem["null_reasons"])
        mfu, hfu, peak_tflops = utilisation(spec, tflops_per_gpu, device_type=device.type,
                                            device_name=env["device_name"], allow_tf32=env["allow_tf32"],
                                            null_reasons=null_reasons)
        start = _process_start_time()
        if s.compile:
            # the first step traces and compiles; what it took beyond a steady step is the compile cost
            compile_s = max(0.0, warm_times[0] - summary["median"])
        else:
            compile_s = None
            null_reasons["compile_s"] = "compile is off for this cell"
        record["metrics"] = {
            "step_time_s": summary,
            "tokens_per_s": tokens / summary["median"],
            "tokens_per_s_per_gpu": tokens / summary["median"] / world_size,
            "tflops_per_gpu": tflops_per_gpu,
            "mfu": mfu,
            "hfu": hfu,
            "mfu_peak_tflops": peak_tflops,
            "peak_memory_allocated_gib": None if peaks[0] < 0 else float(peaks[0]),
            "peak_memory_reserved_gib": None if peaks[1] < 0 else float(peaks[1]),
            "alloc_retries": mem["alloc_retries"],
            "loss": all_losses[-1],
            "losses": all_losses,
            "n_params": spec.model_config.n_params(),
            "flops_per_step": flops_per_step,
            "tokens_per_step": tokens,
            "setup_s": t_ready - t_entry,
            "warmup_step_times_s": warm_times,
            "compile_s": compile_s,
            "startup_s": None if start is None else t_ready - start,
            "dynamo": dict(dynamo, frames_in_measured_steps=int(peaks[2])),
            "null_reasons": null_reasons,
        }
        if peaks[2] > 0:
            record["reason"] = (f"torch.compile compiled {int(peaks[2])} frame(s) during the measured steps "
                                "(recompilation): those steps' times include compile time; raise warmup_steps "
                                "or look for the changing guard with TORCH_LOGS=recompiles")
        if start is None:
            null_reasons["startup_s"] = "process start time unavailable (/proc/self/stat)"
        bad = (~torch.isfinite(per_rank_losses)).nonzero().tolist()  # [rank, step] pairs
        if bad:
            bad_rank, first = min(bad, key=lambda rs: (rs[1], rs[0]))
            record.update(status="nan", failed_rank=bad_rank,
                          reason=f"loss is not finite at step {first + 1} "
                                 f"({'warmup' if first < s.warmup_steps else 'measured'}), first on rank {bad_rank}")
        record["comm"] = comm_summary
        predicted_comm = (record.get("predicted") or {}).get("comm_bytes_per_step")
        if predicted_comm:
            record["predicted"]["comm_deviation"] = comm_summary["bytes_per_step"] / predicted_comm - 1.0
        record["env"] = env
        record["finished_at"] = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
        write_record(payload["results"], record)
        return record
    except BaseException as e:
        status = "oom" if _is_oom(e) else "timeout" if _is_slurm_time_limit(e) else "error"
        extra = {"traceback": traceback.format_exc(limit=30)}
        if status == "oom":
            if torch.cuda.is_available():
                extra["memory_allocated_gib"] = torch.cuda.memory_allocated() / 2**30
                extra["memory_reserved_gib"] = torch.cuda.memory_reserved() / 2**30
            else:
                from harness.worker.meters.memory import rss_bytes

                extra["memory_rss_gib"] = (rss_bytes() or 0) / 2**30
        write_fragment(payload, rank, status, f"{type(e).__name__}: {e}".strip()[:2000], extra)
        raise
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def _step_fn(trainer, batches, injector):
    """The callable the worker times: the trainer's step, with the fault injector in front only when armed."""
    if injector.fault is None:
        return lambda: trainer.step(batches)
    count = 0

    def step():
        nonlocal count
        count += 1
        injector.before_step(count, trainer.model)
        return trainer.step(batches)

    return step


def _forget_earlier_run(payload: dict, job_env: Any) -> None:
    """A requeued SLURM job runs again with the same payload: this rank's fragment and submitit result file from
    the run that was interrupted (requeue, preemption) must not be taken for this run's."""
    if os.environ.get("SLURM_RESTART_COUNT", "0") != "0":
        rank = job_env.global_rank
        (fragment_dir(payload["results"], payload["sweep"], payload["run_id"]) / f"rank{rank}.json").unlink(
            missing_ok=True)
        job_env.paths.result_pickle.unlink(missing_ok=True)


def submitit_entry(payload: dict[str, Any]) -> None:
    """Entry point of every submitit task: rank and rendezvous come from submitit's job environment."""
    import submitit

    job_env = submitit.JobEnvironment()
    port = payload.get("master_port")
    if os.environ.get("SUBMITIT_EXECUTOR") == "slurm":
        payload = dict(payload, job_id=job_env.job_id)
        _forget_earlier_run(payload, job_env)
    if port is None:
        # on a cluster, all tasks derive the same port from the job id (submitit's formula, without its reading of
        # MASTER_PORT: sbatch copies the submitter's environment, and one inherited port would serve every job)
        port = random.Random(job_env.job_id).randint(20000, 60000)
    rank = dict(rank=job_env.global_rank, world_size=job_env.num_tasks, local_rank=job_env.local_rank,
                master_addr=job_env.hostnames[0] if payload.get("master_port") is None else "127.0.0.1",
                master_port=int(port))
    code = prefork.run_forked(payload, **rank)  # a warm fork of this rank, when a local sweep started a zygote
    if code is None:
        run(payload, **rank)
    elif code < 0:
        prefork.exit_like(code)  # died of a signal: so does this task, as the rank itself would have
    elif code > 0:
        raise RuntimeError(f"rank {job_env.global_rank} exited with code {code} (its fragment and log say why)")


def main(argv: list[str] | None = None) -> int:
    """`python -m harness.worker.runner PAYLOAD.json` under torchrun-style environment variables."""
    argv = sys.argv[1:] if argv is None else argv
    payload = json.loads(Path(argv[0]).read_text())
    rank = dict(rank=int(os.environ["RANK"]), world_size=int(os.environ["WORLD_SIZE"]),
                local_rank=int(os.environ.get("LOCAL_RANK", os.environ["RANK"])),
                master_addr=os.environ.get("MASTER_ADDR", "127.0.0.1"), master_port=int(os.environ["MASTER_PORT"]))
    code = prefork.run_forked(payload, **rank)  # a warm fork of this rank, when a local sweep started a zygote
    if code is not None:
        prefork.exit_like(code)
    try:
        run(payload, **rank)
    except BaseException:  # noqa: BLE001 - the fragment has the details; the exit code tells the launcher
        traceback.print_exc()
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
