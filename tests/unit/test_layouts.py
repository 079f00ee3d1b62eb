"""Tensor/pipeline layouts at the edge (harness.core.layout, harness.scenario.schema) and in the planner
(harness.plan.layouts): bad layouts are input errors naming file, key, value and what is allowed (exit 2); strategies
that do not compose are `skipped` with the catalogue's reason; the settings at their defaults change no run_id; the
mesh puts TP inside a node and PP across nodes."""

from __future__ import annotations

import dataclasses

import pytest

from harness.cli import main
from harness.core.catalogue import CATALOGUE, STRATEGIES
from harness.core.errors import InputError
from harness.core.layout import Layout, stage_blocks, stage_params
from harness.core.zoo import ZOO, ModelConfig
from harness.plan.comm import predict_comm
from harness.scenario.schema import parse_scenario
from tests.conftest import make_spec


def doc(*, gpus=4, strategy="fsdp2.full_shard", matrix=None, models=None, **settings) -> dict:
    d = {
        "name": "t",
        "matrix": {"model": ["tiny"], "strategy": [strategy], "precision": ["fp32"], "gpus": [gpus], **(matrix or {})},
        "settings": settings,
    }
    if models:
        d["models"] = models
    return d


def problems(d: dict) -> list[str]:
    with pytest.raises(InputError) as e:
        parse_scenario(d, "s.yaml")
    return [str(p) for p in e.value.problems]


# ---- bad layouts: input errors


def test_tp_x_pp_must_divide_gpus():
    (p,) = [p for p in problems(doc(gpus=4, tp=3)) if "does not divide gpus" in p]
    assert p.startswith("s.yaml: settings.tp: tp 3 x pp 1 = 3 does not divide gpus 4")
    assert "allowed tp x pp: 1, 2, 4" in p and "(cell tiny fsdp2.full_shard fp32 gpus 4)" in p


def test_the_error_names_the_axis_entry_that_set_the_value():
    out = problems(doc(gpus=4, matrix={"pp": [1, 2, 3]}))
    assert any(p.startswith("s.yaml: matrix.pp[2]: tp 1 x pp 3 = 3 does not divide gpus 4") for p in out), out
    out = problems(doc(gpus=2, matrix={"include": [{"model": "tiny", "strategy": "ddp", "precision": "fp32",
                                                    "gpus": 6, "pp": 4}]}))  # fmt: skip
    assert any(p.startswith("s.yaml: matrix.include[0].pp: pp 4 x 1 stage(s) per rank") for p in out), out


def test_tp_must_divide_query_and_kv_heads():
    gqa = {"gqa": {"d_model": 64, "n_layers": 2, "n_heads": 8, "n_kv_heads": 2, "ffn": 128, "vocab": 64}}
    d = doc(gpus=4, tp=4, models=gqa)
    d["matrix"]["model"] = ["gqa"]
    (p,) = problems(d)
    assert p == (
        "s.yaml: settings.tp: tp 4 does not divide the model's n_heads 8 and n_kv_heads 2 (tensor parallelism "
        "splits whole heads); allowed tp: 1, 2 (cell gqa fsdp2.full_shard fp32 gpus 4)"
    )


