"""The harness's decoder against the transformers classes it stands for (transformers runs for real here).

For a tiny config of every family harness.scenario.hf_config reads: the config.json transformers writes reads as a
ModelConfig whose parameter count equals the transformers model's `num_parameters()` exactly, whose model FLOPs
are within 1% of what torch's FlopCounterMode counts over the transformers class's forward + backward (eager
attention: the CPU SDPA kernel has no FLOP formula), and whose torch module, given the transformers model's
weights, computes the same logits and loss (fp32, 1e-4 relative)."""

from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from harness.core.zoo import ModelConfig  # noqa: E402
from harness.scenario.hf_config import load_hf_model  # noqa: E402

BATCH, SEQ = 2, 24
SMALL = {
    "hidden_size": 64,
    "num_hidden_layers": 3,
    "num_attention_heads": 4,
    "intermediate_size": 96,
    "vocab_size": 160,
}
CASES: dict[str, dict] = {
    "llama-tied": {"model_type": "llama", **SMALL, "num_key_value_heads": 2, "tie_word_embeddings": True,
                   "rope_theta": 500000.0, "rms_norm_eps": 1e-5},
    "llama-biases": {"model_type": "llama", **SMALL, "attention_bias": True, "mlp_bias": True},
    "mistral-window": {"model_type": "mistral", **SMALL, "num_key_value_heads": 2, "sliding_window": 8,
                       "head_dim": 24},
    "qwen2": {"model_type": "qwen2", **SMALL, "num_key_value_heads": 2},
    "qwen3": {"model_type": "qwen3", **SMALL, "num_key_value_heads": 2, "head_dim": 32, "tie_word_embeddings": True},
    "gemma": {"model_type": "gemma", **SMALL, "num_key_value_heads": 1, "head_dim": 32},
    "gemma2": {"model_type": "gemma2", **SMALL, "num_key_value_heads": 2, "head_dim": 32, "sliding_window": 8,
               "query_pre_attn_scalar": 24, "attn_logit_softcapping": 5.0, "final_logit_softcapping": 3.0},
    "gemma3": {"model_type": "gemma3_text", **SMALL, "num_key_value_heads": 2, "head_dim": 32, "sliding_window": 8,
               "layer_types": ["sliding_attention", "sliding_attention", "full_attention"],
               "rope_parameters": {"full_attention": {"rope_type": "default", "rope_theta": 1000000.0},
                                   "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0}}},
    "phi": {"model_type": "phi", **SMALL, "partial_rotary_factor": 0.5},
    "phi3": {"model_type": "phi3", **SMALL, "num_key_value_heads": 2, "partial_rotary_factor": 0.75,
             "pad_token_id": 0},
    "olmo2": {"model_type": "olmo2", **SMALL, "num_key_value_heads": 2},
    "gpt2": {"model_type": "gpt2", "n_embd": 64, "n_layer": 3, "n_head": 4, "vocab_size": 160, "n_positions": 48,
             "resid_pdrop": 0.0, "embd_pdrop": 0.0, "attn_pdrop": 0.0, "bos_token_id": 0, "eos_token_id": 0},
    "gpt-neox": {"model_type": "gpt_neox", **SMALL, "rotary_pct": 0.25, "partial_rotary_factor": 0.25},
    "starcoder2": {"model_type": "starcoder2", **SMALL, "num_key_value_heads": 2, "bos_token_id": 0,
                   "eos_token_id": 0},
}  # fmt: skip
"""tiny configs of every family, each exercising its variants (windows shorter than the sequence, soft caps, partial
rotary, tied heads, explicit head_dim ≠ hidden / heads)"""


def _hf_model(case: str, attn: str):
    kwargs = dict(CASES[case])
    model_type = kwargs.pop("model_type")
    cfg = transformers.AutoConfig.for_model(model_type, **kwargs)
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(cfg, attn_implementation=attn)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("bias") or "norm" in name or "ln" in name:
                p.normal_(0.0, 0.1, generator=torch.Generator().manual_seed(len(name)))  # non-trivial norms, biases
    return model.eval(), cfg


def _ours(tmp_path, cfg) -> ModelConfig:
    path = tmp_path / "config.json"
    cfg.to_json_file(path)
    return load_hf_model(path)


def _converted(ours: ModelConfig, hf_sd: dict, model_type: str) -> dict:
    """The transformers model's weights under the harness's names (fused projections split, GPT-2's Conv1D
    weights transposed, Gemma's (1 + w) norm weights made plain)."""
    out: dict = {}
    q, kv = ours.q_width, ours.kv_width
    gemma = model_type.startswith("gemma")
    # the norm after attention: the MLP's pre-norm in Llama-style blocks, a post-norm in Gemma 2/3 and OLMo 2
    post_attn = "attn_out_norm" if ours.norm_place in ("sandwich", "post") else "mlp_norm"
    rename = [
        ("model.embed_tokens.", "tok_emb."), ("gpt_neox.embed_in.", "tok_emb."), ("transformer.wte.", "tok_emb."),
        ("transformer.wpe.", "pos_emb."), ("model.layers.", "blocks."), ("gpt_neox.layers.", "blocks."),
        ("transformer.h.", "blocks."), ("model.norm.", "norm."), ("model.final_layernorm.", "norm."),
        ("gpt_neox.final_layer_norm.", "norm."), ("transformer.ln_f.", "norm."), ("lm_head.", "head."),
        ("embed_out.", "head."), (".self_attn.", ".attn."), (".attention.", ".attn."),
        (".input_layernorm.", ".attn_norm."),
        (".post_attention_layernorm.", f".{post_attn}."), (".pre_feedforward_layernorm.", ".mlp_norm."),
        (".post_feedforward_layernorm.", ".mlp_out_norm."), (".ln_1.", ".attn_norm."), (".ln_2.", ".mlp_norm."),
        (".q_proj.", ".wq."), (".k_proj.", ".wk."), (".v_proj.", ".wv."), (".o_proj.", ".wo."), (".dense.", ".wo."),
        (".gate_proj.", ".w1."), (".up_proj.", ".w3."), (".down_proj.", ".w2."), (".fc1.", ".w1."), (".fc2.", ".w2."),
        (".c_fc.", ".w1."), (".dense_h_to_4h.", ".w1."), (".dense_4h_to_h.", ".w2."),
    ]  # fmt: skip
    for name, t in hf_sd.items():
        for a, b in rename:
            name = name.replace(a, b)
        if gemma and "norm" in name:
            t = t + 1.0
        if model_type == "gpt2":
            if name.endswith("attn.c_attn.weight") or name.endswith("attn.c_attn.bias"):
                t = t.T if t.dim() == 2 else t
                for part, chunk in zip(("wq", "wk", "wv"), t.split([q, kv, kv], dim=0)):
                    out[name.replace("c_attn", part)] = chunk
                continue
            name = name.replace("attn.c_proj", "attn.wo").replace("mlp.c_proj", "mlp.w2")
            t = t.T if (name.endswith("w1.weight") or name.endswith("wo.weight") or name.endswith("w2.weight")) else t
        elif model_type == "starcoder2":
            name = name.replace("mlp.c_proj", "mlp.w2")
        if ".qkv_proj." in name:  # Phi-3
            for part, chunk in zip(("wq", "wk", "wv"), t.split([q, kv, kv], dim=0)):
                out[name.replace("qkv_proj", part)] = chunk
            continue
        if ".gate_up_proj." in name:  # Phi-3: gate first
            gate, up = t.chunk(2, dim=0)
            out[name.replace("gate_up_proj", "w1")], out[name.replace("gate_up_proj", "w3")] = gate, up
            continue
        if ".query_key_value." in name:  # GPT-NeoX: [q, k, v] per head
            h, hd = ours.n_heads, ours.head_size
            per = t.view(h, 3, hd, *t.shape[1:])
            for i, part in enumerate(("wq", "wk", "wv")):
                out[name.replace("query_key_value", part)] = per[:, i].reshape(h * hd, *t.shape[1:])
            continue
        out[name] = t
    return out


def _batch(vocab: int):
    g = torch.Generator().manual_seed(1)
    data = torch.randint(0, vocab, (BATCH, SEQ + 1), generator=g)
    return data[:, :-1], data[:, 1:]


@pytest.mark.parametrize("case", sorted(CASES))
def test_parameters_flops_and_loss_equal_the_transformers_class(case, tmp_path):
    from torch.utils.flop_counter import FlopCounterMode

    from harness.worker.models import build_model, loss_fn

    eager, cfg = _hf_model(case, "eager")
    ours = _ours(tmp_path, cfg)
    assert ours.n_params() == eager.num_parameters(), (ours.n_params(), eager.num_parameters())
    assert sum(p.numel for p in ours.parameter_inventory()) == ours.n_params()

    x, y = _batch(ours.vocab)
    with FlopCounterMode(display=False) as counter:
        logits = eager(input_ids=x).logits
        torch.nn.functional.cross_entropy(logits.float().view(-1, ours.vocab), y.reshape(-1)).backward()
    counted = counter.get_total_flops()
    predicted = ours.flops_per_token(SEQ) * BATCH * SEQ
    if ours.sliding_window is not None and ours.sliding_window < SEQ:
        # FlopCounterMode counts eager attention's whole square; the harness counts a local layer's window
        full = ModelConfig(**{**ours.to_dict(), "sliding_window": None})
        assert predicted < full.flops_per_token(SEQ) * BATCH * SEQ
        predicted = full.flops_per_token(SEQ) * BATCH * SEQ
    assert abs(predicted - counted) / counted < 0.01, (predicted, counted)

    model = build_model(ours, seed=0, device="cpu")
    missing, unexpected = model.load_state_dict(_converted(ours, eager.state_dict(), cfg.model_type), strict=False)
    assert not unexpected, unexpected
    assert not [m for m in missing if not m.endswith("rotary_emb.inv_freq")], missing
    with torch.no_grad():
        theirs = eager(input_ids=x).logits
        mine = model(x)
        torch.testing.assert_close(mine, theirs, rtol=1e-4, atol=1e-4)
        want = torch.nn.functional.cross_entropy(theirs.float().view(-1, ours.vocab), y.reshape(-1)).item()
        got = loss_fn(mine, y).item()
    assert math.isclose(got, want, rel_tol=1e-4), (got, want)
