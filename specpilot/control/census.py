"""Containment and census: which processes a comparison started, and who else took CPU or GPU time.

Containment. Every worker makes itself a *child subreaper* at start-up (`worker_main.py`), so a
process its runner starts stays in the worker's tree even after a double fork and `setsid`: an
orphan is re-parented to the nearest subreaper above it, the worker, not to init. `Worker` finds
that tree here (`descendants`), stops every process of it with its arm (`stop_tree`), continues
them with it and kills them all when it closes (`kill_tree`); every (pid, start time) it has seen
is remembered, so a process that left the tree after being seen is still found and killed.

Census. Around every timed block a worker pair (`pair.py`; shared trusted workers, which run no
candidate's code, take none) samples the CPU time (utime + stime) of every process
on the machine and, when a device is a GPU, `nvidia-smi`'s compute-process list. The controller's
own process tree (itself, every worker, everything they started) is *known*; any other process
that took CPU during the block (or is on the GPU list) is either

    foreign      a process started after the comparison began that is ours by evidence — it was
                 once in a worker's tree, is in a worker's session or process group, or carries a
                 worker's environment marker — or that hangs, through processes as new as itself,
                 off the process where orphans of the controller's tree land (init, or the nearest
                 subreaper above the controller: where a worker's orphan goes when the worker has
                 switched its subreaper off);
    background   everything else: pre-existing load and other people's new processes, reported.

A block is void when its foreign processes took more than `VOID_CPU_SHARE` of its wall time
(and at least `VOID_MIN_CPU_S`), or when a foreign process is on the GPU list; the controller
re-runs void blocks, within a bound (`controller.MAX_VOID_BLOCKS`), then voids the evaluation.

Linux only (/proc). Elsewhere the process table is empty: nothing is tracked beyond the worker's
process group, and no block is ever void. Not seen: a foreign process that starts and exits
between two samples and is reaped by init (its time is charged to init, not to it); GPU processes
in another pid namespace than the controller's (`nvidia-smi` then lists pids that mean nothing
here; they are counted as `gpu_unmatched`).

Owns: reading /proc, the process tree, `Census`, `BlockCensus`, `CensusSummary`. Does not own
when workers are stopped (`worker.py`, `pair.py`) or what a void block means (`controller.py`).
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from dataclasses import asdict, dataclass
from typing import Iterable

MARKER_ENV = "SPECPILOT_CONTAINMENT"  # a per-worker random token in every worker's environment
VOID_CPU_SHARE = 0.05  # foreign CPU seconds / block wall seconds above which a block is void
VOID_MIN_CPU_S = 0.03  # ... and at least this much (a few of /proc's clock ticks, TICK_S)
PROC = "/proc"
TICK_S = 1.0 / os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 0.01


@dataclass(frozen=True)
class Proc:
    pid: int
    ppid: int
    start: int  # clock ticks after boot: (pid, start) names one process, whatever pid reuse does
    cpu: int  # utime + stime, clock ticks
    state: str  # R S D T Z ...
    name: str
    pgid: int = 0
    sid: int = 0


def read_proc(pid: int) -> Proc | None:
    """One process's /proc/PID/stat, or None if it is gone."""
    try:
        with open(f"{PROC}/{pid}/stat", "rb") as f:
            raw = f.read().decode(errors="replace")
    except OSError:
        return None
    name = raw[raw.find("(") + 1 : raw.rfind(")")]
    rest = raw[raw.rfind(")") + 2 :].split()
    # fields after the name, 0-based: state 0, ppid 1, pgrp 2, session 3, utime 11, stime 12, starttime 19
    return Proc(pid, int(rest[1]), int(rest[19]), int(rest[11]) + int(rest[12]), rest[0], name, int(rest[2]),
                int(rest[3]))


def process_table() -> dict[int, Proc]:
    """Every process on the machine (threads excluded); {} without /proc."""
    try:
        names = os.listdir(PROC)
    except OSError:
        return {}
    table = {}
    for name in names:
        if name.isdigit():
            p = read_proc(int(name))
            if p is not None:
                table[p.pid] = p
    return table


