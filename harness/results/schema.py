"""The record and the worker payload as types: the one statement of the fields each holds, with their units.

A record is one JSON file per cell (`results/<sweep>/<run_id>.json`, harness.results.store). Rank 0 of the cell
writes it (harness.worker.runner); when rank 0 could not, the launcher composes it from the ranks' failure
fragments and the job's logs (harness.launch finalize); a cell never launched gets a `skipped` record.

Record contract v1: later versions of the harness add fields and never rename one. A field added after the first
records were written is NotRequired here (those records lack it); `X | None` means always present, possibly null.
`metrics` and `env` are `{}` (or nearly) in records rank 0 did not write: hence the unions.

The README's "Record contract" table documents every field below; tests/unit/test_record_schema.py holds the two,
the example record and the stored records to each other.

NOTE: no `from __future__ import annotations` here: typing.TypedDict (3.11) takes NotRequired written as a string
for a required key.
"""

import sys
from typing import Any, Literal

if sys.version_info >= (3, 11):
    from typing import NotRequired, TypedDict
else:  # NOTE: typing's TypedDict before 3.11 does not know NotRequired
    from typing_extensions import NotRequired, TypedDict

Status = Literal["ok", "oom", "timeout", "error", "nan", "crashed", "cancelled", "skipped"]
"""a cell's outcome (harness.results.store.STATUSES, in the same order)"""


# ---------------------------------------------------------------------------------------------------------------
# spec: the cell (harness.scenario.schema.RunSpec.to_dict)


class ModelConfigDict(TypedDict):
    """The model's dimensions (harness.core.zoo.ModelConfig)."""

    d_model: int
    """hidden size (features)"""
    n_layers: int
    """transformer blocks"""
    n_heads: int
    """attention (query) heads"""
    ffn: int
    """SwiGLU hidden size (features)"""
    vocab: int
    """vocabulary size (tokens)"""
    n_kv_heads: int | None
    """key/value heads (grouped-query attention); null = n_heads"""


class Spec(TypedDict):
    """One cell, flat: what it is and its settings (harness.scenario.schema.Settings); run_id is its digest."""

    model: str
    """model name (zoo or scenario-defined)"""
    model_config: ModelConfigDict
    """the model's dimensions"""
    strategy: str
    """parallelism family and variant, e.g. fsdp.full_shard (harness.scenario.schema.STRATEGIES)"""
    precision: str
    """fp32 | bf16 | fp16 (harness.scenario.schema.PRECISIONS)"""
    gpus: int
    """ranks = GPUs (records written before 2026-12 call it `world_size`; the loaders rename it)"""
    nodes: int
    """nodes (ceil(gpus / gpus_per_node))"""
    gpus_per_node: int
    """ranks per node, from the cluster profile"""
    micro_batch: int
    """sequences per rank per micro-step"""
    seq_len: int
    """tokens per sequence"""
    grad_accum: int
    """micro-steps per optimizer step"""
    warmup_steps: int
    """optimizer steps run before timing"""
    measure_steps: int
    """timed optimizer steps (each one a sample)"""
    activation_checkpointing: str | bool
    """none | full | selective (older records: false/true, read as none/full)"""
    compile: NotRequired[bool]
    """torch.compile the model (absent in older records: false)"""
    offload: str
    """CPU offload: none | optimizer | optimizer+params"""
    seed: int
    """seed of weights and synthetic batches"""
    lr: float
    """AdamW learning rate"""
    time_limit_s: float
    """wall-clock limit of the whole cell (s)"""
    inject: NotRequired[dict[str, Any] | None]
    """fault injection {fault, rank, step}; null: none (absent in older records)"""
    tp: NotRequired[int]
    """tensor-parallel ranks (absent in older records: 1)"""
    pp: NotRequired[int]
    """pipeline-parallel ranks (absent in older records: 1)"""
    pp_schedule: NotRequired[str]
    """gpipe | 1f1b | interleaved_1f1b (meaningful with pp > 1; absent in older records)"""
    microbatches: NotRequired[int]
    """pipeline microbatches per micro-step; 0: one per pipeline rank (absent in older records)"""
    sequence_parallel: NotRequired[bool]
    """tp > 1: the norms run on sequence shards (absent in older records: false)"""


# ---------------------------------------------------------------------------------------------------------------
# metrics: what rank 0 measured (over every rank)


