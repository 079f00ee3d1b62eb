"""The record: one JSON file per cell (`results/<sweep>/<run_id>.json`), as typed models with their units.

Rank 0 of the cell writes it (harness.worker.runner); when rank 0 could not, the launcher composes it from the
ranks' failure fragments and the job's logs (harness.launch.core.outcome); a cell never launched gets a `skipped`
record. Every reader gets these objects from harness.results.store, never the raw JSON.

Record contract v1: later versions of the harness add fields and never rename one. A field added after the first
records were written, or written only in some cases, is marked SOMETIMES (a file may lack it); the others are in
every record of their kind (possibly null). `metrics` and `env` are `{}` (or nearly) in records rank 0 did not
write, which is why their fields default to None here and `Record.contract_problems` says what a record of each
kind must hold. The README's "Record contract" table documents every field below; tests/unit/test_record_schema.py
holds the two, the example record and the stored records to each other.

The numbers a record holds are `Num` (int or float as written: a file's `6000` stays an int, so what compare and
history print of it does not change).
"""

from __future__ import annotations

from typing import Annotated, Any, Final, Literal

from pydantic import Field, PrivateAttr

from harness.core.typed import SOMETIMES, Typed, sometimes
from harness.plan.prediction import Prediction
from harness.results.spec import SpecJSON

SCHEMA_VERSION: Final = 1
STATUSES: tuple[str, ...] = ("ok", "oom", "timeout", "error", "nan", "crashed", "cancelled", "skipped")
Status = Literal["ok", "oom", "timeout", "error", "nan", "crashed", "cancelled", "skipped"]
"""a cell's outcome (STATUSES, in the same order)"""
Num = int | float
"""a JSON number as written (an int stays an int)"""


# ---------------------------------------------------------------------------------------------------------------
# metrics: what rank 0 measured (over every rank)


class StepTime(Typed):
    """Optimizer step time, each measured step between device synchronisations, the slowest rank's (s)."""

    median: Num | None = None
    """median step time (s)"""
    p10: Num | None = None
    """10th percentile (s, linear interpolation)"""
    p90: Num | None = None
    """90th percentile (s)"""
    mean: Num | None = None
    """mean step time (s)"""
    samples: list[Num | None] | None = None
    """every measured step's time (s), in order"""

    def finite_samples(self) -> list[float]:
        """The samples that are numbers (a value a reader could not take is null)."""
        return [float(s) for s in self.samples or () if s is not None]


class Dynamo(Typed):
    """What torch.compile compiled (counts)."""

    frames: int | None = None
    """frames dynamo compiled on rank 0, recompilations included (count)"""
    graphs: int | None = None
    """distinct graphs on rank 0 (count)"""
    graph_breaks: int | None = None
    """graph breaks on rank 0 (count)"""
    frames_in_measured_steps: int | None = None
    """frames compiled during the measured steps, max over ranks (count; > 0: recompilation timed)"""


class RankStep(Typed):
    """One rank's traced step (harness.worker.meters.profile)."""

    rank: int | None = None
    """the rank"""
    step: Num | None = None
    """its traced step's wall time (s)"""
    comm_exposed: Num | None = None
    """the communication it waited for (s)"""
    compute: Num | None = None
    """its compute (s)"""


