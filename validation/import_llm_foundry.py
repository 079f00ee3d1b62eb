"""Regenerate validation/llm_foundry.csv from llm-foundry's benchmark tables (one row per published run).

    git -C <llm-foundry clone> show 8c8dd48f72168c5d51e2f7b151595892a8fba43d:scripts/train/benchmarking/README.md \
        > /tmp/README.md
    python validation/import_llm_foundry.py /tmp/README.md > validation/llm_foundry.csv

The model dimensions come from llm-foundry's scripts/train/yamls/pretrain/mpt-<size>.yaml (d_model, n_heads,
n_layers; expansion_ratio 4, vocab 50368). MPT's expansion-4 GELU MLP has the parameters and FLOPs of a SwiGLU FFN of
width 8·d/3 (`ffn`). Tables kept: every bf16 one (the FP8 table has no harness precision).
"""

from __future__ import annotations

import csv
import sys

COMMIT = "8c8dd48f72168c5d51e2f7b151595892a8fba43d"
SOURCE = f"mosaicml/llm-foundry@{COMMIT[:12]} scripts/train/benchmarking/README.md"
MPT = {  # size → (d_model, n_layers, n_heads), from scripts/train/yamls/pretrain/mpt-<size>.yaml
    "125m": (768, 12, 12),
    "350m": (1024, 24, 16),
    "760m": (1536, 24, 12),
    "1b": (2048, 24, 16),
    "3b": (2560, 32, 20),
    "7b": (4096, 32, 32),
    "13b": (5120, 40, 40),
    "30b": (7168, 48, 56),
    "70b": (8192, 80, 64),
}
TABLES = {  # heading → (table name, harness profile)
    "## H100 80GB BF16 (Large Scale, >= 128 GPUs)": ("H100 80GB BF16 large scale", "h100"),
    "## H100 80GB BF16": ("H100 80GB BF16", "h100"),
    "## A100 80GB with 1600 Gbps node-node interconnect (RoCE)": ("A100 80GB", "a100"),
    "## A100 40GB with 1600 Gbps node-node interconnect (RoCE)": ("A100 40GB", "a100-40gb"),
}
STRATEGY = {"FULL_SHARD": "fsdp.full_shard", "SHARD_GRAD_OP": "fsdp.shard_grad_op"}
FIELDS = [
    "source", "table", "profile", "model", "d_model", "n_layers", "n_heads", "ffn", "vocab", "strategy",
    "published_precision", "precision", "gpus", "seq_len", "micro_batch", "grad_accum", "activation_checkpointing",
    "tokens_per_s_per_gpu", "published_mfu",
]  # fmt: skip


def main(path: str) -> None:
    out = csv.DictWriter(sys.stdout, FIELDS, lineterminator="\n")
    out.writeheader()
    table = None
    for line in open(path, encoding="utf-8"):
        line = line.rstrip("\n")
        if line.startswith("## "):
            table = TABLES.get(line.strip())
            continue
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if table is None or len(cells) < 20 or cells[0] in ("Model", "---") or not cells[1].isdigit():
            continue
        name, profile = table
        model, seq, gpus = cells[0], int(cells[1]), int(cells[2])
        d, layers, heads = MPT[model]
        out.writerow({
            "source": SOURCE, "table": name, "profile": profile, "model": f"mpt-{model}", "d_model": d,
            "n_layers": layers, "n_heads": heads, "ffn": round(8 * d / 3), "vocab": 50368,
            "strategy": STRATEGY[cells[16]], "published_precision": f"{cells[14]}/{cells[15]}", "precision": "bf16",
            "gpus": gpus, "seq_len": seq, "micro_batch": int(cells[7]), "grad_accum": int(cells[8]),
            "activation_checkpointing": "full" if cells[17] == "True" else "none",
            "tokens_per_s_per_gpu": int(cells[12]), "published_mfu": float(cells[4]) / 100,
        })  # fmt: skip


if __name__ == "__main__":
    main(sys.argv[1])