class StepTime(TypedDict):
    """Optimizer step time, each measured step between device synchronisations, the slowest rank's (s)."""

    median: float
    """median step time (s)"""
    p10: float
    """10th percentile (s, linear interpolation)"""
    p90: float
    """90th percentile (s)"""
    mean: float
    """mean step time (s)"""
    samples: list[float]
    """every measured step's time (s), in order"""


class Dynamo(TypedDict):
    """What torch.compile compiled (counts)."""

    frames: int
    """frames dynamo compiled on rank 0, recompilations included (count)"""
    graphs: int
    """distinct graphs on rank 0 (count)"""
    graph_breaks: int
    """graph breaks on rank 0 (count)"""
    frames_in_measured_steps: int
    """frames compiled during the measured steps, max over ranks (count; > 0: recompilation timed)"""


class Metrics(TypedDict):
    """A cell rank 0 measured (status ok, or nan: the numbers of the steps that ran)."""

    step_time_s: StepTime
    """seconds per optimizer step"""
    tokens_per_s: float
    """global throughput at the median step time (tokens/s)"""
    tokens_per_s_per_gpu: float
    """tokens_per_s / gpus (tokens/s)"""
    tflops_per_gpu: float
    """model FLOPs per GPU per second / 1e12 (TFLOPS)"""
    mfu: float | None
    """model FLOPs utilisation: fraction of the device's dense peak (0.412 = 41.2 %); null: peak unknown"""
    hfu: float | None
    """hardware FLOPs utilisation: MFU plus checkpointing's recompute (fraction); null: peak unknown"""
    mfu_peak_tflops: NotRequired[float | None]
    """the dense peak MFU divides by (TFLOPS); null: unknown"""
    peak_memory_allocated_gib: float | None
    """max over ranks of the peak allocated after warmup (GiB, 2**30 B); CPU: peak RSS"""
    peak_memory_reserved_gib: float | None
    """max over ranks of the allocator's peak reserved (GiB); null on CPU"""
    alloc_retries: NotRequired[int | None]
    """rank 0's cudaMalloc retries during the measured steps (count); null on CPU"""
    loss: float | None
    """the last step's loss, mean over ranks; null when not finite"""
    losses: list[float | None]
    """every step's (warmup and measured) loss, mean over ranks"""
    n_params: int
    """model parameters (count)"""
    flops_per_step: float
    """model FLOPs per optimizer step, all ranks (FLOP)"""
    tokens_per_step: NotRequired[int]
    """tokens per optimizer step, all ranks (tokens)"""
    setup_s: NotRequired[float]
    """rank 0's worker entry → first step (s)"""
    warmup_step_times_s: NotRequired[list[float]]
    """each warmup step's time on rank 0 (s)"""
    compile_s: NotRequired[float | None]
    """the first warmup step's excess over the median step (s); null: not compiled"""
    startup_s: NotRequired[float | None]
    """rank 0's process start → first step (s); null: start time unavailable"""
    dynamo: NotRequired[Dynamo]
    """torch.compile's counts"""
    null_reasons: dict[str, str]
    """metric name → why it is null"""


class Unmeasured(TypedDict):
    """`metrics` of a record rank 0 did not write (composed from failures, or skipped): `{}`."""


# ---------------------------------------------------------------------------------------------------------------
# env: where it ran


class SlurmPack(TypedDict):
    """A cell's place in a packed SLURM job (`harness sweep --pack`)."""

    job_id: str
    """the pack's SLURM job id"""
    position: int
    """1-based position of the cell in its pack"""
    of: int
    """cells in the pack (count)"""


