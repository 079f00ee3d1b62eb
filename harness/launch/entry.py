"""Where a rank process starts: the launch side of one rank, between the launcher that started the process and the
worker that benchmarks (`harness.worker.runner.run`).

Two entry points, one per way a rank is started:
  `submitit_entry(payload)`  every submitit task (local sweeps; SLURM cells through jobs.SlurmCell): rank and
                             rendezvous from submitit's job environment
  `python -m harness.launch.entry PAYLOAD.json`  the foreground launcher's and a packed SLURM job's children, under
                             torchrun-style RANK/WORLD_SIZE/LOCAL_RANK/MASTER_ADDR/MASTER_PORT variables
Either one first asks a local sweep's warm zygote to fork the rank (harness.launch.local.prefork) and then only
relays its exit; without a zygote it runs the rank itself.

Why a module of its own: the worker measures and records, and knows nothing of how it was launched (whether it
was forked is passed to `run` as a fact); a requeued SLURM job's leftovers, the port a cluster job derives, and
the zygote are the launcher's business.
"""

from __future__ import annotations

import os
import sys
import traceback
from pathlib import Path
from typing import Any

from harness.core.ports import derived_port
from harness.launch.local import prefork
from harness.results.payload import Payload
from harness.results.store import fragment_dir
from harness.worker.runner import run


def _forget_earlier_run(payload: Payload, job_env: Any) -> None:
    """A requeued SLURM job runs again with the same payload: this rank's fragment, heartbeat and submitit result
    file from the run that was interrupted (requeue, preemption) must not be taken for this run's."""
    if os.environ.get("SLURM_RESTART_COUNT", "0") != "0":
        rank = job_env.global_rank
        folder = fragment_dir(payload.results, payload.sweep, payload.run_id)
        (folder / f"rank{rank}.json").unlink(missing_ok=True)
        (folder / f"beat{rank}.json").unlink(missing_ok=True)  # its heartbeat, stopped when that run was interrupted
        job_env.paths.result_pickle.unlink(missing_ok=True)


def submitit_entry(payload: Payload) -> None:
    """Entry point of every submitit task: rank and rendezvous come from submitit's job environment."""
    import submitit

    job_env = submitit.JobEnvironment()
    port = payload.master_port
    if os.environ.get("SUBMITIT_EXECUTOR") == "slurm":
        payload = payload.model_copy(update={"job_id": job_env.job_id})
        _forget_earlier_run(payload, job_env)
    if port is None:
        # on a cluster, all tasks derive the same port from the job id (submitit's formula, without its reading of
        # MASTER_PORT: sbatch copies the submitter's environment, and one inherited port would serve every job)
        port = derived_port(job_env.job_id)
    rank: dict[str, Any] = dict(
        rank=job_env.global_rank,
        world_size=job_env.num_tasks,
        local_rank=job_env.local_rank,
        master_addr=job_env.hostnames[0] if payload.master_port is None else "127.0.0.1",
        master_port=int(port),
    )
    code = prefork.run_forked(payload, **rank)  # a warm fork of this rank, when a local sweep started a zygote
    if code is None:
        run(payload, **rank)
    elif code < 0:
        prefork.exit_like(code)  # died of a signal: so does this task, as the rank itself would have
    elif code > 0:
        raise RuntimeError(f"rank {job_env.global_rank} exited with code {code} (its fragment and log say why)")


def main(argv: list[str] | None = None) -> int:
    """`python -m harness.launch.entry PAYLOAD.json` under torchrun-style environment variables."""
    argv = sys.argv[1:] if argv is None else argv
    payload = Payload.model_validate_json(Path(argv[0]).read_bytes())
    rank: dict[str, Any] = dict(
        rank=int(os.environ["RANK"]),
        world_size=int(os.environ["WORLD_SIZE"]),
        local_rank=int(os.environ.get("LOCAL_RANK", os.environ["RANK"])),
        master_addr=os.environ.get("MASTER_ADDR", "127.0.0.1"),
        master_port=int(os.environ["MASTER_PORT"]),
    )
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
