"""MkDocs hook: the reference pages that are generated from the code, at every build (`make docs`).

- one page per command of `harness.cli.COMMANDS` (`reference/commands/<name>.md`, a `::: mkdocs-click` block that
  mkdocs-click renders from the click definition), added to the files and to the nav under the page that holds the
  marker below, so a new command gets its page without editing the docs;
- markers a hand-written page puts on a line of its own, replaced by a generated table:
  `<!-- generated: commands -->`  every command, its line in `harness --help`, a link to its page;
  `<!-- generated: settings -->`  every field of `harness.scenario.spec.Settings`: default, limits, meaning;
  `<!-- generated: record -->`    every field of the record (`harness.results.record.Record`, the models inside it,
  the cell's keys: `harness.results.spec.CORE_KEYS`, `harness.scenario.spec.SETTING_FIELDS`, `ModelConfig`), each
  with its type, whether every record holds it, and its docstring.

tests/unit/test_record_schema.py renders the record page through `expand_markers` and holds its table to the
models; tests/unit/test_docs_site.py builds the site and opens a page per command in Chromium.
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import inspect
import posixpath
import re
import textwrap
import types
from typing import Any, Literal, NamedTuple, Union, get_args, get_origin

COMMANDS_DIR = "reference/commands"
"""where the generated command pages live in the site"""
NAV_ANCHOR = "reference/cli.md"
"""the nav entry whose section receives the generated command pages, right after it"""
MARKER = re.compile(r"^<!-- generated: ([a-z-]+) -->$", re.M)

SEE_ALSO: dict[str, list[tuple[str, str]]] = {
    "sweep": [("Scenario files", "../scenario.md"), ("Run on SLURM", "../../how-to/slurm.md")],
    "run": [("Fault injection", "../../how-to/fault-injection.md")],
    "list": [("Your model", "../../how-to/your-model.md")],
    "plan": [("The memory model", "../../planner.md"), ("The step-time model", "../../time-model.md")],
    "status": [("Run on SLURM", "../../how-to/slurm.md")],
    "report": [("The report", "../../report.md")],
    "compare": [("harness compare", "../../nightly/compare.md"), ("Statistics", "../../explanation/statistics.md")],
    "calibrate": [("Your cluster's profile and logs", "../../how-to/cluster-profile.md")],
    "history": [("Results history", "../../nightly/history.md")],
    "tune": [("harness tune", "../../tune.md")],
}
"""hand-written pages a command's page links to (a command missing here gets none)"""


# ---------------------------------------------------------------------------------------------------------------
# the commands


def commands() -> dict[str, Any]:
    """harness.cli.COMMANDS, imported when asked (the hook module itself imports nothing of the harness)."""
    from harness.cli import COMMANDS

    return dict(COMMANDS)


def command_page(name: str) -> str:
    """The Markdown of one command's page: the click definition (options, arguments, subcommands) and links."""
    module, attr = commands()[name].target.split(":")
    lines = [
        "::: mkdocs-click",
        f"    :module: {module}",
        f"    :command: {attr}",
        f"    :prog_name: harness {name}",
        "    :style: plain",
        "    :list_subcommands: true",
        "",
    ]
    see = SEE_ALSO.get(name, [])
    if see:
        lines += ["", "**See also**: " + ", ".join(f"[{title}]({link})" for title, link in see) + "."]
    lines += ["", "[All commands](../cli.md) · [Exit codes](../../exit-codes.md)", ""]
    return "\n".join(lines)


def commands_table(page: str = "reference/cli.md") -> str:
    """Every command, its line in `harness --help` and a link to its page, as linked from the page `page`."""
    here = posixpath.dirname(page)
    rows = ["| command | what it does |", "|---|---|"]
    for name, command in sorted(commands().items()):
        link = posixpath.relpath(f"{COMMANDS_DIR}/{name}.md", here or ".")
        rows.append(f"| [`harness {name}`]({link}) | {command.short_help} |")
    return "\n".join(rows)


