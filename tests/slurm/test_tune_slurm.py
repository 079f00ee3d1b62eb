"""`harness tune --pack` on the real localhost SLURM cluster: each batch of trials is submitted as packed jobs, every
trial ends in its record with its job, and the winner file is a scenario that sweeps on the same cluster."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from harness.results.store import load_records
from harness.scenario.schema import load_scenario
from harness.tune.log import check_tune_log
from tests.slurm.conftest import write

pytestmark = pytest.mark.slurm

REPO = Path(__file__).resolve().parents[2]

SCENARIO = """\
    name: tslurm
    matrix: {model: [tiny], strategy: [ddp, fsdp.full_shard, fsdp2.full_shard], precision: [fp32], gpus: [2]}
    settings: {warmup_steps: 2, measure_steps: 3, time_limit_s: 60}
    tune: {first_round: 3, confirm_runs: 2, max_runs: 2}
"""


def test_tune_on_slurm_packs_each_batch_and_finds_a_winner(slurm_cluster, tmp_path, slurm_timings):
    sc = write(tmp_path / "tslurm.yaml", SCENARIO)
    results = tmp_path / "results"
    cmd = ["tune", str(sc), "--cluster", "local-slurm", "--results", str(results), "--pack", "--format", "json"]
    cmd.append("--no-calibrate")  # NOTE: three candidates, all measured: no ranking needed
    t0 = time.perf_counter()
    p = subprocess.run(
        [sys.executable, "-m", "harness.cli", *cmd], cwd=REPO, capture_output=True, text=True, timeout=600
    )
    slurm_timings["tune --pack (3 candidates, 7 trials)"] = time.perf_counter() - t0
    assert p.returncode == 0, p.stderr[-3000:]
    log = check_tune_log(json.loads(p.stdout))
    (g,) = log.groups
    fates = [(c.label, c.fate, c.reason) for c in g.candidates]  # why, when a trial failed ("alone")
    assert g.verdict in ("ahead", "tied") and g.steps == [2, 3], fates
    # 3 candidates at 2 steps, then the final two at 3 steps, 2 runs each
    assert log.trials == 3 + 2 * 2
    records, warnings = load_records(results / "tslurm-tune")
    assert not warnings and len(records) == 7 and {r.status for r in records} == {"ok"}
    # round 0's three trials share one job (a pack), in positions 1..3
    first = [r for r in records if r.spec.settings.measure_steps == 2]
    (job,) = {r.env.slurm_job_id for r in first}
    assert sorted(r.env.slurm_pack.position for r in first if r.env.slurm_pack) == [1, 2, 3]
    # the final runs ran as SLURM jobs too, each finalist's run 2 after its run 1
    final = [r for r in records if r.spec.settings.measure_steps == 3]
    assert len(final) == 4 and all(r.env.slurm_job_id not in (None, job) for r in final)
    (spec,) = load_scenario(log.field("tuned_file")).expand(gpus_per_node=2)
    assert spec.run_id == g.winner
