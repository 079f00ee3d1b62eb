"""FLOPs per step: the zoo's formula (6 per matmul parameter + the attention term) and the recompute that
activation checkpointing adds, checked against torch.utils.flop_counter.FlopCounterMode.

Two counts: on the meta device (no memory, no compute: SDPA takes the math path there, two bmm's forward
and four backward, exactly the 12 · n_layers · d_model · seq_len convention), and a real CPU forward +
backward through the SDPA flash kernel for CPU, which FlopCounterMode counts only once its formulas are
registered here. Its flash-backward formula adds the recomputation of the scores (2 · b · h · s² · hd,
a hardware FLOP): that is the one documented difference.
"""

from __future__ import annotations

import pytest

from harness.core.zoo import ZOO, ModelConfig
from harness.plan import flops
from harness.scenario.spec import RunSpec, Settings

torch = pytest.importorskip("torch")
from torch.utils.flop_counter import (  # noqa: E402
    FlopCounterMode,
    flop_registry,
    register_flop_formula,
    sdpa_backward_flop_count,
    sdpa_flop_count,
)

from harness.worker.models import apply_activation_checkpointing, build_model, loss_fn  # noqa: E402

aten = torch.ops.aten


def _cpu_sdpa(query_shape, key_shape, value_shape, *args, out_shape=None, **kwargs):
    return sdpa_flop_count(query_shape, key_shape, value_shape)


def _cpu_sdpa_backward(grad_out_shape, query_shape, key_shape, value_shape, *args, out_shape=None, **kwargs):
    return sdpa_backward_flop_count(grad_out_shape, query_shape, key_shape, value_shape)


def register_cpu_sdpa() -> None:
    """Teach FlopCounterMode the CPU flash-attention ops (it knows only the CUDA ones and counts these as 0)."""
    for op, formula in (
        (aten._scaled_dot_product_flash_attention_for_cpu, _cpu_sdpa),
        (aten._scaled_dot_product_flash_attention_for_cpu_backward, _cpu_sdpa_backward),
    ):
        if op not in flop_registry:
            register_flop_formula(op)(formula)


def counted_flops(cfg: ModelConfig, *, micro_batch: int, seq_len: int, device: str, ckpt: bool | str = False) -> dict:
    torch.manual_seed(0)
    model = build_model(cfg, seed=0, device=device)
    if ckpt:
        apply_activation_checkpointing(model, "full" if ckpt is True else ckpt)
    x = torch.randint(0, cfg.vocab, (micro_batch, seq_len), device=device)
    y = torch.randint(0, cfg.vocab, (micro_batch, seq_len), device=device)
    with FlopCounterMode(display=False) as counter:
        loss_fn(model(x), y).backward()
    return {
        "total": counter.get_total_flops(),
        "by_op": {str(k): v for k, v in counter.get_flop_counts()["Global"].items()},
    }


def spec_for(cfg: ModelConfig, *, micro_batch: int, seq_len: int, ckpt: bool | str = False, world: int = 1) -> RunSpec:
    return RunSpec(
        model="m",
        model_config=cfg,
        strategy="ddp",
        precision="fp32",
        gpus=world,
        nodes=1,
        gpus_per_node=world,
        settings=Settings(micro_batch=micro_batch, seq_len=seq_len, activation_checkpointing=ckpt),
    )


GQA = ModelConfig(d_model=256, n_layers=3, n_heads=8, ffn=688, vocab=1000, n_kv_heads=2)
SIZES = [  # (name, config, micro_batch, seq_len): three zoo sizes and a grouped-query shape, meta device
    ("tiny", ZOO["tiny"], 2, 64),
    ("125m", ZOO["125m"], 1, 128),
    ("1.3b", ZOO["1.3b"], 1, 256),
    ("gqa", GQA, 2, 128),
]


@pytest.mark.parametrize("name, cfg, mb_, seq", SIZES, ids=[s[0] for s in SIZES])
def test_model_flops_match_flop_counter(name, cfg, mb_, seq):
    got = counted_flops(cfg, micro_batch=mb_, seq_len=seq, device="meta")
    want = flops.flops_per_step(spec_for(cfg, micro_batch=mb_, seq_len=seq))
    assert want == pytest.approx(got["total"], rel=0.02)
    assert want == got["total"]  # exact: matmuls 2/4 FLOPs per MAC forward/backward, attention 4 + 8 b·h·s²·hd
    attention = 12 * cfg.n_layers * cfg.d_model * seq * mb_ * seq
    assert got["by_op"]["aten.bmm"] == attention


