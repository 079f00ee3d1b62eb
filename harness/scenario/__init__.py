"""Configuration validated once at the edge (docs/ARCHITECTURE.md). Importing the package registers the
`transformers` and `factory` model families (harness.scenario.transformers_model, harness.scenario.factory_model),
so every stage that reads a cell knows them."""

from harness.scenario import factory_model as _factory_model  # noqa: F401
from harness.scenario import transformers_model as _transformers_model  # noqa: F401
