"""Which calibration a report's predictions came from, and `harness report --repredict`.

Every record carries the prediction made before its cell ran (`predicted`, with the rates' source in
`predicted.calibration`: "calibrated <file> …" or "uncalibrated: profile figures (…)"). After `harness calibrate`
those predictions predate the calibration: `stale_predictions` says so, per cluster, and `repredicted` prices a
record's cell again with the rates its cluster has now (the files on disk are left as they are), labelled
"re-predicted at report time: <source>", with its deviations (measured / predicted − 1) recomputed.
"""

from __future__ import annotations

import functools
from collections import Counter
from collections.abc import Iterable

from harness.core.errors import InputError
from harness.plan.calibration import CalibrationMismatch, rates_for
from harness.plan.predict import predict
from harness.results.record import Record
from harness.scenario.cluster import Cluster, load_cluster

REPREDICTED = "re-predicted at report time: "
"""the prefix of a re-predicted record's predicted.calibration"""


@functools.cache
def _cluster(name: str) -> Cluster | None:
    try:
        return load_cluster(name)
    except (InputError, OSError):
        return None


def current_source(cluster_name: str) -> str | None:
    """The source of the rates the cluster's cells are priced with now (its calibration or its profile), or None
    when the profile cannot be read here or its calibration belongs to another machine."""
    cluster = _cluster(cluster_name)
    if cluster is None:
        return None
    try:
        return rates_for(cluster).source
    except (CalibrationMismatch, InputError, OSError):
        return None


def repredicted(rec: Record) -> Record:
    """The record with its cell predicted again at the cluster's current rates; the record itself when its spec
    or cluster cannot be priced here (an older record, a profile not on this machine)."""
    cluster = _cluster(rec.cluster) if rec.cluster else None
    if cluster is None:
        return rec
    try:
        pred = predict(rec.spec, cluster)
    except (InputError, KeyError, TypeError, ValueError, CalibrationMismatch):
        return rec
    if pred is None:
        return rec
    median = rec.metrics.step_time_s.median if rec.metrics.step_time_s is not None else None
    comm = rec.comm.bytes_per_step if rec.comm is not None else None
    pred = pred.model_copy(update={"calibration": REPREDICTED + (pred.calibration or "unknown rates")})
    return rec.model_copy(update={"predicted": pred.with_deviations(comm_bytes=comm, median_s=median)})


def stale_predictions(sources: Iterable[tuple[str | None, str | None]]) -> list[str]:
    """Warnings for the (cluster, predicted.calibration) of every record whose prediction came from other rates
    than its cluster's current ones (a calibration made since, or removed)."""
    counts = Counter((c, s) for c, s in sources if c and s and not s.startswith(REPREDICTED))
    out = []
    for (cluster, source), n in sorted(counts.items()):
        now = current_source(cluster)
        if now is not None and now != source:
            out.append(
                f"{n} record(s) of cluster {cluster!r} were predicted with {source}; its cells are priced with "
                f"{now} now (a calibration made or removed since): `harness report --repredict` predicts them "
                "again with it"
            )
    return out


def sources_text(sources: Iterable[str | None]) -> str:
    """The summary's line: each rates' source and how many records' predictions came from it."""
    counts = Counter(s for s in sources if s)
    if not counts:
        return "no record carries a step-time prediction's source"
    return "; ".join(f"{s} ({n})" for s, n in counts.most_common())
