"""`harness calibrate --cluster NAME --from FILE…`: nccl-tests and mamf-finder logs as the rates the planner prices
with (harness.calibrate.logs, harness.plan.calibration.rates.LoggedRates).

The fixtures under tests/fixtures/logs/ are in the exact layout the tools print (nccl-tests' src/util.cu format
strings: the run header, the `#  Rank` lines, the two-block table, the `Out of bounds` and `Avg bus bandwidth`
footer; mamf-finder.py's header and summary); their numbers are synthetic (a latency plus a bus bandwidth that
saturates with the message size), written by `python -m tests.unit.test_calibrate_from` (`write_fixtures`)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from harness.calibrate.logs import calibration_from_logs, read_log
from harness.calibrate.logs.nccl_tests import NcclLog
from harness.cli import main
from harness.core.errors import InputError
from harness.plan.calibration import (
    CALIBRATION_DIR_ENV,
    LoggedRates,
    ProfileRates,
    clear_caches,
    rates_for,
    write_calibration,
)
from harness.plan.predict import predict
from harness.scenario.cluster import load_cluster
from harness.scenario.schema import parse_scenario
from tests.conftest import REPO

LOGS = REPO / "tests" / "fixtures" / "logs"
ONE_NODE = LOGS / "all_reduce_perf.1node.log"
TWO_NODES = LOGS / "all_reduce_perf.2nodes.log"
ALL_GATHER = LOGS / "all_gather_perf.1node.log"
REDUCE_SCATTER = LOGS / "reduce_scatter_perf.1node.log"
MAMF = LOGS / "mamf-finder.bf16.log"


# ---------------------------------------------------------------------------------------------------------------
# parsing


def test_a_single_node_log_reads_as_an_intra_node_curve():
    log = read_log(ONE_NODE)
    assert isinstance(log, NcclLog)
    assert (log.collective, log.ranks, log.hosts, log.link) == ("all_reduce", 8, ("node01",), "intra")
    assert log.devices == ("NVIDIA H100 80GB HBM3",)
    assert len(log.rows) == 31 and log.rows[0].size == 8 and log.rows[-1].size == 8 * 2**30
    big = log.rows[-1]
    assert (big.dtype, big.redop, big.root) == ("float32", "sum", -1)
    # nccl-tests' own arithmetic holds in the file: algbw = size / time, busbw = algbw * 2 (n - 1) / n
    assert big.algbw_gbps == pytest.approx(big.size / big.time_us / 1e3, rel=1e-3)
    assert big.busbw_gbps == pytest.approx(big.algbw_gbps * 2 * 7 / 8, rel=1e-3)
    assert log.avg_busbw_gbps == pytest.approx(sum(r.busbw_gbps for r in log.rows) / 31, abs=0.01)


def test_a_multi_node_log_without_the_program_line_is_told_apart_by_its_hosts_and_columns():
    """The older layout (no `# Collective test starting`, PCI ids as [0x18], NCCL INFO lines between nccl-tests'
    own): 16 ranks on two hosts is the inter-node link; busbw / algbw = 2 · 15 / 16 says all_reduce."""
    log = read_log(TWO_NODES)
    assert isinstance(log, NcclLog)
    assert (log.collective, log.ranks, log.hosts, log.link) == ("all_reduce", 16, ("node01", "node02"), "inter")
    assert log.rows[-1].busbw_gbps == pytest.approx(log.rows[-1].algbw_gbps * 30 / 16, rel=1e-3)


def test_validation_off_and_other_collectives():
    gather, scatter = read_log(ALL_GATHER), read_log(REDUCE_SCATTER)
    assert isinstance(gather, NcclLog) and isinstance(scatter, NcclLog)
    assert (gather.collective, gather.rows[0].dtype, gather.rows[0].redop) == ("all_gather", "bfloat16", "none")
    assert (scatter.collective, scatter.ranks) == ("reduce_scatter", 8)
    assert "N/A" in ALL_GATHER.read_text()  # -c 0: no #wrong counts, read as no error


def test_a_calibration_from_logs_records_which_file_each_figure_came_from():
    cal = calibration_from_logs([ONE_NODE, TWO_NODES, ALL_GATHER, MAMF], cluster="h100", device="cuda")
    assert cal.from_logs == [str(p) for p in (ONE_NODE, TWO_NODES, ALL_GATHER, MAMF)]
    assert cal.fingerprint.device_name == "NVIDIA H100 80GB HBM3"
    curves = {(c.collective, c.link, c.ranks): c for c in cal.comm}
    assert set(curves) == {("all_reduce", "intra", 8), ("all_reduce", "inter", 16), ("all_gather", "intra", 8)}
    intra = curves["all_reduce", "intra", 8]
    assert intra.source == f"{ONE_NODE} lines 18-48 (8 ranks on 1 host)"
    assert curves["all_reduce", "inter", 16].source is not None
    assert "(16 ranks on 2 hosts)" in (curves["all_reduce", "inter", 16].source or "")
    assert intra.latency_s == pytest.approx(30.95e-6) and intra.busbw_gbps == 469.54
    assert intra.sizes[-1] == 8589934592 and len(intra.times) == 31
    (mm,) = cal.compute.matmul
    assert (mm.dtype, mm.tflops, mm.m, mm.n, mm.k) == ("bfloat16", 727.0, 11264, 4096, 4096)
    assert mm.source == f"{MAMF} line 31"


@pytest.mark.parametrize(
    ("edit", "line", "message"),
    [
        (lambda t: t.split("# Out of bounds")[0], 48, "truncated: no `# Avg bus bandwidth` footer"),
        (lambda t: t.replace("0.03       0    31.08", "0.03       3    31.08", 1), 24, "#wrong 3: the collective re"),
        (
            lambda t: t.replace("Out of bounds values : 0 OK", "Out of bounds values : 2 FAILED"),
            49,
            "nccl-tests found 2 out-of-bounds",
        ),
        (lambda t: t.replace("     float     sum", "      int8     sum", 1), 18, "type 'int8' is not one of"),
        (lambda t: t.replace("     float     sum", "     float", 1), 18, "12 columns where the header names 13"),
        (lambda t: t.replace("all_reduce_perf", "alltoall_perf"), 2, "alltoall_perf: the time model prices"),
        (lambda t: re.sub(r"(?m)^#  Rank.*\n", "", t), 3, "no `#  Rank N Group G Pid P on HOST device D` lines"),
        (lambda t: "Hello from the launcher\nall done\n", 1, "not a log the harness reads"),
    ],
)
def test_a_broken_log_names_the_file_and_line_and_nothing_is_written(tmp_path, capsys, edit, line, message):
    bad = tmp_path / "bad.log"
    bad.write_text(edit(ONE_NODE.read_text()))
    out = tmp_path / "h100.calibration.json"
    code = main(["calibrate", "--cluster", "h100", "--from", str(MAMF), "--from", str(bad), "--out", str(out)])
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err
    assert f"{bad}: line {line}: {message}" in err, err
    assert not out.exists() and list(tmp_path.iterdir()) == [bad]


def test_a_truncated_matmul_log_and_two_logs_of_one_figure_are_refused(tmp_path):
    cut = tmp_path / "mamf.log"
    cut.write_text(MAMF.read_text().split("Tried ")[0])
    with pytest.raises(InputError, match=r"mamf.log: line \d+: truncated: no `Tried N shapes"):
        read_log(cut)
    with pytest.raises(InputError, match="all_reduce float32 on 8 ranks .intra. is also measured by"):
        calibration_from_logs([ONE_NODE, ONE_NODE], cluster="h100", device="cuda")


# ---------------------------------------------------------------------------------------------------------------
# what the planner does with it


def test_doubled_busbw_halves_exactly_the_communication(tmp_path, monkeypatch, capsys):
    """A log whose every size ran twice as fast (time halved, algbw and busbw doubled, as nccl-tests would print
    it) halves the predicted collective time at large messages, and changes nothing else of the prediction."""
    monkeypatch.setenv(CALIBRATION_DIR_ENV, str(tmp_path))
    cluster = _h100_with_memory_bandwidth(tmp_path)
    fast = tmp_path / "all_reduce_perf.1node.fast.log"
    fast.write_text(faster(ONE_NODE.read_text(), 2.0))
    spec = _cell(strategy="ddp", gpus=8)

    base = _plan(["--from", str(ONE_NODE), "--from", str(MAMF)], cluster, spec, capsys)
    doubled = _plan(["--from", str(fast), "--from", str(MAMF)], cluster, spec, capsys)

    # the rate itself: at 1 GiB, and at 16 GiB beyond the largest size (extrapolated at the log's busbw)
    slow_rates, fast_rates = _rates(tmp_path, cluster, ONE_NODE), _rates(tmp_path, cluster, fast)
    for nbytes in (2**30, 16 * 2**30):
        slow, quick = (r.collective_s("all_reduce", link="intra", ranks=8, nbytes=nbytes, dtype="float32")
                       for r in (slow_rates, fast_rates))  # fmt: skip
        assert quick / slow == pytest.approx(0.5, rel=2e-3), nbytes
    # the cell: every all_reduce of a 1.3b model's DDP buckets is a large message, so the comm time halves
    t0, t1 = base["time_s"], doubled["time_s"]
    assert t1["comm_total"] / t0["comm_total"] == pytest.approx(0.5, rel=0.01)
    for part in ("compute", "recompute", "optimizer", "other"):
        assert t1[part] == t0[part], part
    same = {k: v for k, v in base.items() if k not in ("time_s", "step_time_s", "tokens_per_s_per_gpu", "mfu",
                                                         "calibration")}  # fmt: skip
    assert same == {k: v for k, v in doubled.items() if k in same}


def test_logged_figures_replace_the_profiles_and_the_rest_stays_the_profiles(tmp_path, monkeypatch):
    monkeypatch.setenv(CALIBRATION_DIR_ENV, str(tmp_path))
    cluster = load_cluster("h100")
    profile = ProfileRates(cluster)
    rates = _rates(tmp_path, cluster, ONE_NODE, MAMF)
    # matmul at the log's 727.0 TFLOPS, not the profile's (its sourced rate under its roofline)
    assert rates.gemm_s("bfloat16", 4096, 4096, 4096, "nt") == pytest.approx(2 * 4096**3 / 727.0e12)
    assert profile.gemm_s("bfloat16", 4096, 4096, 4096, "nt") != pytest.approx(2 * 4096**3 / 727.0e12)
    # all_gather: no log, so the profile's intra-node figures (NCCL's ring model over its sourced busbw) stand
    gather = {"link": "intra", "ranks": 8, "nbytes": 2**30, "dtype": "bfloat16"}
    assert rates.collective_s("all_gather", **gather) == profile.collective_s("all_gather", **gather) > 0
    # inter-node: unknown in the profile, measured by the two-node log
    rates = _rates(tmp_path, cluster, TWO_NODES)
    s = rates.collective_s("all_reduce", link="inter", ranks=16, nbytes=8 * 2**30, dtype="bfloat16")
    assert s == pytest.approx(read_log(TWO_NODES).rows[-1].time_us * 1e-6)  # type: ignore[union-attr]
    assert rates.source.startswith(f"logs {tmp_path / 'h100.calibration.json'} (all_reduce_perf.2nodes.log); the rest:")
    # whole nodes like the log's (2 x 8) only: 32 ranks on 4 nodes at its busbw; one rank per node is another figure
    # (the latency part scales with the ring's n - 1 steps, the rest with the bus factor: harness.plan.calibration)
    rows = read_log(TWO_NODES).rows  # type: ignore[union-attr]
    lat, t16 = rows[0].time_us * 1e-6, rows[-1].time_us * 1e-6
    s32 = rates.collective_s("all_reduce", link="inter", ranks=32, nbytes=8 * 2**30, dtype="float32")
    assert s32 == pytest.approx(lat * 31 / 15 + (t16 - lat) * (2 * 31 / 32) / (2 * 15 / 16))
    for ranks in (2, 8, 12):  # the profile's inter-node figures price them
        one_per_node = {"link": "inter", "ranks": ranks, "nbytes": 2**30, "dtype": "float32"}
        assert rates.collective_s("all_reduce", **one_per_node) == profile.collective_s("all_reduce", **one_per_node)
    # a group of whole nodes as the time model names it (several ranks on each of several nodes: "mixed") is the log's
    mixed = rates.collective_s("all_reduce", link="mixed", ranks=16, nbytes=8 * 2**30, dtype="bfloat16")
    assert mixed == pytest.approx(t16)


def test_a_log_calibration_applies_on_any_host_but_only_to_its_cluster(tmp_path, monkeypatch, capsys):
    """The logs describe the cluster's nodes, not the host that reads them: no fingerprint check; the cluster
    name still is one."""
    monkeypatch.setenv(CALIBRATION_DIR_ENV, str(tmp_path))
    assert main(["calibrate", "--cluster", "h100", "--from", str(ONE_NODE)]) == 0
    out = capsys.readouterr().out
    assert f"wrote {tmp_path / 'h100.calibration.json'} for cluster h100 from 1 log(s)" in out
    assert "all_reduce     float32  intra    8 ranks  busbw 469.54 GB/s at 8,589,934,592 B, latency 30.95 us" in out
    doc = json.loads((tmp_path / "h100.calibration.json").read_text())
    assert doc["fingerprint"] == {"device": "cuda", "device_name": "NVIDIA H100 80GB HBM3"}
    (tmp_path / "h200.calibration.json").write_text(json.dumps({**doc, "cluster": "h100"}))
    clear_caches()
    with pytest.raises(InputError, match="it calibrates cluster 'h100', not 'h200'"):
        rates_for(load_cluster("h200"))


# ---------------------------------------------------------------------------------------------------------------
# helpers


def _cell(*, strategy: str, gpus: int):
    doc = {"name": "t", "matrix": {"model": ["1.3b"], "strategy": [strategy], "precision": ["bf16"], "gpus": [gpus]}}
    (spec,) = parse_scenario(doc, "t").expand(gpus_per_node=8)
    return spec


def _h100_with_memory_bandwidth(tmp_path: Path):
    """The shipped h100 profile as `h100x`, with a memory bandwidth (the shipped one has none, so its step times
    are null): 2,600 GB/s, a round figure for these tests, not a measurement."""
    text = (REPO / "harness" / "scenario" / "clusters" / "h100.yaml").read_text()
    text = text.replace("name: h100\n", "name: h100x\n").replace("memory_gbps: null", "memory_gbps: 2600")
    (tmp_path / "h100x.yaml").write_text(text)
    return load_cluster(str(tmp_path / "h100x.yaml"))


def _plan(args: list[str], cluster, spec, capsys) -> dict:
    """The cell's prediction after `harness calibrate --cluster CLUSTER ARGS`."""
    assert main(["calibrate", "--cluster", cluster.path, *args]) == 0
    capsys.readouterr()
    clear_caches()
    return predict(spec, cluster).to_dict()


