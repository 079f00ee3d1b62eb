"""The strategy catalogue: every strategy the harness runs, and what each stage needs to know about it.

One entry per strategy, in the order everything lists them (scenario validation, `harness list`, the report's
rows and colours). An entry names the module under harness/worker/strategies/ that implements it (its family),
the device mesh it runs on, which precisions, CPU offload modes and torch.compile it supports (the refusals
are the sentences a `skipped` record carries), the planner's memory and collective models that apply to it, the
step-time model's overlap rule and framework-cost entry, and, from its position, its report colour.
docs/strategies.md has the recipe for adding one.

Rules that hold for every strategy (an injected fault's rank must exist, a hybrid needs whole nodes) stay code
in `harness.scenario.spec.RunSpec.unsupported_reason`; what differs per strategy is data here.

Floor 0: no torch, no import from the rest of the harness but the precisions (harness.core.precisions: every
strategy runs every precision unless its entry says otherwise).
"""

from __future__ import annotations

import colorsys
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from harness.core.precisions import PRECISIONS

OFFLOADS: tuple[str, ...] = ("none", "optimizer", "optimizer+params", "nvme")
"""offload modes: none; the optimizer state (and master weights) to CPU memory; the optimizer state and the
parameters to CPU memory; both to NVMe (DeepSpeed ZeRO-Infinity: ZeRO-3 only, `Strategy.nvme`)"""

FLAT, HYBRID = "flat", "hybrid"
MESHES: tuple[str, ...] = (FLAT, HYBRID)
"""flat: one group of every rank; hybrid: 2-D, shard inside a node × replicate across nodes (whole nodes only)"""

MEMORY_MODELS: tuple[str, ...] = ("ddp", "fsdp1", "fsdp2", "zero")
"""keys of harness.plan.memory.MEMORY_MODELS"""
COMM_MODELS: tuple[str, ...] = ("ddp", "fsdp1", "fsdp2", "zero12", "zero3")
"""keys of harness.plan.comm.COMM_MODELS"""
OVERLAPS: tuple[str, ...] = ("ddp_buckets", "fsdp_prefetch", "zero3_prefetch", "none")
"""keys of harness.plan.overlap.OVERLAP_RULES: how much of a strategy's collective time hides behind its compute
(docs/time-model.md): DDP's gradient buckets under the rest of the backward; FSDP's gathers one unit ahead and
reduce-scatters under the next unit's backward; ZeRO-3's prefetched gathers and asynchronous reduce buckets; none
(every collective exposed: ZeRO-1/2, whose overlap_comm is off)"""
MIXED_MODES: tuple[str, ...] = ("autocast", "lowp")
"""how a bf16/fp16 cell computes: autocast (fp32 parameters, matmuls in 16 bit) or lowp (16-bit parameters)"""

STRATEGY_MODULE_PREFIX = "harness.worker.strategies"

_NO_TP = "{strategy} does not compose with tensor parallelism here (tp > 1 runs with fsdp2.*)"
_NO_PP = "{strategy} does not compose with pipeline parallelism here (pp > 1 runs with ddp or fsdp2.*)"
_NO_DIM = "{strategy} does not compose with {dim} > 1 here"