class Env(TypedDict):
    """Versions, device and hosts, as rank 0 saw them (harness.worker.env.capture and the worker)."""

    python: str
    """Python version"""
    torch: str
    """torch version"""
    cuda: str | None
    """CUDA version torch was built with; null: CPU build"""
    nccl: str | None
    """NCCL version; null on CPU"""
    deepspeed: str | None
    """DeepSpeed version; null: not installed"""
    device_type: str
    """cuda | cpu"""
    device_name: str
    """e.g. NVIDIA H100 80GB HBM3; cpu on CPU"""
    device_count: NotRequired[int | None]
    """CUDA devices visible to rank 0 (count); null on CPU"""
    device_memory_gib: float | None
    """rank 0's device's total memory (GiB); null on CPU"""
    cpu_count: NotRequired[int | None]
    """os.cpu_count() on rank 0's host (count)"""
    torch_num_threads: NotRequired[int]
    """torch's intra-op threads on rank 0 (count)"""
    allow_tf32: NotRequired[bool]
    """fp32 matmuls may use TF32"""
    hostname: NotRequired[str]
    """rank 0's host"""
    slurm_job_id: str | None
    """the SLURM job (submitit's id: <array>_<index> for array tasks); null outside SLURM"""
    slurm_restart_count: NotRequired[int]
    """times SLURM requeued the job (count); only under SLURM"""
    prefork: NotRequired[bool]
    """the ranks were forked from the sweep's warm interpreter"""
    cpu_allocator: NotRequired[str]
    """what rank 0's malloc does with freed memory: 'caching (glibc ... mallopt ...)' or 'system ...' on a CPU
    (the profile's cpu_allocator, harness.worker.allocator); the CUDA caching allocator on a GPU"""
    deepspeed_config: NotRequired[dict[str, Any]]
    """the config DeepSpeed ran with (ZeRO cells)"""
    backend: str
    """torch.distributed backend: nccl | gloo"""
    hostnames: list[str]
    """every rank's node, sorted, once each"""
    harness_git_sha: str | None
    """the harness commit (-dirty: uncommitted changes); null outside a checkout"""
    slurm_pack: NotRequired[SlurmPack]
    """the cell's place in its packed job"""


class ComposedEnv(TypedDict):
    """`env` of a record the launcher composed (rank 0 wrote none): what the payload knew."""

    harness_git_sha: str | None
    """the harness commit; null outside a checkout"""
    slurm_job_id: str | None
    """the SLURM job; null outside SLURM"""
    slurm_pack: NotRequired[SlurmPack]
    """the cell's place in its packed job"""


class NoEnv(TypedDict):
    """`env` of a skipped record: `{}`."""


# ---------------------------------------------------------------------------------------------------------------
# comm: the collectives of one counted step (harness.worker.meters.comm.CommMeter.summary)


class CollectiveStats(TypedDict):
    """One collective type (all_gather, reduce_scatter, …) per step."""

    calls: float
    """calls per step (count)"""
    bytes: float
    """bytes per step (B, nccl-tests convention)"""
    dtype: str | None
    """the dtype with the most bytes"""
    dtypes: NotRequired[dict[str, float]]
    """dtype → bytes per step (B)"""
    time_s: NotRequired[float]
    """its calls' time per step, each timed on its own (s)"""
    algbw_gbps: NotRequired[float]
    """algorithm bandwidth (GB/s, 1e9 B/s)"""
    busbw_gbps: NotRequired[float]
    """bus bandwidth, nccl-tests factors (GB/s)"""


class GroupStats(TypedDict):
    """The collectives of one group kind (intra | inter | mixed | unknown) per step."""

    calls: float
    """calls per step (count)"""
    bytes: float
    """bytes per step (B)"""


class CommGroup(TypedDict):
    """One process group's collectives per step."""

    ranks: list[int]
    """its global ranks"""
    kind: str
    """intra | inter | mixed | unknown"""
    calls: float
    """calls per step (count)"""
    bytes: float
    """bytes per step (B)"""


class Comm(TypedDict):
    """Collectives counted over one untimed step after the measured ones."""

    time_s_per_step: NotRequired[float | None]
    """time in collectives per step, each timed on its own (s); null: not timed"""
    bytes_per_step: float
    """bytes per step, every collective (B)"""
    calls_per_step: float
    """collective calls per step (count)"""
    by_collective: dict[str, CollectiveStats]
    """collective name → its totals"""
    by_group: dict[str, GroupStats]
    """group kind → its totals"""
    groups: NotRequired[list[CommGroup]]
    """every process group that ran a collective"""
    measured_steps: NotRequired[int]
    """steps counted (count)"""
    counted_step: NotRequired[int]
    """1-based number of the counted step (warmup + measured + 1)"""
    counted_step_time_s: NotRequired[float]
    """the counted step's time, meter on (s)"""


# ---------------------------------------------------------------------------------------------------------------
# predicted: the planner's prediction (harness.plan.predict.predict) and how the measurement compares


class PredictedMemory(TypedDict):
    """Predicted memory per rank at its peak (GiB, 2**30 B)."""

    params: NotRequired[float]
    """parameters (GiB)"""
    grads: NotRequired[float]
    """gradients live at the peak (GiB)"""
    optimizer: NotRequired[float]
    """optimizer states (GiB)"""
    activations: NotRequired[float]
    """activations (GiB)"""
    buffers: NotRequired[float]
    """transient buffers (GiB)"""
    total: float
    """their sum (GiB)"""


