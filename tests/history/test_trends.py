"""`harness report --history DB`: the trends data (bands, change points, runs out of band) from a real store,
SQLite and PostgreSQL alike, and the trends section of the HTML report in a real headless Chromium."""

from __future__ import annotations

import random
import re
from pathlib import Path

import numpy as np
import pytest

from harness.cli import main
from harness.history.store import open_store
from harness.history.trends import bands, trend_series
from harness.history.verdicts import Rules
from tests.history.conftest import make_record, write_night

CELLS = (("ddp", "fp32"), ("fsdp", "bf16"), ("deepspeed_zero2", "fp32"))
NIGHTS, STEP_NIGHT, STEP = 16, 11, 1.3


def _history(tmp_path: Path, db: str) -> Path:
    """16 nights of three cells with 3% lognormal noise; ddp's step time rises by 30% from night 11 on. Returns
    the last night's results dir."""
    rng = random.Random(1)
    for night in range(NIGHTS):
        recs = []
        for strategy, precision in CELLS:
            base = 0.02 * (STEP if strategy == "ddp" and night >= STEP_NIGHT else 1.0)
            step = base * rng.lognormvariate(0, 0.03)
            recs.append(make_record(strategy=strategy, precision=precision, night=night, step_s=step))
        results = write_night(tmp_path / f"night{night}", recs)
        assert main(["history", "add", "--db", db, str(results), "--label", f"c{night}"]) == 0
    return results


def test_bands_follow_the_judges_out_of_band_rule():
    rules = Rules()
    quiet = [1.0, 1.001, 0.999, 1.0, 1.002, 0.998, 1.0]
    b = bands([*quiet, 1.2], lower_is_better=True, threshold=0.05, rules=rules)
    assert b[:5] == [None] * 5  # fewer than min_history values before them
    level, lo, hi = b[5]
    assert level == pytest.approx(1.0)  # median of the five before
    # 4·σ·(1 + 4/4) is under the threshold here: the band is the 5% threshold, symmetric in log space
    assert (lo, hi) == (pytest.approx(1 / 1.05), pytest.approx(1.05))
    assert not b[-1][1] <= 1.2 <= b[-1][2]
    # noisier: the band is k·σ·inflation, σ = 1.4826 · median |night-to-night log difference| / √2
    noisy = [1.0, 1.04, 0.97, 1.02, 1.05]
    (level, lo, hi) = bands([*noisy, 1.0], lower_is_better=True, threshold=0.05, rules=rules)[5]
    y = np.log(noisy)
    sigma = 1.4826 * np.median(np.abs(np.diff(y))) / np.sqrt(2)
    half = 4 * sigma * (1 + 4 / 4)
    assert level == pytest.approx(1.02)
    assert (lo, hi) == (pytest.approx(1.02 * np.exp(-half)), pytest.approx(1.02 * np.exp(half)))
    # throughput (higher is better) gets the same band, mirrored
    up = bands([1 / v for v in quiet], lower_is_better=False, threshold=0.05, rules=rules)
    assert up[5][0] == pytest.approx(1.0) and up[5][1] == pytest.approx(1 / 1.05)


def test_trend_series_marks_the_step_in_sqlite_and_postgresql(tmp_path, db_url):
    _history(tmp_path, db_url)
    with open_store(db_url) as store:
        t = trend_series(store)
    assert (t["metric"], t["unit"], t["lower_is_better"]) == ("step_time_s", "s", True)
    by_strategy = {s["label"].split()[1]: s for s in t["series"]}
    assert set(by_strategy) == {s for s, _ in CELLS}
    ddp = by_strategy["ddp"]
    assert len(ddp["runs"]) == NIGHTS
    assert [r["label"] for r in ddp["runs"]] == [f"c{n}" for n in range(NIGHTS)]
    assert all(r["band"] is None for r in ddp["runs"][:5]) and all(r["band"] for r in ddp["runs"][5:])
    (cp,) = ddp["change_points"]
    assert (cp["index"], cp["label"]) == (STEP_NIGHT, f"c{STEP_NIGHT}")
    assert cp["after"] / cp["before"] == pytest.approx(STEP, rel=0.05)
    assert STEP_NIGHT in ddp["out_of_band"] and NIGHTS - 1 in ddp["out_of_band"]
    for strategy in ("fsdp", "deepspeed_zero2"):
        assert by_strategy[strategy]["change_points"] == []
        assert [i for i in by_strategy[strategy]["out_of_band"] if i >= STEP_NIGHT] == []


def test_unknown_history_is_exit_2(tmp_path, capsys):
    results = write_night(tmp_path / "r", [make_record()])
    assert main(["report", str(results), "--history", str(tmp_path / "nope.db"), "-o", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert "nope.db" in err and "Traceback" not in err
    assert not (tmp_path / "out").exists()


@pytest.mark.chromium
def test_trends_section_in_chromium(tmp_path):
    from tests.unit.test_report_chromium import _body_attrs, _find_chromium, _run

    chromium = _find_chromium()
    if chromium is None:
        pytest.skip("chromium is not installed (tests/unit/test_report_chromium.py installs it as root)")
    db = str(tmp_path / "history.db")
    last = _history(tmp_path, db)
    out = tmp_path / "report"
    assert main(["report", str(last), "--history", db, "-o", str(out)]) == 0
    proc = _run(chromium, tmp_path, "--window-size=1400,1000", "--dump-dom", (out / "index.html").resolve().as_uri())
    attrs = _body_attrs(proc)
    assert attrs.get("data-images-loaded") == attrs.get("data-images-total"), attrs
    dom = proc.stdout
    assert '<figure id="fig-trends">' in dom
    section = dom[dom.index('id="trends"') :]
    rows = re.findall(r"<tr>(.*?)</tr>", section[: section.index("</table>")], re.S)
    assert len(rows) == 1 + len(CELLS)  # header + one row per cell
    ddp = next(r for r in rows if "ddp fp32" in r)
    assert f"run {STEP_NIGHT + 1} (c{STEP_NIGHT})" in ddp
    # the runs column's hover title lists every run with its label
    assert re.search(r'title="1: 2026-01-01T02:00:00Z \[c0\]', ddp)
