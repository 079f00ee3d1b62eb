"""Calibration files and the rates the step-time model reads from them (or from the profile's `performance:` block).

`harness calibrate --cluster NAME` (harness.calibrate) measures a cluster's rates and writes its calibration file;
the planner reads it here. Pure and torch-free, so `harness plan` reads a calibration without importing torch:

- `file`: the file's format as typed models (`Calibration`, and `CollectivesPart`, what a group of ranks writes),
  its one reader and writer;
- `find`: where a cluster's file lives, this host's fingerprint, and the refusal of another machine's file;
- `rates`: the `Rates` interface of harness.plan.time, `CalibratedRates` (a file's), `ProfileRates` (the profile's
  figures), `LoggedRates` (the profile's figures with those of a file built from the user's logs by `harness
  calibrate --from`), `rates_for(cluster)`;
- `bus`: nccl-tests' bus-bandwidth factors, which the measurements, the file and the rates share;
- `example`: a synthetic file with round-number rates, for tests and benches.

The names below are the package's interface (`from harness.plan.calibration import rates_for`).
"""

from __future__ import annotations

from harness.plan.calibration.bus import BUS_FACTORS, algbw_gbps, bus_factor, busbw_gbps
from harness.plan.calibration.example import example_calibration
from harness.plan.calibration.file import (
    FORMAT,
    FRAMEWORK_STRATEGIES,
    Calibration,
    CollectivesPart,
    Fingerprint,
    MatmulRate,
    parse_calibration,
    read_calibration,
    read_collectives_part,
    write_calibration,
)
from harness.plan.calibration.find import (
    CALIBRATION_DIR_ENV,
    MATCH_KEYS,
    SUFFIX,
    CalibrationMismatch,
    ClusterProfile,
    Found,
    candidate_paths,
    describe_fingerprint,
    find_calibration,
    host_fingerprint,
    logged_gpu_mismatch,
    mismatch_reason,
    usable_cores,
    user_dir,
    write_path,
)
from harness.plan.calibration.rates import (
    CalibratedRates,
    CollectiveCurve,
    LoggedRates,
    ProfileRates,
    Rates,
    RatesSource,
    Unknown,
    clear_caches,
    rates_for,
)

__all__ = [
    "BUS_FACTORS",
    "CALIBRATION_DIR_ENV",
    "FORMAT",
    "FRAMEWORK_STRATEGIES",
    "MATCH_KEYS",
    "SUFFIX",
    "CalibratedRates",
    "Calibration",
    "CalibrationMismatch",
    "ClusterProfile",
    "CollectiveCurve",
    "CollectivesPart",
    "Fingerprint",
    "Found",
    "LoggedRates",
    "MatmulRate",
    "ProfileRates",
    "Rates",
    "RatesSource",
    "Unknown",
    "algbw_gbps",
    "bus_factor",
    "busbw_gbps",
    "candidate_paths",
    "clear_caches",
    "describe_fingerprint",
    "example_calibration",
    "find_calibration",
    "host_fingerprint",
    "logged_gpu_mismatch",
    "mismatch_reason",
    "parse_calibration",
    "read_calibration",
    "read_collectives_part",
    "rates_for",
    "usable_cores",
    "user_dir",
    "write_calibration",
    "write_path",
]
