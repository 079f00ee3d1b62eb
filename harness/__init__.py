"""harness: a benchmark harness for distributed PyTorch training strategies."""

__version__ = "0.1.0"
