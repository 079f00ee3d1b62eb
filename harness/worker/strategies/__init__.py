"""Strategy families, one module each; they never import each other. `family(strategy)` picks the module.

Which module implements a strategy is its harness.core.catalogue entry's `family`.
"""

from __future__ import annotations

import importlib
from types import ModuleType

from harness.core.catalogue import CATALOGUE


def family_name(strategy: str) -> str:
    """The module under harness/worker/strategies/ that implements `strategy` (KeyError for an unknown name)."""
    return CATALOGUE[strategy].family


def family(strategy: str) -> ModuleType:
    """The module implementing `setup(spec, *, topo) -> Trainer` for a strategy name (imported lazily)."""
    return importlib.import_module(CATALOGUE[strategy].module)
