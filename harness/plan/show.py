"""`harness show cluster NAME`: what the planner knows of a cluster profile, every figure with its full source.

The plan's footnote names this command instead of quoting the sources inline (a profile's sources fill a page). It
prints the profile (executor, device, nodes, memory and the reserve the planner keeps), the dense peak its MFUs
divide by, which rates the step-time model prices with (a calibration file, or the profile's `performance:` figures),
each figure with its source, and what the published runs (validation/*.csv) say of each family's predictions on it
(harness.plan.validation.family_check): the uncertainty `harness plan`'s recommendation quotes.

Lines are yielded as they are made; prose is wrapped to the width the command gives (a terminal's, or a fixed one).
No torch import.
"""

from __future__ import annotations

from collections.abc import Iterator

from harness.core.errors import InputError, Problem, one_of
from harness.core.precisions import PRECISIONS
from harness.core.text import wrap
from harness.plan import calibration as cal
from harness.plan.memory import DEVICE_RESERVE_GIB
from harness.plan.validation import FAMILY_NAMES, LAYOUT_FAMILY, VALIDATION_DIR, family_check
from harness.scenario.cluster import Cluster, find_peak, load_cluster
from harness.scenario.performance import LinkFigures

SHOWN = ("cluster",)
"""what `harness show` shows"""


def show_lines(what: str, name: str, *, width: int = 100) -> Iterator[str]:
    """The lines of `harness show WHAT NAME` (WHAT: one of SHOWN; bad input is an InputError)."""
    if what not in SHOWN:
        raise InputError([Problem("harness show", "WHAT", one_of(what, SHOWN))])
    try:
        cluster = load_cluster(name)
    except InputError as e:  # NOTE: the profile's reader names --cluster, which this command does not have
        raise InputError([Problem(f"harness show {what}", p.path, p.message) if p.file == "--cluster" else p
                          for p in e.problems]) from None  # fmt: skip
    yield from cluster_lines(cluster, width=width)


def _wrap(text: str, width: int, indent: str = "    ", more: str = "") -> list[str]:
    """`text` wrapped to `width` (harness.core.text.wrap: sources name repositories and files), at show's indents."""
    return wrap(text, width, indent=indent, more=more)


def _num(v: float | None, unit: str = "") -> str:
    return "unknown" if v is None else f"{v:g}{unit}"


def _link(link: LinkFigures) -> str:
    return (
        f"busbw {_num(link.busbw_gbps, ' GB/s')}, latency {_num(link.latency_us, ' us')}, hop latency "
        f"{_num(link.hop_latency_us, ' us')}"
    )


def cluster_lines(cluster: Cluster, *, width: int = 100) -> Iterator[str]:
    """The profile's figures and their sources, the rates the planner uses, and the published runs' errors."""
    c, perf = cluster, cluster.performance
    yield f"cluster {c.name} ({c.path}): {c.description}"
    per_node = f"{c.gpus_per_node} {'GPUs' if c.device == 'cuda' else 'ranks'} per node"
    yield f"  executor {c.executor}, device {c.device}, {per_node}"
    if c.device_memory_gib is not None:
        usable = c.device_memory_gib - DEVICE_RESERVE_GIB
        text = (
            f"device memory: {c.device_memory_gib:g} GiB; {usable:g} GiB usable (the planner keeps "
            f"{DEVICE_RESERVE_GIB:g} GiB for the CUDA context and NCCL; `harness plan --headroom GIB` asks for more)"
        )
    else:
        text = "device memory: unknown (no device_memory_gib: nothing is known to fit, nothing is recommended)"
    yield from _wrap(text, width, indent="  ", more="    ")
    peak = find_peak(c.description) if c.device == "cuda" else None
    if peak is not None:
        figures = ", ".join(f"{k} {v:g}" for k, v in peak.tflops.items())
        yield f"  dense peak (the MFUs' denominator): {peak.name}: {figures} TFLOPS"
        yield from _wrap(f"source: {peak.source} (harness/scenario/cluster.py PEAKS)", width)
    else:
        yield "  dense peak: none known for this device (MFU is null)"
    yield from _rates_lines(c, width)
    yield "  performance figures (the profile's `performance:`):"
    rows: list[tuple[str, str]] = [
        ("matmul_tflops", ", ".join(f"{k} {_num(v)}" for k, v in perf.matmul_tflops.items()) or "unknown"),
        ("memory_gbps", _num(perf.memory_gbps, " GB/s")),
        ("intra_node", _link(perf.intra_node) + f" (collectives: {perf.collectives})"),
        ("inter_node", _link(perf.inter_node)),
        ("efficiency", ", ".join(f"{k} {v:g}" for k, v in perf.efficiency) or "none: every matmul at the flat rate"),
        ("price_per_gpu_hour", _num(perf.price_per_gpu_hour)),
        ("storage", f"write {_num(perf.storage.write_gbps, ' GB/s')}, read {_num(perf.storage.read_gbps, ' GB/s')}"),
    ]
    for key, value in rows:
        yield f"    {key}: {value}"
        source = perf.sources.get(key)
        if source:
            yield from _wrap(f"source: {' '.join(source.split())}", width, indent="      ")
    for key in sorted(set(perf.sources) - {k for k, _ in rows}):
        yield f"    {key}:"
        yield from _wrap(f"source: {' '.join(perf.sources[key].split())}", width, indent="      ")
    yield from published_lines(c, width)


def _rates_lines(cluster: Cluster, width: int) -> Iterator[str]:
    """Which rates `harness plan --cluster NAME` prices with here."""
    try:
        rates = cal.rates_for(cluster)
    except cal.CalibrationMismatch as e:
        yield from _wrap(f"step-time rates: refused: {e.problems[0]}", width, indent="  ")
        return
    if type(rates) is not cal.ProfileRates:  # NOTE: a calibration file, or nccl-tests/mamf-finder logs over the figures
        text = f"step-time rates: {rates.source.split('; the rest:')[0]}; the figures below stand in for what it lacks"
    else:
        text = (
            f"step-time rates: the figures below (no calibration file; `harness calibrate --cluster {cluster.name}` "
            "measures this machine's)"
        )
    yield from _wrap(text, width, indent="  ")


def families() -> list[str]:
    """Every family the published runs are grouped by, in the catalogue's order, TP/PP layouts last."""
    return [*dict.fromkeys(FAMILY_NAMES.values()), LAYOUT_FAMILY]


def published_lines(cluster: Cluster, width: int) -> Iterator[str]:
    """What the published runs (validation/*.csv) say of each family's predicted step time on this profile."""
    yield f"  the time model against published runs ({VALIDATION_DIR.name}/*.csv; error = predicted / published - 1):"
    if cluster.device != "cuda":
        yield "    none: the published runs are GPU runs, and this profile's device is a CPU"
        return
    for family in families():
        checks = [family_check(family, p, cluster.name) for p in PRECISIONS]
        found = [ch for ch in checks if ch.runs]
        if not found:
            yield from _wrap(f"{family}: no published GPU run checks {family}'s time model (any precision)", width)
            continue
        for ch in found:
            yield from _wrap(ch.text(), width)
            for source in ch.sources:
                yield from _wrap(f"published: {source}", width, indent="      ")
        missing = [ch.precision for ch in checks if not ch.runs]
        if missing:
            yield from _wrap(f"{family} at {', '.join(missing)}: no published GPU run", width)
