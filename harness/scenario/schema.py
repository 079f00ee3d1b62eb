"""Scenario files → validated Scenario → expanded, hashed RunSpecs (one per matrix cell).

Pure: no torch import, deterministic. Every problem in a file is collected and raised once as an
`InputError` whose lines read `file: dotted.key: message`.

`--set KEY=VALUE` (`harness plan`, `sweep`, `tune`, `run`) changes the parsed document before it is validated
(`parse_scenario(doc, file, overrides=...)`, rules in `apply_overrides`), so a bad value gets the file's own
message, its key path `--set KEY` (`s.yaml: --set micro_batch: 'two' is not an integer`).
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness.core.catalogue import CATALOGUE, FAMILY_SETTINGS
from harness.core.errors import InputError, Problem, one_of, unknown
from harness.core.families import dimension_problems, family_of, model_keys, shapes_of
from harness.core.layout import MESH_DIMS, layout_problems
from harness.core.zoo import ZOO, ModelConfig
from harness.scenario import deepspeed_config
from harness.scenario.factory_model import FACTORY_KEY, factory_model_entry
from harness.scenario.hf_config import HF_CONFIG_KEY, hf_model_entry, model_sources
from harness.scenario.spec import (
    PRECISIONS,
    SETTING_DEFAULTS,
    SETTING_FIELDS,
    STRATEGIES,
    TYPE_NAMES,
    RunSpec,
    Settings,
    canonical_setting,
    value_is,
)
from harness.scenario.tune import TuneSpec, derived_grad_accum, parse_tune
from harness.scenario.yaml_file import load_yaml, yaml_value

FAULTS: tuple[str, ...] = ("oom", "hang", "crash", "nan", "exception", "slow", "checkpoint_truncate")
INJECT_KEYS: tuple[str, ...] = ("fault", "rank", "step", "factor")
SLOW_FACTOR_MAX = 100.0
"""the largest `slow` factor accepted (a step 100 times its own duration)"""
MAX_GPUS = 1 << 20
"""the largest GPU count a cell may have (1,048,576): a scenario's `gpus` and `harness plan --project`'s counts
(harness.plan.projection) alike; nothing is measured near it, and the planner prices it in bounded memory"""
CORE_AXES: tuple[str, ...] = ("model", "strategy", "precision", "gpus")
TOP_LEVEL_KEYS: tuple[str, ...] = ("name", "description", "models", "matrix", "settings", "tune")
NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")


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
    overrides: tuple[str, ...] = ()
    """the `--set KEY=VALUE` texts applied to the file, as given (`apply_overrides`): a sweep's manifest records
    them, so that `harness history check --confirm` re-runs the same cells"""

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
                model_config=padded_vocab(self.model_config(cell["model"]), merged),
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
        if not value_is(v, int) or v < minimum:
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
    if name == deepspeed_config.SETTING:
        _check_deepspeed_config(value, where, file, problems)
        return
    f = SETTING_FIELDS[name]
    value = canonical_setting(name, value)
    typ = {"int": int, "float": float, "bool": bool, "str": str}[f.type] if isinstance(f.type, str) else f.type
    choices, minimum = f.metadata["choices"], f.metadata["minimum"]
    if not value_is(value, typ):
        problems.append(
            Problem(file, where, one_of(value, choices) if choices else f"{value!r} is not {TYPE_NAMES[typ]}")
        )
        return
    if choices and value not in choices:
        problems.append(Problem(file, where, one_of(value, choices)))
    if minimum is not None and value < minimum:
        problems.append(Problem(file, where, f"{value!r} is below the minimum {minimum!r}"))


def _check_deepspeed_config(value: Any, where: str, file: str, problems: list[Problem]) -> None:
    """A `deepspeed_config` value: null, a path (read by `_read_deepspeed_configs`, which says what is wrong with the
    file) or a mapping whose content the harness can merge."""
    if value is None or isinstance(value, str):
        return
    if not isinstance(value, dict):
        problems.append(Problem(file, where, f"{value!r} must be null, a JSON file's path or a mapping"))
        return
    for message in deepspeed_config.content_problems(value, named="the mapping"):
        problems.append(Problem(file, where, message))


def _read_deepspeed_configs(
    doc: dict, every_cell: dict[str, Any], file: str, problems: list[Problem]
) -> tuple[dict, dict[str, Any]]:
    """The document (and the `--set` values) with every `deepspeed_config` path replaced by the JSON object it names,
    read once per path, relative to the scenario file: the cells carry the content, so their run_id follows it. A
    file that cannot be used is one problem at the key that names it (and the path stays: validation stops there)."""
    key = deepspeed_config.SETTING
    read: dict[str, Any] = {}

    def resolve(value: Any, where: str) -> Any:
        if not isinstance(value, str):
            return value
        if value not in read:
            found: list[Problem] = []
            content = deepspeed_config.read_deepspeed_config(value, scenario_file=file, where=where, problems=found)
            if content is not None:
                named = f"{value!r}"
                found += [Problem(file, where, m) for m in deepspeed_config.content_problems(content, named=named)]
            problems.extend(found)
            read[value] = value if found else content
        return read[value]

    doc = {**doc}
    settings = doc.get("settings")
    if isinstance(settings, dict) and key in settings:
        doc["settings"] = {**settings, key: resolve(settings[key], f"settings.{key}")}
    matrix = doc.get("matrix")
    if isinstance(matrix, dict):
        matrix = {**matrix}
        if isinstance(matrix.get(key), list):
            matrix[key] = [resolve(v, f"matrix.{key}[{i}]") for i, v in enumerate(matrix[key])]
        for kind in ("include", "exclude"):
            entries = matrix.get(kind)
            if isinstance(entries, list):
                matrix[kind] = [
                    {**e, key: resolve(e[key], f"matrix.{kind}[{i}].{key}")} if isinstance(e, dict) and key in e else e
                    for i, e in enumerate(entries)
                ]
        doc["matrix"] = matrix
    if key in every_cell:
        every_cell = {**every_cell, key: resolve(every_cell[key], f"--set {key}")}
    return doc, every_cell


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
        if FACTORY_KEY in dims:
            built = factory_model_entry(dims, file=file, where=where, problems=problems)
            if built is not None:
                models[name] = built
            continue
        found = dimension_problems(dims)
        family = family_of(dims)
        known = sorted({*(model_keys(family) if family is not None else ()), HF_CONFIG_KEY, FACTORY_KEY})
        for k, why in found:
            if why:
                problems.append(Problem(file, f"{where}.{k}", why))
            else:
                problems.append(unknown(file, f"{where}.{k}", k, known))
        if not found:
            cfg = shapes_of(dims)
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
        if not value_is(value, int) or value < 1:
            problems.append(Problem(file, where, f"{value!r} is not a positive integer"))
        elif value > MAX_GPUS:
            limit = f"is above the limit of {MAX_GPUS} GPUs; allowed: an integer 1..{MAX_GPUS}"
            problems.append(Problem(file, where, f"{value} {limit}"))
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


def parse_scenario(doc: Any, file: str, *, overrides: Sequence[str] = ()) -> Scenario:
    """Validate a parsed scenario document and expand its matrix. Raises InputError with every problem.
    `overrides`: `--set KEY=VALUE` texts, applied to the document first (`apply_overrides`)."""
    problems: list[Problem] = []
    if not isinstance(doc, dict):
        raise InputError(
            [Problem(file, "", "a scenario file must be a mapping with keys: " + ", ".join(TOP_LEVEL_KEYS))]
        )
    every_cell: dict[str, Any] = {}
    if overrides:
        doc, every_cell, moved = apply_overrides(doc, overrides, file=file, problems=problems)
        try:
            sc = _parse_document(doc, file, every_cell=every_cell, problems=problems)
        except InputError as e:
            raise InputError(_said_by_set(e.problems, moved)) from None
        return dataclasses.replace(sc, overrides=tuple(overrides))
    return _parse_document(doc, file, every_cell=every_cell, problems=problems)


def _parse_document(doc: dict, file: str, *, every_cell: dict[str, Any], problems: list[Problem]) -> Scenario:
    """`parse_scenario` of a document (overrides applied): `every_cell` the scalar `--set` values every cell takes,
    after the matrix is expanded; `problems` those found so far (the overrides')."""

    for k in doc:
        if k not in TOP_LEVEL_KEYS:
            problems.append(unknown(file, str(k), k, TOP_LEVEL_KEYS))
    doc, every_cell = _read_deepspeed_configs(doc, every_cell, file, problems)
    name = doc.get("name", Path(file).stem)
    if not isinstance(name, str) or not NAME_RE.match(name):
        problems.append(Problem(file, "name", f"{name!r} must match {NAME_RE.pattern} (it names result folders)"))
    description = doc.get("description", "") or ""

    models = _check_models(doc.get("models"), file, problems)
    settings = _check_settings(doc.get("settings") or {}, file, problems)
    # NOTE: every model the file declares, refused or not: a refused one has its own problem, and a second one
    # ("'m' is not one of …") would blame the matrix for it
    raw_models = doc.get("models")
    declared = [n for n in raw_models if isinstance(n, str)] if isinstance(raw_models, dict) else []
    axes, include, exclude = _check_matrix(doc.get("matrix"), file, list(dict.fromkeys([*ZOO, *declared])), problems)
    tune = parse_tune(doc.get("tune"), file, problems)
    if tune is not None and tune.global_batch is not None and "grad_accum" in every_cell:
        problems.append(
            Problem(
                file, "--set grad_accum", f"tune.global_batch ({tune.global_batch}) derives grad_accum; leave it out"
            )
        )
    if tune is not None and tune.global_batch is not None:
        _check_one_grad_accum(
            tune.global_batch, settings=settings, axes=axes, include=include, file=file, problems=problems
        )
        # NOTE: a grad_accum written anywhere beside the global batch is refused there already
        _check_axis_or_setting({k: v for k, v in settings.items() if k != "grad_accum"}, axes, file, problems)
    else:
        _check_axis_or_setting(settings, axes, file, problems)

    # NOTE: after the file's own checks (a setting both an axis and under `settings:`): `--set KEY=scalar` is neither
    settings = {**settings, **{k: v for k, v in every_cell.items() if k in SETTING_FIELDS}}
    cells: list[dict[str, Any]] = []
    if not problems:
        cells = _expand_cells(
            axes,
            include,
            exclude,
            settings=settings,
            models=models,
            file=file,
            problems=problems,
            every_cell=every_cell,
        )
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


def _check_axis_or_setting(
    settings: dict[str, Any], axes: dict[str, list[Any]], file: str, problems: list[Problem]
) -> None:
    """A setting given both as a matrix axis and under `settings` is a problem at both places: the axis would
    override the setting in every cell the axes make, silently (an include entry that names the key is a deliberate
    override of some cells, and stays allowed)."""
    # NOTE: refused rather than stated: a value that never applies is a mistake in the file, and a printed note
    # would scroll by; the user keeps whichever was meant
    for key in axes:
        if key in settings:
            problems.append(
                Problem(
                    file,
                    f"matrix.{key}",
                    f"also given as settings.{key} ({settings[key]!r}): the axis would override that setting in every "
                    f"cell of the matrix, silently; give {key} in one place (as the axis, or as the setting)",
                )
            )


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
    every_cell: Mapping[str, Any] | None = None,
) -> list[dict[str, Any]]:
    """The matrix's cells (`expand_matrix`, then the scalar `--set` values of `every_cell`: `with_overrides`), each
    with every core axis and a layout that can be built (else problems)."""
    cells = with_overrides(expand_matrix(axes, include, exclude), every_cell or {})
    for cell in cells:
        missing = [a for a in CORE_AXES if a not in cell]
        if missing:
            src = next((f"matrix.include[{i}]" for i, e in enumerate(include) if _matches(cell, e)), "matrix")
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
            cells,
            settings=settings,
            axes=axes,
            include=include,
            models=models,
            file=file,
            problems=problems,
            every_cell=every_cell or {},
        )
        _check_family_settings(
            cells, settings=settings, axes=axes, include=include, file=file, problems=problems,
            every_cell=every_cell or {},
        )  # fmt: skip
    return cells


