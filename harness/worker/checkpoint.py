"""The checkpoint phase (`checkpoint: true`): after the timed steps, save the full training state the strategy's way,
load it into a freshly built model and optimizer, and train on — timing the save and the load, counting what was
written, and checking that training resumes exactly.

Called once by harness.worker.runner after the timed (and counted, and traced) steps, on every rank:

1. where: `<checkpoint_dir>/<run_id>.<attempt>/` — the cluster profile's `checkpoint_dir` (a shared file system on
   SLURM: ranks on different nodes write and read the same folder), else `<results>/<sweep>/.checkpoints/`. Rank 0
   makes it and every rank tries to write in it before anything is saved, so an unwritable dir is one clear reason,
   not a failure inside a library's collective.
2. save: the family's `save_checkpoint` (DCP with sharded state dicts for FSDP/FSDP2, rank 0's torch.save for DDP,
   DeepSpeed's save_checkpoint for ZeRO) and an fsync of its files (a checkpoint counts once it is on storage),
   between barriers; each rank's own time is kept, the slowest reported.
3. rank 0 counts the files and bytes under the folder (every rank's, on the shared folder).
4. the reference: two more steps of the uninterrupted trainer, their losses kept.
5. load: a fresh trainer (the same build as the measured one: keyed init, same seed), the family's
   `load_checkpoint` between barriers, timed like the save.
6. two steps of the fresh trainer: the first step's loss checks the model's state (its forward runs on the loaded
   parameters), the second's the optimizer's (AdamW's moments and step count made the update between them).
   `resume_loss_delta` is the larger of the two differences from the reference (signed; 0.0 for a correct
   checkpoint).
7. the folder is deleted, also after a failure.

A save or load that raises (disk full, an unwritable dir, a truncated file) ends the phase on every rank with the
reason; the runner then writes the cell's record with its measured steps and status `error` (nothing else is lost).
"""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness.results.payload import Payload
from harness.results.record import Checkpoint, Record
from harness.results.store import sanitize, sweep_dir, unwritable_reason
from harness.scenario.spec import RunSpec

CHECKPOINTS_DIR = ".checkpoints"
"""the default checkpoint folder's name under the sweep's results folder (hidden: the record walk skips it)"""
RESUME_STEPS = 2
"""steps run after the reload (and by the uninterrupted reference): the first checks the model, the second the
optimizer state"""
TRUNCATE_FAULT = "checkpoint_truncate"
"""`inject: {fault: checkpoint_truncate}`: after the save, every file of the checkpoint is cut to half its length, so
the load must fail (a fault test of the failure path)"""


@dataclass
class CheckpointOutcome:
    """What the phase measured, the same on every rank; `failure` says why it stopped (None: it finished)."""

    fields: dict[str, Any] = field(default_factory=dict)
    """harness.results.record.Checkpoint's fields"""
    null_reasons: dict[str, str] = field(default_factory=dict)
    """`checkpoint.<field>` → why it is null"""
    failure: str | None = None
    """the reason the cell's record gets (status error), or None"""


def checkpoint_root(payload: Payload) -> Path:
    """Where this cell's checkpoint goes: `<checkpoint_dir>/<run_id>.<attempt>`; checkpoint_dir is the cluster
    profile's, else the sweep's results folder's `.checkpoints`."""
    base = payload.cluster.checkpoint_dir
    root = Path(base) if base else sweep_dir(payload.results, payload.sweep) / CHECKPOINTS_DIR
    return root / f"{payload.run_id}.{payload.attempt or 'manual'}"