def descendants(table: dict[int, Proc], root: int) -> dict[int, Proc]:
    """Every process below `root` in `table` (root excluded)."""
    children: dict[int, list[int]] = {}
    for p in table.values():
        children.setdefault(p.ppid, []).append(p.pid)
    out, todo = {}, list(children.get(root, ()))
    while todo:
        pid = todo.pop()
        if pid not in out and pid != root:
            out[pid] = table[pid]
            todo.extend(children.get(pid, ()))
    return out


def alive(pid: int, start: int) -> bool:
    """The process (pid, start) still exists and is not a zombie."""
    p = read_proc(pid)
    return p is not None and p.start == start and p.state not in "ZX"


def signal_process(pid: int, start: int, sig: int) -> bool:
    """Send `sig` to (pid, start) unless the pid now names another process."""
    p = read_proc(pid)
    if p is None or p.start != start:
        return False
    try:
        os.kill(pid, sig)
    except (ProcessLookupError, PermissionError):
        return False
    return True


def _settle(procs: dict[int, int], stopped: str, timeout: float) -> None:
    """Wait (briefly) until every process of `procs` shows a state in `stopped` or is gone: a
    signal takes effect when its target is next scheduled."""
    deadline = time.monotonic() + timeout
    pending = dict(procs)
    while pending and time.monotonic() < deadline:
        for pid, start in list(pending.items()):
            p = read_proc(pid)
            if p is None or p.start != start or p.state in stopped:
                del pending[pid]
        if pending:
            time.sleep(0.001)


def stop_tree(root: int, sig: int = signal.SIGSTOP, settle_s: float = 0.2) -> dict[int, int]:
    """Send `sig` to every descendant of `root` until a scan finds none it has not signalled
    (with SIGSTOP the root, signalled by the caller, and each signalled process are first seen
    stopped, so none forks after the last scan). Returns {pid: start} of the processes signalled."""
    done: dict[int, int] = {}
    me = read_proc(root)
    if sig == signal.SIGSTOP and me is not None:  # a root being stopped may be forking right now
        _settle({root: me.start}, "TtZX", settle_s)
    for _ in range(100):
        new = {pid: p.start for pid, p in descendants(process_table(), root).items() if done.get(pid) != p.start}
        if not new:
            break
        for pid, start in new.items():
            signal_process(pid, start, sig)
        done.update(new)
        _settle(new, "TtZX" if sig == signal.SIGSTOP else "ZX", settle_s)
    return done


def kill_tree(root: int | None, also: dict[int, int] | None = None, settle_s: float = 1.0) -> None:
    """SIGKILL every descendant of `root` (stopped first, so none forks meanwhile) and every
    process of `also` ({pid: start}) still alive; wait until they are gone or zombies."""
    targets = dict(also) if also else {}
    if root is not None:
        targets.update(stop_tree(root, signal.SIGSTOP, settle_s=0.05))
    for _ in range(10):
        live = {pid: start for pid, start in targets.items() if alive(pid, start)}
        if not live:
            return
        for pid, start in live.items():
            signal_process(pid, start, signal.SIGKILL)
        _settle(live, "ZX", settle_s)
        if root is not None:  # anything forked between the stop and the kill
            targets.update({pid: p.start for pid, p in descendants(process_table(), root).items()})


def environ_has(pid: int, item: bytes) -> bool:
    """Whether /proc/PID/environ holds the exact entry `item` (b"NAME=value")."""
    try:
        with open(f"{PROC}/{pid}/environ", "rb") as f:
            return item in f.read().split(b"\0")
    except OSError:
        return False


