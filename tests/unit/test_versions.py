"""The minimum versions are true (issue 32): harness/worker/versions.py lists every torch name harness/ imports with
the release it needs; pyproject.toml and the README state the same minimums; a rank on an older torch is refused
with what it lacks. (The check is against the table of the declared minimum's API: CI has torch 2.13 only.)"""

from __future__ import annotations

import ast
import importlib
import re
from pathlib import Path

import pytest

from harness.worker import versions

ROOT = Path(__file__).resolve().parents[2]


def _torch_imports() -> dict[str, set[str]]:
    """'module:name' / 'module' of every torch import in harness/, with the files that make it."""
    found: dict[str, set[str]] = {}
    for path in (ROOT / "harness").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "torch":
                keys = [f"{node.module}:{a.name}" for a in node.names]
            elif isinstance(node, ast.Import):
                keys = [a.name for a in node.names if a.name.startswith("torch.")]
            else:
                continue
            for key in keys:
                found.setdefault(key, set()).add(str(path.relative_to(ROOT)))
    return found


def test_the_table_lists_exactly_the_torch_imports_of_the_code():
    used = _torch_imports()
    unlisted = {k: sorted(v) for k, v in used.items() if k not in versions.TORCH_APIS}
    assert not unlisted, (
        f"add each to harness/worker/versions.py TORCH_APIS with the torch release it needs: {unlisted}"
    )
    assert set(versions.TORCH_APIS) - set(used) == set(), "stale entries: the code no longer imports them"


@pytest.mark.parametrize("api", sorted({**versions.TORCH_APIS, **versions.TORCH_ATTRIBUTES}))
def test_each_listed_name_resolves_in_the_installed_torch(api):
    module, _, name = api.partition(":")
    mod = importlib.import_module(module)
    if name:
        assert hasattr(mod, name) or importlib.import_module(f"{module}.{name}") is not None


def test_the_minimum_is_the_newest_release_the_table_needs():
    needed = {**versions.TORCH_APIS, **versions.TORCH_ATTRIBUTES}
    assert max(needed.values()) == versions.TORCH_MIN == (2, 6)
    assert versions.PYTHON_MIN == (3, 11)


def test_pyproject_and_readme_state_the_minimums():
    # NOTE: not tomllib: ruff's target is still py310 (the bump rewrites unrelated files; the lead's call)
    pyproject = (ROOT / "pyproject.toml").read_text()
    py, torch_min = (".".join(map(str, v)) for v in (versions.PYTHON_MIN, versions.TORCH_MIN))
    assert re.findall(r'^requires-python = "([^"]+)"', pyproject, re.M) == [f">={py}"]
    assert re.findall(r'^  "torch>=([0-9.]+)",', pyproject, re.M) == [torch_min]
    readme = (ROOT / "README.md").read_text()
    assert f"Python ≥ {py}" in readme and f"torch ≥ {torch_min}" in readme
    assert "Python ≥ 3.10" not in readme


def test_python_311_is_what_the_launchers_need():
    """Popen(process_group=...) is Python 3.11's: the claim is there because the code uses it."""
    users = []
    for path in (ROOT / "harness").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and any(k.arg == "process_group" for k in node.keywords):
                if getattr(node.func, "attr", getattr(node.func, "id", "")) == "Popen":
                    users.append(path.name)
    assert sorted(users) == ["launchers.py", "pack.py", "prefork.py"]


@pytest.mark.parametrize("version", ["2.4.1+cu121", "2.5.0"])
def test_an_older_torch_is_refused_with_what_it_lacks(version):
    with pytest.raises(RuntimeError) as e:
        versions.require_torch(version)
    msg = str(e.value)
    assert msg.startswith(f"torch {version} is older than the harness's minimum 2.6: it lacks ")
    assert "torch.distributed.fsdp:fully_shard (torch 2.6)" in msg
    assert ("torch:OutOfMemoryError (torch 2.5)" in msg) == version.startswith("2.4")
    missing = versions.missing_for(version)
    assert len(missing) == (11 if version.startswith("2.4") else 3)


@pytest.mark.parametrize("version, parsed", [("2.6.0", (2, 6)), ("2.13.0+cpu", (2, 13)), ("2.7.0a0+git12ab", (2, 7))])
def test_versions_of_every_shape_parse_and_pass(version, parsed):
    assert versions.version_tuple(version) == parsed
    versions.require_torch(version)


def test_no_module_names_a_python_older_than_the_minimum():
    # the README and every page of the docs (docs/slurm.md once said 3.10; its sections now have pages of their own)
    text = "".join(p.read_text() for p in [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))])
    assert not re.search(r"Python (≥|>=) ?3\.10", text)
