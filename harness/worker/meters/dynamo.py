"""What torch.compile did in a cell, from dynamo's own counters (read outside the timed steps).

The number that matters is frames dynamo compiled *during the measured steps*: a recompilation there (a guard
that fails on a later step, a new shape) is compile time timed as step time. DeepSpeed ZeRO-3's per-module hooks,
for instance, hit dynamo's recompile limit in the first step and then run eagerly: harmless if it all happens in
warmup, which this shows.
"""

from __future__ import annotations


def snapshot() -> dict[str, int]:
    """{frames, graphs, graph_breaks} so far in this process: frames dynamo tried to compile (recompilations
    included), distinct graphs it produced, graph breaks."""
    from torch._dynamo.utils import counters

    return {
        "frames": int(counters["frames"]["total"]),
        "graphs": int(counters["stats"]["unique_graphs"]),
        "graph_breaks": int(sum(counters["graph_break"].values())),
    }
