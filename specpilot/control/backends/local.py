"""`LocalBackend`: worker pairs as worker processes on this machine (the default backend).

The machine's devices are split into groups — one device per session when arms alternate, two
when they run side by side — and a session holds its group until it is closed, so with four GPUs
two side-by-side comparisons (or four alternating ones) can run at once.

A comparison of two knob-only systems (`shared.shareable`) runs in the backend's persistent
shared worker for its device (`shared.py`) when arms alternate; any other comparison gets a fresh
`WorkerPair` of isolated workers (`pair.py`).

Owns: device discovery, the device pool, the shared workers' lifetime, the device name for
fingerprints. Does not own the sessions themselves (`pair.py`, `shared.py`).
"""

from __future__ import annotations

import platform
import queue
from typing import Sequence

from specpilot.control.backends.base import devices_per_session, resolve_placement
from specpilot.control.config import ControllerConfig, Placement
from specpilot.control.pair import WorkerPair
from specpilot.control.shared import SharedPair, SharedWorkers, shareable
from specpilot.control.arm import ArmSpec
from specpilot.errors import ConfigError


def visible_devices() -> list[str]:
    """Every visible GPU as "cuda:i", else ["cpu"]."""
    import torch

    n = torch.cuda.device_count()
    return [f"cuda:{i}" for i in range(n)] if n else ["cpu"]


def device_name(device: str) -> str:
    """Marketing name of a device (torch's "NVIDIA ..."), or the CPU's architecture."""
    if device.startswith("cuda"):
        import torch

        return torch.cuda.get_device_name(int(device.partition(":")[2] or 0))
    return f"cpu-{platform.machine()}"


class _Lease:
    """A session that gives its devices back to the pool when closed."""

    def __init__(self, session: WorkerPair, release):
        self._session = session
        self._release = release
        self.generate = session.generate
        self.run_block = session.run_block

    def close(self) -> None:
        try:
            self._session.close()
        finally:
            release, self._release = self._release, None
            if release:
                release()


class LocalBackend:
    name = "local"

    def __init__(self, devices: Sequence[str] | None = None, placement: Placement = Placement.AUTO):
        self.devices = tuple(devices) if devices else tuple(visible_devices())
        self.placement = resolve_placement(placement, len(self.devices))
        per = devices_per_session(self.placement)
        groups = [self.devices[i : i + per] for i in range(0, len(self.devices) - per + 1, per)]
        if not groups:
            raise ConfigError(f"{self.placement.value} placement needs {per} devices, got {list(self.devices)}")
        self._free: queue.Queue = queue.Queue()
        for g in groups:
            self._free.put(g)
        self.parallelism = len(groups)
        self.shared = SharedWorkers()  # knob-only comparisons: persistent workers, one per device group

    def open(self, incumbent: ArmSpec, candidate: ArmSpec, config: ControllerConfig, warmup=()) -> _Lease:
        group = self._free.get()  # blocks while every group is in use
        try:
            if config.shared_workers and self.placement is Placement.ALTERNATE and shareable(incumbent, candidate):
                session = SharedPair(self.shared, incumbent, candidate, group[0], config, warmup)
            else:
                session = WorkerPair(incumbent, candidate, group, config, self.placement, warmup)
        except BaseException:
            self._free.put(group)
            raise
        return _Lease(session, lambda: self._free.put(group))

    def device_name(self) -> str:
        return device_name(self.devices[0])

    def close(self) -> None:
        self.shared.close()
