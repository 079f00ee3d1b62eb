"""Scenario files → validated Scenario → expanded, hashed RunSpecs (one per matrix cell).

Pure: no torch import, deterministic. Every problem in a file is collected and raised once as an
`InputError` whose lines read `file: dotted.key: message`.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from harness.core.errors import InputError, Problem, one_of, unknown
from harness.core.families import dimension_problems, family_of, model_keys, shapes_of
from harness.core.layout import MESH_DIMS, layout_problems
from harness.core.zoo import ZOO, ModelConfig
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
_MERGE_TAG = "tag:yaml.org,2002:merge"


def _key_of(loader: yaml.SafeLoader, node: yaml.Node) -> Any:
    """A mapping key as the loaded document would hold it (`1` and `1.0` are one key, as in a dict); a key that is
    no scalar (a sequence or mapping as a key) as its node, compared by identity."""
    return loader.construct_object(node) if isinstance(node, yaml.ScalarNode) else node


def _where(mark: yaml.Mark, *, column: bool) -> str:
    return f"{mark.line + 1}:{mark.column + 1}" if column else str(mark.line + 1)


def _duplicate_keys(loader: yaml.SafeLoader, root: yaml.Node | None, file: str) -> list[Problem]:
    """Every key given twice in one mapping, anywhere in the document: YAML's loaders keep only the last silently
    (two top-level `matrix:` blocks: the first is dropped). Each at its key path, with the lines of every
    occurrence (line:column where two share a line, as in a flow mapping)."""
    problems: list[Problem] = []
    seen_nodes: set[int] = set()  # NOTE: an alias repeats its anchor's node; each node once (no billion laughs)
    stack: list[tuple[yaml.Node, str]] = [(root, "")] if root is not None else []
    while stack:
        node, path = stack.pop()
        if id(node) in seen_nodes:
            continue
        seen_nodes.add(id(node))
        if isinstance(node, yaml.SequenceNode):
            stack += [(item, f"{path}[{i}]") for i, item in reversed(list(enumerate(node.value)))]
        elif isinstance(node, yaml.MappingNode):
            marks: dict[Any, list[yaml.Mark]] = {}
            children = []
            for key_node, value_node in node.value:
                if key_node.tag == _MERGE_TAG:  # NOTE: `<<: *base`: keys given beside a merge override it by design
                    children.append((value_node, path))
                    continue
                key = _key_of(loader, key_node)
                marks.setdefault(key, []).append(key_node.start_mark)
                children.append((value_node, f"{path}.{key}" if path else str(key)))
            for key, at in marks.items():
                if len(at) > 1:
                    column = len({m.line for m in at}) < len(at)
                    lines = [_where(m, column=column) for m in at]
                    unit = "line:column" if column else "lines"
                    where = f"{path}.{key}" if path else str(key)
                    problems.append(
                        Problem(
                            file,
                            where,
                            f"given {len(at)} times, at {unit} {', '.join(lines[:-1])} and {lines[-1]}: YAML would "
                            "keep only the last, silently; give it once",
                        )
                    )
            stack += reversed(children)
    return problems


def load_yaml(path: str | Path) -> Any:
    """Parse a YAML file with safe loading (every YAML file the harness reads: scenarios, cluster profiles); syntax
    errors become an InputError naming the line, and a key given twice in one mapping is an InputError naming every
    line it is on (a plain YAML loader keeps the last one silently)."""
    p = Path(path)
    try:
        text = p.read_text()
    except OSError as e:
        raise InputError([Problem(str(path), "", f"cannot read file: {e.strerror or e}")]) from None
    loader = _NoObjectsLoader(text)
    try:
        root = loader.get_single_node()
        duplicates = _duplicate_keys(loader, root, str(path))
        if duplicates:
            raise InputError(duplicates)
        return loader.construct_document(root) if root is not None else None
    except yaml.YAMLError as e:
        raise InputError([Problem(str(path), "", f"invalid YAML: {e}")]) from None
    finally:
        loader.dispose()


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
        found = dimension_problems(dims)
        family = family_of(dims)
        known = sorted({*(model_keys(family) if family is not None else ()), HF_CONFIG_KEY})
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
    # NOTE: every model the file declares, refused or not: a refused one has its own problem, and a second one
    # ("'m' is not one of …") would blame the matrix for it
    raw_models = doc.get("models")
    declared = [n for n in raw_models if isinstance(n, str)] if isinstance(raw_models, dict) else []
    axes, include, exclude = _check_matrix(doc.get("matrix"), file, list(dict.fromkeys([*ZOO, *declared])), problems)
    tune = parse_tune(doc.get("tune"), file, problems)
    if tune is not None and tune.global_batch is not None:
        _check_one_grad_accum(
            tune.global_batch, settings=settings, axes=axes, include=include, file=file, problems=problems
        )
        # NOTE: a grad_accum written anywhere beside the global batch is refused there already
        _check_axis_or_setting({k: v for k, v in settings.items() if k != "grad_accum"}, axes, file, problems)
    else:
        _check_axis_or_setting(settings, axes, file, problems)

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
) -> list[dict[str, Any]]:
    """The matrix's cells (`expand_matrix`), each with every core axis and a layout that can be built (else
    problems)."""
    cells = expand_matrix(axes, include, exclude)
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
        degrees = {d.name: merged[d.name] for d in MESH_DIMS}
        if all(n == 1 for n in degrees.values()):
            continue
        cfg = models.get(cell["model"]) or ZOO[cell["model"]]
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
