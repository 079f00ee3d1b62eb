"""`harness history check --confirm K` on a real tiny sweep (issue 20): the flagged cells are re-run for real (from
the results dir's manifest) and judged again on the re-runs, so a one-off slow night does not fail and a real
slowdown does.

Cheap by construction: one real sweep of two cells — `ddp fp32` as it is, `ddp bf16` with a real slowdown
injected on rank 0 (`inject: {fault: slow, factor: 8, rank: 0}`) — and a history made of edited
copies of those two records (ten
nights, lognormal spread of 15% from evenly spaced quantiles, the slowed cell's copies at its time / 8, i.e. where
it runs without the fault). Tonight, `ddp fp32`'s record is edited 8x slower: a transient that its real re-runs
do not repeat; `ddp bf16` is really slow and its re-runs are too. The factor 8 and the wide history band (15%
noise) keep the verdicts clear of this loaded machine's run-to-run noise; the one-off's re-run in a fresh process
also gets thresholds of 4x (LOAD_PROOF)."""

from __future__ import annotations

import copy
import datetime as dt
import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from scipy.stats import norm

from harness.cli import main
from harness.results.store import atomic_write_json
from tests.conftest import load_docs, read_doc

pytestmark = pytest.mark.dist

SCENARIO = """\
name: conf
matrix:
  model: [tiny]
  strategy: [ddp]
  precision: [fp32, bf16]
  gpus: [2]
  include:
    - {model: tiny, strategy: ddp, precision: bf16, gpus: 2, inject: {fault: slow, factor: 8, rank: 0}}
settings: {micro_batch: 2, seq_len: 32, warmup_steps: 2, measure_steps: 5}
"""
NOISE = np.exp(0.15 * np.random.default_rng(3).permutation(norm.ppf((np.arange(10) + 0.5) / 10)))
"""ten nights' run-to-run factors: σ 15% in log, no extreme draw"""


def scaled(rec: dict, factor: float, *, when: dt.datetime, attempt: str) -> dict:
    """A copy of a real record as if its steps took `factor` times as long (throughputs 1/factor; memory too
    spread by the factor, so the history has a memory band as well), finished at `when`."""
    out = copy.deepcopy(rec)
    m = out["metrics"]
    st = m["step_time_s"]
    for k in ("median", "p10", "p90", "mean"):
        st[k] *= factor
    st["samples"] = [s * factor for s in st["samples"]]
    for k in ("tokens_per_s", "tokens_per_s_per_gpu", "tflops_per_gpu", "mfu"):
        if m.get(k) is not None:
            m[k] /= factor
    if m.get("peak_memory_allocated_gib") is not None:
        m["peak_memory_allocated_gib"] *= factor ** (1 / 3)
    out["finished_at"] = out["started_at"] = when.isoformat(timespec="seconds")
    out["attempt"] = attempt
    out.pop("_path", None)
    return out


@pytest.fixture(scope="module")
def night(tmp_path_factory) -> dict:
    root = tmp_path_factory.mktemp("confirm")
    scenario = root / "conf.yaml"
    scenario.write_text(SCENARIO)
    results = root / "results"
    assert main(["sweep", str(scenario), "--results", str(results)]) == 0
    records, _ = load_docs(results)
    by_precision = {r["spec"]["precision"]: r for r in records}
    assert by_precision["bf16"]["spec"]["inject"] == {"fault": "slow", "factor": 8, "rank": 0}
    db = str(root / "h.db")
    start = dt.datetime.fromisoformat(by_precision["fp32"]["started_at"]) - dt.timedelta(days=11)
    for n, f in enumerate(NOISE):
        when = start + dt.timedelta(days=n)
        folder = root / f"night{n}" / "conf"
        for p, rec in by_precision.items():
            base = 1 / 8 if p == "bf16" else 1.0  # the slowed cell's history: where it runs without the fault
            atomic_write_json(folder / f"{rec['run_id']}.json", scaled(rec, base * f, when=when, attempt=f"n{n}{p}"))
        assert main(["history", "add", "--db", db, str(folder.parent), "--label", f"night{n}"]) == 0
    return {"results": results, "db": db, "records": by_precision, "root": root}


def tonight(night: dict, name: str, *, keep_slowed: bool) -> Path:
    """A copy of the real sweep's results dir (manifest included) with `ddp fp32` edited 8x slower; without
    `keep_slowed` the really slowed `ddp bf16` cell's record is left out."""
    dest = night["root"] / name
    shutil.copytree(night["results"], dest)
    fast = night["records"]["fp32"]
    path = dest / "conf" / f"{fast['run_id']}.json"
    rec = read_doc(path)
    atomic_write_json(
        path, scaled(rec, 8.0, when=dt.datetime.fromisoformat(rec["finished_at"]), attempt=rec["attempt"])
    )
    if not keep_slowed:
        (dest / "conf" / f"{night['records']['bf16']['run_id']}.json").unlink()
    return dest


