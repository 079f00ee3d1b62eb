"""Configuration validated once at the edge (docs/ARCHITECTURE.md). Importing the package registers the
`transformers` model family (harness.scenario.transformers_model), so every stage that reads a cell knows it."""

from harness.scenario import transformers_model as _transformers_model  # noqa: F401
