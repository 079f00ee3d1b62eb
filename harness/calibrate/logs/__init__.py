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
from pathlib import Path

from harness.calibrate.logs.matmul import MatmulLog, looks_like_mamf, parse_mamf
from harness.calibrate.logs.nccl_tests import NcclLog, Row, looks_like_nccl_tests, parse_nccl_tests
from harness.core.errors import InputError, Problem
from harness.plan.calibration import FORMAT, Calibration

__all__ = ["MatmulLog", "NcclLog", "calibration_from_logs", "read_log"]


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


def calibration_from_logs(paths: list[Path], *, cluster: str, device: str) -> Calibration:
    """The calibration file of `cluster` (its profile's `device`) from the logs at `paths`; InputError with every
    file's problem (or two files measuring the same figure) and nothing built."""
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
    devices: set[str] = set()
    for log in logs:
        if isinstance(log, NcclLog):
            devices.update(log.devices)
            for curve in comm_curves(log):
                key = (curve["link"], curve["collective"], curve["dtype"], curve["ranks"])
                _once(comm, key, curve, problems=problems, what=f"{key[1]} {key[2]} on {key[3]} ranks ({key[0]})")
        else:
            if log.device:
                devices.add(log.device)
            rate = {"dtype": log.dtype, "tflops": log.tflops, "m": log.m, "n": log.n, "k": log.k}
            _once(matmul, log.dtype, {**rate, "source": f"{log.path} line {log.line}"}, problems=problems,
                  what=f"the {log.dtype} matmul rate")  # fmt: skip
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


def comm_curves(log: NcclLog) -> list[dict]:
    """The log's curves as the calibration file's `comm` entries: one per dtype it measured, sizes ascending (the
    first row of a size kept), the latency its smallest size's time, the bus bandwidth its largest size's."""
    out = []
    for dtype in dict.fromkeys(r.dtype for r in log.rows):
        rows: dict[int, Row] = {}
        for r in log.rows:
            if r.dtype == dtype:
                rows.setdefault(r.size, r)
        ordered = [rows[s] for s in sorted(rows)]
        largest = ordered[-1]
        if largest.busbw_gbps <= 0:
            raise InputError(
                [Problem(log.path, f"line {largest.line}", "the largest message's busbw is 0: no bandwidth measured")]
            )
        out.append(
            {
                "link": log.link,
                "collective": log.collective,
                "dtype": dtype,
                "ranks": log.ranks,
                "sizes": [r.size for r in ordered],
                "times": [r.time_us * 1e-6 for r in ordered],
                "latency_s": ordered[0].time_us * 1e-6,
                "busbw_gbps": largest.busbw_gbps,
                "busbw_at_sizes_gbps": [r.busbw_gbps for r in ordered],
                "hosts": len(log.hosts),
                "source": f"{log.path} lines {ordered[0].line}-{ordered[-1].line}"
                f" ({log.ranks} ranks on {len(log.hosts)} host{'s' if len(log.hosts) > 1 else ''})",
            }
        )
    return out


def _once(table: dict, key: object, value: dict, *, problems: list[Problem], what: str) -> None:
    """Put `value` under `key`, or a problem when another log measured the same figure."""
    if key in table:
        first = table[key]["source"].split(" line")[0]
        problems.append(Problem(value["source"].split(" line")[0], "", f"{what} is also measured by {first}: give one"))
    else:
        table[key] = value