@dataclass(frozen=True)
class Strategy:
    """One catalogue entry. Refusal sentences may name the strategy as `{strategy}`."""

    name: str
    """what scenario files, records and run_ids call it"""
    family: str
    """the module under harness/worker/strategies/ whose `setup(spec, *, topo)` builds it"""
    memory_model: str
    """which per-rank memory model of harness.plan.memory applies (one of MEMORY_MODELS)"""
    comm_model: str
    """which collective model of harness.plan.comm applies (one of COMM_MODELS)"""
    overlap: str
    """which overlap rule of the step-time model its collectives follow (one of OVERLAPS)"""
    framework_cost: str
    """the strategy whose calibrated framework overhead (hooks, flattening, an engine's bookkeeping per step and
    per block: the calibration's `framework` entry `<framework_cost>/<precision>`) stands for this one's; a
    strategy's own name when `harness calibrate` measures it (harness.plan.calibration.file.FRAMEWORK_STRATEGIES)"""
    mesh: str = FLAT
    """the device mesh it runs on (one of MESHES)"""
    shards: bool = True
    """whether parameters, gradients or optimizer state are split over the shard group (False: every rank holds
    a full replica: DDP, FSDP NO_SHARD)"""
    reshard_after_forward: bool = True
    """sharded strategies: a unit's gathered parameters are freed after its forward and gathered again in backward
    (FULL_SHARD); False keeps them from the forward to the backward (SHARD_GRAD_OP)"""
    mixed: str = "lowp"
    """how bf16/fp16 cells compute (one of MIXED_MODES)"""
    precisions: tuple[str, ...] = PRECISIONS
    """precisions it can run"""
    offload_refusals: dict[str, str] = field(default_factory=dict, hash=False)
    """offload mode → why it cannot run that way; modes not named here are supported (but `nvme`: see `nvme`)"""
    nvme: bool = False
    """whether it runs `offload: nvme` (DeepSpeed ZeRO-Infinity's NVMe swap of parameters and optimizer state);
    an entry without it refuses the mode (_NO_NVME)"""
    compile: bool = True
    """whether torch.compile is supported"""
    compile_with_checkpointing_refusal: str | None = None
    """why compile together with activation checkpointing cannot run, or None when it can"""
    device_refusals: dict[tuple[str, str], str] = field(default_factory=dict, hash=False)
    """(device, precision) → why the backend cannot run that precision on that device (cpu | cuda)"""
    dim_refusals: Mapping[str, str | None] = field(default_factory=lambda: {"tp": _NO_TP, "pp": _NO_PP}, hash=False)
    """parallel dimension (harness.core.layout.MESH_DIMS) → why it cannot run with that dimension's degree > 1
    (harness.worker.strategies.layouts), or None when it composes; a dimension not named here is refused (_NO_DIM)"""

    @property
    def module(self) -> str:
        """The importable name of its family module."""
        return f"{STRATEGY_MODULE_PREFIX}.{self.family}"

    @property
    def offloads(self) -> tuple[str, ...]:
        """The offload modes it supports."""
        return tuple(o for o in OFFLOADS if self.offload_refusal(o) is None)

    def offload_refusal(self, offload: str) -> str | None:
        """Why this strategy cannot run with `offload`, or None."""
        reason = self.offload_refusals.get(offload)
        if reason is None and offload == "nvme" and not self.nvme:
            reason = _NO_NVME
        return None if reason is None else reason.format(strategy=self.name)

    def compile_refusal(self, *, checkpointing: bool) -> str | None:
        """Why this strategy cannot run under torch.compile (with activation checkpointing or not), or None."""
        if not self.compile:
            return f"{self.name}: torch.compile is not supported"
        if checkpointing and self.compile_with_checkpointing_refusal is not None:
            return self.compile_with_checkpointing_refusal.format(strategy=self.name)
        return None

    def layout_refusal(self, dims: Iterable[str]) -> str | None:
        """Why this strategy cannot run with the parallel dimensions `dims` (those of degree > 1), or None."""
        for dim in dims:
            reason = self.dim_refusals.get(dim, _NO_DIM)
            if reason is not None:
                return reason.format(strategy=self.name, dim=dim)
        return None

    def device_refusal(self, device: str | None, precision: str) -> str | None:
        """Why the backend cannot run `precision` on `device`, or None (also when the device is unknown)."""
        reason = self.device_refusals.get((device, precision)) if device is not None else None
        return None if reason is None else reason.format(strategy=self.name)


# --------------------------------------------------------------------------------------------------
# the entries