class PredictedTime(TypedDict):
    """The predicted step time's breakdown (s per optimizer step on one rank; harness.plan.time): compute +
    recompute + optimizer + comm_exposed + other = step_time_s. Null: a rate the part needs is unknown."""

    compute: float | None
    """matmuls, attention and elementwise work of forward and backward (s)"""
    recompute: float | None
    """activation checkpointing's recomputed forward (s)"""
    optimizer: float | None
    """the optimizer step (s)"""
    comm_exposed: float | None
    """collective time not hidden behind compute (s)"""
    comm_total: float | None
    """every collective's time, hidden or not (s)"""
    other: float | None
    """per-op host overhead and the strategy's framework overhead (s)"""


class Predicted(TypedDict):
    """What the planner predicted for the cell."""

    memory_gib: PredictedMemory
    """memory per rank at its peak (GiB)"""
    peak_at: NotRequired[str]
    """the moment of the step the peak falls in"""
    grads_after_backward_gib: NotRequired[float]
    """the gradients' full size per rank (GiB)"""
    cpu_memory_gib: NotRequired[float]
    """host memory per rank under offload (GiB)"""
    device_memory_gib: NotRequired[float | None]
    """the profile's device memory (GiB); null: unknown"""
    fits: NotRequired[bool | None]
    """fits the usable device memory; null: capacity unknown"""
    flops_per_step: NotRequired[float]
    """model FLOPs per optimizer step, all ranks (FLOP)"""
    hardware_flops_per_step: NotRequired[float]
    """flops_per_step plus checkpointing's recompute (FLOP)"""
    comm_bytes_per_step: NotRequired[float | None]
    """collective bytes per step (B); null: no model for the strategy"""
    reason: NotRequired[str | None]
    """the breakdown when it does not fit, else null"""
    notes: NotRequired[dict[str, str]]
    """memory part → how it was counted"""
    comm_deviation: NotRequired[float]
    """measured / predicted collective bytes - 1 (fraction; 0.0: exact)"""
    step_time_s: NotRequired[float | None]
    """predicted time of one optimizer step (s); null: see time_null_reasons"""
    tokens_per_s_per_gpu: NotRequired[float | None]
    """predicted tokens per second per GPU (tokens/s)"""
    mfu: NotRequired[float | None]
    """predicted model FLOPs utilisation (fraction); null: peak unknown or step time unknown"""
    time_s: NotRequired[PredictedTime]
    """the step time's breakdown (s)"""
    calibration: NotRequired[str]
    """the rates' source: "calibrated <file> <date>" or "uncalibrated: profile figures (<sources>)" """
    time_null_reasons: NotRequired[dict[str, str]]
    """step time field or part → why it is null"""
    step_time_deviation: NotRequired[float]
    """measured median step time / predicted - 1 (fraction; 0.0: exact)"""


# ---------------------------------------------------------------------------------------------------------------
# layout: a tensor- or pipeline-parallel cell's mesh and stages (harness.worker.strategies.layouts)


class LayoutInfo(TypedDict):
    """How the cell's ranks split into data × tensor × pipeline parallel groups, and the model into stages."""

    tp: int
    """tensor-parallel ranks"""
    pp: int
    """pipeline-parallel ranks"""
    dp: int
    """data-parallel replicas: gpus / (tp × pp)"""
    dp_shard: int
    """ranks the data-parallel strategy shards over (the rest of a node beside tp for a hybrid)"""
    dp_replicate: int
    """replicas of the sharded state (1 unless hybrid)"""
    mesh: dict[str, int]
    """mesh dimension → size, outermost first (pp, dp, tp; pp, dp_replicate, dp_shard, tp for a hybrid)"""
    pp_schedule: str | None
    """the pipeline schedule; null without a pipeline"""
    n_stages: int
    """pipeline stages (pp × stages per rank; 1 without a pipeline)"""
    microbatches: int | None
    """pipeline microbatches per step; null without a pipeline"""
    sequence_parallel: bool
    """the norms ran on sequence shards"""
    loss_parallel: bool
    """cross-entropy ran on vocabulary-sharded logits"""
    stages: list[int]
    """blocks per stage, in stage order: the stage balance"""
    stage_blocks: list[list[int]]
    """the blocks of each stage"""
    stage_params: list[int]
    """parameters per stage (whole, before tensor- or data-parallel sharding)"""


