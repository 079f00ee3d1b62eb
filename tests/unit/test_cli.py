"""harness.cli: the lazy command table."""

from __future__ import annotations

import importlib

import pytest

from harness import cli


def test_every_command_in_the_table_imports():
    """Each entry names a real click command (a broken import of our own module fails here, never skips)."""
    for name, target in cli.COMMANDS.items():
        module, attr = target.split(":")
        command = getattr(importlib.import_module(module), attr)
        assert command.name is not None, name


def test_an_unimportable_command_says_why(monkeypatch, capsys):
    """A command whose module cannot be imported answers "'x' is not available: <why>" and exit 1.

    Before the fix, the stand-in's body read the `except ... as e` name after Python had deleted it, so the user
    got a NameError traceback instead of the reason.
    """
    monkeypatch.setitem(cli.COMMANDS, "ghost", "harness.no_such_module:command")
    rc = cli.main(["ghost"])
    err = capsys.readouterr().err
    assert rc == 1
    assert "'ghost' is not available: No module named 'harness.no_such_module'" in err


@pytest.mark.parametrize("argv", [["--help"], ["ghost", "--help"]])
def test_help_lists_the_unavailable_command(monkeypatch, capsys, argv):
    monkeypatch.setitem(cli.COMMANDS, "ghost", "harness.no_such_module:command")
    assert cli.main(argv) == 0
    out = capsys.readouterr().out
    assert "ghost" in out or "unavailable: No module named 'harness.no_such_module'" in out
