"""harness.plan.time and harness.plan.calibration: the step-time model, its calibration files, and `harness plan`'s
step-time columns. Every test reads calibrations from a temp dir (HARNESS_CALIBRATION_DIR), never this machine's."""

from __future__ import annotations

import collections
import json
from pathlib import Path

import pytest

from harness.cli import main
from harness.core.errors import InputError
from harness.core.zoo import ModelConfig
from harness.plan import calibration as cal
from harness.plan import compute as cp
from harness.plan import overlap as ov
from harness.plan import time as tm
from harness.plan.comm import predict_comm
from harness.scenario.cluster import load_cluster
from tests.conftest import make_spec

REPO = Path(__file__).resolve().parents[2]
HELDOUT = str(REPO / "scenarios" / "time-model-heldout.yaml")


@pytest.fixture
def cal_dir(tmp_path, monkeypatch) -> Path:
    d = tmp_path / "calibration"
    d.mkdir()
    monkeypatch.setenv(cal.CALIBRATION_DIR_ENV, str(d))
    return d


def write_cal(cal_dir: Path, cluster: str = "local", **kw) -> Path:
    path = cal_dir / f"{cluster}{cal.SUFFIX}"
    path.write_text(json.dumps(cal.example_calibration(cluster, **kw)))
    return path


# ---- bus bandwidth


def test_busbw_follows_the_nccl_tests_factors():
    from harness.worker.meters.comm import BUS_FACTORS as METER_FACTORS

    for n in (2, 4, 8, 16):
        assert cal.bus_factor("all_reduce", n) == pytest.approx(2 * (n - 1) / n)
        assert cal.bus_factor("all_gather", n) == pytest.approx((n - 1) / n)
        assert cal.bus_factor("reduce_scatter", n) == pytest.approx((n - 1) / n)
        assert cal.bus_factor("broadcast", n) == 1.0
        for c in cal.BUS_FACTORS:  # the plan's copy and the worker meter's agree
            assert cal.bus_factor(c, n) == pytest.approx(METER_FACTORS[c](n))
    # 1 GB all_reduce in 1 s on 4 ranks: algbw 1 GB/s, busbw 1.5 GB/s
    assert cal.algbw_gbps(1e9, 1.0) == pytest.approx(1.0)
    assert cal.busbw_gbps("all_reduce", 4, 1e9, 1.0) == pytest.approx(1.5)
    assert cal.busbw_gbps("all_gather", 4, 1e9, 2.0) == pytest.approx(0.375)
    assert cal.bus_factor("all_reduce", 1) == 0.0  # one rank: nothing crosses a link


def test_a_collective_curve_times_large_messages_by_busbw():
    data = cal.example_calibration("local")
    rates = cal.CalibratedRates(cal.Found(Path("x.json"), data, None))
    # example: 100 us + bytes * factor / 1 GB/s, exact at the measured points, linear beyond
    for n, coll in ((2, "all_reduce"), (4, "all_gather"), (4, "reduce_scatter")):
        t = rates.collective_s(coll, link="intra", ranks=n, nbytes=2**30, dtype="float32")
        assert t == pytest.approx(1e-4 + 2**30 * cal.bus_factor(coll, n) / 1e9)
        t2 = rates.collective_s(coll, link="intra", ranks=n, nbytes=2**31, dtype="float32")
        assert t2 == pytest.approx(1e-4 + 2**31 * cal.bus_factor(coll, n) / 1e9)
    # 16 ranks, measured up to 8: busbw carries over, the latency grows with the ring (15/7 steps)
    t16 = rates.collective_s("all_reduce", link="intra", ranks=16, nbytes=2**30, dtype="float32")
    assert t16 == pytest.approx(1e-4 * 15 / 7 + 2**30 * cal.bus_factor("all_reduce", 16) / 1e9)


# ---- the model


def test_overlap_switched_off_is_the_sum_of_the_parts(cal_dir):
    write_cal(cal_dir, device="cuda")  # a GPU calibration: collectives may overlap compute
    cluster = load_cluster("local-gpu")
    write_cal(cal_dir, cluster="local-gpu", device="cuda")
    rates = cal.rates_for(cluster)
    for strategy in ("ddp", "fsdp.full_shard", "fsdp.shard_grad_op", "fsdp2.full_shard", "zero2", "zero3"):
        spec = make_spec(strategy=strategy, model="125m", gpus=4, precision="bf16", gpus_per_node=8, seq_len=512)
        off = tm.predict_time(spec, cluster, rates, overlap=False).to_dict()
        on = tm.predict_time(spec, cluster, rates, overlap=True).to_dict()
        t = off["time_s"]
        assert t["comm_exposed"] == t["comm_total"] > 0
        parts = t["compute"] + t["recompute"] + t["optimizer"] + t["comm_total"] + t["other"]
        assert off["step_time_s"] == pytest.approx(parts, rel=1e-12), strategy
        u = on["time_s"]
        assert on["step_time_s"] == pytest.approx(
            u["compute"] + u["recompute"] + u["optimizer"] + u["comm_exposed"] + u["other"], rel=1e-12
        )
        assert u["comm_total"] == pytest.approx(t["comm_total"]) and 0 <= u["comm_exposed"] <= u["comm_total"]
        if strategy != "zero2":
            assert u["comm_exposed"] < u["comm_total"], strategy  # these hide some of it behind compute
        else:
            assert u["comm_exposed"] == pytest.approx(u["comm_total"]), strategy  # ZeRO-2: overlap_comm off


