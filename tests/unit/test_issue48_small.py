"""Issue 48, item 10: the smaller things. A Hugging Face model's folder as `hf_config`; one error for a refused
`hf_config` model, not a second that blames the matrix; `--cluster ./path/NAME` without its .yaml; no bus bandwidth
printed for a one-rank group; the sweep's last lines runnable as printed, with no `|` between two commands."""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path

import pytest

from harness.cli import main
from harness.core.errors import InputError
from harness.core.zoo import ZOO
from harness.launch.run import summary_lines, this_command
from harness.scenario.cluster import load_cluster
from harness.scenario.schema import load_scenario
from tests.conftest import REPO

HF = REPO / "tests" / "fixtures" / "hf"


def _scenario(tmp_path: Path, models: dict, *, model: str) -> Path:
    path = tmp_path / "s.yaml"
    matrix = {"model": [model], "strategy": ["ddp"], "precision": ["bf16"], "gpus": [2]}
    path.write_text(json.dumps({"name": "s", "models": models, "matrix": matrix}))
    return path


def test_hf_config_naming_a_model_folder_reads_the_config_json_in_it(tmp_path, capsys):
    """A Hugging Face snapshot is a folder (config.json, the weights, the tokenizer): naming it reads its
    config.json."""
    folder = tmp_path / "models" / "Llama-3.1-8B"
    folder.mkdir(parents=True)
    (folder / "config.json").write_text((HF / "llama3.1-8b.json").read_text())
    scenario = load_scenario(_scenario(tmp_path, {"my-8b": {"hf_config": "models/Llama-3.1-8B"}}, model="my-8b"))
    assert scenario.models["my-8b"] == ZOO["llama3.1-8b"]
    assert main(["list", "models", str(tmp_path / "s.yaml")]) == 0
    line = next(x for x in capsys.readouterr().out.splitlines() if x.startswith("my-8b"))
    assert line.endswith(f"source: hf_config {folder / 'config.json'}")
    # a folder without one: the file it looked for, and why
    (folder / "config.json").unlink()
    with pytest.raises(InputError) as e:
        load_scenario(tmp_path / "s.yaml")
    assert str(e.value) == f"{folder / 'config.json'}: cannot read the Hugging Face config: No such file or directory"


def test_a_refused_hf_config_model_is_one_error_not_a_second_about_the_matrix(tmp_path, capsys):
    scenario = _scenario(tmp_path, {"m": {"hf_config": str(HF / "mixtral-8x7b.json")}}, model="m")
    assert main(["plan", str(scenario)]) == 2
    err = capsys.readouterr().err
    assert f"{HF / 'mixtral-8x7b.json'}: num_local_experts: cannot build: 8: a mixture of experts" in err
    assert "matrix.model" not in err and "is not one of" not in err, err
    # a name the file does not declare is still the matrix's problem
    scenario = _scenario(tmp_path, {"m": {"hf_config": str(HF / "mixtral-8x7b.json")}}, model="n")
    assert main(["plan", str(scenario)]) == 2
    assert f"{scenario}: matrix.model[0]: 'n' is not one of" in capsys.readouterr().err


def test_a_cluster_path_without_its_yaml_is_a_path(tmp_path, monkeypatch):
    """`--cluster ./site/h100x` is the file ./site/h100x.yaml, as `--cluster ./site/h100x.yaml` is: a name has no
    folder in it."""
    site = tmp_path / "site"
    site.mkdir()
    text = (REPO / "harness" / "scenario" / "clusters" / "h100.yaml").read_text()
    (site / "h100x.yaml").write_text(text.replace("name: h100\n", "name: h100x\n"))
    monkeypatch.chdir(tmp_path)
    for given in ("./site/h100x", "site/h100x", str(site / "h100x"), "./site/h100x.yaml"):
        cluster = load_cluster(given)
        assert (cluster.name, Path(cluster.path).resolve()) == ("h100x", site / "h100x.yaml"), given
    with pytest.raises(InputError) as e:
        load_cluster("./site/h200x")
    assert str(e.value) == "--cluster: ./site/h200x: no such profile file (site/h200x, site/h200x.yaml, site/h200x.yml)"
    assert load_cluster("h100").name == "h100"  # a name is still a name


ONE_RANK = textwrap.dedent(
    """
    import sys
    import torch, torch.distributed as dist
    from harness.calibrate.group import measure_collectives
    from harness.worker import teardown
    dist.init_process_group("gloo", init_method="file://" + sys.argv[1], rank=0, world_size=1)
    measure_collectives(link="self", device=torch.device("cpu"), quick=True)
    teardown.end_process_group()
    """
)


def test_calibrate_prints_no_bus_bandwidth_for_a_one_rank_group(tmp_path):
    """A one-rank group moves nothing over a link: its curve's slope (often flat, then 1e+06 "GB/s") is no bus
    bandwidth. Real gloo, one rank, the quick sizes."""
    run = subprocess.run(
        [sys.executable, "-c", ONE_RANK, str(tmp_path / "store")],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stderr
    lines = [x for x in run.stdout.splitlines() if x.startswith("calibrate: ")]
    assert len(lines) == 6, run.stdout  # all_reduce, all_gather, reduce_scatter, broadcast; two in bfloat16
    for line in lines:
        assert "busbw" not in line and "GB/s" not in line, line
        assert line.endswith("no bus bandwidth (one rank: nothing crosses a link)"), line
        assert " on 1 rank(s) (self): latency " in line


@dataclass(frozen=True)
class _Finished:
    records: tuple = ()
    results_dir: Path = Path("results/smoke")
    wall_s: float = 12.0
    in_flight: int = 0


def test_the_sweeps_last_lines_are_each_one_command_with_no_pipe(tmp_path):
    """`(harness report results | harness status results/smoke)` read as a shell pipe: each command is now a line
    of its own, runnable as printed."""
    folder = tmp_path / "my results" / "smoke"
    lines = summary_lines(_Finished(results_dir=folder), results=str(tmp_path / "my results"))  # type: ignore[arg-type]
    assert not any("|" in line for line in lines), lines
    assert lines[-3] == f"records: {folder}/  (read them with:)"
    me = shlex.split(this_command())
    assert shlex.split(lines[-2]) == [*me, "report", str(tmp_path / "my results")]
    assert shlex.split(lines[-1]) == [*me, "status", str(folder)]