def _check_family_settings(
    cells: list[dict[str, Any]],
    *,
    settings: dict[str, Any],
    axes: dict[str, list[Any]],
    include: list[dict[str, Any]],
    file: str,
    problems: list[Problem],
    every_cell: Mapping[str, Any],
) -> None:
    """A family's framework option (harness.core.catalogue.FAMILY_SETTINGS) set away from its default where no cell
    of the scenario is of a family that takes it: every such cell would be skipped, so the file is refused (exit 2),
    at the key that set it, with the reason. (A matrix that mixes families keeps its cells: those of the other
    families are skipped with the reason.)"""
    for name, fs in FAMILY_SETTINGS.items():
        set_in = [c for c in cells if c.get(name, settings.get(name, SETTING_DEFAULTS[name])) != SETTING_DEFAULTS[name]]
        if not set_in or any(CATALOGUE[c["strategy"]].family in fs.families for c in set_in):
            continue
        cell = set_in[0]
        where = _source(name, cell, settings=settings, axes=axes, include=include, every_cell=every_cell)
        problems.append(Problem(file, where, fs.refusal.format(strategy=cell["strategy"], setting=name)))


def _source(
    key: str,
    cell: dict[str, Any],
    *,
    settings: dict,
    axes: dict,
    include: list[dict],
    every_cell: Mapping[str, Any] | None = None,
) -> str:
    """Where a cell's value of `key` was written: `--set` (every cell's), the last include entry that set it, its
    matrix axis, or `settings`; the key alone for a default."""
    if key in (every_cell or {}):
        return f"--set {key}"
    for i in reversed(range(len(include))):
        if key in include[i] and _matches(cell, include[i]):
            return f"matrix.include[{i}].{key}"
    if key in axes and key in cell and cell[key] in axes[key]:
        return f"matrix.{key}[{axes[key].index(cell[key])}]"
    return f"settings.{key}"  # set there, or left at its default


