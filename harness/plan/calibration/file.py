"""The calibration file (`<cluster>.calibration.json`, format "harness-calibration/1") as typed models: its one type
and its one reader and writer.

`harness calibrate` (harness.calibrate) writes it: the device process writes a `Calibration` without the merge's
fields (`created_at`, `duration_s`, `quick`), each group of ranks a `CollectivesPart`, and the orchestration merges
them into the file (`Calibration.merged`). `harness calibrate --from LOG…` (harness.calibrate.logs) writes one
from nccl-tests and matmul-benchmark logs instead: `from_logs` names them, each curve's and rate's `source` its
file and lines, and it holds only what they measured. The planner reads it back (harness.plan.calibration.find →
the rates); `harness calibrate`'s summary line too. Nothing else parses the JSON.

Models on harness.core.typed.Typed: frozen, strict (an int stays an int: a message size of 1024 is written back as
1024), unknown fields kept. A field that a file written by an earlier harness (or a part) may lack is marked
SOMETIMES; its default is what the reader assumes then, and an absent field is not written back. Every number is
`Num` (int or float, as written). The fields are declared in the order the measuring processes write them, so a
file read and written again is byte for byte the same (tests/unit/test_time_model.py holds it with a file the
harness wrote before these models existed).

Units: seconds (`_s`), bytes, GB/s (1e9 B/s, `_gbps`).
"""

from __future__ import annotations

import json
import os
import secrets
import statistics
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, Final, Literal

from pydantic import ValidationError

from harness.core.errors import InputError, Problem
from harness.core.typed import SOMETIMES, Typed, problems_of

FORMAT: Final = "harness-calibration/1"
Num = int | float
"""a JSON number as written (an int stays an int)"""
FRAMEWORK_STRATEGIES: tuple[str, ...] = ("ddp", "fsdp.full_shard", "fsdp2.full_shard", "zero1", "zero2", "zero3")
"""the strategies whose framework overhead a calibration measures (its `compute.framework` keys are
`<strategy>/<precision>`): one per framework code path, as every FSDP1 (or FSDP2) strategy runs the same code at
one rank; a catalogue entry's `framework_cost` names one of them"""


# ---------------------------------------------------------------------------------------------------------------
# the parts


class Fingerprint(Typed):
    """The machine a calibration describes: what the mismatch check compares (harness.plan.calibration.find)."""

    hostname: str | None = None
    """the host's name (socket.gethostname)"""
    cpu_model: str | None = None
    """the CPU's model name (/proc/cpuinfo)"""
    cpu_count: int | None = None
    """CPU cores the process may run on (its affinity), which the host's ranks share"""
    torch: str | None = None
    """torch's package version"""
    device: Annotated[str, SOMETIMES] = "cpu"
    """cpu | cuda"""
    device_name: Annotated[str | None, SOMETIMES] = None
    """the GPU's name as torch reports it (MFU's peak); null on a CPU"""
    device_count: Annotated[int | None, SOMETIMES] = None
    """GPUs the device process saw; null on a CPU"""
    backend: Annotated[str | None, SOMETIMES] = None
    """process-group backend of the measurements: gloo | nccl"""
    threads_per_rank: Annotated[int | None, SOMETIMES] = None
    """torch's intra-op threads in each measuring process (the profile's OMP_NUM_THREADS)"""
    torch_full: Annotated[str | None, SOMETIMES] = None
    """torch.__version__ (with its local build tag)"""
    cpu_allocator: Annotated[str, SOMETIMES] = "system"
    """the profile's cpu_allocator when measured: caching | system (absent in files from before the key: glibc's
    defaults, system)"""


class GemmPoint(Typed):
    """One matmul shape's time: C (m × n) from A and B with inner dimension k, in one layout."""

    dtype: str
    """float32 | bfloat16 | float16"""
    layout: str
    """nt (a Linear's forward, x·Wᵀ) | nn (its input gradient) | tn (its weight gradient)"""
    m: int
    """rows of the output"""
    n: int
    """columns of the output"""
    k: int
    """the inner (reduced) dimension"""
    s: Num
    """seconds per call (median)"""


class ElementwisePoint(Typed):
    """Bandwidth of an elementwise product (two reads, one write) at one operand size, net of the op's fixed cost."""

    dtype: str
    """float32 | bfloat16"""
    op_bytes: Num
    """bytes of one operand"""
    gbps: Num
    """bytes moved (3 × op_bytes) per second (GB/s)"""


