"""Every environment knob SpecPilot reads, declared once.

Nothing else in the package reads `os.environ`; code asks this module. Values are read at call
time (not import time) so tests can set them with monkeypatch.
"""

from __future__ import annotations

import os
from pathlib import Path

import torch


def default_device() -> torch.device:
    """`SPECPILOT_DEVICE` if set, else cuda when available, else cpu."""
    name = os.environ.get("SPECPILOT_DEVICE")
    if name:
        return torch.device(name)
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def default_dtype(device: torch.device) -> torch.dtype:
    """bf16 on GPU, float32 on CPU (`SPECPILOT_DTYPE=float32|bfloat16|float16` overrides)."""
    name = os.environ.get("SPECPILOT_DTYPE")
    if name:
        return {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[name]
    return torch.bfloat16 if device.type == "cuda" else torch.float32


def triton_interpret() -> bool:
    """True when Triton kernels run under the CPU interpreter (`TRITON_INTERPRET=1`)."""
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


def home() -> Path:
    """Where SpecPilot keeps its memory database and run outputs (`SPECPILOT_HOME`)."""
    return Path(os.environ.get("SPECPILOT_HOME", Path.home() / ".specpilot"))


def coding_agent_command() -> str | None:
    """Template of the external coding-agent command (`SPECPILOT_CODING_AGENT`), if configured."""
    return os.environ.get("SPECPILOT_CODING_AGENT") or None
