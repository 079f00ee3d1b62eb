"""An nccl-tests log (`all_reduce_perf`, `all_gather_perf`, `reduce_scatter_perf`, `broadcast_perf`) as the
collective curves of a calibration: bus bandwidth and time per message size, per collective, dtype and link.

What nccl-tests prints (NVIDIA/nccl-tests: src/common.cu, since 2.17 src/util.cu):

    # nccl-tests version 2.17.1 nccl-headers=22602 nccl-library=22602     (2.17.4 on)
    # Collective test starting: all_reduce_perf                             (2.16.7 on; a NAME_SUFFIX may follow)
    # nThread 1 nGpus 1 minBytes 8 maxBytes 8589934592 step: 2(factor) warmup iters: 5 iters: 20 ...
    #
    # Using devices
    #  Rank  0 Group  0 Pid  12345 on    node001 device  0 [0000:18:00] NVIDIA H100 80GB HBM3
    ...                                               (before 2.13: `#   Rank  0 Pid …`, no Group)
    #                                                              out-of-place            in-place (…)
    #       size         count      type   redop    root     time   algbw   busbw  #wrong     time  …
    #        (B)    (elements)                               (us)  (GB/s)  (GB/s)             (us)  …
               8             2     float     sum      -1    36.93    0.00    0.00       0    36.42  …
    ...
    # Out of bounds values : 0 OK
    # Avg bus bandwidth    : 102.542
    #

Before 2.13 each program printed its own columns: all_reduce and reduce_scatter `size count type redop`,
all_gather `size count type`, broadcast `size count type root`, alltoall `size count type redop` with the redop left
empty; and an `error` column (the largest deviation from the expected values, `%5.0le`, not a count) where `#wrong`
is now. From 2.13.0 every program prints redop and root, all_gather's, broadcast's and alltoall's redop empty until
2.13.4 (`none` since). A table is read by its column header's names, never by position.

What else a real log holds is read past: NCCL's own output (its `NCCL version 2.21.5+cuda12.4` banner, printed
whenever NCCL_DEBUG is set, and its `host:pid:tid [dev] NCCL INFO|WARN …` lines, which can cut a row of the table in
two: the row's start stays, the rest follows on a later line), a launcher's prefix on every line (the text before
the `# nThread` header, e.g. `srun -l`'s ` 0: `, Open MPI's `[1,0]<stdout>:`; its digits may differ from line to
line), and any other program's line that is not shaped like a row of the table.

The ranks are the `#  Rank` lines, the hosts the names after `on`: one host is the `intra` link, several the
`inter` link. The collective is the program's name where the log gives it, else told by the columns (redop and
root, and busbw / algbw: 2(n-1)/n for all_reduce, (n-1)/n for reduce_scatter and all_gather, 1 for broadcast). Sizes
are nccl-tests' bytes (all_gather's whole output, reduce_scatter's whole input: the harness's convention,
harness.plan.calibration.bus); times are the out-of-place column's (us, an average over the iterations), the bus
bandwidth its busbw (GB/s). A row of 0 bytes (all_gather's and reduce_scatter's sizes below one element per rank)
moves nothing and is left out; so are rows of types the harness has no dtype for, when the log has others (`-d all`).

Refused, with the file and the line: a run that did not finish (no `# Avg bus bandwidth` footer), wrong results
(`#wrong` above 0, or out-of-bounds values), a row that does not read as the header names, two runs in one file, and
a collective the time model does not price (yet): all-to-all (`alltoall_perf`; without the program line told by
its empty redop before 2.13, by its unchecked in-place results from 2.13.1 when validated), send/receive, reduce,
gather, scatter. Pure: no torch.
"""

from __future__ import annotations

import math
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

UNPRICED: dict[str, str] = {
    "alltoall_perf": "all-to-all",
    "alltoallv_perf": "all-to-all",
    "sendrecv_perf": "send/receive",
    "reduce_perf": "reduce",
    "gather_perf": "gather",
    "scatter_perf": "scatter",
    "hypercube_perf": "hypercube",
}
"""nccl-tests programs whose collectives the time model does not price (yet) → what they measure"""

DTYPES: dict[str, str] = {
    "float": "float32",
    "float32": "float32",
    "half": "float16",
    "float16": "float16",
    "bfloat16": "bfloat16",
    "double": "float64",
}
"""nccl-tests' type names → torch's dtype names (the calibration's); rows of other types are left out"""