class AttentionPoint(Typed):
    """Causal SDPA forward and backward at one shape."""

    dtype: str
    """float32 | bfloat16 | float16"""
    batch: int
    """sequences"""
    heads: int
    """attention heads"""
    seq: int
    """tokens per sequence"""
    head_dim: int
    """features per head"""
    forward_s: Num
    """seconds of the forward (median)"""
    backward_s: Num
    """seconds of the backward (median; forward and backward timed together, minus the forward)"""


class Dispatch(Typed):
    """Host overhead per op, on tiny tensors."""

    forward_s: Num
    """one forward op recorded by autograd (s)"""
    backward_s: Num
    """one backward op (s)"""


class OptimizerPoint(Typed):
    """One measured AdamW step."""

    tensors: int
    """parameter tensors"""
    elements: int
    """parameter elements, all tensors together"""
    s: Num
    """seconds per step (median)"""


class Optimizer(Typed):
    """AdamW's step cost: per_tensor_s × tensors + per_element_s × elements (least squares over `points`)."""

    per_tensor_s: Num
    """seconds per parameter tensor"""
    per_element_s: Num
    """seconds per parameter element"""
    points: Annotated[list[OptimizerPoint] | None, SOMETIMES] = None
    """the steps the fit was made from"""


class FrameworkCost(Typed):
    """A strategy's own host work per micro-step beyond what the time model prices (hooks, flattening, an engine's
    bookkeeping): fixed_s + per_block_s × blocks + per_element_s × parameter elements."""

    fixed_s: Num
    """seconds per step"""
    per_block_s: Num
    """seconds per transformer block"""
    per_element_s: Annotated[Num, SOMETIMES] = 0.0
    """seconds per parameter element the rank's optimizer updates (absent in older files: 0)"""
    measured_s: Annotated[dict[str, Num] | None, SOMETIMES] = None
    """the measured step time per calibration model (s)"""
    predicted_s: Annotated[dict[str, Num] | None, SOMETIMES] = None
    """the time model's step time of each, without framework overhead (s)"""


class StepProbe(Typed):
    """One probe of the in-step fit (harness.calibrate.in_step): the zoo Transformer's forward + backward on one
    rank, no strategy, at one shape, measured and priced at the isolated rates."""

    probe: str
    model: dict[str, int]
    """d_model, n_layers, n_heads, ffn, vocab, kv_heads"""
    batch: int
    seq: int
    measured_s: Num
    """median step (s)"""
    predicted_s: Num
    """the time model's compute and per-op host overhead at the isolated rates (s)"""
    kernels_s: Num
    """of which matmuls and attention"""
    elementwise_s: Num
    """elementwise and normalisation bytes"""
    host_s: Num
    """per-op host overhead"""


class InStep(Typed):
    """How this calibration's isolated rates hold inside a step (harness.calibrate.in_step): the factors the time
    model multiplies each part of a micro-step's compute by, fitted on the probes. Absent: 1 (older files, GPUs)."""

    kernels: Num
    """matmuls and attention"""
    elementwise: Num
    """elementwise and normalisation bytes"""
    host: Num
    """per-op host overhead"""
    probes: Annotated[list[StepProbe], SOMETIMES] = []
    """the plain steps the factors were fitted on, priced at the isolated rates (factors 1)"""


class MatmulRate(Typed):
    """An achievable matmul rate a matmul benchmark's log reports (`harness calibrate --from`): the best shape's."""

    dtype: str
    """bfloat16 | float16 | float32 | … (torch's names)"""
    tflops: Num
    """the rate (1e12 FLOP/s)"""
    m: int
    """rows of the output at the best shape"""
    n: int
    """columns of the output"""
    k: int
    """the inner dimension"""
    source: str
    """the log it was read from, and the line"""


class Compute(Typed):
    """What one process measured on one device. A part a file lacks makes what needs it unknown (a null reason)."""

    gemm: Annotated[list[GemmPoint], SOMETIMES] = []
    """matmul times over a grid of shapes, per dtype and layout"""
    elementwise: Annotated[list[ElementwisePoint], SOMETIMES] = []
    """elementwise bandwidth per dtype and operand size"""
    attention: Annotated[list[AttentionPoint], SOMETIMES] = []
    """SDPA times per dtype and shape"""
    dispatch: Annotated[Dispatch | None, SOMETIMES] = None
    """per-op host overhead"""
    optimizer: Annotated[Optimizer | None, SOMETIMES] = None
    """AdamW's cost"""
    framework: Annotated[dict[str, FrameworkCost], SOMETIMES] = {}
    """framework overhead per `<strategy>/<precision>` (FRAMEWORK_STRATEGIES × fp32, bf16, and fp16 on CUDA)"""
    in_step: Annotated[dict[str, InStep], SOMETIMES] = {}
    """per compute dtype: the isolated rates' factors inside a plain step (CPU calibrations)"""
    matmul: Annotated[list[MatmulRate], SOMETIMES] = []
    """achievable matmul rates per dtype from a matmul benchmark's log (a calibration built `--from` logs)"""