# ---------------------------------------------------------------------------------------------------------------
# docstrings of fields: the string literal under each annotated attribute (the house style, STYLE.md)


@functools.cache
def attribute_docs(cls: type) -> dict[str, str]:
    """{field: its docstring, whitespace folded} for a class and its bases (dataclass or pydantic model)."""
    out: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        if klass.__module__ == "builtins" or klass.__module__.startswith("pydantic"):
            continue
        try:
            source = textwrap.dedent(inspect.getsource(klass))
        except (OSError, TypeError):
            continue
        body = ast.parse(source).body[0].body  # type: ignore[attr-defined]
        for node, after in zip(body, body[1:]):
            if (
                isinstance(node, ast.AnnAssign)
                and isinstance(node.target, ast.Name)
                and isinstance(after, ast.Expr)
                and isinstance(after.value, ast.Constant)
                and isinstance(after.value.value, str)
            ):
                out[node.target.id] = " ".join(after.value.value.split())
    return out


def _doc(obj: Any) -> str:
    return " ".join((inspect.getdoc(obj) or "").split())


def _cell(text: str) -> str:
    """Text for a Markdown table cell: pipes escaped, and `<`, `>` outside code spans written as entities (a
    docstring's `<model>` is a placeholder, not an HTML tag)."""
    return _cell_text(text.replace("|", "\\|").replace("\n", " "))


def type_name(tp: Any) -> str:
    """A field's type as a reader of the JSON file sees it: `number or null`, `list of (number or null)`."""
    from pydantic import BaseModel

    origin, args = get_origin(tp), get_args(tp)
    if origin is not None and str(origin).endswith("Annotated"):
        return type_name(args[0])
    if origin in (Union, types.UnionType):
        parts = [a for a in args if a is not type(None)]
        names = ["number" if p in (int, float) and {int, float} <= set(parts) else type_name(p) for p in parts]
        return " or ".join(dict.fromkeys(names)) + (" or null" if type(None) in args else "")
    if origin is Literal:
        return " or ".join(f"`{a!r}`" if not isinstance(a, str) else f'`"{a}"`' for a in args)
    if origin is list:
        return f"list of {_grouped(type_name(args[0]))}" if args else "list"
    if origin is dict:
        return f"object: {type_name(args[0])} → {_grouped(type_name(args[1]))}" if args else "object"
    if isinstance(tp, type) and issubclass(tp, BaseModel):
        return "object"
    if tp is Any:
        return "any"
    return {str: "string", int: "integer", float: "number", bool: "boolean"}.get(tp, getattr(tp, "__name__", str(tp)))


def _grouped(name: str) -> str:
    return f"({name})" if " or " in name else name


# ---------------------------------------------------------------------------------------------------------------
# the record


class Section(NamedTuple):
    """One table of the record page: the fields of one model at one path."""

    path: str
    model: str
    doc: str
    rows: list[tuple[str, str, str, str]]
    """(dotted path, type, `always` or `sometimes`, meaning)"""


