"""`harness compare`: per-cell regressions between a baseline and a candidate result set.

metrics (what is compared) → match (cells paired by spec) → judge (verdicts, with stats) → comparison (the
result) → render (table, md, json, github-benchmark); load reads a side, sides indexes both, outputs prints and
writes the renderings, promote makes a candidate the baseline, run is the command's flow (harness.cli.compare
holds its options).
"""
