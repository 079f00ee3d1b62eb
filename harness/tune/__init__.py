"""`harness tune`: the fastest cell that fits per (model, gpus), measuring a fraction of the matrix (docs/tune.md).

`search` is the state machine (prune, rank by prediction, successive halving, confirmation beyond noise) and
launches nothing; `run` drives it with real sweeps and writes `tune.json` and `tuned.yaml`; `log` is tune.json's
typed model and its one reader; `summary` is what a log says for people (the funnel, the ranking, the table
`harness tune` prints). The report draws what `log` and `summary` give it; nothing here imports the report.
"""
