"""The results history: run-level values of every cell, night after night, and judgement against them.

`keys` (what a record is in the history: cell, machine, software, values), `rows` (each table's row as a type,
the metric columns the registry gives), `store` (SQLite / PostgreSQL, one schema, versioned), `changepoint`
(E-Divisive means in numpy), `verdicts` (the rules and what a check decides, with its JSON form), `metric_judge`
(one metric against its history: between-run noise, the noise band, recent change points), `judge` (a sweep's
cells), `show` and `render` (what `harness history show|check` print), `trends` (each run's band for the
report), `sweeps` (results dirs added to the history or checked against it: the commands' flows), `confirm`
(`history check --confirm`'s re-runs). Torch-free.
"""
