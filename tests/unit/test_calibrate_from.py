"""`harness calibrate --cluster NAME --from FILE…`: nccl-tests and mamf-finder logs as the rates the planner prices
with (harness.calibrate.logs, harness.plan.calibration.rates.LoggedRates).

The fixtures under tests/fixtures/logs/ are in the exact layout the tools print (nccl-tests' src/util.cu format
strings: the run header, the `#  Rank` lines, the two-block table, the `Out of bounds` and `Avg bus bandwidth`
footer; mamf-finder.py's header and summary); their numbers are synthetic (a latency plus a bus bandwidth that
saturates with the message size), written by `python -m tests.unit.test_calibrate_from` (`write_fixtures`)."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

import pytest

from harness.calibrate.logs import MatmulLog, calibration_from_logs, read_log
from harness.calibrate.logs.nccl_tests import NcclLog
from harness.cli import main
from harness.core.errors import InputError
from harness.plan.calibration import (
    CALIBRATION_DIR_ENV,
    CalibrationMismatch,
    LoggedRates,
    ProfileRates,
    clear_caches,
    rates_for,
    read_calibration,
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
SRUN = LOGS / "all_reduce_perf.2nodes.srun-l.log"
OPENMPI = LOGS / "reduce_scatter_perf.1node.openmpi.log"
OLD_ALL_REDUCE = LOGS / "all_reduce_perf.1node.nccl-tests-2.11.log"
OLD_ALL_GATHER = LOGS / "all_gather_perf.1node.nccl-tests-2.11.log"
OLD_BROADCAST = LOGS / "broadcast_perf.1node.nccl-tests-2.11.log"
LARGE_ONLY = LOGS / "all_reduce_perf.2nodes.b512M.log"
SMALL_ONLY = LOGS / "all_reduce_perf.1node.e1M.log"
ALLTOALL = LOGS / "alltoall_perf.1node.log"
ALLTOALL_2_13 = LOGS / "alltoall_perf.1node.nccl-tests-2.13.log"
ALLTOALL_2_11 = LOGS / "alltoall_perf.1node.nccl-tests-2.11.log"
ALL_GATHER_2_13_0 = LOGS / "all_gather_perf.1node.nccl-tests-2.13.0.log"
MAMF_2025_01 = LOGS / "mamf-finder.bf16.2025-01.log"
MAMF_V1 = LOGS / "mamf-finder.bf16.v1.log"


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
        (lambda t: t.replace("     float     sum", "      int8     sum"), 18, "type 'int8' is not one of float, "),
        (lambda t: re.sub(r"(?m)^(\s+8\s+2\s+float.*)\s+0$", r"\1", t), 18, "12 columns where the header names 13"),
        (lambda t: t.replace("all_reduce_perf", "alltoall_perf"), 2, "alltoall_perf: all-to-all is not priced (yet): "
         "the time model prices all_reduce_perf, all_gather_perf, reduce_scatter_perf, broadcast_perf"),
        (lambda t: re.sub(r"(?m)^#  Rank.*\n", "", t), 3, "no `#  Rank N … Pid P on HOST device D` lines"),
        (lambda t: "Hello from the launcher\nall done\n", 1, "not a log the harness reads"),
        (lambda t: t + t, 56, "a second nccl-tests run starts here (`# nThread …`): give each run in a file of its "
         "own"),
    ],
)  # fmt: skip
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
# the logs clusters really have (issue 48): each reads to the figures it was written with, or is refused with the
# true reason


@pytest.mark.parametrize(
    "path",
    [TWO_NODES, SRUN, OPENMPI, OLD_ALL_REDUCE, OLD_ALL_GATHER, OLD_BROADCAST, ALL_GATHER_2_13_0],
    ids=lambda p: p.name,
)
def test_a_real_log_reads_to_its_own_latency_and_busbw(path):
    """NCCL's bare banner (TWO_NODES), srun -l's and Open MPI's prefixes (with other tasks' and stderr's lines),
    the layout before nccl-tests 2.13 (no Group, no root, no redop for all_gather and broadcast, an `error` column,
    a row cut in two by NCCL's INFO lines, 0-byte rows), 2.13.0's empty redop: each reads to the latency and bus
    bandwidth it was written with, within 1 %, with every one of its message sizes."""
    fixture = FIXTURES[path]
    log = read_log(path)
    assert isinstance(log, NcclLog)
    program = fixture.program.removesuffix("_perf")
    assert (log.collective, log.ranks, len(log.hosts)) == (program, fixture.ranks, len(fixture.hosts))
    printed = sorted({fixture.printed_size(s)[0] for s in fixture.sizes} - {0})
    assert [r.size for r in log.rows] == printed
    (curve,) = calibration_from_logs([path], cluster="h100", device="cuda").comm
    latency_us, busbw = fixture.expected()
    assert curve.latency_s is not None and curve.latency_s * 1e6 == pytest.approx(latency_us, rel=0.01)
    assert curve.busbw_gbps == pytest.approx(busbw, rel=0.01)
    assert curve.null_reasons is None


def _prefixed(text: str, prefix: str) -> str:
    return "".join(prefix + line for line in text.splitlines(keepends=True))


def _cut_row(text: str) -> str:
    """The 1 MiB row cut after its root by NCCL's INFO lines (a connection made at its first call)."""
    row = next(line for line in text.splitlines() if line.split()[:1] == ["1048576"])
    head, rest = row[:56], row[56:]
    info = "node01:400100:400180 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[1] via P2P/IPC"
    return text.replace(row, f"{head}{info}\nnode01:400100:400180 [0] NCCL INFO Connected all rings\n{rest}")


def _old_columns(text: str) -> str:
    """ALL_GATHER as nccl-tests printed all_gather before 2.13: no redop and root columns, `error` for #wrong."""
    out = []
    for line in text.splitlines():
        tokens = line.split()
        if tokens[:2] == ["#", "size"] or (tokens[:1] and tokens[0].isdigit()):
            keep = [t for i, t in enumerate(tokens) if i not in ((4, 5) if tokens[0] == "#" else (3, 4))]
            line = ("# " if tokens[0] == "#" else "") + "  ".join(keep[1:] if tokens[0] == "#" else keep)
        out.append(line.replace("#wrong", "error"))
    return "\n".join(out) + "\n"


@pytest.mark.parametrize(
    ("base", "edit"),
    [
        (ONE_NODE, lambda t: t.replace("#\n#  ", "#\nNCCL version 2.21.5+cuda12.4\n#  ", 1)),  # NCCL_DEBUG set
        (ONE_NODE, lambda t: _prefixed(t, " 0: ")),  # srun -l
        (ONE_NODE, lambda t: _prefixed(t, "[1,0]<stdout>:")),  # mpirun --tag-output
        (ONE_NODE, lambda t: re.sub(r"Group +\d+ ", "", t).replace("#  Rank", "#   Rank")),  # before 2.13
        (REDUCE_SCATTER, lambda t: t.replace("#wrong", " error").replace("       0", "   4e-03")),  # before 2.13:
        # the largest deviation (a bfloat16 sum's, under nccl-tests' 1e-2), not a count of wrong elements
        (ONE_NODE, lambda t: t.replace("           8 ", "           0             0     float     sum      -1    "
                                       "  4.12    0.00    0.00       0     4.14    0.00    0.00       0\n           8 ",
                                       1)),  # a 0-byte row
        (ONE_NODE, _cut_row),  # NCCL INFO lines inside the table
        (ALL_GATHER, _old_columns),  # no redop, no root
        (ONE_NODE, lambda t: t.replace("starting: all_reduce_perf", "starting: all_reduce_perf_mpi")),  # NAME_SUFFIX
    ],
    ids=["nccl-banner", "srun-l", "openmpi", "rank-without-group", "error-column", "zero-bytes", "info-in-table",
         "no-redop-root", "name-suffix"],
)  # fmt: skip
def test_each_difference_of_a_real_log_alone_reads_to_the_same_curve(tmp_path, base, edit):
    """One difference at a time from a log that reads: the edited log gives exactly the same curve."""
    edited = tmp_path / base.name
    edited.write_text(edit(base.read_text()))
    assert edited.read_text() != base.read_text()
    (want,) = calibration_from_logs([base], cluster="h100", device="cuda").comm
    (got,) = calibration_from_logs([edited], cluster="h100", device="cuda").comm
    assert (got.collective, got.ranks, got.sizes, got.times) == (want.collective, want.ranks, want.sizes, want.times)
    assert (got.latency_s, got.busbw_gbps) == (want.latency_s, want.busbw_gbps)


@pytest.mark.parametrize(
    ("path", "line", "why"),
    [
        (ALLTOALL, 2, "alltoall_perf: all-to-all is not priced (yet)"),
        (ALLTOALL_2_13, 16, "the in-place results are N/A where the out-of-place ones are checked, in every row: "
         "nccl-tests does that for alltoall_perf (and sendrecv_perf), whose all-to-all is not priced (yet)"),
        (ALLTOALL_2_11, 16, "the redop column is empty, as nccl-tests before 2.13 printed it for alltoall_perf "
         "only: all-to-all is not priced (yet)"),
    ],
    ids=lambda v: v.name if isinstance(v, Path) else "",
)  # fmt: skip
def test_alltoall_is_refused_as_the_all_to_all_the_model_does_not_price(tmp_path, capsys, path, line, why):
    """In each layout: named by its program line (2.16.7 on), by its unchecked in-place results (2.13.1 on, with
    validation), by its empty redop (before 2.13)."""
    out = tmp_path / "h100.calibration.json"
    assert main(["calibrate", "--cluster", "h100", "--from", str(path), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert f"{path}: line {line}: {why}: the time model prices all_reduce_perf, all_gather_perf" in err, err
    assert "columns where the header" not in err and not out.exists()


def test_a_log_of_large_messages_has_no_latency_and_the_profile_prices_below_it(tmp_path, monkeypatch, capsys):
    """`-b 512M`: the first row's 2.8 ms is no latency. Messages below 512 MiB are the profile's (a DDP cell's 25 MB
    buckets: its prediction is the uncalibrated one), those in the log's range its own; the file and the command
    say so."""
    monkeypatch.setenv(CALIBRATION_DIR_ENV, str(tmp_path))
    cluster = load_cluster("h100")
    spec = _cell(strategy="ddp", gpus=16)
    uncalibrated = predict(spec, cluster).to_dict()
    assert main(["calibrate", "--cluster", "h100", "--from", str(LARGE_ONLY)]) == 0
    out = capsys.readouterr().out
    (curve,) = read_calibration(tmp_path / "h100.calibration.json").comm
    assert curve.latency_s is None and curve.busbw_gbps == 371.4
    assert (curve.null_reasons or {})["latency_s"].startswith(
        "the smallest size, 536,870,912 B (line 26), is not latency-bound: its busbw 362.69 GB/s is 98% of the log's "
        "371.4; messages below it are priced with the profile's figures"
    )
    assert "busbw 371.4 GB/s at 8,589,934,592 B, no latency (sizes from 536,870,912 B; below: the profile's)" in out
    assert "    latency_s: null: the smallest size, 536,870,912 B (line 26), is not latency-bound" in out
    clear_caches()
    rates, profile = rates_for(cluster), ProfileRates(cluster)
    call = {"link": "mixed", "ranks": 16, "dtype": "float32"}
    assert rates.collective_s("all_reduce", nbytes=25e6, **call) == profile.collective_s("all_reduce", nbytes=25e6,
                                                                                         **call)  # fmt: skip
    row = next(r for r in read_log(LARGE_ONLY).rows if r.size == 2**30)  # type: ignore[union-attr]
    assert rates.collective_s("all_reduce", nbytes=2**30, **call) == pytest.approx(row.time_us * 1e-6)
    # another group size needs the latency the log lacks: the profile's
    assert rates.collective_s("all_reduce", nbytes=2**30, **{**call, "ranks": 32}) == profile.collective_s(
        "all_reduce", nbytes=2**30, **{**call, "ranks": 32})  # fmt: skip
    calibrated = predict(spec, cluster).to_dict()
    assert calibrated["step_time_s"] == uncalibrated["step_time_s"]
    assert calibrated["calibration"].startswith(f"logs {tmp_path / 'h100.calibration.json'}")


def test_a_log_of_small_messages_has_no_bus_bandwidth_and_the_profile_prices_above_it(tmp_path, monkeypatch):
    """`-e 1M` on NVLink: the 1 MiB row's busbw (235 GB/s of 470) is no bus bandwidth to extrapolate from."""
    monkeypatch.setenv(CALIBRATION_DIR_ENV, str(tmp_path))
    cluster = load_cluster("h100")
    rates, profile = _rates(tmp_path, cluster, SMALL_ONLY), ProfileRates(cluster)
    (curve,) = read_calibration(tmp_path / "h100.calibration.json").comm
    assert curve.busbw_gbps is None and curve.latency_s == pytest.approx(30.95e-6)
    assert "the largest size, 1,048,576 B (line 35), had not reached the bus bandwidth" in (curve.null_reasons or {})[
        "busbw_gbps"]  # fmt: skip
    call = {"link": "intra", "ranks": 8, "dtype": "float32"}
    assert rates.collective_s("all_reduce", nbytes=2**30, **call) == profile.collective_s("all_reduce", nbytes=2**30,
                                                                                          **call)  # fmt: skip
    row = next(r for r in read_log(SMALL_ONLY).rows if r.size == 2**16)  # type: ignore[union-attr]
    assert rates.collective_s("all_reduce", nbytes=2**16, **call) == pytest.approx(row.time_us * 1e-6)
    assert rates.collective_s("all_reduce", nbytes=4, **call) == pytest.approx(30.95e-6)  # the latency, below


def test_logs_of_another_gpu_than_the_profiles_are_refused(tmp_path, monkeypatch, capsys):
    """H100 logs for the a100 profile would price an A100 cluster with H100 figures and move MFU's peak to the
    H100's: refused when read, and a file built before the check is refused by the planner unless forced."""
    monkeypatch.setenv(CALIBRATION_DIR_ENV, str(tmp_path))
    out = tmp_path / "a100.calibration.json"
    assert main(["calibrate", "--cluster", "a100", "--from", str(ONE_NODE), "--from", str(MAMF)]) == 2
    err = capsys.readouterr().err
    why = "the logs ran on 'NVIDIA H100 80GB HBM3' (H100 SXM) and the profile describes A100 ('SLURM, 8x "
    assert f"{ONE_NODE}: line 6: {why}" in err and f"{MAMF}: line 11: {why}" in err, err
    assert "read them with the profile of that GPU (`--cluster NAME`)" in err and not out.exists()
    # the same logs read without the profile's description (as before the check): the planner refuses the file
    write_calibration(out, calibration_from_logs([ONE_NODE], cluster="a100", device="cuda"))
    clear_caches()
    a100 = load_cluster("a100")
    with pytest.raises(CalibrationMismatch, match=re.escape(why)):
        rates_for(a100)
    forced = rates_for(a100, force=True)
    assert forced.device_name == "NVIDIA H100 80GB HBM3"
    # the profile's own GPU, or several GPUs in one calibration
    assert main(["calibrate", "--cluster", "h100", "--from", str(ONE_NODE), "--out", str(out)]) == 0
    capsys.readouterr()
    a100_log = tmp_path / "a100.log"
    a100_log.write_text(ONE_NODE.read_text().replace("NVIDIA H100 80GB HBM3", "NVIDIA A100-SXM4-80GB"))
    assert main(["calibrate", "--cluster", "local-gpu", "--from", str(ONE_NODE), "--from", str(a100_log)]) == 2
    err = capsys.readouterr().err
    gpus = "('NVIDIA H100 80GB HBM3', 'NVIDIA A100-SXM4-80GB')"
    assert f"{a100_log}: line 6: the logs ran on different GPUs {gpus}: give one GPU's logs" in err


def test_mamf_finder_as_printed_in_2025_reads_and_version_1_is_refused_with_the_reason():
    """Two spaces in `Tried  80 shapes` and the max line first (2025-01 to 2025-10) read as the later layout; the
    2024 version's one line has no mean."""
    early, later = read_log(MAMF_2025_01), read_log(MAMF)
    assert isinstance(early, MatmulLog) and isinstance(later, MatmulLog)
    assert (early.tflops, early.m, early.n, early.k, early.shapes) == (later.tflops, later.m, later.n, later.k, 80)
    with pytest.raises(InputError) as e:
        read_log(MAMF_V1)
    assert str(e.value) == (
        f"{MAMF_V1}: line 25: mamf-finder version 1's summary (755.6 TFLOPS) gives the best shape's fastest "
        "iteration, not the mean rate the harness plans with; run mamf-finder version 2 (`Tried N shapes => the best "
        "outcomes were:`, ml-engineering since 2025-01)"
    )


def test_a_log_of_every_type_keeps_the_types_the_harness_plans_with(tmp_path):
    """`-d all` puts int8, uint8, … rows beside float's: they are left out, the float rows read."""
    text = ONE_NODE.read_text()
    rows = [line for line in text.splitlines() if line.split()[:1] and line.split()[0].isdigit()]
    int8 = [line.replace("     float", "      int8") for line in rows]
    mixed = tmp_path / "all_reduce_perf.all-types.log"
    mixed.write_text(text.replace(rows[0], "\n".join(int8) + "\n" + rows[0]))
    (want,) = calibration_from_logs([ONE_NODE], cluster="h100", device="cuda").comm
    (got,) = calibration_from_logs([mixed], cluster="h100", device="cuda").comm
    assert (got.dtype, got.sizes, got.times, got.busbw_gbps) == (want.dtype, want.sizes, want.times, want.busbw_gbps)


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


@dataclass(frozen=True)
class Fixture:
    """One nccl-tests log the tests read, and how nccl-tests (and what ran around it) printed it."""

    program: str
    """the nccl-tests program (all_reduce_perf, …)"""
    hosts: tuple[str, ...]
    """8 ranks on each"""
    kind: str
    """nccl-tests' type name: float, bfloat16"""
    sizes: tuple[int, ...]
    """the sizes asked for (-b … -e …, -f 2), bytes"""
    lat_us: float
    peak_gbps: float
    """the synthetic link: a call costs lat_us plus the bytes at a bus bandwidth that saturates at peak_gbps"""
    layout: str = "2.17"
    """2.17: the version and program lines (2.17.4 on), PCI ids as [0000:18:00]; 2.13: neither line, [0x18]
    (2.13.4 to 2.16.6); 2.13.0: that, with an empty redop for all_gather, broadcast and alltoall (2.13.0 to 2.13.3,
    alltoall's in-place results checked in 2.13.0 only); 2.11: before 2.13, each program its own columns (no root
    but broadcast's, no redop for all_gather and broadcast), an `error` column (%5.0le), `#   Rank N Pid` lines
    without Group"""
    validation: bool = True
    """-c 1: #wrong (error) figures; -c 0: N/A"""
    info: bool = False
    """NCCL_DEBUG=INFO: NCCL's banner and its INFO lines around the table"""
    cut_at: int | None = None
    """the size whose row NCCL's INFO lines cut in two (a connection made at its first call)"""
    label: str = ""
    """a launcher's prefix on every line: srun (`srun -l`), openmpi (`mpirun --tag-output`)"""

    @property
    def ranks(self) -> int:
        return 8 * len(self.hosts)

    @property
    def factor(self) -> float:
        """busbw / algbw (nccl-tests' GetBw)"""
        n = self.ranks
        return {"all_reduce_perf": 2 * (n - 1) / n, "broadcast_perf": 1.0}.get(self.program, (n - 1) / n)

    @property
    def op(self) -> str:
        """the redop column's value ("" where nccl-tests prints an empty one)"""
        if self.program in ("all_reduce_perf", "reduce_scatter_perf"):
            return "sum"
        return "" if self.layout in ("2.11", "2.13.0") else "none"

    def printed_size(self, size: int) -> tuple[int, int]:
        """(bytes, count) of the row of `size` asked for: all_gather's, reduce_scatter's and alltoall's whole
        buffer of whole elements per rank (0 below one each), and the count per rank (nccl-tests' paramcount)"""
        word = {"float": 4, "bfloat16": 2}[self.kind]
        if self.program in ("all_reduce_perf", "broadcast_perf"):
            return size, size // word
        per_rank = size // word // self.ranks
        return per_rank * self.ranks * word, per_rank

    def time_us(self, size: int) -> float:
        """the synthetic time of a row (us): latency plus the bytes at a bus bandwidth saturating around 1 MiB"""
        if size == 0:
            return 4.12  # NOTE: NCCL returns without a kernel: nccl-tests times its own loop
        bw = self.peak_gbps * size / (size + 2**20)
        return self.lat_us + size * self.factor / (bw * 1e3)

    def expected(self) -> tuple[float, float]:
        """(latency us, busbw GB/s) the log says: its smallest size's time, its largest size's busbw"""
        printed = [self.printed_size(s)[0] for s in self.sizes]
        smallest, largest = min(p for p in printed if p > 0), max(printed)
        return self.time_us(smallest), self.peak_gbps * largest / (largest + 2**20)

    def text(self) -> str:
        """The whole log as it lands in the file."""
        lines = self._lines()
        if self.label == "srun":  # srun -l: "%*d: " (the task id, as wide as the largest); NCCL's lines per task
            width = len(str(self.ranks - 1))
            lines = [f"{task:>{width}}: {line}" for task, line in lines]
        elif self.label == "openmpi":  # mpirun --tag-output: [jobid,rank]<stream>: (a task below 0: -rank-1's stderr)
            lines = [f"[1,{task}]<stdout>:{line}" if task >= 0 else f"[1,{-task - 1}]<stderr>:{line}"
                     for task, line in lines]  # fmt: skip
            lines = ["Warning: Permanently added 'node02' (ED25519) to the list of known hosts.", *lines]
        else:
            lines = [line for _, line in lines]
        return "\n".join(lines) + "\n" + ("\n" if self.layout == "2.17" else "")

    def _lines(self) -> list[tuple[int, str]]:
        """(task, line): what rank 0 prints (task 0), and NCCL's lines of other tasks"""
        old = self.layout == "2.11"
        out: list[tuple[int, str]] = []
        if self.layout == "2.17":
            out += [(0, "# nccl-tests version 2.17.1 nccl-headers=22602 nccl-library=22602"),
                    (0, f"# Collective test starting: {self.program}")]  # fmt: skip
        check = int(self.validation)
        run = f"# nThread 1 nGpus 1 minBytes {self.sizes[0]} maxBytes {self.sizes[-1]} step: 2(factor) warmup iters: 5"
        run += f" iters: 20 validation: {check} " if old else f" iters: 20 agg iters: 1 validation: {check} graph: 0"
        out += [(0, run), (0, "#"), (0, "# Using devices")]
        for r in range(self.ranks):
            bus, host, pid = 0x18 + 0x10 * (r % 8), self.hosts[r // 8], 400100 + r
            name = "NVIDIA H100 80GB HBM3"
            if old:
                out.append((0, f"#   Rank {r:2d} Pid {pid:6d} on {host:>10s} device {r % 8:2d} [0x{bus:02x}] {name}"))
            else:
                pci = f"[0000:{bus:02x}:00]" if self.layout == "2.17" else f"[0x{bus:02x}]"
                out.append((0, f"#  Rank {r:2d} Group  0 Pid {pid:6d} on {host:>10s} device {r % 8:2d} {pci} {name}"))
        if self.info:
            for task in (0, self.ranks - 1) if self.label else (0,):
                host = self.hosts[task // 8]
                out.append((task, f"{host}:{400100 + task}:{400100 + task} [{task % 8}] NCCL INFO Bootstrap : Using "
                                  f"ib0:10.0.0.{task + 1}<0>"))  # fmt: skip
            out.append((0, "NCCL version 2.21.5+cuda12.4"))  # NOTE: bare: NCCL's showVersion printf
            if self.label == "openmpi":
                out.append((-8, "node01:400107:400107 [7] NCCL INFO NET/IB : No device found."))
        out += [(0, line) for line in (self._header_old() if old else self._header())]
        bws = []
        for size in self.sizes:
            nbytes, count = self.printed_size(size)
            blocks = []
            for stretch in (1.0, 1.004):  # out-of-place, in-place
                t = self.time_us(nbytes) * stretch
                shown = float(_fmt_old_time(t) if old else _fmt(round(t, 2) if t < 1e4 else t, 7))
                algbw = nbytes / shown / 1e3
                unchecked = stretch > 1 and self.program == "alltoall_perf" and self.layout in ("2.13", "2.17")
                wrong = "N/A" if not self.validation or unchecked else "0"
                blocks.append((shown, algbw, algbw * self.factor, wrong))
            bws.append(float(f"{blocks[0][2]:.2f}") if old else float(_fmt(blocks[0][2], 6)))
            root = 0 if self.program == "broadcast_perf" else -1
            row = (self._row_old(nbytes, count, root, blocks) if old else
                   table_row(nbytes, count, self.kind, self.op, root, blocks))  # fmt: skip
            if size == self.cut_at:  # the row's start, NCCL's lines (its connection at this size), the row's rest
                at = len(f"{nbytes:12d}  {count:12d}  {self.kind:>8s}  {self.op:>6s}" + ("" if old else f"  {root:6d}"))
                host = self.hosts[0]
                out += [(0, row[:at] + f"{host}:400100:400180 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[1] via P2P/IPC"),
                        (0, f"{host}:400100:400180 [0] NCCL INFO Connected all rings"),
                        (0, row[at:])]  # fmt: skip
            else:
                out.append((0, row))
        avg = sum(bws) / len(bws)
        footer = [f"# {'Out of bounds values':<20s} : 0 OK", f"# {'Avg bus bandwidth':<20s} : {avg:g} ", "#"]
        out += [(0, line) for line in footer]
        if self.layout == "2.17":
            out.append((0, f"# Collective test concluded: {self.program}"))
        return out

    def _header(self) -> list[str]:
        """2.13 on: `# %10s  %12s  %8s  %6s  %6s  %7s  %6s  %6s  %6s  %7s  %6s  %6s  %6s `"""

        def header(*names: str) -> str:
            widths = (10, 12, 8, 6, 6, 7, 6, 6, 6, 7, 6, 6, 6)
            return "# " + "  ".join(f"{n:>{w}s}" for n, w in zip(names, widths)) + " "

        top = header("", "", "", "", "")[:-1] + "           out-of-place                       in-place          "
        return ["#", top, header("size", "count", "type", "redop", "root", *("time", "algbw", "busbw", "#wrong") * 2),
                header("(B)", "(elements)", "", "", "", *("(us)", "(GB/s)", "(GB/s)", "") * 2)]  # fmt: skip

    def _old_columns(self) -> list[str]:
        """before 2.13: the columns between type and time, per program"""
        return {"all_gather_perf": [], "broadcast_perf": ["root"]}.get(self.program, ["redop"])

    def _header_old(self) -> list[str]:
        """before 2.13: `# %10s  %12s  %8s[  %6s]  %7s  %6s  %6s  %5s  %7s  %6s  %6s  %5s` (all_reduce.cu's
        print_header)"""
        extra = self._old_columns()
        lead = "# " + "  ".join([f"{'':>10s}", f"{'':>12s}", f"{'':>8s}", *(f"{'':>6s}" for _ in extra)])
        top = lead + "            out-of-place                       in-place          "
        widths = (10, 12, 8, *(6 for _ in extra), 7, 6, 6, 5, 7, 6, 6, 5)

        def header(*names: str) -> str:
            return "# " + "  ".join(f"{n:>{w}s}" for n, w in zip(names, widths))

        units = ("(B)", "(elements)", "", *("" for _ in extra), *("(us)", "(GB/s)", "(GB/s)", "") * 2)
        return ["#", top, header("size", "count", "type", *extra, *("time", "algbw", "busbw", "error") * 2),
                header(*units)]  # fmt: skip

    def _row_old(self, nbytes: int, count: int, root: int, blocks: list[tuple[float, float, float, str]]) -> str:
        """before 2.13: `%12li  %12li  %8s[  %6s | %6i]`, then per block `  %7s  %6.2f  %6.2f  %5.0le` (or `%5s`
        N/A)"""
        line = f"{nbytes:12d}  {count:12d}  {self.kind:>8s}"
        extra = self._old_columns()
        if extra == ["redop"]:
            line += f"  {self.op:>6s}"
        elif extra == ["root"]:
            line += f"  {root:6d}"
        for t, algbw, busbw, wrong in blocks:
            error = f"{0.0:5.0e}" if wrong != "N/A" else "  N/A"
            line += f"  {_fmt_old_time(t)}  {algbw:6.2f}  {busbw:6.2f}  {error}"
        return line


def _fmt_old_time(t: float) -> str:
    """the time before 2.13: %7.0f from 10 ms, %7.1f from 100 us, else %7.2f"""
    return f"{t:7.0f}" if t >= 1e4 else f"{t:7.1f}" if t >= 100 else f"{t:7.2f}"


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

MAMF_LOG_2025_01 = """
Benchmark started on 2025-02-11 09:40:03

** Command line:
/opt/venv/bin/python mamf-finder.py --m_range 0 20480 256 --n 4096 --k 4096 --output_file=mm.out

** Dtype: torch.bfloat16

** Platform/Device info:
Linux node01 5.15.0-1063-nvidia #64-Ubuntu SMP Fri Aug 9 17:13:45 UTC 2024 x86_64 x86_64
_CudaDeviceProperties(name='NVIDIA H100 80GB HBM3', major=9, minor=0, total_memory=81008MB, multi_processor_count=132)

** Critical software versions:
torch=2.5.1+cu124
cuda=12.4

** Additional notes:
benchmark version: 2


--------------------------------------------------------------------------------


Warming up the accelerator for 30 secs ... accelerator warmup finished
{progress}
Tried  80 shapes => the best outcomes were:
max:    755.6 TFLOPS @ 9472x4096x4096 (MxNxK)
median: 727.8 TFLOPS @ 11264x4096x4096 (MxNxK)
mean:   727.0 TFLOPS @ 11264x4096x4096 (MxNxK)

Elapsed time: 0:01:47
""".format(
    progress="     1 |  330.2(max)  312.4(median)  311.9(mean) @ 256x4096x4096         | best:  330.2(max)"
    "  312.4(median)  311.9(mean) TFLOPS\r    80 |  745.7(max)  719.3(median)  718.5(mean) @ 20224x4096x4096     "
    "| best:  755.6(max)  727.8(median)  727.0(mean) TFLOPS\r\x1b[K"
)
"""mamf-finder.py's output file between 2025-01 and 2025-10 (ml-engineering dacf05a, benchmark version 2): `Tried  N
shapes` with two spaces, the max line first and the mean last, the header's lines without their `- `"""

MAMF_LOG_V1 = """
Benchmark started on 2024-11-20 14:02:11

** Command line:
/opt/venv/bin/python mamf-finder.py --m_range 0 20480 256 --n 4096 --k 4096 --output_file=mm.out

** Dtype: torch.bfloat16

** Platform/Device info:
Linux node01 5.15.0-1063-nvidia #64-Ubuntu SMP Fri Aug 9 17:13:45 UTC 2024 x86_64 x86_64
_CudaDeviceProperties(name='NVIDIA H100 80GB HBM3', major=9, minor=0, total_memory=81008MB, multi_processor_count=132)

** Critical software versions:
torch=2.5.1+cu124
cuda=12.4

** Additional notes:


--------------------------------------------------------------------------------


Warming up the accelerator for 30 secs ... accelerator warmup finished
{progress}
The best outcome was 755.6TFLOPS @ 9472x4096x4096 (MxNxK) (tried 80 shapes)
Elapsed time: 0:01:41
""".format(
    progress="     1 |  330.2 TFLOPS @ 256x4096x4096         | best:  330.2 TFLOPS @ 256x4096x4096 (MxNxK)\r    80 |"
    "  745.7 TFLOPS @ 20224x4096x4096       | best:  755.6 TFLOPS @ 9472x4096x4096 (MxNxK)\r\x1b[K"
)
"""mamf-finder.py's output file in 2024 (ml-engineering 3e455fe, before benchmark version 2): one summary line, the
best shape's fastest iteration"""


POWERS = tuple(2**i for i in range(3, 34))
"""8 B … 8 GiB, as `-b 8 -e 8G -f 2`"""
BIG = tuple(2**i for i in range(10, 34))
"""1 KiB … 8 GiB (`-b 1K`: every rank's share a whole element)"""
NODE, NODES = ("node01",), ("node01", "node02")
FIXTURES: dict[Path, Fixture] = {
    ONE_NODE: Fixture("all_reduce_perf", NODE, "float", POWERS, 27.05, 470.0),
    TWO_NODES: Fixture("all_reduce_perf", NODES, "float", POWERS, 64.2, 372.0, layout="2.13", info=True),
    ALL_GATHER: Fixture("all_gather_perf", NODE, "bfloat16", BIG, 18.4, 455.0, validation=False),
    REDUCE_SCATTER: Fixture("reduce_scatter_perf", NODE, "bfloat16", BIG, 19.9, 450.0),
    SRUN: Fixture("all_reduce_perf", NODES, "bfloat16", POWERS, 61.0, 380.0, info=True, label="srun"),
    OPENMPI: Fixture("reduce_scatter_perf", NODE, "float", BIG, 21.3, 448.0, layout="2.13", info=True,
                     label="openmpi"),
    OLD_ALL_REDUCE: Fixture("all_reduce_perf", NODE, "float", POWERS, 25.1, 462.0, layout="2.11", info=True,
                            cut_at=2**20),
    OLD_ALL_GATHER: Fixture("all_gather_perf", NODE, "bfloat16", POWERS, 17.2, 440.0, layout="2.11"),
    OLD_BROADCAST: Fixture("broadcast_perf", NODE, "float", POWERS, 15.8, 410.0, layout="2.11", validation=False),
    LARGE_ONLY: Fixture("all_reduce_perf", NODES, "float", tuple(2**i for i in range(29, 34)), 64.2, 372.0),
    SMALL_ONLY: Fixture("all_reduce_perf", NODE, "float", tuple(2**i for i in range(3, 21)), 27.05, 470.0),
    ALLTOALL: Fixture("alltoall_perf", NODE, "float", BIG, 22.0, 380.0),
    ALLTOALL_2_13: Fixture("alltoall_perf", NODE, "float", BIG, 22.0, 380.0, layout="2.13"),
    ALLTOALL_2_11: Fixture("alltoall_perf", NODE, "float", BIG, 22.0, 380.0, layout="2.11"),
    ALL_GATHER_2_13_0: Fixture("all_gather_perf", NODE, "bfloat16", BIG, 18.4, 455.0, layout="2.13.0"),
}  # fmt: skip
"""every nccl-tests fixture: what it ran, how it was printed"""


def write_fixtures() -> None:
    """(Re)write tests/fixtures/logs/: the nccl-tests logs and the mamf-finder logs the tests read."""
    LOGS.mkdir(parents=True, exist_ok=True)
    for path, fixture in FIXTURES.items():
        path.write_text(fixture.text())
    MAMF.write_text(MAMF_LOG)
    MAMF_2025_01.write_text(MAMF_LOG_2025_01)
    MAMF_V1.write_text(MAMF_LOG_V1)


if __name__ == "__main__":  # pragma: no cover
    write_fixtures()
