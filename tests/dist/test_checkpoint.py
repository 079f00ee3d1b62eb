"""The checkpoint phase (`checkpoint: true`, issue 34) on real gloo ranks, through the real sweep: every strategy family
saves its full training state its own way (DCP for FSDP/FSDP2, rank 0's torch.save for DDP, DeepSpeed's
save_checkpoint for ZeRO), reloads it into a fresh model and optimizer and trains on exactly as the uninterrupted run.

One sweep serves every assertion: ddp, fsdp.full_shard, fsdp2.full_shard, zero1, zero3 in fp32 and bf16 on 2 ranks,
and an FSDP2 hybrid on 4 (2 nodes x 2). The model has 1.0M parameters: large enough that each format's framing (DCP's
metadata and per-item records, torch.save's zip records, DeepSpeed's pickled client state and zero_to_fp32.py) stays
under 5% of the tensor bytes the planner predicts, small enough for a CPU step in tens of milliseconds.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from harness.cli import main
from harness.compare.judge import compare
from harness.core.catalogue import CATALOGUE
from harness.plan import checkpoint as ck
from harness.results.spec import spec_from_json
from harness.results.store import load_records
from harness.worker.checkpoint import CHECKPOINTS_DIR
from tests.conftest import load_docs

pytestmark = pytest.mark.dist

SCENARIO = """\
name: ckpt
models:
  ck1m: {d_model: 128, n_layers: 2, n_heads: 4, ffn: 352, vocab: 2048}
matrix:
  model: [ck1m]
  strategy: [ddp, fsdp.full_shard, fsdp2.full_shard, zero1, zero3]
  precision: [fp32, bf16]
  gpus: [2]
  include:
    - {model: ck1m, strategy: fsdp2.hybrid_shard, precision: bf16, gpus: 4}
settings: {warmup_steps: 2, measure_steps: 1}
"""
PARAMS = 2 * 2048 * 128 + 2 * (4 * 128 * 128 + 3 * 128 * 352 + 2 * 128) + 128
"""ck1m's parameters: embedding and head, two blocks (attention, SwiGLU, two norms), the final norm"""
FORMATS = {"ddp": "torch.save (rank 0)", "fsdp": "dcp", "fsdp2": "dcp", "zero": "deepspeed"}


@pytest.fixture(scope="module")
def sweep(tmp_path_factory):
    """The sweep, with `--checkpoint` (the scenario leaves the setting at its default)."""
    tmp = tmp_path_factory.mktemp("ckpt")
    scenario = tmp / "ckpt.yaml"
    scenario.write_text(textwrap.dedent(SCENARIO))
    results = tmp / "results"
    code = main(["sweep", str(scenario), "--checkpoint", "--results", str(results)])
    docs, warnings = load_docs(results)
    return {"code": code, "docs": {(d["spec"]["strategy"], d["spec"]["precision"]): d for d in docs},
            "warnings": warnings, "results": results}  # fmt: skip


def test_every_cell_is_ok_and_leaves_no_checkpoint_behind(sweep):
    assert sweep["code"] == 0 and not sweep["warnings"]
    assert len(sweep["docs"]) == 11
    assert {d["status"] for d in sweep["docs"].values()} == {"ok"}, [d["reason"] for d in sweep["docs"].values()]
    assert all(d["spec"]["checkpoint"] is True for d in sweep["docs"].values())
    assert not (sweep["results"] / "ckpt" / CHECKPOINTS_DIR).exists()


def _folder(d: dict) -> str:
    """The folder the cell's checkpoint was written to (harness.worker.checkpoint.checkpoint_root)."""
    return str(Path(d["metrics"]["checkpoint"]["dir"]) / f"{d['run_id']}.{d.get('attempt') or 'manual'}")


def test_bytes_are_the_prediction_plus_the_formats_framing(sweep):
    for (strategy, precision), d in sweep["docs"].items():
        c, p = d["metrics"]["checkpoint"], d["predicted"]
        family = CATALOGUE[strategy].family
        assert c["format"] == FORMATS[family], strategy
        # the planner's tensor bytes: fp32 params (or master) and two fp32 moments; ZeRO-1's module state beside them
        module = {"fp32": 4, "bf16": 2}[precision] * PARAMS if strategy == "zero1" else 0
        spec = spec_from_json(d["spec"])
        assert ck.tensor_bytes(spec) == 12 * PARAMS + module, (strategy, precision)
        if family in ck.DCP_FAMILIES:  # DCP: every byte predicted, the folder's path aside (issue 48)
            assert p["checkpoint_bytes"] == ck.dcp_bytes(spec) > 12 * PARAMS
            assert c["bytes"] == ck.dcp_bytes(spec, folder=_folder(d)), (strategy, precision)
        else:  # framing only adds: every other format writes all the tensor bytes and a little more (< 5%)
            assert p["checkpoint_bytes"] == 12 * PARAMS + module, (strategy, precision)
            assert 0 <= c["bytes"] - p["checkpoint_bytes"] < 0.05 * p["checkpoint_bytes"], (strategy, c["bytes"])
        assert p["checkpoint_bytes_deviation"] == pytest.approx(c["bytes"] / p["checkpoint_bytes"] - 1)
        assert p["checkpoint_s"] is None and "storage.write_gbps" in p["checkpoint_null_reasons"]["checkpoint_s"]


