"""The uncalibrated GPU model's kernel efficiencies and collective costs (docs/time-model.md: profile figures).

A profile's `performance:` figures are a few sourced rates (achievable matmul, achieved memory bandwidth, NCCL
link figures); these functions turn them into the seconds of one kernel or one collective:

- **GEMM**: the roofline `max(2mnk / R, bytes / B)` (R the achievable matmul rate of the dtype, B the achieved
  memory bandwidth, bytes the operands and result once; a GEMM kernel pipelines its loads under its math): a GEMM
  with a small dimension (few tokens per rank, a narrow tensor-parallel shard, a small hidden size) is memory bound
  and runs far below R; a large one runs at R. No fitted parameter. (The additive form `2mnk / R + bytes / B` and
  tile/wave quantisation on 108 SMs with 128×128 tiles were tried: both made the A100 rows worse, 10.7 % and 12.0 %
  MAPE against 7.9 %, since R, a maximum achievable rate, already holds a good shape's losses.)
- **attention** (SDPA flash / memory-efficient kernels): the causal FLOPs (forward 2·b·h·s²·hd, backward 2.5×:
  FlashAttention-2's five matmuls against two) at `R · a · s / (s + s½) · hd / (hd + hd½)`: a fraction `a` of the
  matmul rate, lower for short sequences (fewer tiles per head; the causal diagonal) and small head dims (lower
  arithmetic intensity per tile), as FlashAttention-2's A100 and FlashAttention-3's H100 measurements show. The
  three parameters are fitted on the llm-foundry A100 rows (validation/llm_foundry.csv) and carried as profile
  figures with that source.
- **collectives** (`collectives: nccl-ring`): NCCL's ring cost model (NVIDIA/nccl 2.30.7 src/graph/tuning.cc): a
  base latency plus one hop latency per ring step (2(n−1) steps for all_reduce, n−1 for all_gather and
  reduce_scatter), and the bytes × nccl-tests' bus factor at the bus bandwidth. A group spanning nodes runs its
  inter-node steps at the network's hop latency, and its bandwidth is the slower of NVLink and its ranks' NICs
  (`ranks_per_node` × the per-GPU NIC figure: NCCL's rings cross each node through every NIC at once); a group of
  one rank per node (a hybrid's replicate group) has one NIC per rank. An all_reduce across nodes takes the cheaper
  of the ring and NCCL's tree (latency 6.8 + 2((ranks per node − 1)·0.6 + log2(nodes)·5.0) us, bandwidth
  0.92 · busbw / 2).

Pure arithmetic, no torch.
"""

from __future__ import annotations

import math

from harness.plan.calibration.bus import bus_factor

ATTENTION_BACKWARD = 2.5
"""backward FLOPs / forward FLOPs of flash attention (FlashAttention-2, Dao 2023, §3: five matmuls against two)"""


def gemm_seconds(m: int, n: int, k: int, *, tflops: float, memory_gbps: float | None, element_bytes: int) -> float:
    """One GEMM (m×k · k×n) at the roofline: the longer of its FLOPs at `tflops` and its operands and result moved
    once at `memory_gbps` (a GEMM kernel pipelines its loads under its math; flat rate when the bandwidth is
    unknown)."""
    t = 2.0 * m * n * k / (tflops * 1e12)
    if memory_gbps:
        return max(t, element_bytes * (m * k + k * n + m * n) / (memory_gbps * 1e9))
    return t


def attention_rate_tflops(tflops: float, *, seq: int, head_dim: int, efficiency: dict[str, float]) -> float:
    """The achieved rate of causal flash attention (fwd or bwd) at `seq` tokens and `head_dim`."""
    a = efficiency.get("attention", 1.0)
    s_half = efficiency.get("attention_seq_half", 0.0)
    hd_half = efficiency.get("attention_head_dim_half", 0.0)
    return tflops * a * seq / (seq + s_half) * head_dim / (head_dim + hd_half)


def attention_seconds(
    *, batch: int, heads: int, seq: int, head_dim: int, phase: str, tflops: float, efficiency: dict[str, float]
) -> float:
    """Causal flash attention of `batch` × `heads` heads: the score and value matmuls' causal half (forward
    2·b·h·s²·hd FLOPs, backward `ATTENTION_BACKWARD` times that) at `attention_rate_tflops`."""
    fwd = 2.0 * batch * heads * seq * seq * head_dim
    flops = fwd if phase == "forward" else ATTENTION_BACKWARD * fwd
    return flops / (attention_rate_tflops(tflops, seq=seq, head_dim=head_dim, efficiency=efficiency) * 1e12)


TREE_LATENCY_US = (6.8, 0.6, 5.0)
"""NCCL's tree all_reduce under LL (NVIDIA/nccl 2.30.7 src/graph/tuning.cc, ncclTunerConstantsDefaults): base
latency, NVLink hop, network hop (us)"""
TREE_BANDWIDTH = 0.92 * 0.5
"""tree all_reduce: busBw × 0.92 (tuning.cc's refinement), algorithm bandwidth half of it (its ratio .5)"""


def ring_steps(collective: str, ranks: int) -> int:
    """Ring steps of one call (NCCL tuning.cc's nsteps): all_reduce 2(n−1), all_gather/reduce_scatter n−1, else 1."""
    if collective == "all_reduce":
        return 2 * (ranks - 1)
    if collective in ("all_gather", "reduce_scatter", "all_to_all"):
        return ranks - 1
    return 1


def nccl_ring_seconds(
    collective: str,
    *,
    ranks: int,
    nbytes: float,
    ranks_per_node: int,
    intra: tuple[float, float, float],
    inter: tuple[float, float, float] | None,
) -> float:
    """One ring collective of `ranks` ranks, `ranks_per_node` of them on each node (= ranks: one node): `intra` and
    `inter` the links' (base latency us, hop latency us, bus bandwidth GB/s; inter's bandwidth per GPU NIC)."""
    if ranks <= 1:
        return 0.0
    steps = ring_steps(collective, ranks)
    base, hop, bw = intra
    if ranks_per_node >= ranks or inter is None:
        lat = base + steps * hop
    else:
        nodes = math.ceil(ranks / ranks_per_node)
        inter_steps = ring_steps(collective, nodes) if nodes > 1 else 0
        base, net_hop, nic = inter
        lat = base + (steps - inter_steps) * hop + inter_steps * net_hop
        bw = min(bw, ranks_per_node * nic) if ranks_per_node > 1 else nic
        if collective == "all_reduce" and nodes > 1:
            # NCCL picks the cheaper of ring and tree: the tree's latency grows with log2(nodes), not with the ranks
            t_base, t_hop, t_net = TREE_LATENCY_US
            tree_lat = t_base + 2 * ((ranks_per_node - 1) * t_hop + int(math.log2(nodes)) * t_net)
            ring = lat * 1e-6 + nbytes * bus_factor(collective, ranks) / (bw * 1e9)
            return min(ring, tree_lat * 1e-6 + nbytes / (TREE_BANDWIDTH * bw * 1e9))
    return lat * 1e-6 + nbytes * bus_factor(collective, ranks) / (bw * 1e9)