_NO_OFFLOAD = "{strategy} has no CPU offload"
_NO_NVME = "{strategy}: NVMe offload is DeepSpeed ZeRO-Infinity's, which swaps ZeRO-3's partitions (run it with zero3)"
_FSDP_OFFLOAD = "{strategy}: FSDP's CPUOffload moves parameters and gradients (offload: optimizer+params)"
_FSDP2_OFFLOAD = "{strategy}: CPU offload is not part of this harness's FSDP2 cells"
_ZERO12_OFFLOAD = "{strategy}: DeepSpeed offloads parameters only with ZeRO-3 (offload: optimizer)"
_FSDP1_TP = (
    "{strategy}: FSDP1 composes with tensor parallelism only through its FlatParameter 2-D device_mesh path, which "
    "torch keeps for backward compatibility; run tp with fsdp2.full_shard or fsdp2.hybrid_shard"
)
_FSDP1_PP = (
    "{strategy}: torch.distributed.pipelining drives the gradient sync of FSDP2 and DDP stages, not FSDP1's; run pp "
    "with ddp, fsdp2.full_shard or fsdp2.hybrid_shard"
)
_ZERO_LAYOUT = (
    "{strategy}: DeepSpeed's engine wraps the whole model and has its own pipeline engine; it does not compose with "
    "torch's DTensor tensor parallelism or torch.distributed.pipelining (zero1 does: it runs the harness's "
    "distributed optimizer there; or fsdp2.full_shard)"
)
_DS_CPU_FP16 = {("cpu", "fp16"): "DeepSpeed fp16 is not supported on CPU ('Type fp16 is not supported on your device')"}
# NOTE: measured (deepspeed 0.19.8, torch 2.13): inside the checkpoint HOP dynamo traces ZeRO-3's per-module
# hooks, whose guards (sub_module.ds_id, pre_bwd_fn) fail on every module: each call recompiles until the
# limit, then runs eagerly; steps took 5 s instead of 0.08 s
_ZERO3_COMPILE_AC = (
    "{strategy} with compile and activation checkpointing: ZeRO-3's per-module gather hooks inside "
    "a checkpointed block make torch.compile recompile on every call"
)

_ENTRIES: tuple[Strategy, ...] = (
    Strategy(
        "ddp",
        family="ddp",
        memory_model="ddp",
        comm_model="ddp",
        overlap="ddp_buckets",
        framework_cost="ddp",
        shards=False,
        mixed="autocast",
        offload_refusals={"optimizer": _NO_OFFLOAD, "optimizer+params": _NO_OFFLOAD},
        dim_refusals={"tp": None, "pp": None},
    ),
    Strategy(
        "fsdp.full_shard",
        family="fsdp",
        memory_model="fsdp1",
        comm_model="fsdp1",
        overlap="fsdp_prefetch",
        framework_cost="fsdp.full_shard",
        offload_refusals={"optimizer": _FSDP_OFFLOAD},
        dim_refusals={"tp": _FSDP1_TP, "pp": _FSDP1_PP},
    ),
    Strategy(
        "fsdp.shard_grad_op",
        family="fsdp",
        memory_model="fsdp1",
        comm_model="fsdp1",
        overlap="fsdp_prefetch",
        framework_cost="fsdp.full_shard",
        reshard_after_forward=False,
        offload_refusals={"optimizer": _FSDP_OFFLOAD},
        dim_refusals={"tp": _FSDP1_TP, "pp": _FSDP1_PP},
    ),
    Strategy(
        "fsdp.no_shard",
        family="fsdp",
        memory_model="fsdp1",
        comm_model="fsdp1",
        overlap="fsdp_prefetch",
        framework_cost="fsdp.full_shard",
        shards=False,
        offload_refusals={"optimizer": _FSDP_OFFLOAD},
        dim_refusals={"tp": _FSDP1_TP, "pp": _FSDP1_PP},
    ),
    Strategy(
        "fsdp.hybrid_shard",
        family="fsdp",
        memory_model="fsdp1",
        comm_model="fsdp1",
        overlap="fsdp_prefetch",
        framework_cost="fsdp.full_shard",
        mesh=HYBRID,
        offload_refusals={"optimizer": _FSDP_OFFLOAD},
        dim_refusals={"tp": _FSDP1_TP, "pp": _FSDP1_PP},
    ),
    Strategy(
        "fsdp.hybrid_shard_zero2",
        family="fsdp",
        memory_model="fsdp1",
        comm_model="fsdp1",
        overlap="fsdp_prefetch",
        framework_cost="fsdp.full_shard",
        mesh=HYBRID,
        reshard_after_forward=False,
        offload_refusals={"optimizer": _FSDP_OFFLOAD},
        dim_refusals={"tp": _FSDP1_TP, "pp": _FSDP1_PP},
    ),
    Strategy(
        "fsdp2.full_shard",
        family="fsdp2",
        memory_model="fsdp2",
        comm_model="fsdp2",
        overlap="fsdp_prefetch",
        framework_cost="fsdp2.full_shard",
        offload_refusals={"optimizer": _FSDP2_OFFLOAD, "optimizer+params": _FSDP2_OFFLOAD},
        dim_refusals={"tp": None, "pp": None},
    ),
    Strategy(
        "fsdp2.hybrid_shard",
        family="fsdp2",
        memory_model="fsdp2",
        comm_model="fsdp2",
        overlap="fsdp_prefetch",
        framework_cost="fsdp2.full_shard",
        mesh=HYBRID,
        offload_refusals={"optimizer": _FSDP2_OFFLOAD, "optimizer+params": _FSDP2_OFFLOAD},
        dim_refusals={"tp": None, "pp": None},
    ),
    Strategy(
        "zero1",
        family="zero",
        memory_model="zero",
        comm_model="zero12",
        overlap="none",
        framework_cost="zero1",
        offload_refusals={"optimizer+params": _ZERO12_OFFLOAD},
        device_refusals=_DS_CPU_FP16,
        dim_refusals={"tp": None, "pp": None},
    ),
    Strategy(
        "zero2",
        family="zero",
        memory_model="zero",
        comm_model="zero12",
        overlap="none",
        framework_cost="zero2",
        offload_refusals={"optimizer+params": _ZERO12_OFFLOAD},
        device_refusals=_DS_CPU_FP16,
        dim_refusals={"tp": _ZERO_LAYOUT, "pp": _ZERO_LAYOUT},
    ),
    Strategy(
        "zero3",
        family="zero",
        memory_model="zero",
        comm_model="zero3",
        overlap="zero3_prefetch",
        framework_cost="zero3",
        nvme=True,
        compile_with_checkpointing_refusal=_ZERO3_COMPILE_AC,
        device_refusals=_DS_CPU_FP16,
        dim_refusals={"tp": _ZERO_LAYOUT, "pp": _ZERO_LAYOUT},
    ),
)