def test_simulate_hides_what_fits_behind_compute():
    # two 1 s segments; a 0.5 s collective issued at the start and needed at the end: hidden
    assert ov.simulate([1.0, 1.0], [(0.5, 0, 2)]) == pytest.approx(2.0)
    # needed before the first segment: exposed in full
    assert ov.simulate([1.0, 1.0], [(0.5, 0, 0)]) == pytest.approx(2.5)
    # issued after the last segment: the reduce tail
    assert ov.simulate([1.0, 1.0], [(0.5, 2, 2)]) == pytest.approx(2.5)
    # one stream: two collectives queue (0.8 + 0.8 from t=0, the second one ends at 1.6, within the 2 s)
    assert ov.simulate([1.0, 1.0], [(0.8, 0, 2), (0.8, 0, 2)]) == pytest.approx(2.0)
    assert ov.simulate([1.0, 1.0], [(1.5, 0, 2), (1.5, 0, 2)]) == pytest.approx(3.0)


def test_no_collectives_at_one_rank_means_no_comm_time(cal_dir):
    write_cal(cal_dir)
    cluster = load_cluster("local")
    rates = cal.rates_for(cluster)
    spec = make_spec(strategy="fsdp2.full_shard", gpus=1)
    assert predict_comm(spec)["calls_per_step"] == 0  # FSDP2 issues nothing on one rank
    pred = tm.predict_time(spec, cluster, rates).to_dict()
    assert pred["time_s"]["comm_total"] == 0.0 and pred["time_s"]["comm_exposed"] == 0.0
    assert pred["step_time_s"] > 0
    # DDP at one rank still reduces on its one-rank group: timed on the "self" link, not zero
    ddp = tm.predict_time(make_spec(strategy="ddp", gpus=1), cluster, rates).to_dict()
    assert ddp["time_s"]["comm_total"] > 0


def test_the_parts_follow_the_settings(cal_dir):
    write_cal(cal_dir)
    cluster = load_cluster("local")
    rates = cal.rates_for(cluster)

    def pred(**kw):
        return tm.predict_time(
            make_spec(strategy="ddp", gpus=2, model="125m", seq_len=128, **kw), cluster, rates
        ).to_dict()

    base, full, sel = pred(), pred(activation_checkpointing="full"), pred(activation_checkpointing="selective")
    assert base["time_s"]["recompute"] == 0 < sel["time_s"]["recompute"] < full["time_s"]["recompute"]
    assert full["time_s"]["compute"] == pytest.approx(base["time_s"]["compute"])
    two = pred(grad_accum=2)
    assert two["time_s"]["compute"] == pytest.approx(2 * base["time_s"]["compute"])
    assert two["time_s"]["optimizer"] == pytest.approx(base["time_s"]["optimizer"])  # one step per accumulation
    assert two["tokens_per_s_per_gpu"] == pytest.approx(
        2 * 2 * 128 / two["step_time_s"]  # micro_batch 2 (default) x seq 128 x 2 micro-steps
    )
    # four ranks on two cores (the example calibration records this host's cores) share them
    cores = cal.usable_cores()
    four = tm.predict_time(make_spec(strategy="ddp", gpus=4, model="125m", seq_len=128), cluster, rates).to_dict()
    assert four["time_s"]["compute"] == pytest.approx(base["time_s"]["compute"] * max(1, 4 / cores) / max(1, 2 / cores))


def test_unmodelled_cells_are_null_with_the_reason(cal_dir):
    write_cal(cal_dir)
    cluster = load_cluster("local")
    rates = cal.rates_for(cluster)
    compiled = tm.predict_time(make_spec(strategy="ddp", compile=True), cluster, rates).to_dict()
    assert compiled["step_time_s"] is None and "compile" in compiled["time_null_reasons"]["step_time_s"]
    offload = tm.predict_time(make_spec(strategy="zero2", offload="optimizer"), cluster, rates).to_dict()
    assert offload["step_time_s"] is None and "offload" in offload["time_null_reasons"]["step_time_s"]
    cpu_mfu = tm.predict_time(make_spec(strategy="ddp"), cluster, rates).to_dict()
    assert cpu_mfu["mfu"] is None and "CPU" in cpu_mfu["time_null_reasons"]["mfu"]


