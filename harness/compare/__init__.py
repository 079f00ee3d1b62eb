"""`harness compare`: per-cell regressions between a baseline and a candidate result set.

metrics (what is compared) → match (cells paired by spec) → judge (verdicts, with stats) → comparison (the
result) → render (table, md, json, github-benchmark); load reads a side, promote makes a candidate the baseline.
The command itself is harness.cli.compare.
"""
