"""`harness tune`: the fastest cell that fits per (model, gpus), measuring a fraction of the matrix (docs/tune.md).

`search` is the state machine (prune, rank by prediction, successive halving, confirmation beyond noise) and
launches nothing; `run` drives it with real sweeps and writes `tune.json` and `tuned.yaml`.
"""
