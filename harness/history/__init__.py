"""The results history: run-level values of every cell, night after night, and judgement against them.

`keys` (what a record is in the history: cell, machine, software, values), `store` (SQLite / PostgreSQL, one
schema, versioned), `changepoint` (E-Divisive means in numpy), `judge` (between-run noise, the noise band, recent
change points), `show` and `render` (what `harness history show|check` print). Torch-free.
"""