class CommCurve(Typed):
    """One collective on one link at one group size: its time per message size, and the latency and bus bandwidth
    fitted for messages beyond the largest."""

    link: str
    """self (a one-rank group) | intra (ranks of one node) | inter (a group across nodes)"""
    collective: str
    """all_reduce | all_gather | reduce_scatter | broadcast"""
    dtype: Annotated[str, SOMETIMES] = "float32"
    """the elements' dtype (absent in older files: float32)"""
    ranks: int
    """ranks in the group"""
    sizes: list[Num]
    """message sizes (bytes, nccl-tests' convention)"""
    times: list[Num]
    """seconds per call at each size: the maximum over ranks of their medians"""
    latency_s: Num | None
    """the smallest message's time (s); null when it was not a latency (a log of large messages only:
    `null_reasons` says why), and then messages below the smallest size are not priced by this curve"""
    busbw_gbps: Num | None
    """bus bandwidth between the two largest sizes (GB/s); null when the largest size had not reached it (a log of
    small messages only: `null_reasons` says why), and then messages above the largest size are not priced by this
    curve"""
    busbw_at_sizes_gbps: Annotated[list[Num] | None, SOMETIMES] = None
    """bus bandwidth at each size (GB/s)"""
    source: Annotated[str | None, SOMETIMES] = None
    """the log it was read from and its table's lines (`harness calibrate --from`); absent when measured"""
    hosts: Annotated[int | None, SOMETIMES] = None
    """hosts the log's group spanned (`harness calibrate --from`); absent when measured"""
    null_reasons: Annotated[dict[str, str] | None, SOMETIMES] = None
    """why `latency_s` or `busbw_gbps` is null (`harness calibrate --from`), by field; absent when neither is"""


SHARING_PROBES: tuple[str, ...] = ("gemm", "gemm_bfloat16", "elementwise", "optimizer")
"""the work a `Sharing` entry times (its fields `<probe>_s`, `<probe>_alone_s`, `<probe>_slowdown`)"""


class Sharing(Typed):
    """How a rank slows while `ranks` ranks share the host (harness.calibrate.group.measure_sharing): each probe
    timed on every rank together (`<probe>_s`, the slowest rank), on rank 0 alone in the same repetitions
    (`<probe>_alone_s`), and their median ratio (`<probe>_slowdown`). Probes: an fp32 and a bf16 GEMM, an
    elementwise product, an AdamW step, a plain step in fp32 and in bf16. Files from before a probe (or before the
    pairing) lack its fields."""

    ranks: int
    """ranks sharing the host"""
    gemm_s: Annotated[Num | None, SOMETIMES] = None
    """seconds of the fp32 GEMM probe, every rank at once"""
    gemm_alone_s: Annotated[Num | None, SOMETIMES] = None
    """seconds of it on rank 0 alone"""
    gemm_slowdown: Annotated[Num | None, SOMETIMES] = None
    """median ratio of the two (≥ 1 where sharing slows)"""
    gemm_bfloat16_s: Annotated[Num | None, SOMETIMES] = None
    """seconds of the bf16 GEMM probe, every rank at once"""
    gemm_bfloat16_alone_s: Annotated[Num | None, SOMETIMES] = None
    """seconds of it on rank 0 alone"""
    gemm_bfloat16_slowdown: Annotated[Num | None, SOMETIMES] = None
    """median ratio of the two"""
    elementwise_s: Annotated[Num | None, SOMETIMES] = None
    """seconds of the elementwise probe (16 MiB operands), every rank at once"""
    elementwise_alone_s: Annotated[Num | None, SOMETIMES] = None
    """seconds of it on rank 0 alone"""
    elementwise_slowdown: Annotated[Num | None, SOMETIMES] = None
    """median ratio of the two"""
    optimizer_s: Annotated[Num | None, SOMETIMES] = None
    """seconds of the AdamW probe (4M elements), every rank at once"""
    optimizer_alone_s: Annotated[Num | None, SOMETIMES] = None
    """seconds of it on rank 0 alone"""
    optimizer_slowdown: Annotated[Num | None, SOMETIMES] = None
    """median ratio of the two"""
    step_s: Annotated[Num | None, SOMETIMES] = None
    """seconds of the plain-step probe (fp32 forward and backward of a small Transformer), every rank at once"""
    step_alone_s: Annotated[Num | None, SOMETIMES] = None
    """seconds of it on rank 0 alone"""
    step_slowdown: Annotated[Num | None, SOMETIMES] = None
    """median ratio of the two"""
    step_bfloat16_s: Annotated[Num | None, SOMETIMES] = None
    """seconds of the plain-step probe in bf16, every rank at once"""
    step_bfloat16_alone_s: Annotated[Num | None, SOMETIMES] = None
    """seconds of it on rank 0 alone"""
    step_bfloat16_slowdown: Annotated[Num | None, SOMETIMES] = None
    """median ratio of the two"""
    sync_wait_s: Annotated[Num | None, SOMETIMES] = None
    """seconds each collective call waits for ranks the host has not run yet (groups of 2 or more ranks)"""

    def seconds(self, probe: str) -> float | None:
        """The probe's time with every rank at once (s), None where not measured."""
        value: float | None = self.field(f"{probe}_s")
        return value

    def slowdown(self, probe: str) -> float | None:
        """The probe's paired slowdown against rank 0 alone, None where not measured."""
        value: float | None = self.field(f"{probe}_slowdown")
        return value


