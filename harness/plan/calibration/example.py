"""A synthetic calibration with round-number rates, for tests and benches that must not depend on the machine."""

from __future__ import annotations

import datetime
from typing import Any

from harness.core.catalogue import CATALOGUE
from harness.core.precisions import PRECISIONS
from harness.plan.calibration.bus import BUS_FACTORS, bus_factor
from harness.plan.calibration.file import FORMAT
from harness.plan.calibration.find import host_fingerprint


def example_calibration(
    cluster: str, *, device: str = "cpu", fingerprint: dict[str, Any] | None = None, tflops: float = 0.05
) -> dict[str, Any]:
    """A complete calibration file's JSON document with round-number rates (every GEMM at `tflops`, 10 GB/s
    elementwise, 10 us per op, 1 GB/s busbw and 100 us latency per collective, 1 ms + 1 ms/block framework overhead)
    for this host, dated now: what tests and benches write (or edit, then write) where a measured file would make
    results depend on the machine. `fingerprint` overrides fingerprint fields. A document, not a `Calibration`, so
    that a test can break it; harness.plan.calibration.file.parse_calibration reads it."""
    dims = (64, 256, 1024, 4096, 32768)
    gemm = [
        {"dtype": dt, "layout": lay, "m": m, "n": n, "k": k, "s": 2.0 * m * n * k / (tflops * 1e12)}
        for dt in ("float32", "bfloat16", "float16")
        for lay in ("nt", "nn", "tn")
        for m in dims
        for n in dims
        for k in dims
    ]

    def att(dt: str, s: int) -> dict[str, Any]:
        fwd = 2.0 * 4 * s * s * 64 / (tflops * 1e12)  # causal half of 4·h·s²·hd, at the matmul rate
        shape = {"batch": 1, "heads": 4, "seq": s, "head_dim": 64}
        return {"dtype": dt, **shape, "forward_s": fwd, "backward_s": 2.5 * fwd}

    attention = [att(dt, s) for dt in ("float32", "bfloat16", "float16") for s in (128, 512, 2048)]
    keys = {e.framework_cost for e in CATALOGUE.values()}
    comm = [
        {"link": link, "collective": c, "dtype": "float32", "ranks": n, "sizes": [1024.0, 2.0**30],
         "times": [1e-4, 1e-4 + 2.0**30 * (bus_factor(c, n) or 1.0) / 1e9], "latency_s": 1e-4, "busbw_gbps": 1.0}
        for link, ranks in (("self", (1,)), ("intra", (2, 4, 8)), ("inter", (2, 4, 8)))
        for n in ranks for c in BUS_FACTORS
    ]  # fmt: skip
    fp = dict(host_fingerprint().to_dict(), device=device, device_name=None, cpu_allocator="caching")
    fp.update(fingerprint or {})
    return {
        "format": FORMAT,
        "cluster": cluster,
        "created_at": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "fingerprint": fp,
        "compute": {
            "gemm": gemm,
            "attention": attention,
            "elementwise": [
                {"dtype": dt, "op_bytes": b, "gbps": 10.0} for dt in ("float32", "bfloat16") for b in (1e4, 1e8)
            ],  # fmt: skip
            "dispatch": {"forward_s": 1e-5, "backward_s": 1e-5},
            "optimizer": {"per_tensor_s": 1e-5, "per_element_s": 2.8e-9},
            "framework": {
                f"{k}/{p}": {"fixed_s": 1e-3, "per_block_s": 1e-3, "per_element_s": 0.0}
                for k in keys
                for p in PRECISIONS
            },
        },
        "comm": comm,
    }
