"""The timing lock: one timing run at a time per device and per memory, machine-wide.

Two `specpilot run` on one machine skew each other's timings (their noise floors came out 17.5% and
9.8%), and both stored their verdicts for good. So whatever times — a loop run, `specpilot
evaluate`, a noise measurement — holds a `TimingLock` for as long as it times:

* lock files: `$SPECPILOT_HOME/locks/timing-<device>.lock` for each device of the set (the
  physical GPU behind `cuda:N` under `CUDA_VISIBLE_DEVICES`), and `<memory>.timing.lock` next to
  the memory database; each taken with `fcntl.flock(LOCK_EX)`, all or none. The kernel drops a
  flock when its holder dies, so a killed run never leaves a stale lock; the holder writes its pid,
  start time and command into the files for the others' messages.
* waiting: a second run prints one line, "waiting for another timing run (pid N, started T) to
  finish...", and polls until it gets the lock or `wait_s` runs out. With `wait_s == 0`
  (`--no-wait`) or on timeout it times anyway, without the lock: every `Load` it reads is then
  `contended`, which the memory stores with its noise floors and evaluations, and the loop does
  not take such verdicts as final. `try_acquire` takes the lock later if it has come free.
* census: each timing run, holding the lock or not, registers a file under
  `$SPECPILOT_HOME/locks/active/` and keeps a flock on it; `others()` counts the live entries that
  share a lock file with this one (a dead run's entry is unlocked, and removed when seen), so a
  run that started without waiting is seen by the one holding the lock too. A run that goes on
  without the lock also appends a line to `<lock file>.intruders`, so that one which came and
  went within a window is seen as well.
* `window()`: the `Load` (`load.py`) over a stretch of timing, census included.

A process must not take a second `TimingLock` on the same files while it holds one (flock locks
are per open file: it would wait for itself). Locks are advisory and local to one machine's
filesystem (flock over NFS is not to be trusted).

Owns: lock files, waiting, the census, load windows. Does not own what is timed or stored.
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import sys
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from specpilot import env
from specpilot.control import load as loads
from specpilot.control.load import Load, LoadProbe
from specpilot.errors import writing

DEFAULT_WAIT_S = 3600.0  # how long a second timing run waits for the first by default
POLL_S = 0.5
PROBE_S = 2.0  # length of the window `current()` reads the load over


@dataclass(frozen=True)
class Holder:
    """Who holds (or last held) a lock file."""

    pid: int
    started: str
    command: str = ""

    def describe(self) -> str:
        return f"pid {self.pid or '?'}, started {self.started}"

    @classmethod
    def read(cls, path: Path) -> Holder:
        try:
            d = json.loads(path.read_text())
            return cls(int(d["pid"]), str(d["started"]), str(d.get("command", "")))
        except (OSError, ValueError, KeyError, TypeError):  # being rewritten, or not ours
            return cls(0, "?")


def device_key(device: str) -> str:
    """A device's lock name: 'cpu', or 'cuda-<id>' for the physical GPU behind 'cuda:N'."""
    if device.startswith("cuda"):
        try:
            physical = env.worker_environment(device)["CUDA_VISIBLE_DEVICES"]
        except ValueError:
            physical = device.partition(":")[2] or "0"
        device = f"cuda-{physical}"
    return re.sub(r"[^A-Za-z0-9_.-]", "_", device)


def lock_paths(devices: Sequence[str], memory: str | Path | None, home: Path) -> list[Path]:
    """The lock files of a device set and a memory, in the order they are taken."""
    paths = {home / "locks" / f"timing-{device_key(d)}.lock" for d in devices}
    if memory is not None:
        memory = Path(memory).resolve()
        paths.add(memory.with_name(memory.name + ".timing.lock"))
    return sorted(paths)


def _intruders(lock_file: Path) -> Path:
    return lock_file.with_name(lock_file.name + ".intruders")