def padded_vocab(cfg: ModelConfig, settings: Mapping[str, Any]) -> ModelConfig:
    """The cell's model with its vocabulary padded as its `pad_vocab_multiple` × tp asks (the harness's decoder
    only: another family's cell is refused with the reason, RunSpec.unsupported_reason)."""
    multiple = int(settings.get("pad_vocab_multiple") or 0)
    if multiple <= 1 or cfg.family != "decoder":
        return cfg
    return cfg.padded(multiple * int(settings.get("tp") or 1))


def _check_layouts(
    cells: list[dict[str, Any]],
    *,
    settings: dict[str, Any],
    axes: dict[str, list[Any]],
    include: list[dict[str, Any]],
    models: dict[str, ModelConfig],
    file: str,
    problems: list[Problem],
    every_cell: Mapping[str, Any] | None = None,
) -> None:
    """Every cell's tensor/pipeline layout can be built (harness.core.layout.layout_problems); each problem once,
    at the key that set the offending value."""
    seen: set[tuple[str, str]] = set()
    for cell in cells:
        merged = {**SETTING_DEFAULTS, **settings, **{k: v for k, v in cell.items() if k in SETTING_FIELDS}}
        degrees = {d.name: merged[d.name] for d in MESH_DIMS}
        cfg = padded_vocab(models.get(cell["model"]) or ZOO[cell["model"]], merged)
        if all(n == 1 for n in degrees.values()) and cfg.positions != "learned":
            continue  # NOTE: a learned position table bounds seq_len whatever the layout
        found = layout_problems(
            gpus=int(cell["gpus"]),
            degrees=degrees,
            cfg=cfg,
            schedule=merged["pp_schedule"],
            microbatches=merged["microbatches"],
            micro_batch=merged["micro_batch"],
            grad_accum=merged["grad_accum"],
            seq_len=merged["seq_len"],
            sequence_parallel=merged["sequence_parallel"],
            virtual_stages=merged["pp_virtual_stages"],
        )
        what = f"cell {cell['model']} {cell['strategy']} {cell['precision']} gpus {cell['gpus']}"
        for key, message in found:
            where = _source(key, cell, settings=settings, axes=axes, include=include, every_cell=every_cell or {})
            if (where, message) not in seen:
                seen.add((where, message))
                problems.append(Problem(file, where, f"{message} ({what})"))


