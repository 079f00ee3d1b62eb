"""Local GPU sweeps: which GPUs a cell's tasks get, and cells that need more GPUs than the machine shows are
`skipped` before anything launches. (No GPU here: the GPUs are what CUDA_VISIBLE_DEVICES says.)"""

from __future__ import annotations

import json

from harness.cli import main
from harness.launch.local.launchers import local_executor_parameters, local_gpus
from harness.scenario.cluster import load_cluster


def test_the_users_cuda_visible_devices_are_the_gpus_the_tasks_get(monkeypatch):
    # submitit's default would give the tasks CUDA_VISIBLE_DEVICES=0,1 (physical indices), not the user's 2,3
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,3")
    assert local_gpus() == [2, 3]
    params = local_executor_parameters(2, cluster=load_cluster("local-gpu"), time_limit_s=600)
    assert params["gpus_per_node"] == 2 and params["visible_gpus"] == (2, 3) and params["tasks_per_node"] == 2


def test_gpus_named_by_uuid_are_not_counted(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "GPU-5f3c2a1e-0000-0000-0000-000000000000")
    assert local_gpus() is None
    assert "visible_gpus" not in local_executor_parameters(1, cluster=load_cluster("local-gpu"), time_limit_s=60)


def test_cpu_cells_ask_for_no_gpu(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")
    params = local_executor_parameters(2, cluster=load_cluster("local"), time_limit_s=60)
    assert params["gpus_per_node"] == 0 and "visible_gpus" not in params


def test_cells_needing_more_gpus_than_visible_are_skipped_unlaunched(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    scenario = tmp_path / "s.yaml"
    scenario.write_text(
        json.dumps(
            {"name": "g", "matrix": {"model": ["tiny"], "strategy": ["ddp"], "precision": ["bf16"], "gpus": [2, 4]}}
        )
    )
    results = tmp_path / "results"
    assert main(["sweep", str(scenario), "--cluster", "local-gpu", "--results", str(results)]) == 1  # nothing ran
    records = [json.loads(p.read_text()) for p in (results / "g").glob("tiny-*.json")]
    assert sorted((r["spec"]["gpus"], r["status"]) for r in records) == [(2, "skipped"), (4, "skipped")]
    for r in records:
        n = r["spec"]["gpus"]
        assert r["reason"] == f"needs {n} GPUs on this machine; 1 visible (CUDA_VISIBLE_DEVICES='0')"
    assert not (results / "g" / ".submitit").exists()  # nothing was launched
