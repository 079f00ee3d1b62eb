"""`harness calibrate --cluster NAME --from FILE…`: a calibration from the measurements a cluster team already made,
without a calibration run.

- `nccl_tests`: an nccl-tests log → one collective's curves (time and bus bandwidth per message size) on one link
  at one group size, per dtype;
- `matmul`: a matmul benchmark's log (mamf-finder) → the achievable matmul rate of one dtype.

`calibration_from_logs` reads every file (each told apart by its content), and builds the calibration file
(harness.plan.calibration.file.Calibration) with `from_logs` naming them and every curve and rate naming its file
and lines. The planner prices with what the logs measured and with the profile's figures for the rest
(harness.plan.calibration.rates.LoggedRates). Any file that is not one of these logs, or is truncated, raises
InputError naming the file and the line, before anything is written. Pure: no torch.
"""

from __future__ import annotations

import datetime
import math
from pathlib import Path

from harness.calibrate.logs.matmul import MatmulLog, looks_like_mamf, parse_mamf
from harness.calibrate.logs.nccl_tests import NcclLog, Row, looks_like_nccl_tests, parse_nccl_tests
from harness.core.errors import InputError, Problem
from harness.plan.calibration import FORMAT, Calibration, logged_gpu_mismatch

__all__ = ["MatmulLog", "NcclLog", "calibration_from_logs", "read_log", "summary_lines"]


def read_log(path: Path) -> NcclLog | MatmulLog:
    """One log, told apart by its content: nccl-tests' run header, or mamf-finder's dtype line."""
    try:
        text = path.read_bytes().decode(errors="replace")  # NOTE: bytes: read_text would make a \r a line
    except OSError as e:
        raise InputError([Problem(str(path), "", f"cannot read the log: {e.strerror or e}")]) from e
    if looks_like_nccl_tests(text):
        return parse_nccl_tests(path, text)
    if looks_like_mamf(text):
        return parse_mamf(path, text)
    raise InputError(
        [
            Problem(
                str(path),
                "line 1",
                "not a log the harness reads: neither nccl-tests' output (`# nThread … nGpus …`) nor mamf-finder's "
                "(`** Dtype: …`)",
            )
        ]
    )


LATENCY_SHARE = 0.1
"""a log's smallest size measured the latency when its busbw is at most this share of the log's largest busbw:
nine tenths of its time or more is the fixed cost of a call, not bytes (a log from `-b 8` on: about 0; one from
`-b 512M`: above 0.9)"""
SATURATED_SLOPE = 0.9
"""a log's largest size measured the bus bandwidth when its time grew at least this fast with the size from the
size before it (the log-log slope: 1 once the bytes are the time, about 0 while the latency is): the busbw had
stopped growing, and prices the sizes beyond"""


def calibration_from_logs(
    paths: list[Path], *, cluster: str, device: str, description: str | None = None
) -> Calibration:
    """The calibration file of `cluster` (its profile's `device`, and its `description`, which names its GPU) from
    the logs at `paths`; InputError with every file's problem (or two files measuring the same figure, or logs of
    another GPU than the profile's) and nothing built."""
    paths = [Path(p).resolve() for p in paths]  # NOTE: the file records where each figure came from, wherever read
    logs: list[NcclLog | MatmulLog] = []
    problems: list[Problem] = []
    for path in paths:
        try:
            logs.append(read_log(path))
        except InputError as e:
            problems.extend(e.problems)
    if problems:
        raise InputError(problems)
    comm: dict[tuple[str, str, str, int], dict] = {}
    matmul: dict[str, dict] = {}
    for log in logs:
        if isinstance(log, NcclLog):
            for curve in comm_curves(log):
                key = (curve["link"], curve["collective"], curve["dtype"], curve["ranks"])
                _once(comm, key, curve, problems=problems, what=f"{key[1]} {key[2]} on {key[3]} ranks ({key[0]})")
        else:
            rate = {"dtype": log.dtype, "tflops": log.tflops, "m": log.m, "n": log.n, "k": log.k}
            _once(matmul, log.dtype, {**rate, "source": f"{log.path} line {log.line}"}, problems=problems,
                  what=f"the {log.dtype} matmul rate")  # fmt: skip
    devices = logged_devices(logs)
    problems += device_problems(devices, description=description or "")
    if problems:
        raise InputError(problems)
    fingerprint: dict = {"device": device}
    if len(devices) == 1:
        fingerprint["device_name"] = next(iter(devices))
    doc = {
        "format": FORMAT,
        "cluster": cluster,
        "fingerprint": fingerprint,
        "compute": {"matmul": list(matmul.values())} if matmul else {},
        "comm": list(comm.values()),
        "created_at": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "from_logs": [str(p) for p in paths],
    }
    return Calibration.model_validate(doc)


def logged_devices(logs: list[NcclLog | MatmulLog]) -> dict[str, list[tuple[str, int]]]:
    """The GPUs the logs name → the (file, line) of each log naming it."""
    out: dict[str, list[tuple[str, int]]] = {}
    for log in logs:
        named = log.devices if isinstance(log, NcclLog) else ((log.device,) if log.device else ())
        for name in named:
            out.setdefault(name, []).append((log.path, log.device_line))
    return out