class TimeBreakdown(Typed):
    """The traced step split into the parts of predicted.time_s, from the slowest rank's profiler trace (s);
    compute + recompute + optimizer + comm_exposed + other = window (docs/time-model.md, "Measured breakdown")."""

    step: Num | None = None
    """the slowest rank's traced step, perf_counter around it and its device synchronisation (s): the median of
    `steps`, whose parts these are"""
    steps: list[Num] | None = None
    """every traced step's wall time, the slowest rank's, in the order they ran (s); absent in records before
    several steps were traced"""
    index: int | None = None
    """which of `steps` (0-based) is the median one: `step` and the parts are its"""
    untraced_steps: list[Num] | None = None
    """the untraced steps run just before and just after the traced ones (the same steps without the profiler,
    adjacent in time), the slowest rank's wall time each, in the order they ran (s); absent in older records"""
    profiler_cost: Num | None = None
    """the traced steps' median over `untraced_steps`' median (ratio): the profiler's own cost to the step, measured
    beside it (1.0: none); null when the untraced steps' median is 0"""
    compute: Num | None = None
    """busy outside the optimizer and recomputation (s)"""
    recompute: Num | None = None
    """busy inside a checkpointed block's recomputation (s); null: not separable (compiled blocks)"""
    optimizer: Num | None = None
    """busy inside the optimizer's step and zero_grad (s)"""
    comm_exposed: Num | None = None
    """idle while a collective runs: the communication the rank waits for (s)"""
    other: Num | None = None
    """idle with no collective running: host overhead between operators, launch gaps (s)"""
    comm_total: Num | None = None
    """time a collective ran during the step, hidden or not (s)"""
    window: Num | None = None
    """the traced step's own interval (its perf_counter wall time placed on the trace's clock; the annotation in a
    trace without that clock): what the parts add up to (s)"""
    slowest_rank: int | None = None
    """the rank whose traced step took longest (whose parts these are)"""
    spread_s: Num | None = None
    """slowest − fastest rank's traced step (s)"""
    waits_least_rank: int | None = None
    """the rank with the least exposed communication: the one the others wait for"""
    by_rank: list[RankStep] | None = None
    """every rank's traced step, exposed communication and compute"""
    basis: str | None = None
    """what was taken as busy: `device kernels` (GPU) or `main thread operators` (CPU)"""
    null_reasons: dict[str, str] | None = None
    """part → why it is null"""


class Checkpoint(Typed):
    """The checkpoint phase (`checkpoint: true`, harness.worker.checkpoint): the full training state saved the
    strategy's way after the timed steps, loaded into a fresh model and optimizer, and trained on."""

    format: str | None = None
    """how it was written: dcp (FSDP, FSDP2: torch.distributed.checkpoint, sharded) | torch.save (rank 0) (DDP) |
    deepspeed (ZeRO: engine.save_checkpoint)"""
    dir: str | None = None
    """the folder the checkpoint was written under (deleted after measuring)"""
    step: int | None = None
    """the optimizer steps the saved state holds (count)"""
    save_s: Num | None = None
    """the save between barriers, the slowest rank's (s); null: see null_reasons['checkpoint.save_s']"""
    save_s_per_rank: list[Num] | None = None
    """every rank's save time, by rank (s)"""
    load_s: Num | None = None
    """the load into a fresh model and optimizer between barriers, the slowest rank's (s)"""
    load_s_per_rank: list[Num] | None = None
    """every rank's load time, by rank (s)"""
    bytes: int | None = None
    """bytes written, every rank's files (B)"""
    files: int | None = None
    """files written, every rank's (count)"""
    resume_loss_delta: Num | None = None
    """loss after the reload minus the uninterrupted run's loss of the same step, the larger of the two steps after
    it (nats; 0.0 for a correct checkpoint)"""
    resume_losses: list[Num] | None = None
    """the losses of the steps after the reload, mean over ranks (nats)"""


class TensorMemory(Typed):
    """Tensor memory measured over one untimed step by storage-level accounting (harness.worker.meters.tensors):
    the bytes of every live tensor storage on the rank with the largest peak, at that peak, split into the planner's
    categories (`predicted.memory_gib` holds the same names). GiB = 2**30 B."""

    params: Num
    """parameter storages this rank keeps between steps (its shards, or the full replica)"""
    grads: Num
    """gradient storages: every parameter's `.grad` (of the model's and of a sharded optimizer's fp32 partition), and
    the strategy's gradient buffers they are views of (DDP's buckets)"""
    optimizer: Num
    """optimizer state (AdamW's moments) and a master copy the optimizer steps (DeepSpeed's fp32 partitions)"""
    activations: Num
    """storages created by the forward (or a checkpointed block's recompute) that are neither parameters nor
    communication buffers: what backward still needs, live at the peak"""
    buffers: Num
    """everything else: communication buffers (gathered parameters, reduce buckets), backward's temporaries,
    gradients in flight before they are reduced, persistent tables"""
    total: Num
    """the sum of the five: the peak of live tensor bytes"""
    rank: int
    """the rank the breakdown is from (the largest total over ranks)"""
    phase: str
    """where that rank's peak fell: forward, backward or optimizer"""
    per_rank_total: list[Num]
    """every rank's peak total, by rank (GiB)"""
    meter_s: Annotated[Num | None, SOMETIMES] = None
    """the measured step's wall time under the meter, the slowest rank's (s): what the measurement cost, outside
    every timed step"""
    host: Annotated[Num | None, SOMETIMES] = None
    """on an accelerator, the peak of tensor storages in host memory (offload's states), the largest rank's (GiB),
    beside predicted.cpu_memory_gib; 0 on CPU, where the host is the device and every storage is in the categories"""
    off_thread_frees: Annotated[int | None, SOMETIMES] = None
    """storages whose last reference died on another thread (a collective's worker), over all ranks (count): each is
    placed right after the measured thread's last operator on it, not when the worker let go (which depends on
    scheduling), so the measurement repeats to the byte"""


