"""A scenario's `tune:` section and `harness tune`'s bad input: every problem named by file and key, exit 2, nothing
launched or written."""

from __future__ import annotations

import pytest

from harness.cli import main
from harness.core.errors import InputError
from harness.scenario.schema import parse_scenario

MATRIX = {"model": ["tiny"], "strategy": ["ddp"], "precision": ["fp32"], "gpus": [2, 4], "micro_batch": [1, 2, 4]}


def problems(doc) -> list[str]:
    with pytest.raises(InputError) as e:
        parse_scenario(doc, "s.yaml")
    return [f"{p.path}: {p.message}" for p in e.value.problems]


def test_global_batch_derives_grad_accum_and_leaves_out_what_it_cannot_divide():
    sc = parse_scenario({"matrix": MATRIX, "tune": {"global_batch": 8}}, "s.yaml")
    got = {(s.gpus, s.settings.micro_batch): s.settings.grad_accum for s in sc.expand(gpus_per_node=2)}
    assert got == {(2, 1): 4, (2, 2): 2, (2, 4): 1, (4, 1): 2, (4, 2): 1}
    ((cell, why),) = sc.left_out(gpus_per_node=2)
    assert (cell["gpus"], cell["micro_batch"]) == (4, 4)
    assert why == "global_batch 8 is not a multiple of micro_batch 4 x 4 data-parallel ranks = 16"
    assert sc.tune is not None and sc.tune.objective == "throughput" and sc.tune.memory_headroom == 0.0


def test_each_bad_tune_key_is_named():
    got = problems(
        {
            "matrix": MATRIX,
            "tune": {"objective": "fastest", "global_batch": 0, "memory_headroom": 1.5, "alpha": 0.9, "rounds": 3},
        }
    )
    assert any(p.startswith("tune.objective: 'fastest' is not one of throughput, step_time") for p in got)
    assert "tune.global_batch: 0 is below the minimum 1" in got
    assert any(p.startswith("tune.memory_headroom: 1.5 must be a fraction in [0, 1)") for p in got)
    assert any(p.startswith("tune.alpha: 0.9 must be a significance level") for p in got)
    assert any(p.startswith("tune.rounds: unknown key") for p in got)
    assert problems({"matrix": MATRIX, "tune": {"confirm_runs": 4, "max_runs": 3}}) == [
        "tune.max_runs: 3 is below confirm_runs (4)"
    ]
    assert problems({"matrix": MATRIX, "tune": [1]}) == [
        "tune: must be a mapping with keys: objective, global_batch, memory_headroom, first_round, confirm_runs, "
        "max_runs, alpha"
    ]


def test_grad_accum_beside_a_global_batch_is_refused_where_it_is_written():
    got = problems(
        {"matrix": {**MATRIX, "grad_accum": [1, 2]}, "settings": {"grad_accum": 2}, "tune": {"global_batch": 8}}
    )
    assert got == [
        "settings.grad_accum: tune.global_batch (8) derives grad_accum; remove this key",
        "matrix.grad_accum: tune.global_batch (8) derives grad_accum; remove this key",
    ]


def test_a_global_batch_no_cell_can_make_is_refused():
    got = problems({"matrix": {**MATRIX, "micro_batch": [3]}, "tune": {"global_batch": 8}})
    assert got == [
        "tune.global_batch: leaves no cell: global_batch 8 is not a multiple of micro_batch 3 x 2 data-parallel "
        "ranks = 6 (and every other cell alike)"
    ]


def test_tune_cli_bad_budgets_exit_2_and_write_nothing(tmp_path, capsys):
    sc = tmp_path / "s.yaml"
    sc.write_text(
        "matrix: {model: [tiny], strategy: [ddp, zero2], precision: [fp32], gpus: [2, 4]}\ntune: {confirm_runs: 3}\n"
    )
    results = tmp_path / "results"
    base = ["tune", str(sc), "--results", str(results)]
    assert main([*base, "--budget-cells", "0"]) == 2
    assert "error: --budget-cells: 0 must be a positive number of trial runs" in capsys.readouterr().err
    assert main([*base, "--budget-minutes", "nan"]) == 2
    assert main([*base, "--budget-cells", "9", "--budget-minutes", "5"]) == 2
    assert "give one budget" in capsys.readouterr().err
    # two groups (2 and 4 GPUs) need at least 2 x (2 candidates x 3 runs) = 12 trial runs
    assert main([*base, "--budget-cells", "11"]) == 2
    err = capsys.readouterr().err
    assert "11 trial runs cannot judge 2 group(s)" in err and "= 12" in err and "Traceback" not in err
    assert not results.exists() or not any(results.rglob("*.json"))
