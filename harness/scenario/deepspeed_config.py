"""A user's DeepSpeed config (`deepspeed_config:`) and the harness's own, for the DeepSpeed ZeRO cells.

The harness builds a config for every ZeRO cell (`harness_config`: batch sizes, stage, precision, offload, the
optimizer it passes itself). A scenario's `deepspeed_config` (a JSON file, relative to the scenario file, or a
mapping) is merged over it key by key (`merged_config`): every key the harness does not own is the user's. The keys
the harness owns (`OWNED_KEYS`) may be repeated with the harness's value; another value is refused before launch
(`conflicts`), with both values. The planner prices the keys of `PRICED_KEYS` with the cell's merged values
(`zero_value`); `unmodelled_keys` names the ones a user set that neither the planner prices nor are known to leave
memory and collectives alone, and the predictions say so.

The file is read once, at scenario load (`read_deepspeed_config`); the cell carries its content (so the run_id
follows the content, and the record's `spec` says what ran). Pure: no torch, no deepspeed import.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from harness.core import catalogue, precisions
from harness.core.constants import (
    DS_ALLGATHER_BUCKET_ELEMS,
    DS_MAX_LIVE_PARAMETERS,
    DS_MAX_REUSE_DISTANCE,
    DS_PARAM_PERSISTENCE_THRESHOLD,
    DS_PREFETCH_BUCKET_ELEMS,
    DS_REDUCE_BUCKET_ELEMS,
    DS_SUB_GROUP_SIZE,
)
from harness.core.errors import Problem

RunSpec = Any
"""a cell (harness.scenario.spec.RunSpec, which imports this module: named here only by its fields)"""

SETTING = "deepspeed_config"
ZERO_STAGES: dict[str, int] = {"zero1": 1, "zero2": 2, "zero3": 3}
"""strategy → its ZeRO stage (harness.worker.strategies.zero runs them)"""
DEEPSPEED_STRATEGIES: tuple[str, ...] = tuple(s.name for s in catalogue.CATALOGUE.values() if s.family == "zero")
"""the strategies DeepSpeed runs, and so the only ones a `deepspeed_config` applies to"""

ABSENT = object()
"""a key the harness's config leaves out"""


def _stage(spec: RunSpec) -> str:
    return f"the cell's strategy {spec.strategy}"


def _precision(spec: RunSpec) -> str:
    return f"the cell's precision {spec.precision}"


def _offload(spec: RunSpec) -> str:
    return f"the cell's offload {spec.settings.offload}"


OWNED_KEYS: tuple[tuple[str, Callable[[RunSpec], str]], ...] = (
    ("train_micro_batch_size_per_gpu", lambda spec: "the cell's micro_batch"),
    ("gradient_accumulation_steps", lambda spec: "the cell's grad_accum"),
    (
        "train_batch_size",
        lambda spec: (
            f"the cell's micro_batch x grad_accum x gpus "
            f"({spec.settings.micro_batch} x {spec.settings.grad_accum} x {spec.gpus})"
        ),
    ),
    ("zero_optimization.stage", _stage),
    ("zero_optimization.offload_optimizer.device", _offload),
    ("zero_optimization.offload_optimizer.nvme_path", lambda spec: "the cell's nvme_path setting"),
    ("zero_optimization.offload_param.device", _offload),
    ("zero_optimization.offload_param.nvme_path", lambda spec: "the cell's nvme_path setting"),
    ("bf16.enabled", _precision),
    ("fp16.enabled", _precision),
    ("fp16.loss_scale", _precision),
    ("fp16.initial_scale_power", _precision),
    ("optimizer", lambda spec: "the harness, which passes its own optimizer (torch AdamW; DeepSpeedCPUAdam offloaded)"),
    ("gradient_clipping", lambda spec: "the harness (no clipping: every family trains the same model)"),
    ("steps_per_print", lambda spec: "the harness (DeepSpeed's step logs off)"),
    ("zero_allow_untested_optimizer", lambda spec: "the harness (its torch AdamW)"),
    ("zero_force_ds_cpu_optimizer", lambda spec: "the harness (its torch AdamW)"),
)
"""the dotted keys the harness sets from the cell (or leaves out on purpose), each with who sets it: a user's value
must equal the harness's, or the cell is refused before launch"""