def _rates(tmp_path: Path, cluster, *logs: Path) -> LoggedRates:
    """The rates of `cluster` from a calibration built from `logs` (written where the planner finds it)."""
    calibration = calibration_from_logs(list(logs), cluster=cluster.name, device="cuda")
    write_calibration(tmp_path / f"{cluster.name}.calibration.json", calibration)
    clear_caches()
    rates = rates_for(cluster)
    assert isinstance(rates, LoggedRates)
    return rates


def _fmt(value: float, width: int) -> str:
    """nccl-tests' getFloatStr: the value in `width` characters, with as many decimals as fit (2, 1, 0, then e)."""
    for spec in (".2f", ".1f", ".0f"):
        s = f"{value:{width}{spec}}"
        if len(s) <= width:
            return s
    return f"{value:{width}.1e}" if width >= 7 else f"{value:{width}.0e}"


def table_row(size: int, count: int, kind: str, op: str, root: int, blocks: list[tuple[float, float, float, str]]):
    """One row of nccl-tests' table: `%12li  %12li  %8s  %6s  %6s`, then per block (out-of-place, in-place)
    `  %7s  %6s  %6s  %6s` (time, algbw, busbw as getFloatStr; #wrong as %6g, or `   N/A`)."""
    line = f"{size:12d}  {count:12d}  {kind:>8s}  {op:>6s}  {root:6d}"
    for time_us, algbw, busbw, wrong in blocks:
        line += f"  {_fmt(time_us, 7)}  {_fmt(algbw, 6)}  {_fmt(busbw, 6)}  {wrong:>6s}"
    return line


