"""Shared test helpers: build RunSpecs from a few keys and run cells for real (gloo processes)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from harness.results.record import Record
from harness.scenario.cluster import load_cluster
from harness.scenario.schema import parse_scenario
from harness.scenario.spec import RunSpec

REPO = Path(__file__).resolve().parents[1]


def make_spec(
    *, strategy: str, precision: str = "fp32", gpus: int = 2, model: str = "tiny", gpus_per_node: int = 2, **settings
) -> RunSpec:
    doc = {
        "name": "t",
        "matrix": {"model": [model], "strategy": [strategy], "precision": [precision], "gpus": [gpus]},
        "settings": settings,
    }
    (spec,) = parse_scenario(doc, "test").expand(gpus_per_node=gpus_per_node)
    return spec


def as_doc(rec: Record) -> dict[str, Any]:
    """A record as the JSON document its file holds (read through harness.results.store), with `_path`: what tests
    of what was written assert on."""
    return {**rec.to_dict(), "_path": rec.path}


def load_docs(*dirs: str | Path) -> tuple[list[dict[str, Any]], list[str]]:
    """harness.results.store.load_records, each record as its document (as_doc)."""
    from harness.results.store import load_records

    records, warnings = load_records(*dirs)
    return [as_doc(r) for r in records], warnings


def read_doc(path: str | Path) -> dict[str, Any]:
    """harness.results.store.read_record, as its document (as_doc)."""
    from harness.results.store import read_record

    return as_doc(read_record(path))


def run_cell(spec: RunSpec, results: Path, *, sweep: str = "t", cluster: str = "local") -> dict:
    """Run one cell in the foreground launcher (real processes, real gloo group) and return its record's document
    (as_doc)."""
    from harness.launch.core.payload import make_payload
    from harness.launch.local.launchers import launch_foreground

    payload = make_payload(spec, sweep=sweep, cluster=load_cluster(cluster), results=results, sha=None, predicted=None)
    return as_doc(launch_foreground(payload, time_limit_s=spec.settings.time_limit_s, stream=False))


@pytest.fixture
def results(tmp_path: Path) -> Path:
    return tmp_path / "results"


@pytest.fixture(scope="session")
def smoke_sweep(tmp_path_factory) -> dict:
    """scenarios/smoke.yaml swept once per test session through the real CLI path (submitit, gloo):
    {"code", "results" (dir), "records" (run_id → record), "warnings", "wall_s", "extensions" (what the ranks
    JIT-built into their own, initially empty TORCH_EXTENSIONS_DIR), "output" (what the sweep printed)}."""
    import contextlib
    import io
    import os
    import time

    from harness.cli import main
    from harness.launch.local import prefork

    results = tmp_path_factory.mktemp("smoke") / "results"
    extensions = tmp_path_factory.mktemp("torch_extensions")
    t0 = time.time()
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("TORCH_EXTENSIONS_DIR", str(extensions))
        # NOTE: the sweep starts its own zygote, under this environment, as `make sweep` does; not tests/dist's
        mp.delenv(prefork.SOCKET_ENV, raising=False)
        with contextlib.redirect_stdout(io.StringIO()) as out:
            code = main(["sweep", str(REPO / "scenarios" / "smoke.yaml"), "--results", str(results)])
    print(out.getvalue())
    records, warnings = load_docs(results)
    return {
        "code": code,
        "results": results,
        "records": {r["run_id"]: r for r in records},
        "warnings": warnings,
        "wall_s": time.time() - t0,
        "extensions": sorted(os.listdir(extensions)),
        "output": out.getvalue(),
    }


def run_light(argv: list[str]) -> str:
    """`harness ARGV` in a fresh interpreter that must finish with exit 0 and without importing torch, pandas or
    matplotlib (the commands that only read and print); returns what it printed."""
    import os
    import subprocess
    import sys

    code = (
        "import sys; from harness.cli import main; "
        f"rc = main({argv!r}); assert rc == 0, rc; assert 'torch' not in sys.modules, 'torch imported'; "
        "heavy = {'pandas', 'matplotlib'} & set(sys.modules); assert not heavy, heavy"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        timeout=120,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    return out.stdout


def assert_comm_is_plans(rec: dict, spec: RunSpec) -> None:
    """The collectives a cell's record counted equal the plan's, to the byte and the call, per collective."""
    from harness.plan.comm import predict_comm

    assert rec["status"] == "ok", rec.get("reason")
    pred, got = predict_comm(spec), rec["comm"]
    assert pred is not None
    why = f"\nmeasured {got['by_collective']}\npredicted {pred['items']}"
    assert (got["bytes_per_step"], got["calls_per_step"]) == (pred["comm_bytes_per_step"], pred["calls_per_step"]), why
    assert {k: (v["calls"], v["bytes"]) for k, v in got["by_collective"].items()} == {
        k: (v["calls"], v["bytes"]) for k, v in pred["by_collective"].items()
    }, why


def assert_memory_is_plans(rec: dict, spec: RunSpec, *, total_rel: float = 0.05) -> tuple[dict, dict, Any, str]:
    """The tensor memory a cell's record measured against the plan's: the total within `total_rel`, the parameters
    and optimizer states within 1%. Returns (measured, predicted, the plan's Memory, a message) for more checks."""
    from harness.plan.memory import memory

    assert rec["status"] == "ok", rec.get("reason")
    got = rec["metrics"]["memory_gib"]
    plan = memory(spec, device="cpu")
    want = plan.gib()
    why = f"\nmeasured {got}\npredicted {want} at the {plan.window}\n{plan.notes}"
    assert got["total"] == pytest.approx(want["total"], rel=total_rel), why
    for state in ("params", "optimizer"):
        assert got[state] == pytest.approx(want[state], rel=0.01), f"{state}{why}"
    return got, want, plan, why
