"""Which CUDA device each rank takes and what LOCAL_RANK it exports (harness.worker.devices), over the environments
SLURM gives a task, for the worker's ranks and `harness calibrate`'s processes alike.

No GPU here: the CUDA device count is what CUDA_VISIBLE_DEVICES lists (what torch.cuda.device_count() returns when
it is set), and in the runner's test torch.cuda's is_available/device_count/set_device are mocked (the GPU only)."""

from __future__ import annotations

import os

import pytest

from harness.worker.devices import cuda_placement

# (what SLURM sets for one task, the device torch must use, LOCAL_RANK for DeepSpeed's set_device)
SLURM_TASKS = [
    # --gpus-per-task=1 / --gpu-bind=single:1: each task sees its one GPU, renumbered cuda:0
    ({"SLURM_LOCALID": "0", "CUDA_VISIBLE_DEVICES": "0"}, 0, "0"),
    ({"SLURM_LOCALID": "3", "CUDA_VISIBLE_DEVICES": "3"}, 0, "0"),
    ({"SLURM_LOCALID": "7", "CUDA_VISIBLE_DEVICES": "7"}, 0, "0"),
    # --gpus-per-node=8 without a binding: every task sees the node's GPUs and takes its local id's
    ({"SLURM_LOCALID": "0", "CUDA_VISIBLE_DEVICES": "0,1,2,3,4,5,6,7"}, 0, "0"),
    ({"SLURM_LOCALID": "5", "CUDA_VISIBLE_DEVICES": "0,1,2,3,4,5,6,7"}, 5, "5"),
    # half a node shared with another job: the GPUs listed are 4..7, numbered 0..3 in the process
    ({"SLURM_LOCALID": "2", "CUDA_VISIBLE_DEVICES": "4,5,6,7"}, 2, "2"),
    ({"SLURM_LOCALID": "3", "CUDA_VISIBLE_DEVICES": "4,5,6,7"}, 3, "3"),
]


def _count(env: dict[str, str]) -> int:
    return len(env["CUDA_VISIBLE_DEVICES"].split(","))


@pytest.mark.parametrize("env, index, local_rank", SLURM_TASKS)
def test_each_slurm_task_takes_its_gpu_and_local_rank_names_that_gpu(env, index, local_rank):
    got = cuda_placement(
        int(env["SLURM_LOCALID"]), device_count=_count(env), visible_devices=env["CUDA_VISIBLE_DEVICES"], host="n1"
    )
    assert (got.index, got.local_rank) == (index, local_rank)
    # DeepSpeed calls set_device(int(LOCAL_RANK)): it must be the device the rank took, never beyond what it sees
    assert int(got.local_rank) == got.index < _count(env)


@pytest.mark.parametrize(
    "local_rank, visible, match",
    [
        (
            3,
            "0,1",
            r"local rank 3 needs cuda:3, but host n1 has 2 CUDA device\(s\) visible "
            r"\(CUDA_VISIBLE_DEVICES='0,1'\); bind one GPU per task",
        ),  # fmt: skip
        (0, "", r"local rank 0 needs a CUDA device, but host n1 has none visible \(CUDA_VISIBLE_DEVICES=''\)"),
    ],
)
def test_a_rank_the_binding_shows_no_gpu_of_its_own_is_an_error_that_says_why(local_rank, visible, match):
    with pytest.raises(RuntimeError, match=match):
        cuda_placement(local_rank, device_count=len([v for v in visible.split(",") if v]), visible_devices=visible,
                       host="n1")  # fmt: skip


@pytest.mark.parametrize("env, index, local_rank", SLURM_TASKS)
def test_the_runner_exports_the_local_rank_of_the_device_it_set(env, index, local_rank, monkeypatch):
    """The worker's rank: rank_device sets the device and returns the LOCAL_RANK _join_process_group exports.
    NOTE: torch.cuda is mocked (no GPU here): is_available, device_count (the entries of CUDA_VISIBLE_DEVICES) and
    set_device (recorded)."""
    import torch

    from harness.results.payload import PayloadCluster
    from harness.worker.runner import rank_device

    set_to = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: _count(env))
    monkeypatch.setattr(torch.cuda, "set_device", set_to.append)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", env["CUDA_VISIBLE_DEVICES"])
    cluster = PayloadCluster(name="gpu", device="cuda", pg_timeout_s=600, env={})
    device, backend, exported = rank_device(cluster, local_rank=int(env["SLURM_LOCALID"]))
    assert (device.type, device.index, backend, exported) == ("cuda", index, "nccl", local_rank)
    assert set_to == [torch.device("cuda", index)]


def test_calibration_processes_take_the_same_device(monkeypatch, tmp_path):
    """harness.calibrate.process's setup under a one-GPU binding: cuda:0 and LOCAL_RANK rewritten to 0.
    NOTE: torch.cuda is mocked (no GPU here), as above."""
    import torch

    from harness.calibrate import process

    set_to = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "set_device", set_to.append)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "6")
    monkeypatch.setenv("LOCAL_RANK", "6")
    cluster, device = process.process_setup("local-gpu")
    assert (cluster.device, device, set_to) == ("cuda", torch.device("cuda", 0), [0])
    assert os.environ["LOCAL_RANK"] == "0"


@pytest.mark.parametrize(
    "hosts, gpn, ok",
    [
        (["n1", "n1", "n2", "n2"], 2, True),  # --distribution=block
        (["n1"] * 8 + ["n2"] * 8, 8, True),
        (["vm"] * 4, 2, True),  # local: two simulated nodes on one host
        (["n1", "n2", "n1", "n2"], 2, False),  # --distribution=cyclic
    ],
)
def test_ranks_must_be_numbered_node_by_node(hosts, gpn, ok):
    from harness.worker.devices import node_major_problem

    problem = node_major_problem(hosts, gpus_per_node=gpn)
    assert (problem is None) == ok
    if not ok:
        assert problem == (
            "ranks are not numbered node by node: ranks 0..1 should share a node (2 per node) but run on 2 "
            "(rank 0 on n1, rank 1 on n2); ask SLURM for --distribution=block (slurm.distribution in the cluster "
            "profile)"
        )
