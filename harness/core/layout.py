"""Parallel layouts: how a cell's GPUs split into data × tensor × pipeline parallel groups, and the model into stages.

A cell runs on `gpus` ranks, numbered node-major (rank = node * gpus_per_node + local, as SLURM and torchrun number
them), laid out as a row-major mesh `(pp, dp, tp)` — `(pp, dp_replicate, dp_shard, tp)` for a hybrid data-parallel
strategy. TP is innermost, so a TP group is consecutive ranks inside one node; PP is outermost, so pipeline stages
lie across nodes; data parallelism fills what is between (a hybrid shards over the rest of a node and replicates
across nodes). torchtitan orders its mesh the same way (`pp, dp_replicate, dp_shard, cp, tp`).

The pipeline cuts the model by blocks into `pp × stages per rank` stages (interleaved 1F1B gives every rank
`pp_virtual_stages` of them, 2 by default: `rank, rank + pp, …`, torch's "loop" order); the embedding is on the
first stage, the final norm and the head on the last.

Floor 0: no torch, no import from the rest of the harness but the zoo. The scenario validates with
`layout_problems`, the planner's models read `Layout` and `stage_blocks`, the worker builds its meshes from them.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping
from dataclasses import dataclass

from harness.core.zoo import ModelConfig

PP_SCHEDULES: tuple[str, ...] = ("gpipe", "1f1b", "interleaved_1f1b")
"""torch.distributed.pipelining schedules: ScheduleGPipe, Schedule1F1B, ScheduleInterleaved1F1B"""
STAGES_PER_RANK: dict[str, int] = {"gpipe": 1, "1f1b": 1, "interleaved_1f1b": 2}
"""pipeline stages each rank holds (virtual stages): interleaved 1F1B runs two per rank"""


def divisors(n: int) -> list[int]:
    """The positive divisors of n, ascending."""
    return [d for d in range(1, n + 1) if n % d == 0]


@dataclass(frozen=True)
class MeshDim:
    """One parallel dimension beside data parallelism: its name is also the setting that gives its degree
    (harness.scenario.spec.Settings) and the mesh dimension the worker builds."""

    name: str
    """the setting, the mesh dimension and the record's `layout.mesh` key"""
    before_dp: bool
    """it sits outside data parallelism in the mesh (outermost: pipeline stages across nodes); else inside it"""
    inside_node: bool
    """its groups must lie inside one node (its collectives are on every block's critical path)"""
    noun: str
    """what a sentence calls it: `tensor parallelism`"""
    doc: str


MESH_DIMS: tuple[MeshDim, ...] = (
    MeshDim("pp", True, False, "pipeline parallelism", "ranks that each hold consecutive blocks (across nodes)"),
    MeshDim("tp", False, True, "tensor parallelism", "ranks that split every block's matmuls (inside a node)"),
)
"""the parallel dimensions besides data parallelism, outermost first; data parallelism (dp, or dp_replicate ×
dp_shard for a hybrid) takes the ranks they leave, between the `before_dp` ones and the rest. Adding one (context
or expert parallelism) is an entry here, its setting, its `apply_*` step in the worker and its planner functions
(docs/extending.md, "A parallel dimension")."""
MESH_DIM_NAMES: tuple[str, ...] = tuple(d.name for d in MESH_DIMS)


