"""`harness report --history DB`: a best-strategy lead between cells measured once is judged against the two
cells' between-run noise in a real SQLite history (harness.history.noise), and says so; without the history the
same results are "single run: lead not judged"."""

from __future__ import annotations

import math
import random
from pathlib import Path

import pytest

from harness.cli import main
from harness.history.metric_judge import INFLATE, noise_sigma
from harness.history.noise import cell_noise
from harness.history.store import open_store
from tests.history.conftest import make_record, write_night
from tests.unit.test_report import md_rows, md_section

NIGHTS = 8


def _history(tmp_path: Path, db: str, *, sigma: float) -> dict[str, list[float]]:
    """NIGHTS nights of ddp (0.020 s) and zero2 (0.021 s) with lognormal noise `sigma`; their step times."""
    rng = random.Random(7)
    steps: dict[str, list[float]] = {"ddp": [], "deepspeed_zero2": []}
    for night in range(NIGHTS):
        recs = []
        for strategy, base in (("ddp", 0.020), ("deepspeed_zero2", 0.021)):
            step = base * rng.lognormvariate(0, sigma)
            steps[strategy].append(step)
            recs.append(make_record(strategy=strategy, night=night, step_s=step))
        assert main(["history", "add", "--db", db, str(write_night(tmp_path / f"n{night}", recs))]) == 0
    return steps


def _best_row(tmp_path: Path, args: list[str]) -> list[str]:
    tonight = write_night(
        tmp_path / "tonight",
        [
            make_record(strategy="ddp", night=NIGHTS, step_s=0.020),
            make_record(strategy="deepspeed_zero2", night=NIGHTS, step_s=0.022),
        ],
    )
    out = tmp_path / f"report{len(args)}"
    assert main(["report", str(tonight), "-o", str(out), *args]) == 0
    rows = md_rows(md_section((out / "report.md").read_text(), "## Best strategy per model and GPU count"))
    assert len(rows) == 1
    return rows[0]


@pytest.mark.parametrize("sigma, crowned", [(0.005, True), (0.10, False)])
def test_a_single_run_lead_is_judged_on_the_history_noise(tmp_path, sigma, crowned):
    db = str(tmp_path / "h.sqlite")
    steps = _history(tmp_path, db, sigma=sigma)
    with open_store(db) as store:
        noise = cell_noise(store)
    expected = {}
    for strategy, values in steps.items():
        y = [math.log(v) for v in values]
        expected[strategy] = noise_sigma(y) * (1 + INFLATE / (len(y) - 1))
    by_strategy = {key[0].split("-")[1]: value for key, value in noise.items()}
    assert by_strategy == {s: (pytest.approx(e, rel=1e-12), NIGHTS) for s, e in expected.items()}

    plain = _best_row(tmp_path, [])
    assert plain[7] == "10.0% slower (single run: lead not judged)" and plain[8] == "not judged"

    judged = _best_row(tmp_path, ["--history", db])
    z = math.log(0.022 / 0.020) / math.sqrt(expected["ddp"] ** 2 + expected["deepspeed_zero2"] ** 2)
    p = math.erfc(z / math.sqrt(2))
    assert judged[8] == "history noise" and (p < 0.05) is crowned
    noise_text = f"history noise {expected['ddp']:.1%} / {expected['deepspeed_zero2']:.1%} ({NIGHTS} / {NIGHTS} runs)"
    if crowned:
        assert judged[2] == "ddp" and judged[7] == f"10.0% slower (p={p:.2g}, 1 vs 1 runs, {noise_text})"
    else:
        assert judged[2] == "ddp ≈ deepspeed_zero2"
        assert judged[7] == f"≈ 10.0% slower (not distinguishable, p={p:.2g}, 1 vs 1 runs, {noise_text})"
