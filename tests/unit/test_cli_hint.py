"""The sweep's last line names the commands to run next, runnable as printed: after `make sweep` the venv's bin is
not on PATH, and `harness report results` was `command not found` for a newcomer. (Issue 15, item 4.)"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
VENV_HARNESS = REPO / ".venv" / "bin" / "harness"


@pytest.mark.skipif(not VENV_HARNESS.exists(), reason="no .venv/bin/harness (make setup makes it)")
def test_the_next_commands_run_as_printed_without_the_venv_on_path(tmp_path):
    scenario = tmp_path / "hint.yaml"
    # a cell that is skipped (a hybrid on one node): the sweep ends in seconds, launching nothing
    scenario.write_text(
        "name: hint\nmatrix: {model: [tiny], strategy: [fsdp.hybrid_shard], precision: [fp32], gpus: [2]}\n"
    )
    venv_bin = str(VENV_HARNESS.parent)
    path = os.pathsep.join(d for d in os.environ.get("PATH", "").split(os.pathsep) if d and d != venv_bin)
    env = {k: v for k, v in os.environ.items() if k != "VIRTUAL_ENV"}
    env.update(PATH=path or "/usr/bin:/bin", HARNESS_NO_PREFORK="1")
    results = tmp_path / "results"
    run = subprocess.run(
        [".venv/bin/harness", "sweep", str(scenario), "--results", str(results)],  # as the Makefile calls it
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 1, run.stdout + run.stderr  # nothing ran: every cell skipped (docs/exit-codes.md)
    tail = run.stdout.strip().splitlines()[-3:]  # the records' folder, then one command a line (issue 48)
    assert re.fullmatch(r"records: (\S+)/  \(read them with:\)", tail[0]), tail
    report, status = (shlex.split(c) for c in tail[1:])
    assert report[0] == status[0] == ".venv/bin/harness"  # relative to the working directory, where it is
    assert report[1:] == ["report", str(results)] and status[1:] == ["status", str(results / "hint")]
    exe = REPO / report[0]
    assert exe.is_file() and os.access(exe, os.X_OK)
    again = subprocess.run(status, cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert again.returncode == 0, again.stderr
    assert "sweep 'hint'" in again.stdout and "1 skipped" in again.stdout
