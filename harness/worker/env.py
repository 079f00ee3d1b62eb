"""The environment a record was measured in: versions, device, hosts, scheduler job."""

from __future__ import annotations

import os
import platform
import socket
import subprocess
import sys
import warnings
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


COLLECTIVE_RENAMES = r"`torch\.distributed\.\w+` is deprecated\. Please use `torch\.distributed\.\w+_single` instead"
"""torch 2.13's deprecation of all_gather_into_tensor / reduce_scatter_tensor for the *_single names"""


def silence_collective_renames() -> None:
    """Drop torch's FutureWarning for the renamed collectives: FSDP and DeepSpeed call the old names on every
    collective (a calibration printed about 80 such lines); the harness's own calls use the new names where torch
    has them. Other warnings are untouched."""
    warnings.filterwarnings("ignore", message=COLLECTIVE_RENAMES, category=FutureWarning)


def git_sha() -> str | None:
    """The harness checkout's commit (suffixed -dirty with uncommitted changes); None outside a checkout."""
    try:
        sha = subprocess.run(
            ["git", "-C", str(REPO), "rev-parse", "--short=12", "HEAD"], capture_output=True, text=True, timeout=5
        ).stdout.strip()
        if not sha:
            return None
        dirty = subprocess.run(
            ["git", "-C", str(REPO), "status", "--porcelain", "--untracked-files=no"],
            capture_output=True,
            text=True,
            timeout=5,
        ).stdout.strip()
        return sha + ("-dirty" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        return None


def capture(device_type: str) -> dict:
    """Versions and device facts of this process (call after torch is imported and the device is set)."""
    import torch

    env: dict = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "nccl": None,
        "deepspeed": None,
        "transformers": None,
        "device_type": device_type,
        "device_name": "cpu",
        "device_count": None,
        "device_memory_gib": None,
        "cpu_count": os.cpu_count(),
        "torch_num_threads": torch.get_num_threads(),
        "allow_tf32": torch.backends.cuda.matmul.allow_tf32,
        "hostname": socket.gethostname(),
        "slurm_job_id": os.environ.get("SLURM_JOB_ID"),
    }
    if device_type == "cuda":
        env["device_name"] = torch.cuda.get_device_name()
        env["device_count"] = torch.cuda.device_count()
        env["device_memory_gib"] = torch.cuda.get_device_properties(torch.cuda.current_device()).total_memory / 2**30
        try:
            env["nccl"] = ".".join(map(str, torch.cuda.nccl.version()))
        except Exception:  # noqa: BLE001 - a build without NCCL
            env["nccl"] = None
    try:
        from importlib.metadata import version

        env["deepspeed"] = version("deepspeed")
    except Exception:  # noqa: BLE001 - not installed
        pass
    if "transformers" in sys.modules:  # NOTE: only where a cell imported it (implementation: transformers)
        env["transformers"] = version("transformers")
    return env