LOAD_PROOF = tuple(
    a
    for m, t in (("step_time_s", 3.0), ("tokens_per_s", 0.75), ("tokens_per_s_per_gpu", 0.75), ("mfu", 0.75))
    for a in ("--threshold", f"{m}={t}")
)
"""for the one-off only (the test whose only flagged cell is the edited fp32 one): thresholds a timing must also
exceed to count, 4x slower (step time +300 %, throughputs -75 %). The edited 8x stays well beyond them; a re-run on
this 2-core host with the other pytest run beside it does not reach them: the tiny cell's 5-10 ms steps once re-ran
at 28.2 ms/step, and with the default 5 % threshold that re-run was judged a regression that persisted (2026-12-04,
CI of 58059eb). Not for the injected slowdown: its re-runs measured under 4x its history once (CI of 8a77426)."""


def check(night: dict, results: Path, capsys, *args: str) -> tuple[int, dict]:
    code = main(["history", "check", "--db", night["db"], str(results), "--format", "json", *args])
    return code, json.loads(capsys.readouterr().out)


def test_a_real_slowdown_persists_and_fails_a_one_off_does_not(night, capsys):
    results = tonight(night, "both", keep_slowed=True)
    code, first = check(night, results, capsys)
    assert code == 1 and first["summary"]["regressions"] == 2  # two cells (their timing metrics), counted as cells
    code, out = check(night, results, capsys, "--confirm", "2")
    assert code == 1, out
    by = {c["label"].split()[2]: c for c in out["cells"]}
    one_off, real = by["fp32"], by["bf16"]
    assert one_off["confirm"]["persisted"] is False and real["confirm"]["persisted"] is True
    assert "step_time_s" in one_off["confirm"]["first"] and one_off["confirm"]["runs"] == 2 and one_off["runs"] == 2
    assert all(m["verdict"] != "regression" for m in one_off["metrics"])
    slow = {m["metric"]: m for m in real["metrics"]}["step_time_s"]
    assert slow["verdict"] == "regression" and slow["change"] > 3  # ~8x its unslowed history
    assert out["summary"]["regressions"] == 1
    assert (out["summary"]["confirmed"], out["summary"]["not_confirmed"]) == (1, 1)
    rid = night["records"]["fp32"]["run_id"]
    reruns = sorted(p.name for p in (results / "conf").glob(f"{rid}*.json"))
    assert reruns == [f"{rid}.json", f"{rid}.r2.json", f"{rid}.r3.json"]  # the re-runs, beside the first run
    assert [read_doc(results / "conf" / n).get("repeat") for n in reruns] == [None, 2, 3]


def test_confirm_needs_the_sweeps_manifest(night, tmp_path, capsys):
    results = tonight(night, "no-manifest", keep_slowed=False)
    (results / "conf" / "manifest.json").unlink()
    code = main(["history", "check", "--db", night["db"], str(results), "--confirm", "2"])
    err = capsys.readouterr().err
    assert code == 2 and "--confirm: no sweep manifest beside this record" in err
    assert main(["history", "check", "--db", night["db"], str(results), "--confirm", "-1"]) == 2
    assert "--confirm: -1 is not a whole number of runs per cell from 1 to 100" in capsys.readouterr().err


def test_json_on_stdout_stays_one_document_while_cells_re_run(night):
    """A fresh `harness` process (as CI runs it, `| jq`): the re-runs import the strategies' libraries and fork
    ranks that write to stdout (DeepSpeed prints "Setting accelerator to CPU" on import); --format json's stdout
    must still be the one JSON document, everything else on stderr."""
    import subprocess
    import sys

    results = tonight(night, "subprocess", keep_slowed=False)
    proc = subprocess.run(
        [sys.executable, "-m", "harness.cli", "history", "check", "--db", night["db"], str(results)]
        + ["--format", "json", "--confirm", "1", *LOAD_PROOF],
        capture_output=True,
        text=True,
        cwd=Path(__file__).resolve().parents[2],
    )
    doc = json.loads(proc.stdout)  # NOTE: the assertion: stdout parses whole
    assert proc.returncode == 0, proc.stderr[-2000:]
    (cell,) = [c for c in doc["cells"] if c.get("confirm")]
    assert cell["confirm"] == {"runs": 1, "first": cell["confirm"]["first"], "persisted": False}
    assert "--confirm: re-running 1 flagged cell(s) 1 time(s)" in proc.stderr