def faster(text: str, by: float) -> str:
    """The log as nccl-tests would print it on a link `by` times faster at every size: each row's times divided,
    its bandwidths multiplied, recomputed from the size as nccl-tests does, the footer's average too."""
    out, bws = [], []
    for line in text.splitlines():
        tokens = line.split()
        if line.startswith("#") or len(tokens) != 13:
            out.append(line)
            continue
        size, count, kind, op, root = int(tokens[0]), int(tokens[1]), tokens[2], tokens[3], int(tokens[4])
        factor = float(tokens[7]) / float(tokens[6]) if float(tokens[6]) > 0 else 2 * 7 / 8
        blocks = []
        for at in (5, 9):
            t = float(tokens[at]) / by
            algbw = size / t / 1e3
            blocks.append((t, algbw, algbw * factor, tokens[at + 3]))
        bws.append(blocks[0][2])
        out.append(table_row(size, count, kind, op, root, blocks))
    avg = sum(bws) / len(bws)
    return "\n".join(re.sub(r"Avg bus bandwidth    : \S+", f"Avg bus bandwidth    : {avg:g}", x) for x in out) + "\n"


def _nccl_log(*, program: str | None, hosts: list[str], kind: str, op: str, sizes: list[int], lat_us: float,
              peak_gbps: float, wrong: str, info: bool) -> str:  # fmt: skip
    """A whole nccl-tests log in its layout: a `program` None is the older layout (no version and program lines,
    PCI ids as [0x18]); `info` adds NCCL INFO lines as NCCL_DEBUG=INFO prints them."""
    ranks = 8 * len(hosts)
    factor = {"sum": 2 * (ranks - 1) / ranks, "none": (ranks - 1) / ranks}[op]
    if program == "reduce_scatter_perf":
        factor = (ranks - 1) / ranks
    word = {"float": 4, "bfloat16": 2}[kind]
    lines = []
    if program:
        lines += ["# nccl-tests version 2.17.1 nccl-headers=22602 nccl-library=22602",
                  f"# Collective test starting: {program}"]  # fmt: skip
    lines += [f"# nThread 1 nGpus 1 minBytes {sizes[0]} maxBytes {sizes[-1]} step: 2(factor) warmup iters: 5 iters: "
              f"20 agg iters: 1 validation: {0 if wrong == 'N/A' else 1} graph: 0", "#", "# Using devices"]  # fmt: skip
    for r in range(ranks):
        bus = 0x18 + 0x10 * (r % 8)
        pci = f"[0000:{bus:02x}:00]" if program else f"[0x{bus:02x}]"
        lines.append(f"#  Rank {r:2d} Group  0 Pid {400100 + r:6d} on {hosts[r // 8]:>10s} device {r % 8:2d} {pci} "
                     "NVIDIA H100 80GB HBM3")  # fmt: skip
    if info:
        lines += [f"{hosts[0]}:400100:400100 [0] NCCL INFO Bootstrap : Using ib0:10.0.0.1<0>",
                  f"{hosts[0]}:400100:400100 [0] NCCL INFO NCCL version 2.21.5+cuda12.4"]  # fmt: skip

    def header(*names: str) -> str:  # `# %10s  %12s  %8s  %6s  %6s  %7s  %6s  %6s  %6s  %7s  %6s  %6s  %6s `
        widths = (10, 12, 8, 6, 6, 7, 6, 6, 6, 7, 6, 6, 6)
        return "# " + "  ".join(f"{n:>{w}s}" for n, w in zip(names, widths)) + " "

    top = header("", "", "", "", "")[:-1] + "           out-of-place                       in-place          "
    lines += ["#", top, header("size", "count", "type", "redop", "root", *("time", "algbw", "busbw", "#wrong") * 2),
              header("(B)", "(elements)", "", "", "", *("(us)", "(GB/s)", "(GB/s)", "") * 2)]  # fmt: skip
    bws = []
    for size in sizes:
        bw = peak_gbps * size / (size + 2**20)  # saturates around tens of MiB
        t = lat_us + size * factor / (bw * 1e3)
        blocks = []
        for t_block in (round(t, 2) if t < 1e4 else t, (round(t * 1.004, 2) if t < 1e4 else t * 1.004)):
            shown = float(_fmt(t_block, 7))
            algbw = size / shown / 1e3
            blocks.append((shown, algbw, algbw * factor, wrong))
        bws.append(float(_fmt(blocks[0][2], 6)))
        root = -1 if program != "broadcast_perf" else 0
        lines.append(table_row(size, size // word, kind, op, root, blocks))
    lines += [f"# {'Out of bounds values':<20s} : 0 OK", f"# {'Avg bus bandwidth':<20s} : {sum(bws) / len(bws):g} ",
              "#"]  # fmt: skip
    if program:
        lines += [f"# Collective test concluded: {program}"]
    return "\n".join(lines) + "\n" + ("\n" if program else "")


MAMF_LOG = """
Benchmark started on 2026-11-20 14:02:11

** Command line:
/opt/venv/bin/python mamf-finder.py --m_range 0 20480 256 --n 4096 --k 4096 --output_file=mm.out

** Dtype: torch.bfloat16

** Platform/Device info:
- Linux node01 5.15.0-1063-nvidia #64-Ubuntu SMP Fri Aug 9 17:13:45 UTC 2024 x86_64 x86_64
- _CudaDeviceProperties(name='NVIDIA H100 80GB HBM3', major=9, minor=0, total_memory=81008MB, multi_processor_count=132)

** Critical software versions:
- torch=2.5.1+cu124
- cuda=12.4

** Critical environment variables:
- PYTORCH_TUNABLEOP_ENABLED=0

** Additional notes:
- benchmark version: 2



--------------------------------------------------------------------------------


Warming up the accelerator for 30 secs ... accelerator warmup finished
{progress}
Tried 80 shapes => the best outcomes were:
mean:   727.0 TFLOPS @ 11264x4096x4096 (MxNxK)
median: 727.8 TFLOPS @ 11264x4096x4096 (MxNxK)
max:    755.6 TFLOPS @ 9472x4096x4096 (MxNxK)

Across 80 shapes in range: m=[0, 20480, 256] | n=[4096] | k=[4096] in this run:
arithmetic mean: 693.2 TFLOPS
geometric mean:  692.9 TFLOPS

Legend: TFLOPS = 10**12 FLOPS
Elapsed time: 0:01:47
""".format(
    progress="     1 |  311.9(mean)  312.4(median)  330.2(max) @ 256x4096x4096         | best:  311.9(mean)"
    "  312.4(median)  330.2(max) TFLOPS\r    80 |  718.5(mean)  719.3(median)  745.7(max) @ 20224x4096x4096     "
    "| best:  727.0(mean)  727.8(median)  755.6(max) TFLOPS\r\x1b[K"
)
"""mamf-finder.py's output file (a shortened m range); the progress line's records are separated by carriage
returns, as the script writes them"""


def write_fixtures() -> None:
    """(Re)write tests/fixtures/logs/: the nccl-tests logs and the mamf-finder log the tests read."""
    LOGS.mkdir(parents=True, exist_ok=True)
    powers = [2**i for i in range(3, 34)]  # 8 B … 8 GiB, as `-b 8 -e 8G -f 2`
    big = [2**i for i in range(10, 34)]  # 1 KiB … 8 GiB (`-b 1K`: every rank's share a whole element)
    node = ["node01"]
    logs = {
        ONE_NODE: dict(program="all_reduce_perf", hosts=node, kind="float", op="sum", sizes=powers, lat_us=27.05,
                       peak_gbps=470.0, wrong="0", info=False),
        TWO_NODES: dict(program=None, hosts=["node01", "node02"], kind="float", op="sum", sizes=powers, lat_us=64.2,
                        peak_gbps=372.0, wrong="0", info=True),
        ALL_GATHER: dict(program="all_gather_perf", hosts=node, kind="bfloat16", op="none", sizes=big, lat_us=18.4,
                         peak_gbps=455.0, wrong="N/A", info=False),
        REDUCE_SCATTER: dict(program="reduce_scatter_perf", hosts=node, kind="bfloat16", op="sum", sizes=big,
                             lat_us=19.9, peak_gbps=450.0, wrong="0", info=False),
    }  # fmt: skip
    for path, kw in logs.items():
        path.write_text(_nccl_log(**kw))  # type: ignore[arg-type]
    MAMF.write_text(MAMF_LOG)


if __name__ == "__main__":  # pragma: no cover
    write_fixtures()