@dataclass(frozen=True)
class Layout:
    """A cell's parallel layout: the rank mesh and the pipeline's stages (sizes are ranks). The one object that
    multiplies the degrees: everything else asks it (`dp`, `mesh_dims`, `group`, …)."""

    gpus: int
    """ranks in the cell (the world)"""
    degrees: tuple[tuple[str, int], ...] = ()
    """(name, degree) of every MESH_DIMS dimension the cell uses (a dimension left out has degree 1)"""
    gpus_per_node: int = 1
    """ranks per node (the cluster profile)"""
    hybrid: bool = False
    """the data-parallel strategy shards inside a node and replicates across nodes"""
    schedule: str = "1f1b"
    """the pipeline schedule (one of PP_SCHEDULES; only with pp > 1)"""
    virtual_stages: int = 0
    """stages per pipeline rank (Megatron's virtual pipeline; interleaved 1F1B only); 0: the schedule's own
    (STAGES_PER_RANK)"""

    @functools.cached_property
    def _by_name(self) -> dict[str, int]:
        return dict(self.degrees)

    def degree(self, name: str) -> int:
        """The degree of the MESH_DIMS dimension `name` (1 when the cell does not use it)."""
        return self._by_name.get(name, 1)

    @property
    def tp(self) -> int:
        """tensor-parallel degree: ranks that split every block's matmuls (inside a node)"""
        return self.degree("tp")

    @property
    def pp(self) -> int:
        """pipeline-parallel degree: ranks that each hold consecutive blocks (across nodes)"""
        return self.degree("pp")

    @property
    def used(self) -> tuple[MeshDim, ...]:
        """The MESH_DIMS dimensions of degree > 1, innermost first (how sentences and tags name them: `tp2 × pp2`)."""
        return tuple(d for d in reversed(MESH_DIMS) if self.degree(d.name) > 1)

    def named(self, dims: tuple[MeshDim, ...]) -> str:
        """`tp 2 x pp 2`: the dimensions with their degrees."""
        return " x ".join(f"{d.name} {self.degree(d.name)}" for d in dims)

    @functools.cached_property
    def model_parallel(self) -> int:
        """The product of every MESH_DIMS degree: the ranks one data-parallel replica spans."""
        return math.prod(self.degree(d.name) for d in MESH_DIMS)

    @functools.cached_property
    def inside_node(self) -> int:
        """The product of the degrees whose groups stay inside a node (MeshDim.inside_node)."""
        return math.prod(self.degree(d.name) for d in MESH_DIMS if d.inside_node)

    @property
    def dp(self) -> int:
        """Data-parallel degree: gpus / the product of every other dimension's degree."""
        return self.gpus // self.model_parallel

    @property
    def dp_shard(self) -> int:
        """Ranks a data-parallel strategy shards over: all of dp (flat), or the rest of a node beside the inside-node
        dimensions (hybrid)."""
        if not self.hybrid:
            return self.dp
        return max(1, min(self.dp, self.gpus_per_node // self.inside_node))

    @property
    def dp_replicate(self) -> int:
        """Replicas of the sharded state: dp / dp_shard (1 unless hybrid)."""
        return self.dp // self.dp_shard

    @property
    def is_default(self) -> bool:
        """Data parallelism only: the layout every strategy ran before layouts existed."""
        return self.model_parallel == 1

    @property
    def mesh_dims(self) -> tuple[tuple[str, int], ...]:
        """(name, size) of each mesh dimension, outermost first."""
        dp = (("dp_replicate", self.dp_replicate), ("dp_shard", self.dp_shard)) if self.hybrid else (("dp", self.dp),)
        outer = tuple((d.name, self.degree(d.name)) for d in MESH_DIMS if d.before_dp)
        inner = tuple((d.name, self.degree(d.name)) for d in MESH_DIMS if not d.before_dp)
        return outer + dp + inner

    @property
    def dp_dims(self) -> tuple[str, ...]:
        """The mesh dimensions data parallelism runs over (outermost first)."""
        return ("dp_replicate", "dp_shard") if self.hybrid else ("dp",)

    def coords(self, rank: int) -> dict[str, int]:
        """The rank's index along every mesh dimension."""
        out: dict[str, int] = {}
        rest = rank
        for name, size in reversed(self.mesh_dims):
            out[name] = rest % size
            rest //= size
        return dict(reversed(list(out.items())))

    def rank_of(self, coords: dict[str, int]) -> int:
        """The rank at `coords` (every dimension named)."""
        rank = 0
        for name, size in self.mesh_dims:
            rank = rank * size + coords[name]
        return rank

    def group(self, rank: int, dims: tuple[str, ...]) -> list[int]:
        """The ranks that share every coordinate of `rank` except along `dims` (its group over those dimensions)."""
        c = self.coords(rank)
        sizes = dict(self.mesh_dims)
        ranks = [self.rank_of({**c, **dict(zip(dims, idx))}) for idx in _product([range(sizes[d]) for d in dims])]
        return sorted(ranks)

    def dp_rank(self, rank: int) -> int:
        """The rank's index among the data-parallel replicas: which rows of the global batch it trains on."""
        c = self.coords(rank)
        if self.hybrid:
            return c["dp_replicate"] * self.dp_shard + c["dp_shard"]
        return c["dp"]

    def pp_rank(self, rank: int) -> int:
        return self.coords(rank)["pp"]

    def tp_rank(self, rank: int) -> int:
        return self.coords(rank)["tp"]

    @property
    def stages_per_rank(self) -> int:
        """Pipeline stages each rank holds: `virtual_stages` when set, else the schedule's (1; interleaved 2)."""
        if self.pp == 1:
            return 1
        return self.virtual_stages or STAGES_PER_RANK[self.schedule]

    @property
    def n_stages(self) -> int:
        """Pipeline stages in all: pp × stages per rank (1 without a pipeline)."""
        return self.pp * self.stages_per_rank

    def stages_of(self, pp_rank: int) -> list[int]:
        """The stage indices a pipeline rank holds, in order: pp_rank, pp_rank + pp, … (torch's loop order)."""
        return [pp_rank + k * self.pp for k in range(self.stages_per_rank)]

    def to_dict(self) -> dict:
        return {
            **{d.name: self.degree(d.name) for d in MESH_DIMS},
            "dp": self.dp,
            "dp_shard": self.dp_shard,
            "dp_replicate": self.dp_replicate,
            "mesh": {name: size for name, size in self.mesh_dims},
            "pp_schedule": self.schedule if self.pp > 1 else None,
            "pp_virtual_stages": self.stages_per_rank if self.pp > 1 else None,
            "n_stages": self.n_stages,
        }


def _product(ranges: list[range]) -> list[tuple[int, ...]]:
    out: list[tuple[int, ...]] = [()]
    for r in ranges:
        out = [t + (i,) for t in out for i in r]
    return out


def stage_blocks(n_layers: int, n_stages: int) -> list[list[int]]:
    """The blocks of each pipeline stage: consecutive, as even as possible, the earlier stages one more when they do
    not divide (the last stage also holds the head, usually the largest matmul)."""
    if not 1 <= n_stages <= n_layers:
        raise ValueError(f"{n_stages} pipeline stages for {n_layers} blocks: every stage needs a block")
    base, extra = divmod(n_layers, n_stages)
    out, start = [], 0
    for s in range(n_stages):
        n = base + (1 if s < extra else 0)
        out.append(list(range(start, start + n)))
        start += n
    return out


def effective_microbatches(microbatches: int, pp: int) -> int:
    """Pipeline microbatches per step: the setting, or one per pipeline rank when it is 0 (the default)."""
    return microbatches or pp


def layout_problems(
    *,
    gpus: int,
    degrees: Mapping[str, int],
    cfg: ModelConfig,
    schedule: str,
    microbatches: int,
    micro_batch: int,
    grad_accum: int,
    seq_len: int | None = None,
    sequence_parallel: bool = False,
    virtual_stages: int = 0,
) -> list[tuple[str, str]]:
    """What is wrong with a cell's layout (`degrees`: the MESH_DIMS dimensions' degrees), as (setting it is about,
    sentence) pairs; [] when it can be built.

    These are input errors (exit 2), not `skipped` cells: no cluster or strategy can run them."""
    out: list[tuple[str, str]] = []
    tp, pp = degrees.get("tp", 1), degrees.get("pp", 1)
    if tp > 1:
        out += _tensor_parallel_problems(tp=tp, cfg=cfg, seq_len=seq_len, sequence_parallel=sequence_parallel)
    out += model_layout_problems(cfg, tp=tp, pp=pp, sequence_parallel=sequence_parallel and tp > 1)
    if cfg.positions == "learned" and seq_len is not None and seq_len > (cfg.max_positions or 0):
        out.append(
            (
                "seq_len",
                f"seq_len {seq_len} is longer than the model's learned position table ({cfg.max_positions} "
                f"positions); allowed seq_len: 2..{cfg.max_positions}",
            )
        )
    used = [(d.name, degrees.get(d.name, 1)) for d in reversed(MESH_DIMS)]  # NOTE: innermost first: `tp 2 x pp 2`
    product = math.prod(n for _, n in used)
    if gpus % product:
        ok = [f"{d}" for d in divisors(gpus)]
        names = " x ".join(name for name, _ in used)
        out.append(
            (
                next((name for name, n in used if n > 1), MESH_DIMS[-1].name),
                f"{' x '.join(f'{name} {n}' for name, n in used)} = {product} does not divide gpus {gpus} "
                f"(data-parallel degree = gpus / ({names})); allowed {names}: {', '.join(ok)}",
            )
        )
    if tp > 1 and (cfg.n_heads % tp or cfg.kv_heads % tp):
        ok = [f"{d}" for d in divisors(math.gcd(cfg.n_heads, cfg.kv_heads))]
        out.append(
            (
                "tp",
                f"tp {tp} does not divide the model's n_heads {cfg.n_heads} and n_kv_heads {cfg.kv_heads} "
                f"(tensor parallelism splits whole heads); allowed tp: {', '.join(ok)}",
            )
        )
    if pp > 1:
        v = virtual_stages or STAGES_PER_RANK[schedule]
        if virtual_stages and (schedule == "interleaved_1f1b") != (virtual_stages > 1):
            out.append(
                (
                    "pp_virtual_stages",
                    f"pp_virtual_stages {virtual_stages} with pp_schedule {schedule}: several stages per rank is the "
                    "interleaved schedule's; allowed: pp_virtual_stages 2 or more with interleaved_1f1b, 1 (or 0) "
                    "with gpipe or 1f1b",
                )
            )
        if pp * v > cfg.n_layers:
            out.append(
                (
                    "pp",
                    f"pp {pp} x {v} stage(s) per rank ({schedule}) = {pp * v} pipeline stages > the model's "
                    f"{cfg.n_layers} blocks (every stage holds at least one); allowed pp: 1..{cfg.n_layers // v}"
                    f"{', or fewer pp_virtual_stages' if virtual_stages > 2 else ''}",
                )
            )
        m = effective_microbatches(microbatches, pp)
        if micro_batch % m:
            out.append(
                (
                    "microbatches",
                    f"micro_batch {micro_batch} does not split into {m} pipeline microbatches"
                    f"{'' if microbatches else ' (0: one per pipeline rank, pp)'}; allowed microbatches: "
                    + ", ".join(str(d) for d in divisors(micro_batch)),
                )
            )
        elif schedule == "1f1b" and m < pp:
            out.append(("microbatches", f"1f1b needs at least as many microbatches as stages ({pp}), got {m}"))
        if grad_accum != 1:
            out.append(
                (
                    "grad_accum",
                    f"grad_accum {grad_accum} with pp {pp}: the pipeline's microbatches are its gradient accumulation "
                    "(set microbatches; grad_accum must be 1)",
                )
            )
    return out


def model_layout_problems(cfg: ModelConfig, *, tp: int, pp: int, sequence_parallel: bool) -> list[tuple[str, str]]:
    """The model's variants (harness.core.zoo.ModelConfig's knobs) the layouts cannot shard or cut as they are, as
    (setting, sentence) pairs; [] when every knob composes with these degrees."""
    out: list[tuple[str, str]] = []
    if cfg.tied_embeddings and (tp > 1 or pp > 1):
        dim = "tp" if tp > 1 else "pp"
        why = (
            "the embedding (split over the vocabulary, row-wise) and the head (column-wise) would shard one weight "
            "twice"
            if tp > 1
            else "the embedding and the head share one weight, on the first and the last stage"
        )
        out.append((dim, f"{dim} {tp if tp > 1 else pp} with tied embeddings: {why}; untie them or use {dim} 1"))
    if cfg.qk_norm != "none" and tp > 1:
        out.append(
            (
                "tp",
                f"tp {tp} with qk_norm {cfg.qk_norm}: the q/k norms' weights are shared by every head, so their "
                "gradients are partial sums over the tensor-parallel ranks, which the layout does not reduce; use tp 1",
            )
        )
    if sequence_parallel and cfg.norm_place != "pre":
        out.append(
            (
                "sequence_parallel",
                f"norm_place {cfg.norm_place}: sequence parallelism shards the norms before each sublayer (pre-norm "
                "blocks) only",
            )
        )
    if sequence_parallel and cfg.positions == "learned" and cfg.embed_scale:
        out.append(
            (
                "sequence_parallel",
                "learned positions with embed_scale: the sequence-parallel embedding adds this rank's positions to a "
                "DTensor, which the scale's tensor constant does not multiply",
            )
        )
    return out


def _tensor_parallel_problems(
    *, tp: int, cfg: ModelConfig, seq_len: int | None, sequence_parallel: bool
) -> list[tuple[str, str]]:
    """The dimensions tensor parallelism splits into tp equal shards: DTensor's parallel styles assume even shards
    (a column-parallel output of 17 + 16 features is read back as 34: `aten.mm` then fails with "a and b must have
    same reduction dim"), so the SwiGLU width, the vocabulary (embedding rows, output columns) and, with sequence
    parallelism, the sequence length must divide by tp. Heads are checked apart (layout_problems)."""
    out: list[tuple[str, str]] = []
    for name, size, key in (("ffn", cfg.ffn, "tp"), ("vocab", cfg.vocab, "tp")):
        if size % tp:
            ok = divisors(math.gcd(cfg.n_heads, cfg.kv_heads, cfg.ffn, cfg.vocab))
            pad = " (or pad it: pad_vocab_multiple: 128, as Megatron-LM does)" if name == "vocab" else ""
            out.append(
                (
                    key,
                    f"tp {tp} does not divide the model's {name} {size} (tensor parallelism splits it into equal "
                    f"shards); allowed tp for this model: {', '.join(map(str, ok))}{pad}",
                )
            )
    if sequence_parallel and seq_len is not None and seq_len % tp:
        out.append(
            (
                "seq_len",
                f"seq_len {seq_len} does not split into tp {tp} equal sequence-parallel shards; allowed seq_len: "
                f"multiples of {tp}",
            )
        )
    return out


def stage_params(cfg: ModelConfig, n_stages: int) -> list[int]:
    """Parameters each pipeline stage holds (whole, before any tensor- or data-parallel sharding): its blocks, the
    embedding on the first, the final norm and the head on the last."""
    out = []
    split = stage_blocks(cfg.n_layers, n_stages)
    for s, blocks in enumerate(split):
        n = len(blocks) * cfg.block_params()
        if s == 0:
            n += cfg.embedding_params() + cfg.position_params()
        if s == n_stages - 1:
            n += cfg.norm_params() + cfg.head_params()
        out.append(n)
    return out


def group_kind(ranks: list[int], gpus_per_node: int) -> str:
    """ "self" (one rank), "intra" (one node), "inter" (one rank per node) or "mixed": the classes of
    harness.worker.meters.comm, which the analytic models (harness.plan.comm, harness.plan.layouts) share."""
    nodes = {r // gpus_per_node for r in ranks}
    if len(ranks) == 1:
        return "self"
    if len(nodes) == 1:
        return "intra"
    if len(nodes) == len(ranks):
        return "inter"
    return "mixed"
