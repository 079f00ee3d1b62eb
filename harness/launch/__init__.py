"""The launch stage: cells (RunSpecs) → rank processes → exactly one record per cell.

Inside it, from the bottom up (a module imports only those above it in this list; tests/unit/test_layers.py checks
that nothing imports the sweep and that core imports no backend):
  core/               the payload, the manifest and locks, how a cell's end becomes its record: every backend's
  local/prefork.py    the warm zygote that forks local CPU ranks
  entry.py            where every rank process starts (`python -m harness.launch.entry`, submitit's task)
  local/launchers.py  the local backend: ranks as processes on this machine
  slurm/              the SLURM backend: jobs.py (submit, follow, re-attach, cancel), pack.py (a packed job's tasks)
  sweep.py            a scenario's cells through one backend: skip, lock, launch, record
Beside sweep.py, importing what is above it but never the sweep: run.py (`harness sweep`'s start and summary,
`harness run`'s one cell), status.py (`harness status`), stdout.py.
"""
