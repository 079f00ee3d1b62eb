"""A cell's payload (harness.results.payload.Payload): everything one rank of one cell needs — the spec, where
results go, the cluster's device and environment, this attempt's id, the planner's prediction and (locally) a
rendezvous port.

Why a module of its own: every backend starts ranks from the same payload (the local launchers write it to a file
or pickle it through submitit, SLURM jobs carry it in their pickle, packed jobs in a list), and the records made
without rank 0 are built from it too; it is the one contract between the sweep and the processes it starts.
"""

from __future__ import annotations

import sys
import uuid
from pathlib import Path

from harness.core.ports import free_port
from harness.plan.predict import predict as plan_predict
from harness.plan.prediction import Prediction
from harness.results.payload import Payload
from harness.scenario.cluster import Cluster
from harness.scenario.spec import RunSpec


def predict(spec: RunSpec, cluster: Cluster) -> Prediction | None:
    """The planner's prediction for a cell (None, with a warning, when the planner fails on it: a planner bug must
    not cost the measurement)."""
    try:
        return plan_predict(spec, cluster)
    except Exception as e:  # noqa: BLE001 - a planner bug must not cost the measurement; it is reported
        print(f"warning: planner failed for {spec.run_id}: {type(e).__name__}: {e}", file=sys.stderr)
        return None


def make_payload(
    spec: RunSpec, *, sweep: str, cluster: Cluster, results: str | Path, sha: str | None, predicted: Prediction | None
) -> Payload:
    """Everything a rank needs (pickled by submitit, or written to a file as JSON)."""
    return Payload.model_validate(
        {
            "spec": spec,
            "run_id": spec.run_id,
            "sweep": sweep,
            "attempt": uuid.uuid4().hex[:12],
            "results": str(Path(results).resolve()),
            "cluster": {
                "name": cluster.name,
                "device": cluster.device,
                "pg_timeout_s": cluster.pg_timeout_s,
                "env": cluster.env,
                "cpu_allocator": cluster.cpu_allocator,
                # NOTE: only when the profile names one, so every other payload reads as before
                **({"checkpoint_dir": cluster.checkpoint_dir} if cluster.checkpoint_dir else {}),
            },
            "git_sha": sha,
            "predicted": predicted,
            "master_port": free_port() if cluster.executor == "local" else None,
        }
    )


def host_refusal(spec: RunSpec, cluster: Cluster) -> str | None:
    """Why this machine cannot run the cell although the cell itself is valid (its `skipped` reason), or None: an
    `offload: nvme` cell needs DeepSpeed's async I/O op, which links libaio. Asked for local cells only (a SLURM
    node is not this machine: its rank refuses there, with the same sentence)."""
    if cluster.executor != "local" or spec.settings.offload != "nvme":
        return None
    from harness.worker.strategies.zero import nvme_refusal

    return nvme_refusal()