HEADER_RE = re.compile(r"# nThread (\d+) nGpus (\d+) minBytes (\d+) maxBytes (\d+)")
"""the run header, searched anywhere in a line: what comes before it is a launcher's prefix"""
RANK_RE = re.compile(
    r"^#\s+Rank\s+(\d+)\s+(?:Group\s+\d+\s+)?Pid\s+\d+\s+on\s+(\S+)\s+device\s+\d+\s+\[[^\]]*\]\s*(.*)$"
)
PROGRAM_RE = re.compile(r"^# Collective test starting: (\S+)")
FOOTER_BW_RE = re.compile(r"^# Avg bus bandwidth\s*:\s*(\S+)")
FOOTER_OOB_RE = re.compile(r"^# Out of bounds values\s*:\s*(\d+)\s*(\S*)")
NCCL_BANNER_RE = re.compile(r"^\s*NCCL version \d\S*\s*$")
"""NCCL's version line, printed bare to stdout whenever NCCL_DEBUG is set (src/init.cc, showVersion)"""
NCCL_DEBUG_RE = re.compile(r"\bNCCL (?:INFO|WARN|TRACE|ABORT)\b")
"""a line of NCCL's debug output (`host:pid:tid [dev] NCCL INFO …`; WARN lines put `file.cc:123` before NCCL)"""


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
    """the reduction (sum, …), none, or empty (no redop column, or an empty one: 2.13.0-2.13.3's all_gather,
    broadcast, alltoall)"""
    root: int
    """the root rank (broadcast) or -1"""
    time_us: float
    """out-of-place time (us)"""
    algbw_gbps: float
    """out-of-place algorithm bandwidth (GB/s)"""
    busbw_gbps: float
    """out-of-place bus bandwidth (GB/s)"""
    checked: tuple[bool, bool] = (True, True)
    """whether nccl-tests checked the (out-of-place, in-place) results: a number, not N/A, under #wrong/error"""


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
    """the table, in the log's order (rows of 0 bytes and of types the harness has no dtype for left out)"""
    avg_busbw_gbps: float
    """the footer's average bus bandwidth (GB/s)"""
    table_lines: tuple[int, int] = field(default=(0, 0))
    """the first and last line of the table"""
    device_line: int = 0
    """the first `#  Rank` line (where the devices are named)"""

    @property
    def link(self) -> str:
        """intra (one host) | inter (several)"""
        return "intra" if len(self.hosts) == 1 else "inter"


def looks_like_nccl_tests(text: str) -> bool:
    """Whether `text` has nccl-tests' run header (behind a launcher's prefix or not)."""
    return HEADER_RE.search(text) is not None


def parse_nccl_tests(path: Path, text: str) -> NcclLog:
    """The log at `path` (its `text`); InputError naming the file and the line when it is not one nccl-tests run
    of a collective the time model prices, or did not finish, or measured wrong results."""
    file = str(path)
    raw = text.removesuffix("\n").split("\n")

    def fail(n: int, message: str) -> InputError:
        return InputError([Problem(file, f"line {n}", message)])

    found = next(((i, m) for i, line in enumerate(raw) if (m := HEADER_RE.search(line))), None)
    if found is None:
        raise fail(1, "not an nccl-tests log: no `# nThread … nGpus … minBytes … maxBytes …` header")
    start, header = found
    lines = strip_prefix(raw, raw[start][: header.start()])
    program = next(((i + 1, m.group(1)) for i, line in enumerate(lines[: start + 1]) if (m := PROGRAM_RE.match(line))),
                   None)  # fmt: skip
    if program is not None:
        _check_program(*program, file=file)
    hosts = {m.group(2) for line in lines[start + 1 :] if (m := RANK_RE.match(line))}
    cut_by_nccl = nccl_message_re(hosts)
    ranks: list[tuple[int, str, str]] = []
    columns: list[str] | None = None
    rows: list[Row] = []
    other_types: dict[str, int] = {}
    footer: float | None = None
    pending = ""  # a row's start that one of NCCL's lines cut off; its rest follows on a later line
    end = len(lines)
    for n, line in enumerate(lines[start + 1 :], start=start + 2):
        cut = cut_by_nccl.search(line) if cut_by_nccl is not None else None
        if cut is not None:
            pending += line[: cut.start()]
            continue
        if NCCL_DEBUG_RE.search(line) or NCCL_BANNER_RE.match(line):
            continue
        if pending.strip():
            line = pending + line
        pending = ""
        if (m := RANK_RE.match(line)) is not None:
            ranks.append((n, m.group(2), m.group(3).strip()))
        elif line.startswith("#") and {"size", "count"} <= set(line[1:].split()):
            columns = line[1:].split()
            _check_columns(columns, file=file, n=n)
        elif (m := FOOTER_OOB_RE.match(line)) is not None:
            if int(m.group(1)) > 0:
                raise fail(n, f"nccl-tests found {m.group(1)} out-of-bounds values: not a measurement to plan with")
        elif (m := FOOTER_BW_RE.match(line)) is not None:
            footer = _number(m.group(1), file=file, n=n, what="the average bus bandwidth")
            end = n
            break
        elif columns is None or not _row_shaped(line):
            continue  # NOTE: nccl-tests' comments, blank lines, and other programs' output (a launcher's, MPI's)
        else:
            kind = _type_of(line, columns)
            if kind not in DTYPES:
                other_types.setdefault(kind, n)
            elif (row := _row(line, columns, file=file, n=n)) is not None:
                rows.append(row)
    if not ranks:
        raise fail(start + 1, "no `#  Rank N … Pid P on HOST device D` lines: the group's size is unknown")
    if footer is None:
        raise fail(len(lines), "truncated: no `# Avg bus bandwidth` footer (the run did not finish)")
    again = next((i for i, line in enumerate(lines[end:], start=end + 1) if HEADER_RE.search(line)), None)
    if again is not None:
        raise fail(again, "a second nccl-tests run starts here (`# nThread …`): give each run in a file of its own")
    if not rows:
        if other_types:
            kind, n = next(iter(other_types.items()))
            raise fail(n, f"type {kind!r} is not one of {', '.join(DTYPES)}: no row of a type the harness plans with")
        raise fail(start + 1, "no measured sizes in the table")
    hosts_in_order = tuple(dict.fromkeys(h for _, h, _ in ranks))
    devices = tuple(dict.fromkeys(d for _, _, d in ranks if d))
    collective = PROGRAMS[program_of(program[1])] if program is not None else _told(rows, len(ranks), file=file)
    return NcclLog(
        path=file,
        collective=collective,
        ranks=len(ranks),
        hosts=hosts_in_order,
        devices=devices,
        rows=tuple(rows),
        avg_busbw_gbps=footer,
        table_lines=(rows[0].line, rows[-1].line),
        device_line=ranks[0][0],
    )


