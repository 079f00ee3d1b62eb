"""The best-strategy table's verdict (harness.report.leader): judged on runs (compare's run-level test) when each
cell was measured at least 3 times, else on a results history's between-run noise, else not judged — never on one
run's per-step samples (two sweeps of one commit crowned opposite leaders that way: issue 31)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from harness.compare.stats import run_level_p
from harness.report import build_report
from harness.report.leader import HISTORY, NOT_JUDGED, RUNS, Contest, Noise, leader_verdict
from harness.results.store import record_name
from tests.unit.test_report import md_rows, md_section


def test_one_run_a_side_is_not_judged_however_large_the_lead():
    v = leader_verdict(Contest(leader_runs=[200.0], runner_runs=[100.0]))
    assert (v.basis, v.distinguishable, v.p, v.n_runs) == (NOT_JUDGED, None, None, (1, 1))
    assert v.text() == "single run: lead not judged"
    two = leader_verdict(Contest(leader_runs=[200.0, 190.0], runner_runs=[100.0]))
    assert two.basis == NOT_JUDGED and two.text() == "2 vs 1 runs: lead not judged (3 a side needed, or a history)"


def test_three_runs_a_side_use_compares_run_level_test():
    a, b = [110.0, 111.0, 109.5], [100.0, 100.5, 99.0]
    v = leader_verdict(Contest(leader_runs=a, runner_runs=b))
    assert v.basis == RUNS and v.p == run_level_p(a, b) and v.p < 0.05 and v.distinguishable is True
    assert v.text() == f"p={v.p:.2g}, 3 vs 3 runs"
    # the leader's third run slower than the runner-up: the lead is noise
    noisy = leader_verdict(Contest(leader_runs=[110.0, 66.0, 130.0], runner_runs=b))
    assert noisy.basis == RUNS and noisy.distinguishable is False and noisy.text().startswith("not distinguishable, p=")


def test_history_noise_judges_single_runs():
    quiet = Noise(sigma=0.02, n=12)
    v = leader_verdict(Contest(leader_runs=[110.0], runner_runs=[100.0], leader_noise=quiet, runner_noise=quiet))
    z = math.log(1.1) / math.sqrt(2 * 0.02**2)
    assert v.basis == HISTORY and v.p == pytest.approx(math.erfc(z / math.sqrt(2)), rel=1e-12)
    assert v.distinguishable is True
    assert v.text() == f"p={v.p:.2g}, 1 vs 1 runs, history noise 2.0% / 2.0% (12 / 12 runs)"
    loud = Noise(sigma=0.10, n=12)
    w = leader_verdict(Contest(leader_runs=[110.0], runner_runs=[100.0], leader_noise=loud, runner_noise=quiet))
    assert w.basis == HISTORY and w.distinguishable is False and w.p > 0.05
    # a history of one cell only is no basis: both cells' noise is needed
    one = leader_verdict(Contest(leader_runs=[110.0], runner_runs=[100.0], leader_noise=quiet))
    assert one.basis == NOT_JUDGED
    # three runs a side: the runs decide, the history is not used
    runs = leader_verdict(
        Contest(leader_runs=[110.0] * 3, runner_runs=[100.0] * 3, leader_noise=loud, runner_noise=loud)
    )
    assert runs.basis == RUNS and runs.p == 0.0


@settings(max_examples=60, deadline=None)
@given(
    runs=st.lists(st.integers(1, 10**6).map(float), min_size=1, max_size=6),
    other=st.lists(st.integers(1, 10**6).map(float), min_size=1, max_size=6),
    scale=st.sampled_from([2.0**-8, 0.5, 2.0, 1024.0]),
    sigma=st.floats(0.001, 0.5),
)
def test_verdict_is_unit_free_and_only_judged_with_a_basis(runs, other, scale, sigma):
    """Scaling both sides' throughput by one factor (exact: a power of two) changes no verdict; with
    fewer than 3 runs a side and no history, nothing is ever judged."""
    noise = Noise(sigma=sigma, n=10)
    for n1, n2 in ((None, None), (noise, noise)):
        v = leader_verdict(Contest(runs, other, n1, n2))
        w = leader_verdict(Contest([x * scale for x in runs], [x * scale for x in other], n1, n2))
        assert (v.basis, v.distinguishable) == (w.basis, w.distinguishable)
        if v.p is not None:
            assert w.p == pytest.approx(v.p, abs=1e-9)
        if min(len(runs), len(other)) < 3 and n1 is None:
            assert v.basis == NOT_JUDGED and v.distinguishable is None


# --- issue 48, item 7: the cells that compete, and on what value -------------------------------------------------

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "records" / "fixture-h100"
TEMPLATE = "125m-zero2-bf16-g2-ddf42619a1.json"


def _write_runs(folder: Path, strategy: str, gpus: int, steps: int, values: list[float], *, at: int) -> None:
    """The runs (repeat 1, 2, …) of one cell of a `harness tune` search's folder: `strategy` at `gpus`, timed with
    `steps` steps, each run's tokens/s/GPU, finishing one minute apart from minute `at`."""
    doc = json.loads((FIXTURE / TEMPLATE).read_text())
    run_id = f"125m-{strategy}-bf16-g{gpus}-steps{steps}"
    for k, tps in enumerate(values, 1):
        rec = json.loads(json.dumps(doc))
        rec.update(run_id=run_id, sweep="s-tune", finished_at=f"2026-12-01T02:{at + k:02d}:00+00:00")
        rec["spec"].update(strategy=strategy, world_size=gpus, measure_steps=steps)
        rec["metrics"]["tokens_per_s_per_gpu"] = tps
        if k > 1:
            rec["repeat"] = k
        (folder / record_name(run_id, k)).write_text(json.dumps(rec))