class Metrics(Typed):
    """What rank 0 measured (status ok, or nan: the numbers of the steps that ran); `{}` in a record rank 0 did not
    write (composed from failures, or skipped)."""

    step_time_s: StepTime | None = None
    """seconds per optimizer step"""
    tokens_per_s: Num | None = None
    """global throughput at the median step time (tokens/s)"""
    tokens_per_s_per_gpu: Num | None = None
    """tokens_per_s / gpus (tokens/s)"""
    tflops_per_gpu: Num | None = None
    """model FLOPs per GPU per second / 1e12 (TFLOPS)"""
    mfu: Num | None = None
    """model FLOPs utilisation: fraction of the device's dense peak (0.412 = 41.2 %); null: peak unknown"""
    hfu: Num | None = None
    """hardware FLOPs utilisation: MFU plus checkpointing's recompute (fraction); null: peak unknown"""
    mfu_peak_tflops: Annotated[Num | None, SOMETIMES] = None
    """the dense peak MFU divides by (TFLOPS); null: unknown"""
    peak_memory_allocated_gib: Num | None = None
    """max over ranks of the peak allocated after warmup (GiB, 2**30 B); CPU: peak RSS"""
    peak_memory_reserved_gib: Num | None = None
    """max over ranks of the allocator's peak reserved (GiB); null on CPU"""
    memory_gib: Annotated[TensorMemory | None, SOMETIMES] = None
    """measured tensor memory by category at the peak of one untimed step, beside `predicted.memory_gib`"""
    memory_fragmentation_gib: Annotated[Num | None, SOMETIMES] = None
    """CUDA: the allocator's peak reserved minus the peak of live tensor bytes (memory_gib.total): what caching and
    fragmentation cost on top of the tensors (GiB); null on CPU (no caching allocator)"""
    alloc_retries: Annotated[int | None, SOMETIMES] = None
    """cudaMalloc retries during the measured steps, the max over ranks (count); null on CPU"""
    loss: Num | None = None
    """the last step's loss, mean over ranks; null when not finite"""
    losses: list[Num | None] | None = None
    """every step's (warmup and measured) loss, mean over ranks"""
    n_params: int | None = None
    """model parameters (count)"""
    flops_per_step: Num | None = None
    """model FLOPs per optimizer step, all ranks (FLOP)"""
    tokens_per_step: Annotated[int | None, SOMETIMES] = None
    """tokens per optimizer step, all ranks (tokens)"""
    setup_s: Annotated[Num | None, SOMETIMES] = None
    """rank 0's worker entry → first step (s)"""
    warmup_step_times_s: Annotated[list[Num] | None, SOMETIMES] = None
    """each warmup step's time on rank 0 (s)"""
    compile_s: Annotated[Num | None, SOMETIMES] = None
    """the first warmup step's excess over the median step (s); null: not compiled"""
    startup_s: Annotated[Num | None, SOMETIMES] = None
    """rank 0's process start → first step (s); null: start time unavailable"""
    dynamo: Annotated[Dynamo | None, SOMETIMES] = None
    """torch.compile's counts"""
    time_s: Annotated[TimeBreakdown | None, SOMETIMES] = None
    """the traced step's measured breakdown (trace: true)"""
    checkpoint: Annotated[Checkpoint | None, SOMETIMES] = None
    """the checkpoint phase's save and load (only in `checkpoint: true` cells)"""
    null_reasons: dict[str, str] | None = None
    """metric name → why it is null"""

    def null_reason(self, name: str) -> str | None:
        """Why the metric `name` is null, when the record says."""
        return (self.null_reasons or {}).get(name)