def test_mfu_on_a_known_gpu(cal_dir):
    cluster = load_cluster("a100")
    write_cal(cal_dir, cluster="a100", device="cuda", fingerprint={"device_name": "NVIDIA A100-SXM4-80GB"})
    rates = cal.rates_for(cluster)
    spec = make_spec(strategy="fsdp.full_shard", model="1.3b", gpus=8, precision="bf16", gpus_per_node=8)
    p = tm.predict_time(spec, cluster, rates).to_dict()
    from harness.plan.flops import flops_per_step

    assert p["mfu"] == pytest.approx(flops_per_step(spec) / 8 / p["step_time_s"] / 312e12)


# ---- calibration files


def test_a_calibration_round_trips(cal_dir):
    path = write_cal(cal_dir)
    cluster = load_cluster("local")
    found = cal.find_calibration(cluster)
    assert found is not None and found.path == path and found.forced is None
    assert found.calibration.to_dict() == json.loads(path.read_text())
    rates = cal.rates_for(cluster)
    assert isinstance(rates, cal.CalibratedRates)
    created = found.calibration.created_at
    assert created is not None and rates.source == f"calibrated {path} {created[:10]}"
    p = found.calibration.compute.gemm[7]  # a grid point is read back exactly
    assert rates.gemm_s(p.dtype, p.m, p.n, p.k, p.layout) == pytest.approx(p.s)
    assert rates.dispatch_s() == (1e-5, 1e-5)
    assert cal.write_path(cluster) == path


def test_another_machines_calibration_is_refused(cal_dir, capsys):
    write_cal(cal_dir, fingerprint={"hostname": "elsewhere", "cpu_model": "Some Other CPU"})
    cluster = load_cluster("local")
    with pytest.raises(cal.CalibrationMismatch) as e:
        cal.rates_for(cluster)
    msg = str(e.value)
    assert "measured on host elsewhere (Some Other CPU" in msg and "hostname, cpu_model differ" in msg
    assert "harness calibrate --cluster local" in msg and "--force" in msg
    # `harness plan` stops with that error (exit 2); forced, it plans with the file and says so
    assert main(["plan", HELDOUT]) == 2
    assert "this calibration does not apply here" in capsys.readouterr().err
    assert main(["plan", HELDOUT, "--format", "json", "--force-calibration"]) == 0
    cells = json.loads(capsys.readouterr().out)
    assert all("(forced: it was measured on host elsewhere" in c["calibration"] for c in cells)
    # the sweep's path (predict without rates) does not stop: null with the reason
    from harness.plan.predict import predict

    pred = predict(make_spec(strategy="ddp"), cluster).to_dict()
    assert pred["step_time_s"] is None and "does not apply here" in pred["time_null_reasons"]["step_time_s"]


def test_a_calibration_of_another_cluster_is_refused(cal_dir):
    path = cal_dir / f"local{cal.SUFFIX}"
    path.write_text(json.dumps(cal.example_calibration("h100")))
    with pytest.raises(cal.CalibrationMismatch, match="it calibrates cluster 'h100', not 'local'"):
        cal.rates_for(load_cluster("local"))
    path.write_text(json.dumps({"format": "something else"}))
    with pytest.raises(InputError, match="is not 'harness-calibration/1'"):
        cal.rates_for(load_cluster("local"))


FIXTURE = REPO / "tests" / "fixtures" / "calibration" / "local.calibration.json"
"""a calibration file the harness wrote before the file had a type (220ad9c: `harness calibrate --quick` on the
2-core development host, groups of 2 and 4 ranks): every field the measuring processes write"""


def test_a_file_written_before_the_types_reads_and_writes_back_byte_for_byte(tmp_path):
    calibration = cal.read_calibration(FIXTURE)
    assert calibration.cluster == "local" and calibration.quick is True and calibration.duration_s == 95.0
    assert calibration.fingerprint.cpu_count == 2 and calibration.fingerprint.cpu_allocator == "caching"
    assert len(calibration.compute.gemm) == 156 and set(calibration.compute.framework) == {
        f"{s}/{p}" for s in cal.FRAMEWORK_STRATEGIES for p in ("fp32", "bf16")
    }
    assert [e.ranks for e in calibration.sharing] == [1, 2, 4]
    assert {(c.link, c.ranks) for c in calibration.comm} == {("self", 1), ("intra", 2), ("intra", 4)}
    assert not calibration.model_extra and not calibration.fingerprint.model_extra  # every field has a type
    written = cal.write_calibration(tmp_path / FIXTURE.name, calibration)
    assert written.read_bytes() == FIXTURE.read_bytes()