def test_tp_must_split_ffn_vocab_and_the_sequence_evenly():
    """DTensor's parallel styles assume even shards (issue 31: ffn 33 over tp 2 failed in aten.mm at run time)."""
    odd = {"odd": {"d_model": 64, "n_layers": 2, "n_heads": 4, "n_kv_heads": 2, "ffn": 33, "vocab": 101}}
    d = doc(gpus=2, tp=2, models=odd, sequence_parallel=True, seq_len=37)
    d["matrix"]["model"] = ["odd"]
    assert problems(d) == [
        "s.yaml: settings.tp: tp 2 does not divide the model's ffn 33 (tensor parallelism splits it into equal "
        "shards); allowed tp for this model: 1 (cell odd fsdp2.full_shard fp32 gpus 2)",
        "s.yaml: settings.tp: tp 2 does not divide the model's vocab 101 (tensor parallelism splits it into equal "
        "shards); allowed tp for this model: 1 (or pad it: pad_vocab_multiple: 128, as Megatron-LM does) (cell odd "
        "fsdp2.full_shard fp32 gpus 2)",
        "s.yaml: settings.seq_len: seq_len 37 does not split into tp 2 equal sequence-parallel shards; allowed "
        "seq_len: multiples of 2 (cell odd fsdp2.full_shard fp32 gpus 2)",
    ]
    # padded (issue 49): the vocabulary is no longer a problem, and the cell's model says what it pads
    d = doc(gpus=2, tp=2, models={"odd": {**odd["odd"], "ffn": 34}}, pad_vocab_multiple=8)
    d["matrix"]["model"] = ["odd"]
    (spec,) = parse_scenario(d, "s.yaml").expand(gpus_per_node=2)  # no InputError
    assert (spec.model_config.vocab, spec.model_config.data_vocab, spec.model_config.tokens) == (112, 101, 101)
    assert spec.model_config.n_params() == ModelConfig(d_model=64, n_layers=2, n_heads=4, n_kv_heads=2, ffn=34,
                                                       vocab=112).n_params()  # fmt: skip


def test_virtual_stages_belong_to_the_interleaved_schedule():
    tiny8 = {"tiny8": {"d_model": 64, "n_layers": 8, "n_heads": 4, "ffn": 176, "vocab": 512}}
    d = doc(gpus=2, pp=2, pp_schedule="1f1b", pp_virtual_stages=2, models=tiny8, micro_batch=4)
    d["matrix"]["model"] = ["tiny8"]
    (p,) = problems(d)
    assert "pp_virtual_stages 2 with pp_schedule 1f1b: several stages per rank is the interleaved schedule's" in p
    d = doc(gpus=2, pp=2, pp_schedule="interleaved_1f1b", pp_virtual_stages=5, models=tiny8, micro_batch=4)
    d["matrix"]["model"] = ["tiny8"]
    (p,) = problems(d)
    assert "pp 2 x 5 stage(s) per rank (interleaved_1f1b) = 10 pipeline stages > the model's 8 blocks" in p
    d = doc(gpus=2, pp=2, pp_schedule="interleaved_1f1b", pp_virtual_stages=4, models=tiny8, micro_batch=4)
    d["matrix"]["model"] = ["tiny8"]
    (spec,) = parse_scenario(d, "s.yaml").expand(gpus_per_node=2)
    assert (spec.layout.stages_per_rank, spec.layout.n_stages, spec.layout.stages_of(1)) == (4, 8, [1, 3, 5, 7])
    assert spec.layout_tag == "pp2 (interleaved_1f1b v4)"


def test_more_stages_than_blocks():
    (p,) = problems(doc(gpus=4, pp=4, micro_batch=4))
    assert "pp 4 x 1 stage(s) per rank (1f1b) = 4 pipeline stages > the model's 2 blocks" in p
    assert "allowed pp: 1..2" in p
    # interleaved 1F1B holds two stages per rank: pp 2 needs four blocks
    (p,) = problems(doc(gpus=2, pp=2, pp_schedule="interleaved_1f1b"))
    assert p.startswith("s.yaml: settings.pp: pp 2 x 2 stage(s) per rank (interleaved_1f1b) = 4 pipeline stages")


def test_microbatches_must_split_the_micro_batch_and_replace_grad_accum():
    (p,) = problems(doc(gpus=2, pp=2, micro_batch=3))
    assert p.startswith("s.yaml: settings.microbatches: micro_batch 3 does not split into 2 pipeline microbatches")
    assert "allowed microbatches: 1, 3" in p
    (p,) = problems(doc(gpus=2, pp=2, microbatches=1))
    assert "1f1b needs at least as many microbatches as stages (2), got 1" in p
    (p,) = problems(doc(gpus=2, pp=2, grad_accum=2))
    assert p.startswith("s.yaml: settings.grad_accum: grad_accum 2 with pp 2")


