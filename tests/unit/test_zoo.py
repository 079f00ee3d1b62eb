"""Zoo parameter counts: the pure formula, the torch module and the published sizes agree."""

from __future__ import annotations

import pytest
import torch

from harness.core.zoo import ZOO
from harness.worker.models import build_model


@pytest.mark.parametrize("name", list(ZOO))
def test_formula_matches_module(name):
    model = build_model(ZOO[name], seed=0, device="meta")  # meta: no memory, even for 70b
    assert sum(p.numel() for p in model.parameters()) == ZOO[name].n_params()


@pytest.mark.parametrize(
    "name,expected",
    [
        ("7b", 6_738_415_616),  # Llama-2-7B's published count
        ("13b", 13_015_864_320),  # Llama-2-13B
        ("70b", 68_976_648_192),  # Llama-2-70B (GQA, 8 kv heads)
        ("125m", 134_105_856),
        ("1.3b", 1_345_423_360),
    ],
)
def test_published_sizes(name, expected):
    assert ZOO[name].n_params() == expected


def test_keyed_init_is_build_path_independent():
    from harness.worker.models import init_module_

    eager = build_model(ZOO["tiny"], seed=3, device="cpu")
    lazy = build_model(ZOO["tiny"], seed=3, device="meta")
    lazy.to_empty(device="cpu")
    for m in reversed(list(lazy.modules())):  # a different order than construction
        init_module_(m)
    for (n, a), (_, b) in zip(eager.named_parameters(), lazy.named_parameters()):
        assert torch.equal(a, b), n
    other = build_model(ZOO["tiny"], seed=4, device="cpu")
    assert not torch.equal(other.head.weight, eager.head.weight)