def test_a_file_written_before_the_types_prices_as_it_did():
    """Figures of the fixture's rates as the harness computed them from the same file at 220ad9c, before the file
    had a type: the reader changed, the rates did not (bit for bit)."""
    r = cal.CalibratedRates(cal.Found(FIXTURE, cal.read_calibration(FIXTURE), None))
    assert r.gemm_s("float32", 100, 200, 300, "nt") == 0.00015562802550376568
    assert r.gemm_s("bfloat16", 64, 4096, 512, "nt") == 0.001769746499576285
    assert r.attention_s("float32", batch=2, heads=4, seq=300, head_dim=64, phase="backward") == 0.009752254311659055
    assert r.elementwise_s("bfloat16", 1e6, op_bytes=1e5) == 2.8975685341387996e-05
    assert r.dispatch_s() == (3.2847350007614297e-06, 4.6786049983893464e-06)
    assert r.optimizer_s(elements=1e6, tensors=20) == 0.005488292700425039
    assert r.framework_s("ddp", "bf16", blocks=3, elements=1e6) == 0.003598190937608707
    assert r.framework_s("zero3", "bf16", blocks=3, elements=1e6) == 0.03525275134630519
    assert r.collective_s("all_reduce", link="intra", ranks=2, nbytes=1e5, dtype="bfloat16") == 0.0005160128940927666
    assert r.collective_s("all_reduce", link="intra", ranks=3, nbytes=1e5, dtype="bfloat16") == 0.0009128815253004994
    assert [r.share("compute", ranks=n) for n in (1, 2, 3, 4, 6)] == [
        1.0, 3.2133609883059457, 3.4589054995774573, 3.7044500108489693, 5.556675016273454
    ]  # fmt: skip
    assert [r.sync_wait_s(ranks_on_host=n) for n in (1, 2, 3, 4, 8)] == [
        0.0, 0.0, 0.0018716221874228722, 0.0037432443748457445, 0.007486488749691489
    ]  # fmt: skip
    assert (r.device, r.device_name, r.host_cores) == ("cpu", None, 2)


def test_the_processes_parts_merge_into_the_file_byte_for_byte(tmp_path):
    """`harness calibrate` reads back the device process's part and each group's part through their types and merges
    them (harness.calibrate.run): the fixture, cut into the parts its processes wrote, merges into the same bytes."""
    doc = json.loads(FIXTURE.read_text())
    device = {k: v for k, v in doc.items() if k not in ("created_at", "duration_s", "quick")}
    device.update(
        comm=[c for c in doc["comm"] if c["ranks"] == 1], sharing=[e for e in doc["sharing"] if e["ranks"] == 1]
    )
    (tmp_path / "compute.json").write_text(json.dumps(device, indent=1))
    parts = []
    for n in (2, 4):
        part = {
            "comm": [c for c in doc["comm"] if c["ranks"] == n],
            "sharing": [e for e in doc["sharing"] if e["ranks"] == n],
        }
        (tmp_path / f"comm{n}.json").write_text(json.dumps(part, indent=1))
        parts.append(cal.read_collectives_part(tmp_path / f"comm{n}.json"))
    device_part = cal.read_calibration(tmp_path / "compute.json")
    assert device_part.created_at is None and len(device_part.comm) == 6 and len(parts[1].comm) == 6
    merged = device_part.merged(parts, created_at=doc["created_at"], duration_s=doc["duration_s"], quick=doc["quick"])
    assert cal.write_calibration(tmp_path / FIXTURE.name, merged).read_bytes() == FIXTURE.read_bytes()
    # a part that is not one is one line per problem, naming the part's file
    part["comm"][0]["ranks"] = "4"
    (tmp_path / "comm4.json").write_text(json.dumps(part))
    with pytest.raises(InputError) as e:
        cal.read_collectives_part(tmp_path / "comm4.json")
    assert [str(p) for p in e.value.problems] == [f"{tmp_path / 'comm4.json'}: comm[0].ranks: '4' is not an integer"]


def test_a_file_that_is_not_a_calibration_is_one_line_per_problem(cal_dir, capsys):
    data = cal.example_calibration("local")
    data["fingerprint"]["cpu_count"] = "two"
    data["compute"]["gemm"][3]["s"] = "fast"
    del data["comm"][0]["ranks"]
    path = cal_dir / f"local{cal.SUFFIX}"
    path.write_text(json.dumps(data))
    with pytest.raises(InputError) as e:
        cal.rates_for(load_cluster("local"))
    assert [str(p) for p in e.value.problems] == [
        f"{path}: fingerprint.cpu_count: 'two' is not an integer",
        f"{path}: compute.gemm[3].s: 'fast' is not a number",
        f"{path}: comm[0].ranks: missing (required)",
    ]
    # `harness plan` stops with those lines (exit 2), never a traceback
    assert main(["plan", HELDOUT]) == 2
    err = capsys.readouterr().err
    assert f"{path}: compute.gemm[3].s: 'fast' is not a number" in err and "Traceback" not in err
    path.write_text('{"format": "harness-calibration/1", "cluster": ')
    with pytest.raises(InputError, match=f"{path}: not a readable calibration file: Expecting value"):
        cal.rates_for(load_cluster("local"))
    # a document given in Python (tests, benches) is validated as the file is
    with pytest.raises(InputError, match="x.json: compute.gemm\\[3\\].s: 'fast' is not a number"):
        cal.Found(Path("x.json"), dict(data, comm=[]), None)


# ---- harness plan