def test_a_bad_layout_exits_2_before_anything_runs(tmp_path, capsys):
    path = tmp_path / "s.yaml"
    path.write_text(
        "name: s\nmatrix: {model: [tiny], strategy: [fsdp2.full_shard], precision: [fp32], gpus: [4], tp: [3]}\n"
    )
    assert main(["plan", str(path)]) == 2
    err = capsys.readouterr().err
    assert "matrix.tp[0]: tp 3 x pp 1 = 3 does not divide gpus 4" in err


# ---- strategies that do not compose: skipped with the catalogue's reason


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_the_catalogue_says_which_strategies_compose(strategy):
    entry = CATALOGUE[strategy]
    gpus = 8 if entry.mesh == "hybrid" else 4
    tp, pp = make_spec(strategy=strategy, gpus=gpus, tp=2), make_spec(strategy=strategy, gpus=gpus, pp=2)
    composes = strategy.startswith("fsdp2.") or strategy in ("ddp", "zero1")  # zero1: the distributed optimizer
    assert (tp.unsupported_reason() is None) == composes
    assert (pp.unsupported_reason() is None) == composes
    for spec in (tp, pp):
        why = spec.unsupported_reason()
        assert why is None or why.startswith(strategy) and "{strategy}" not in why


def test_layout_refusals_say_why():
    assert make_spec(strategy="ddp", gpus=2, tp=2).unsupported_reason() is None  # localised TP shards (issue 49)
    assert (
        "pipelining drives the gradient sync of FSDP2 and DDP"
        in make_spec(strategy="fsdp.full_shard", gpus=2, pp=2).unsupported_reason()
    )
    assert "own pipeline engine" in make_spec(strategy="zero3", gpus=2, tp=2).unsupported_reason()
    assert (
        "zero1 does: it runs the harness's distributed optimizer"
        in make_spec(strategy="zero2", gpus=4, tp=2, pp=2).unsupported_reason()
    )
    # TP stays inside a node; HSDP needs whole replicas beside tp and pp
    assert (
        "does not fit in a node of 2 GPUs" in make_spec(strategy="fsdp2.full_shard", gpus=4, tp=4).unsupported_reason()
    )
    why = make_spec(strategy="fsdp2.hybrid_shard", gpus=4, pp=2).unsupported_reason()
    assert "leaves 1 replica(s), it needs at least 2" in why
    assert make_spec(strategy="fsdp2.hybrid_shard", gpus=8, pp=2).unsupported_reason() is None
    # fp16 runs under the layouts (issue 49: one loss scaler's verdict over every rank), zero1's too on CPU (the
    # harness's distributed optimizer, not DeepSpeed, whose fp16 CPU cannot run)
    for strategy in ("fsdp2.full_shard", "ddp", "zero1"):
        assert make_spec(strategy=strategy, gpus=2, tp=2, precision="fp16").unsupported_reason("cpu") is None
    assert "DeepSpeed fp16" in make_spec(strategy="zero1", gpus=2, precision="fp16").unsupported_reason("cpu")
    assert (
        "harness's distributed optimizer, not DeepSpeed"
        in make_spec(strategy="zero1", gpus=2, tp=2, deepspeed_config={"gradient_clipping": 1.0}).unsupported_reason()
    )
    assert "compile" in make_spec(strategy="fsdp2.full_shard", gpus=2, pp=2, compile=True).unsupported_reason()


# ---- identity: defaults change no run_id


def test_layout_settings_at_their_defaults_keep_every_run_id():
    plain = make_spec(strategy="fsdp2.full_shard")
    same = make_spec(strategy="fsdp2.full_shard", tp=1, pp=1, pp_schedule="1f1b", microbatches=0)
    assert same.run_id == plain.run_id
    # the pipeline's and sequence parallelism's knobs mean nothing without pp / tp: dropped, so a pp: [1, 2] axis
    # with a schedule setting keeps the pp 1 cell's run_id
    assert make_spec(strategy="fsdp2.full_shard", pp_schedule="gpipe", sequence_parallel=True).run_id == plain.run_id
    assert make_spec(strategy="fsdp2.full_shard", gpus=2, tp=2).run_id != plain.run_id
    specs = parse_scenario(doc(gpus=2, matrix={"pp": [1, 2]}, pp_schedule="gpipe"), "s").expand(gpus_per_node=2)
    assert specs[0].run_id == make_spec(strategy="fsdp2.full_shard").run_id
    assert specs[1].settings.pp_schedule == "gpipe"


