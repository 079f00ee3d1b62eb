"""`factory: package.module:function` (issue 53) planned from the module itself: its parameters from a meta-device
build, its FLOPs and saved activations from a forward and backward on fake tensors (harness.worker.factory_models,
run as the planner's child). Each figure is held to the same thing measured on the real module, on the CPU; a bad
entry is refused with its file, key path and reason (exit 2)."""

from __future__ import annotations

import json

import pytest

from harness.cli import main
from harness.scenario.factory_model import FactoryModel, factory_model_entry
from harness.scenario.schema import parse_scenario

torch = pytest.importorskip("torch")
TARGET = "tests.fixtures.factory_pkg.conv_lm"
ARGS = {"layers": 2, "width": 24, "tied": False}
MATRIX = {"strategy": ["ddp"], "precision": ["fp32"], "gpus": [1]}


def _cfg(args: dict = ARGS, fn: str = "build") -> FactoryModel:
    problems: list = []
    cfg = factory_model_entry({"factory": f"{TARGET}:{fn}", "args": args}, file="s.yaml", where="models.m",
                              problems=problems)  # fmt: skip
    assert not problems and isinstance(cfg, FactoryModel), problems
    return cfg


def _real(args: dict = ARGS):
    from harness.worker.factory_models import build_factory

    return build_factory(f"{TARGET}:build", args, seed=0)


@pytest.mark.parametrize("tied", [True, False])
def test_parameters_are_the_modules(tied):
    args = {**ARGS, "tied": tied}
    cfg, model = _cfg(args), _real(args)
    assert cfg.n_params() == sum(p.numel() for p in model.parameters())
    assert [(p.name, p.shape) for p in cfg.parameter_inventory()] == [
        (n, tuple(p.shape)) for n, p in model.named_parameters()
    ]
    assert (cfg.n_layers, cfg.vocab) == (2, 256)
    units = {p.unit for p in cfg.parameter_inventory()}
    assert units == {"root", "blocks.0", "blocks.1"}


def test_flops_and_recompute_are_flopcounter_on_the_real_module():
    from torch.utils.flop_counter import FlopCounterMode

    from harness.worker.models import apply_activation_checkpointing, loss_fn

    cfg = _cfg()
    x = torch.zeros(1, 16, dtype=torch.long)
    counts = []
    for ckpt in (False, True):
        model = _real()
        if ckpt:
            apply_activation_checkpointing(model, "full")
        counter = FlopCounterMode(display=False)
        with counter:
            loss_fn(model(x), x).backward()
        counts.append(counter.get_total_flops())
    assert cfg.flops_per_token(16) * 16 == counts[0] > 0
    m = cfg.measured_step(micro_batch=1, seq_len=16, mode="fp32")
    assert m is not None and m.recompute_flops == counts[1] - counts[0] > 0


@pytest.mark.parametrize("mode", ["fp32", "autocast", "lowp"])
def test_saved_activations_are_the_real_modules(mode):
    """The bytes the fake-tensor forward saved equal those of the real module's forward on the CPU (distinct
    storages under saved-tensor hooks, parameters and autocast's weight copies left out); in bf16 parameters with a
    tied head (Module.to cannot convert a fake parameter two modules share: the dry GPU check found it)."""
    from harness.worker.models import loss_fn

    args = {**ARGS, "tied": mode == "lowp"}
    model = _real(args)
    if mode == "lowp":
        model = model.to(torch.bfloat16)
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    shapes = {tuple(p.shape) for p in model.parameters()} | {tuple(p.shape)[::-1] for p in model.parameters()}
    seen: dict[int, int] = {}

    def pack(t):
        key = t.untyped_storage().data_ptr()
        cast = mode == "autocast" and t.dtype == torch.bfloat16 and tuple(t.shape) in shapes
        if key not in params and not cast:
            seen[key] = t.untyped_storage().nbytes()
        return t

    x = torch.zeros(2, 16, dtype=torch.long)
    y = x.clone()  # NOTE: the worker's targets are a tensor of their own, saved by the loss
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=mode == "autocast"):
            logits = model(x)
        loss_fn(logits, y)
    m = _cfg(args).measured_step(micro_batch=2, seq_len=16, mode=mode)
    assert m is not None
    assert m.saved_root + sum(m.saved_blocks) == sum(seen.values())
    assert m.logits == 2 * 16 * 256 and len(set(m.saved_blocks)) == 1


def test_a_scenario_plans_it_and_refuses_what_it_cannot_plan(tmp_path):
    doc = {
        "name": "t",
        "models": {"conv": {"factory": f"{TARGET}:build", "args": ARGS}},
        "matrix": {"model": ["conv"], "strategy": ["ddp", "fsdp2.full_shard"], "precision": ["fp32"], "gpus": [2]},
        "settings": {"micro_batch": 2, "seq_len": 16, "activation_checkpointing": "selective"},
    }
    (spec, _) = parse_scenario(doc, str(tmp_path / "t.yaml")).expand(gpus_per_node=2)
    assert "selective checkpointing of a factory model" in (spec.unsupported_reason("cpu") or "")
    doc["settings"] = {"micro_batch": 2, "seq_len": 16, "tp": 2}
    (spec,) = [s for s in parse_scenario(doc, str(tmp_path / "t.yaml")).expand(gpus_per_node=2)
               if s.strategy == "fsdp2.full_shard"]  # fmt: skip
    assert "factory model does not compose with tensor" in (spec.unsupported_reason("cpu") or "")
    # a record's model_config reads back to the same model without importing the factory
    back = FactoryModel(**spec.model_config.to_dict())
    assert back == spec.model_config and "d_model" not in spec.model_config.to_dict()


def test_list_models_prints_what_was_read_from_the_module(tmp_path, capsys):
    path = tmp_path / "s.yaml"
    path.write_text(json.dumps({"name": "s", "models": {"conv": {"factory": f"{TARGET}:build", "args": ARGS}},
                                "matrix": MATRIX | {"model": ["conv"]}}))  # fmt: skip
    assert main(["list", "models", str(path)]) == 0
    line = next(x for x in capsys.readouterr().out.splitlines() if x.startswith("conv "))
    n = sum(p.numel() for p in _real().parameters())
    assert f"{n:,} params" in line and "blocks   2 (MixerBlock)" in line and "class ConvLM" in line, line


@pytest.mark.parametrize(
    "entry, key, words",
    [
        ({"factory": "no_colon_here"}, "models.m.factory", "is not package.module:function"),
        ({"factory": "no_such_pkg.mod:build"}, "models.m.factory", "cannot import 'no_such_pkg.mod'"),
        ({"factory": f"{TARGET}:missing"}, "models.m.factory", "has no callable 'missing'"),
        ({"factory": f"{TARGET}:not_a_module"}, "models.m.factory", "not an nn.Module"),
        ({"factory": f"{TARGET}:build", "args": {"nope": 1}}, "models.m.factory", "unexpected keyword argument"),
        ({"factory": f"{TARGET}:build", "args": [1]}, "models.m.args", "is not a mapping"),
        ({"factory": f"{TARGET}:build", "d_model": 8}, "models.m", "d_model cannot be given with it"),
    ],
)
def test_a_bad_factory_entry_is_refused_with_its_key_and_reason(tmp_path, capsys, entry, key, words):
    path = tmp_path / "s.yaml"
    path.write_text(json.dumps({"name": "s", "models": {"m": entry}, "matrix": MATRIX | {"model": ["m"]}}))
    assert main(["plan", str(path)]) == 2
    err = capsys.readouterr().err
    assert f"{path}: {key}" in err and words in err and "Traceback" not in err, err
