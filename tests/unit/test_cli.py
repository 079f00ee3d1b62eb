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
