"""A cell's FSDP wrap units: the parameter inventory's units grouped as the worker wraps them (`wrap_blocks`).

The inventory (harness.core.zoo `parameters`) names every parameter's unit: `root` (the embedding, the final norm,
the head) or `blocks.<i>`. The worker wraps `wrap_blocks` consecutive blocks as one FSDP unit (FSDP1: a `BlockGroup`
module per group; FSDP2: one `fully_shard` over the group's blocks; harness.worker.strategies.base.block_groups), or
the whole model as the one root unit (wrap_blocks 0). Here a block's unit becomes its group's, named after the
group's first block (`blocks.0`, `blocks.2`, … for wrap_blocks 2): the collective model then issues one all-gather
and one reduce-scatter per group, of the group's bytes, and the overlap model finds the group where its first block
runs (harness.plan.overlap reads the names). wrap_blocks 1 is the inventory as it is.

Pure arithmetic, no torch; cached per (model, wrap_blocks).
"""

from __future__ import annotations

import functools

from harness.core.zoo import ModelConfig, Param, parameters

ROOT = "root"


def group_of(unit: str, wrap_blocks: int) -> str:
    """The wrap unit of an inventory unit: `root` stays; `blocks.<i>` becomes `blocks.<first block of its group>`
    (itself for wrap_blocks 1), or `root` when the whole model is one unit (wrap_blocks 0)."""
    if unit == ROOT or wrap_blocks == 1:
        return unit
    if wrap_blocks == 0:
        return ROOT
    i = int(unit.split(".", 1)[1])
    return f"blocks.{i - i % wrap_blocks}"


@functools.cache
def wrap_units(cfg: ModelConfig, wrap_blocks: int) -> tuple[tuple[str, tuple[Param, ...]], ...]:
    """FSDP units in wrapping order, each with its parameters in registration order: the block groups first, the root
    last (what no group holds; every parameter when wrap_blocks is 0, in the model's registration order, which is
    the order FSDP1 flattens them in)."""
    out: dict[str, list[Param]] = {}
    params = parameters(cfg)
    for p in params:
        group = group_of(p.unit, wrap_blocks)
        if group != ROOT:
            out.setdefault(group, []).append(p)
    out[ROOT] = [p for p in params if group_of(p.unit, wrap_blocks) == ROOT]
    return tuple((name, tuple(unit)) for name, unit in out.items())


@functools.cache
def wrap_sizes(cfg: ModelConfig, wrap_blocks: int) -> tuple[tuple[str, int], ...]:
    """(unit, elements) per FSDP unit of `wrap_units`."""
    return tuple((name, sum(p.numel for p in unit)) for name, unit in wrap_units(cfg, wrap_blocks))


@functools.cache
def wrap_summary(cfg: ModelConfig, wrap_blocks: int) -> tuple[int, int, int]:
    """(largest block unit, root unit, block units) in elements and count: what the memory model reads. The largest
    block unit is 0 when the whole model is the root unit (wrap_blocks 0)."""
    sizes = dict(wrap_sizes(cfg, wrap_blocks))
    root = sizes.pop(ROOT)
    return max(sizes.values(), default=0), root, len(sizes)


@functools.cache
def backward_units(cfg: ModelConfig, wrap_blocks: int) -> tuple[int, ...]:
    """Elements of each block unit in the order the backward runs them (the last group first; it may hold fewer
    blocks than the others); () when the whole model is the root unit."""
    return tuple(reversed([n for name, n in wrap_sizes(cfg, wrap_blocks) if name != ROOT]))


def gathered_elements(cfg: ModelConfig, wrap_blocks: int, units: int) -> int:
    """Elements of the `units` block units unsharded at once in the backward's first units (the one computing and
    those prefetched after it): `units` x a block for one block per unit (as every plan before wrap units said, a
    one-block model too), else the first `units` units of `backward_units`."""
    if wrap_blocks == 1:
        return units * wrap_summary(cfg, 1)[0]
    return sum(backward_units(cfg, wrap_blocks)[:units])


def clear_caches() -> None:
    """Forget every grouping (tests compare cold and warm predictions)."""
    for f in (wrap_units, wrap_sizes, wrap_summary, backward_units):
        f.cache_clear()
