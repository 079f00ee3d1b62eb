"""`harness` command line. Subcommands load their modules lazily so `harness --help` and `harness plan`
never import torch, pandas or matplotlib.

Exit codes (docs/exit-codes.md has every command's table): 0 success; 1 the work ran and failed (a failed cell, a
sweep that ran nothing, a regression, a group without a winner, a measurement) or the environment stopped it
mid-way (a disk with no room: `error: PATH: cannot write: …`, never a traceback; SLURM unreachable); 2 bad input,
refused before any work (a results or output folder that cannot be written too; unreadable records); 130
interrupted (Ctrl-C, SIGTERM to a sweep or a tune: `interrupt_on_sigterm`).
"""

from __future__ import annotations

import errno
import importlib
import signal
import sys
from typing import NamedTuple

import click

from harness.core.errors import InputError


class Command(NamedTuple):
    """A command of the table: where its click command is, and its one line in `harness --help`."""

    target: str
    """`module:attribute` of the click command, imported when the command is run (or its own --help asked for)"""
    short_help: str
    """its line in `harness --help`, written here so the group's help imports no command module"""


COMMANDS: dict[str, Command] = {
    "sweep": Command("harness.cli.sweep:sweep", "Run every cell of a scenario; one JSON record per cell."),
    "run": Command("harness.cli.run:run", "Run one cell in the foreground."),
    "list": Command("harness.cli.run:list_", "List models, strategies, clusters, or a scenario's cells."),
    "plan": Command("harness.cli.plan:plan_command", "Predict memory, FLOPs and traffic per cell; launches nothing."),
    "show": Command("harness.cli.show:show_command", "A cluster profile's figures with their full sources."),
    "status": Command("harness.cli.run:status", "Per-cell state of the sweeps in a results dir."),
    "report": Command(
        "harness.cli.report:report_command", "Tables and figures (HTML, Markdown, CSV) from result dirs."
    ),
    "compare": Command(
        "harness.cli.compare:compare_command", "Regressions between a baseline and a candidate (exit 1)."
    ),
    "calibrate": Command(
        "harness.cli.calibrate:calibrate_command", "Measure this machine's rates for the step-time model."
    ),
    "history": Command(
        "harness.cli.history:history_group", "A results history: add sweeps, show series, check a new sweep (exit 1)."
    ),
    "tune": Command(
        "harness.cli.tune:tune_command",
        "The fastest cell that fits per model and GPU count, measuring a fraction of the matrix.",
    ),
}
"""every command: adding one is a module under harness/cli/ and one line here"""


def unavailable_command(name: str, error: BaseException) -> click.Command:
    """A stand-in for a command whose module cannot be imported: running it says why (exit 1).

    NOTE: the message is formatted here, not in the command's body: Python deletes an `except ... as e` name when
    its block ends, so a body that read `e` later raised NameError instead of saying what was unavailable.
    """
    message = f"'{name}' is not available: {error}"

    @click.command(name=name, help=f"(unavailable: {error})")
    def unavailable() -> None:
        raise click.ClickException(message)

    return unavailable


class LazyGroup(click.Group):
    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(COMMANDS)

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        # static one-liners: `harness --help` must not import torch, pandas or matplotlib
        with formatter.section("Commands"):
            formatter.write_dl([(name, COMMANDS[name].short_help) for name in self.list_commands(ctx)])

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        command = COMMANDS.get(name)
        if command is None:
            return None
        module, attr = command.target.split(":")
        try:
            return getattr(importlib.import_module(module), attr)
        except (ImportError, AttributeError) as e:
            return unavailable_command(name, e)


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="harness")
def cli() -> None:
    """Benchmark distributed PyTorch training strategies (DDP, FSDP, FSDP2, DeepSpeed ZeRO) across
    precisions and GPU counts, locally on CPU/gloo or on SLURM GPU clusters."""


def interrupt_on_sigterm() -> None:
    """The policy of a long command (a sweep, a tune): SIGTERM — a scheduler's, `kill`'s — stops it as Ctrl-C does,
    by raising KeyboardInterrupt wherever it is. Its `finally` blocks and the sweep's own handling run, the manifest
    and the records stay consistent, and `main` turns it into exit 130 with its message. (SIGINT is Python's own
    KeyboardInterrupt already.) Installed once the command starts, for the rest of the process."""
    signal.signal(signal.SIGTERM, _raise_keyboard_interrupt)


def _raise_keyboard_interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def main(argv: list[str] | None = None) -> int:
    """Entry point: bad input anywhere (InputError) → its lines on stderr and exit code 2."""
    try:
        rv = cli.main(args=argv, prog_name="harness", standalone_mode=False)
    except InputError as e:
        for p in e.problems:
            click.echo(f"error: {p}", err=True)
        return 2
    except (click.exceptions.Abort, KeyboardInterrupt):
        click.echo("interrupted: the manifest and records are consistent; re-run the same command to resume", err=True)
        return 130
    except click.ClickException as e:
        e.show()
        return 2 if isinstance(e, click.UsageError) else e.exit_code
    except OSError as e:
        line = write_error_line(e)
        if line is None:
            raise  # NOTE: not the environment's doing: a bug, whose traceback says where
        click.echo(f"error: {line}", err=True)
        return 1
    return rv if isinstance(rv, int) else 0


NO_ROOM = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EROFS})
"""what a file system says when it takes no more: full, over quota, a file too big, remounted read-only"""


def write_error_line(e: OSError) -> str | None:
    """The line for a write the environment refused mid-way (harness.results.store.WriteFailed, or any OSError of
    NO_ROOM): the file, why, and that re-running goes on (records and manifests are written whole or not at all,
    harness.results.store's atomic writes, so what was written before stands); None for any other OSError."""
    from harness.results.store import WriteFailed

    if not isinstance(e, WriteFailed) and e.errno not in NO_ROOM:
        return None
    where = f"{e.filename}: cannot write: " if e.filename else "cannot write: "
    return f"{where}{e.strerror or e}; free space (or quota) and re-run the same command to go on from there"


def entry() -> None:
    """The `harness` command and `python -m harness.cli`: exit with main's code. A Ctrl-C or SIGTERM that arrives
    after main returned cannot turn that code into a death by signal: the work is filed by then, and Python resets
    its SIGINT handler to the default while it shuts down, so a late signal would end the process as killed (-2)
    after it printed "interrupted … consistent" (seen once in CI's early Ctrl-C test). The signals are blocked for
    the little that is left; a blocked signal still pending at exit is discarded."""
    try:
        code = main()
    except KeyboardInterrupt:  # NOTE: raised between main's own handler and here
        code = 130
    try:
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})
    except KeyboardInterrupt:
        pass
    sys.exit(code)


if __name__ == "__main__":
    entry()
