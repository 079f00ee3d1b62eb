"""The activation model of harness.plan.memory: the moments of a training step at which a rank's memory can peak
(`WINDOWS`) and the bytes the zoo's decoder saves for backward and holds transiently at each (`ActivationModel`),
traced op by op. Pure arithmetic: no torch import."""

from __future__ import annotations

from dataclasses import dataclass

from harness.core.zoo import ModelConfig
from harness.plan.layouts import LOSS_TRANSIENT_BYTES_PER_LOGIT

FORWARD_END, LOSS_BACKWARD, HEAD_BACKWARD, BLOCK_BACKWARD, BLOCK_REDUCE, LAST_BLOCK, BACKWARD_END, OPTIMIZER_STEP = (
    "forward end",
    "loss backward",
    "head backward",
    "block backward",
    "block reduce",
    "last block backward",
    "backward end",
    "optimizer step",
)
WINDOWS = (
    FORWARD_END,
    LOSS_BACKWARD,
    HEAD_BACKWARD,
    BLOCK_BACKWARD,
    BLOCK_REDUCE,
    LAST_BLOCK,
    BACKWARD_END,
    OPTIMIZER_STEP,
)
"""The moments of a training step at which a rank's memory can peak."""
WINDOW_HELP = {
    FORWARD_END: "all activations saved",
    LOSS_BACKWARD: "start of backward",
    HEAD_BACKWARD: "the head's backward done, every block's activations still saved",
    BLOCK_BACKWARD: "inside the first block's backward",
    BLOCK_REDUCE: "the first block's gradients complete",
    LAST_BLOCK: "inside the last block's backward, the other blocks' gradients done",
    BACKWARD_END: "all gradients complete",
    OPTIMIZER_STEP: "no activations",
}