def strip_prefix(lines: list[str], prefix: str) -> list[str]:
    """`lines` without a launcher's `prefix` (the text before the run header): every line that starts like it, its
    digits and spaces free to differ (`srun -l` numbers each task, ` 0: ` to `15: `; Open MPI its ranks,
    `[1,0]<stdout>:`), loses it; other lines (another stream's, the launcher's own) stay as they are."""
    if not prefix:
        return lines
    parts = re.findall(r"\d+|\s+|[^\d\s]+", prefix)
    each = (r"\d+" if p.isdigit() else r"\s*" if p.isspace() else re.escape(p) for p in parts)
    pattern = re.compile("^" + "".join(each))
    return [line[m.end() :] if (m := pattern.match(line)) else line for line in lines]


def nccl_message_re(hosts: set[str]) -> re.Pattern[str] | None:
    """Where one of NCCL's debug lines starts (`host:pid:tid [dev] NCCL INFO`, a WARN's `file.cc:123` between), the
    host one of the log's: found also in the middle of a line, where it cut off a row of the table."""
    if not hosts:
        return None
    names = "|".join(re.escape(h) for h in sorted(hosts, key=len, reverse=True))
    return re.compile(rf"(?:{names}):\d+:\d+ \[-?\d+\] (?:\S+ )?NCCL (?:INFO|WARN|TRACE|ABORT)\b")


def program_of(name: str) -> str:
    """The nccl-tests program a `Collective test starting:` name is (a build's NAME_SUFFIX dropped:
    `all_reduce_perf_mpi` is all_reduce_perf)."""
    m = re.match(r"^(.+?_perf)(?:_|$)", name)
    return m.group(1) if m else name


def _check_program(n: int, name: str, *, file: str) -> None:
    """InputError unless the program measures a collective the time model prices."""
    base = program_of(name)
    if base in PROGRAMS:
        return
    allowed = ", ".join(PROGRAMS)
    what = UNPRICED.get(base)
    why = f"{what} is not priced (yet)" if what else "not a collective test the time model knows"
    raise InputError([Problem(file, f"line {n}", f"{name}: {why}: the time model prices {allowed}")])


def _check_columns(columns: list[str], *, file: str, n: int) -> None:
    """InputError unless the column header names what a row is read by."""
    missing = [k for k in ("size", "type", "algbw", "busbw") if k not in columns]
    if "time" not in columns and "cputime" not in columns:
        missing.insert(1, "time")
    if missing:
        raise InputError(
            [Problem(file, f"line {n}", f"the column header lacks {', '.join(missing)}: not nccl-tests' table")]
        )


def _row_shaped(line: str) -> bool:
    """Whether a line starts as a row of the table does: with its size, a whole number of bytes."""
    tokens = line.split()
    return bool(tokens) and tokens[0].isdigit()


def _is_number(token: str) -> bool:
    try:
        float(token)
    except ValueError:
        return False
    return True


