"""The SLURM backend: cells as SLURM jobs through submitit (jobs.py), or packed several to a job (pack.py)."""
