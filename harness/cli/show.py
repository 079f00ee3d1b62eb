"""`harness show cluster NAME`: a cluster profile's figures with their full sources, the rates the planner prices
with, and what the published runs say of its predictions (what `harness plan`'s one-line footnote points to).

The command only; the lines are harness.plan.show's. No torch import on this path.
"""

from __future__ import annotations

import click

from harness.cli.plan import terminal_width
from harness.plan.show import SHOWN, show_lines


@click.command("show")
@click.argument("what", type=click.Choice(SHOWN))
@click.argument("name")
def show_command(what: str, name: str) -> int:
    """Show WHAT (a cluster profile) called NAME (`harness list clusters`) or at a path: every figure the planner
    uses, with its source."""
    for line in show_lines(what, name, width=terminal_width()):
        click.echo(line)
    return 0
