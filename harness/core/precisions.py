"""The precisions a cell trains in: one entry each, with what every stage needs to know about it.

A precision is a name (what scenario files, records and run_ids say), the torch dtype its matmuls run in (and, for
strategies that keep 16-bit parameters, the dtype of its parameters and collectives), whether it needs a dynamic loss
scaler, and which of a device's dense peaks its MFU divides by. Everything else follows from the entry:

- scenario validation and the catalogue's default per strategy (`PRECISIONS`);
- the planner's bytes per element (`element_bytes`), collective dtypes and matmul rates (the profile's
  `matmul_tflops` key is the precision's name; a calibration's measured dtype maps back with `of_dtype`);
- the MFU's peak (harness.scenario.cluster PEAKS, by `peak`);
- the worker's policy (harness.worker.precision: autocast and the loss scaler from `dtype` and `loss_scaling`);
- the report's line and marker styles (harness.report.figures.base: a known style, or one shared by new entries).

Adding one is this file's entry (docs/extending.md, "A precision"); tests/unit/test_extending.py registers a new
entry in a fresh interpreter and checks that every stage above takes it. A precision that changes the model itself
(fp8's float8 linears) adds its transform beside its policy in harness.worker.precision.

Floor 0: no torch, no import from the rest of the harness.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Precision:
    """One precision."""

    name: str
    """what scenario files, records and run_ids call it"""
    dtype: str
    """the torch dtype (its name: torch is not imported here) matmuls run in; 16-bit strategies also keep parameters,
    gradients and collectives in it"""
    loss_scaling: bool
    """the step needs a dynamic loss scaler (fp16's narrow exponent); bf16 has fp32's range and does not"""
    peak: str
    """the key of a device's dense peak table (harness.scenario.cluster PEAKS) its MFU divides by"""
    doc: str = ""

    @property
    def element_bytes(self) -> int:
        """bytes per element of `dtype` (B)"""
        return DTYPE_BYTES[self.dtype]

    @property
    def mixed(self) -> bool:
        """computes below fp32 (a strategy then runs it as its catalogue entry's `mixed` mode)"""
        return self.dtype != "float32"


DTYPE_BYTES: dict[str, int] = {"float64": 8, "float32": 4, "bfloat16": 2, "float16": 2, "uint8": 1}
"""bytes per element of the torch dtypes the planner counts (B)"""

ENTRIES: tuple[Precision, ...] = (
    Precision("fp32", "float32", loss_scaling=False, peak="fp32", doc="fp32 everything"),
    Precision("fp16", "float16", loss_scaling=True, peak="fp16", doc="16-bit compute with dynamic loss scaling"),
    Precision("bf16", "bfloat16", loss_scaling=False, peak="bf16", doc="16-bit compute, fp32's exponent range"),
)
"""every precision, in the order everything lists them"""

BY_NAME: dict[str, Precision] = {p.name: p for p in ENTRIES}
PRECISIONS: tuple[str, ...] = tuple(BY_NAME)
"""the precisions' names, in order"""


def get(name: str) -> Precision:
    """The entry of `name` (KeyError for a name no entry has: validation refuses those first)."""
    return BY_NAME[name]


def of_dtype(dtype: str) -> str:
    """The precision whose matmuls run in `dtype` (the first such entry); `dtype` itself when none does."""
    return next((p.name for p in ENTRIES if p.dtype == dtype), dtype)


def register(entry: Precision, *, element_bytes: int | None = None) -> None:
    """Add a precision (a site's, or a test's). Call it before the stages are imported: they read `PRECISIONS` when
    they load. `element_bytes` for a dtype DTYPE_BYTES does not know yet."""
    global ENTRIES, PRECISIONS
    if entry.name in BY_NAME:
        raise ValueError(f"precision {entry.name!r} exists already")
    if element_bytes is not None:
        DTYPE_BYTES[entry.dtype] = element_bytes
    if entry.dtype not in DTYPE_BYTES:
        raise ValueError(f"precision {entry.name!r}: dtype {entry.dtype!r} has no element size (give element_bytes)")
    ENTRIES = (*ENTRIES, entry)
    BY_NAME[entry.name] = entry
    PRECISIONS = tuple(BY_NAME)
