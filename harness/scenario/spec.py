"""The cell: `RunSpec`, one matrix cell from scenario to record, and its `Settings`.

A scenario expands into RunSpecs (harness.scenario.schema); the planner keys its caches on them (frozen, hashable);
the launcher hands one to every rank in its payload; the record carries it as `spec`. Its JSON form is written and
read through one pair of functions, harness.results.spec (`spec_to_json`, `spec_from_json`), which also reads the
records of earlier versions. `run_id` is a digest of `identity()`: the cell without the settings left at their
default, so a setting added later keeps every earlier run_id.

Pure: no torch import, deterministic.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import math
from dataclasses import dataclass, field
from typing import Any, NoReturn

from harness.core import catalogue, precisions
from harness.core.constants import DDP_BUCKET_CAP_MB
from harness.core.families import FAMILIES
from harness.core.layout import MESH_DIMS, PP_SCHEDULES, Layout
from harness.core.zoo import ModelConfig
from harness.scenario import deepspeed_config

STRATEGIES: tuple[str, ...] = catalogue.STRATEGIES
HYBRID_STRATEGIES: frozenset[str] = catalogue.HYBRID_STRATEGIES
PRECISIONS: tuple[str, ...] = precisions.PRECISIONS
OFFLOADS: tuple[str, ...] = catalogue.OFFLOADS
AC_POLICIES: tuple[str, ...] = ("none", "full", "selective")
"""activation checkpointing: none; full (recompute each block); selective (keep matmul and attention outputs,
recompute the rest of each block: norms, RoPE, SiLU, products)"""

BACKWARD_PREFETCH: tuple[str, ...] = ("backward_pre", "backward_post", "none")
"""FSDP1's backward_prefetch (torch.distributed.fsdp.BackwardPrefetch, or None): when the next unit's all-gather is
issued in backward"""

LEGACY_GPUS_KEY = "world_size"
"""what records written before 2026-12 call `spec.gpus`; still the key run_id hashes it under"""


class FrozenDict(dict[str, Any]):
    """A dict that cannot change and hashes by its content: the value of a mapping setting (`inject`) inside a frozen,
    hashable `Settings`, so a RunSpec can key the planner's caches (functools.cache). Still a dict (JSON, equality
    with a plain dict, key order as written), so records, plans and run_ids read exactly as before."""

    def __hash__(self) -> int:  # type: ignore[override]
        return hash(frozenset(self.items()))

    def _refuse(self, *args: Any, **kwargs: Any) -> NoReturn:
        raise TypeError(f"a setting's mapping is frozen: {dict(self)!r}")

    __setitem__ = __delitem__ = __ior__ = clear = pop = popitem = setdefault = update = _refuse

    def __reduce__(self) -> tuple[type, tuple[dict[str, Any]]]:
        # NOTE: pickle's default for a dict subclass fills it with __setitem__, which refuses
        return FrozenDict, (dict(self),)


def frozen(value: Any) -> Any:
    """A JSON value frozen all the way down (mappings as FrozenDicts, lists as tuples): a nested mapping setting
    (`deepspeed_config`) that hashes by its content. JSON writes it back as it was read."""
    if isinstance(value, dict):
        return value if _is_frozen(value) else FrozenDict({k: frozen(v) for k, v in value.items()})
    if isinstance(value, (list, tuple)):
        return tuple(frozen(v) for v in value)
    return value


def thawed(value: Any) -> Any:
    """A frozen setting's value as plain JSON data again (dicts and lists): what a spec's JSON form writes."""
    if isinstance(value, dict):
        return {k: thawed(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [thawed(v) for v in value]
    return value


def _is_frozen(value: Any) -> bool:
    if isinstance(value, FrozenDict):
        return all(_is_frozen(v) for v in value.values())
    if isinstance(value, dict) or isinstance(value, list):
        return False
    if isinstance(value, tuple):
        return all(_is_frozen(v) for v in value)
    return True


SETTING_DEFAULTS: dict[str, Any] = {}
"""setting → its default (filled once Settings is defined)"""


def _setting(default: Any, doc: str, *, choices: tuple | None = None, minimum: float | None = None) -> Any:
    return field(default=default, metadata={"doc": doc, "choices": choices, "minimum": minimum})


@dataclass(frozen=True)
class Settings:
    """Per-cell knobs. Every field may be set under `settings:` or used as a matrix axis."""

    micro_batch: int = _setting(2, "sequences per rank per micro-step", minimum=1)
    seq_len: int = _setting(64, "tokens per sequence", minimum=2)
    grad_accum: int = _setting(1, "micro-steps per optimizer step", minimum=1)
    warmup_steps: int = _setting(2, "steps run before timing (>= 2: DDP rebuilds its buckets at step 2)", minimum=2)
    measure_steps: int = _setting(5, "timed steps; every one is kept as a sample", minimum=1)
    activation_checkpointing: str = _setting(
        "none",
        "none | full (recompute each block in backward) | selective (keep each block's matmul and attention "
        "outputs, recompute the rest); true/false mean full/none",
        choices=AC_POLICIES,
    )
    compile: bool = _setting(
        False, "torch.compile the model (per block for FSDP2/ZeRO, the wrapped model for DDP/FSDP1)"
    )
    offload: str = _setting(
        "none",
        "CPU offload: DeepSpeed ZeRO offload_optimizer/offload_param, FSDP CPUOffload; nvme: ZeRO-3's parameters "
        "and optimizer state swapped to nvme_path (ZeRO-Infinity; needs DeepSpeed's async I/O op, libaio)",
        choices=OFFLOADS,
    )
    seed: int = _setting(0, "seed for weights and synthetic batches", minimum=0)
    lr: float = _setting(1e-3, "AdamW learning rate", minimum=0.0)
    time_limit_s: float = _setting(900.0, "wall-clock limit for the whole cell (s)", minimum=1.0)
    inject: dict | None = _setting(
        None,
        "fault injection: {fault: oom|hang|crash|nan|exception, rank: N, step: K}, or a known slowdown "
        "{fault: slow, factor: F, rank: N (omitted: every rank), step: K (from this step on)}",
    )
    tp: int = _setting(
        1,
        "tensor-parallel ranks (inside a node); data-parallel degree = gpus / (tp x pp); with fsdp2.*, ddp or zero1",
        minimum=1,
    )
    pp: int = _setting(1, "pipeline-parallel ranks (stages across nodes); pp > 1 with ddp, fsdp2.* or zero1", minimum=1)
    pp_schedule: str = _setting(
        "1f1b",
        "pipeline schedule (pp > 1): gpipe | 1f1b | interleaved_1f1b (pp_virtual_stages per rank, 2 by default)",
        choices=PP_SCHEDULES,
    )
    pp_virtual_stages: int = _setting(
        0,
        "pipeline stages per rank with interleaved_1f1b (Megatron's virtual pipeline, 2 or more: a smaller bubble, "
        "more sends); 0 = the schedule's own (2 interleaved, 1 otherwise)",
        minimum=0,
    )
    microbatches: int = _setting(
        0, "pipeline microbatches each rank's micro_batch is split into (pp > 1); 0 = one per pipeline rank", minimum=0
    )
    sequence_parallel: bool = _setting(
        False, "tp > 1: shard the norms' activations over the sequence (all-gather / reduce-scatter for all-reduce)"
    )
    pad_vocab_multiple: int = _setting(
        0,
        "pad the vocabulary (embedding rows, head columns) to a multiple of this × tp, as Megatron-LM's "
        "make-vocab-size-divisible-by (128): an odd vocabulary then splits over tp; the planner counts the padded "
        "rows; 0 = no padding",
        minimum=0,
    )
    trace: bool = _setting(
        False,
        "five more steps after the timed ones under torch.profiler, between three untraced ones either side (the "
        "profiler's cost): a Chrome trace per rank beside the record and the measured step-time breakdown "
        "(metrics.time_s)",
    )
    checkpoint: bool = _setting(
        False,
        "after the timed steps, save the full training state (model, optimizer, step) the strategy's way, load it "
        "into a fresh model and optimizer and train on: metrics.checkpoint (save_s, load_s, bytes, files)",
    )
    # NOTE: the framework options below are each one family's (harness.core.catalogue.FAMILY_SETTINGS): a cell of
    # another family refuses them away from their default (a `skipped` record with the reason)
    wrap_blocks: int = _setting(
        1,
        "fsdp.*, fsdp2.*: consecutive transformer blocks per FSDP unit (one all-gather and one reduce-scatter "
        "each); 1 = one unit per block, 0 = the whole model as one unit",
        minimum=0,
    )
    reshard_after_forward: bool = _setting(
        True,
        "fsdp2.*: fully_shard(reshard_after_forward); false keeps every unit gathered from its forward to its "
        "backward (no all-gather in backward, more memory); FSDP1's equivalent is fsdp.shard_grad_op",
    )
    prefetch_units: int = _setting(
        1,
        "fsdp2.*: FSDP units all-gathered ahead of the one running, forward and backward; 1 = FSDP2's implicit "
        "prefetch, N > 1 = set_modules_to_forward_prefetch / set_modules_to_backward_prefetch of the next N",
        minimum=1,
    )
    forward_prefetch: bool = _setting(
        False, "fsdp.*: FSDP1 forward_prefetch (issue the next unit's all-gather before the current forward)"
    )
    backward_prefetch: str = _setting(
        "backward_pre",
        "fsdp.*: FSDP1 backward_prefetch: backward_pre (the next unit gathered before the current unit's gradient "
        "computation) | backward_post (after it) | none",
        choices=BACKWARD_PREFETCH,
    )
    limit_all_gathers: bool = _setting(
        True, "fsdp.*: FSDP1 limit_all_gathers (at most two units' all-gathers in flight ahead of the compute)"
    )
    bucket_cap_mb: float = _setting(
        float(DDP_BUCKET_CAP_MB),
        "ddp: DistributedDataParallel bucket_cap_mb (MiB); 25 = torch's default (its first bucket 1 MiB), another "
        "value is every bucket's cap, the first's too (as torch takes an explicit value)",
        minimum=0.0,
    )

    deepspeed_config: dict | None = _setting(
        None,
        "zero* cells: a DeepSpeed config (a JSON file, relative to the scenario file, or a mapping) merged over the "
        "harness's own; the keys the harness sets (batch sizes, stage, precision, offload, optimizer) may only repeat "
        "its values; the cell carries the file's content, so the run_id follows it (docs/strategies.md)",
    )
    nvme_path: str = _setting(
        "",
        "offload: nvme's swap folder, an absolute path on a fast local disk (ignored by other offloads); empty: a "
        "folder of the run's own under the sweep's results (.scratch/<run_id>.<attempt>/nvme), removed after the run",
    )

    def __post_init__(self) -> None:
        # NOTE: true/false were the only values before the policies existed; records and files keep them
        object.__setattr__(
            self,
            "activation_checkpointing",
            canonical_setting("activation_checkpointing", self.activation_checkpointing),
        )
        # NOTE: the pipeline and sequence-parallel knobs mean nothing without pp / tp: back to their defaults, so a
        # `pp: [1, 2]` axis with `pp_schedule: gpipe` keeps the pp 1 cell's run_id that of the cell without them
        if self.pp == 1:
            object.__setattr__(self, "pp_schedule", SETTING_DEFAULTS["pp_schedule"])
            object.__setattr__(self, "microbatches", SETTING_DEFAULTS["microbatches"])
            object.__setattr__(self, "pp_virtual_stages", SETTING_DEFAULTS["pp_virtual_stages"])
        if self.tp == 1:
            object.__setattr__(self, "sequence_parallel", SETTING_DEFAULTS["sequence_parallel"])
        if self.offload != "nvme":  # NOTE: likewise, the swap folder means nothing without NVMe offload
            object.__setattr__(self, "nvme_path", SETTING_DEFAULTS["nvme_path"])
        # NOTE: frozen all the way down, so that a RunSpec hashes (the planner's caches key on it)
        if isinstance(self.inject, dict) and not isinstance(self.inject, FrozenDict):
            object.__setattr__(self, "inject", FrozenDict(self.inject))
        if isinstance(self.deepspeed_config, dict):
            object.__setattr__(self, "deepspeed_config", frozen(self.deepspeed_config))

    @property
    def degrees(self) -> tuple[tuple[str, int], ...]:
        """(name, degree) of every parallel dimension (harness.core.layout.MESH_DIMS: each is a setting)."""
        return tuple((d.name, getattr(self, d.name)) for d in MESH_DIMS)

    @property
    def checkpointing(self) -> bool:
        """Whether blocks run under activation checkpointing (full or selective)."""
        return self.activation_checkpointing != "none"


SETTING_FIELDS = {f.name: f for f in dataclasses.fields(Settings)}
SETTING_DEFAULTS.update({name: f.default for name, f in SETTING_FIELDS.items()})
LAYOUT_SETTINGS: tuple[str, ...] = (
    "tp", "pp", "pp_schedule", "pp_virtual_stages", "microbatches", "sequence_parallel", "pad_vocab_multiple",
)  # fmt: skip
"""the settings of a cell's parallel layout (harness.core.layout)"""


