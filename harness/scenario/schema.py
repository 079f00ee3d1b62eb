"""Scenario files → validated Scenario → expanded, hashed RunSpecs (one per matrix cell).

Pure: no torch import, deterministic. Every problem in a file is collected and raised once as an
`InputError` whose lines read `file: dotted.key: message`.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import itertools
import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NoReturn

import yaml

from harness.core import catalogue
from harness.core.errors import InputError, Problem, one_of, unknown
from harness.core.layout import PP_SCHEDULES, Layout, layout_problems
from harness.core.zoo import BOOL_MODEL_KEYS, MODEL_KEYS, REQUIRED_MODEL_KEYS, ZOO, ModelConfig
from harness.scenario.hf_config import HF_CONFIG_KEY, hf_model_entry, model_sources
from harness.scenario.tune import TuneSpec, derived_grad_accum, parse_tune

# NOTE: the strategy names, precisions and offload modes are the catalogue's (harness.core.catalogue); re-exported
# here because every stage validates against them through this module
STRATEGIES: tuple[str, ...] = catalogue.STRATEGIES
HYBRID_STRATEGIES: frozenset[str] = catalogue.HYBRID_STRATEGIES
PRECISIONS: tuple[str, ...] = catalogue.PRECISIONS
OFFLOADS: tuple[str, ...] = catalogue.OFFLOADS
AC_POLICIES: tuple[str, ...] = ("none", "full", "selective")
"""activation checkpointing: none; full (recompute each block); selective (keep matmul and attention outputs,
recompute the rest of each block: norms, RoPE, SiLU, products)"""
FAULTS: tuple[str, ...] = ("oom", "hang", "crash", "nan", "exception", "slow", "checkpoint_truncate")
INJECT_KEYS: tuple[str, ...] = ("fault", "rank", "step", "factor")
SLOW_FACTOR_MAX = 100.0
"""the largest `slow` factor accepted (a step 100 times its own duration)"""
CORE_AXES: tuple[str, ...] = ("model", "strategy", "precision", "gpus")
LEGACY_GPUS_KEY = "world_size"
"""what records written before 2026-12 call `spec.gpus`; still the key run_id hashes it under"""
TOP_LEVEL_KEYS: tuple[str, ...] = ("name", "description", "models", "matrix", "settings", "tune")
NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")


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
        "none", "CPU offload: DeepSpeed ZeRO offload_optimizer/offload_param, FSDP CPUOffload", choices=OFFLOADS
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
        1, "tensor-parallel ranks (inside a node); data-parallel degree = gpus / (tp x pp); with fsdp2.*", minimum=1
    )
    pp: int = _setting(1, "pipeline-parallel ranks (stages across nodes); pp > 1 with ddp or fsdp2.*", minimum=1)
    pp_schedule: str = _setting(
        "1f1b", "pipeline schedule (pp > 1): gpipe | 1f1b | interleaved_1f1b (2 stages per rank)", choices=PP_SCHEDULES
    )
    microbatches: int = _setting(
        0, "pipeline microbatches each rank's micro_batch is split into (pp > 1); 0 = one per pipeline rank", minimum=0
    )
    sequence_parallel: bool = _setting(
        False, "tp > 1: shard the norms' activations over the sequence (all-gather / reduce-scatter for all-reduce)"
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
        if self.tp == 1:
            object.__setattr__(self, "sequence_parallel", SETTING_DEFAULTS["sequence_parallel"])
        # NOTE: frozen all the way down, so that a RunSpec hashes (the planner's caches key on it)
        if isinstance(self.inject, dict) and not isinstance(self.inject, FrozenDict):
            object.__setattr__(self, "inject", FrozenDict(self.inject))

    @property
    def checkpointing(self) -> bool:
        """Whether blocks run under activation checkpointing (full or selective)."""
        return self.activation_checkpointing != "none"


SETTING_FIELDS = {f.name: f for f in dataclasses.fields(Settings)}
SETTING_DEFAULTS.update({name: f.default for name, f in SETTING_FIELDS.items()})
LAYOUT_SETTINGS: tuple[str, ...] = ("tp", "pp", "pp_schedule", "microbatches", "sequence_parallel")
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
    precision: str
    gpus: int
    """ranks = GPUs (the scenario's `gpus` axis; torch calls it the world size)"""
    nodes: int
    """ceil(gpus / gpus_per_node)"""
    gpus_per_node: int
    """ranks per node, from the cluster profile; hybrids shard inside a node and replicate across nodes"""
    settings: Settings

    def to_dict(self) -> dict[str, Any]:
        """Flat JSON form: `spec.{model, strategy, precision, gpus, nodes, gpus_per_node, micro_batch, …}`."""
        d: dict[str, Any] = {
            "model": self.model,
            "model_config": self.model_config.to_dict(),
            "strategy": self.strategy,
            "precision": self.precision,
            "gpus": self.gpus,
            "nodes": self.nodes,
            "gpus_per_node": self.gpus_per_node,
        }
        # NOTE: not dataclasses.asdict (a deepcopy per field): planning 10,000 cells calls this for every run_id
        for k in SETTING_FIELDS:
            v = getattr(self.settings, k)
            d[k] = dict(v) if isinstance(v, dict) else v
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> RunSpec:
        known = {k: d[k] for k in SETTING_FIELDS if k in d}
        return cls(
            model=d["model"],
            model_config=ModelConfig(**d["model_config"]),
            strategy=d["strategy"],
            precision=d["precision"],
            gpus=int(d["gpus"] if "gpus" in d else d[LEGACY_GPUS_KEY]),
            nodes=int(d["nodes"]),
            gpus_per_node=int(d["gpus_per_node"]),
            settings=Settings(**known),
        )

    def identity(self) -> dict[str, Any]:
        """What makes two cells the same cell: the spec without settings left at their default.

        A setting added in a later version (at its default) thus keeps every existing run_id and match.
        The GPU count is hashed under its old key, `world_size`, so renaming it to `gpus` kept every run_id.
        """
        defaults = {name: f.default for name, f in SETTING_FIELDS.items()}
        out = {k: v for k, v in self.to_dict().items() if not (k in defaults and v == defaults[k])}
        out[LEGACY_GPUS_KEY] = out.pop("gpus")
        return out

    @functools.cached_property
    def run_id(self) -> str:
        """`<model>-<strategy>-<precision>-g<N>-<digest>`: readable, and stable for the same spec."""
        canonical = json.dumps(self.identity(), sort_keys=True, separators=(",", ":"))
        digest = hashlib.sha256(canonical.encode()).hexdigest()[:10]
        return f"{self.model}-{self.strategy}-{self.precision}-g{self.gpus}-{digest}"

    @property
    def layout(self) -> Layout:
        """The cell's parallel layout: data × tensor × pipeline ranks (harness.core.layout)."""
        s = self.settings
        return Layout(
            gpus=self.gpus,
            tp=s.tp,
            pp=s.pp,
            gpus_per_node=self.gpus_per_node,
            hybrid=catalogue.is_hybrid(self.strategy),
            schedule=s.pp_schedule,
        )

    @property
    def layout_tag(self) -> str:
        """The layout in a few characters, '' for plain data parallelism: `tp2 sp`, `pp2 (1f1b)`, `tp2 × pp2 (gpipe)`.
        Cells that differ only in their layout share the rest of their run_id, so every line that names a cell
        shows this beside it (issue 31)."""
        s = self.settings
        parts = []
        if s.tp > 1:
            parts.append(f"tp{s.tp}" + (" sp" if s.sequence_parallel else ""))
        if s.pp > 1:
            parts.append(f"pp{s.pp} ({s.pp_schedule})")
        return " × ".join(parts)

    @property
    def cell_name(self) -> str:
        """How a terminal line names the cell: its run_id, and its layout when it has one."""
        return f"{self.run_id} [{self.layout_tag}]" if self.layout_tag else self.run_id

    @property
    def dp(self) -> int:
        """Data-parallel degree: gpus / (tp x pp), the replicas that each train on their own rows of the batch."""
        return self.gpus // (self.settings.tp * self.settings.pp)

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
        if s.tp > 1 or s.pp > 1:
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
        return entry.device_refusal(device, self.precision)

    def _layout_refusal(self, entry: catalogue.Strategy, device: str | None) -> str | None:
        """Why a tensor- or pipeline-parallel cell cannot run (its layout is valid: validation checked it)."""
        s, lay = self.settings, self.layout
        why = entry.layout_refusal(tp=s.tp, pp=s.pp)
        if why is not None:
            return why
        if s.tp > 1 and self.gpus_per_node % s.tp:
            return (
                f"tp {s.tp} does not fit in a node of {self.gpus_per_node} GPUs (tensor parallelism stays inside a "
                "node: its collectives are on every block's critical path)"
            )
        if entry.mesh == catalogue.HYBRID:
            if self.gpus % self.gpus_per_node:
                return f"{self.strategy} needs whole nodes: gpus {self.gpus} % gpus_per_node {self.gpus_per_node} != 0"
            if lay.dp_replicate < 2 or lay.dp_shard * lay.dp_replicate != lay.dp:
                return (
                    f"{self.strategy} shards over the {lay.dp_shard} rank(s) of a node beside tp {s.tp} and replicates "
                    f"across nodes; dp {lay.dp} (gpus {self.gpus} / (tp {s.tp} x pp {s.pp})) leaves "
                    f"{lay.dp_replicate} replica(s), it needs at least 2 whole ones"
                )
        if self.precision not in entry.precisions:
            return f"{self.strategy} does not run {self.precision} (it runs {', '.join(entry.precisions)})"
        if self.precision == "fp16":
            return "fp16 loss scaling is not part of the tensor- and pipeline-parallel layouts here (run bf16 or fp32)"
        if s.offload != "none":
            why = entry.offload_refusal(s.offload) or f"{self.strategy}: CPU offload is not part of the tp/pp layouts"
            return why
        if s.compile:
            return "torch.compile is not part of the tensor- and pipeline-parallel layouts here"
        if s.checkpoint:
            return "checkpoint is not part of the tensor- and pipeline-parallel layouts here"
        return entry.device_refusal(device, self.precision)


@dataclass(frozen=True)
class Scenario:
    """A validated scenario file."""

    name: str
    path: str
    models: dict[str, ModelConfig]
    """scenario-defined models, beside the zoo"""
    cells: tuple[dict[str, Any], ...]
    """expanded matrix combinations (axis name → value), before the cluster fixes node layout"""
    settings: dict[str, Any]
    """the scenario-level settings overrides"""
    description: str = ""
    tune: TuneSpec | None = None
    """the `tune:` section (harness.scenario.tune): `harness tune`'s objective and search; with its
    `global_batch`, every cell's grad_accum is derived"""
    model_sources: dict[str, str] = field(default_factory=dict)
    """scenario-defined model name → where its dimensions come from (`hf_config <path>` or the scenario file),
    for `harness list models`"""

    def model_config(self, name: str) -> ModelConfig:
        return self.models.get(name) or ZOO[name]

    def with_setting(self, name: str, value: Any) -> Scenario:
        """This scenario with setting `name` at `value` in every cell, over what its settings and matrix say: what a
        sweep flag turns on for a whole sweep (`harness sweep --trace`). Cells that then coincide become one."""
        cells = tuple({**c, name: value} if name in c else c for c in self.cells)
        return dataclasses.replace(self, settings={**self.settings, name: value}, cells=cells)

    def expand(self, *, gpus_per_node: int) -> list[RunSpec]:
        """RunSpecs in file order, de-duplicated by run_id. `gpus_per_node` comes from the cluster profile."""
        return self.expand_all(gpus_per_node=gpus_per_node)[0]

    def left_out(self, *, gpus_per_node: int) -> list[tuple[dict[str, Any], str]]:
        """Matrix cells left out of `expand` and why: those whose grad_accum `tune.global_batch` cannot derive."""
        return self.expand_all(gpus_per_node=gpus_per_node)[1]

    def expand_all(self, *, gpus_per_node: int) -> tuple[list[RunSpec], list[tuple[dict[str, Any], str]]]:
        """(`expand`, `left_out`) from one pass over the cells, for a caller that needs both."""
        specs: dict[str, RunSpec] = {}
        dropped: list[tuple[dict[str, Any], str]] = []
        global_batch = self.tune.global_batch if self.tune is not None else None
        for cell in self.cells:
            merged = {**self.settings, **{k: v for k, v in cell.items() if k in SETTING_FIELDS}}
            world = int(cell["gpus"])
            spec = RunSpec(
                model=cell["model"],
                model_config=self.model_config(cell["model"]),
                strategy=cell["strategy"],
                precision=cell["precision"],
                gpus=world,
                nodes=math.ceil(world / gpus_per_node),
                gpus_per_node=min(gpus_per_node, world),
                settings=Settings(**merged),
            )
            if global_batch is not None:
                accum, why = derived_grad_accum(global_batch, micro_batch=spec.settings.micro_batch, dp=spec.dp)
                if accum is None:
                    dropped.append((cell, str(why)))
                    continue
                spec = dataclasses.replace(spec, settings=dataclasses.replace(spec.settings, grad_accum=accum))
            specs.setdefault(spec.run_id, spec)
        return list(specs.values()), dropped


# --------------------------------------------------------------------------------------------------
# loading and validation


class _NoObjectsLoader(yaml.SafeLoader):
    """Safe loading, and a clear error (not a traceback) for tags like !!python/object."""


def _refuse_tag(loader: yaml.SafeLoader, suffix: str, node: yaml.Node) -> Any:
    raise yaml.constructor.ConstructorError(
        None, None, f"tag {node.tag!r} is not allowed (scenario files are plain data)", node.start_mark
    )


_NoObjectsLoader.add_multi_constructor("!", _refuse_tag)
_NoObjectsLoader.add_multi_constructor("tag:yaml.org,2002:python/", _refuse_tag)


def load_yaml(path: str | Path) -> Any:
    """Parse a YAML file with safe loading; syntax errors become an InputError naming the line."""
    p = Path(path)
    try:
        text = p.read_text()
    except OSError as e:
        raise InputError([Problem(str(path), "", f"cannot read file: {e.strerror or e}")]) from None
    try:
        return yaml.load(text, Loader=_NoObjectsLoader)  # noqa: S506 - a SafeLoader subclass
    except yaml.YAMLError as e:
        raise InputError([Problem(str(path), "", f"invalid YAML: {e}")]) from None


def _type_ok(value: Any, typ: type) -> bool:
    if typ is bool:
        return isinstance(value, bool)
    if typ is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if typ is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    return isinstance(value, typ)


_TYPE_NAMES = {bool: "a boolean", int: "an integer", float: "a number", str: "a string"}


def _check_inject(value: Any, where: str, file: str, problems: list[Problem]) -> None:
    if value is None:
        return
    if not isinstance(value, dict):
        problems.append(
            Problem(file, where, f"{value!r} must be null or a mapping like {{fault: exception, rank: 1, step: 3}}")
        )
        return
    for k in value:
        if k not in INJECT_KEYS:
            problems.append(unknown(file, f"{where}.{k}", k, INJECT_KEYS))
    if "fault" not in value:
        problems.append(Problem(file, f"{where}.fault", f"missing; one of {', '.join(FAULTS)}"))
    elif value["fault"] not in FAULTS:
        problems.append(Problem(file, f"{where}.fault", one_of(value["fault"], FAULTS)))
    for k, minimum in (("rank", 0), ("step", 1)):
        v = value.get(k, minimum)
        if not _type_ok(v, int) or v < minimum:
            problems.append(Problem(file, f"{where}.{k}", f"{v!r} is not an integer >= {minimum}"))
    if value.get("fault") == "slow":
        factor = value.get("factor")
        if "factor" not in value:
            problems.append(Problem(file, f"{where}.factor", "missing; the slowdown, e.g. 1.3 (steps take 1.3x)"))
        elif isinstance(factor, bool) or not isinstance(factor, (int, float)) or not 1 < factor <= SLOW_FACTOR_MAX:
            problems.append(Problem(file, f"{where}.factor", f"{factor!r} is not a number in (1, {SLOW_FACTOR_MAX:g}]"))
    elif "factor" in value:
        problems.append(Problem(file, f"{where}.factor", "only `fault: slow` takes a factor"))


def _check_setting(name: str, value: Any, where: str, file: str, problems: list[Problem]) -> None:
    if name == "inject":
        _check_inject(value, where, file, problems)
        return
    f = SETTING_FIELDS[name]
    value = canonical_setting(name, value)
    typ = {"int": int, "float": float, "bool": bool, "str": str}[f.type] if isinstance(f.type, str) else f.type
    choices, minimum = f.metadata["choices"], f.metadata["minimum"]
    if not _type_ok(value, typ):
        problems.append(
            Problem(file, where, one_of(value, choices) if choices else f"{value!r} is not {_TYPE_NAMES[typ]}")
        )
        return
    if choices and value not in choices:
        problems.append(Problem(file, where, one_of(value, choices)))
    if minimum is not None and value < minimum:
        problems.append(Problem(file, where, f"{value!r} is below the minimum {minimum!r}"))


def _check_models(raw: Any, file: str, problems: list[Problem]) -> dict[str, ModelConfig]:
    models: dict[str, ModelConfig] = {}
    if raw is None:
        return models
    if not isinstance(raw, dict):
        problems.append(Problem(file, "models", "must be a mapping of model name to dimensions"))
        return models
    for name, dims in raw.items():
        where = f"models.{name}"
        if not isinstance(name, str) or not NAME_RE.match(name):
            problems.append(Problem(file, where, f"model name {name!r} must match {NAME_RE.pattern}"))
            continue
        if name in ZOO:
            problems.append(Problem(file, where, f"{name!r} is a zoo model; pick another name"))
            continue
        if not isinstance(dims, dict):
            problems.append(Problem(file, where, "must be a mapping like {d_model: 4096, n_layers: 32, ...}"))
            continue
        if HF_CONFIG_KEY in dims:
            from_file = hf_model_entry(dims, file=file, where=where, problems=problems)
            if from_file is not None:
                models[name] = from_file
            continue
        ok = True
        for k in dims:
            if k not in MODEL_KEYS:
                problems.append(unknown(file, f"{where}.{k}", k, sorted(MODEL_KEYS | {HF_CONFIG_KEY})))
                ok = False
        for k in sorted(REQUIRED_MODEL_KEYS - set(dims)):
            problems.append(Problem(file, f"{where}.{k}", "missing (required)"))
            ok = False
        for k, v in dims.items():
            if k in BOOL_MODEL_KEYS and not isinstance(v, bool):
                problems.append(Problem(file, f"{where}.{k}", f"{v!r} is not true or false"))
                ok = False
            elif k in MODEL_KEYS - BOOL_MODEL_KEYS and v is not None and (not _type_ok(v, int) or v < 1):
                problems.append(Problem(file, f"{where}.{k}", f"{v!r} is not a positive integer"))
                ok = False
        if ok:
            cfg = ModelConfig(**dims)
            bad = cfg.shape_problem()
            if bad is None:
                models[name] = cfg
            else:
                problems.append(Problem(file, f"{where}.{bad[0]}", bad[1]))
    return models


def _check_axis_value(
    axis: str, value: Any, where: str, file: str, model_names: list[str], problems: list[Problem]
) -> None:
    if axis == "model":
        if value not in model_names:
            problems.append(Problem(file, where, one_of(value, model_names)))
    elif axis == "strategy":
        if value not in STRATEGIES:
            problems.append(Problem(file, where, one_of(value, STRATEGIES)))
    elif axis == "precision":
        if value not in PRECISIONS:
            problems.append(Problem(file, where, one_of(value, PRECISIONS)))
    elif axis == "gpus":
        if not _type_ok(value, int) or value < 1:
            problems.append(Problem(file, where, f"{value!r} is not a positive integer"))
    else:
        _check_setting(axis, value, where, file, problems)


def _matches(cell: dict[str, Any], pattern: dict[str, Any]) -> bool:
    return all(k in cell and cell[k] == v for k, v in pattern.items())


def expand_matrix(
    axes: dict[str, list[Any]], include: list[dict[str, Any]], exclude: list[dict[str, Any]]
) -> list[dict[str, Any]]:
    """GitHub Actions matrix semantics.

    Cartesian product of `axes` in key order; drop combinations matching any `exclude` entry (all of its
    keys equal); then each `include` entry is merged into every combination whose original axis values it
    does not contradict (its extra keys added; keys added by an earlier include may be overwritten), and
    becomes a new combination when it merges into none.
    """
    keys = list(axes)
    base = [dict(zip(keys, values)) for values in itertools.product(*(axes[k] for k in keys))] if keys else []
    base = [c for c in base if not any(_matches(c, e) for e in exclude)]
    originals = [dict(c) for c in base]
    cells = [dict(c) for c in base]
    extra: list[dict[str, Any]] = []
    for inc in include:
        merged = False
        for orig, cell in zip(originals, cells):
            if all(orig[k] == v for k, v in inc.items() if k in orig):
                cell.update(inc)
                merged = True
        if not merged:
            extra.append(dict(inc))
    return cells + extra


def parse_scenario(doc: Any, file: str) -> Scenario:
    """Validate a parsed scenario document and expand its matrix. Raises InputError with every problem."""
    problems: list[Problem] = []
    if not isinstance(doc, dict):
        raise InputError(
            [Problem(file, "", "a scenario file must be a mapping with keys: " + ", ".join(TOP_LEVEL_KEYS))]
        )

    for k in doc:
        if k not in TOP_LEVEL_KEYS:
            problems.append(unknown(file, str(k), k, TOP_LEVEL_KEYS))
    name = doc.get("name", Path(file).stem)
    if not isinstance(name, str) or not NAME_RE.match(name):
        problems.append(Problem(file, "name", f"{name!r} must match {NAME_RE.pattern} (it names result folders)"))
    description = doc.get("description", "") or ""

    models = _check_models(doc.get("models"), file, problems)
    settings = _check_settings(doc.get("settings") or {}, file, problems)
    axes, include, exclude = _check_matrix(doc.get("matrix"), file, list(ZOO) + list(models), problems)
    tune = parse_tune(doc.get("tune"), file, problems)
    if tune is not None and tune.global_batch is not None:
        _check_one_grad_accum(
            tune.global_batch, settings=settings, axes=axes, include=include, file=file, problems=problems
        )

    cells: list[dict[str, Any]] = []
    if not problems:
        cells = _expand_cells(axes, include, exclude, settings=settings, models=models, file=file, problems=problems)
    if problems:
        raise InputError(problems)
    sc = Scenario(
        name=name,
        path=file,
        models=models,
        cells=tuple(cells),
        settings=settings,
        description=str(description),
        tune=tune,
        model_sources=model_sources(doc.get("models"), models, file=file),
    )
    if tune is not None and tune.global_batch is not None:
        # NOTE: gpus_per_node does not change the data-parallel degree, so 1 stands for every profile
        kept, left_out = sc.expand_all(gpus_per_node=1)
        if kept:
            return sc
        why = left_out[0][1]
        raise InputError([Problem(file, "tune.global_batch", f"leaves no cell: {why} (and every other cell alike)")])
    return sc


def _check_settings(raw: Any, file: str, problems: list[Problem]) -> dict[str, Any]:
    """The scenario-level `settings:` overrides that are valid (each bad one is a problem)."""
    settings: dict[str, Any] = {}
    if not isinstance(raw, dict):
        problems.append(Problem(file, "settings", "must be a mapping of setting name to value"))
        return settings
    for k, v in raw.items():
        if k not in SETTING_FIELDS:
            problems.append(unknown(file, f"settings.{k}", k, SETTING_FIELDS, what="setting"))
            continue
        before = len(problems)
        _check_setting(k, v, f"settings.{k}", file, problems)
        if len(problems) == before:
            settings[k] = v
    return settings


def _check_matrix(
    matrix: Any, file: str, model_names: list[str], problems: list[Problem]
) -> tuple[dict[str, list[Any]], list[dict[str, Any]], list[dict[str, Any]]]:
    """(axes, include, exclude) of the `matrix:` section, each entry valid (each bad one is a problem)."""
    axes: dict[str, list[Any]] = {}
    include: list[dict[str, Any]] = []
    exclude: list[dict[str, Any]] = []
    allowed_axes = list(CORE_AXES) + list(SETTING_FIELDS)
    if not isinstance(matrix, dict):
        problems.append(
            Problem(
                file,
                "matrix",
                "missing; a mapping of axes (model, strategy, precision, gpus, "
                "any setting) to lists, with optional include/exclude",
            )
        )
        matrix = {}
    for axis, values in matrix.items():
        if axis in ("include", "exclude"):
            continue
        where = f"matrix.{axis}"
        if axis not in allowed_axes:
            problems.append(unknown(file, where, axis, allowed_axes, what="axis"))
            continue
        if not isinstance(values, list) or not values:
            problems.append(Problem(file, where, f"must be a non-empty list, got {values!r}"))
            continue
        before = len(problems)
        for i, v in enumerate(values):
            _check_axis_value(axis, v, f"{where}[{i}]", file, model_names, problems)
        if len(problems) == before:
            axes[axis] = values

    for kind, target in (("include", include), ("exclude", exclude)):
        entries = matrix.get(kind) or []
        if not isinstance(entries, list):
            problems.append(Problem(file, f"matrix.{kind}", "must be a list of mappings"))
            continue
        for i, entry in enumerate(entries):
            where = f"matrix.{kind}[{i}]"
            if not isinstance(entry, dict) or not entry:
                problems.append(Problem(file, where, f"must be a non-empty mapping of axis to value, got {entry!r}"))
                continue
            before = len(problems)
            for k, v in entry.items():
                if k not in allowed_axes:
                    problems.append(unknown(file, f"{where}.{k}", k, allowed_axes, what="axis"))
                else:
                    _check_axis_value(k, v, f"{where}.{k}", file, model_names, problems)
            if len(problems) == before:
                target.append(entry)
    return axes, include, exclude


def _check_one_grad_accum(
    global_batch: int,
    *,
    settings: dict[str, Any],
    axes: dict[str, list[Any]],
    include: list[dict[str, Any]],
    file: str,
    problems: list[Problem],
) -> None:
    """`tune.global_batch` derives every cell's grad_accum: a grad_accum written anywhere else is a problem."""
    # NOTE: one source for grad_accum: a value written beside the global batch would be silently overridden
    written = ["settings.grad_accum"] if "grad_accum" in settings else []
    written += ["matrix.grad_accum"] if "grad_accum" in axes else []
    written += [f"matrix.include[{i}].grad_accum" for i, e in enumerate(include) if "grad_accum" in e]
    for where in written:
        problems.append(Problem(file, where, f"tune.global_batch ({global_batch}) derives grad_accum; remove this key"))


def _expand_cells(
    axes: dict[str, list[Any]],
    include: list[dict[str, Any]],
    exclude: list[dict[str, Any]],
    *,
    settings: dict[str, Any],
    models: dict[str, ModelConfig],
    file: str,
    problems: list[Problem],
) -> list[dict[str, Any]]:
    """The matrix's cells (`expand_matrix`), each with every core axis and a layout that can be built (else
    problems)."""
    cells = expand_matrix(axes, include, exclude)
    inc_index = {id(e): i for i, e in enumerate(include)}
    for cell in cells:
        missing = [a for a in CORE_AXES if a not in cell]
        if missing:
            src = next((f"matrix.include[{inc_index[id(e)]}]" for e in include if _matches(cell, e)), "matrix")
            problems.append(
                Problem(
                    file,
                    src,
                    f"cell {cell} has no {', '.join(missing)} (give the axis in the matrix or in the include entry)",
                )
            )
    if not cells and not problems:
        problems.append(Problem(file, "matrix", "expands to no cells (everything excluded?)"))
    if not problems:
        _check_layouts(
            cells, settings=settings, axes=axes, include=include, models=models, file=file, problems=problems
        )
    return cells


def _source(key: str, cell: dict[str, Any], *, settings: dict, axes: dict, include: list[dict]) -> str:
    """Where a cell's value of `key` was written: the last include entry that set it, its matrix axis, or
    `settings`; the key alone for a default."""
    for i in reversed(range(len(include))):
        if key in include[i] and _matches(cell, include[i]):
            return f"matrix.include[{i}].{key}"
    if key in axes and key in cell and cell[key] in axes[key]:
        return f"matrix.{key}[{axes[key].index(cell[key])}]"
    return f"settings.{key}"  # set there, or left at its default


def _check_layouts(
    cells: list[dict[str, Any]],
    *,
    settings: dict[str, Any],
    axes: dict[str, list[Any]],
    include: list[dict[str, Any]],
    models: dict[str, ModelConfig],
    file: str,
    problems: list[Problem],
) -> None:
    """Every cell's tensor/pipeline layout can be built (harness.core.layout.layout_problems); each problem once,
    at the key that set the offending value."""
    seen: set[tuple[str, str]] = set()
    for cell in cells:
        merged = {**SETTING_DEFAULTS, **settings, **{k: v for k, v in cell.items() if k in SETTING_FIELDS}}
        if merged["tp"] == 1 and merged["pp"] == 1:
            continue
        cfg = models.get(cell["model"]) or ZOO[cell["model"]]
        found = layout_problems(
            gpus=int(cell["gpus"]),
            tp=merged["tp"],
            pp=merged["pp"],
            cfg=cfg,
            schedule=merged["pp_schedule"],
            microbatches=merged["microbatches"],
            micro_batch=merged["micro_batch"],
            grad_accum=merged["grad_accum"],
            seq_len=merged["seq_len"],
            sequence_parallel=merged["sequence_parallel"],
        )
        what = f"cell {cell['model']} {cell['strategy']} {cell['precision']} gpus {cell['gpus']}"
        for key, message in found:
            where = _source(key, cell, settings=settings, axes=axes, include=include)
            if (where, message) not in seen:
                seen.add((where, message))
                problems.append(Problem(file, where, f"{message} ({what})"))


def load_scenario(path: str | Path) -> Scenario:
    """Load, validate and expand a scenario file (raises InputError listing every problem)."""
    return parse_scenario(load_yaml(path), str(path))