CATALOGUE: dict[str, Strategy] = {s.name: s for s in _ENTRIES}
"""strategy name → entry, in catalogue order"""
STRATEGIES: tuple[str, ...] = tuple(CATALOGUE)
HYBRID_STRATEGIES: frozenset[str] = frozenset(s.name for s in _ENTRIES if s.mesh == HYBRID)
FAMILIES: tuple[str, ...] = tuple(dict.fromkeys(s.family for s in _ENTRIES))
"""the family modules under harness/worker/strategies/, in catalogue order"""
FAMILY_MODULES: tuple[str, ...] = tuple(f"{STRATEGY_MODULE_PREFIX}.{f}" for f in FAMILIES)


# --------------------------------------------------------------------------------------------------
# the framework options a family takes (settings of harness.scenario.spec.Settings): where each applies


@dataclass(frozen=True)
class FamilySetting:
    """A setting that is one family's framework option (FSDP1's prefetch, FSDP2's resharding, DDP's buckets): the
    families whose modules apply it, and why a cell of another family, or a tensor/pipeline layout, refuses it when
    it is set away from its default (`{strategy}` is replaced by the name)."""

    name: str
    """the setting (a field of harness.scenario.spec.Settings)"""
    families: tuple[str, ...]
    """the strategy families (harness/worker/strategies/<family>.py) that apply it"""
    refusal: str
    """why a strategy of another family cannot take it"""
    layouts: bool = False
    """whether it composes with tensor or pipeline parallelism (tp or pp > 1)"""