def test_tokens_per_step_count_each_data_parallel_replica_once():
    spec = make_spec(strategy="fsdp2.full_shard", gpus=4, tp=2)
    assert spec.dp == 2 and spec.tokens_per_step == 2 * 64 * 2
    assert make_spec(strategy="fsdp2.full_shard", gpus=4).tokens_per_step == 2 * 64 * 4


# ---- the mesh and the stages


def test_tp_is_innermost_inside_a_node_and_pp_outermost():
    lay = Layout(gpus=8, degrees=(("pp", 2), ("tp", 2)), gpus_per_node=2)
    assert lay.mesh_dims == (("pp", 2), ("dp", 2), ("tp", 2))
    assert lay.group(0, ("tp",)) == [0, 1]  # one node
    assert lay.group(0, ("dp",)) == [0, 2]  # across nodes
    assert lay.group(0, ("pp",)) == [0, 4]
    assert [lay.dp_rank(r) for r in range(8)] == [0, 0, 1, 1, 0, 0, 1, 1]
    hsdp = Layout(gpus=8, degrees=(("pp", 2),), gpus_per_node=2, hybrid=True)
    assert hsdp.mesh_dims == (("pp", 2), ("dp_replicate", 2), ("dp_shard", 2), ("tp", 1))
    assert hsdp.group(0, ("dp_shard",)) == [0, 1] and hsdp.group(0, ("dp_replicate",)) == [0, 2]
    assert [hsdp.dp_rank(r) for r in range(4)] == [0, 1, 2, 3]


def test_stages_are_balanced_by_blocks_and_hold_every_parameter():
    assert stage_blocks(5, 2) == [[0, 1, 2], [3, 4]]
    assert stage_blocks(4, 4) == [[0], [1], [2], [3]]
    with pytest.raises(ValueError, match="every stage needs a block"):
        stage_blocks(2, 3)
    cfg = ZOO["7b"]
    per_stage = stage_params(cfg, 4)
    assert sum(per_stage) == cfg.n_params()
    assert per_stage[0] - per_stage[1] == cfg.embedding_params()


# ---- the planner


def test_tp_collectives_per_micro_step():
    """tp 2 on the tiny model (2 blocks), micro_batch 2 x 64 tokens x d_model 64, fp32: per block 2 all_reduces
    forward and 5 backward, the embedding's and the head's, then loss parallel's three per token."""
    pred = predict_comm(make_spec(strategy="fsdp2.full_shard", gpus=2, tp=2))
    x = 2 * 64 * 64 * 4
    assert pred["by_collective"] == {
        "all_reduce": {"calls": 19.0, "bytes": 16.0 * x + 3 * 128 * 4, "dtype": "float32",
                       "dtypes": {"float32": 16.0 * x + 3 * 128 * 4}},
    }  # fmt: skip
    sp = predict_comm(make_spec(strategy="fsdp2.full_shard", gpus=2, tp=2, sequence_parallel=True))
    assert sp["by_collective"]["all_gather"]["calls"] == sp["by_collective"]["reduce_scatter"]["calls"] == 10
    assert sp["by_collective"]["all_reduce"]["calls"] == 3 + 5  # loss parallel + the 5 norm weights' gradients


def test_pp_sends_and_receives_per_microbatch():
    one = predict_comm(make_spec(strategy="fsdp2.full_shard", gpus=2, pp=2))
    assert one["by_collective"]["send"] == one["by_collective"]["recv"]
    assert one["by_collective"]["send"]["calls"] == 2  # 2 microbatches: activations forward, gradients back
    assert one["by_collective"]["send"]["bytes"] == 2 * 64 * 64 * 4
    bf16 = predict_comm(make_spec(strategy="fsdp2.full_shard", gpus=2, pp=2, precision="bf16"))
    assert bf16["by_collective"]["send"]["dtype"] == "bfloat16"
    # DDP's autocast keeps the residual stream in fp32
    assert (
        predict_comm(make_spec(strategy="ddp", gpus=2, pp=2, precision="bf16"))["by_collective"]["send"]["dtype"]
        == "float32"
    )


