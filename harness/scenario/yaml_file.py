"""YAML as every file the harness reads takes it: safe loading (no tags), a key given twice refused with every line it
is on, and a syntax error as one `InputError` naming its line. Scenario files and cluster profiles are read through
`load_yaml`; a `--set KEY=VALUE`'s VALUE through `yaml_value`.

Pure: no torch import.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from harness.core.errors import InputError, Problem


class _PlainDataLoader(yaml.SafeLoader):
    """Safe loading, and a clear error (not a traceback) for tags like !!python/object."""


def _refuse_tag(loader: yaml.SafeLoader, suffix: str, node: yaml.Node) -> Any:
    raise yaml.constructor.ConstructorError(
        None, None, f"tag {node.tag!r} is not allowed (scenario files are plain data)", node.start_mark
    )


_PlainDataLoader.add_multi_constructor("!", _refuse_tag)
_PlainDataLoader.add_multi_constructor("tag:yaml.org,2002:python/", _refuse_tag)
_MERGE_TAG = "tag:yaml.org,2002:merge"


def _key_of(loader: yaml.SafeLoader, node: yaml.Node) -> Any:
    """A mapping key as the loaded document would hold it (`1` and `1.0` are one key, as in a dict); a key that is
    no scalar (a sequence or mapping as a key) as its node, compared by identity."""
    return loader.construct_object(node) if isinstance(node, yaml.ScalarNode) else node


def _where(mark: yaml.Mark, *, column: bool) -> str:
    return f"{mark.line + 1}:{mark.column + 1}" if column else str(mark.line + 1)


def duplicate_keys(loader: yaml.SafeLoader, root: yaml.Node | None, file: str) -> list[Problem]:
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
    loader = _PlainDataLoader(text)
    try:
        root = loader.get_single_node()
        duplicates = duplicate_keys(loader, root, str(path))
        if duplicates:
            raise InputError(duplicates)
        return loader.construct_document(root) if root is not None else None
    except yaml.YAMLError as e:
        raise InputError([Problem(str(path), "", f"invalid YAML: {e}")]) from None
    finally:
        loader.dispose()


def yaml_value(raw: str, *, where: str, file: str, problems: list[Problem]) -> tuple[Any, bool]:
    """VALUE of `--set KEY=VALUE` as YAML, safely (no tags, a key given twice refused, as in a file); (value, ok)."""
    loader = _PlainDataLoader(raw)
    try:
        root = loader.get_single_node()
        duplicates = duplicate_keys(loader, root, file)
        if duplicates:
            problems.extend(Problem(file, f"{where}.{p.path}", p.message) for p in duplicates)
            return None, False
        return (loader.construct_document(root) if root is not None else None), True
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        at = f" at column {mark.column + 1}" if isinstance(mark, yaml.Mark) else ""
        why = getattr(e, "problem", None) or " ".join(str(e).split())
        problems.append(Problem(file, where, f"{raw!r} is not a YAML value: {why}{at}"))
        return None, False
    finally:
        loader.dispose()
