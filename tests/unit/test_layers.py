"""The package's import structure: stage folders stacked in floors, no cycles, nothing importing upwards.

Every `import` counts, also one inside a function (a lazy import that runs back up a floor is still a cycle that
only works by luck of timing). docs/ARCHITECTURE.md explains the floors; this test is their definition.
"""

from __future__ import annotations

import ast
from pathlib import Path

import harness

PACKAGE = Path(harness.__file__).resolve().parent

# bottom to top, as measured (test_the_floors_are_the_measured_order): a module may import its own floor and the
# floors below it; the stage packages that share a floor import nothing of each other
FLOORS: list[tuple[str, ...]] = [
    ("harness", "harness.core"),
    ("harness.scenario",),
    ("harness.plan",),
    ("harness.results",),
    ("harness.worker", "harness.compare"),
    ("harness.launch",),
    ("harness.calibrate", "harness.history"),
    ("harness.tune",),
    ("harness.report",),
    ("harness.cli",),
]


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules() -> dict[str, Path]:
    return {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def imports_of(name: str, path: Path, known: set[str]) -> set[str]:
    """The harness modules `name` imports anywhere in its body (resolved to modules that exist)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    is_package = path.name == "__init__.py"
    found: set[str] = set()
    for node in ast.walk(tree):
        targets: list[str] = []
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = name.split(".")
                anchor = anchor if is_package else anchor[:-1]
                anchor = anchor[: len(anchor) - (node.level - 1)]
                base = ".".join(anchor + ([base] if base else []))
            targets = [f"{base}.{a.name}" for a in node.names] + [base]
        for t in targets:
            # the longest prefix that is one of our modules (`from harness.x import f` → harness.x)
            parts = t.split(".")
            for i in range(len(parts), 0, -1):
                cand = ".".join(parts[:i])
                if cand in known:
                    if cand != name:
                        found.add(cand)
                    break
    return found


def floor_of(name: str) -> int:
    best, floor = -1, -1
    for i, prefixes in enumerate(FLOORS):
        for prefix in prefixes:
            if (name == prefix or name.startswith(prefix + ".")) and len(prefix) > best:
                best, floor = len(prefix), i
    assert floor >= 0, f"{name} is in no floor: add its folder to FLOORS (and docs/ARCHITECTURE.md)"
    return floor


def graph() -> dict[str, set[str]]:
    mods = modules()
    known = set(mods)
    return {name: imports_of(name, path, known) for name, path in mods.items()}


def test_every_module_has_a_floor():
    for name in modules():
        floor_of(name)


def test_nothing_imports_a_higher_floor():
    upward = [
        f"{a} (floor {floor_of(a)}) imports {b} (floor {floor_of(b)})"
        for a, targets in graph().items()
        for b in sorted(targets)
        if floor_of(b) > floor_of(a) and not (a == "harness" or b == "harness")
    ]
    assert upward == []


def test_launch_core_sits_below_its_backends():
    """launch/core is the library every backend uses; it imports no backend and nothing imports the sweep."""
    g = graph()
    core = [m for m in g if m.startswith("harness.launch.core")]
    assert core, "harness/launch/core/ is where payload, manifest and outcome live"
    for m in core:
        bad = [t for t in g[m] if t.startswith("harness.launch.") and not t.startswith("harness.launch.core")]
        assert bad == [], f"{m} imports {bad}"
    for m, targets in g.items():
        if m.startswith("harness.launch.") and m != "harness.launch.sweep":
            assert "harness.launch.sweep" not in targets, f"{m} imports the sweep orchestration"


def test_no_import_cycles():
    g = graph()
    # a package's __init__ importing its own children is not a cycle of stages; drop parent→child edges
    edges = {a: {b for b in bs if not b.startswith(a + ".")} for a, bs in g.items()}
    cycles: list[list[str]] = []
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(edges.get(node, ())):
            if state.get(nxt) == 1:
                cycles.append(stack[stack.index(nxt) :] + [nxt])
            elif nxt not in state:
                visit(nxt)
        stack.pop()
        state[node] = 2

    for node in sorted(edges):
        if node not in state:
            visit(node)
    assert cycles == []


def test_the_layer_check_sees_lazy_and_relative_imports(tmp_path):
    """The checker itself can fail: an import inside a function and a relative import are both found."""
    mod = tmp_path / "harness" / "worker" / "x.py"
    mod.parent.mkdir(parents=True)
    mod.write_text("def f():\n    from harness.launch.sweep import run_sweep\n\nfrom . import models\n")
    known = {"harness.launch.sweep", "harness.worker.models", "harness.worker", "harness.worker.x"}
    got = imports_of("harness.worker.x", mod, known)
    assert got == {"harness.launch.sweep", "harness.worker.models", "harness.worker"}
    assert floor_of("harness.launch.sweep") > floor_of("harness.worker.x")


def stage(name: str) -> str:
    """The stage package a module belongs to (`harness.plan.calibration.rates` → `harness.plan`)."""
    return ".".join(name.split(".")[:2])


def test_the_floors_are_the_measured_order():
    """Each stage package sits one floor above the highest stage it imports: FLOORS (and docs/ARCHITECTURE.md's
    diagram) are the import graph's own levels, not a wish. A new import that lifts a stage fails here, naming it."""
    deps: dict[str, set[str]] = {}
    for a, targets in graph().items():
        for b in targets:
            if stage(a) != stage(b) and "harness" not in (a, b):
                deps.setdefault(stage(a), set()).add(stage(b))

    def level(pkg: str) -> int:
        return 1 + max((level(d) for d in deps.get(pkg, ())), default=-1)

    measured: dict[int, set[str]] = {}
    for pkg in {stage(m) for m in modules()} - {"harness"}:
        measured.setdefault(level(pkg), set()).add(pkg)
    assert [measured[i] for i in sorted(measured)] == [set(f) - {"harness"} for f in FLOORS]
