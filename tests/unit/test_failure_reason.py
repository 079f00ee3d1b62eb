"""A failed rank's reason says what and where (issue 31): an exception without a message — torch's bare
`AssertionError` inside `_StridedShard._shard_tensor` once was a record's whole reason, "AssertionError:" — reads
"AssertionError: no message (raised at torch/distributed/tensor/placement_types.py:993 in _shard_tensor)"."""

from __future__ import annotations

import re

import torch

from harness.worker.runner import failure_reason


def _raise_bare() -> None:
    raise AssertionError


def test_an_empty_exception_names_where_it_was_raised():
    try:
        _raise_bare()
    except AssertionError as e:
        reason = failure_reason(e)
    assert re.fullmatch(
        r"AssertionError: no message \(raised at tests/unit/test_failure_reason\.py:\d+ in _raise_bare\)", reason
    )


def test_an_exception_inside_an_installed_package_is_named_from_the_package():
    try:
        torch.nn.Linear(2, 3).load_state_dict({})
    except RuntimeError as e:
        reason = failure_reason(e)
    assert reason.startswith("RuntimeError: Error(s) in loading state_dict for Linear:"), reason
    assert re.search(r" \(raised at torch/nn/modules/module\.py:\d+ in load_state_dict\)$", reason), reason