def run_checkpoint(
    trainer: Any,
    step: Callable[[], Any],
    *,
    spec: RunSpec,
    payload: Payload,
    rank: int,
    device: Any,
    steps_done: int,
    fresh: Callable[[], tuple[Any, Callable[[], Any]]],
) -> CheckpointOutcome:
    """The phase on this rank (collective: every rank calls it). `step` runs one step of `trainer`; `steps_done`:
    optimizer steps trained so far (the step the checkpoint holds); `fresh()` builds a new trainer like the measured
    one and returns it with its step function. `loss_ranks` of a trainer are honoured like the runner's."""
    from harness.worker.strategies import family

    fam = family(spec.strategy)
    out = CheckpointOutcome()
    folder = checkpoint_root(payload)
    out.fields["dir"] = str(folder.parent)
    out.fields["step"] = steps_done
    try:
        failure = _prepare(folder, rank=rank)
        if failure is None:
            node_leader = rank % spec.gpus_per_node == 0

            def save() -> str:
                fmt = fam.save_checkpoint(trainer, folder, step=steps_done)
                _make_durable(folder, node_leader=node_leader)
                return fmt

            save_s, failure, fmt = _timed_collective(save, what="save", device=device)
            if failure is None:  # NOTE: a failed save's time is how long it took to fail: not a save time
                out.fields.update(format=fmt, save_s=max(save_s), save_s_per_rank=save_s)
        if failure is None:
            n_files, n_bytes = _files_and_bytes(folder, rank=rank)
            out.fields.update(files=n_files, bytes=n_bytes)
            if (spec.settings.inject or {}).get("fault") == TRUNCATE_FAULT:
                _truncate(folder, rank=rank)
            reference = _losses(step, trainer, n=RESUME_STEPS, device=device)
            new_trainer, new_step = fresh()
            loaded: list[int] = []
            load_s, failure, _ = _timed_collective(
                lambda: loaded.append(fam.load_checkpoint(new_trainer, folder)), what="load", device=device
            )
            if failure is None:
                if loaded[0] != steps_done:
                    failure = f"checkpoint load returned step {loaded[0]}, the save was at step {steps_done}"
                else:
                    out.fields.update(load_s=max(load_s), load_s_per_rank=load_s)
                    resumed = _losses(new_step, new_trainer, n=RESUME_STEPS, device=device)
                    deltas = [r - u for r, u in zip(resumed, reference)]
                    out.fields["resume_loss_delta"] = max(deltas, key=abs)
                    out.fields["resume_losses"] = resumed
            del new_trainer, new_step
    except BaseException:
        if rank == 0:  # NOTE: no barrier: the other ranks may be anywhere; the cell ends in its error record
            shutil.rmtree(folder, ignore_errors=True)
        raise
    _remove(folder, rank=rank)
    out.failure = failure
    _null_reasons(out)
    return out


def into_record(record: Record, out: CheckpointOutcome) -> Record:
    """Rank 0's record with the phase's `metrics.checkpoint` (and its null reasons); status error with the failure
    as its reason when the phase failed (the measured steps stay in the record)."""
    metrics = record.metrics.model_copy(
        update={
            "checkpoint": Checkpoint.model_validate(sanitize(out.fields)),
            "null_reasons": {**(record.metrics.null_reasons or {}), **out.null_reasons},
        }
    )
    update: dict[str, Any] = {"metrics": metrics}
    predicted, measured = record.predicted, out.fields.get("bytes")
    if predicted is not None and predicted.checkpoint_bytes and measured is not None:
        deviation = measured / predicted.checkpoint_bytes - 1.0
        update["predicted"] = predicted.model_copy(update={"checkpoint_bytes_deviation": deviation})
    if out.failure is not None and record.status == "ok":
        update.update(status="error", reason=out.failure)
    return record.model_copy(update=update)


def _null_reasons(out: CheckpointOutcome) -> None:
    """Every measurement the phase did not reach is null, with the failure (or a dry run's reason) as its reason."""
    why = out.failure or "not measured"
    for name in ("save_s", "load_s", "bytes", "files", "resume_loss_delta"):
        if out.fields.get(name) is None:
            out.null_reasons[f"checkpoint.{name}"] = why
    for name in Checkpoint.model_fields:  # every field in every record, null where the phase did not reach it
        out.fields.setdefault(name, None)


def _agree(error: str | None) -> str | None:
    """Every rank's error, gathered: the first rank's that had one (`rank N: …`), the same on every rank."""
    import torch.distributed as dist

    errors: list[str | None] = [None] * dist.get_world_size()
    dist.all_gather_object(errors, error)
    return next((f"rank {r}: {e}" for r, e in enumerate(errors) if e is not None), None)


def _prepare(folder: Path, *, rank: int) -> str | None:
    """Rank 0 makes the folder; then every rank tries to write in it. The reason it cannot, or None."""
    error = None
    if rank == 0:
        error = unwritable_reason(folder)
        if error is None:
            try:
                folder.mkdir(parents=True, exist_ok=True)
            except OSError as e:
                error = f"{type(e).__name__}: {e}"
    error = _agree(None if error is None else f"checkpoint dir {folder}: {error}")
    if error is not None:
        return error
    why = unwritable_reason(folder)  # NOTE: a node whose mount of the shared folder is read-only says so here
    return _agree(None if why is None else f"checkpoint dir {folder}: {why}")