def device_problems(devices: dict[str, list[tuple[str, int]]], *, description: str) -> list[Problem]:
    """Logs of another GPU than the profile's (its `description` names it), or of several GPUs: a problem for each
    log, naming the line that names its GPU. A calibration holds one GPU's rates, and its GPU is MFU's peak."""
    problems = []
    for name, where in devices.items():
        why = logged_gpu_mismatch(name, description)
        if why is not None:
            fix = "read them with the profile of that GPU (`--cluster NAME`)"
            problems += [Problem(path, f"line {line}", f"{why}; {fix}") for path, line in where]
    if not problems and len(devices) > 1:
        names = ", ".join(repr(d) for d in devices)
        problems += [
            Problem(path, f"line {line}", f"the logs ran on different GPUs ({names}): give one GPU's logs")
            for where in devices.values()
            for path, line in where
        ]
    return problems


def comm_curves(log: NcclLog) -> list[dict]:
    """The log's curves as the calibration file's `comm` entries: one per dtype it measured, sizes ascending (the
    first row of a size kept). The latency is the smallest size's time when that size is latency-bound
    (LATENCY_SHARE), the bus bandwidth the largest size's busbw when that size reached it (SATURATED_SLOPE); each
    is null otherwise, with the reason, and the planner prices the sizes beyond the log's with the profile's
    figures."""
    out = []
    for dtype in dict.fromkeys(r.dtype for r in log.rows):
        rows: dict[int, Row] = {}
        for r in log.rows:
            if r.dtype == dtype:
                rows.setdefault(r.size, r)
        ordered = [rows[s] for s in sorted(rows)]
        latency, busbw, reasons = _ends(ordered)
        out.append(
            {
                "link": log.link,
                "collective": log.collective,
                "dtype": dtype,
                "ranks": log.ranks,
                "sizes": [r.size for r in ordered],
                "times": [r.time_us * 1e-6 for r in ordered],
                "latency_s": latency,
                "busbw_gbps": busbw,
                "busbw_at_sizes_gbps": [r.busbw_gbps for r in ordered],
                "hosts": len(log.hosts),
                "source": f"{log.path} lines {ordered[0].line}-{ordered[-1].line}"
                f" ({log.ranks} ranks on {len(log.hosts)} host{'s' if len(log.hosts) > 1 else ''})",
                **({"null_reasons": reasons} if reasons else {}),
            }
        )
    return out


def _ends(rows: list[Row]) -> tuple[float | None, float | None, dict[str, str]]:
    """(latency s, bus bandwidth GB/s, why either is null) of one curve's rows (ascending sizes)."""
    first, last = rows[0], rows[-1]
    reasons = {}
    peak = max(r.busbw_gbps for r in rows)
    latency: float | None = first.time_us * 1e-6
    if first.busbw_gbps > LATENCY_SHARE * peak:
        latency = None
        reasons["latency_s"] = (
            f"the smallest size, {first.size:,} B (line {first.line}), is not latency-bound: its busbw "
            f"{first.busbw_gbps:g} GB/s is {first.busbw_gbps / peak:.0%} of the log's {peak:g}; messages below it "
            "are priced with the profile's figures (a latency needs small messages: nccl-tests -b 8)"
        )
    slope = _slope(rows[-2], last) if len(rows) > 1 else None
    busbw: float | None = last.busbw_gbps
    if slope is None or slope < SATURATED_SLOPE:
        busbw = None
        grew = "one size only" if slope is None else f"its time grew {slope:.2f} times as fast as the size"
        reasons["busbw_gbps"] = (
            f"the largest size, {last.size:,} B (line {last.line}), had not reached the bus bandwidth ({grew}); "
            "messages above it are priced with the profile's figures (the bandwidth needs large messages: "
            "nccl-tests -e 8G)"
        )
    return latency, busbw, reasons


def _slope(a: Row, b: Row) -> float:
    """d log(time) / d log(size) between two rows."""
    return math.log(b.time_us / a.time_us) / math.log(b.size / a.size)


def summary_lines(calibration: Calibration) -> list[str]:
    """What `harness calibrate --from` prints under its first line: one line per figure, what it prices, and the
    file and lines it came from."""
    out = []
    for c in calibration.comm:
        reasons = c.null_reasons or {}
        busbw = (
            f"busbw {c.busbw_gbps:g} GB/s at {c.sizes[-1]:,} B"
            if c.busbw_gbps is not None
            else f"no busbw (sizes up to {c.sizes[-1]:,} B; above: the profile's)"
        )
        latency = (
            f"latency {c.latency_s * 1e6:g} us"
            if c.latency_s is not None
            else f"no latency (sizes from {c.sizes[0]:,} B; below: the profile's)"
        )
        head = f"  {c.collective:14s} {c.dtype:8s} {c.link:5s} {c.ranks:4d} ranks"
        out.append(f"{head}  {busbw}, {latency}  <- {c.source}")
        out += [f"    {field}: null: {why}" for field, why in reasons.items()]
    for r in calibration.compute.matmul:
        out.append(f"  matmul         {r.dtype:8s} {r.tflops:g} TFLOPS at {r.m}x{r.n}x{r.k}  <- {r.source}")
    return out


def _once(table: dict, key: object, value: dict, *, problems: list[Problem], what: str) -> None:
    """Put `value` under `key`, or a problem when another log measured the same figure."""
    if key in table:
        first = table[key]["source"].split(" line")[0]
        problems.append(Problem(value["source"].split(" line")[0], "", f"{what} is also measured by {first}: give one"))
    else:
        table[key] = value