def load_scenario(path: str | Path, *, overrides: Sequence[str] = ()) -> Scenario:
    """Load, validate and expand a scenario file (raises InputError listing every problem); `overrides`: the
    `--set KEY=VALUE` texts to apply to it (`apply_overrides`)."""
    return parse_scenario(load_yaml(path), str(path), overrides=overrides)


# --------------------------------------------------------------------------------------------------
# `--set KEY=VALUE`: overrides of the file, from the command line

SET_KEYS: tuple[str, ...] = (*CORE_AXES, *SETTING_FIELDS)
"""what `--set` takes: a core axis or a setting (the keys a matrix takes)"""
MAPPING_SETTINGS: tuple[str, ...] = tuple(k for k, f in SETTING_FIELDS.items() if "dict" in str(f.type))
"""the settings whose value is a mapping (`inject`): `--set inject.fault=slow` sets one of its keys"""


def apply_overrides(
    doc: dict, overrides: Sequence[str], *, file: str, problems: list[Problem]
) -> tuple[dict, dict[str, Any], set[str]]:
    """The document with `--set` applied: (the document, the scalar values every cell takes, the keys a list made
    an axis of). Problems go to `problems`, each at `--set KEY`, in the file's own words.

    The rules, and why:

    - `KEY=VALUE`, VALUE read as YAML (`2`, `true`, `bf16`, `[8, 64]`, `{fault: slow, factor: 2}`); KEY a core
      axis (model, strategy, precision, gpus) or a setting, as a matrix takes them: anything else is the file's
      "unknown key … did you mean". Given twice, the last wins (as each later YAML key would).
    - A scalar (not a list) is every cell's value: the matrix expands as the file says (its include and exclude
      entries match the file's own values), then each cell takes KEY=VALUE, and cells that become the same are
      one. For a setting it is also `settings.KEY`. So `--set micro_batch=2` on a file whose matrix has a
      `micro_batch` axis runs every cell at 2 (the axis is replaced, not refused as a key given both as an axis
      and a setting would be): what the user asks for.
    - A list is the matrix axis KEY, replacing the file's axis, or its `settings.KEY` (the setting becomes an
      axis); include and exclude entries match on the new values, as they would had the file said so.
    - A dotted key sets one key of a mapping setting: `--set inject.fault=slow --set inject.factor=2` is
      `--set inject={fault: slow, factor: 2}` merged over the file's `settings.inject`; a scalar then. Over a
      `deepspeed_config` path, the file's content is what the key is set in.
    - No `=` is refused (`--set micro_batch` is no value), as is a VALUE that is not YAML.

    The file is not written: a sweep's manifest records the texts (`Scenario.overrides`)."""
    doc = {**doc}
    declared = doc.get("models")
    model_names = list(
        dict.fromkeys([*ZOO, *(n for n in declared if isinstance(n, str))] if isinstance(declared, dict) else ZOO)
    )
    raw_settings = doc.get("settings")
    file_settings = raw_settings if isinstance(raw_settings, dict) else {}
    values: dict[str, Any] = {}
    for text in overrides:
        key, sep, raw = text.partition("=")
        key = key.strip()
        if not sep:
            problems.append(
                Problem("--set", "", f"{text!r} is not KEY=VALUE (e.g. --set micro_batch=2, --set gpus=[8,64])")
            )
            continue
        where = f"--set {key}"
        head, dot, rest = key.partition(".")
        if head not in SET_KEYS:
            problems.append(unknown(file, where, head, SET_KEYS))
            continue
        value, ok = yaml_value(raw, where=where, file=file, problems=problems)
        if not ok:
            continue
        if dot:
            if head not in MAPPING_SETTINGS or not rest:
                mappings = ", ".join(MAPPING_SETTINGS)
                problems.append(
                    Problem(
                        file, where, f"a dotted key sets a key of a mapping setting ({mappings}); give {head}=VALUE"
                    )
                )
                continue
            base = values.get(head, file_settings.get(head))
            if head == deepspeed_config.SETTING and isinstance(base, str):  # NOTE: the file's keys, then the --set's
                base = deepspeed_config.read_deepspeed_config(base, scenario_file=file, where=where, problems=problems)
            value = _set_in(dict(base) if isinstance(base, dict) else {}, rest.split("."), value)
        values.pop(head, None)  # NOTE: the last one given wins, and stands where it was given last
        values[head] = value
    every_cell: dict[str, Any] = {}
    moved: set[str] = set()
    for key, value in values.items():
        before = len(problems)
        if isinstance(value, list):
            if not value:
                problems.append(Problem(file, f"--set {key}", f"must be a non-empty list, got {value!r}"))
            for i, v in enumerate(value):
                _check_axis_value(key, v, f"--set {key}[{i}]", file, model_names, problems)
            if len(problems) == before:
                matrix = doc.get("matrix")
                doc["matrix"] = {**(matrix if isinstance(matrix, dict) else {}), key: value}
                if key in file_settings:
                    doc["settings"] = {k: v for k, v in file_settings.items() if k != key}
                moved.add(key)
        else:
            _check_axis_value(key, value, f"--set {key}", file, model_names, problems)
            if len(problems) == before:
                every_cell[key] = value
    return doc, every_cell, moved