def _say(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


class TimingLock:
    """The right to time on `devices` with `memory` (see the module docstring). A context manager:
    `with TimingLock(...) as lock:` acquires (waiting per `wait_s`) and releases."""

    def __init__(self, devices: Sequence[str], memory: str | Path | None = None, *, wait_s: float = DEFAULT_WAIT_S,
                 say: Callable[[str], None] | None = None, probe: LoadProbe | None = None, home: Path | None = None,
                 poll_s: float = POLL_S, command: str | None = None):
        self.devices = tuple(devices) or ("cpu",)
        self.home = Path(home) if home is not None else env.home()
        self.paths = lock_paths(self.devices, memory, self.home)
        self.wait_s, self.poll_s = wait_s, poll_s
        self.say = say or _say
        self.probe = probe or loads.default_probe()
        self.me = Holder(os.getpid(), time.strftime("%Y-%m-%d %H:%M:%S"), command or " ".join(sys.argv))
        self.held = False
        self.waited_s = 0.0
        self._fds: list[int] = []
        self._entry: tuple[Path, int] | None = None

    @property
    def device(self) -> str:
        return ",".join(self.devices)

    # ---- the lock ------------------------------------------------------------------------------
    def acquire(self) -> bool:
        """Take the lock, waiting up to `wait_s` for a run that holds it; on timeout (or with no
        wait) go on without it, contended. Returns whether it is held."""
        start = time.monotonic()
        holder = busy = self._take()
        if busy is not None and self.wait_s > 0:
            self.say(f"waiting for another timing run ({busy.describe()}) to finish...")
            while holder is not None and time.monotonic() - start < self.wait_s:
                time.sleep(min(self.poll_s, max(0.0, self.wait_s - (time.monotonic() - start))))
                holder = self._take()
        self.waited_s = time.monotonic() - start if busy is not None else 0.0
        if holder is None and busy is not None:
            self.say(f"the other timing run finished; timing now (waited {self.waited_s:.0f} s)")
        elif holder is not None:
            why = f"gave up waiting after {self.waited_s:.0f} s" if self.wait_s > 0 else "not waiting (--no-wait)"
            self.say(f"another timing run ({holder.describe()}) is timing on {self.device} or with this memory: "
                     f"{why}; timing anyway, and what is timed now is marked as measured under contention")
        self._register()
        return self.held

    def try_acquire(self) -> bool:
        """Take the lock if it is free now (a run that went on without it); returns whether held."""
        if not self.held and self._take() is None:
            self.say("the timing lock is free now: timing uncontended from here on")
            self._register()
        return self.held

    def release(self) -> None:
        for fd in self._fds:
            os.close(fd)  # closing drops the flock
        self._fds, self.held = [], False
        self._unregister()

    def __enter__(self) -> TimingLock:
        self.acquire()
        return self

    def __exit__(self, *exc) -> None:
        self.release()

    def _take(self) -> Holder | None:
        """All lock files or none: None when taken, else the holder of the first busy one."""
        fds = []
        for path in self.paths:
            with writing(path, "the timing lock"):  # a read-only home: one error line, not a traceback
                path.parent.mkdir(parents=True, exist_ok=True)
                fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)  # not inherited by workers (O_CLOEXEC)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                for other in fds:
                    os.close(other)
                return Holder.read(path)
            fds.append(fd)
        data = json.dumps(asdict(self.me)).encode()
        for fd in fds:
            os.ftruncate(fd, 0)
            os.pwrite(fd, data, 0)
        self._fds, self.held = fds, True
        return None

    # ---- the census ----------------------------------------------------------------------------
    @property
    def _active(self) -> Path:
        return self.home / "locks" / "active"

    def _register(self) -> None:
        """(Re)write this run's census entry; written under a temporary name, locked, then renamed,
        so that no reader ever sees it unlocked."""
        self._unregister()
        self._active.mkdir(parents=True, exist_ok=True)
        name = f"{self.me.pid}-{uuid.uuid4().hex[:12]}"
        tmp = self._active / f"{name}.tmp"
        fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o666)
        fcntl.flock(fd, fcntl.LOCK_EX)
        entry = {**asdict(self.me), "locks": [str(p) for p in self.paths], "held": self.held}
        os.write(fd, json.dumps(entry).encode())
        path = tmp.with_suffix(".json")
        os.rename(tmp, path)
        self._entry = (path, fd)
        if not self.held:
            for lock_file in self.paths:
                with open(_intruders(lock_file), "a") as f:
                    f.write(f"{self.me.pid} {self.me.started}\n")

    def _unregister(self) -> None:
        if self._entry is not None:
            path, fd = self._entry
            path.unlink(missing_ok=True)
            os.close(fd)
            self._entry = None

    def others(self) -> int:
        """Other live timing runs (holding the lock or not) that share a lock file with this one."""
        if not self._active.is_dir():
            return 0
        mine, own = {str(p) for p in self.paths}, self._entry[0] if self._entry else None
        count = 0
        for path in self._active.glob("*.json"):
            if path == own:
                continue
            try:
                fd = os.open(path, os.O_RDONLY)
            except FileNotFoundError:
                continue
            try:
                try:
                    fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
                except BlockingIOError:  # its owner is alive
                    try:
                        locks = set(json.loads(path.read_text()).get("locks", ()))
                    except (OSError, ValueError):
                        continue
                    count += bool(locks & mine)
                else:  # nobody holds it: its run died without cleaning up
                    path.unlink(missing_ok=True)
            finally:
                os.close(fd)
        return count

    def intrusions(self) -> int:
        """A number that grows whenever a run starts timing on these lock files without the lock."""
        total = 0
        for lock_file in self.paths:
            try:
                total += _intruders(lock_file).stat().st_size
            except FileNotFoundError:
                pass
        return total

    # ---- loads ---------------------------------------------------------------------------------
    def window(self) -> Window:
        return Window(self)

    def current(self, seconds: float = PROBE_S) -> Load:
        """The load right now: read over a short window of `seconds` (census included)."""
        with self.window() as w:
            self.probe.sleep(seconds)
        return w.load


class Window:
    """The load over a stretch of timing: `with lock.window() as w: ...` then `w.load`. Contended
    when the lock was not held at either end, or another timing run was seen at either end."""

    def __init__(self, lock: TimingLock):
        self.lock = lock
        self.load: Load | None = None

    def __enter__(self) -> Window:
        self._held, self._others, self._intrusions = self.lock.held, self.lock.others(), self.lock.intrusions()
        self._t0, self._cpu = time.monotonic(), self.lock.probe.cpu()
        return self

    def __exit__(self, *exc) -> None:
        lock, probe = self.lock, self.lock.probe
        others = max(self._others, lock.others(), int(lock.intrusions() > self._intrusions))
        self.load = Load.between(self._cpu, probe.cpu(), device=lock.device, seconds=time.monotonic() - self._t0,
                                 loadavg=probe.loadavg(), other_timing_runs=others,
                                 contended=not (self._held and lock.held))
