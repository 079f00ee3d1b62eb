"""The activation model of harness.plan.memory: the moments of a training step at which a rank's memory can peak
(`WINDOWS`) and the bytes the zoo's decoder saves for backward and holds transiently at each (`ActivationModel`),
traced op by op. Pure arithmetic: no torch import."""

from __future__ import annotations

from dataclasses import dataclass

from harness.core.zoo import ModelConfig, StepMeasure

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
LOSS_TRANSIENT_BYTES_PER_LOGIT = 8
"""cross-entropy backward: nll_loss's dense fp32 gradient and log_softmax's fp32 input gradient live at once,
beside the saved fp32 log-probabilities (counted as activations): 2 x 4 bytes per logit"""

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

    The block is walked as its forward runs (`_block_saves`), each op saving what autograd keeps for its backward,
    with the dtype each tensor has in the precision mode (a = bytes of the compute dtype, per token unless said):
    RMSNorm saves its fp32 input (`x.float()`: the tensor itself when it is fp32, else a copy), its rsqrt (4 per
    row) and the normalised value it multiplies by the weight (fp32, or its 16-bit `type_as` copy when the input
    was 16 bit); LayerNorm its input (fp32 under autocast, which runs it in fp32) and its mean and rstd; a Linear
    saves its input, which autocast casts once per Linear (3·a·d for q/k/v, 2·a·d for w1/w3); attention saves the
    (rotated) q, k and v as SDPA gets them (k and v after GQA's repeat_interleave, cast to 16 bit under autocast
    when a qk-norm made them fp32), the SDPA output and the copy that transpose+reshape makes for wo, and SDPA's
    fp32 logsumexp (4·n_heads); the flash kernels save nothing of size seq². Soft-capped attention (eager) saves
    its tanh's output and its fp32 softmax (and the 16-bit copy the value matmul gets): seq² per head. A gated MLP
    saves w1's and w3's outputs, the activation's output and the product (4·a·ffn), a plain one w1's output and
    the activation's (2·a·ffn). RoPE's rotations and the masks save only cached tables. Outside the blocks: the
    final norm, the head's input, a final soft-cap's tanh output, log_softmax's fp32 output (4·vocab) and the
    int64 tokens and targets (16).

    Llama's block: fp32 44d + 16ffn + 4h + 8; autocast (a=2) 36d + 8ffn + 4h + 8; lowp (a=2) 26d + 8ffn + 4h + 8.
    Checked against saved-tensor hooks for every knob of ModelConfig in tests/unit/test_model_budget.py.
    """

    cfg: ModelConfig
    mode: str
    tokens: int
    """tokens per micro-batch on this rank (micro_batch × seq_len)"""
    seq_len: int = 0
    """tokens per sequence (0: one sequence of `tokens`): soft-capped attention saves seq² per head"""

    @property
    def compute_bytes(self) -> int:
        return 4 if self.mode == "fp32" else 2

    @property
    def residual_bytes(self) -> int:
        """dtype of the residual stream (block inputs): fp32 unless the parameters themselves are 16 bit"""
        return 2 if self.mode == "lowp" else 4

    @property
    def seq(self) -> int:
        return self.seq_len or self.tokens

    @property
    def norm_out_bytes(self) -> int:
        """dtype of a norm's output: its weight's (fp32 under autocast, where RMSNorm's product promotes and
        layer_norm runs in fp32), 16 bit where the parameters are"""
        return 2 if self.mode == "lowp" else 4

    def _norm_saves(self, width: int, rows: int, in_bytes: int) -> int:
        """Bytes saved per token by the model's norm over `width` features in `rows` rows per token, its input
        `in_bytes` per element."""
        return self._rms_saves(width, rows, in_bytes) if self.cfg.norm == "rms" else self._ln_saves(width)

    def _rms_saves(self, width: int, rows: int, in_bytes: int) -> int:
        normalised = 4 * width if in_bytes == 4 else in_bytes * width
        return 4 * width + 4 * rows + normalised

    def _ln_saves(self, width: int) -> int:
        # NOTE: autocast runs layer_norm in fp32; its mean and rstd are in the input's dtype
        return 2 * width + 4 if self.mode == "lowp" else 4 * width + 8

    def _linear_inputs(self, width: int, in_bytes: int, consumers: int) -> int:
        """What `consumers` Linears of one input save: autocast casts an fp32 input once per Linear."""
        if self.mode == "autocast" and in_bytes == 4:
            return consumers * 2 * width
        return in_bytes * width

    def _attention_saves(self, in_bytes: int, *, linear_input: bool = True) -> int:
        c, a = self.cfg, self.compute_bytes
        d, q, kv = c.d_model, c.q_width, c.kv_width
        saved = self._linear_inputs(d, in_bytes, 3) if linear_input else 0
        if c.qk_norm != "none":
            rows_q, rows_k = (c.n_heads, c.kv_heads) if c.qk_norm == "head" else (1, 1)
            saved += self._rms_saves(q, rows_q, a) + self._rms_saves(kv, rows_k, a)
        gqa = c.kv_heads != c.n_heads
        k_width = q if gqa else kv
        # NOTE: SDPA (and eager attention's matmuls under autocast) get q, k, v in the compute dtype: a qk-norm's
        # fp32 outputs are cast, the casts saved; v is wv's output itself without GQA (a view)
        saved += a * q + a * k_width + a * (q if gqa else kv)
        if c.attn_softcap is not None:
            # the tanh's output, the fp32 softmax and its 16-bit copy for the value matmul; the matmul's output
            # is wo's input after a copy, saved by nothing itself
            s, h = self.seq, c.n_heads
            return saved + a * s * h + 4 * s * h + (a * s * h if a != 4 else 0) + a * q
        saved += 4 * c.n_heads + a * q  # SDPA's logsumexp and output
        # NOTE: transpose+reshape copies the output for wo only when q was laid out (batch, heads, seq) — RoPE's
        # cat makes it so; q as a view of wq's output gives an output whose transpose is already contiguous
        return saved + (a * q if c.rotary_dims else 0)

    def _mlp_saves(self, in_bytes: int, *, linear_input: bool = True) -> int:
        c, a = self.cfg, self.compute_bytes
        saved = self._linear_inputs(c.d_model, in_bytes, 2 if c.gated else 1) if linear_input else 0
        return saved + (4 if c.gated else 2) * a * c.ffn

    def block_per_token(self) -> int:
        """Bytes one block saves per token: its norms, and its sublayers on what they are fed (the residual stream
        after each sublayer with `post`; one norm's output for both with `parallel`)."""
        c, o, r = self.cfg, self.norm_out_bytes, self.residual_bytes
        saved = self.block_norms_per_token()
        if c.norm_place == "post":
            return saved + self._attention_saves(r) + self._mlp_saves(r)
        if c.norm_place == "parallel":
            shared = self._linear_inputs(c.d_model, o, 5 if c.gated else 4)
            return (
                saved + shared + self._attention_saves(o, linear_input=False) + self._mlp_saves(o, linear_input=False)
            )
        return saved + self._attention_saves(o) + self._mlp_saves(o)

    def block_norms_per_token(self) -> int:
        """Of `block_per_token`, what the block's d-wide norms save (sequence parallelism shards them): each on the
        residual stream (before a sublayer) or on a sublayer's output (after it, 16 bit outside fp32)."""
        c, r, a = self.cfg, self.residual_bytes, self.compute_bytes
        ins = {"pre": [r, r], "post": [a, a], "sandwich": [r, a, r, a], "parallel": [r], "parallel2": [r, r]}
        saved = sum(self._norm_saves(c.d_model, 1, b) for b in ins[c.norm_place])
        if c.norm_place == "parallel2":
            # both norms read the block's input: what they save of it is one tensor
            saved -= (4 * c.d_model if r == 4 else 0) if c.norm == "rms" else r * c.d_model
        return saved

    def final_norm_per_token(self) -> int:
        """What the final norm saves per token."""
        return self._norm_saves(self.cfg.d_model, 1, self.residual_bytes)

    def block_input_per_token(self) -> int:
        """Bytes of a block's input (the residual stream), which non-reentrant checkpointing keeps."""
        return self.residual_bytes * self.cfg.d_model

    def outside_blocks_per_token(self) -> int:
        """Final norm, head input, a final soft-cap, log-probabilities, tokens and targets."""
        c = self.cfg
        softcap = self.compute_bytes * c.vocab if c.final_softcap is not None else 0
        head_input = self._linear_inputs(c.d_model, self.norm_out_bytes, 1)
        return self.final_norm_per_token() + head_input + softcap + 4 * c.vocab + 16

    def block(self) -> int:
        return self.tokens * self.block_per_token()

    def block_input(self) -> int:
        return self.tokens * self.block_input_per_token()

    def outside_blocks(self) -> int:
        positions = 8 * self.seq if self.cfg.positions == "learned" else 0  # the position ids (int64)
        return self.tokens * self.outside_blocks_per_token() + positions

    def selective_kept_per_token(self) -> int:
        """Bytes the `selective` policy keeps per block per token beside the block's input: the outputs of its
        matmuls (q and o projections, w2: their widths; k and v: kv_heads · head_dim; w1 (and w3): ffn) and of
        SDPA (the queries' width, and its fp32 logsumexp), or eager attention's two matmuls."""
        c, a = self.cfg, self.compute_bytes
        kept = a * (2 * c.q_width + 2 * c.d_model + 2 * c.kv_width + (2 if c.gated else 1) * c.ffn)
        if c.attn_softcap is not None:
            return kept + a * self.seq * c.n_heads
        return kept + 4 * c.n_heads

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
        the kept outputs that the backward uses as they are (SDPA's output and logsumexp, w1's (and w3's)
        outputs, and v, a view of wv's output, without grouped-query heads)."""
        extra = self.block() - (self.block_input() if self.mode != "lowp" else 0)
        if policy == "selective":
            c, a = self.cfg, self.compute_bytes
            attention = a * c.q_width + (4 * c.n_heads if c.attn_softcap is None else 0)
            reused = attention + (2 if c.gated else 1) * a * c.ffn + (a * c.kv_width if c.kv_heads == c.n_heads else 0)
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
        (measured by the tensor-memory meter, tests/dist/test_tensor_memory.py); a plain MLP's two (w2's input's,
        and the activation's input's)."""
        ffn_grads = 3 if self.cfg.gated else 2
        return self.tokens * (self.residual_bytes * self.cfg.d_model + ffn_grads * self.compute_bytes * self.cfg.ffn)

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
                layers * kept + self.tokens * self.final_norm_per_token(),
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


def measured_windows(m: StepMeasure, mode: str, *, checkpointing: str) -> dict[str, tuple[int, list[tuple[str, int]]]]:
    """`ActivationModel.windows` for a module the harness did not write, from its step measured on fake tensors
    (harness.core.zoo.StepMeasure): what the forward saved, outside the blocks and in each; under full
    checkpointing each block keeps its input and one block is recomputed at a time. The logits' and the loss's
    transients are the decoder's (the harness's loss is the same); a block's gradients in flight are the gradient
    entering it and what torch's MemTracker saw its backward hold beyond that."""
    if checkpointing not in ("none", "full"):
        raise ValueError(f"no measured activation windows under {checkpointing!r} checkpointing")
    blocks = list(m.saved_blocks) or [0]
    a = 4 if mode == "fp32" else 2
    logits = m.logits * (a + (4 if a != 4 else 0))
    loss = m.logits * LOSS_TRANSIENT_BYTES_PER_LOGIT
    if checkpointing == "full":
        kept = m.block_inputs
        one_input = kept // len(blocks)
        block, after_block, last = kept + max(blocks), kept - one_input, one_input + blocks[0]
    else:
        kept = sum(blocks)
        block, after_block, last = kept, kept - blocks[-1], blocks[0]
    saved = m.saved_root + kept
    # the gradient entering a block (its output's) and what its backward makes beyond it (torch's MemTracker)
    flight = [("gradients in flight", m.block_inputs // len(blocks) + m.block_backward)]
    return {
        FORWARD_END: (saved + logits, []),
        LOSS_BACKWARD: (saved, [("cross-entropy gradient", loss)]),
        # the head's backward: the loss's saved tensors freed, the head's input gradient made from the logits'
        HEAD_BACKWARD: (kept, [("logits gradient", m.logits * a)]),
        BLOCK_BACKWARD: (block, flight),
        BLOCK_REDUCE: (after_block, []),
        LAST_BLOCK: (last, flight),
        BACKWARD_END: (0, []),
        OPTIMIZER_STEP: (0, []),
    }