# ---------------------------------------------------------------------------------------------------------------
# env: where it ran


class SlurmPack(Typed):
    """A cell's place in a packed SLURM job (`harness sweep --pack`)."""

    job_id: str | None = None
    """the pack's SLURM job id"""
    position: int | None = None
    """1-based position of the cell in its pack"""
    of: int | None = None
    """cells in the pack (count)"""


class Env(Typed):
    """Versions, device and hosts, as rank 0 saw them (harness.worker.env.capture and the worker). A record the
    launcher composed has only harness_git_sha and slurm_job_id (and slurm_pack); a skipped one none."""

    python: str | None = None
    """Python version"""
    torch: str | None = None
    """torch version"""
    cuda: str | None = None
    """CUDA version torch was built with; null: CPU build"""
    nccl: str | None = None
    """NCCL version; null on CPU"""
    deepspeed: str | None = None
    """DeepSpeed version; null: not installed"""
    transformers: Annotated[str | None, SOMETIMES] = None
    """transformers version, where the cell imported it (implementation: transformers); null otherwise"""
    model_class: Annotated[str | None, SOMETIMES] = None
    """the transformers class the cell trained (implementation: transformers; module.Class); null: the harness's
    own model"""
    device_type: str | None = None
    """cuda | cpu"""
    device_name: str | None = None
    """e.g. NVIDIA H100 80GB HBM3; cpu on CPU"""
    device_count: Annotated[int | None, SOMETIMES] = None
    """CUDA devices visible to rank 0 (count); null on CPU"""
    device_memory_gib: Num | None = None
    """rank 0's device's total memory (GiB); null on CPU"""
    cpu_count: Annotated[int | None, SOMETIMES] = None
    """os.cpu_count() on rank 0's host (count)"""
    torch_num_threads: Annotated[int | None, SOMETIMES] = None
    """torch's intra-op threads on rank 0 (count)"""
    allow_tf32: Annotated[bool | None, SOMETIMES] = None
    """fp32 matmuls may use TF32"""
    hostname: Annotated[str | None, SOMETIMES] = None
    """rank 0's host"""
    slurm_job_id: str | None = None
    """the SLURM job (submitit's id: <array>_<index> for array tasks); null outside SLURM"""
    slurm_restart_count: Annotated[int | None, SOMETIMES] = None
    """times SLURM requeued the job (count); only under SLURM"""
    prefork: Annotated[bool | None, SOMETIMES] = None
    """the ranks were forked from the sweep's warm interpreter"""
    cpu_allocator: Annotated[str | None, SOMETIMES] = None
    """what rank 0's malloc does with freed memory: 'caching (glibc ... mallopt ...)' or 'system ...' on a CPU
    (the profile's cpu_allocator, harness.worker.allocator); the CUDA caching allocator on a GPU"""
    deepspeed_config: Annotated[dict[str, Any] | None, SOMETIMES] = None
    """the config DeepSpeed ran with (ZeRO cells): the harness's own with the cell's `deepspeed_config` merged over it
    (harness.scenario.deepspeed_config.merged_config), and an `offload: nvme` cell's actual swap folder"""
    backend: str | None = None
    """torch.distributed backend: nccl | gloo"""
    hostnames: list[str] | None = None
    """every rank's node, sorted, once each"""
    harness_git_sha: str | None = None
    """the harness commit (-dirty: uncommitted changes); null outside a checkout"""
    slurm_pack: Annotated[SlurmPack | None, SOMETIMES] = None
    """the cell's place in its packed job"""


COMPOSED_ENV: frozenset[str] = frozenset({"harness_git_sha", "slurm_job_id", "slurm_pack"})
"""the env fields of a record the launcher composed (rank 0 wrote none): what the payload knew"""


