"""The plan's recommendation beside what the device check measured (bench/gpu_check.sh, each sweep part).

    python bench/gpu_check_recommend.py SCENARIO PROFILE RESULTS

Per (model, GPU count) of SCENARIO: the cell `harness plan SCENARIO --cluster PROFILE` recommends
(harness.plan.recommend, the profile's own figures: the device's published rates, its memory), and, from the records
under RESULTS, the measured tokens/s per GPU of that cell and of the fastest cell that ran ok. One run per cell: the
last column is a place to look, not a verdict (a lead within the between-run noise is no win: `harness compare`,
`harness tune`). PROFILE is the shipped profile of the device the check ran on (h100, h200, a100); in the CPU dry
mode, h100 (the tiny cells planned as if on one, so the path runs). Prints a Markdown table.
"""

from __future__ import annotations

import sys

from harness.plan.calibration import rates_for
from harness.plan.predict import plan_cells
from harness.plan.recommend import cell_words, recommend
from harness.results.store import load_records
from harness.scenario.cluster import load_cluster
from harness.scenario.schema import load_scenario


def main(scenario: str, profile: str, results: str) -> None:
    cluster = load_cluster(profile)
    specs = load_scenario(scenario).expand(gpus_per_node=cluster.gpus_per_node)
    cells = plan_cells(specs, cluster, rates=rates_for(cluster))
    recs = recommend(cells, cluster=cluster)
    records, _ = load_records(results)
    measured = {
        r.run_id: r.metrics.tokens_per_s_per_gpu
        for r in records
        if r.status == "ok" and r.metrics is not None and r.metrics.tokens_per_s_per_gpu
    }
    print(f"\nrecommendation of `harness plan --cluster {profile}` beside the measured tokens/s per GPU (one run each)")
    print("| model × GPUs | recommended (predicted tok/s/GPU) | its measured | fastest measured | same cell |")
    print("|---|---|---|---|---|")
    for g in recs.groups:
        members = [cells[i] for i in g.cells]
        ran = [(measured[c.spec.run_id], c) for c in members if c.spec.run_id in measured]
        best = max(ran, key=lambda x: x[0]) if ran else None
        fastest = f"{cell_words(best[1])} ({best[0]:,.0f})" if best else "none ran ok"
        if g.winner is None:
            print(f"| {g.model} × {g.gpus} | none: {g.why_none} | - | {fastest} | - |")
            continue
        w = cells[g.winner]
        mine = measured.get(w.spec.run_id)
        same = "-" if best is None else ("yes" if best[1].spec.run_id == w.spec.run_id else "no")
        print(
            f"| {g.model} × {g.gpus} | {cell_words(w)} ({w.prediction.tokens_per_s_per_gpu or 0:,.0f}) | "
            f"{'did not run ok' if mine is None else f'{mine:,.0f}'} | {fastest} | {same} |"
        )


if __name__ == "__main__":
    if len(sys.argv) != 4:
        sys.exit(__doc__)
    main(*sys.argv[1:])
