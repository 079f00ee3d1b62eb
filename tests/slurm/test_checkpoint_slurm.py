"""A 2-node checkpoint on the real localhost SLURM cluster (issue 34): an FSDP cell of 4 ranks, 2 on each of the
cluster's two nodes, saves its sharded state into the profile's `checkpoint_dir` (the folder both nodes share: on a
real cluster a parallel file system), and every rank reads the coordinator's metadata and its own shards back from
it into a fresh model, then trains on exactly as before.
"""

from __future__ import annotations

import textwrap

import pytest

from harness.cli import main
from harness.scenario.cluster import SHIPPED_DIR
from tests.conftest import load_docs
from tests.slurm.conftest import write

pytestmark = pytest.mark.slurm

SCENARIO = """\
    name: ckpt-slurm
    matrix: {model: [tiny], strategy: [fsdp.full_shard], precision: [fp32], gpus: [4]}
    settings: {warmup_steps: 2, measure_steps: 1, checkpoint: true}
"""


@pytest.fixture(scope="module")
def two_nodes(slurm_cluster, tmp_path_factory) -> dict:
    tmp = tmp_path_factory.mktemp("ckpt-slurm")
    shared = tmp / "shared-checkpoints"
    profile = (SHIPPED_DIR / "local-slurm.yaml").read_text().replace("name: local-slurm", "name: local-slurm-ckpt")
    cluster = write(tmp / "local-slurm-ckpt.yaml", profile + f"checkpoint_dir: {shared}\n")
    scenario = write(tmp / "ckpt.yaml", textwrap.dedent(SCENARIO))
    results = tmp / "results"
    code = main(["sweep", str(scenario), "--cluster", str(cluster), "--results", str(results)])
    docs, warnings = load_docs(results)
    return {"code": code, "docs": docs, "warnings": warnings, "shared": shared}


def test_a_two_node_cell_writes_and_reads_its_checkpoint_in_the_shared_dir(two_nodes, slurm_cluster):
    assert two_nodes["code"] == 0 and not two_nodes["warnings"]
    (d,) = two_nodes["docs"]
    assert d["status"] == "ok", d["reason"]
    assert d["env"]["hostnames"] == list(slurm_cluster.nodes)  # 2 nodes x 2 ranks
    c = d["metrics"]["checkpoint"]
    assert c["format"] == "dcp" and c["dir"] == str(two_nodes["shared"])
    # every rank's shard (written from both nodes) and the coordinator's metadata, in the one shared folder
    assert c["files"] == 5
    assert c["bytes"] >= d["predicted"]["checkpoint_bytes"] > 12 * d["metrics"]["n_params"]  # DCP: framing predicted
    assert len(c["save_s_per_rank"]) == len(c["load_s_per_rank"]) == 4
    assert abs(c["resume_loss_delta"]) <= 1e-6  # read back on both nodes into fresh models: training goes on exactly
    assert list(two_nodes["shared"].iterdir()) == []  # the cell's checkpoint was deleted after measuring
