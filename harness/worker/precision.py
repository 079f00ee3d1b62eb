"""Precision policies: fp32, fp16 (+ dynamic loss scaling), bf16, and what each strategy family does with them.

| precision | DDP                          | FSDP1 / FSDP2                                     | DeepSpeed          |
|-----------|------------------------------|---------------------------------------------------|--------------------|
| fp32      | fp32 everything              | no mixed precision                                | no fp16/bf16 block |
| bf16      | autocast(bf16), fp32 params  | params gathered in bf16, gradients reduced in fp32 | `bf16: enabled`    |
| fp16      | autocast(fp16) + GradScaler  | as bf16 with fp16 + ShardedGradScaler             | `fp16: enabled`    |

fp16's step unscales before it steps (harness.worker.strategies.base.TorchTrainer.optimizer_step), and FSDP's fp16
AdamW is foreach, not fused, on every device (adamw_kwargs): ranks then skip an overflow together.

Gradients are reduced in fp32 under FSDP mixed precision (torchtitan's default) so low-precision compute
does not also mean low-precision accumulation across ranks; DeepSpeed reduces in its model dtype.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch

from harness.core import precisions


@dataclass(frozen=True)
class PrecisionPolicy:
    name: str
    compute_dtype: torch.dtype
    """dtype matmuls run in"""
    loss_scaling: bool
    """fp16 needs a (dynamic) loss scaler; bf16 has fp32's exponent range and does not"""

    @property
    def mixed(self) -> bool:
        return self.compute_dtype != torch.float32

    def autocast(self, device_type: str) -> contextlib.AbstractContextManager:
        """Autocast for strategies that keep fp32 parameters (DDP)."""
        if not self.mixed:
            return contextlib.nullcontext()
        return torch.autocast(device_type=device_type, dtype=self.compute_dtype)


def policy(name: str) -> PrecisionPolicy:
    """The policy of a precision of harness.core.precisions: its dtype as torch's, its loss scaling."""
    entry = precisions.get(name)
    return PrecisionPolicy(name, getattr(torch, entry.dtype), loss_scaling=entry.loss_scaling)