def test_a_tune_search_crowns_its_finalist_not_a_fast_screening_run(tmp_path):
    """A `harness tune` folder, as issue 48 found it: zero2 won at a median 5,489 tok/s/GPU over three 5-step runs;
    its own 2-step round-0 trial ran 6,954 once, and ddp's 2-step trial, eliminated in round 0, 7,100 once. The
    best-strategy table crowned neither tune's winner nor its figure: it pooled runs of 2 and 5 steps as runs of
    one cell (6 vs 1 runs) and ranked cells by their last run. Now each step count is a cell of its own, a cell's
    value is its runs' median, and only the cells timed with the most steps compete: zero2 at 5,489 over zero1's
    5,000 (tune's runner-up), judged on their 3 runs each; the three 2-step cells are counted, not compared. At 4
    GPUs only zero2 reached the final round: it leads, uncrowned, with no runner-up."""
    folder = tmp_path / "results" / "s-tune"
    folder.mkdir(parents=True)
    _write_runs(folder, "ddp", 2, 2, [7100.0], at=0)
    _write_runs(folder, "zero2", 2, 2, [6954.0], at=1)
    _write_runs(folder, "zero1", 2, 2, [5200.0], at=2)
    _write_runs(folder, "zero2", 2, 5, [5300.0, 5489.0, 5700.0], at=3)
    _write_runs(folder, "zero1", 2, 5, [5000.0, 5100.0, 4900.0], at=6)
    _write_runs(folder, "ddp", 4, 2, [9000.0], at=10)
    _write_runs(folder, "zero2", 4, 5, [4000.0, 4100.0, 4200.0], at=11)
    result = build_report([tmp_path / "results"], out=tmp_path / "out")
    best = {int(b["gpus"]): b for b in result["best"].to_dict("records")}
    b = best[2]
    assert (b["strategy"], b["variant"], b["tokens_per_s_per_gpu"]) == ("zero2", "steps=5", 5489.0)
    assert (b["runner_up"], b["runner_up_tokens_per_s_per_gpu"]) == ("zero1", 5000.0)
    p = run_level_p([5300.0, 5489.0, 5700.0], [5000.0, 5100.0, 4900.0])
    assert b["basis"] == RUNS and b["p_value"] == pytest.approx(p, rel=1e-12)
    assert b["verdict"] == f"p={p:.2g}, 3 vs 3 runs" and b["distinguishable"] is (p < 0.05)
    assert (b["measure_steps"], b["n_shorter"], b["n_ok"], b["n_cells"]) == (5, 3, 5, 5)
    four = best[4]
    assert (four["strategy"], four["tokens_per_s_per_gpu"], four["n_shorter"]) == ("zero2", 4100.0, 1)
    assert pd.isna(four["runner_up"]) and four["basis"] == NOT_JUDGED
    assert four["verdict"] == "other strategies measured with fewer than 5 steps only"
    md = result["paths"]["markdown"].read_text()
    rows = {r[1]: r for r in md_rows(md_section(md, "## Best strategy per model and GPU count"))}
    assert rows["2"][2:6] == ["zero2", "bf16", "steps=5", "5,489"]
    assert rows["2"][-1] == "5 of 5; 3 with fewer than 5 steps not compared"
    assert rows["4"][2] == "zero2" and rows["4"][8].startswith("not judged (other strategies measured with fewer")
    # the model table: each step count its own row; no ★ at 4 GPUs (the lead was not judged against anything)
    four_gpus = md_rows(md_section(md, "### 125m · 4 GPUs"))
    assert [r[:3] for r in four_gpus] == [["ddp", "bf16", "steps=2"], ["zero2", "bf16", "steps=5"]]
    assert not any("★" in c for r in four_gpus for c in r)