def test_plan_json_has_the_time_fields(cal_dir, capsys):
    write_cal(cal_dir)
    assert main(["plan", HELDOUT, "--format", "json"]) == 0
    cells = json.loads(capsys.readouterr().out)
    assert len(cells) > 30
    for c in cells:
        assert set(c["time_s"]) == set(tm.PARTS)
        assert c["step_time_s"] > 0 and c["tokens_per_s_per_gpu"] > 0
        assert c["mfu"] is None and "CPU" in c["time_null_reasons"]["mfu"]
        assert c["calibration"].startswith("calibrated ")
        t = c["time_s"]
        assert c["step_time_s"] == pytest.approx(
            t["compute"] + t["recompute"] + t["optimizer"] + t["comm_exposed"] + t["other"]
        )
    assert main(["plan", HELDOUT]) == 0
    table = capsys.readouterr().out
    assert "ms/step  tok/s/gpu  MFU" in table and "step time: calibrated " in " ".join(table.split())


def test_uncalibrated_local_is_null_with_the_reason(cal_dir, capsys):
    assert main(["plan", HELDOUT, "--format", "json"]) == 0
    cells = json.loads(capsys.readouterr().out)
    for c in cells:
        assert c["step_time_s"] is None and c["tokens_per_s_per_gpu"] is None and c["mfu"] is None
        assert "run `harness calibrate --cluster local`" in c["time_null_reasons"]["step_time_s"]
        assert c["calibration"].startswith("uncalibrated: profile figures")
    # a GPU profile cites its figures and prices every cell that can run with them (issue 30); a profile that
    # lacks a figure is null with the same advice
    assert main(["plan", HELDOUT, "--format", "json", "--cluster", "h100"]) == 0
    cells = json.loads(capsys.readouterr().out)
    assert all("MAMF" in c["calibration"] for c in cells)
    runnable = [c for c in cells if not c["unsupported"]]
    assert runnable and all(c["step_time_s"] > 0 and 0 < c["mfu"] < 1 for c in runnable)


# ---- the traced inventory the model prices


def test_the_traced_inventory_matches_the_torch_model():
    """Re-trace forward + backward of the zoo Transformer (one and two blocks) with a TorchDispatchMode: op counts
    equal OPS, matmul shapes equal the GEMMs priced, elementwise bytes within 1% of BLOCK_BYTES and ROOT_BYTES."""
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_flatten

    from harness.worker.models import build_model, loss_fn

    view = {"view", "_unsafe_view", "t", "transpose", "slice", "expand", "detach", "alias", "unsqueeze", "squeeze"}
    view |= {"permute", "split", "select", "_reshape_alias", "lift_fresh", "unbind", "as_strided"}

    class Count(TorchDispatchMode):
        def __init__(self) -> None:
            super().__init__()
            self.ops, self.bytes, self.mm = 0, 0, collections.Counter()

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            name = func.overloadpacket.__name__
            self.ops += 1
            if name == "mm":
                a, b = args[0], args[1]
                layout = ("t" if a.stride()[0] == 1 and a.shape[0] > 1 else "n") + (
                    "t" if b.stride()[0] == 1 and b.shape[0] > 1 else "n"
                )
                self.mm[(a.shape[0], b.shape[1], a.shape[1], layout)] += 1
            elif name not in view and "scaled_dot_product" not in name:
                flat = tree_flatten((args, kwargs))[0] + tree_flatten(out)[0]
                self.bytes += sum(t.numel() * t.element_size() for t in flat if isinstance(t, torch.Tensor))
            return out

    d, ffn, nh, vocab, b, s = 96, 256, 4, 768, 2, 24
    runs = {}
    for layers in (1, 2):
        cfg = ModelConfig(d_model=d, n_layers=layers, n_heads=nh, ffn=ffn, vocab=vocab)
        m = build_model(cfg, seed=0, device="cpu")
        x, y = torch.randint(0, vocab, (b, s)), torch.randint(0, vocab, (b, s))
        loss_fn(m(x), y).backward()  # fills the RoPE cache, as the warmup steps do
        m.zero_grad(set_to_none=True)
        with Count() as f:
            loss = loss_fn(m(x), y)
        with Count() as bw:
            loss.backward()
        runs[layers] = (f, bw)
    (f1, b1), (f2, b2) = runs[1], runs[2]
    assert (f2.ops - f1.ops, b2.ops - b1.ops) == cp.OPS["fp32"]["block"]
    assert (2 * f1.ops - f2.ops, 2 * b1.ops - b2.ops) == cp.OPS["fp32"]["root"]
    T, hd = b * s, d // nh
    cfg = ModelConfig(d_model=d, n_layers=1, n_heads=nh, ffn=ffn, vocab=vocab)
    p_block = sum(o * i for _, o, i in cp.block_linears(cfg))
    xs = (T * d, T * ffn, T * nh, s * hd, d, p_block)
    bf, bb = cp.BLOCK_BYTES["fp32"]
    assert f2.bytes - f1.bytes == pytest.approx(cp.dot(bf, xs), rel=0.01)
    assert b2.bytes - b1.bytes == pytest.approx(cp.dot(bb, xs), rel=0.01)
    rx = (T * d, T * vocab, vocab * d, d, T)
    rf, rb = cp.ROOT_BYTES["fp32"]
    # forward: the trace counts the whole embedding table as the gather's input; the model prices the rows read
    assert 2 * f1.bytes - f2.bytes - 4 * vocab * d == pytest.approx(cp.dot(rf, rx), rel=0.01)
    assert 2 * b1.bytes - b2.bytes == pytest.approx(cp.dot(rb, rx), rel=0.01)
    # the matmuls of one block, as (m, n, k, layout), equal the GEMMs the model prices
    block_mm = (f2.mm + b2.mm) - (f1.mm + b1.mm)
    priced: collections.Counter = collections.Counter()
    for _, out_f, in_f in cp.block_linears(cfg):
        fwd, bwd = cp.linear_gemms(T, out_f, in_f)
        for g in fwd + bwd:
            priced[(g.m, g.n, g.k, g.layout)] += 1
    assert block_mm == priced


