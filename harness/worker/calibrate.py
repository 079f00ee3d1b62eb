"""Moved: `harness calibrate`'s measurements are harness.calibrate (device, group, framework, process), and the
strategies whose framework overhead a calibration measures are harness.plan.calibration.file.FRAMEWORK_STRATEGIES.

This module keeps only that name's old import path, for tests/unit/test_catalogue.py (issue 29's calibrate branch
could not edit it); once that test imports it from harness.plan.calibration, delete this file.
"""

from __future__ import annotations

from harness.plan.calibration.file import FRAMEWORK_STRATEGIES

__all__ = ["FRAMEWORK_STRATEGIES"]
