"""Every strategy trains: with the same seed and batches, fp32 runs of every family reach the same losses
as a single-process reference (relative 1e-4) — proof that `step` does the real work, not a no-op.
bf16 runs finish with finite, decreasing loss. Real processes, real gloo process groups.

The fp32 and bf16 cells are those of scenarios/smoke.yaml (every strategy, world 2, hybrids 4 = 2×2; 2
warmup + 5 measured steps), swept once per session by the `smoke_sweep` fixture and shared with the
collective-accounting and integration tests."""

from __future__ import annotations

import math

import pytest
import torch

from harness.launch.local import prefork
from harness.plan.comm import predict_comm
from harness.scenario.cluster import load_cluster
from harness.scenario.spec import STRATEGIES, RunSpec
from harness.worker.models import build_model, loss_fn, synthetic_batch
from harness.results.spec import spec_from_json
from tests.conftest import make_spec, run_cell

pytestmark = pytest.mark.dist

STEPS = dict(warmup_steps=2, measure_steps=2)  # 4 losses: the last one is after 3 optimizer steps


@pytest.fixture(scope="module", autouse=True)
def _warm_ranks():
    """The cells of this module fork their ranks from one warm zygote, as a local sweep's are (forked ranks
    measure what cold ones do: tests/dist/test_prefork.py); no torch import per rank."""
    with prefork.zygote(load_cluster("local").env, label="test_equivalence"):
        yield


def reference_losses(spec) -> list[float]:
    """One process, the whole global batch (every data-parallel replica's rows), plain AdamW: what every strategy
    and layout must reproduce."""
    s = spec.settings
    torch.manual_seed(s.seed)
    model = build_model(spec.model_config, seed=s.seed, device="cpu")
    opt = torch.optim.AdamW(model.parameters(), lr=s.lr, foreach=True)
    batches = [synthetic_batch(spec.model_config, seed=s.seed, rank=0, micro_batch=s.micro_batch * spec.dp,
                               seq_len=s.seq_len, micro_step=i) for i in range(s.grad_accum)]
    losses = []
    for _ in range(s.warmup_steps + s.measure_steps):
        total = 0.0
        for x, y in batches:
            loss = loss_fn(model(x), y) / s.grad_accum
            loss.backward()
            total += loss.item()
        opt.step()
        opt.zero_grad()
        losses.append(total)
    return losses


def smoke_record(smoke_sweep, strategy: str, precision: str) -> tuple[dict, RunSpec]:
    (rec,) = [r for r in smoke_sweep["records"].values()
              if (r["spec"]["strategy"], r["spec"]["precision"]) == (strategy, precision)
              and r["spec"].get("tp", 1) == r["spec"].get("pp", 1) == 1]  # layout cells: tests/dist/test_layouts.py
    assert rec["status"] == "ok", rec.get("reason")
    return rec, spec_from_json(rec["spec"])


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_fp32_matches_single_process_reference(strategy, smoke_sweep):
    rec, spec = smoke_record(smoke_sweep, strategy, "fp32")
    ref = reference_losses(spec)
    got = rec["metrics"]["losses"]
    assert len(got) == len(ref) == spec.settings.warmup_steps + spec.settings.measure_steps
    for i, (g, r) in enumerate(zip(got, ref)):
        assert g == pytest.approx(r, rel=1e-4), f"step {i + 1}: {strategy} {g} vs reference {r}"
    assert got[-1] < got[0]


@pytest.mark.parametrize("strategy", ["ddp", "fsdp.full_shard", "fsdp2.full_shard", "zero2"])
def test_gradient_accumulation_matches_reference(strategy, results):
    spec = make_spec(strategy=strategy, precision="fp32", grad_accum=2, micro_batch=1, **STEPS)
    rec = run_cell(spec, results)
    assert rec["status"] == "ok", rec.get("reason")
    for g, r in zip(rec["metrics"]["losses"], reference_losses(spec)):
        assert g == pytest.approx(r, rel=1e-4)


@pytest.mark.parametrize("policy", ["full", "selective"])
@pytest.mark.parametrize("strategy", ["ddp", "fsdp.full_shard", "fsdp2.full_shard", "zero3"])
def test_activation_checkpointing_matches_reference(strategy, policy, results):
    """Recomputing (all of a block, or all but its matmuls and attention) changes no number: the losses are
    the reference's, and the collectives are the analytic model's (ZeRO-3 gathers parameters again for
    the recompute: the model's trace of module calls says which)."""
    spec = make_spec(strategy=strategy, precision="fp32", activation_checkpointing=policy, **STEPS)
    assert spec.settings.activation_checkpointing == policy
    rec = run_cell(spec, results)
    assert rec["status"] == "ok", rec.get("reason")
    for g, r in zip(rec["metrics"]["losses"], reference_losses(spec), strict=True):
        assert g == pytest.approx(r, rel=1e-4)
    pred = predict_comm(spec)
    assert rec["comm"]["bytes_per_step"] == pred["comm_bytes_per_step"]
    assert rec["comm"]["calls_per_step"] == pred["calls_per_step"]


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_bf16_finite_and_decreasing(strategy, smoke_sweep):
    rec, spec = smoke_record(smoke_sweep, strategy, "bf16")
    losses = rec["metrics"]["losses"]
    assert all(math.isfinite(x) for x in losses)
    assert all(b < a for a, b in zip(losses, losses[1:])), losses
    # bf16 trains the same model: close to the fp32 reference, but not bit-equal (it is really bf16)
    ref = reference_losses(spec)
    assert losses[0] == pytest.approx(ref[0], rel=2e-2)
    assert losses != pytest.approx(ref, rel=1e-7)
