"""How a cell computes: its precision mode, and the FLOPs of one optimizer step (model FLOPs, the MFU numerator, and
hardware FLOPs with activation checkpointing's recompute, the HFU numerator). Pure arithmetic: no torch import
(`harness plan` must stay fast); the worker's MFU and HFU divide by the same numbers.

Units: FLOPs per optimizer step over all ranks (global), counted as multiply-adds × 2; per token where the name says so.
"""

from __future__ import annotations

from harness.core import precisions
from harness.core.catalogue import CATALOGUE
from harness.core.zoo import ModelConfig
from harness.scenario.spec import RunSpec

PRECISION_MODES = ("fp32", "autocast", "lowp")
"""How a cell computes: fp32 everywhere; autocast (fp32 params and residual stream, matmuls in 16 bit: DDP);
lowp (16-bit params, so the residual stream is 16 bit too: FSDP/FSDP2 mixed precision, DeepSpeed bf16/fp16)."""


def precision_mode(strategy: str, precision: str) -> str:
    """fp32, or how the strategy computes in 16 bit (its catalogue entry's `mixed`)."""
    if not precisions.get(precision).mixed:
        return "fp32"
    return CATALOGUE[strategy].mixed


def recompute_flops_per_token(cfg: ModelConfig, seq_len: int) -> float:
    """FLOPs activation checkpointing adds per token: the forward of every block again (2 per matmul
    parameter, and the attention forward, 4 · d_model · seq_len per layer), except the block's last matmul.

    The MLP's down projection (w2, d_model × ffn) is not recomputed: its output is saved by nothing (the
    residual add needs no inputs), and non-reentrant checkpointing stops recomputing as soon as every saved
    tensor is back (`torch.utils.checkpoint` early stop, on by default). FlopCounterMode agrees exactly.
    """
    measured = cfg.measured_step(micro_batch=1, seq_len=seq_len, mode="fp32")
    if measured is not None:  # a module the harness did not write: counted on fake tensors
        return measured.recompute_flops / seq_len
    per_block_matmul = (cfg.n_matmul_params() - cfg.head_params()) / cfg.n_layers
    recomputed = per_block_matmul - cfg.d_model * cfg.ffn
    return cfg.n_layers * (2.0 * recomputed + 4.0 * cfg.d_model * seq_len)


def flops_per_step(spec: RunSpec) -> float:
    """Model FLOPs per optimizer step over all ranks: `ModelConfig.flops_per_token` (6 per matmul parameter
    + 12 · n_layers · d_model · seq_len, full attention square) × global tokens per step. The MFU numerator."""
    return spec.model_config.flops_per_token(spec.settings.seq_len) * spec.tokens_per_step


def hardware_flops_per_step(spec: RunSpec) -> float:
    """FLOPs the devices execute per step: model FLOPs plus the recomputed forward of every block under
    activation checkpointing. The HFU numerator."""
    full = spec.settings.activation_checkpointing == "full"  # selective keeps every matmul's and SDPA's output
    extra = recompute_flops_per_token(spec.model_config, spec.settings.seq_len) if full else 0.0
    return flops_per_step(spec) + extra * spec.tokens_per_step