def with_overrides(cells: list[dict[str, Any]], every_cell: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The expanded cells with the scalar `--set` values: a core axis in every cell, a setting in the cells that name
    it (the others take it from `settings`, where it is too); cells that became the same are one, in file order."""
    if not every_cell:
        return cells
    out: dict[str, dict[str, Any]] = {}
    for cell in cells:
        new = {**cell, **{k: v for k, v in every_cell.items() if k in CORE_AXES or k in cell}}
        out.setdefault(repr(sorted(new.items(), key=lambda kv: kv[0])), new)
    return list(out.values())


def _set_in(mapping: dict, path: list[str], value: Any) -> dict:
    """`mapping` with `value` at the dotted `path` (mappings made on the way)."""
    if len(path) == 1:
        return {**mapping, path[0]: value}
    inner = mapping.get(path[0])
    return {**mapping, path[0]: _set_in(dict(inner) if isinstance(inner, dict) else {}, path[1:], value)}


def _said_by_set(problems: list[Problem], moved: set[str]) -> list[Problem]:
    """The problems with the matrix axes a `--set KEY=[...]` made named as `--set KEY` (the file did not say them)."""
    out = []
    for p in problems:
        for key in moved:
            axis = f"matrix.{key}"
            if p.path == axis or p.path.startswith(f"{axis}["):
                p = Problem(p.file, f"--set {key}{p.path[len(axis) :]}", p.message)
                break
        out.append(p)
    return out
