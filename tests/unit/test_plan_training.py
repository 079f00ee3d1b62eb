"""`harness plan --tokens`: days, GPU-hours and cost of training N tokens at each cell's predicted throughput, on a
shipped GPU profile's sourced figures (no GPU runs: the prediction is arithmetic)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from harness.cli import main
from harness.core.errors import InputError
from harness.plan.training import parse_tokens

REPO = Path(__file__).resolve().parents[2]
SMALL = str(REPO / "validation" / "plan-small.yaml")


def test_token_counts_parse_and_bad_ones_are_named():
    assert parse_tokens("1T") == 1e12 and parse_tokens("300B") == 3e11 and parse_tokens("2.5e12") == 2.5e12
    assert parse_tokens("1000") == 1000.0 and parse_tokens("2k") == 2000.0
    for bad in ("1X", "", "-3T", "0"):
        with pytest.raises(InputError) as e:
            parse_tokens(bad)
        assert "--tokens" in str(e.value) and repr(bad) in str(e.value)


def test_plan_tokens_gives_days_and_gpu_hours_and_a_null_cost_with_its_reason(capsys):
    assert main(["plan", SMALL, "--cluster", "h100", "--format", "json", "--tokens", "1T"]) == 0
    cells = json.loads(capsys.readouterr().out)
    assert len(cells) == 8
    for c in cells:
        t = c["training"]
        assert t["tokens"] == 1e12 and t["cost"] is None
        if c["unsupported"]:
            assert t["days"] is None and t["reason"].startswith("no step time: fsdp.hybrid_shard shards inside")
            continue
        rate = c["tokens_per_s_per_gpu"]
        assert t["gpu_hours"] == pytest.approx(1e12 / rate / 3600)
        assert t["days"] == pytest.approx(t["gpu_hours"] / c["spec"]["gpus"] / 24)
        assert "price_per_gpu_hour" in t["reason"]
    assert main(["plan", SMALL, "--cluster", "h100", "--tokens", "1X"]) == 2
    assert "'1X' is not a token count" in capsys.readouterr().err