# ---------------------------------------------------------------------------------------------------------------
# comm: the collectives of one counted step (harness.worker.meters.comm.CommMeter.summary)


class CollectiveStats(Typed):
    """One collective type (all_gather, reduce_scatter, …) per step."""

    calls: Num | None = None
    """calls per step (count)"""
    bytes: Num | None = None
    """bytes per step (B, nccl-tests convention)"""
    dtypes: Annotated[dict[str, Num] | None, SOMETIMES] = None
    """dtype → bytes per step (B)"""
    time_s: Annotated[Num | None, SOMETIMES] = None
    """its calls' time per step, each timed on its own (s)"""
    algbw_gbps: Annotated[Num | None, SOMETIMES] = None
    """algorithm bandwidth (GB/s, 1e9 B/s)"""
    busbw_gbps: Annotated[Num | None, SOMETIMES] = None
    """bus bandwidth, nccl-tests factors (GB/s)"""
    dtype: str | None = None
    """the dtype with the most bytes"""


class GroupStats(Typed):
    """The collectives of one group kind (intra | inter | mixed | unknown) per step."""

    calls: Num | None = None
    """calls per step (count)"""
    bytes: Num | None = None
    """bytes per step (B)"""


class CommGroup(Typed):
    """One process group's collectives per step."""

    ranks: list[int] | None = None
    """its global ranks"""
    kind: str | None = None
    """intra | inter | mixed | unknown"""
    calls: Num | None = None
    """calls per step (count)"""
    bytes: Num | None = None
    """bytes per step (B)"""


class Comm(Typed):
    """Collectives counted over one untimed step after the measured ones."""

    time_s_per_step: Annotated[Num | None, SOMETIMES] = None
    """time in collectives per step, each timed on its own (s); null: not timed"""
    bytes_per_step: Num | None = None
    """bytes per step, every collective (B)"""
    calls_per_step: Num | None = None
    """collective calls per step (count)"""
    by_collective: dict[str, CollectiveStats] | None = None
    """collective name → its totals"""
    by_group: dict[str, GroupStats] | None = None
    """group kind → its totals"""
    groups: Annotated[list[CommGroup] | None, SOMETIMES] = None
    """every process group that ran a collective"""
    measured_steps: Annotated[int | None, SOMETIMES] = None
    """steps counted (count)"""
    counted_step: Annotated[int | None, SOMETIMES] = None
    """1-based number of the counted step (warmup + measured + 2: after the tensor-memory step)"""
    counted_step_time_s: Annotated[Num | None, SOMETIMES] = None
    """the counted step's time, meter on (s)"""


# ---------------------------------------------------------------------------------------------------------------
# predicted: the planner's prediction (harness.plan.prediction.Prediction, its one model: the worker adds how the
# measurement compares, comm_deviation and step_time_deviation)

# ---------------------------------------------------------------------------------------------------------------
# layout: a tensor- or pipeline-parallel cell's mesh and stages (harness.worker.strategies.layouts)


class LayoutInfo(Typed):
    """How the cell's ranks split into data × tensor × pipeline parallel groups, and the model into stages."""

    tp: int | None = None
    """tensor-parallel ranks"""
    pp: int | None = None
    """pipeline-parallel ranks"""
    dp: int | None = None
    """data-parallel replicas: gpus / (tp × pp)"""
    dp_shard: int | None = None
    """ranks the data-parallel strategy shards over (the rest of a node beside tp for a hybrid)"""
    dp_replicate: int | None = None
    """replicas of the sharded state (1 unless hybrid)"""
    mesh: dict[str, int] | None = None
    """mesh dimension → size, outermost first (pp, dp, tp; pp, dp_replicate, dp_shard, tp for a hybrid)"""
    pp_schedule: str | None = None
    """the pipeline schedule; null without a pipeline"""
    n_stages: int | None = None
    """pipeline stages (pp × stages per rank; 1 without a pipeline)"""
    microbatches: int | None = None
    """pipeline microbatches per step; null without a pipeline"""
    sequence_parallel: bool | None = None
    """the norms ran on sequence shards"""
    loss_parallel: bool | None = None
    """cross-entropy ran on vocabulary-sharded logits"""
    stages: list[int] | None = None
    """blocks per stage, in stage order: the stage balance"""
    stage_blocks: list[list[int]] | None = None
    """the blocks of each stage"""
    stage_params: list[int] | None = None
    """parameters per stage (whole, before tensor- or data-parallel sharding)"""


