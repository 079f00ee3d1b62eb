"""Options that several commands take, spelled once. Each is a decorator that imports what its choices need only
when a command applies it, so this module costs no import of a stage (`harness --help` loads none)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import click

F = TypeVar("F", bound=Callable[..., Any])


def cluster_option(f: F) -> F:
    """`--cluster NAME`, as every command that runs or plans cells on a cluster profile takes it."""
    return click.option(
        "--cluster",
        "cluster_name",
        default="local",
        show_default=True,
        help="cluster profile: a name (`harness list clusters`) or a path",
    )(f)


def format_option(f: F) -> F:
    """`--format`, as `harness compare` and `harness history check` take it."""
    return click.option(
        "--format",
        "fmt",
        type=click.Choice(["table", "md", "json", "github-benchmark"]),
        default="table",
        show_default=True,
        help="What goes to stdout (and -o).",
    )(f)


def direction_option(f: F) -> F:
    """`--direction`, the kind of github-benchmark entries, as `harness compare` and `harness history check` take
    it."""
    from harness.compare.render import BENCHMARK_FILES

    return click.option(
        "--direction",
        type=click.Choice(sorted(BENCHMARK_FILES)),
        help="With --format github-benchmark: customSmallerIsBetter or customBiggerIsBetter entries.",
    )(f)


def set_option(f: F) -> F:
    """`--set KEY=VALUE`, repeatable, as `harness plan`, `sweep`, `tune` and `run` take it: the scenario file as if it
    said so (harness.scenario.schema.apply_overrides has the rules; a bad one gets the file's own error, exit 2)."""
    return click.option(
        "--set",
        "overrides",
        multiple=True,
        metavar="KEY=VALUE",
        help="change the scenario without editing it (repeatable): a setting or an axis (model, strategy, precision, "
        "gpus), VALUE as YAML. A single value is every cell's (--set micro_batch=2), a list is the axis "
        "(--set gpus=[8,64]), KEY.SUB one key of a mapping (--set inject.fault=slow); validated as the file is",
    )(f)