# ---------------------------------------------------------------------------------------------------------------
# the file and the parts the processes write


class Storage(Typed):
    """The checkpoint folder's bandwidth (harness.calibrate.storage): one file written sequentially and fsynced, then
    read back with its pages dropped from the page cache, by one process."""

    path: str
    """the folder measured (the profile's checkpoint_dir, else the calibration file's folder)"""
    bytes: int
    """the file's size (B)"""
    write_gbps: Num
    """bytes written / (write + fsync) time (GB/s, 1e9 B/s)"""
    read_gbps: Num
    """bytes read / read time, its cached pages dropped first (GB/s)"""


class CollectivesPart(Typed):
    """What one group of ranks measured (`harness calibrate`'s `collectives` process, rank 0 writes it)."""

    comm: list[CommCurve]
    """the collectives' curves at this group's size"""
    sharing: list[Sharing]
    """the host's sharing at this group's size (groups inside one node; empty across nodes)"""


class Calibration(Typed):
    """A cluster's calibration: the file. The device process writes it without the merge's fields; the
    orchestration adds every group's curves and sharing, the date and the duration (`merged`)."""

    format: Literal["harness-calibration/1"]
    """FORMAT"""
    cluster: str
    """the cluster profile's name"""
    fingerprint: Fingerprint
    """the machine it describes"""
    compute: Compute
    """the device's rates"""
    comm: list[CommCurve]
    """collective curves: the one-rank group's, then each measured group's"""
    sharing: Annotated[list[Sharing], SOMETIMES] = []
    """the host's sharing at each measured rank count (absent in older files: the cores rule)"""
    storage: Annotated[Storage | None, SOMETIMES] = None
    """the checkpoint folder's write and read bandwidth (absent in older files: predicted.checkpoint_s is null)"""
    compute_s: Annotated[Num | None, SOMETIMES] = None
    """seconds the device process took"""
    created_at: Annotated[str | None, SOMETIMES] = None
    """when the calibration started (ISO 8601, UTC); absent in the device process's part"""
    duration_s: Annotated[Num | None, SOMETIMES] = None
    """seconds the whole calibration took (0.1 s)"""
    quick: Annotated[bool | None, SOMETIMES] = None
    """measured with `--quick` (the smaller grid)"""
    from_logs: Annotated[list[str] | None, SOMETIMES] = None
    """the log files it was built from (`harness calibrate --from`): it holds only what they measured, and the
    profile's figures price the rest (harness.plan.calibration.rates.LoggedRates); absent when measured"""

    def in_step_drift(self, dtype: str) -> float:
        """How much slower the host ran over the whole calibration than at the moment its in-step probes were timed
        (`dtype`'s): the median of every timing of the same plain step — the in-step probe `mid` and the sharing
        probes' plain step on rank 0 alone (`step_alone_s`, `step_bfloat16_alone_s`) at 1, 2 and 4 ranks, measured
        minutes apart — over the in-step probe's. The time model multiplies the in-step factors by it, so they
        describe the host's typical speed during the calibration, not one moment's. 1 without the timings (GPUs,
        older files).

        NOTE: on the 2-core development VM one calibration timed that step at 79.7, 69.8, 79.0 and 85.5 ms within
        three minutes; its factors, fitted at the 69.8 ms moment, under-predicted the unseen-shapes bench by a
        median 16 % over three sweeps after it."""
        fit = self.compute.in_step.get(dtype)
        mid = next((p.measured_s for p in fit.probes if p.probe == "mid"), None) if fit is not None else None
        field = "step_alone_s" if dtype == "float32" else f"step_{dtype}_alone_s"
        alone = [s.field(field) for s in self.sharing]
        timings = [float(mid)] + [float(t) for t in alone if t] if mid else []
        if len(timings) < 2:
            return 1.0
        return statistics.median(timings) / timings[0]

    def merged(self, parts: list[CollectivesPart], *, created_at: str, duration_s: float, quick: bool) -> Calibration:
        """This device part with every group's curves and sharing appended, dated: the file."""
        doc = self.to_dict()
        doc["comm"] = doc["comm"] + [c.to_dict() for p in parts for c in p.comm]
        doc["sharing"] = doc.get("sharing", []) + [s.to_dict() for p in parts for s in p.sharing]
        doc.update(created_at=created_at, duration_s=duration_s, quick=quick)
        return Calibration.model_validate(doc)


