"""`python -m harness.cli`: the same as the `harness` command."""

from harness.cli import entry

entry()
