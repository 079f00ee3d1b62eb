"""Strategy families, one module each; they never import each other. `family(strategy)` picks the module."""

from __future__ import annotations

import importlib
from types import ModuleType

FAMILIES = {"ddp": "ddp", "fsdp": "fsdp", "fsdp2": "fsdp2", "zero1": "zero", "zero2": "zero", "zero3": "zero"}


def family_name(strategy: str) -> str:
    return FAMILIES[strategy.split(".")[0]]


def family(strategy: str) -> ModuleType:
    """The module implementing `setup(spec, *, topo) -> Trainer` for a strategy name (imported lazily)."""
    return importlib.import_module(f"harness.worker.strategies.{family_name(strategy)}")
