"""The report's exact Mann–Whitney U (harness.report.leader.exact_p) against scipy's: the same floats, and the
best-strategy table of a real smoke sweep (5 step samples per cell: the exact test) without importing
scipy.stats."""

from __future__ import annotations

import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest
from scipy.stats import mannwhitneyu

from harness.report.leader import EXACT_MAX, _is_exact, exact_p

ROOT = Path(__file__).resolve().parents[2]


def test_exact_p_is_scipys_float():
    rng = np.random.default_rng(7)
    for _ in range(300):
        n1, n2 = int(rng.integers(1, EXACT_MAX + 1)), int(rng.integers(1, 13))
        if rng.random() < 0.5:
            n1, n2 = n2, n1
        xs, ys = rng.normal(0, 1, n1).tolist(), rng.normal(2 * rng.random(), 1, n2).tolist()
        assert _is_exact(xs, ys)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            ref = float(mannwhitneyu(xs, ys, alternative="two-sided").pvalue)
        assert exact_p(xs, ys) == ref, (xs, ys)
    assert exact_p(list(range(7)), list(range(10, 17))) == pytest.approx(2 / 3432)
    assert exact_p([1.0, 2.0], [1.5, 2.5]) == pytest.approx(2 / 3)
    assert exact_p([1.0, 4.0], [2.0, 3.0]) == 1.0  # U1 = U2: 2 × P(U ≤ 2) > 1, clipped
    assert not _is_exact([1.0, 1.0], [2.0]) and not _is_exact(list(range(9)), list(range(10, 19)))


def test_best_table_of_a_smoke_sweep_does_not_import_scipy_stats():
    if not any((ROOT / "baselines" / "smoke-local").rglob("*.json")):
        pytest.skip("baselines/smoke-local has no records")
    code = (
        "import sys\n"
        "from harness.report.frame import best_per_model_gpus, cell_table, load_frame\n"
        "df, _ = load_frame('baselines/smoke-local')\n"
        "best = best_per_model_gpus(cell_table(df)[0], df)\n"
        "print(best['p_value'].notna().sum(), 'scipy.stats' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["2", "False"]  # two leaders tested, and scipy.stats never loaded
