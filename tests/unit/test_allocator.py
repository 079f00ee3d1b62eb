"""cpu_allocator: a CPU rank that keeps freed memory stops paying the kernel for every step's large buffers.

Each probe runs in a fresh interpreter (malloc's settings are per process and cannot be undone), allocates and frees
the same three large tensors per "step", as a training step does, and counts the minor page faults of the steps
after the first few (getrusage): with glibc's defaults the buffers above the mmap threshold (32 MiB at most) are
mapped and faulted in again every step; kept, they are not."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from harness.core.errors import InputError
from harness.plan import calibration as cal
from harness.scenario.cluster import load_cluster, parse_cluster

PROBE = r"""
import json, resource, sys, torch
from harness.worker import allocator
used = allocator.apply(sys.argv[1], "cpu")
def faults():
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt
per_step = []
for step in range(12):
    f0 = faults()
    xs = [torch.ones(n) for n in (16 * 2**20, 12 * 2**20, 4 * 2**20)]  # 64, 48 and 16 MiB
    del xs
    per_step.append(faults() - f0)
print(json.dumps({"used": used, "faults": per_step}))
"""


def probe(choice: str) -> dict:
    out = subprocess.run([sys.executable, "-c", PROBE, choice], capture_output=True, text=True, check=True).stdout
    return json.loads(out.splitlines()[-1])


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt: Linux only")
def test_kept_memory_is_not_faulted_in_again_every_step():
    caching, system = probe("caching"), probe("system")
    assert caching["used"].startswith("caching (glibc ") and system["used"].startswith("system")
    # the last four steps: by then the kept heap has grown to hold the step's buffers (torch asks for 64-byte aligned
    # blocks, a little more than a freed block of the same size, so the heap takes a few steps to get there; a
    # training step gets there in three or four, docs/time-model.md)
    kept, returned = sum(caching["faults"][8:]), sum(system["faults"][8:])
    # glibc's defaults: the 64 and 48 MiB buffers are mapped afresh each step (28,672 pages of 4 KiB; fewer where
    # transparent huge pages are always on), so every step faults
    assert min(system["faults"][8:]) > 0
    assert kept * 20 < returned, (caching, system)


def test_a_profile_names_an_allocator_from_the_list():
    assert load_cluster("local").cpu_allocator == "caching"
    assert parse_cluster({"name": "x"}, "x.yaml").cpu_allocator == "caching"
    assert parse_cluster({"name": "x", "cpu_allocator": "system"}, "x.yaml").cpu_allocator == "system"
    with pytest.raises(InputError) as e:
        parse_cluster({"name": "x", "cpu_allocator": "jemalloc"}, "x.yaml")
    msg = str(e.value)
    assert "x.yaml" in msg and "cpu_allocator" in msg and "'jemalloc'" in msg and "caching" in msg and "system" in msg


def test_a_calibration_measured_with_the_other_allocator_is_refused(tmp_path, monkeypatch):
    """Step times on a CPU move with the allocator (ZeRO-3 by a third on the development host), so a file measured
    with glibc's defaults does not describe ranks that keep their memory; a file from before the key existed was
    measured with the defaults."""
    cluster = load_cluster("local")
    for i, fp in enumerate(({"cpu_allocator": "system"}, {}, {"cpu_allocator": "caching"})):
        data = cal.example_calibration("local")
        data["fingerprint"].pop("cpu_allocator")
        data["fingerprint"].update(fp)
        (tmp_path / str(i)).mkdir()
        (tmp_path / str(i) / f"local{cal.SUFFIX}").write_text(json.dumps(data))
        monkeypatch.setenv(cal.CALIBRATION_DIR_ENV, str(tmp_path / str(i)))
        if fp.get("cpu_allocator") == "caching":
            assert isinstance(cal.rates_for(cluster), cal.CalibratedRates)
            continue
        with pytest.raises(cal.CalibrationMismatch, match="measured with cpu_allocator 'system'.*now says 'caching'"):
            cal.rates_for(cluster)