# ---- issue 49: the distributed optimizer, checkpointing under TP


def test_the_distributed_optimizer_holds_2_plus_4_plus_12_over_dp_bytes_per_parameter():
    """zero1 under a layout (Megatron's distributed optimizer, bf16): the rank's stage parameters in bf16 and their
    fp32 main gradients whole, the fp32 master and AdamW's moments on 1/dp of the flat buffer (padded to dp)."""
    from harness.plan.layouts import local_stage_params
    from harness.plan.memory import memory

    spec = make_spec(strategy="zero1", precision="bf16", model="llama3.1-70b", gpus=256, gpus_per_node=8, tp=8, pp=4,
                     micro_batch=4, seq_len=256)  # fmt: skip
    m = memory(spec, device="cuda")
    flats = [local_stage_params(spec, stage=st)["flat"] for st in range(4)]
    assert all(f % spec.dp == 0 for f in flats)
    flat = next(f for f in flats if m.params == 2 * f)  # the planned pipeline rank's stage
    assert (m.params, m.grads_after_backward, m.optimizer) == (2 * flat, 4 * flat, 12 * flat // spec.dp)
    fsdp2 = memory(dataclasses.replace(spec, strategy="fsdp2.full_shard"), device="cuda")
    assert fsdp2.optimizer < m.optimizer * 1.01  # FSDP2 shards the fp32 parameters too: 8 B/param over dp
    ledger = predict_comm(spec)["by_collective"]
    assert ledger["reduce_scatter"]["dtypes"].keys() == {"float32"}  # fp32 main gradients
    assert "bfloat16" in ledger["all_gather"]["dtypes"]  # bf16 parameters gathered


@pytest.mark.parametrize("sp", [False, True])
@pytest.mark.parametrize("policy", ["full", "selective"])
def test_checkpointing_under_tp_reissues_the_forward_collectives_but_the_last(sp, policy):
    base = make_spec(strategy="fsdp2.full_shard", gpus=2, tp=2, sequence_parallel=sp)
    ckpt = make_spec(strategy="fsdp2.full_shard", gpus=2, tp=2, sequence_parallel=sp, activation_checkpointing=policy)
    a, b = predict_comm(base)["by_collective"], predict_comm(ckpt)["by_collective"]
    blocks, x = base.model_config.n_layers, base.settings.micro_batch * base.settings.seq_len * 64 * 4
    extra = {k: b[k]["bytes"] - a[k]["bytes"] for k in b}
    if sp:  # per block: the all-gathers into attention and the MLP, the reduce-scatter out of attention
        assert extra == {"all_gather": 2 * blocks * x, "reduce_scatter": blocks * x, "all_reduce": 0}
    else:  # per block: the all-reduce after attention's o (not the one after the down projection)
        assert extra == {"all_reduce": blocks * x}


def test_fp16_under_a_layout_plans_the_foreach_step_its_sharded_scaler_forces_on_cuda():
    """Every layout's fp16 steps under a ShardedGradScaler, so AdamW runs foreach on CUDA too (not fused), holding
    one fp32 temporary as large as the shards it steps."""
    from harness.plan.memory import foreach_optimizer

    for strategy in ("ddp", "zero1", "fsdp2.full_shard"):
        assert foreach_optimizer(make_spec(strategy=strategy, gpus=2, tp=2, precision="fp16"), "cuda")
        assert not foreach_optimizer(make_spec(strategy=strategy, gpus=2, tp=2, precision="bf16"), "cuda")
    assert not foreach_optimizer(make_spec(strategy="ddp", gpus=2, precision="fp16"), "cuda")  # torch's GradScaler
