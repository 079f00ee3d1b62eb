"""harness.cli: the lazy command table."""

from __future__ import annotations

import importlib
import signal
from pathlib import Path

import click
import pytest

from harness import cli

REPO = Path(__file__).resolve().parents[2]


def test_every_command_in_the_table_imports():
    """Each entry names a real click command (a broken import of our own module fails here, never skips)."""
    for name, (target, short_help) in cli.COMMANDS.items():
        assert short_help.endswith(".") and len(short_help) < 100, name
        module, attr = target.split(":")
        command = getattr(importlib.import_module(module), attr)
        assert command.name is not None, name


def test_an_unimportable_command_says_why(monkeypatch, capsys):
    """A command whose module cannot be imported answers "'x' is not available: <why>" and exit 1.

    Before the fix, the stand-in's body read the `except ... as e` name after Python had deleted it, so the user
    got a NameError traceback instead of the reason.
    """
    monkeypatch.setitem(cli.COMMANDS, "ghost", cli.Command("harness.no_such_module:command", "A ghost."))
    rc = cli.main(["ghost"])
    err = capsys.readouterr().err
    assert rc == 1
    assert "'ghost' is not available: No module named 'harness.no_such_module'" in err


@pytest.mark.parametrize("argv", [["--help"], ["ghost", "--help"]])
def test_help_lists_the_unavailable_command(monkeypatch, capsys, argv):
    monkeypatch.setitem(cli.COMMANDS, "ghost", cli.Command("harness.no_such_module:command", "A ghost."))
    assert cli.main(argv) == 0
    out = capsys.readouterr().out
    assert "ghost" in out or "unavailable: No module named 'harness.no_such_module'" in out


def test_list_models_prints_exact_parameter_counts(capsys):
    """`harness list models` prints each zoo model's exact count with thousands separators, as the README promises.

    Before the fix it printed billions to three decimals, so `tiny` read "0.000 B params".
    """
    from harness.core.zoo import ZOO

    assert cli.main(["list", "models"]) == 0
    lines = {line.split()[0]: line for line in capsys.readouterr().out.splitlines() if line.strip()}
    assert set(ZOO) <= set(lines)
    for name, cfg in ZOO.items():
        assert f" {cfg.n_params():,} params" in lines[name], lines[name]
    assert ZOO["tiny"].n_params() == 166_208
    assert "166,208 params (166.2 K)" in lines["tiny"]
    assert "(6.74 B)" in lines["7b"]


def test_list_models_with_a_scenario_includes_its_custom_models(tmp_path, capsys):
    """`harness list models SCENARIO` lists the scenario's own models beside the zoo, marked as the scenario's.

    Before the fix the SCENARIO argument was ignored for `models`, so a custom model never showed.
    """
    from harness.core.zoo import ModelConfig

    path = tmp_path / "custom.yaml"
    path.write_text(
        "name: custom\n"
        "models:\n"
        "  my-7.5b: {d_model: 4096, n_layers: 36, n_heads: 32, ffn: 11008, vocab: 32000}\n"
        "matrix: {model: [my-7.5b], strategy: [ddp], precision: [fp32], gpus: [2]}\n"
    )
    assert cli.main(["list", "models", str(path)]) == 0
    lines = {line.split()[0]: line for line in capsys.readouterr().out.splitlines() if line.strip()}
    expected = ModelConfig(d_model=4096, n_layers=36, n_heads=32, ffn=11008, vocab=32000).n_params()
    assert "tiny" in lines
    assert f" {expected:,} params" in lines["my-7.5b"], lines["my-7.5b"]
    assert "custom.yaml" in lines["my-7.5b"] and "custom.yaml" not in lines["tiny"]


@pytest.fixture
def sigterm_restored():
    """SIGTERM's handler as it was before the test (the policy is installed for the rest of a process); while the
    test runs, a SIGTERM that reaches the old handler fails it instead of ending pytest."""
    previous = signal.getsignal(signal.SIGTERM)

    def not_stopped(signum, frame):
        raise RuntimeError("SIGTERM reached the handler before the command's policy")

    signal.signal(signal.SIGTERM, not_stopped)
    yield
    signal.signal(signal.SIGTERM, previous)


@click.command("long")
def long_command() -> int:
    """A long command as `sweep` and `tune` are: the policy, then a SIGTERM from outside."""
    cli.interrupt_on_sigterm()
    signal.raise_signal(signal.SIGTERM)
    return 0


def test_sigterm_stops_a_long_command_as_ctrl_c_does(monkeypatch, capsys, sigterm_restored):
    """SIGTERM (a scheduler, `kill`) after `interrupt_on_sigterm` is KeyboardInterrupt: exit 130 and the message
    that the manifest and records are consistent, as for Ctrl-C (after the newline click writes on an interrupt)."""
    monkeypatch.setitem(cli.COMMANDS, "long", cli.Command("tests.unit.test_cli:long_command", "Long."))
    assert cli.main(["long"]) == 130
    err = capsys.readouterr().err
    assert err == "\ninterrupted: the manifest and records are consistent; re-run the same command to resume\n"


@pytest.mark.parametrize(
    "argv, target",
    [
        (["sweep", "{scenario}", "--results", "{results}"], "harness.launch.sweep.run_sweep"),
        (["tune", "{scenario}", "--results", "{results}", "--no-calibrate"], "harness.tune.run.run_tune"),
    ],
    ids=["sweep", "tune"],
)
def test_sweep_and_tune_take_the_one_sigterm_policy(tmp_path, monkeypatch, capsys, sigterm_restored, argv, target):
    """`harness sweep` and `harness tune` install the shared policy before their work starts: a SIGTERM while it
    runs (here, as the sweep or search begins) ends the command with exit 130, never with the signal's death."""
    scenario = REPO / "scenarios" / ("smoke.yaml" if argv[0] == "sweep" else "tune-bench.yaml")

    def stopped(*args, **kwargs):
        signal.raise_signal(signal.SIGTERM)
        raise AssertionError("SIGTERM did not stop the command")

    monkeypatch.setattr(target, stopped)
    argv = [a.format(scenario=scenario, results=tmp_path / "results") for a in argv]
    assert cli.main(argv) == 130
    assert capsys.readouterr().err.endswith("re-run the same command to resume\n")
    assert signal.getsignal(signal.SIGTERM) is cli._raise_keyboard_interrupt