def _timed_collective(fn: Callable[[], Any], *, what: str, device: Any) -> tuple[list[float], str | None, Any]:
    """(every rank's time (s), the failure or None, what fn returned on this rank): fn between barriers, each rank
    timed from the first barrier to its own end (device synchronised)."""
    import torch.distributed as dist
    from torch.distributed.checkpoint.api import CheckpointException

    from harness.worker.meters.timing import synchronize

    result, error = None, None
    dist.barrier()
    t0 = time.perf_counter()
    try:
        result = fn()
        synchronize(device)
    # NOTE: DCP's CheckpointException is a BaseException: every rank's failure, gathered by DCP itself
    except (Exception, CheckpointException) as e:  # noqa: BLE001 - disk full, unwritable, a truncated file
        error = f"checkpoint {what} failed: {_describe(e)}"[:1000]
    elapsed = time.perf_counter() - t0
    times: list[float] = [0.0] * dist.get_world_size()
    dist.all_gather_object(times, elapsed)
    return times, _agree(error), result


def _make_durable(folder: Path, *, node_leader: bool) -> None:
    """A save ends when its files are on storage, not in the page cache: the first rank of each node fsyncs every
    file of the checkpoint (its node's dirty pages go out; another node's files are clean here, a cheap fsync), then
    every rank waits for all nodes. torch.save and DeepSpeed do not sync; DCP syncs its own files (sync_files)."""
    import torch.distributed as dist

    if node_leader:
        for p in sorted(folder.rglob("*")):
            if p.is_file():
                fd = os.open(p, os.O_RDONLY)
                try:
                    os.fsync(fd)
                finally:
                    os.close(fd)
    dist.barrier()


def _describe(e: BaseException) -> str:
    """`Type: message` of a failure; for DCP's CheckpointException, its first failing rank's exception (not every
    rank's traceback)."""
    failures = getattr(e, "failures", None)
    if isinstance(failures, dict) and failures:
        rank, (inner, _) = min(failures.items())
        return f"{type(e).__name__} on rank {rank}: {type(inner).__name__}: {inner}".strip()
    return f"{type(e).__name__}: {e}".strip()


def _files_and_bytes(folder: Path, *, rank: int) -> tuple[int, int]:
    """(files, bytes) under the folder, counted by rank 0 and shared: every rank's files, on the shared folder."""
    import torch.distributed as dist

    counted = [0, 0]
    if rank == 0:
        sizes = [p.stat().st_size for p in folder.rglob("*") if p.is_file()]
        counted = [len(sizes), sum(sizes)]
    shared = [counted]
    dist.broadcast_object_list(shared, src=0)
    return int(shared[0][0]), int(shared[0][1])


def _truncate(folder: Path, *, rank: int) -> None:
    """The truncate fault: rank 0 cuts every file of the checkpoint to half its length."""
    import torch.distributed as dist

    if rank == 0:
        for p in folder.rglob("*"):
            if p.is_file():
                with p.open("r+b") as f:
                    f.truncate(p.stat().st_size // 2)
    dist.barrier()


def _losses(step: Callable[[], Any], trainer: Any, *, n: int, device: Any) -> list[float]:
    """n steps' losses, each the mean over the ranks whose loss counts (the trainer's `loss_ranks`, else all)."""
    import torch
    import torch.distributed as dist

    local = torch.stack([step().float().reshape(()) for _ in range(n)]).to(device)
    per_rank = [torch.empty_like(local) for _ in range(dist.get_world_size())]
    dist.all_gather(per_rank, local)
    stacked = torch.stack(per_rank).cpu().double()
    ranks = getattr(trainer, "loss_ranks", None)
    return (stacked if ranks is None else stacked[ranks]).mean(0).tolist()


def _remove(folder: Path, *, rank: int) -> None:
    """Rank 0 deletes the checkpoint (and the default `.checkpoints` folder once empty) after every rank is done."""
    import torch.distributed as dist

    dist.barrier()
    if rank == 0:
        shutil.rmtree(folder, ignore_errors=True)
        if folder.parent.name == CHECKPOINTS_DIR:
            try:
                folder.parent.rmdir()
            except OSError:  # another cell's checkpoint is still there, or it never existed
                pass
