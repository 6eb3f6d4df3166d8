"""Every environment knob SpecPilot reads, declared once.

Nothing else in the package reads `os.environ`; code asks this module. Values are read at call
time (not import time) so tests can set them with monkeypatch. The directories under the home are
made here too, and `writable_dir` / `writable_home` check that one takes files before a command
spends time on work it could not save.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

from specpilot.errors import writing

if TYPE_CHECKING:  # torch loads on first use: `specpilot --help` and `memory list` never need it
    import torch


def default_device() -> torch.device:
    """`SPECPILOT_DEVICE` if set, else cuda when available, else cpu."""
    import torch

    name = os.environ.get("SPECPILOT_DEVICE")
    if name:
        return torch.device(name)
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def default_dtype(device: torch.device) -> torch.dtype:
    """bf16 on GPU, float32 on CPU (`SPECPILOT_DTYPE=float32|bfloat16|float16` overrides)."""
    import torch

    name = os.environ.get("SPECPILOT_DTYPE")
    if name:
        return {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[name]
    return torch.bfloat16 if device.type == "cuda" else torch.float32


def resolve_device(name: "str | torch.device | None" = None) -> "torch.device":
    """`name` (None: `default_device()`) as a device this process can run on, else a one-line
    `ConfigError` (a CPU-only torch build, no GPU visible, a GPU index out of range, a bad name)."""
    import torch

    from specpilot.errors import ConfigError

    if name is None:
        name = os.environ.get("SPECPILOT_DEVICE") or default_device()  # the variable is checked like a flag
    try:
        dev = torch.device(name)
    except (RuntimeError, TypeError):
        raise ConfigError(f"unknown device {str(name)!r} (expected cpu, cuda or cuda:N)") from None
    if dev.type == "cuda":
        if not torch.backends.cuda.is_built():
            raise ConfigError(f"device {str(name)!r}: this torch ({torch.__version__}) is a CPU-only build "
                              "without CUDA; use cpu, or install a CUDA build of torch")
        count = torch.cuda.device_count()
        if count == 0:
            visible = os.environ.get("CUDA_VISIBLE_DEVICES")
            where = f" (CUDA_VISIBLE_DEVICES={visible!r})" if visible is not None else ""
            raise ConfigError(f"device {str(name)!r}: no CUDA GPU is visible{where}; use cpu")
        if dev.index is not None and dev.index >= count:
            raise ConfigError(f"device {str(name)!r}: only {count} CUDA GPU(s) visible (cuda:0 to cuda:{count - 1})")
    return dev


def triton_interpret() -> bool:
    """True when Triton kernels run under the CPU interpreter (`TRITON_INTERPRET=1`)."""
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


def pdl() -> bool:
    """True when `SPECPILOT_PDL=1`: the Triton kernels launch with programmatic dependent launch
    (`specpilot.kernels.launch.pdl`; Hopper and later)."""
    return os.environ.get("SPECPILOT_PDL", "0") == "1"


def home() -> Path:
    """Where SpecPilot keeps its memory database, run outputs and tuned kernel tables (`SPECPILOT_HOME`)."""
    return Path(os.environ.get("SPECPILOT_HOME", Path.home() / ".specpilot"))


def writable_dir(path: Path, what: str = "") -> Path:
    """`path`, created if missing, once a file could be written in it; else a one-line
    `StorageError` naming `what` and `path` (a read-only mount, another user's directory, a full
    disk). A probe file is written and removed: `os.access` trusts mode bits, which root ignores."""
    with writing(path, what):
        path.mkdir(parents=True, exist_ok=True)
        fd, probe = tempfile.mkstemp(dir=path, prefix=".write-check-")
        try:
            os.write(fd, b"x")  # a full disk may still take an empty file, not its first byte
        finally:
            os.close(fd)
            os.unlink(probe)
    return path


def writable_home() -> Path:
    """`home()` checked to take files (`writable_dir`): commands that write there call it before any work."""
    return writable_dir(home(), "SPECPILOT_HOME")


def worker_logs() -> Path:
    """Where worker processes write their output (`home()/workers`, created): one folder per
    comparison or shared worker pool, removed when its workers closed cleanly, kept when one died."""
    path = home() / "workers"
    with writing(path, "the workers' log directory"):
        path.mkdir(parents=True, exist_ok=True)
    return path


def coding_agent_command() -> str | None:
    """Template of the external coding-agent command (`SPECPILOT_CODING_AGENT`), if configured."""
    return os.environ.get("SPECPILOT_CODING_AGENT") or None


def memory_path() -> Path:
    """The memory database (`SPECPILOT_MEMORY`, default `home()/memory.sqlite`)."""
    path = os.environ.get("SPECPILOT_MEMORY")
    return Path(path) if path else home() / "memory.sqlite"


# Set for every worker process the controller starts: NVLink multicast (NVLS) stays off.
WORKER_MULTICAST_OFF = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}


def worker_environment(device: str | None) -> dict[str, str]:
    """Environment of an isolated worker pinned to `device`: this process's, multicast off, and
    `CUDA_VISIBLE_DEVICES` narrowed to that one GPU ("cuda:N" is the N-th GPU visible here;
    "cpu" hides every GPU; None leaves visibility as it is). The folder holding this `specpilot`
    package comes first on `PYTHONPATH`, so a worker imports the controller's code also when it
    runs from a checkout that is not installed (`python -m specpilot` in the repository)."""
    out = dict(os.environ)
    out.update(WORKER_MULTICAST_OFF)
    root = str(Path(__file__).resolve().parents[1])
    rest = [p for p in out.get("PYTHONPATH", "").split(os.pathsep) if p and p != root]
    out["PYTHONPATH"] = os.pathsep.join([root, *rest])
    if device is None:
        return out
    if device == "cpu":
        out["CUDA_VISIBLE_DEVICES"] = ""
        return out
    kind, _, index = device.partition(":")
    if kind != "cuda":
        raise ValueError(f"cannot pin a worker to device {device!r}")
    n = int(index or 0)
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    ids = [v.strip() for v in visible.split(",") if v.strip()] if visible is not None else None
    if ids is not None and n >= len(ids):
        raise ValueError(f"device {device!r}: only {len(ids)} GPU(s) visible (CUDA_VISIBLE_DEVICES={visible!r})")
    out["CUDA_VISIBLE_DEVICES"] = ids[n] if ids is not None else str(n)
    return out


def memory_check() -> bool:
    """Refuse a CPU load the memory estimate says does not fit (`engine.memory_check`);
    `SPECPILOT_MEMORY_CHECK=0` only notes it and loads anyway."""
    return os.environ.get("SPECPILOT_MEMORY_CHECK", "1") != "0"


def compile_enabled() -> bool:
    """Fuse elementwise ops with torch.compile on GPU (`SPECPILOT_COMPILE=0` turns it off)."""
    return os.environ.get("SPECPILOT_COMPILE", "1") != "0"


def source_commit() -> str | None:
    """Commit of a copied source tree (`SPECPILOT_COMMIT`), for provenance; when set it wins over
    what git says there (a copy's .git may be absent or stale)."""
    return os.environ.get("SPECPILOT_COMMIT") or None


def umask_mode() -> int:
    """The mode the user's umask gives a new file (0o666 & ~umask): read from /proc where Linux
    shows it, else by setting the umask and putting it back."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return 0o666 & ~int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0o077)  # the strictest mask while it is read: a file another thread makes meanwhile is private
    os.umask(mask)
    return 0o666 & ~mask
