"""A checkpoint that cannot be written or read back ends its cell as a clear `error` record that keeps the measured
steps, and the sweep goes on (issue 34): real gloo ranks, the real sweep path, real file-system failures.

- an unwritable checkpoint_dir: the cluster profile points at a folder nothing can be created in (a chmod 0o555 one,
  or /sys when we are root, who writes in a 0o555 folder anyway);
- a truncated checkpoint: `inject: {fault: checkpoint_truncate}` cuts every file the save wrote to half its length,
  so each family's own load (torch.load, DCP, DeepSpeed) meets a truncated file.
"""

from __future__ import annotations

import os
import textwrap
from pathlib import Path

import pytest

from harness.cli import main
from harness.results.store import load_records
from harness.worker.checkpoint import CHECKPOINTS_DIR
from tests.conftest import load_docs

pytestmark = pytest.mark.dist

SCENARIO = """\
name: {name}
matrix:
  model: [tiny]
  strategy: {strategies}
  precision: [fp32]
  gpus: [2]
  inject: {inject}
settings: {{warmup_steps: 2, measure_steps: 1, checkpoint: true, time_limit_s: 180}}
"""
CLUSTER = """\
name: local-ckpt
executor: local
device: cpu
gpus_per_node: 2
pg_timeout_s: 60
env: {{OMP_NUM_THREADS: "1"}}
checkpoint_dir: {dir}
"""


def refuses_entries(folder: Path) -> bool:
    probe = folder / f".harness-test-probe-{os.getpid()}"
    try:
        probe.mkdir()
    except OSError:
        return True
    probe.rmdir()
    return False


def unwritable_dir(tmp: Path) -> Path:
    """A folder nothing can be created in, as this user: a 0o555 one unless we are root, else under /sys."""
    ro = tmp / "ro"
    ro.mkdir()
    ro.chmod(0o555)
    if refuses_entries(ro):
        return ro / "checkpoints"
    ro.chmod(0o755)
    if Path("/sys").is_dir() and refuses_entries(Path("/sys")):
        return Path("/sys") / "harness-checkpoints"
    pytest.skip("neither a 0o555 folder nor /sys refuses new entries here")


def sweep(tmp: Path, name: str, *, strategies: str, inject: str, cluster: Path | None = None) -> dict:
    scenario = tmp / f"{name}.yaml"
    scenario.write_text(textwrap.dedent(SCENARIO.format(name=name, strategies=strategies, inject=inject)))
    results = tmp / "results"
    args = ["sweep", str(scenario), "--results", str(results)]
    code = main(args + (["--cluster", str(cluster)] if cluster else []))
    docs, warnings = load_docs(results / name)
    records, _ = load_records(results / name)
    return {
        "code": code,
        "docs": {(d["spec"]["strategy"], (d["spec"]["inject"] or {}).get("fault")): d for d in docs},
        "problems": [p for r in records for p in r.contract_problems()],
        "warnings": warnings,
        "results": results / name,
    }


@pytest.fixture(scope="module")
def truncated(tmp_path_factory):
    """ddp, FSDP2 and ZeRO-1, each with its checkpoint truncated after the save."""
    tmp = tmp_path_factory.mktemp("truncated")
    return sweep(tmp, "trunc", strategies="[ddp, fsdp2.full_shard, zero1]", inject="[{fault: checkpoint_truncate}]")


@pytest.fixture(scope="module")
def unwritable(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("unwritable")
    cluster = tmp / "cluster.yaml"
    folder = unwritable_dir(tmp)
    cluster.write_text(textwrap.dedent(CLUSTER.format(dir=folder)))
    try:
        out = sweep(tmp, "unwritable", strategies="[fsdp.full_shard]", inject="[null]", cluster=cluster)
    finally:
        (tmp / "ro").chmod(0o755)
    out["folder"] = folder
    return out


def test_a_truncated_checkpoint_fails_the_load_in_a_clear_record(truncated):
    assert truncated["code"] == 1 and not truncated["warnings"] and not truncated["problems"]
    assert set(truncated["docs"]) == {("ddp", "checkpoint_truncate"), ("fsdp2.full_shard", "checkpoint_truncate"),
                                      ("zero1", "checkpoint_truncate")}  # fmt: skip
    for (strategy, _), d in truncated["docs"].items():
        assert d["status"] == "error", (strategy, d["reason"])
        assert d["reason"].startswith("rank 0: checkpoint load failed: "), d["reason"]
        m, c = d["metrics"], d["metrics"]["checkpoint"]
        # the measured steps and the save are kept; what the load did not reach is null, with the load's reason
        assert m["step_time_s"]["median"] > 0 and len(m["losses"]) == 3
        assert c["save_s"] > 0 and c["bytes"] > 0 and c["files"] >= 1
        assert c["load_s"] is None and c["resume_loss_delta"] is None
        assert m["null_reasons"]["checkpoint.load_s"] == d["reason"]
    assert not (truncated["results"] / CHECKPOINTS_DIR).exists()


def test_an_unwritable_checkpoint_dir_is_a_clear_record(unwritable):
    assert unwritable["code"] == 1 and not unwritable["warnings"] and not unwritable["problems"]
    (d,) = unwritable["docs"].values()
    assert d["status"] == "error"
    assert d["reason"].startswith(f"rank 0: checkpoint dir {unwritable['folder']}/"), d["reason"]
    assert "cannot" in d["reason"]
    c = d["metrics"]["checkpoint"]
    assert d["metrics"]["step_time_s"]["median"] > 0  # the measured steps are kept
    assert c["dir"] == str(unwritable["folder"]) and c["save_s"] is None and c["bytes"] is None
    assert d["metrics"]["null_reasons"]["checkpoint.save_s"] == d["reason"]