# ---------------------------------------------------------------------------------------------------------------
# reading and writing


def parse_calibration(doc: Any, *, file: str) -> Calibration:
    """A calibration from its JSON document; InputError naming `file`, the key path and the value when it is not
    one (a document of another format: that one line, not every field's)."""
    if not isinstance(doc, Mapping) or doc.get("format") != FORMAT:
        got = doc.get("format") if isinstance(doc, Mapping) else type(doc).__name__
        raise InputError([Problem(file, "format", f"{got!r} is not {FORMAT!r}")])
    try:
        return Calibration.model_validate(doc)
    except ValidationError as e:
        raise InputError(problems_of(e, file=file, doc=doc)) from None


def read_calibration(path: Path) -> Calibration:
    """The calibration file at `path`; InputError (exit 2 from the CLI) when it is not one."""
    try:
        text = path.read_bytes()
    except OSError as e:
        raise InputError([Problem(str(path), "", f"not a readable calibration file: {e}")]) from e
    try:
        # NOTE: pydantic's own parser in one pass for the common case; what it refuses is read again for the lines
        return Calibration.model_validate_json(text)
    except ValidationError:
        pass
    try:
        doc = json.loads(text)
    except ValueError as e:  # not JSON, or not UTF-8
        raise InputError([Problem(str(path), "", f"not a readable calibration file: {e}")]) from e
    return parse_calibration(doc, file=str(path))


def read_collectives_part(path: Path) -> CollectivesPart:
    """What a group of ranks wrote (the orchestration reads it back); InputError when it is not that."""
    try:
        return CollectivesPart.model_validate_json(path.read_bytes())
    except OSError as e:
        raise InputError([Problem(str(path), "", f"not a readable calibration part: {e}")]) from e
    except ValidationError as e:
        try:
            doc = json.loads(path.read_bytes())
        except ValueError:
            doc = None
        raise InputError(problems_of(e, file=str(path), doc=doc)) from None


def write_calibration(path: Path, doc: Calibration | CollectivesPart) -> Path:
    """Write the file (or a part) atomically: a temp file beside it, fsynced, then a rename; returns `path`. Python's
    json writes the numbers (pydantic's JSON formats floats differently), one space of indent, as it always was.

    The file gets what the umask leaves of 0o666, as any file a program creates (tempfile.mkstemp's 0600 left a
    cluster's calibration, which the whole team's `harness plan` reads, to its writer alone). The text is made
    before the temp file, so a document that cannot be written as JSON leaves nothing; a write that fails (a full
    disk) leaves the old file as it was and no temp file (the planner floor has its own writer: harness.results,
    where the others' is, sits a floor above)."""
    text = json.dumps(doc.to_dict(), indent=1, allow_nan=False)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = _new_temp(path)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return path


def _new_temp(path: Path) -> tuple[int, Path]:
    """(fd, path) of a new temp file beside `path`, made with mode 0o666 for the umask to narrow."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0)
    while True:
        tmp = path.with_name(f".{path.name}.{secrets.token_hex(6)}.tmp")
        try:
            return os.open(tmp, flags, 0o666), tmp
        except FileExistsError:
            continue