# ---- harness calibrate


def test_calibrate_is_a_command_and_stops_cleanly_where_a_slurm_profile_cannot_run(cal_dir, capsys):
    from harness.cli import COMMANDS

    assert COMMANDS["calibrate"].target == "harness.cli.calibrate:calibrate_command"
    # a100's partition `gpu` is not on this machine: refused before anything is submitted, whether a SLURM
    # controller answers here (its partitions are listed: bad input, exit 2) or none does (exit 1)
    rc = main(["calibrate", "--cluster", "a100"])
    err = capsys.readouterr().err
    if "is not a partition of this SLURM cluster" in err:
        assert rc == 2 and "a100.yaml: slurm.partition: 'gpu'" in err
    else:
        assert rc == 1 and "nothing was submitted or written" in err
    assert "Traceback" not in err
    assert list(cal_dir.iterdir()) == []  # nothing written


def test_the_framework_terms_are_solved_from_paired_step_times():
    """harness.calibrate.framework steps three models in alternation; a change of the machine's load in one round
    hits all three alike, so it cancels out of the per-block and per-element terms (paired differences) and only
    the per-step term carries its median."""
    from harness.calibrate.framework import framework_models, solve_framework_cost

    n = {name: cfg.n_params() for name, cfg in framework_models(quick=False).items()}
    assert n == {"one": 115904, "three": 216512, "wide": 7357952}  # the wide one: 7.4M parameters, 63x the first
    blocks = {"one": 1, "three": 3, "wide": 1}
    predicted = {"one": 0.010, "three": 0.020, "wide": 0.050}
    load = [0.0, 4e-4, -1e-4, 9e-3]  # the machine's extra time in each round (s)
    times = {k: [predicted[k] + 2e-3 + 5e-4 * blocks[k] + 3e-9 * n[k] + e for e in load] for k in n}
    cost = solve_framework_cost(times, predicted=predicted, n_params=n)
    assert cost.per_element_s == pytest.approx(3e-9, rel=1e-9)
    assert cost.per_block_s == pytest.approx(5e-4, rel=1e-9)
    assert cost.fixed_s == pytest.approx(2e-3 + 2e-4, rel=1e-9)  # + the median load, (0 + 4e-4) / 2
    assert cost.predicted_s == predicted
    assert cost.measured_s == pytest.approx({k: predicted[k] + 2e-3 + 5e-4 * blocks[k] + 3e-9 * n[k] + 2e-4 for k in n})
    # a strategy faster than the model without overhead: no negative cost
    assert solve_framework_cost(times, predicted={k: v + 1.0 for k, v in predicted.items()}, n_params=n).fixed_s == 0.0


def test_measured_sharing_of_a_host_scales_the_parts(cal_dir):
    data = cal.example_calibration("local")
    data["fingerprint"]["cpu_count"] = 2
    data["sharing"] = [
        {"ranks": 1, "gemm_s": 1.0, "elementwise_s": 1.0, "optimizer_s": 1.0},
        {"ranks": 2, "gemm_s": 1.2, "elementwise_s": 2.0, "optimizer_s": 1.8},
        {"ranks": 4, "gemm_s": 2.4, "elementwise_s": 4.0, "optimizer_s": 3.6},
    ]
    (cal_dir / f"local{cal.SUFFIX}").write_text(json.dumps(data))
    cluster = load_cluster("local")
    rates = cal.rates_for(cluster)
    assert rates.share("compute", ranks=1) == 1.0 and rates.share("compute", ranks=2) == pytest.approx(1.2)
    assert rates.share("memory", ranks=3) == pytest.approx(3.0)  # linear between measured counts
    assert rates.share("optimizer", ranks=8) == pytest.approx(7.2)  # beyond: proportional to the ranks
    one = tm.predict_time(make_spec(strategy="fsdp2.full_shard", gpus=1), cluster, rates).to_dict()
    four = tm.predict_time(make_spec(strategy="fsdp2.full_shard", gpus=4), cluster, rates).to_dict()
    comp = cp.micro_step_compute(make_spec(strategy="fsdp2.full_shard", gpus=4), rates)
    assert four["time_s"]["compute"] == pytest.approx(2.4 * (comp.total - comp.elementwise) + 4.0 * comp.elementwise)
    assert one["time_s"]["compute"] == pytest.approx(comp.total)