# ---------------------------------------------------------------------------------------------------------------
# artifacts: files the cell wrote beside its record


class Artifacts(Typed):
    """Files beside the record, as paths relative to the record's folder."""

    traces: list[str] | None = None
    """each rank's profiler trace of the traced step, rank order (gzipped Chrome trace JSON: Perfetto opens it)"""


# ---------------------------------------------------------------------------------------------------------------
# failures: what each failed rank reported (composed records)


class Failure(Typed):
    """One rank's failure (its fragment), or a task's traceback the scheduler kept."""

    rank: int | None = None
    """the rank"""
    status: str | None = None
    """oom | timeout | error (its own verdict)"""
    reason: str | None = None
    """exception type and message"""
    traceback: str | None = None
    """its traceback (text)"""
    hostname: Annotated[str | None, SOMETIMES] = None
    """its node"""
    memory_allocated_gib: Annotated[Num | None, SOMETIMES] = None
    """CUDA memory allocated at an OOM (GiB)"""
    memory_reserved_gib: Annotated[Num | None, SOMETIMES] = None
    """CUDA memory reserved at an OOM (GiB)"""
    memory_rss_gib: Annotated[Num | None, SOMETIMES] = None
    """host RSS at a CPU OOM (GiB)"""


class Fragment(Failure):
    """What a failing rank writes before it dies (`.fragments/<run_id>/rank<k>.json`, harness.worker.runner), from
    which the launcher composes the record when rank 0 wrote none (harness.launch.core.outcome)."""

    attempt: str | None = None
    """the launch it belongs to (a stale attempt's fragments are ignored)"""
    time: Num | None = None
    """when it failed (s since the epoch): the first failure is the root cause"""

    def failure(self) -> Failure:
        """The part the record keeps (`failures[]`)."""
        keep = ("rank", "status", "reason", "hostname", "traceback")
        memory = ("memory_allocated_gib", "memory_reserved_gib", "memory_rss_gib")
        return Failure.model_validate({**{k: getattr(self, k) for k in keep + memory}})


class Beat(Typed):
    """A rank's heartbeat (`.fragments/<run_id>/beat<k>.json`): a thread of the rank rewrites it every second
    (harness.worker.heartbeat), so it stops when the process dies or freezes, whatever the cause. The launcher
    attributes a failure that raised no Python exception from it (an NCCL watchdog's abort, a SIGKILL, a frozen
    node): harness.launch.core.outcome."""

    rank: int
    """the rank"""
    attempt: str | None = None
    """the launch it belongs to (a stale attempt's beats are ignored)"""
    pid: int | None = None
    """the rank's process id on its host"""
    hostname: str | None = None
    """its node"""
    phase: str
    """what the rank was doing: setup | warmup | timed | counted | aggregate | record | ended"""
    phase_since: Num
    """when it entered that phase (s since the epoch)"""
    time: Num
    """when this beat was written (s since the epoch)"""
    ended: bool = False
    """the rank left the benchmark (returned or raised): its beats stop by design"""


# ---------------------------------------------------------------------------------------------------------------
# the record


