"""The planner's memory model of tensor- and pipeline-parallel cells (harness.plan.layouts.layout_memory) against what
rank 0 really holds on CPU, for two layouts: tp 2 (FSDP2 on a one-rank data-parallel mesh) and a 2-stage 1F1B
pipeline (two microbatches in flight on stage 0).

Measured over one training step after two warm ones, in real gloo processes: the parameter bytes rank 0 keeps (the
local tensors of its sharded parameters) and the peak of the bytes saved for backward that are alive at once (every
tensor autograd packs, deduplicated by storage, counted until autograd releases it; the parameters' own storages
and the RoPE tables left out), which is what the model calls activations."""

from __future__ import annotations

import json
import os
import socket

import pytest

from harness.plan.layouts import in_flight, rank_layout_memory
from harness.results.spec import spec_from_json, spec_to_json

pytestmark = pytest.mark.dist


def _measure(rank: int, spec_dict: dict, port: int, out: str) -> None:
    import torch
    import torch.distributed as dist
    from torch.distributed._functional_collectives import AsyncCollectiveTensor
    from torch.distributed.tensor import DTensor

    from harness.scenario.spec import RunSpec
    from harness.worker import models
    from harness.worker.models import synthetic_batch
    from harness.worker.strategies import family
    from harness.worker.strategies.base import Topology
    from harness.worker.teardown import end_process_group

    torch.set_num_threads(1)
    spec = spec_from_json(spec_dict)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=spec.gpus)
    topo = Topology(rank=rank, world_size=spec.gpus, local_rank=rank % spec.gpus_per_node,
                    gpus_per_node=spec.gpus_per_node, device=torch.device("cpu"))  # fmt: skip
    trainer = family(spec.strategy).setup(spec, topo=topo)
    s = spec.settings
    batch = [synthetic_batch(spec.model_config, seed=s.seed, rank=spec.layout.dp_rank(rank), micro_batch=s.micro_batch,
                             seq_len=s.seq_len)]  # fmt: skip
    for _ in range(2):
        trainer.step(batch)

    def local(t):
        """The plain tensor that holds the bytes: a DTensor's local shard, a collective's (waited) result."""
        t = t._local_tensor if isinstance(t, DTensor) else t
        return t.elem if isinstance(t, AsyncCollectiveTensor) else t

    param_bytes = sum(local(p).numel() * local(p).element_size() for p in trainer.model.parameters())
    live: dict[int, list[int]] = {}  # storage → [bytes, references]
    state = {"now": 0, "peak": 0}
    rope = {t.untyped_storage().data_ptr() for pair in models._ROPE_CACHE.values() for t in pair}

    class Held:
        def __init__(self, t, key):
            self.t, self.key = t, key

        def __del__(self):
            entry = live[self.key]
            entry[1] -= 1
            if entry[1] == 0:
                state["now"] -= entry[0]
                del live[self.key]

    def ptr(t) -> int | None:
        try:
            return local(t).untyped_storage().data_ptr()
        except RuntimeError:  # a storage FSDP2 resized to nothing (a freed unsharded parameter)
            return None

    def pack(t):
        lt, key = local(t), ptr(t)
        params = {ptr(p) for p in trainer.model.parameters()}
        if key is None or key in params or key in rope:
            return t
        if key not in live:
            live[key] = [lt.untyped_storage().nbytes(), 0]
            state["now"] += live[key][0]
            state["peak"] = max(state["peak"], state["now"])
        live[key][1] += 1
        return Held(t, key)

    def unpack(h):
        return h.t if isinstance(h, Held) else h

    with torch.autograd.graph.saved_tensors_hooks(pack, unpack):
        trainer.step(batch)
    if rank == 0:
        with open(out, "w") as f:
            json.dump({"param_bytes": param_bytes, "peak_saved_bytes": state["peak"]}, f)
    end_process_group()


def measure(spec, tmp_path) -> dict:
    import torch.multiprocessing as mp

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    out = tmp_path / "measured.json"
    mp.spawn(_measure, args=(spec_to_json(spec), port, str(out)), nprocs=spec.gpus)
    return json.loads(out.read_text())


def _spec(**settings):
    from tests.conftest import make_spec

    return make_spec(strategy="fsdp2.full_shard", gpus=2, **settings)


@pytest.mark.parametrize(
    "settings, forwards",
    [({"tp": 2}, 1), ({"pp": 2, "pp_schedule": "1f1b", "micro_batch": 4, "microbatches": 4}, 2)],
    ids=["tp2", "pp2-1f1b"],
)
def test_layout_memory_matches_what_rank_0_holds(settings, forwards, tmp_path):
    spec = _spec(**settings)
    got = measure(spec, tmp_path)
    mem = rank_layout_memory(spec, pp_rank=0)  # rank 0's: what this test measures (the plan keeps the largest rank's)
    assert len(in_flight(spec.layout, max(1, spec.settings.microbatches))) == forwards
    # parameters: rank 0's tensor-parallel shards, or its stage, exactly (fp32)
    assert got["param_bytes"] == mem["params"]
    # activations: the forwards in flight at rank 0's peak, each what one forward of its stage saves (a pipeline's
    # microbatches of token ids are views of one batch: their storage is counted once, not per microbatch)
    assert got["peak_saved_bytes"] == pytest.approx(mem["activations"], rel=0.005), (got, mem["notes"])