def canonical_setting(name: str, value: Any) -> Any:
    """A setting's value as this version spells it: activation_checkpointing true/false → full/none (the
    booleans of earlier records and files). Everything else as given."""
    if name == "activation_checkpointing" and isinstance(value, bool):
        return "full" if value else "none"
    return value


@dataclass(frozen=True)
class RunSpec:
    """One matrix cell: everything a worker needs, serialisable, hashed into `run_id`."""

    model: str
    """model name (zoo or scenario-defined)"""
    model_config: ModelConfig
    """the model's dimensions (so a renamed or edited custom model changes run_id)"""
    strategy: str
    """parallelism family and variant, e.g. fsdp.full_shard (harness.core.catalogue)"""
    precision: str
    """fp32 | bf16 | fp16"""
    gpus: int
    """ranks = GPUs (the scenario's `gpus` axis; torch calls it the world size)"""
    nodes: int
    """ceil(gpus / gpus_per_node)"""
    gpus_per_node: int
    """ranks per node, from the cluster profile; hybrids shard inside a node and replicate across nodes"""
    settings: Settings
    extra: tuple[tuple[str, str], ...] = ()
    """spec keys this version does not know (a newer harness's setting, read from its record), as (key, JSON text)
    pairs in the file's order: kept so that the record writes back whole and stays a cell of its own; () for every
    cell a scenario expands to"""

    def identity(self) -> dict[str, Any]:
        """What makes two cells the same cell: the spec without settings left at their default (and with the keys a
        newer harness wrote, `extra`).

        A setting added in a later version (at its default) thus keeps every existing run_id and match.
        The GPU count is hashed under its old key, `world_size`, so renaming it to `gpus` kept every run_id.
        """
        out: dict[str, Any] = {
            "model": self.model,
            "model_config": self.model_config.to_dict(),
            "strategy": self.strategy,
            "precision": self.precision,
            LEGACY_GPUS_KEY: self.gpus,
            "nodes": self.nodes,
            "gpus_per_node": self.gpus_per_node,
        }
        # NOTE: not dataclasses.asdict (a deepcopy per field): planning 10,000 cells calls this for every run_id
        for name, f in SETTING_FIELDS.items():
            v = getattr(self.settings, name)
            if v != f.default:
                out[name] = thawed(v) if isinstance(v, dict) else v
        out.update((key, json.loads(text)) for key, text in self.extra)
        return out

    @functools.cached_property
    def match_key(self) -> str:
        """The cell as `harness compare` matches it and the history keys it: canonical JSON of `identity()` with the
        GPU count under `gpus` (900 and 900.0 alike), so a renamed sweep or a re-organised results tree still lines
        up and a setting added later (at its default) matches the records written before it."""
        return self.key_without(())

    def key_without(self, ignore: tuple[str, ...]) -> str:
        """`match_key` with the top-level keys `ignore` left out (`harness compare --ignore-spec-key`)."""
        d = self.identity()
        d["gpus"] = d.pop(LEGACY_GPUS_KEY)
        for k in ignore:
            d.pop("gpus" if k == LEGACY_GPUS_KEY else k, None)
        return json.dumps(canonical_json(d), sort_keys=True, separators=(",", ":"))

    @functools.cached_property
    def run_id(self) -> str:
        """`<model>-<strategy>-<precision>-g<N>-<digest>`: readable, and stable for the same spec."""
        canonical = json.dumps(self.identity(), sort_keys=True, separators=(",", ":"))
        digest = hashlib.sha256(canonical.encode()).hexdigest()[:10]
        return f"{self.model}-{self.strategy}-{self.precision}-g{self.gpus}-{digest}"

    @functools.cached_property
    def layout(self) -> Layout:
        """The cell's parallel layout: data × tensor × pipeline ranks (harness.core.layout)."""
        s = self.settings
        return Layout(
            gpus=self.gpus,
            degrees=s.degrees,
            gpus_per_node=self.gpus_per_node,
            hybrid=catalogue.is_hybrid(self.strategy),
            schedule=s.pp_schedule,
            virtual_stages=s.pp_virtual_stages,
        )

    @property
    def layout_tag(self) -> str:
        """The layout in a few characters, '' for plain data parallelism: `tp2 sp`, `pp2 (1f1b)`, `tp2 × pp2 (gpipe)`.
        Cells that differ only in their layout share the rest of their run_id, so every line that names a cell
        shows this beside it (issue 31)."""
        s, lay = self.settings, self.layout
        return " × ".join(f"{d.name}{lay.degree(d.name)}{_TAG_DETAILS.get(d.name, _none)(s)}" for d in lay.used)

    @property
    def cell_name(self) -> str:
        """How a terminal line names the cell: its run_id, and its layout when it has one."""
        return f"{self.run_id} [{self.layout_tag}]" if self.layout_tag else self.run_id

    @property
    def dp(self) -> int:
        """Data-parallel degree (the layout's): the replicas that each train on their own rows of the batch."""
        return self.layout.dp

    @property
    def tokens_per_step(self) -> int:
        """Global tokens per optimizer step: every data-parallel replica's (tensor- and pipeline-parallel ranks of
        one replica train on the same rows)."""
        s = self.settings
        return s.micro_batch * s.seq_len * s.grad_accum * self.dp

    def unsupported_reason(self, device: str | None = None) -> str | None:
        """Why this cell cannot run as specified (it becomes a `skipped` record), or None.

        `device` (cpu | cuda, from the cluster profile) adds what a backend cannot do on that device. The rules
        for every strategy are here; what one strategy supports is its harness.core.catalogue entry.
        """
        s = self.settings
        if s.inject is not None and s.inject.get("rank", 0) >= self.gpus:
            return f"inject.rank {s.inject.get('rank', 0)} is not a rank of a world of {self.gpus}"
        if s.inject is not None and s.inject.get("fault") == "checkpoint_truncate" and not s.checkpoint:
            return "inject checkpoint_truncate cuts the checkpoint's files: it needs checkpoint: true"
        entry = catalogue.CATALOGUE.get(self.strategy)
        if entry is None:  # not a strategy of this version (validation refuses it; an old record may carry it)
            return None
        why = self._family_setting_refusal() or self.model_config.checkpointing_refusal(s.activation_checkpointing)
        if why is not None:
            return why
        if s.pad_vocab_multiple > 1 and self.model_config.family != "decoder":
            return (
                f"pad_vocab_multiple pads the harness's own decoder; the {self.model_config.family} model builds its "
                "vocabulary from its own config"
            )
        if not self.layout.is_default:
            return self._layout_refusal(entry, device)
        if entry.mesh == catalogue.HYBRID:
            if self.gpus % self.gpus_per_node:
                return (
                    f"{self.strategy} needs gpus divisible by gpus_per_node ({self.gpus} % {self.gpus_per_node} != 0)"
                )
            if self.nodes < 2:
                return (
                    f"{self.strategy} shards inside a node and replicates across nodes; world {self.gpus} "
                    f"with {self.gpus_per_node} GPUs per node is a single node"
                )
        if self.precision not in entry.precisions:
            return f"{self.strategy} does not run {self.precision} (it runs {', '.join(entry.precisions)})"
        if s.offload != "none":
            why = entry.offload_refusal(s.offload)
            if why is not None:
                return why
        if s.compile:
            why = entry.compile_refusal(checkpointing=s.checkpointing)
            if why is not None:
                return why
        why = deepspeed_config.refusal(self)
        if why is not None:
            return why
        return entry.device_refusal(device, self.precision)

    def _family_setting_refusal(self) -> str | None:
        """Why a framework option set away from its default does not apply to this cell (another family's option,
        or one the tensor/pipeline layouts do not take), or None."""
        s, layout = self.settings, not self.layout.is_default
        for name in catalogue.FAMILY_SETTINGS:
            if getattr(s, name) != SETTING_DEFAULTS[name]:
                why = catalogue.family_setting_refusal(name, strategy=self.strategy, layout=layout)
                if why is not None:
                    return why
        if s.prefetch_units != SETTING_DEFAULTS["prefetch_units"] and s.wrap_blocks == 0:
            return "prefetch_units: wrap_blocks 0 makes the whole model one FSDP unit, so there is nothing to prefetch"
        return None

    def _layout_refusal(self, entry: catalogue.Strategy, device: str | None) -> str | None:
        """Why a tensor- or pipeline-parallel cell cannot run (its layout is valid: validation checked it)."""
        s, lay = self.settings, self.layout
        why = entry.layout_refusal(d.name for d in lay.used)
        if why is not None:
            return why
        family = FAMILIES[self.model_config.family].layout_refusal
        if family is not None:
            return family.format(family=self.model_config.family)
        inside = tuple(d for d in lay.used if d.inside_node)
        if self.gpus_per_node % lay.inside_node:
            return (
                f"{lay.named(inside)} does not fit in a node of {self.gpus_per_node} GPUs "
                f"({' and '.join(d.noun for d in inside)} stay{'s' if len(inside) == 1 else ''} inside a node: "
                f"{'its' if len(inside) == 1 else 'their'} collectives are on every block's critical path)"
            )
        if entry.mesh == catalogue.HYBRID:
            if self.gpus % self.gpus_per_node:
                return f"{self.strategy} needs whole nodes: gpus {self.gpus} % gpus_per_node {self.gpus_per_node} != 0"
            if lay.dp_replicate < 2 or lay.dp_shard * lay.dp_replicate != lay.dp:
                return (
                    f"{self.strategy} shards over the {lay.dp_shard} rank(s) of a node beside "
                    f"{lay.named(inside) or 'tp 1'} and replicates across nodes; dp {lay.dp} (gpus {self.gpus} / "
                    f"({lay.named(tuple(reversed(MESH_DIMS)))})) leaves {lay.dp_replicate} replica(s), it needs at "
                    "least 2 whole ones"
                )
        if self.precision not in entry.precisions:
            return f"{self.strategy} does not run {self.precision} (it runs {', '.join(entry.precisions)})"
        if s.offload != "none":
            why = entry.offload_refusal(s.offload) or f"{self.strategy}: CPU offload is not part of the tp/pp layouts"
            return why
        if s.compile:
            return "torch.compile is not part of the tensor- and pipeline-parallel layouts here"
        if s.checkpoint:
            return "checkpoint is not part of the tensor- and pipeline-parallel layouts here"
        why = deepspeed_config.refusal(self)
        if why is not None:
            return why
        if deepspeed_config.is_deepspeed(self.strategy) and not deepspeed_config.runs_deepspeed(self):
            return None  # DeepSpeed's device refusals: this zero1 cell runs the harness's distributed optimizer
        return entry.device_refusal(device, self.precision)