# ---------------------------------------------------------------------------------------------------------------
# failures: what each failed rank reported (composed records)


class Failure(TypedDict):
    """One rank's failure (its fragment), or a task's traceback the scheduler kept."""

    rank: int
    """the rank"""
    status: str
    """oom | timeout | error (its own verdict)"""
    reason: str
    """exception type and message"""
    traceback: str | None
    """its traceback (text)"""
    hostname: NotRequired[str | None]
    """its node"""
    memory_allocated_gib: NotRequired[float | None]
    """CUDA memory allocated at an OOM (GiB)"""
    memory_reserved_gib: NotRequired[float | None]
    """CUDA memory reserved at an OOM (GiB)"""
    memory_rss_gib: NotRequired[float | None]
    """host RSS at a CPU OOM (GiB)"""


# ---------------------------------------------------------------------------------------------------------------
# the record


class Record(TypedDict):
    """One cell's record, schema_version 1."""

    schema_version: Literal[1]
    """the contract's version"""
    run_id: str
    """<model>-<strategy>-<precision>-g<N>-<digest of spec>"""
    sweep: str
    """scenario name"""
    cluster: str
    """cluster profile name"""
    status: Status
    """the cell's outcome"""
    reason: str | None
    """why the status is not ok (or a note on ok numbers); null: none"""
    failed_rank: int | None
    """the first rank to fail; null: none or unknown"""
    spec: Spec
    """the cell"""
    metrics: Metrics | Unmeasured
    """what was measured; {} when rank 0 wrote no record"""
    env: Env | ComposedEnv | NoEnv
    """where it ran"""
    started_at: str
    """ISO-8601 UTC, to the second"""
    finished_at: str
    """ISO-8601 UTC, to the second"""
    attempt: NotRequired[str | None]
    """the launch's id (12 hex digits): tells this launch's record and fragments from an earlier one's; null: a
    payload without one (written by hand for `python -m harness.worker.runner`)"""
    repeat: NotRequired[int]
    """which run of its cell (`harness sweep --repeat K`, k >= 2); absent: the first"""
    predicted: NotRequired[Predicted]
    """the planner's prediction; absent when no planner ran"""
    comm: NotRequired[Comm]
    """collectives of one counted step; absent when rank 0 wrote no record"""
    layout: NotRequired[LayoutInfo]
    """a tensor- or pipeline-parallel cell's mesh and stage balance; absent for every other cell"""
    failures: NotRequired[list[Failure]]
    """each failed rank's report (composed records)"""
    log_tail: NotRequired[str]
    """the job's last output, at most 4000 characters (composed records)"""
    _path: NotRequired[str]
    """not in the file: the path load_records read it from"""


# ---------------------------------------------------------------------------------------------------------------
# the payload: what the launcher hands each rank of a cell (harness.launch make_payload)


class PayloadCluster(TypedDict):
    """The part of the cluster profile a rank needs."""

    name: str
    """cluster profile name"""
    device: str
    """cuda | cpu"""
    pg_timeout_s: float
    """collective watchdog of every process group (s)"""
    env: dict[str, str]
    """environment variables set in each rank (unless already set)"""
    cpu_allocator: NotRequired[str]
    """'caching' or 'system': what a CPU rank's malloc does with freed memory (harness.worker.allocator)"""


class PackPlace(TypedDict):
    """A packed cell's place in its SLURM job."""

    position: int
    """1-based position in the pack"""
    of: int
    """cells in the pack (count)"""
    minutes: int
    """the pack's --time (min)"""


class Payload(TypedDict):
    """Everything one rank of one cell needs, as plain JSON data (pickled by submitit, or written to a file)."""

    spec: Spec
    """the cell"""
    run_id: str
    """the cell's run_id"""
    sweep: str
    """scenario name"""
    attempt: str
    """this launch's id (12 hex digits)"""
    results: str
    """the results dir (absolute path)"""
    cluster: PayloadCluster
    """the cluster profile's part a rank needs"""
    git_sha: str | None
    """the harness commit; null outside a checkout"""
    predicted: Predicted | None
    """the planner's prediction; null: none"""
    master_port: int | None
    """rendezvous port (local cells); null: derived from the job id (SLURM)"""
    job_id: NotRequired[str]
    """the SLURM job id, set once submitted"""
    pack: NotRequired[PackPlace]
    """the cell's place in its packed job (`--pack`)"""