def record_sections() -> list[Section]:
    """Every field of the record as the file has it, one section per model, in the file's order."""
    from harness.core.typed import models_in, sometimes
    from harness.core.zoo import OPTIONAL_FIELDS, ModelConfig
    from harness.results.record import Record
    from harness.results.spec import CORE_KEYS
    from harness.scenario.spec import SETTING_FIELDS, RunSpec

    sections: list[Section] = []

    def walk(model: type, prefix: str) -> None:
        docs = attribute_docs(model)
        section = Section(prefix.rstrip(".") or "(top level)", model.__name__, _doc(model), [])
        sections.append(section)
        nested: list[tuple[type, str]] = []
        for name, f in model.model_fields.items():  # type: ignore[attr-defined]
            key = f.alias or name
            path = f"{prefix}{key}"
            inner = models_in(f.annotation, key="<name>")
            typ = type_name(f.annotation)
            if name == "spec" and model is Record:
                typ = "object (the cell)"
                nested.append((RunSpec, f"{path}."))
            every = "sometimes" if sometimes(model, name) else "always"
            section.rows.append((path, typ, every, docs.get(name, "")))
            nested += [(sub, f"{path}{suffix}.") for sub, suffix in inner]
        for attr in getattr(model, "__private_attributes__", {}):
            prop = getattr(model, attr.lstrip("_"), None)
            if isinstance(prop, property):
                section.rows.append((f"{prefix}{attr}", "string or null", "never (not in the file)", _doc(prop)))
        for sub, sub_prefix in nested:
            if sub is RunSpec:
                spec(sub_prefix)
            else:
                walk(sub, sub_prefix)

    def spec(prefix: str) -> None:
        """The cell, as harness.results.spec writes it: the core keys, then every setting."""
        run_docs = attribute_docs(RunSpec)
        types_ = {f.name: f.type for f in dataclasses.fields(RunSpec)}
        rows = [
            (
                f"{prefix}{key}",
                "object" if key == "model_config" else _annotation_text(types_[key]),
                "always",
                run_docs.get(key, ""),
            )
            for key in CORE_KEYS
        ]
        for name, f in SETTING_FIELDS.items():
            rows.append((f"{prefix}{name}", _setting_type(f), "sometimes", f.metadata.get("doc", "")))
        sections.append(Section(prefix.rstrip("."), "RunSpec", _doc(RunSpec), rows))
        cfg_docs = attribute_docs(ModelConfig)
        cfg_rows = [
            (
                f"{prefix}model_config.{f.name}",
                _annotation_text(f.type),
                "sometimes" if f.name in OPTIONAL_FIELDS else "always",
                cfg_docs.get(f.name, "") or f.metadata.get("doc", ""),
            )
            for f in dataclasses.fields(ModelConfig)
        ]
        sections.append(Section(f"{prefix}model_config", "ModelConfig", _doc(ModelConfig), cfg_rows))

    walk(Record, "")
    return sections


def _annotation_text(tp: Any) -> str:
    """A dataclass field's type (a string under `from __future__ import annotations`) as a reader sees it."""
    text = tp if isinstance(tp, str) else type_name(tp)
    for py, js in (
        ("str", "string"),
        ("int", "integer"),
        ("float", "number"),
        ("bool", "boolean"),
        ("None", "null"),
        ("dict", "object"),
        (" | ", " or "),
    ):
        text = re.sub(rf"\b{re.escape(py)}\b" if py.isalpha() else re.escape(py), js, text)
    return text


def _setting_type(f: dataclasses.Field) -> str:
    return _annotation_text(f.type)


def record_table() -> str:
    """The record's fields, one table per model, as Markdown."""
    out: list[str] = []
    for s in record_sections():
        out += [f"### `{s.path}`" if s.path != "(top level)" else "### The top level", ""]
        if s.doc:
            out += [f"*{s.model}*: {_cell(s.doc)}", ""]
        out += ["| key | type | in the file | meaning |", "|---|---|---|---|"]
        out += [f"| `{p}` | {_cell(t)} | {e} | {_cell(d)} |" for p, t, e, d in s.rows]
        out.append("")
    return "\n".join(out)


# ---------------------------------------------------------------------------------------------------------------
# the settings


def settings_table() -> str:
    """Every setting of a cell: its default, its limits and what it means (harness.scenario.spec.Settings)."""
    from harness.scenario.spec import SETTING_FIELDS

    rows = ["| setting | type | default | allowed | meaning |", "|---|---|---|---|---|"]
    for name, f in SETTING_FIELDS.items():
        meta = f.metadata
        allowed = []
        if meta.get("choices"):
            allowed.append(", ".join(f"`{c}`" for c in meta["choices"]))
        if meta.get("minimum") is not None:
            allowed.append(f"≥ {meta['minimum']:g}")
        default = "null" if f.default is None else str(f.default).lower() if isinstance(f.default, bool) else f.default
        limits = " ".join(allowed) or "—"
        rows.append(f"| `{name}` | {_setting_type(f)} | `{default}` | {limits} | {_cell(meta.get('doc', ''))} |")
    return "\n".join(rows)