def _number(token: str, *, file: str, n: int, what: str) -> float:
    try:
        return float(token)
    except ValueError:
        raise InputError([Problem(file, f"line {n}", f"{what} {token!r} is not a number")]) from None


def _type_of(line: str, columns: list[str]) -> str:
    """The row's type column ("" when the row is too short to have one: `_row` says why)."""
    tokens, at = line.split(), columns.index("type")
    return tokens[at] if len(tokens) > at else ""


def _row(line: str, columns: list[str], *, file: str, n: int) -> Row | None:
    """One line of the table, read by the column header's names (the out-of-place block comes first); None for a
    row of 0 bytes."""
    tokens = line.split()

    def fail(message: str) -> InputError:
        return InputError([Problem(file, f"line {n}", message)])

    def value(name: str) -> float:
        return _number(tokens[columns.index(name)], file=file, n=n, what=name)

    if len(tokens) == len(columns) - 1 and "redop" in columns and _is_number(tokens[columns.index("redop")]):
        # an empty redop: in 2.13.0-2.13.3 (a root column beside it) all_gather's, broadcast's and alltoall's;
        # before 2.13 (no root column but broadcast's, no redop column for all_gather) alltoall's only
        if "root" not in columns:
            raise fail(
                "the redop column is empty, as nccl-tests before 2.13 printed it for alltoall_perf only: all-to-all "
                f"is not priced (yet): the time model prices {', '.join(PROGRAMS)}"
            )
        tokens.insert(columns.index("redop"), "")
    if len(tokens) < len(columns):  # NOTE: more is fine: a timestamp column's value is two tokens
        raise fail(f"{len(tokens)} columns where the header names {len(columns)}: {line.strip()!r}")
    time = "time" if "time" in columns else "cputime"
    size, seconds, algbw, busbw = value("size"), value(time), value("algbw"), value("busbw")
    # the (out-of-place, in-place) results' check: #wrong counts wrong elements; before 2.13, `error` was the
    # largest deviation, which nccl-tests judged itself (the footer's out-of-bounds count)
    wrong_col = "#wrong" if "#wrong" in columns else "error"
    wrong = [tokens[i] for i, c in enumerate(columns) if c == wrong_col][:2]
    for w in wrong:
        if w != "N/A" and _number(w, file=file, n=n, what=wrong_col) > 0 and wrong_col == "#wrong":
            raise fail(f"#wrong {w}: the collective returned wrong results at this size")
    checked = [w != "N/A" for w in wrong] + [True] * (2 - len(wrong))
    if size == 0:
        return None  # NOTE: nothing moves (all_gather's sizes below one element per rank)
    if seconds <= 0 or size < 0:
        raise fail(f"{tokens[columns.index('size')]} B in {tokens[columns.index(time)]} us: not a measurement")
    return Row(
        line=n,
        size=int(size),
        dtype=DTYPES[tokens[columns.index("type")]],
        redop=tokens[columns.index("redop")] if "redop" in columns else "",
        root=int(value("root")) if "root" in columns else -1,
        time_us=seconds,
        algbw_gbps=algbw,
        busbw_gbps=busbw,
        checked=(checked[0], checked[1]),
    )


def _told(rows: list[Row], ranks: int, *, file: str) -> str:
    """The collective of a log that does not name its program, told by its columns."""

    def fail(n: int, message: str) -> InputError:
        return InputError([Problem(file, f"line {n}", message)])

    priced = ", ".join(PROGRAMS)
    if all(r.checked == (True, False) for r in rows):
        raise fail(
            rows[0].line,
            "the in-place results are N/A where the out-of-place ones are checked, in every row: nccl-tests does "
            f"that for alltoall_perf (and sendrecv_perf), whose all-to-all is not priced (yet): the time model "
            f"prices {priced}",
        )
    big = max(rows, key=lambda r: r.size)
    ratio = big.busbw_gbps / big.algbw_gbps if big.algbw_gbps > 0 else 0.0
    candidates: tuple[str, ...]
    if big.redop in ("none", ""):
        candidates = ("broadcast",) if big.root >= 0 else ("all_gather",)
    elif big.root >= 0:
        raise fail(big.line, f"redop {big.redop} with root {big.root}: reduce_perf, whose reduce is not priced (yet)")
    else:
        candidates = ("all_reduce", "reduce_scatter")
    for name in candidates:
        if math.isclose(ratio, BUS_FACTORS[name](ranks), abs_tol=0.02):
            return name
    expected = " or ".join(f"{BUS_FACTORS[c](ranks):.3f} ({c})" for c in candidates)
    raise fail(
        big.line,
        f"which collective this is cannot be told: busbw / algbw = {ratio:.3f} at {ranks} ranks, not {expected}; "
        "a log that starts with `# Collective test starting: all_reduce_perf` says it",
    )
