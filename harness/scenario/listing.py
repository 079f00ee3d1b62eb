"""`harness list`: what can be launched, one line each — the zoo's models (and a scenario's own), the strategies,
the cluster profiles, or the cells (run_ids) of a scenario on a profile, with the reason a cell would be skipped.

The lines come one at a time, as each is made, so the command prints what it has before a later entry fails.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

from harness.core.errors import InputError, Problem
from harness.core.families import DEFAULT_FAMILY
from harness.core.zoo import ZOO, ZOO_SOURCES, ModelConfig
from harness.scenario.cluster import PEAKS, PROJECT_DIR, SHIPPED_DIR, available_clusters, load_cluster
from harness.scenario.schema import load_scenario
from harness.scenario.spec import STRATEGIES


def list_lines(what: str, *, scenario: str | None, cluster_name: str) -> Iterator[str]:
    """The lines of `harness list WHAT [SCENARIO]`: `what` is models, strategies, clusters or cells (which needs
    `scenario`: InputError without one); cells are expanded for the profile `cluster_name`."""
    if what == "models":
        yield from model_lines(scenario)
    elif what == "strategies":
        yield from STRATEGIES
    elif what == "clusters":
        for name in available_clusters():
            c = load_cluster(name)
            yield f"{name:12s} {c.executor:6s} {c.device:5s} {c.gpus_per_node} per node  {c.description}"
        yield f"\nprofiles: ./{PROJECT_DIR}/NAME.yaml (this project's, first), then {SHIPPED_DIR}/ (shipped)"
        yield "known devices for MFU: " + ", ".join(p.name for p in PEAKS)
    else:
        if not scenario:
            raise InputError([Problem("harness list cells", "SCENARIO", "missing: give a scenario file")])
        cluster = load_cluster(cluster_name)
        for spec in load_scenario(scenario).expand(gpus_per_node=cluster.gpus_per_node):
            reason = spec.unsupported_reason(cluster.device)
            yield spec.run_id + (f"   (skipped: {reason})" if reason else "")


def model_lines(scenario: str | None) -> list[str]:
    """One line per zoo model, then per model SCENARIO defines: the exact parameter count with thousands
    separators, a rounded figure (K/M/B = 1e3/1e6/1e9), the dimensions, the knobs that differ from Llama's
    (`ModelConfig.knobs`: tied_embeddings, head_dim 128, norm_place sandwich …), and where they come from (the zoo
    entry's source, the scenario file, or the Hugging Face config.json it names)."""
    rows: list[tuple[str, ModelConfig, str]] = [(name, cfg, f"zoo: {ZOO_SOURCES[name]}") for name, cfg in ZOO.items()]
    if scenario:
        sc = load_scenario(scenario)
        rows += [(name, cfg, sc.model_sources.get(name, Path(scenario).name)) for name, cfg in sc.models.items()]
    name_w = max(len(name) for name, _, _ in rows)
    count_w = max(len(f"{cfg.n_params():,}") for _, cfg, _ in rows)
    lines = []
    for name, cfg, origin in rows:
        n = cfg.n_params()
        rounded = f"({rounded_count(n)})"
        bias = "".join(f" {k}" if v is True else f" {k} {v:g}" if isinstance(v, float) else f" {k} {v}"
                       for k, v in cfg.knobs().items())  # fmt: skip
        family = "" if cfg.family == DEFAULT_FAMILY else f" family {cfg.family}"
        structure = getattr(cfg, "structure", None)
        if structure is not None:  # a factory's module: no decoder dimensions, what was read from it instead
            lines.append(
                f"{name:{name_w}s} {n:>{count_w},} params {rounded:10s}  blocks {cfg.n_layers:3d} "
                f"({structure['block_class']})  vocab {cfg.vocab:6d}  class {structure['class_name']}"
                f"{family}  source: {origin}"
            )
            continue
        lines.append(
            f"{name:{name_w}s} {n:>{count_w},} params {rounded:10s}  d_model {cfg.d_model:5d}  layers "
            f"{cfg.n_layers:3d}  heads {cfg.n_heads:3d}  kv_heads {cfg.kv_heads:3d}  ffn {cfg.ffn:6d}  "
            f"vocab {cfg.vocab:6d}{bias}{family}  source: {origin}"
        )
    return lines


def rounded_count(n: int) -> str:
    """A count for reading at a glance: 166.2 K, 134.1 M, 6.74 B (decimal prefixes)."""
    if n >= 1e9:
        return f"{n / 1e9:.2f} B"
    if n >= 1e6:
        return f"{n / 1e6:.1f} M"
    if n >= 1e3:
        return f"{n / 1e3:.1f} K"
    return str(n)
