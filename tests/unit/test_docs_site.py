"""The README as a front page and the documentation site (mkdocs.yml, docs/): what they promise holds.

Without MkDocs: the README's size, its two commands, its table of commands against `harness.cli.COMMANDS`, no dated
measurement in it; every relative link of the README and the docs reaches a file; every scenario the docs show loads.
With MkDocs (the project's `docs` extra: `make docs` installs it) and Chromium: the site builds with `--strict`, and
every command's page, generated from its click definition, renders in a real headless browser.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from harness.cli import COMMANDS
from harness.scenario.schema import parse_scenario
from tests.unit.test_report_chromium import BROWSER_TIMEOUT_S, FLAGS, chromium  # noqa: F401 (the fixture)

REPO = Path(__file__).resolve().parents[2]
README = REPO / "README.md"
DOCS = REPO / "docs"
README_MAX_CHARS = 15_000
COMMAND_PAGES = "reference/commands"
"""where docs/hooks/reference.py puts each command's generated page"""
BUILD_TIMEOUT_S = 300


def pages() -> list[Path]:
    return sorted(DOCS.rglob("*.md"))


# ---- the README


def test_the_readme_is_a_front_page_with_the_two_commands():
    text = README.read_text()
    assert len(text) <= README_MAX_CHARS, f"README.md has {len(text)} characters; the front page keeps to 15,000"
    blocks = "\n".join(re.findall(r"```bash\n(.*?)```", text, re.S))
    assert re.search(r"^make sweep\b", blocks, re.M) and re.search(r"^make test\b", blocks, re.M)


def test_the_readme_carries_no_measurement_that_dates():
    """Measured figures, with their dates and machines, belong on docs/benchmarks.md: a date, a load average or a
    commit in the README is a sentence the next commit makes stale."""
    text = README.read_text()
    assert re.findall(r"\b20\d\d-\d\d-\d\d\b", text) == []
    assert re.findall(r"load average|\b[0-9a-f]{7}\b(?![-\w])", text) == []


def test_the_readme_lists_every_command():
    text = README.read_text()
    section = text[text.index("## Commands") :]
    table = section[: section.index("\n\n", section.index("| command"))]
    listed = re.findall(r"^\| `harness ([a-z]+)` \|", table, re.M)
    assert sorted(listed) == sorted(COMMANDS), "README.md's table of commands and harness.cli.COMMANDS differ"


# ---- links and examples, without building anything


def _links(path: Path) -> list[str]:
    text = re.sub(r"```.*?```", "", path.read_text(), flags=re.S)
    text = re.sub(r"`[^`\n]*`", "", text)
    return [link for link in re.findall(r"\]\(([^)\s]+)\)", text) if not re.match(r"[a-z]+:|#", link)]


def test_every_relative_link_of_the_readme_and_the_docs_reaches_a_file():
    generated = {f"{COMMAND_PAGES}/{name}.md" for name in COMMANDS}
    broken = []
    for path in [README, *pages()]:
        for link in _links(path):
            target = (path.parent / link.split("#")[0]).resolve()
            in_site = target.relative_to(DOCS).as_posix() if target.is_relative_to(DOCS) else None
            if not target.exists() and in_site not in generated:
                broken.append(f"{path.relative_to(REPO)}: {link}")
    assert broken == []


def _scenarios_shown() -> list[tuple[str, dict]]:
    """Every YAML block of the README and the docs that is a whole scenario (a `name` and a `matrix`)."""
    out = []
    for path in [README, *pages()]:
        for block in re.findall(r"```yaml\n(.*?)```", path.read_text(), re.S):
            doc = yaml.safe_load(block)
            if isinstance(doc, dict) and {"name", "matrix"} <= set(doc):
                out.append((f"{path.relative_to(REPO)}: {doc['name']}", doc))
    return out


SCENARIOS_SHOWN = _scenarios_shown()


def test_the_docs_show_scenarios():
    assert len(SCENARIOS_SHOWN) >= 5


@pytest.mark.parametrize(("where", "doc"), SCENARIOS_SHOWN, ids=[w for w, _ in SCENARIOS_SHOWN])
def test_every_scenario_the_docs_show_is_valid(where, doc):
    """A scenario a page tells you to write loads, and expands into cells, as shown."""
    models = doc.get("models") or {}
    if any("hf_config" in (m or {}) for m in models.values()):
        pytest.skip(f"{where}: names a config.json the reader has, not this repository")
    cells = parse_scenario(doc, where).expand(gpus_per_node=8)
    assert cells, f"{where}: no cell"


# ---- the site, built


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    for module in ("mkdocs", "material", "mkdocs_click"):
        pytest.importorskip(
            module, reason=f"{module} is not installed: `make docs` installs the docs extra (pip install -e '.[docs]')"
        )
    out = tmp_path_factory.mktemp("site")
    build = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(out)],
        cwd=REPO,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1", "PYTHONPATH": str(REPO)},
        capture_output=True,
        text=True,
        timeout=BUILD_TIMEOUT_S,
    )
    assert build.returncode == 0, build.stdout + build.stderr
    return out


@pytest.mark.slow
def test_the_site_has_a_page_per_command_in_its_nav(site):
    home = (site / "index.html").read_text()
    for name in COMMANDS:
        assert (site / COMMAND_PAGES / f"{name}.html").is_file(), name
        assert f'href="{COMMAND_PAGES}/{name}.html"' in home, f"the nav does not link to harness {name}'s page"


@pytest.mark.slow
def test_no_generated_marker_is_left_in_the_site(site):
    left = [p.relative_to(site).as_posix() for p in site.rglob("*.html") if "<!-- generated:" in p.read_text()]
    assert left == []


@pytest.mark.slow
@pytest.mark.chromium
@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_each_command_page_renders_in_chromium(site, chromium, tmp_path, name):  # noqa: F811 (the fixture)
    """The page as a browser builds it: the command's title, its usage line and its options, from its click
    definition (a subcommand group lists its subcommands)."""
    page = site / COMMAND_PAGES / f"{name}.html"
    run = subprocess.run(
        [chromium, *FLAGS, f"--user-data-dir={tmp_path / 'profile'}", "--dump-dom", page.as_uri()],
        capture_output=True,
        text=True,
        timeout=BROWSER_TIMEOUT_S,
    )
    assert run.returncode == 0, run.stderr[-2000:]
    dom = run.stdout
    title = re.search(r"<h1[^>]*>(.*?)</h1>", dom, re.S)
    assert title is not None and re.sub(r"<[^>]+>", "", title.group(1)).strip().startswith(f"harness {name}")
    assert f"harness {name} [OPTIONS]" in dom
    assert "--help" in dom and "Show this message and exit." in dom
    if name == "history":
        for sub in ("add", "show", "check"):
            assert f"harness history {sub} [OPTIONS]" in dom