def gpu_compute_pids() -> frozenset[int] | None:
    """Pids on any GPU's compute-process list, or None when `nvidia-smi` is not there or fails."""
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return None
    try:
        out = subprocess.run([exe, "--query-compute-apps=pid", "--format=csv,noheader"], capture_output=True,
                             text=True, timeout=20, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    return frozenset(int(x) for x in out.split() if x.strip().isdigit())


def orphan_landing() -> set[int]:
    """Where an orphan of this process's tree is re-parented (the nearest subreaper above it, else
    init), found by orphaning a short `sleep`; {} when that cannot be done."""
    try:
        out = subprocess.run(["sh", "-c", "sleep 5 >/dev/null 2>&1 & echo $!"], capture_output=True, text=True,
                             timeout=5, check=True).stdout
        pid = int(out.split()[0])
    except (OSError, subprocess.SubprocessError, ValueError, IndexError):
        return set()
    p = read_proc(pid)
    if p is not None:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
    return {p.ppid} if p is not None and p.ppid != os.getpid() else set()


@dataclass(frozen=True)
class Snapshot:
    time: float  # time.monotonic()
    table: dict
    gpu: frozenset[int] | None


@dataclass(frozen=True)
class BlockCensus:
    """Who took CPU (and the GPU) between two samples around one timed block."""

    wall_s: float
    foreign_cpu_s: float  # CPU of foreign processes (see the module docstring)
    background_cpu_s: float  # CPU of every other process outside the controller's tree
    foreign: tuple[str, ...] = ()  # "pid name cpu_s why" per foreign process that ran
    gpu_foreign: tuple[int, ...] = ()  # foreign pids on the GPU list
    gpu_background: int = 0  # other processes of ours-pid-namespace on the GPU list, outside the tree
    gpu_unmatched: int = 0  # pids on the GPU list that do not exist here (another pid namespace)
    gpu_checked: bool = False

    @property
    def void(self) -> bool:
        cpu = self.foreign_cpu_s > max(VOID_CPU_SHARE * self.wall_s, VOID_MIN_CPU_S)
        return cpu or bool(self.gpu_foreign)

    @property
    def background_share(self) -> float:
        """Background CPU seconds per wall second (2.0: two cores' worth of other load)."""
        return self.background_cpu_s / self.wall_s if self.wall_s > 0 else 0.0

    def to_dict(self) -> dict:
        d = asdict(self)
        d.update(foreign=list(self.foreign), gpu_foreign=list(self.gpu_foreign), void=self.void)
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "BlockCensus":
        d = {k: v for k, v in d.items() if k != "void"}
        return cls(**{**d, "foreign": tuple(d.get("foreign", ())), "gpu_foreign": tuple(d.get("gpu_foreign", ()))})


@dataclass(frozen=True)
class CensusSummary:
    """The census of one evaluation's timed blocks (void ones included), for the record."""

    blocks: int
    void_blocks: int
    foreign_cpu_s: float
    background_cpu_s: float
    max_background_share: float
    foreign: tuple[str, ...]  # the first few foreign processes seen
    gpu_checked: bool

    @classmethod
    def of(cls, censuses: Iterable[BlockCensus]) -> "CensusSummary":
        cs = list(censuses)
        foreign = tuple(dict.fromkeys(f for c in cs for f in c.foreign))[:20]
        return cls(len(cs), sum(c.void for c in cs), sum(c.foreign_cpu_s for c in cs),
                   sum(c.background_cpu_s for c in cs), max((c.background_share for c in cs), default=0.0),
                   foreign, any(c.gpu_checked for c in cs))

    def to_dict(self) -> dict:
        d = asdict(self)
        d["foreign"] = list(self.foreign)
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "CensusSummary":
        return cls(**{**d, "foreign": tuple(d.get("foreign", ()))})


class Census:
    """The process census of one worker pair, seen from the controller's process `root`."""

    def __init__(self, markers: Iterable[str] = (), gpu: bool = False, root: int | None = None):
        self.root = os.getpid() if root is None else root
        table = process_table()
        self.baseline = {(p.pid, p.start) for p in table.values()}
        self.landing = orphan_landing() | {1}  # where an orphan of the controller's tree is re-parented
        self.markers = [f"{MARKER_ENV}={m}".encode() for m in markers]
        self.gpu = gpu and gpu_compute_pids() is not None
        self.suspects: dict[tuple[int, int], str] = {}  # (pid, start) -> why, for every foreign process seen
        self._last: Snapshot | None = None

    def add_markers(self, markers: Iterable[str]) -> None:
        self.markers.extend(f"{MARKER_ENV}={m}".encode() for m in markers)

    def snapshot(self) -> Snapshot:
        s = Snapshot(time.monotonic(), process_table(), gpu_compute_pids() if self.gpu else None)
        self._last = s
        return s

    def begin(self, max_age_s: float = 1.0) -> Snapshot:
        """The sample a block starts from: the last one if it is recent (the end of the previous
        block: one scan, and one `nvidia-smi` call, per block), else a fresh one."""
        last = self._last
        if last is not None and time.monotonic() - last.time <= max_age_s:
            return last
        return self.snapshot()

    def judge(self, before: Snapshot, after: Snapshot, tracked: dict[int, int],
              workers: Iterable[int] = ()) -> BlockCensus:
        """The census of the span between two samples; `tracked`: {pid: start} of every process ever
        seen in a worker's tree; `workers`: the workers' pids (each leads its own session)."""
        table = after.table
        known = {self.root, *descendants(table, self.root)}
        workers = set(workers)
        foreign, notes = 0, []
        background = 0
        for pid, p in table.items():
            if pid in known:
                continue
            prev = before.table.get(pid)
            ticks = p.cpu - prev.cpu if prev is not None and prev.start == p.start else p.cpu
            on_gpu = after.gpu is not None and pid in after.gpu
            if ticks <= 0 and not on_gpu:
                continue
            why = self._why(p, table, tracked, workers)
            if why:
                foreign += ticks
                self.suspects[pid, p.start] = why
                notes.append(f"{pid} {p.name} {ticks * TICK_S:.2f}s {why}")
            else:
                background += ticks
        gpu_foreign, gpu_background, gpu_unmatched = [], 0, 0
        for pid in sorted(after.gpu or ()):
            if pid in known:
                continue
            if pid not in table:
                gpu_unmatched += 1
            elif self._why(table[pid], table, tracked, workers):
                gpu_foreign.append(pid)
            else:
                gpu_background += 1
        return BlockCensus(after.time - before.time, foreign * TICK_S, background * TICK_S, tuple(notes),
                           tuple(gpu_foreign), gpu_background, gpu_unmatched, after.gpu is not None)

    def _why(self, p: Proc, table: dict[int, Proc], tracked: dict[int, int], workers: set[int]) -> str:
        """Why `p` (outside the controller's tree) is foreign, or "" for background."""
        if tracked.get(p.pid) == p.start:
            return "left-a-worker-tree"
        if (p.pid, p.start) in self.baseline:
            return ""
        if p.sid in workers or p.pgid in workers:
            return "worker-session"
        if self.markers and any(environ_has(p.pid, m) for m in self.markers):
            return "worker-environment"
        cur = p
        for _ in range(256):  # up through processes newer than the comparison
            if cur.ppid in self.landing:
                return "orphan"
            parent = table.get(cur.ppid)
            if parent is None or (parent.pid, parent.start) in self.baseline:
                return ""
            if tracked.get(parent.pid) == parent.start:
                return "left-a-worker-tree"
            cur = parent
        return ""

    def sweep(self, tracked: dict[int, int]) -> None:
        """Kill every live process that is ours by evidence: seen in a worker's tree, or carrying a
        worker's marker (orphans without either are only reported: they might be anyone's)."""
        targets = dict(tracked)
        for p in process_table().values():
            if (p.pid, p.start) not in self.baseline and p.pid != self.root and self.markers \
                    and any(environ_has(p.pid, m) for m in self.markers):
                targets[p.pid] = p.start
        kill_tree(None, targets)
