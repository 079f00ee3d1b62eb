"""The launch stage: cells (RunSpecs) → rank processes → exactly one record per cell.

Inside it, from the bottom up (a module imports only those above it in this list; tests/unit/test_layers.py checks
that nothing imports the sweep and that core imports no backend):
  core/               every backend's: the payload, the manifest and locks, how a cell's end becomes its record,
                      what a backend is to the sweep
  local/prefork.py    the warm zygote that forks local CPU ranks
  entry.py            where every rank process starts (`python -m harness.launch.entry`, submitit's task)
  local/              the local backend: backend.py (a round, cell after cell), launchers.py (ranks as processes)
  slurm/              the SLURM backend: backend.py (a round), jobs.py (submit, follow, re-attach, cancel), pack.py
                      (a packed job's tasks)
  sweep.py            a scenario's cells through the one backend it picks: skip, lock, file, the rounds
Beside sweep.py, importing what is above it but never the sweep: run.py (`harness sweep`'s start and summary,
`harness run`'s one cell), status.py (`harness status`), stdout.py.
"""
