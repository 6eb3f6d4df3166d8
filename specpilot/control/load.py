"""The machine load a timing was measured under, and whether two loads are comparable.

Paired timing cancels slow drifts, but not a neighbour that competes for the cores, the memory bus
or the GPU while one arm runs and not the other: a noise floor measured next to another timing run
came out 17.5% where a quiet machine gives a fraction of that. So every noise floor and every
evaluation carries a `Load`, read over the window it was measured in:

* `other_cpu_share` — the share of the machine's CPU time (all cores) that processes outside this
  run's process tree used during the window: busy time from `/proc/stat` minus the CPU time of
  this process and its descendants (workers, coding agents) from `/proc/<pid>/stat`. Hypervisor
  steal counts as others' use. 0.25 on a 4-core machine is one other core-saturating process.
* `loadavg` — the 1-minute load average at the end of the window (this run's processes included;
  kept for people, not compared).
* `other_timing_runs` — other SpecPilot timing runs on the same devices or memory seen during
  the window (`timing_lock.py`'s census).
* `contended` — timed without the timing lock, or alongside another timing run.

A stored noise floor is reused only under a comparable load (`not_comparable`): neither contended
and the other-process CPU shares within `SHARE_BAND` of each other.

The readings come from a `LoadProbe` (`ProcProbe` on Linux); tests pass a `FixedProbe`, so nothing
they decide depends on how busy the test machine is.

Owns: `Load`, `CpuTimes`, the probes (`ProcProbe`, `FixedProbe`), `not_comparable`. Does not own
locks or the census (`timing_lock.py`) or storing loads (`specpilot.memory`).
"""

from __future__ import annotations

import os
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Protocol

SHARE_BAND = 0.10  # other-process CPU shares further apart than this (of the machine) are not comparable


@dataclass(frozen=True)
class CpuTimes:
    """Cumulative CPU ticks at one instant (any unit, the same for all three)."""

    busy: int  # the whole machine: every core's non-idle time
    total: int  # the whole machine: busy + idle
    own: int  # this process and its descendants (exited ones included once reaped)


class LoadProbe(Protocol):
    def cpu(self) -> CpuTimes | None: ...  # None where the machine does not say

    def loadavg(self) -> float | None: ...

    def sleep(self, seconds: float) -> None: ...


@dataclass(frozen=True)
class Load:
    """The load over one measurement window (see the module docstring)."""

    device: str  # the device set timed on, e.g. "cuda:0 (GPU 3)" or "cpu"
    seconds: float  # length of the window
    other_cpu_share: float | None  # 0..1 of the machine's CPU time; None where /proc is missing
    loadavg: float | None
    cpus: int
    other_timing_runs: int = 0
    contended: bool = False

    @classmethod
    def between(cls, start: CpuTimes | None, end: CpuTimes | None, *, device: str, seconds: float,
                loadavg: float | None, cpus: int | None = None, other_timing_runs: int = 0,
                contended: bool = False) -> Load:
        return cls(device, seconds, other_share(start, end), loadavg, cpus or os.cpu_count() or 1,
                   other_timing_runs, contended or other_timing_runs > 0)

    def describe(self) -> str:
        """'others 12% of CPU, load 3.1 on 8 cores' (+ ', contended: 1 other timing run')."""
        share = "others' CPU share unknown" if self.other_cpu_share is None else \
            f"others {self.other_cpu_share:.0%} of CPU"
        text = share + (f", load {self.loadavg:.1f} on {self.cpus} cores" if self.loadavg is not None else "")
        if self.contended:
            runs = self.other_timing_runs
            text += ", contended: " + (f"{runs} other timing run(s)" if runs else "timed without the timing lock")
        return text

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict | None) -> Load | None:
        if not d:
            return None
        return cls(d["device"], d["seconds"], d.get("other_cpu_share"), d.get("loadavg"), d.get("cpus", 1),
                   d.get("other_timing_runs", 0), d.get("contended", False))


def other_share(start: CpuTimes | None, end: CpuTimes | None) -> float | None:
    """Share of the machine's CPU time used by processes outside our tree between two readings."""
    if start is None or end is None or end.total <= start.total:
        return None
    others = (end.busy - start.busy) - (end.own - start.own)
    return min(1.0, max(0.0, others / (end.total - start.total)))


def not_comparable(stored: Load | None, now: Load, band: float = SHARE_BAND) -> str | None:
    """Why a measurement made under `stored` should not stand in for one made under `now`, or None."""
    if now.contended:
        return "another timing run is active now" if now.other_timing_runs else "this run does not hold the timing lock"
    if stored is None:
        return "it carries no load record (stored before loads were recorded)"
    if stored.contended:
        return "it was measured under contention (another timing run)"
    a, b = stored.other_cpu_share, now.other_cpu_share
    if (a is None) != (b is None):
        return "the machine's load is unknown for one of the two"
    if a is not None and abs(a - b) > band:
        return f"other processes used {a:.0%} of the CPU then and {b:.0%} now (more than {band:.0%} apart)"
    return None


class ProcProbe:
    """Readings from Linux's /proc; None elsewhere."""

    def __init__(self, root: Path = Path("/proc"), pid: int | None = None):
        self.root, self.pid = root, pid or os.getpid()

    def cpu(self) -> CpuTimes | None:
        try:
            first = (self.root / "stat").read_text().split("\n", 1)[0].split()
        except OSError:
            return None
        # user nice system idle iowait irq softirq steal (guest time is already inside user)
        ticks = [int(x) for x in first[1:9]]
        ticks += [0] * (8 - len(ticks))
        idle = ticks[3] + ticks[4]
        busy = sum(ticks[:8]) - idle
        return CpuTimes(busy, busy + idle, self._tree_ticks())

    def _tree_ticks(self) -> int:
        """utime + stime + cutime + cstime of this process and every live descendant."""
        children: dict[int, list[int]] = {}
        ticks: dict[int, int] = {}
        for entry in self.root.iterdir():
            if not entry.name.isdigit():
                continue
            try:
                text = (entry / "stat").read_text()
            except OSError:  # exited while we looked
                continue
            fields = text[text.rfind(")") + 2 :].split()  # after "pid (comm) "; comm may hold spaces
            pid = int(entry.name)
            children.setdefault(int(fields[1]), []).append(pid)
            ticks[pid] = sum(int(x) for x in fields[11:15])
        total, stack = 0, [self.pid]
        while stack:
            pid = stack.pop()
            total += ticks.get(pid, 0)
            stack += children.get(pid, [])
        return total

    def loadavg(self) -> float | None:
        try:
            return os.getloadavg()[0]
        except OSError:
            return None

    def sleep(self, seconds: float) -> None:
        time.sleep(seconds)


class FixedProbe:
    """A machine whose other processes use a fixed `share` of the CPU (assign it to change the load)
    and that never sleeps: for tests, and wherever /proc's numbers should not decide."""

    def __init__(self, share: float = 0.0, loadavg: float = 0.0, ticks: int = 1000):
        self.share, self._loadavg, self._ticks = share, loadavg, ticks
        self._busy = self._total = 0

    def cpu(self) -> CpuTimes:
        self._total += self._ticks
        self._busy += round(self._ticks * self.share)
        return CpuTimes(self._busy, self._total, 0)

    def loadavg(self) -> float:
        return self._loadavg

    def sleep(self, seconds: float) -> None:
        pass


def default_probe() -> LoadProbe:
    """The probe used when none is passed (tests replace this function to stay deterministic)."""
    return ProcProbe()
