"""The calibration's in-step factors (harness.calibrate.in_step): the fit recovers the factors a set of probes was
made with, keeps them inside their bounds, and the time model multiplies each part of a micro-step by its factor."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from harness.calibrate.in_step import BOUNDS, fit_in_step
from harness.core.zoo import ModelConfig
from harness.plan import calibration as cal
from harness.plan.calibration.file import StepProbe
from harness.plan.compute import IN_STEP_OPERAND_BYTES, compute_of, host_per_op

PARTS = [  # (kernels, elementwise, host) seconds of five probes at the isolated rates: each part leads somewhere
    (0.7e-3, 0.6e-3, 4.0e-3),
    (42.7e-3, 8.8e-3, 1.5e-3),
    (13.6e-3, 8.3e-3, 1.5e-3),
    (26.7e-3, 10.4e-3, 1.5e-3),
    (46.0e-3, 14.4e-3, 2.8e-3),
]


def probes(k: float, e: float, h: float) -> list[StepProbe]:
    return [
        StepProbe(
            probe=f"p{i}",
            model={"d_model": 64},
            batch=1,
            seq=64,
            measured_s=k * a + e * b + h * c,
            predicted_s=a + b + c,
            kernels_s=a,
            elementwise_s=b,
            host_s=c,
        )  # fmt: skip
        for i, (a, b, c) in enumerate(PARTS)
    ]


@settings(max_examples=50, deadline=None)
@given(k=st.floats(BOUNDS[0], BOUNDS[1]), e=st.floats(BOUNDS[0], BOUNDS[1]), h=st.floats(BOUNDS[0], BOUNDS[1]))
def test_the_fit_recovers_the_factors_the_probes_were_made_with(k, e, h):
    assert fit_in_step(probes(k, e, h)) == pytest.approx((k, e, h), rel=1e-6)


def test_a_factor_beyond_its_bounds_is_held_at_the_bound():
    k, e, h = fit_in_step(probes(1.2, 40.0, 0.01))
    assert e == pytest.approx(BOUNDS[1]) and all(BOUNDS[0] <= f <= BOUNDS[1] for f in (k, e, h))


def rates_with(in_step: dict | None, *, curve: bool = False, sharing: list | None = None) -> cal.CalibratedRates:
    data = copy.deepcopy(cal.example_calibration("local"))
    if sharing is not None:
        data["sharing"] = sharing
    if curve:  # a cache-resident bandwidth at small operands, 10 GB/s beyond the caches
        data["compute"]["elementwise"] = [
            {"dtype": dt, "op_bytes": b, "gbps": g}
            for dt in ("float32", "bfloat16")
            for b, g in ((2.0**16, 80.0), (2.0**20, 20.0), (2.0**26, 10.0))
        ]
    if in_step is not None:
        data["compute"]["in_step"] = in_step
    return cal.CalibratedRates(cal.Found(Path("local.json"), cal.parse_calibration(data, file="local.json"), None))


CFG = ModelConfig(d_model=128, n_layers=2, n_heads=4, ffn=344, vocab=4096)


def compute(rates: cal.CalibratedRates, precision: str = "fp32"):
    mode = "fp32" if precision == "fp32" else "lowp"
    return compute_of(
        CFG, mode=mode, precision=precision, batch=2, seq_len=128, policy="full", tp=1, sequence_parallel=False,
        rates=rates,
    )  # fmt: skip


def test_each_part_of_a_micro_step_is_multiplied_by_its_factor():
    plain = rates_with(None)
    fit = {"float32": {"kernels": 2.0, "elementwise": 3.0, "host": 0.5}}
    scaled = rates_with(fit)
    a, b = compute(plain), compute(scaled)
    assert b.elementwise == pytest.approx(3.0 * a.elementwise)
    assert b.recompute_elementwise == pytest.approx(3.0 * a.recompute_elementwise)
    assert b.total - b.elementwise - b.recompute_elementwise == pytest.approx(
        2.0 * (a.total - a.elementwise - a.recompute_elementwise)
    )
    assert host_per_op(scaled, "fp32") == pytest.approx(tuple(0.5 * x for x in host_per_op(plain, "fp32")))
    # a dtype the calibration did not fit takes float32's factors; a file without the fit prices at 1
    assert host_per_op(scaled, "bf16") == pytest.approx(host_per_op(scaled, "fp32"))
    assert plain.in_step("float32") == (1.0, 1.0, 1.0)


def test_every_elementwise_byte_is_priced_beyond_the_caches():
    """An activation of this model is 128 KiB, where the curve says 80-20 GB/s; inside a step every elementwise byte
    is priced at the bandwidth of the largest operand (10 GB/s): the same seconds as a flat 10 GB/s curve."""
    assert IN_STEP_OPERAND_BYTES >= 2.0**26
    curved, flat = compute(rates_with(None, curve=True)), compute(rates_with(None))
    assert curved.elementwise == pytest.approx(flat.elementwise) and curved.elementwise > 0
    assert curved.recompute_elementwise == pytest.approx(flat.recompute_elementwise)


def mid_probe(measured_s: float) -> dict:
    return {
        "probe": "mid", "model": {"d_model": 224}, "batch": 2, "seq": 192, "measured_s": measured_s,
        "predicted_s": 0.05, "kernels_s": 0.03, "elementwise_s": 0.015, "host_s": 0.005,
    }  # fmt: skip


def test_the_factors_follow_the_hosts_median_speed_over_the_calibration():
    """The in-step probes timed the `mid` plain step at 70 ms; the sharing probes timed the same step on rank 0 alone
    at 80, 79 and 86 ms minutes later (at 1, 2 and 4 ranks): over the calibration the host's median is 79.5 ms, so
    the factors fitted at the 70 ms moment are multiplied by 79.5 / 70 (and bf16's by its own timings')."""
    fit = {"kernels": 2.0, "elementwise": 3.0, "host": 0.5}
    in_step = {"float32": {**fit, "probes": [mid_probe(0.070)]}, "bfloat16": {**fit, "probes": [mid_probe(0.040)]}}
    sharing = [
        {"ranks": 1, "step_alone_s": 0.080, "step_bfloat16_alone_s": 0.040},
        {"ranks": 2, "step_alone_s": 0.079, "step_bfloat16_alone_s": 0.044},
        {"ranks": 4, "step_alone_s": 0.086},  # a file may lack a probe at some rank count
    ]
    rates = rates_with(in_step, sharing=sharing)
    drift = (0.079 + 0.080) / 2 / 0.070
    assert rates.in_step("float32") == pytest.approx((2.0 * drift, 3.0 * drift, 0.5 * drift))
    assert rates.in_step("bfloat16") == pytest.approx(tuple(f * 0.040 / 0.040 for f in (2.0, 3.0, 0.5)))
    # no sharing timings, or no `mid` probe (older files): the factors as fitted
    assert rates_with(in_step).in_step("float32") == pytest.approx((2.0, 3.0, 0.5))
    assert rates_with({"float32": fit}, sharing=sharing).in_step("float32") == pytest.approx((2.0, 3.0, 0.5))
