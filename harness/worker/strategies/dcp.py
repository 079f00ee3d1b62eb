"""The distributed checkpoint of a torch-optimizer trainer (FSDP1, FSDP2): `torch.distributed.checkpoint` (DCP) with
sharded state dicts, the way torchtitan saves and resumes them.

Every rank writes its own shards of the model and of the AdamW state (`__<rank>_0.distcp`) and the coordinator the
`.metadata` that maps them; a load reads back only the shards the rank owns, so no rank ever holds the whole state.
`get_state_dict` / `set_state_dict` give the sharded form for either FSDP (FSDP1's SHARDED_STATE_DICT, FSDP2's
DTensors) and initialise a fresh optimizer's state so that it has tensors to load into.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

FORMAT = "dcp"
"""what the record's metrics.checkpoint.format says of these files"""


def unwrapped(model: torch.nn.Module) -> torch.nn.Module:
    """The module whose state is saved: the compiled module's original (torch.compile wraps it)."""
    return getattr(model, "_orig_mod", model)


def save(trainer: Any, directory: Path, *, step: int) -> None:
    """Write the trainer's model, optimizer (and loss scaler) state and `step` (optimizer steps done) under
    `directory`, each rank its own shards. Collective: every rank calls it."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict

    model_sd, optim_sd = get_state_dict(unwrapped(trainer.model), trainer.optimizer)
    state: dict[str, Any] = {"model": model_sd, "optimizer": optim_sd, "step": torch.tensor(step)}
    if trainer.scaler is not None:
        state["scaler"] = trainer.scaler.state_dict()
    dcp.save(state, checkpoint_id=str(directory))


def load(trainer: Any, directory: Path) -> int:
    """Read what `save` wrote into a freshly built trainer (the same strategy and world); returns the step saved.
    Collective."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    model = unwrapped(trainer.model)
    model_sd, optim_sd = get_state_dict(model, trainer.optimizer)
    state: dict[str, Any] = {"model": model_sd, "optimizer": optim_sd, "step": torch.tensor(0)}
    if trainer.scaler is not None:
        state["scaler"] = trainer.scaler.state_dict()
    dcp.load(state, checkpoint_id=str(directory))
    set_state_dict(model, trainer.optimizer, model_state_dict=state["model"], optim_state_dict=state["optimizer"])
    if trainer.scaler is not None:
        trainer.scaler.load_state_dict(state["scaler"])
    return int(state["step"])