def _none(settings: Settings) -> str:
    return ""


_TAG_DETAILS: dict[str, Any] = {
    "tp": lambda s: " sp" if s.sequence_parallel else "",
    "pp": lambda s: f" ({s.pp_schedule}{f' v{s.pp_virtual_stages}' if s.pp_virtual_stages > 1 else ''})",
}
"""what a layout tag adds after a dimension's degree (`tp2 sp`, `pp2 (1f1b)`): its settings that shape it"""


def value_is(value: Any, typ: type) -> bool:
    """Whether `value` is a `typ` as a cell's fields take it: a bool is no int, an int is a float, NaN is none."""
    if typ is bool:
        return isinstance(value, bool)
    if typ is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if typ is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    return isinstance(value, typ)


TYPE_NAMES = {bool: "a boolean", int: "an integer", float: "a number", str: "a string"}
"""a setting's type as an error line words it"""


_PLAIN = frozenset({str, int, bool, type(None)})


def canonical_json(obj: Any) -> Any:
    """A spec value as keys compare it: an integral float as an int (900.0 from a dataclass default, 900 from YAML)."""
    if type(obj) in _PLAIN:  # most spec values: as they are
        return obj
    if isinstance(obj, float) and obj.is_integer():
        return int(obj)
    if isinstance(obj, dict):
        return {str(k): canonical_json(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [canonical_json(v) for v in obj]
    return obj