SMOKE = """\
name: ckpt-smoke
matrix: {model: [tiny], strategy: [fsdp.full_shard, fsdp2.full_shard], precision: [fp32], gpus: [2]}
settings: {warmup_steps: 2, measure_steps: 1}
"""


def test_the_smoke_models_dcp_checkpoint_is_predicted_to_the_byte(tmp_path, record_property):
    """Issue 48, item 11: on the smoke model (tiny, 1,994,496 tensor bytes) FSDP's and FSDP2's DCP checkpoints
    were 2,283,5xx bytes against 1,994,496 predicted (+14.5%): DCP writes every chunk as its own torch.save
    archive and a metadata file beside them. The prediction now counts both; with the folder's path, which the
    metadata names and the planner cannot know, it is the checkpoint's size exactly."""
    scenario = tmp_path / "ckpt-smoke.yaml"
    scenario.write_text(SMOKE)
    assert main(["sweep", str(scenario), "--checkpoint", "--results", str(tmp_path / "results")]) == 0
    docs, warnings = load_docs(tmp_path / "results")
    assert not warnings and sorted(d["spec"]["strategy"] for d in docs) == ["fsdp.full_shard", "fsdp2.full_shard"]
    for d in docs:
        c, p, spec = d["metrics"]["checkpoint"], d["predicted"], spec_from_json(d["spec"])
        assert d["status"] == "ok" and c["files"] == 3  # two ranks' .distcp and the .metadata
        assert ck.tensor_bytes(spec) == 1_994_496 < p["checkpoint_bytes"] == ck.dcp_bytes(spec)
        assert c["bytes"] == ck.dcp_bytes(spec, folder=_folder(d))
        assert 0 < c["bytes"] - p["checkpoint_bytes"] < 200  # the folder's path: each component, its length and 3 B
        note = f"{spec.strategy}: measured {c['bytes']:,} B, predicted {p['checkpoint_bytes']:,} B (without the folder)"
        record_property(spec.strategy, note)
        print(note)


def test_files_follow_the_format(sweep):
    files = {k: d["metrics"]["checkpoint"]["files"] for k, d in sweep["docs"].items()}
    assert files[("ddp", "fp32")] == 1  # rank 0's one file
    assert files[("fsdp.full_shard", "bf16")] == files[("fsdp2.full_shard", "fp32")] == 3  # 2 shards + .metadata
    assert files[("fsdp2.hybrid_shard", "bf16")] == 5  # 4 ranks' files (replicas deduplicated) + .metadata
    # DeepSpeed: latest, zero_to_fp32.py, the module states and one optimizer partition per rank (at least)
    assert files[("zero1", "fp32")] >= 5 and files[("zero3", "bf16")] >= 5


def test_training_resumes_exactly_after_the_reload(sweep):
    for key, d in sweep["docs"].items():
        c, s = d["metrics"]["checkpoint"], d["spec"]
        assert c["step"] == s["warmup_steps"] + s["measure_steps"] + 2  # after the memory and the counted steps
        assert abs(c["resume_loss_delta"]) <= 1e-6, key
        assert len(c["resume_losses"]) == 2 and all(0 < x < 10 for x in c["resume_losses"])
        assert c["resume_losses"][1] < d["metrics"]["losses"][0]  # trained on, from the saved state


def test_every_ranks_time_is_kept_and_the_slowest_reported(sweep):
    for key, d in sweep["docs"].items():
        c = d["metrics"]["checkpoint"]
        assert len(c["save_s_per_rank"]) == len(c["load_s_per_rank"]) == d["spec"]["gpus"], key
        assert c["save_s"] == max(c["save_s_per_rank"]) > 0 and c["load_s"] == max(c["load_s_per_rank"]) > 0


def test_compare_judges_the_bytes_exactly_and_the_times_as_timing(sweep):
    records, _ = load_records(sweep["results"])
    cmp = compare(records, records)
    rows = {(c.label, m.metric): m for c in cmp.cells for m in c.metrics}
    byte_rows = [m for (_, name), m in rows.items() if name == "checkpoint.bytes"]
    save_rows = [m for (_, name), m in rows.items() if name == "checkpoint.save_s"]
    assert len(byte_rows) == len(save_rows) == 11
    assert {m.kind for m in byte_rows} == {"exact"} and {m.verdict for m in byte_rows} == {"unchanged"}
    assert {m.kind for m in save_rows} == {"sampled"}