@pytest.mark.parametrize("name, cfg, mb_, seq", SIZES, ids=[s[0] for s in SIZES])
def test_checkpointing_recompute_matches_flop_counter(name, cfg, mb_, seq):
    """HFU's numerator: one more forward of every block except its last matmul (w2): non-reentrant
    checkpointing stops recomputing once every saved tensor is back, and nothing saves w2's output."""
    s = spec_for(cfg, micro_batch=mb_, seq_len=seq, ckpt=True)
    got = counted_flops(cfg, micro_batch=mb_, seq_len=seq, device="meta", ckpt=True)
    assert flops.hardware_flops_per_step(s) == got["total"]
    assert flops.flops_per_step(s) == flops.flops_per_step(spec_for(cfg, micro_batch=mb_, seq_len=seq))
    assert flops.hardware_flops_per_step(spec_for(cfg, micro_batch=mb_, seq_len=seq)) == flops.flops_per_step(s)


@pytest.mark.parametrize("device", ["meta", "cpu"])
@pytest.mark.parametrize("name, cfg, mb_, seq", [SIZES[0], SIZES[3]], ids=["tiny", "gqa"])
def test_selective_checkpointing_recomputes_no_matmul(name, cfg, mb_, seq, device):
    """The selective policy keeps every matmul's and the attention kernel's output, so its recompute adds
    no FLOPs the counter sees (on meta SDPA decomposes to bmm, on CPU it is the flash kernel): HFU = MFU."""
    register_cpu_sdpa()
    plain = counted_flops(cfg, micro_batch=mb_, seq_len=seq, device=device)
    sel = counted_flops(cfg, micro_batch=mb_, seq_len=seq, device=device, ckpt="selective")
    full = counted_flops(cfg, micro_batch=mb_, seq_len=seq, device=device, ckpt="full")
    assert sel["by_op"] == plain["by_op"] and full["total"] > plain["total"]
    s = spec_for(cfg, micro_batch=mb_, seq_len=seq, ckpt="selective")
    assert flops.hardware_flops_per_step(s) == flops.flops_per_step(s)
    if device == "meta":
        assert flops.flops_per_step(s) == sel["total"]


@pytest.mark.parametrize(
    "cfg, mb_, seq",
    [(ZOO["tiny"], 2, 64), (ModelConfig(d_model=128, n_layers=2, n_heads=4, ffn=352, vocab=2000), 1, 128)],
    ids=["tiny", "small"],
)
def test_cpu_flash_attention_counts_the_scores_recompute(cfg, mb_, seq):
    """A real CPU step: without the registration SDPA counts 0; with it, the counter's flash-backward formula
    also counts recomputing QKᵀ (2 of its 10 b·h·s²·hd), which model FLOPs (and MFU) leave out."""
    saved = {
        op: flop_registry.pop(op)
        for op in (
            aten._scaled_dot_product_flash_attention_for_cpu,
            aten._scaled_dot_product_flash_attention_for_cpu_backward,
        )
        if op in flop_registry
    }
    try:
        unregistered = counted_flops(cfg, micro_batch=mb_, seq_len=seq, device="cpu")
    finally:
        flop_registry.update(saved)
    assert not any("flash_attention" in op for op in unregistered["by_op"])
    register_cpu_sdpa()
    got = counted_flops(cfg, micro_batch=mb_, seq_len=seq, device="cpu")
    assert got["by_op"]["aten._scaled_dot_product_flash_attention_for_cpu"] > 0
    tokens = mb_ * seq
    model = flops.flops_per_step(spec_for(cfg, micro_batch=mb_, seq_len=seq))
    scores_recompute = 2 * cfg.n_layers * cfg.d_model * seq * tokens
    assert got["total"] == model + scores_recompute
    assert model == pytest.approx(got["total"], rel=0.03)


