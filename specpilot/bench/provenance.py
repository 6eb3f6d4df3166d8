"""Where a benchmark ran: git commit, device, library versions, host.

Owns `capture`, a plain-JSON dict stored in every results.json so a number can be traced to the
code and hardware that produced it. Reads only; never fails a run (unknown values are null).

Does not own the deployment or system configuration (they are serialised by their own classes).
"""

from __future__ import annotations

import os
import platform
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import numpy as np
import torch

import specpilot
from specpilot import env


def _git(*args: str) -> str | None:
    root = Path(specpilot.__file__).resolve().parents[1]
    try:
        out = subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


def git_state() -> dict:
    """Commit of the source checkout and whether tracked files differ from it (None outside git)."""
    if env.source_commit():  # named by whoever copied the tree (a GPU box's .git can be absent or stale)
        return {"git_commit": env.source_commit(), "git_dirty": None}
    commit = _git("rev-parse", "HEAD")
    status = _git("status", "--porcelain", "--untracked-files=no") if commit else None
    return {"git_commit": commit, "git_dirty": bool(status) if status is not None else None}


def _cpu_name() -> str | None:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or None


def device_info(device: torch.device) -> dict:
    info = {"device": str(device), "gpu": None, "gpu_count": 0, "cuda": torch.version.cuda,
            "driver": None, "gpu_memory_gib": None, "compute_capability": None,
            "cpu": _cpu_name(), "cpu_count": os.cpu_count(),
            "torch_threads": torch.get_num_threads()}
    if device.type == "cuda" and torch.cuda.is_available():
        index = device.index if device.index is not None else torch.cuda.current_device()
        props = torch.cuda.get_device_properties(index)
        info.update(gpu=props.name, gpu_count=torch.cuda.device_count(),
                    gpu_memory_gib=round(props.total_memory / 2**30, 1),
                    compute_capability=f"{props.major}.{props.minor}")
        try:
            out = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                                 capture_output=True, text=True, timeout=10)
            if out.returncode == 0:
                info["driver"] = out.stdout.splitlines()[0].strip() if out.stdout.strip() else None
        except (OSError, subprocess.SubprocessError):
            pass
    return info


def versions() -> dict:
    out = {"specpilot": specpilot.__version__, "python": sys.version.split()[0], "torch": torch.__version__,
           "numpy": np.__version__}
    for name in ("triton", "tokenizers", "matplotlib"):
        try:
            out[name] = metadata.version(name)  # without importing it
        except metadata.PackageNotFoundError:
            out[name] = None
    return out


def capture(device: torch.device, dtype: torch.dtype | None = None) -> dict:
    """Git commit, device (and the models' dtype), versions and host of this process, as plain JSON."""
    return {**git_state(), **device_info(torch.device(device)),
            "dtype": str(dtype).removeprefix("torch.") if dtype is not None else None,
            "versions": versions(), "platform": platform.platform(), "hostname": platform.node()}