def test_a_paired_slowdown_wins_over_times_measured_minutes_apart(cal_dir):
    """measure_sharing times each probe on rank 0 alone and on every rank together, back to back, and stores the
    median ratio: that figure is the slowdown, not the group's time over a one-rank time measured minutes earlier
    under another load (here 1.0 ms then: the ratio of times would say 2.0x, the paired ratio says 1.3x)."""
    data = cal.example_calibration("local")
    data["sharing"] = [
        {"ranks": 1, "gemm_s": 1.0, "elementwise_s": 1.0, "optimizer_s": 1.0},
        {"ranks": 2, "gemm_s": 2.0, "gemm_alone_s": 1.5, "gemm_slowdown": 1.3,
         "elementwise_s": 2.0, "elementwise_slowdown": 1.6, "optimizer_s": 2.0, "optimizer_slowdown": 0.9},
    ]  # fmt: skip
    (cal_dir / f"local{cal.SUFFIX}").write_text(json.dumps(data))
    rates = cal.rates_for(load_cluster("local"))
    assert rates.share("compute", ranks=2) == pytest.approx(1.3)
    assert rates.share("memory", ranks=2) == pytest.approx(1.6)
    assert rates.share("optimizer", ranks=2) == 1.0  # never below the rank alone


def test_each_collective_call_waits_the_measured_sync_wait_on_a_crowded_host(cal_dir):
    """measure_sync_wait's figure (the wait per collective for ranks the scheduler has not run yet) is added to
    every collective call of a multi-rank cell on a CPU host, interpolated at the host's ranks: calls x wait more
    comm than the same file without it; a one-rank cell's calls (no peers) wait nothing."""
    data = cal.example_calibration("local")
    data["fingerprint"]["cpu_count"] = 2
    base = [
        {"ranks": 1, "gemm_s": 1.0, "elementwise_s": 1.0, "optimizer_s": 1.0},
        {"ranks": 2, "gemm_s": 1.0, "elementwise_s": 1.0, "optimizer_s": 1.0},
        {"ranks": 4, "gemm_s": 1.0, "elementwise_s": 1.0, "optimizer_s": 1.0},
    ]
    cluster = load_cluster("local")
    comm = {}
    for name, waits in (("without", {}), ("with", {2: 0.001, 4: 0.005})):
        data["sharing"] = [dict(e, **({"sync_wait_s": waits[e["ranks"]]} if e["ranks"] in waits else {})) for e in base]
        d = cal_dir / name
        d.mkdir()
        (d / f"local{cal.SUFFIX}").write_text(json.dumps(data))
        rates = cal.CalibratedRates(cal.Found(d / f"local{cal.SUFFIX}", data, None))
        if waits:
            assert rates.sync_wait_s(ranks_on_host=1) == 0.0 and rates.sync_wait_s(ranks_on_host=2) == 0.001
            assert rates.sync_wait_s(ranks_on_host=3) == pytest.approx(0.003)  # linear between measured counts
            assert rates.sync_wait_s(ranks_on_host=8) == pytest.approx(0.010)  # beyond: proportional to the ranks
        for gpus in (1, 4):
            spec = make_spec(strategy="fsdp.full_shard", gpus=gpus)
            calls = sum(n for c, n in ov.collective_calls(spec, cluster, rates) if c.ranks > 1)
            comm[(name, gpus)] = (tm.predict_time(spec, cluster, rates).to_dict()["time_s"]["comm_total"], calls)
        tm.clear_caches()
    (with4, calls4), (without4, _) = comm[("with", 4)], comm[("without", 4)]
    assert calls4 > 0 and with4 - without4 == pytest.approx(calls4 * 0.005)
    assert comm[("with", 1)][0] == comm[("without", 1)][0]


