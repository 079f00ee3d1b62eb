"""The SLURM backend: a round's cells (backend.py) as SLURM jobs through submitit (jobs.py), or packed several to a
job (pack.py)."""