@dataclass(frozen=True)
class ActivationModel:
    """Bytes saved for backward by harness.worker.models.Transformer, per token, traced op by op.

    Derivation (T tokens per micro-batch, a = bytes of the compute dtype, per token unless said):
    RMSNorm saves its fp32 input (`x.float()`: the residual stream itself when that is fp32, else a copy,
    4d), rsqrt (4) and the normalised value (fp32 4d, or its 16-bit `type_as` copy a·d in lowp); a Linear
    saves its input: the norm output (4d in fp32, a·d in lowp, shared by q/k/v and by w1/w3) except under
    autocast, which casts the input once per Linear (3·a·d for q/k/v, 2·a·d for w1/w3). Attention saves
    the rotated q and k, v (k and v after GQA's repeat_interleave, so d wide either way), the SDPA output
    and the copy that transpose+reshape makes for wo (5·a·d), and SDPA's fp32 logsumexp (4·n_heads); the
    flash kernels save nothing of size seq² (no attention matrix). SwiGLU saves w1's and w3's outputs,
    silu's output and the product (4·a·ffn). RoPE's rotations save only their cached cos/sin tables.
    Outside the blocks: the final norm, the head's input, log_softmax's fp32 output (4·vocab) and the int64
    tokens and targets (16).

    Per block: fp32 44d + 16ffn + 4h + 8; autocast (a=2) 36d + 8ffn + 4h + 8; lowp (a=2) 26d + 8ffn + 4h + 8.
    Checked against saved-tensor hooks and torch's MemTracker on CPU in tests/unit/test_model_budget.py.
    """

    cfg: ModelConfig
    mode: str
    tokens: int
    """tokens per micro-batch on this rank (micro_batch × seq_len)"""

    @property
    def compute_bytes(self) -> int:
        return 4 if self.mode == "fp32" else 2

    @property
    def residual_bytes(self) -> int:
        """dtype of the residual stream (block inputs): fp32 unless the parameters themselves are 16 bit"""
        return 2 if self.mode == "lowp" else 4

    def _norm_per_token(self) -> int:
        d, a = self.cfg.d_model, self.compute_bytes
        normalised = a * d if self.mode == "lowp" else 4 * d
        return 4 * d + 4 + normalised

    def _linear_inputs_per_token(self, consumers: int) -> int:
        d, a = self.cfg.d_model, self.compute_bytes
        if self.mode == "autocast":
            return consumers * a * d
        return a * d

    def block_per_token(self) -> int:
        """Bytes one block saves per token."""
        c, a = self.cfg, self.compute_bytes
        attention = 5 * a * c.d_model + 4 * c.n_heads
        mlp = 4 * a * c.ffn
        return (
            2 * self._norm_per_token()
            + self._linear_inputs_per_token(3)
            + attention
            + self._linear_inputs_per_token(2)
            + mlp
        )

    def block_input_per_token(self) -> int:
        """Bytes of a block's input (the residual stream), which non-reentrant checkpointing keeps."""
        return self.residual_bytes * self.cfg.d_model

    def outside_blocks_per_token(self) -> int:
        """Final norm, head input, log-probabilities, tokens and targets."""
        return self._norm_per_token() + self._linear_inputs_per_token(1) + 4 * self.cfg.vocab + 16

    def block(self) -> int:
        return self.tokens * self.block_per_token()

    def block_input(self) -> int:
        return self.tokens * self.block_input_per_token()

    def outside_blocks(self) -> int:
        return self.tokens * self.outside_blocks_per_token()

    def selective_kept_per_token(self) -> int:
        """Bytes the `selective` policy keeps per block per token beside the block's input: the outputs of its
        seven matmuls (q and o projections, w2: d wide; k and v: kv_heads · head_dim; w1, w3: ffn) and of
        SDPA (d, and its fp32 logsumexp)."""
        c, a = self.cfg, self.compute_bytes
        kv = c.kv_heads * c.head_dim
        return a * (4 * c.d_model + 2 * kv + 2 * c.ffn) + 4 * c.n_heads

    def kept_per_block(self, policy: str) -> int:
        """Bytes one block keeps from its forward to its backward under `policy` (none | full | selective)."""
        if policy == "none":
            return self.block()
        kept = self.block_input()
        return kept + (self.tokens * self.selective_kept_per_token() if policy == "selective" else 0)

    def saved_end_of_forward(self, *, checkpointing: str) -> int:
        """Bytes saved for backward when forward returns, under a policy (none | full | selective)."""
        return self.cfg.n_layers * self.kept_per_block(checkpointing) + self.outside_blocks()

    def recompute_extra(self, policy: str = "full") -> int:
        """What recomputing one checkpointed block adds to what it kept: the block's saved tensors, less its
        input when the residual stream is fp32 (the norm saves its input as is) and, under `selective`, less
        the kept outputs that the backward uses as they are (SDPA's output and logsumexp, w1's and w3's
        outputs, and v, a view of wv's output, without grouped-query heads)."""
        extra = self.block() - (self.block_input() if self.mode != "lowp" else 0)
        if policy == "selective":
            c, a = self.cfg, self.compute_bytes
            reused = a * c.d_model + 4 * c.n_heads + 2 * a * c.ffn + (a * c.d_model if c.kv_heads == c.n_heads else 0)
            extra -= self.tokens * reused
        return extra

    def logits_transient(self) -> int:
        """Alive while the loss runs log_softmax, beside everything saved: the head's output and, when that
        is 16 bit, its fp32 copy (`loss_fn` computes in fp32). Freed once the loss returns."""
        a = self.compute_bytes
        return self.tokens * self.cfg.vocab * (a + (4 if a != 4 else 0))

    def loss_transient(self) -> int:
        return self.tokens * self.cfg.vocab * LOSS_TRANSIENT_BYTES_PER_LOGIT

    def mlp_backward_transient(self) -> int:
        """Gradients in flight inside a block's backward at its largest, in the MLP's backward right after the down
        projection's: the residual-stream gradient entering the block, the gradient of w2's input (ffn wide) and
        the two it splits into at the SwiGLU product (silu's output's and w3's output's), all three alive at once
        (measured by the tensor-memory meter, tests/dist/test_tensor_memory.py)."""
        return self.tokens * (self.residual_bytes * self.cfg.d_model + 3 * self.compute_bytes * self.cfg.ffn)

    def mlp_backward_freed(self) -> int:
        """What the block has freed of its saved tensors by then: w2's saved input (the SwiGLU product)."""
        return self.tokens * self.compute_bytes * self.cfg.ffn

    def windows(self, *, checkpointing: str) -> dict[str, tuple[int, list[tuple[str, int]]]]:
        """Activation bytes, and the backward's own transients, live at each moment of `WINDOWS`.

        forward end: every saved tensor, and the logits while the loss runs. loss backward: those plus the
        cross-entropy gradient. block backward: the first block's backward (the head's tensors are freed by
        then) with its gradients in flight; under checkpointing, that block recomputed on top of what every
        block kept. block reduce:
        that block done (its saved tensors freed), its gradients about to be reduced. last block backward:
        one block's activations left (recomputed under checkpointing). backward end and optimizer step: none.
        """
        policy = checkpointing
        saved = self.saved_end_of_forward(checkpointing=policy)
        layers, kept = self.cfg.n_layers, self.kept_per_block(policy)
        if policy != "none":
            block, after_block, last = (
                layers * kept + self.recompute_extra(policy),
                layers * kept,
                kept + self.recompute_extra(policy),
            )
        else:
            block, after_block, last = layers * kept, (layers - 1) * kept, kept
        return {
            # the logits and their fp32 copy are made by the forward: activations while the loss runs
            FORWARD_END: (saved + self.logits_transient(), []),
            LOSS_BACKWARD: (saved, [("cross-entropy gradient", self.loss_transient())]),
            # the loss's and the head's saved tensors freed, the final norm's still saved; the head's input
            # gradient flowing into it (the head's weight gradient is the strategy's: held)
            HEAD_BACKWARD: (
                layers * kept + self.tokens * self._norm_per_token(),
                [("gradient into the final norm", self.tokens * self.compute_bytes * self.cfg.d_model)],
            ),
            BLOCK_BACKWARD: (
                block - self.mlp_backward_freed(),
                [("gradients in flight", self.mlp_backward_transient())],
            ),
            BLOCK_REDUCE: (after_block, [("gradient into the next block", self.block_input())]),
            LAST_BLOCK: (last - self.mlp_backward_freed(), [("gradients in flight", self.mlp_backward_transient())]),
            BACKWARD_END: (0, []),
            OPTIMIZER_STEP: (0, []),
        }