def test_flops_per_step_is_global():
    cfg = ZOO["125m"]
    one = flops.flops_per_step(spec_for(cfg, micro_batch=2, seq_len=512, world=1))
    eight = flops.flops_per_step(spec_for(cfg, micro_batch=2, seq_len=512, world=8))
    assert eight == 8 * one == 8 * cfg.flops_per_token(512) * 2 * 512


def test_recompute_formula():
    cfg = ZOO["7b"]
    per_block = cfg.block_params() - 2 * cfg.d_model  # matmul parameters of a block
    want = cfg.n_layers * (2 * (per_block - cfg.d_model * cfg.ffn) + 4 * cfg.d_model * 4096)
    assert flops.recompute_flops_per_token(cfg, 4096) == want
    # about a quarter on top of the model FLOPs (a forward is a third of forward+backward, minus w2)
    assert 0.2 < want / cfg.flops_per_token(4096) < 0.3


# ---- MFU / HFU as the worker computes them on a GPU (the device name is given, not detected: no GPU here) ----


@pytest.mark.parametrize("ac", ["none", "full", "selective"])
def test_mfu_on_an_h200_divides_by_the_dense_bf16_peak(ac):
    from harness.worker.runner import utilisation
    from tests.conftest import make_spec

    spec = make_spec(strategy="ddp", precision="bf16", model="1.3b", gpus=1, activation_checkpointing=ac)
    reasons: dict[str, str] = {}
    mfu, hfu, peak = utilisation(
        spec, 550.0, device_type="cuda", device_name="NVIDIA H200", allow_tf32=False, null_reasons=reasons
    )
    assert peak == 989.4 and mfu == pytest.approx(550.0 / 989.4) and reasons == {}
    # full checkpointing recomputes each block's forward: HFU = MFU x (6N + recompute) / 6N-with-attention
    ratio = flops.hardware_flops_per_step(spec) / flops.flops_per_step(spec)
    assert hfu == pytest.approx(mfu * ratio)
    # (full: the blocks' forward again, at most a third more, less the head's share; selective: no matmul again)
    assert (1.2 < ratio < 4 / 3) if ac == "full" else (ratio == 1.0)


def test_fp32_mfu_uses_the_tf32_peak_only_when_tf32_is_allowed():
    from harness.worker.runner import utilisation
    from tests.conftest import make_spec

    spec = make_spec(strategy="ddp", precision="fp32", model="125m", gpus=1)
    assert (
        utilisation(
            spec, 40.0, device_type="cuda", device_name="NVIDIA H100 80GB HBM3", allow_tf32=True, null_reasons={}
        )[2]
        == 494.7
    )
    assert (
        utilisation(
            spec, 40.0, device_type="cuda", device_name="NVIDIA H100 80GB HBM3", allow_tf32=False, null_reasons={}
        )[2]
        == 67.0
    )


@pytest.mark.parametrize("device_type, name", [("cpu", "cpu"), ("cuda", "NVIDIA GeForce RTX 4090")])
def test_mfu_is_null_with_a_reason_where_the_peak_is_unknown(device_type, name):
    from harness.worker.runner import utilisation
    from tests.conftest import make_spec

    spec = make_spec(strategy="ddp", precision="bf16", gpus=1)
    reasons: dict[str, str] = {}
    assert utilisation(
        spec, 1.0, device_type=device_type, device_name=name, allow_tf32=False, null_reasons=reasons
    ) == (None, None, None)
    assert (
        reasons["mfu"] == reasons["hfu"] and f"no dense peak FLOPS known for device {name!r} (bf16)" in reasons["mfu"]
    )


@pytest.mark.parametrize(
    "device_name, peak_name, bf16",
    [
        ("NVIDIA H100 NVL", "H100 NVL", 835.5),  # issue 32: was no entry (MFU null)
        ("NVIDIA H200 NVL", "H200 NVL", 835.5),  # issue 32: was the SXM part's 989.4
        ("NVIDIA H200", "H200", 989.4),
        ("NVIDIA H100 80GB HBM3", "H100 SXM", 989.4),
        ("NVIDIA H100 PCIe", "H100 PCIe", 756.0),
    ],
)
def test_each_hopper_part_gets_its_own_dense_peak(device_name, peak_name, bf16):
    from harness.scenario.cluster import find_peak

    peak = find_peak(device_name)
    assert peak is not None and (peak.name, peak.tflops["bf16"]) == (peak_name, bf16)
