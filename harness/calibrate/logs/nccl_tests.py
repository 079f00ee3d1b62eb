"""An nccl-tests log (`all_reduce_perf`, `all_gather_perf`, `reduce_scatter_perf`, `broadcast_perf`) as the
collective curves of a calibration: bus bandwidth and time per message size, per collective, dtype and link.

What nccl-tests prints (src/util.cu, NVIDIA/nccl-tests 2.x; older versions print the same columns):

    # nccl-tests version 2.17.1 nccl-headers=22602 nccl-library=22602     (newer versions only)
    # Collective test starting: all_reduce_perf                             (newer versions only)
    # nThread 1 nGpus 1 minBytes 8 maxBytes 8589934592 step: 2(factor) warmup iters: 5 iters: 20 ...
    #
    # Using devices
    #  Rank  0 Group  0 Pid  12345 on    node001 device  0 [0000:18:00] NVIDIA H100 80GB HBM3
    ...
    #                                                              out-of-place            in-place (…)
    #       size         count      type   redop    root     time   algbw   busbw  #wrong     time  …
    #        (B)    (elements)                               (us)  (GB/s)  (GB/s)             (us)  …
               8             2     float     sum      -1    36.93    0.00    0.00       0    36.42  …
    ...
    # Out of bounds values : 0 OK
    # Avg bus bandwidth    : 102.542
    #

The ranks are the `#  Rank` lines, the hosts the names after `on`: one host is the `intra` link, several the
`inter` link. The collective is the program's name where the log gives it, else told by the columns (redop and
root, and busbw / algbw: 2(n-1)/n for all_reduce, (n-1)/n for reduce_scatter). Sizes are nccl-tests' bytes (all_gather's
whole output, reduce_scatter's whole input: the harness's convention, harness.plan.calibration.bus); times are the
out-of-place column's (us, an average over the iterations), the bus bandwidth its busbw (GB/s). A log whose run
did not finish (no `Avg bus bandwidth` footer), with wrong results (`#wrong` above 0, or out-of-bounds values),
or with a line of another layout is refused with the file and the line. Pure: no torch.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from harness.core.errors import InputError, Problem
from harness.plan.calibration import BUS_FACTORS

PROGRAMS: dict[str, str] = {
    "all_reduce_perf": "all_reduce",
    "all_gather_perf": "all_gather",
    "reduce_scatter_perf": "reduce_scatter",
    "broadcast_perf": "broadcast",
}
"""nccl-tests programs whose collectives the time model prices → the collective"""

DTYPES: dict[str, str] = {
    "float": "float32",
    "float32": "float32",
    "half": "float16",
    "float16": "float16",
    "bfloat16": "bfloat16",
    "double": "float64",
}
"""nccl-tests' type names → torch's dtype names (the calibration's); other types are refused"""

HEADER_RE = re.compile(r"^# nThread (\d+) nGpus (\d+) minBytes (\d+) maxBytes (\d+)")
RANK_RE = re.compile(
    r"^#\s+Rank\s+(\d+)\s+Group\s+(\d+)\s+Pid\s+(\d+)\s+on\s+(\S+)\s+device\s+(\d+)\s+\[[^\]]*\]\s*(.*)$"
)
PROGRAM_RE = re.compile(r"^# Collective test starting: (\S+)")
FOOTER_BW_RE = re.compile(r"^# Avg bus bandwidth\s*:\s*(\S+)")
FOOTER_OOB_RE = re.compile(r"^# Out of bounds values\s*:\s*(\d+)\s*(\S*)")
NOISE_RE = re.compile(r"NCCL (INFO|WARN)|^\s*$")
"""lines a log may hold between nccl-tests' own: NCCL's debug output, blank lines"""


@dataclass(frozen=True)
class Row:
    """One message size of the table: nccl-tests' out-of-place figures."""

    line: int
    """the line number in the log (1-based)"""
    size: int
    """bytes"""
    dtype: str
    """torch's name of the type column"""
    redop: str
    """the reduction (sum, …) or none"""
    root: int
    """the root rank (broadcast) or -1"""
    time_us: float
    """out-of-place time (us)"""
    algbw_gbps: float
    """out-of-place algorithm bandwidth (GB/s)"""
    busbw_gbps: float
    """out-of-place bus bandwidth (GB/s)"""


@dataclass(frozen=True)
class NcclLog:
    """What one nccl-tests log measured."""

    path: str
    collective: str
    """all_reduce | all_gather | reduce_scatter | broadcast"""
    ranks: int
    """ranks in the group (the `#  Rank` lines)"""
    hosts: tuple[str, ...]
    """the hosts they ran on, in rank order, once each"""
    devices: tuple[str, ...]
    """the devices' names as nccl-tests printed them, once each"""
    rows: tuple[Row, ...]
    """the table, in the log's order"""
    avg_busbw_gbps: float
    """the footer's average bus bandwidth (GB/s)"""
    table_lines: tuple[int, int] = field(default=(0, 0))
    """the first and last line of the table"""

    @property
    def link(self) -> str:
        """intra (one host) | inter (several)"""
        return "intra" if len(self.hosts) == 1 else "inter"


def looks_like_nccl_tests(text: str) -> bool:
    """Whether `text` has nccl-tests' run header."""
    return any(HEADER_RE.match(line) for line in text.split("\n"))


def parse_nccl_tests(path: Path, text: str) -> NcclLog:
    """The log at `path` (its `text`); InputError naming the file and the line when it is not one nccl-tests run
    of a collective the time model prices, or did not finish, or measured wrong results."""
    file = str(path)
    lines = text.removesuffix("\n").split("\n")

    def fail(n: int, message: str) -> InputError:
        return InputError([Problem(file, f"line {n}", message)])

    start = next((i for i, line in enumerate(lines) if HEADER_RE.match(line)), None)
    if start is None:
        raise fail(1, "not an nccl-tests log: no `# nThread … nGpus … minBytes … maxBytes …` header")
    named = [(i + 1, m.group(1)) for i, line in enumerate(lines[: start + 1]) if (m := PROGRAM_RE.match(line))]
    program = named[0] if named else None
    ranks: list[tuple[str, str]] = []
    columns: list[str] | None = None
    rows: list[Row] = []
    footer: float | None = None
    for n, line in enumerate(lines[start + 1 :], start=start + 2):
        if (m := RANK_RE.match(line)) is not None:
            ranks.append((m.group(4), m.group(6).strip()))
        elif line.startswith("#") and " size " in f" {line[1:]} " and "count" in line:
            columns = line[1:].split()
        elif (m := FOOTER_OOB_RE.match(line)) is not None:
            if int(m.group(1)) > 0:
                raise fail(n, f"nccl-tests found {m.group(1)} out-of-bounds values: not a measurement to plan with")
        elif (m := FOOTER_BW_RE.match(line)) is not None:
            footer = _number(m.group(1), file=file, n=n, what="the average bus bandwidth")
            break
        elif line.startswith("#") or NOISE_RE.search(line):
            continue
        elif columns is None:
            raise fail(n, f"a line before nccl-tests' column header: {line.strip()[:80]!r}")
        else:
            rows.append(_row(line, columns, file=file, n=n))
    if not ranks:
        raise fail(start + 1, "no `#  Rank N Group G Pid P on HOST device D` lines: the group's size is unknown")
    if footer is None:
        raise fail(len(lines), "truncated: no `# Avg bus bandwidth` footer (the run did not finish)")
    if not rows:
        raise fail(start + 1, "no measured sizes in the table")
    hosts = tuple(dict.fromkeys(h for h, _ in ranks))
    devices = tuple(dict.fromkeys(d for _, d in ranks if d))
    collective = _collective(program, rows, len(ranks), file=file)
    return NcclLog(
        path=file,
        collective=collective,
        ranks=len(ranks),
        hosts=hosts,
        devices=devices,
        rows=tuple(rows),
        avg_busbw_gbps=footer,
        table_lines=(rows[0].line, rows[-1].line),
    )


def _number(token: str, *, file: str, n: int, what: str) -> float:
    try:
        return float(token)
    except ValueError:
        raise InputError([Problem(file, f"line {n}", f"{what} {token!r} is not a number")]) from None


def _row(line: str, columns: list[str], *, file: str, n: int) -> Row:
    """One line of the table, read by the column header's names (the out-of-place block comes first)."""
    tokens = line.split()
    if len(tokens) < len(columns):  # NOTE: more is fine: a timestamp column's value is two tokens
        raise InputError(
            [
                Problem(
                    file, f"line {n}", f"{len(tokens)} columns where the header names {len(columns)}: {line.strip()!r}"
                )
            ]
        )
    at: dict[str, int] = {n: columns.index(n) for n in ("size", "type", "redop", "algbw", "busbw") if n in columns}
    if len(at) < 5:
        missing = ", ".join(k for k in ("size", "type", "redop", "algbw", "busbw") if k not in at)
        raise InputError([Problem(file, f"line {n}", f"the column header lacks {missing}: not nccl-tests' table")])
    at["time"] = columns.index("time") if "time" in columns else columns.index("cputime")
    wrong_col = "#wrong" if "#wrong" in columns else "error"  # NOTE: nccl-tests before 2.10 printed a max error
    wrong = tokens[columns.index(wrong_col)] if wrong_col in columns else "N/A"
    if wrong != "N/A" and _number(wrong, file=file, n=n, what=wrong_col) > 0:
        raise InputError(
            [Problem(file, f"line {n}", f"{wrong_col} {wrong}: the collective returned wrong results at this size")]
        )
    kind = tokens[at["type"]]
    if kind not in DTYPES:
        raise InputError([Problem(file, f"line {n}", f"type {kind!r} is not one of {', '.join(DTYPES)}")])
    num = {k: _number(tokens[at[k]], file=file, n=n, what=k) for k in ("size", "time", "algbw", "busbw")}
    num["root"] = _number(tokens[columns.index("root")], file=file, n=n, what="root") if "root" in columns else -1
    if num["time"] <= 0 or num["size"] <= 0:
        raise InputError([Problem(file, f"line {n}", "a size or time that is not positive")])
    return Row(
        line=n,
        size=int(num["size"]),
        dtype=DTYPES[kind],
        redop=tokens[at["redop"]],
        root=int(num["root"]),
        time_us=num["time"],
        algbw_gbps=num["algbw"],
        busbw_gbps=num["busbw"],
    )


def _collective(program: tuple[int, str] | None, rows: list[Row], ranks: int, *, file: str) -> str:
    """The collective the log measured: its program's (line, name), else told by the columns."""
    if program is not None:
        n, name = program
        if name not in PROGRAMS:
            allowed = ", ".join(PROGRAMS)
            raise InputError(
                [Problem(file, f"line {n}", f"{name}: the time model prices the collectives of {allowed}")]
            )
        return PROGRAMS[name]
    big = max(rows, key=lambda r: r.size)
    if big.redop == "none":
        return "broadcast" if big.root >= 0 else "all_gather"
    ratio = big.busbw_gbps / big.algbw_gbps if big.algbw_gbps > 0 else 0.0
    for name in ("all_reduce", "reduce_scatter"):
        if abs(ratio - BUS_FACTORS[name](ranks)) < 0.02:
            return name
    raise InputError(
        [
            Problem(
                file,
                f"line {big.line}",
                f"which collective this is cannot be told (busbw / algbw = {ratio:.3f} at {ranks} ranks; "
                "a log that starts with `# Collective test starting: all_reduce_perf` says it)",
            )
        ]
    )
