"""The payload: everything one rank of one cell needs, as a typed model — what the launcher hands every rank
(harness.launch.core.payload makes it; the local launchers pickle it through submitit or write it to a file,
SLURM jobs carry it in their pickle, packed jobs in a list) and what the worker (harness.worker.runner) and the
records composed without rank 0 (harness.launch.core.outcome) are built from.

It lives with the record (floor 3) because both the worker (floor 4) and the launcher (floor 5) use it.
"""

from __future__ import annotations

from typing import Annotated

from harness.core.typed import SOMETIMES, Typed
from harness.plan.prediction import Prediction
from harness.results.spec import SpecJSON


class PayloadCluster(Typed):
    """The part of the cluster profile a rank needs."""

    name: str
    """cluster profile name"""
    device: str
    """cuda | cpu"""
    pg_timeout_s: int | float
    """collective watchdog of every process group (s)"""
    env: dict[str, str]
    """environment variables set in each rank (unless already set)"""
    cpu_allocator: Annotated[str | None, SOMETIMES] = None
    """'caching' or 'system': what a CPU rank's malloc does with freed memory (harness.worker.allocator)"""
    checkpoint_dir: Annotated[str | None, SOMETIMES] = None
    """where `checkpoint: true` cells write (the profile's checkpoint_dir); absent: under the results folder"""


class PackPlace(Typed):
    """A packed cell's place in its SLURM job."""

    position: int
    """1-based position in the pack"""
    of: int
    """cells in the pack (count)"""
    minutes: int
    """the pack's --time (min)"""


class Payload(Typed):
    """Everything one rank of one cell needs (frozen: a launcher that learns more, such as the SLURM job id, makes
    a copy with `model_copy(update=...)`)."""

    spec: SpecJSON
    """the cell (harness.scenario.spec.RunSpec)"""
    run_id: str
    """the cell's run_id"""
    sweep: str
    """scenario name"""
    attempt: Annotated[str | None, SOMETIMES] = None
    """this launch's id (12 hex digits); absent in a payload written by hand (`python -m harness.launch.entry`)"""
    results: str
    """the results dir (absolute path)"""
    cluster: PayloadCluster
    """the cluster profile's part a rank needs"""
    git_sha: str | None
    """the harness commit; null outside a checkout"""
    predicted: Prediction | None
    """the planner's prediction; null: none"""
    master_port: int | None
    """rendezvous port (local cells); null: derived from the job id (SLURM)"""
    job_id: Annotated[str | None, SOMETIMES] = None
    """the SLURM job id, set once submitted"""
    pack: Annotated[PackPlace | None, SOMETIMES] = None
    """the cell's place in its packed job (`--pack`)"""