class Record(Typed):
    """One cell's record, schema_version 1."""

    schema_version: Literal[1]
    """the contract's version"""
    run_id: str
    """<model>-<strategy>-<precision>-g<N>-<digest of spec>"""
    sweep: str | None = None
    """scenario name"""
    cluster: str | None = None
    """cluster profile name"""
    status: Status
    """the cell's outcome"""
    reason: str | None = None
    """why the status is not ok (or a note on ok numbers); null: none"""
    failed_rank: int | None = None
    """the first rank to fail; null: none or unknown"""
    spec: SpecJSON
    """the cell (harness.scenario.spec.RunSpec), written and read by harness.results.spec"""
    metrics: Metrics = Field(default_factory=Metrics)
    """what was measured; {} when rank 0 wrote no record"""
    env: Env = Field(default_factory=Env)
    """where it ran"""
    started_at: str | None = None
    """ISO-8601 UTC, to the second"""
    finished_at: str | None = None
    """ISO-8601 UTC, to the second"""
    attempt: Annotated[str | None, SOMETIMES] = None
    """the launch's id (12 hex digits): tells this launch's record and fragments from an earlier one's; null: a
    payload without one (written by hand for `python -m harness.worker.runner`)"""
    repeat: Annotated[int | None, SOMETIMES] = None
    """which run of its cell (`harness sweep --repeat K`, k >= 2); absent: the first"""
    predicted: Annotated[Prediction | None, SOMETIMES] = None
    """the planner's prediction; absent when no planner ran"""
    comm: Annotated[Comm | None, SOMETIMES] = None
    """collectives of one counted step; absent when rank 0 wrote no record"""
    layout: Annotated[LayoutInfo | None, SOMETIMES] = None
    """a tensor- or pipeline-parallel cell's mesh and stage balance; absent for every other cell"""
    artifacts: Annotated[Artifacts | None, SOMETIMES] = None
    """files the cell wrote beside the record (trace: true); absent otherwise"""
    failures: Annotated[list[Failure] | None, SOMETIMES] = None
    """each failed rank's report (composed records)"""
    log_tail: Annotated[str | None, SOMETIMES] = None
    """the job's last output, at most 4000 characters (composed records)"""

    _path: str | None = PrivateAttr(default=None)

    @property
    def path(self) -> str | None:
        """Not in the file: where harness.results.store read the record from (None: not read from a file)."""
        return self._path

    def at(self, path: str) -> Record:
        """This record, remembered as read from `path`."""
        self._path = path
        return self

    @property
    def origin(self) -> str:
        """Where the record came from, for messages: its file, else its run_id."""
        return self._path or self.run_id or "<record>"

    @property
    def repeat_index(self) -> int:
        """Which run of its cell the record is: `repeat`, 1 when absent (a sweep without --repeat)."""
        k = self.repeat
        return k if k is not None and k >= 1 else 1

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    def in_pack(self, *, job_id: str, position: int, of: int) -> Record:
        """This record with `env.slurm_pack`: the cell's place in its packed SLURM job."""
        pack = SlurmPack(job_id=job_id, position=position, of=of)
        return self.model_copy(update={"env": self.env.model_copy(update={"slurm_pack": pack})})

    def contract_problems(self) -> list[str]:
        """What this record lacks, or has beyond, the contract of its kind (the record the worker writes, one the
        launcher composed, a skipped one): empty for a record the harness wrote. Tests hold the writers to it."""
        problems = _missing(self, "record") + _extra(self, "record")
        measured = bool(self.metrics.model_fields_set)
        if measured:
            problems += _missing(self.metrics, "record.metrics")
        env_fields = self.env.model_fields_set
        if env_fields and not env_fields <= COMPOSED_ENV:
            problems += _missing(self.env, "record.env")
        elif env_fields:
            problems += [f"record.env.{k}: missing" for k in sorted({"harness_git_sha", "slurm_job_id"} - env_fields)]
        return problems


def _missing(model: Typed, where: str) -> list[str]:
    """The fields every file of `model`'s kind holds that this one lacks."""
    return [
        f"{where}.{f.alias or name}: missing"
        for name, f in type(model).model_fields.items()
        if name not in model.model_fields_set and not sometimes(type(model), name)
    ]


def _extra(model: Typed, where: str) -> list[str]:
    """Fields of `model` and of every model inside it that no model declares (a newer harness's, or a typo)."""
    out = [f"{where}.{k}: not a field of {type(model).__name__}" for k in sorted(model.model_extra or {})]
    for name in model.model_fields_set:
        value = getattr(model, name)
        items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
        if isinstance(value, Typed):
            out += _extra(value, f"{where}.{name}")
        for k, v in items:
            if isinstance(v, Typed):
                out += _extra(v, f"{where}.{name}.{k}")
    return out
