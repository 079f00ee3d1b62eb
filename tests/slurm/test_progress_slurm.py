"""The sweep's status line on SLURM (harness.core.progress, issue 52 item 6), on the real localhost cluster: while
`harness sweep --cluster local-slurm` waits for its jobs, a terminal shows the runs ended of how many, with an ETA
once one has ended, and the wait loop's `slurm:` lines and each cell's line print above it, never through it."""

from __future__ import annotations

import re

import pytest

from harness.cli import main
from tests.slurm.conftest import write
from tests.unit.test_progress import Terminal, screen

pytestmark = pytest.mark.slurm

CELLS = """\
    name: slp
    matrix:
      model: [tiny]
      strategy: [ddp]
      precision: [fp32]
      gpus: [2]
      seed: [1, 2]
    settings: {warmup_steps: 2, measure_steps: 3}
"""


def test_a_slurm_sweep_counts_its_runs_on_a_terminal(slurm_cluster, tmp_path):
    scenario = write(tmp_path / "slp.yaml", CELLS)
    term = Terminal()
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr("sys.stdout", term)
        mp.setenv("COLUMNS", "200")
        code = main(["sweep", str(scenario), "--cluster", "local-slurm", "--results", str(tmp_path / "results")])
    raw = term.getvalue()
    assert code == 0, raw
    assert "\rsweep slp: 0/2 runs, 0s elapsed, ETA unknown" in raw
    assert re.search(r"\rsweep slp: 2/2 runs, \d+s elapsed, ETA 0s", raw), raw
    rows = screen(raw)
    assert rows[0] == "sweep 'slp': 2 cells on cluster 'local-slurm' (slurm, cpu)"
    assert sum("  submitted: SLURM job " in r for r in rows) == 2 and any(r.startswith("  slurm: ") for r in rows)
    assert sum(r.startswith("[") and "  ok  " in r for r in rows) == 2
    assert not [r for r in rows if "sweep slp: " in r] and rows[-1] == ""  # drawn in place, gone at the end
