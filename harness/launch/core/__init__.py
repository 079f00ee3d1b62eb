"""The shared core of the launch stage: what every backend (local, SLURM) needs and nothing backend-specific —
the payload a rank runs from (payload.py), the sweep's manifest and locks (manifest.py), and how a finished cell
becomes exactly one record (outcome.py). It imports no backend and no part of the sweep.
"""