_FSDP1_ONLY = (
    "{strategy}: {setting} is an option of FSDP1's FullyShardedDataParallel (fsdp.*); {strategy} does not take it"
)
FAMILY_SETTINGS: dict[str, FamilySetting] = {
    s.name: s
    for s in (
        FamilySetting(
            "wrap_blocks",
            ("fsdp", "fsdp2"),
            "{strategy}: wrap_blocks groups transformer blocks into FSDP units (fsdp.*, fsdp2.*); {strategy} has no "
            "wrapping units",
        ),
        FamilySetting(
            "reshard_after_forward",
            ("fsdp2",),
            "{strategy}: reshard_after_forward is FSDP2's fully_shard option (fsdp2.*); {strategy} does not take it "
            "(FSDP1 keeps gathered parameters to the backward as a strategy of its own: fsdp.shard_grad_op, "
            "fsdp.hybrid_shard_zero2)",
        ),
        FamilySetting(
            "prefetch_units",
            ("fsdp2",),
            "{strategy}: prefetch_units is FSDP2's explicit prefetch (set_modules_to_forward_prefetch / "
            "set_modules_to_backward_prefetch, fsdp2.*); FSDP1's is forward_prefetch and backward_prefetch",
        ),
        FamilySetting("forward_prefetch", ("fsdp",), _FSDP1_ONLY),
        FamilySetting("backward_prefetch", ("fsdp",), _FSDP1_ONLY),
        FamilySetting("limit_all_gathers", ("fsdp",), _FSDP1_ONLY),
        FamilySetting(
            "bucket_cap_mb",
            ("ddp",),
            "{strategy}: bucket_cap_mb is DistributedDataParallel's gradient bucket size (ddp); {strategy} does not "
            "take it",
            layouts=True,
        ),
    )
}
"""setting → where it applies: a family's framework option, refused by the other families' cells (a `skipped`
record with the reason) when it is set away from its default"""


def family_setting_refusal(setting: str, *, strategy: str, layout: bool) -> str | None:
    """Why a cell of `strategy` (with a tensor/pipeline layout when `layout`) cannot take the family setting
    `setting` away from its default, or None (also for a setting that is no family's option)."""
    fs = FAMILY_SETTINGS.get(setting)
    entry = CATALOGUE.get(strategy)
    if fs is None or entry is None:
        return None
    if entry.family not in fs.families:
        return fs.refusal.format(strategy=strategy, setting=setting)
    if layout and not fs.layouts:
        return f"{strategy}: {setting} is not part of the tensor- and pipeline-parallel layouts here"
    return None


def is_hybrid(strategy: str) -> bool:
    """Whether `strategy` runs on the 2-D (replicate × shard) mesh; False for a name not in the catalogue."""
    return strategy in HYBRID_STRATEGIES


# --------------------------------------------------------------------------------------------------
# report colours

PALETTE: tuple[str, ...] = (
    "#000000",
    "#0072B2",
    "#56B4E9",
    "#332288",
    "#44AA99",
    "#999933",
    "#009E73",
    "#CC79A7",
    "#E69F00",
    "#D55E00",
    "#882255",
)
"""Okabe & Ito (2008) without yellow (too light on white), then Paul Tol's muted indigo, teal, olive, wine: all
distinguishable with the common colour-vision deficiencies. The first strategies take these, in catalogue order."""
UNKNOWN_COLOUR = "#888888"
"""grey: the colour of a strategy that is not in the catalogue (an old record's)"""
_GOLDEN = 0.6180339887498949
_LIGHTNESS = (0.40, 0.55, 0.30)


def palette_colour(index: int) -> str:
    """The colour of the strategy at position `index` of a catalogue: PALETTE, then colours that never run out.

    Past the palette, hues step by the golden ratio around the colour wheel (each new hue far from the last ones)
    at full saturation, cycling three lightnesses; never grey, and deterministic.
    """
    if index < 0:
        raise ValueError(f"palette index {index} is negative")
    if index < len(PALETTE):
        return PALETTE[index]
    k = index - len(PALETTE)
    r, g, b = colorsys.hls_to_rgb((0.07 + k * _GOLDEN) % 1.0, _LIGHTNESS[k % len(_LIGHTNESS)], 0.85)
    return "#{:02X}{:02X}{:02X}".format(*(round(c * 255) for c in (r, g, b)))


def strategy_colours(names: tuple[str, ...] | list[str] = STRATEGIES) -> dict[str, str]:
    """strategy → report colour, by position in `names` (the catalogue's order by default)."""
    return {name: palette_colour(i) for i, name in enumerate(names)}


STRATEGY_COLOURS: dict[str, str] = strategy_colours()
"""strategy → colour, the same in every figure of every report"""