_OWNED_WHEN_ABSENT: dict[str, Any] = {
    "bf16.enabled": False,
    "fp16.enabled": False,
    "zero_optimization.offload_optimizer.device": "none",
    "zero_optimization.offload_param.device": "none",
}
"""what an owned key the harness leaves out means to DeepSpeed (a user may write it out)"""

PRICED_KEYS: dict[str, int] = {
    "zero_optimization.reduce_bucket_size": DS_REDUCE_BUCKET_ELEMS,
    "zero_optimization.allgather_bucket_size": DS_ALLGATHER_BUCKET_ELEMS,
    "zero_optimization.stage3_prefetch_bucket_size": DS_PREFETCH_BUCKET_ELEMS,
    "zero_optimization.stage3_max_live_parameters": DS_MAX_LIVE_PARAMETERS,
    "zero_optimization.stage3_max_reuse_distance": DS_MAX_REUSE_DISTANCE,
    "zero_optimization.stage3_param_persistence_threshold": DS_PARAM_PERSISTENCE_THRESHOLD,
    "zero_optimization.sub_group_size": DS_SUB_GROUP_SIZE,
}
"""the keys the planner reads from a cell's merged config (harness.plan.memory, zero3, comm), with DeepSpeed's
default (elements; harness.core.constants); allgather_bucket_size is read and changes nothing: ZeRO-1/2 gather the
updated buffer with one all_gather_into_tensor wherever torch has it (every torch the harness runs)"""

_DEFAULT_EQUAL: dict[str, Callable[[int], Any]] = {
    "zero_optimization.overlap_comm": lambda stage: stage == 3,
    "zero_optimization.contiguous_gradients": lambda stage: True,
    "zero_optimization.reduce_scatter": lambda stage: True,
}
"""keys the planner does not price but that may be written out at DeepSpeed's default (for the cell's stage)"""

NEUTRAL_KEYS: tuple[str, ...] = (
    "wall_clock_breakdown",
    "memory_breakdown",
    "flops_profiler",
    "comms_logger",
    "tensorboard",
    "csv_monitor",
    "wandb",
    "comet",
    "dump_state",
    "timers",
    "zero_optimization.offload_optimizer.pin_memory",
    "zero_optimization.offload_param.pin_memory",
)
"""keys (and the keys under them) that change neither memory nor collectives: logging, profiling, pinning"""


def is_deepspeed(strategy: str) -> bool:
    return strategy in DEEPSPEED_STRATEGIES


def runs_deepspeed(spec: RunSpec) -> bool:
    """Whether the cell runs DeepSpeed's engine: a ZeRO strategy without tensor or pipeline parallelism (zero1 under
    a layout runs the harness's distributed optimizer, harness.worker.strategies.distributed_optimizer)."""
    return is_deepspeed(spec.strategy) and spec.layout.is_default


# --------------------------------------------------------------------------------------------------
# reading the file


def config_path(raw: str, *, scenario_file: str) -> Path:
    """A `deepspeed_config` path as written: relative to the scenario file's folder (as `hf_config` paths are), or
    absolute."""
    path = Path(raw).expanduser()
    return path if path.is_absolute() else Path(scenario_file).parent / path


def read_deepspeed_config(raw: str, *, scenario_file: str, where: str, problems: list[Problem]) -> dict | None:
    """The JSON object the path `raw` names, or None with one problem (at the scenario's `where`, naming the path
    and what is wrong with the file)."""
    path = config_path(raw, scenario_file=scenario_file)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        problems.append(Problem(scenario_file, where, f"{raw!r}: no such file ({path})"))
        return None
    except (OSError, UnicodeDecodeError) as e:
        problems.append(Problem(scenario_file, where, f"{raw!r}: cannot be read ({path}: {e})"))
        return None
    try:
        value = json.loads(text)
    except json.JSONDecodeError as e:
        problems.append(
            Problem(scenario_file, where, f"{raw!r} is not JSON: {e.msg} at line {e.lineno} column {e.colno} ({path})")
        )
        return None
    if not isinstance(value, dict):
        problems.append(
            Problem(scenario_file, where, f"{raw!r} holds a JSON {_json_kind(value)}, not an object ({path})")
        )
        return None
    return value


