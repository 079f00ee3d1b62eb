"""Each stored cell's between-run noise, for the report's best-strategy table (`harness report --history DB`).

The noise is the one `history check` holds a night to (harness.history.metric_judge.noise_sigma: the median
absolute night-to-night difference of the log series, scaled to σ), of the cell's last `window` ok values of
`step_time_s` on one machine (cluster profile, device type, name and count), widened by (1 + INFLATE/(n − 1)) as
the judge widens its band while it rests on few values. σ of log step time is σ of log tokens/s/GPU (one is the
other's inverse times a constant). A cell with fewer than `min_history` values on a machine has no noise there.
The result is plain data keyed by what a record says (run_id, cluster, device name), so the report, which does not
import the history, looks its cells up in it.
"""

from __future__ import annotations

import math

from harness.history.metric_judge import INFLATE, noise_sigma
from harness.history.store import HistoryStore
from harness.history.verdicts import Rules

NOISE_METRIC = "step_time_s"

NoiseKey = tuple[str, str, str | None]
"""(run_id, cluster profile, device name) of a cell's runs on one machine"""


def cell_noise(store: HistoryStore, *, rules: Rules | None = None) -> dict[NoiseKey, tuple[float, int]]:
    """(run_id, cluster, device name) → (σ of log step time between runs, the runs it rests on), for every cell
    with at least `min_history` ok values on that machine."""
    rules = (rules or Rules()).checked()
    out: dict[NoiseKey, tuple[float, int]] = {}
    for cell in store.cells():
        series: dict[NoiseKey, list[float]] = {}
        for run in store.runs_of(cell.id):
            v = run.values.get(NOISE_METRIC)
            if run.status == "ok" and v is not None and v > 0:
                m = run.machine
                series.setdefault((cell.run_id, m.cluster, m.device_name), []).append(math.log(v))
        for key, logs in series.items():
            y = logs[-rules.window :]
            if len(y) >= rules.min_history:
                out[key] = (noise_sigma(y) * (1 + INFLATE / (len(y) - 1)), len(y))
    return out