# ---------------------------------------------------------------------------------------------------------------
# mkdocs-click, with the text of a command's help escaped


def escape_placeholders(lines: Any) -> list[str]:
    """Markdown lines with `<` and `>` outside code (fences and spans) written as entities: a command's help says
    `RESULTS/<scenario name>/…`, which Markdown would pass on as an HTML tag and a browser would drop."""
    out: list[str] = []
    fenced = False
    for line in lines:
        if line.lstrip().startswith("```"):
            fenced = not fenced
        out.append(line if fenced else _cell_text(line))
    return out


def _cell_text(line: str) -> str:
    parts = line.split("`")
    for i in range(0, len(parts), 2):
        parts[i] = parts[i].replace("<", "&lt;").replace(">", "&gt;")
    return "`".join(parts)


def click_extension() -> Any:
    """mkdocs-click's Markdown extension (the `::: mkdocs-click` blocks), its output escaped (escape_placeholders)."""
    from markdown.preprocessors import Preprocessor
    from mkdocs_click._extension import MKClickExtension, replace_command_docs
    from mkdocs_click._processing import replace_blocks

    class Processor(Preprocessor):
        def run(self, lines: list[str]) -> list[str]:
            return list(
                replace_blocks(
                    lines,
                    title="mkdocs-click",
                    replace=lambda **options: escape_placeholders(replace_command_docs(has_attr_list=True, **options)),
                )
            )

    class Extension(MKClickExtension):
        def extendMarkdown(self, md: Any) -> None:
            md.registerExtension(self)
            md.preprocessors.register(Processor(md), "mk_click", 141)

    return Extension()


# ---------------------------------------------------------------------------------------------------------------
# the hook's events


GENERATORS = {"commands": commands_table, "settings": settings_table, "record": record_table}


def expand_markers(markdown: str, page: str = "reference/cli.md") -> str:
    """A page's Markdown with every `<!-- generated: NAME -->` line replaced by its table; `page` is the page's
    path in the site (links are relative to it)."""

    def replace(m: re.Match[str]) -> str:
        if m.group(1) not in GENERATORS:
            raise ValueError(f"unknown generated table {m.group(1)!r}; known: {', '.join(GENERATORS)}")
        if m.group(1) == "commands":
            return commands_table(page)
        return GENERATORS[m.group(1)]()

    return MARKER.sub(replace, markdown)


def on_config(config: Any) -> Any:
    """The nav gets one entry per command, after NAV_ANCHOR in its section."""
    pages = [{f"harness {name}": f"{COMMANDS_DIR}/{name}.md"} for name in sorted(commands())]

    def insert(items: list[Any]) -> bool:
        for i, item in enumerate(items):
            value = next(iter(item.values())) if isinstance(item, dict) else item
            if value == NAV_ANCHOR:
                items[i + 1 : i + 1] = pages
                return True
            if isinstance(value, list) and insert(value):
                return True
        return False

    if config.get("nav") and not insert(config["nav"]):
        raise ValueError(f"mkdocs.yml: the nav has no {NAV_ANCHOR}, where the command pages go")
    config["markdown_extensions"].append(click_extension())
    return config


def on_files(files: Any, config: Any) -> Any:
    from mkdocs.structure.files import File

    for name in sorted(commands()):
        files.append(File.generated(config, f"{COMMANDS_DIR}/{name}.md", content=command_page(name)))
    return files


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    return expand_markers(markdown, page.file.src_uri)
