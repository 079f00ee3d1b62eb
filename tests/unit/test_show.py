"""`harness show cluster NAME` (issue 52, item 2): a profile's figures with their full sources, the rates the planner
prices with, and what the published runs say per family: what `harness plan`'s one-line footnote points to."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest

from harness.cli import main
from harness.plan.validation import family_check
from harness.scenario.cluster import SHIPPED_DIR, load_cluster
from tests.conftest import run_light

REPO = Path(__file__).resolve().parents[2]
SMALL = "name: s\nmatrix: {model: [125m], strategy: [fsdp.full_shard, zero3], precision: [bf16], gpus: [8]}\n"


def flat(text: str) -> str:
    """The words of `text` (wrapped lines joined): sources are wrapped to the terminal."""
    return " ".join(text.split())


def test_show_cluster_prints_every_figure_with_its_full_source(capsys):
    assert main(["show", "cluster", "h100"]) == 0
    out = capsys.readouterr().out
    words = flat(out)
    cluster = load_cluster("h100")
    assert out.splitlines()[0] == f"cluster h100 ({cluster.path}): {cluster.description}"
    assert "device memory: 80 GiB; 79 GiB usable" in words
    assert "dense peak (the MFUs' denominator): H100 SXM: fp32 67, tf32 494.7, bf16 989.4, fp16 989.4 TFLOPS" in words
    perf = cluster.performance
    assert set(perf.sources) == {"matmul_tflops", "memory_gbps", "intra_node", "inter_node", "efficiency"}
    for key, source in perf.sources.items():
        assert f"source: {flat(source)}" in words, key  # whole: nothing cut to fit a line
    assert "matmul_tflops: bf16 794.5, fp16 794.5, tf32 397.2, fp32 53.8" in words
    assert "step-time rates: the figures below (no calibration file" in words
    fsdp = family_check("FSDP", "bf16", "h100")
    assert fsdp.runs == 70 and f"FSDP bf16: MAPE {fsdp.mape:.1%}" in words
    assert "ZeRO-3: no published GPU run checks ZeRO-3's time model (any precision)" in words
    assert all(len(line) <= 100 or "/" in line for line in out.splitlines())  # a path is never broken


def test_the_plan_footnote_names_a_command_that_works(tmp_path, capsys):
    scenario = tmp_path / "s.yaml"
    scenario.write_text(SMALL)
    for given in ("h100", str(_copy(tmp_path))):
        assert main(["plan", str(scenario), "--cluster", given]) == 0
        out = capsys.readouterr().out
        lines = out.splitlines()
        (start,) = [i for i, x in enumerate(lines) if x.startswith("step time: ")]
        ends = [i for i in range(start + 1, len(lines)) if not lines[i].startswith("    ")]
        footnote = " ".join(" ".join(lines[start : ends[0] if ends else len(lines)]).split())  # wrapped: one text
        (command,) = re.findall(r"`(harness show cluster [^`]+)`", footnote)
        assert command == f"harness show cluster {given}"
        assert len(footnote) < 200  # was 2,400 characters of sources
        assert main(command.split()[1:]) == 0
        assert "source: bf16: maximum achievable matmul FLOPS (MAMF)" in flat(capsys.readouterr().out)


def _copy(tmp_path: Path) -> Path:
    """The h100 profile under another folder: a profile given by path is shown by its path."""
    site = tmp_path / "site"
    site.mkdir()
    return Path(shutil.copy(SHIPPED_DIR / "h100.yaml", site / "h100.yaml"))


def test_show_refuses_what_it_cannot_show(capsys):
    assert main(["show", "cluster", "nope"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: harness show cluster: 'nope' is not one of a100") and "Traceback" not in err
    assert main(["show", "model", "7b"]) == 2
    assert main(["show", "cluster", "local"]) == 0
    assert "none: the published runs are GPU runs, and this profile's device is a CPU" in capsys.readouterr().out


@pytest.mark.parametrize("command", [["show", "cluster", "h100"]])
def test_show_does_not_import_torch(command):
    run_light(command)
