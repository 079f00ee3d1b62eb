"""The tables of docs/planner/memory.md, "Predicted per-rank memory": every strategy's predicted memory per rank for
the zoo's 7b and 1.3b (bf16, micro-batch 1 x 2048 tokens, no offload) on CUDA, with and without checkpointing, and
the offload cells. Prints Markdown; the page holds its output.

    .venv/bin/python bench/memory_tables.py > /tmp/tables.md
"""

from __future__ import annotations

from harness.core.zoo import ZOO
from harness.plan import memory as mb
from harness.scenario.schema import parse_scenario

GIB = 2**30
A100_USABLE, H200_USABLE = 79.0, 138.8
ROWS = [
    ("ddp", 1), ("ddp", 8), ("fsdp.full_shard", 1), ("fsdp.full_shard", 8), ("fsdp.shard_grad_op", 8),
    ("fsdp.no_shard", 8), ("fsdp.hybrid_shard", 16), ("fsdp.hybrid_shard_zero2", 16), ("fsdp2.full_shard", 1),
    ("fsdp2.full_shard", 8), ("fsdp2.hybrid_shard", 16), ("zero1", 1), ("zero1", 8), ("zero2", 1), ("zero2", 8),
    ("zero3", 1), ("zero3", 8),
]  # fmt: skip
OFFLOAD = [("zero2", "optimizer", 8), ("zero3", "optimizer", 1), ("zero3", "optimizer+params", 1),
           ("zero3", "optimizer+params", 8), ("fsdp.full_shard", "optimizer+params", 8)]  # fmt: skip


def spec(model: str, strategy: str, gpus: int, **settings):
    doc = {
        "name": "t",
        "matrix": {"model": [model], "strategy": [strategy], "precision": ["bf16"], "gpus": [gpus]},
        "settings": {"micro_batch": 1, "seq_len": 2048, **settings},
    }
    (s,) = parse_scenario(doc, "bench").expand(gpus_per_node=8)
    return s


def table(model: str) -> str:
    out = [
        f"#### {model} ({ZOO[model].n_params():.2e} parameters)",
        "",
        "| strategy | GPUs | params | grads | optimizer | activations | buffers | **total** | peak at | A100-80 | H200 "
        "| total, ckpt |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---|:-:|:-:|---:|",
    ]
    for strategy, gpus in ROWS:
        m = mb.memory(spec(model, strategy, gpus))
        g = m.gib()
        ck = mb.memory(spec(model, strategy, gpus, activation_checkpointing="full")).gib()["total"]
        parts = " | ".join(f"{g[k]:.1f}" for k in ("params", "grads", "optimizer", "activations", "buffers"))
        fit = ("yes" if g["total"] <= A100_USABLE else "no", "yes" if g["total"] <= H200_USABLE else "no")
        out.append(f"| {strategy} | {gpus} | {parts} | **{g['total']:.1f}** | {m.window} | {fit[0]} | {fit[1]} "
                   f"| {ck:.1f} |")  # fmt: skip
    return "\n".join(out)


def offload(model: str) -> str:
    out = [f"| {model} offload cell | GPUs | device total | host per rank |", "|---|---:|---:|---:|"]
    for strategy, what, gpus in OFFLOAD:
        m = mb.memory(spec(model, strategy, gpus, offload=what))
        out.append(f"| {strategy}, {what} | {gpus} | {m.total / GIB:.1f} | {m.cpu / GIB:.1f} |")
    return "\n".join(out)


if __name__ == "__main__":
    print(table("7b"), "", offload("7b"), "", table("1.3b"), "", offload("1.3b"), sep="\n")