def _json_kind(value: Any) -> str:
    return {list: "array", str: "string", bool: "boolean", type(None): "null"}.get(type(value), "number")


def content_problems(config: Mapping[str, Any], *, named: str) -> list[str]:
    """What is wrong with a config's content, whatever the cell (`named`: how a message names the config): a
    section the harness merges into that is not an object, a priced key that is not a whole number >= 0."""
    out = []
    for key in ("zero_optimization", "bf16", "fp16"):
        v = config.get(key, {})
        if not isinstance(v, Mapping):
            out.append(f"{named}: {key} is {v!r}, not an object")
    zero = config.get("zero_optimization", {})
    if isinstance(zero, Mapping):
        for key in ("offload_optimizer", "offload_param"):
            v = zero.get(key, {})
            if not isinstance(v, Mapping):
                out.append(f"{named}: zero_optimization.{key} is {v!r}, not an object")
    for path in PRICED_KEYS:
        v = get_path(config, path)
        if v is not ABSENT and not _whole(v):
            out.append(f"{named}: {path} is {v!r}, not a whole number >= 0 (elements)")
    return out


def _whole(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and v >= 0 and float(v).is_integer()


# --------------------------------------------------------------------------------------------------
# the harness's config, the merge, the conflicts


def harness_config(spec: RunSpec, *, nvme_path: str | None = None) -> dict[str, Any]:
    """The config the harness builds for a ZeRO cell (before the user's is merged over it). `nvme_path`: where an
    `offload: nvme` cell swaps (the worker's run folder when the setting leaves it empty)."""
    s = spec.settings
    zero: dict[str, Any] = {"stage": ZERO_STAGES[spec.strategy]}
    if s.offload in ("optimizer", "optimizer+params"):
        zero["offload_optimizer"] = {"device": "cpu", "pin_memory": True}
    if s.offload == "optimizer+params":
        zero["offload_param"] = {"device": "cpu", "pin_memory": True}
    if s.offload == "nvme":
        where = nvme_path or s.nvme_path
        zero["offload_optimizer"] = {"device": "nvme", "nvme_path": where, "pin_memory": True}
        zero["offload_param"] = {"device": "nvme", "nvme_path": where, "pin_memory": True}
    cfg: dict[str, Any] = {
        "train_micro_batch_size_per_gpu": s.micro_batch,
        "gradient_accumulation_steps": s.grad_accum,
        "train_batch_size": s.micro_batch * s.grad_accum * spec.gpus,
        "zero_optimization": zero,
        "gradient_clipping": 0.0,
        "steps_per_print": 2**31 - 1,
        "wall_clock_breakdown": False,
        "zero_allow_untested_optimizer": True,
        "zero_force_ds_cpu_optimizer": False,
    }
    dtype = precisions.get(spec.precision).dtype
    if dtype == "bfloat16":
        cfg["bf16"] = {"enabled": True}
    elif dtype == "float16":
        cfg["fp16"] = {"enabled": True, "loss_scale": 0, "initial_scale_power": 16}
    return cfg


def merged_config(spec: RunSpec, *, nvme_path: str | None = None) -> dict[str, Any]:
    """The config a ZeRO cell runs with: the user's `deepspeed_config` merged over `harness_config` (a nested
    mapping merges key by key, anything else replaces). Plain dicts and lists, the user's keys after the harness's."""
    return merge(harness_config(spec, nvme_path=nvme_path), spec.settings.deepspeed_config or {})


def merge(base: Mapping[str, Any], over: Mapping[str, Any]) -> dict[str, Any]:
    """`over` merged over `base`, recursively for mappings on both sides (new dicts; neither is changed)."""
    out = {k: _plain(v) for k, v in base.items()}
    for k, v in over.items():
        if isinstance(v, Mapping) and isinstance(out.get(k), Mapping):
            out[k] = merge(out[k], v)
        else:
            out[k] = _plain(v)
    return out


def _plain(v: Any) -> Any:
    """A value as JSON holds it: mappings as dicts, sequences as lists (the frozen setting's tuples included)."""
    if isinstance(v, Mapping):
        return {k: _plain(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_plain(x) for x in v]
    return v


def get_path(config: Mapping[str, Any], dotted: str) -> Any:
    """The value at a dotted key, or ABSENT."""
    node: Any = config
    for part in dotted.split("."):
        if not isinstance(node, Mapping) or part not in node:
            return ABSENT
        node = node[part]
    return node


def conflicts(spec: RunSpec) -> list[str]:
    """Every owned key the cell's `deepspeed_config` sets to another value than the harness's, as a sentence with
    both values (`deepspeed_config sets zero_optimization.stage to 2 but the cell's strategy zero3 sets 3`); [] when
    none (or no config)."""
    user = spec.settings.deepspeed_config
    if not user:
        return []
    ours = harness_config(spec)
    out = []
    for key, who in OWNED_KEYS:
        theirs = get_path(user, key)
        if theirs is ABSENT:
            continue
        mine = get_path(ours, key)
        if mine is ABSENT:
            mine = _OWNED_WHEN_ABSENT.get(key, ABSENT)
        if mine is ABSENT:
            out.append(f"{SETTING} sets {key} to {_shown(theirs)} but {who(spec)} leaves it unset")
        elif not _same(theirs, mine):
            out.append(f"{SETTING} sets {key} to {_shown(theirs)} but {who(spec)} sets {_shown(mine)}")
    return out


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, bool) or isinstance(b, bool):
        return a is b
    return bool(a == b)


def _shown(v: Any) -> str:
    return json.dumps(_plain(v), sort_keys=True)


def refusal(spec: RunSpec) -> str | None:
    """Why the cell's `deepspeed_config` keeps it from running (a strategy DeepSpeed does not run, an owned key set
    to another value than the harness's, a bad content), or None."""
    user = spec.settings.deepspeed_config
    if user is None:
        return None
    if not is_deepspeed(spec.strategy):
        return (
            f"{SETTING} is DeepSpeed's config: {spec.strategy} does not run DeepSpeed (give it to "
            f"{', '.join(DEEPSPEED_STRATEGIES)} cells only)"
        )
    if not runs_deepspeed(spec):
        return (
            f"{SETTING} is DeepSpeed's config: {spec.strategy} under tensor or pipeline parallelism runs the "
            "harness's distributed optimizer, not DeepSpeed"
        )
    found = content_problems(user, named=SETTING) + conflicts(spec)
    return "; ".join(found) if found else None


# --------------------------------------------------------------------------------------------------
# what the planner reads


def zero_value(spec: RunSpec, key: str) -> int:
    """The cell's value of a priced key (`PRICED_KEYS`, dotted): the user's, else DeepSpeed's default (elements)."""
    v = get_path(spec.settings.deepspeed_config or {}, key)
    return PRICED_KEYS[key] if v is ABSENT else int(v)


def unmodelled_keys(spec: RunSpec) -> tuple[str, ...]:
    """The dotted keys of the cell's `deepspeed_config` the planner neither prices nor knows to change nothing
    (owned keys, priced keys, neutral keys and keys written at DeepSpeed's default are left out)."""
    user = spec.settings.deepspeed_config
    if not user or not is_deepspeed(spec.strategy):
        return ()
    stage = ZERO_STAGES[spec.strategy]
    owned = {k for k, _ in OWNED_KEYS}
    out = []
    for key, value in _leaves(user):
        if key in owned or key in PRICED_KEYS or any(key == n or key.startswith(n + ".") for n in NEUTRAL_KEYS):
            continue
        if key in _DEFAULT_EQUAL and _same(value, _DEFAULT_EQUAL[key](stage)):
            continue
        if any(key.startswith(o + ".") for o in owned):  # inside an owned value (optimizer.params…): refused anyway
            continue
        out.append(key)
    return tuple(out)


def _leaves(config: Mapping[str, Any], prefix: str = "") -> list[tuple[str, Any]]:
    out: list[tuple[str, Any]] = []
    for k, v in config.items():
        key = f"{prefix}{k}"
        if isinstance(v, Mapping) and v and key not in {o for o, _ in OWNED_KEYS}:
            out += _leaves(v, key + ".")
        else:
            out.append((key, v))
    return out
