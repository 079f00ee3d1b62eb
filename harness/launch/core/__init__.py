"""The shared core of the launch stage: what every backend (local, SLURM) needs and nothing backend-specific —
the payload a rank runs from (payload.py), the sweep's manifest, its states and locks (manifest.py), how a finished
cell becomes exactly one record (outcome.py), and what a backend is to the sweep (backend.py). It imports no backend
and no part of the sweep.
"""