def test_bf16_compute_is_stretched_by_its_own_measured_sharing(cal_dir):
    """A bf16 GEMM shares a CPU host differently from an fp32 one (this 2-core machine: 1.32x at 2 ranks for fp32,
    about 1x for bf16): with the bf16 probe in the file, bf16 cells use it; without it (a file from before the
    probe), the fp32 figure, as before."""
    data = cal.example_calibration("local")
    data["fingerprint"]["cpu_count"] = 2
    data["sharing"] = [
        {"ranks": 1, "gemm_s": 1.0, "gemm_bfloat16_s": 2.0, "elementwise_s": 1.0, "optimizer_s": 1.0},
        {"ranks": 2, "gemm_s": 1.3, "gemm_bfloat16_s": 2.0, "elementwise_s": 2.0, "optimizer_s": 1.8},
        {"ranks": 4, "gemm_s": 2.0, "gemm_bfloat16_s": 3.0, "elementwise_s": 4.0, "optimizer_s": 3.6},
    ]
    (cal_dir / f"local{cal.SUFFIX}").write_text(json.dumps(data))
    cluster = load_cluster("local")
    rates = cal.rates_for(cluster)
    assert rates.share("compute_bfloat16", ranks=2) == 1.0 and rates.share("compute_bfloat16", ranks=4) == 1.5
    assert rates.share("compute", ranks=2) == pytest.approx(1.3)
    assert rates.share("compute_float16", ranks=2) == pytest.approx(1.3)  # not measured: the fp32 figure
    assert cp.compute_kind("bf16") == "compute_bfloat16"
    assert cp.compute_kind("fp32") == "compute"
    spec = make_spec(strategy="fsdp2.full_shard", gpus=4, precision="bf16")
    comp = cp.micro_step_compute(spec, rates)
    four = tm.predict_time(spec, cluster, rates).to_dict()
    assert four["time_s"]["compute"] == pytest.approx(1.5 * (comp.total - comp.elementwise) + 4.0 * comp.elementwise)
    for e in data["sharing"]:
        del e["gemm_bfloat16_s"]
    (cal_dir / f"local{cal.SUFFIX}").write_text(json.dumps(data))
    old = cal.rates_for(cluster)
    assert old.share("compute_bfloat16", ranks=4) == pytest.approx(2.0)
    four = tm.predict_time(spec, cluster, old).to_dict()
    assert four["time_s"]["compute"] == pytest.approx(2.0 * (comp.total - comp.elementwise) + 4.0 * comp.elementwise)


def test_a_plain_step_probe_stretches_compute_and_memory_where_the_file_has_it(cal_dir):
    """measure_sharing's plain-step probes (fp32 and bf16) are the mix of work a micro-step is: where a file has them
    at every rank count, compute and elementwise work are stretched by them (bf16 cells by the bf16 one), not by the
    GEMM and the product timed alone; the optimizer keeps its own probe; a file without them, the isolated probes."""
    data = cal.example_calibration("local")
    data["fingerprint"]["cpu_count"] = 2
    data["sharing"] = [
        {"ranks": 1, "gemm_s": 1.0, "gemm_bfloat16_s": 1.0, "elementwise_s": 1.0, "optimizer_s": 1.0,
         "step_s": 1.0, "step_bfloat16_s": 1.0},
        {"ranks": 2, "gemm_s": 1.0, "gemm_slowdown": 0.87, "gemm_bfloat16_s": 1.0, "gemm_bfloat16_slowdown": 1.05,
         "elementwise_s": 1.0, "elementwise_slowdown": 1.15, "optimizer_s": 1.0, "optimizer_slowdown": 1.16,
         "step_s": 1.0, "step_slowdown": 1.21, "step_bfloat16_s": 1.0, "step_bfloat16_slowdown": 1.33},
    ]  # fmt: skip
    (cal_dir / f"local{cal.SUFFIX}").write_text(json.dumps(data))
    cluster = load_cluster("local")
    rates = cal.rates_for(cluster)
    assert rates.share("compute", ranks=2) == pytest.approx(1.21)
    assert rates.share("memory", ranks=2) == pytest.approx(1.21)
    assert rates.share("compute_bfloat16", ranks=2) == pytest.approx(1.33)
    assert rates.share("optimizer", ranks=2) == pytest.approx(1.16)
    spec = make_spec(strategy="ddp", gpus=2)
    comp = cp.micro_step_compute(spec, rates)
    two = tm.predict_time(spec, cluster, rates).to_dict()
    assert two["time_s"]["compute"] == pytest.approx(1.21 * comp.total)
    # a file from before the probe (the 2-rank entry lacks it): the GEMM's and the product's figures
    del data["sharing"][1]["step_s"], data["sharing"][1]["step_bfloat16_s"]
    (cal_dir / f"local{cal.SUFFIX}").write_text(json.dumps(data))
    tm.clear_caches()
    old = cal.rates_for(cluster)
    assert old.share("compute", ranks=2) == 1.0  # 0.87, never below the rank alone
    assert old.share("memory", ranks=2) == pytest.approx(1.15)
    assert old.share("compute_bfloat16", ranks=2) == pytest.approx(1.05)


def test_bad_performance_figures_are_named_with_their_key_path():
    from harness.scenario.performance import parse_performance

    problems: list = []
    doc = {"matmul_tflops": {"bf16": -1, "xx": 3}, "intra_node": 5, "inter_node": {"busbw_gbps": "a"}}
    parse_performance(doc, "f.yaml", problems)
    assert [str(p) for p in problems] == [
        "f.yaml: performance.matmul_tflops.bf16: -1 is not a positive number or null",
        "f.yaml: performance.matmul_tflops.xx: unknown key; allowed: fp32, tf32, bf16, fp16",
        "f.yaml: performance.intra_node: must be a mapping (busbw_gbps, latency_us, hop_latency_us)",
        "f.yaml: performance.inter_node.busbw_gbps: 'a' is not a positive number or null",
    ]
