"""`Worker`: one arm's runner in its own process, seen from the controller's side.

Each worker is a fresh Python interpreter (`worker_main.py`, not a fork), in its own session and
process group, pinned to one device through `CUDA_VISIBLE_DEVICES` with NVLink multicast off
(`env.worker_environment`). It talks JSON over a private socket pair; its stdout and stderr go
to a log file whose tail is quoted when it fails.

Isolation guarantees: a candidate's code never runs in the controller's process (nothing it sends
is unpickled), never shares a process with the other arm, and cannot touch the controller's
clock; request-to-response times are taken here, around the round trip.

Containment: the worker is a child subreaper (`worker_main.py`), so everything its runner starts
stays in its process tree, double fork and `setsid` included. `freeze()` SIGSTOPs the process
group and then every process of the tree (`census.stop_tree`), so an idle arm cannot steal CPU
from the arm being timed, through a helper process either; `thaw()` continues them; `close()`
kills the whole tree, and every process ever seen in it, before and after the worker exits. Each
worker carries a random marker in its environment (`census.MARKER_ENV`) for the census.

Not defended here (the guard, the census and the re-measurement are the backstops): GPU work an
arm queued before replying still drains while the other arm is timed (a signal cannot recall
kernels); a runner that switches the worker's subreaper off and orphans a process between two
scans gets it re-parented to init, outside the tree (the census voids blocks it runs in; it is
killed at the end only if it kept the marker); code that rewrites CUDA_VISIBLE_DEVICES before
CUDA initialises can see the other GPU. Without /proc (not Linux) only the process group is
stopped and killed.

Owns: starting, talking to, freezing and killing one worker; validating that replies are well
formed. Does not own what requests are sent when (`pair.py`).
"""

from __future__ import annotations

import enum
import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from multiprocessing.connection import Connection
from pathlib import Path

from specpilot.control.arm import ArmSpec
from specpilot.control.census import MARKER_ENV, descendants, kill_tree, process_table, signal_process, stop_tree
from specpilot.errors import SpecPilotError

WORKER_MAIN = Path(__file__).with_name("worker_main.py")
MAX_REPLY_BYTES = 1 << 30

_spawner: ThreadPoolExecutor | None = None
_spawner_lock = threading.Lock()


def spawn(start):
    """`start()` (a `subprocess.Popen`) run on one thread that lives as long as this process.

    A worker asks for SIGKILL when its parent dies (PR_SET_PDEATHSIG, `worker_main.py`), and Linux
    sends it when the *thread* that forked the worker exits, not the process: a worker started
    from a short-lived thread (a round's screening pool) would be killed when that thread ended,
    between two of its requests."""
    global _spawner
    with _spawner_lock:
        if _spawner is None:
            _spawner = ThreadPoolExecutor(max_workers=1, thread_name_prefix="worker-spawner")
    return _spawner.submit(start).result()


def _forget_spawner() -> None:
    global _spawner
    _spawner = None  # a forked child has none of its parent's threads: it starts its own spawner


os.register_at_fork(after_in_child=_forget_spawner)


class FailureKind(enum.Enum):
    RAISED = "raised"  # the runner raised; the worker reported it
    CRASHED = "crashed"  # the process died
    TIMEOUT = "timeout"  # no reply within the limit
    PROTOCOL = "protocol"  # a reply that is not the agreed JSON, or malformed outputs


class WorkerError(SpecPilotError):
    """A worker failed; `kind` says how."""

    def __init__(self, message: str, kind: FailureKind):
        super().__init__(message)
        self.kind = kind


class Worker:
    """A started worker process; build it with `Worker.start`."""

    def __init__(self, spec: ArmSpec, label: str, proc: subprocess.Popen, conn: Connection, log_path: Path,
                 device: str | None = None, marker: str = ""):
        self.spec = spec  # as the worker sees it (its one GPU is cuda:0)
        self.device = device  # as the controller placed it ("cuda:1")
        self.label = label
        self.proc = proc
        self.conn = conn
        self.log_path = log_path
        self.marker = marker  # the value of MARKER_ENV in its environment
        self.frozen = False
        self.crashed = False  # its process was found dead: its log is kept (`log_path`)
        self.info: dict = {}
        self.tracked: dict[int, int] = {}  # {pid: start} of every process ever seen in its tree
        self._stopped: dict[int, int] = {}  # descendants stopped by the last freeze

    @classmethod
    def start(cls, spec: ArmSpec, label: str, log_dir: Path, cpus: tuple[int, ...] | None = None) -> "Worker":
        """Spawn the process (from `spawn`'s thread, whichever thread asks); `build` must follow
        (kept apart so several can load at once).
        `cpus`: the cores it pins itself to (`specpilot.control.cpus`), None for no pinning."""
        from specpilot import env  # imports torch: only where workers are started
        from specpilot.control.cpus import CPUS_ENV

        environment = env.worker_environment(spec.device)
        if cpus:
            environment[CPUS_ENV] = ",".join(map(str, cpus))
            environment.setdefault("OMP_NUM_THREADS", str(len(cpus)))
        else:
            environment.pop(CPUS_ENV, None)
        marker = secrets.token_hex(8)
        environment[MARKER_ENV] = marker
        ours, theirs = socket.socketpair()
        log_path = Path(log_dir) / f"{label}.log"
        try:
            with open(log_path, "wb") as log:
                proc = spawn(lambda: subprocess.Popen(
                    [sys.executable, "-u", str(WORKER_MAIN), str(theirs.fileno()), str(os.getpid())],
                    pass_fds=(theirs.fileno(),),
                    stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                    env=environment, start_new_session=True,
                ))
        finally:
            theirs.close()
        # the runner sees its one visible GPU as cuda:0
        local = spec.placed("cuda:0" if spec.device and spec.device.startswith("cuda") else spec.device)
        return cls(local, label, proc, Connection(ours.detach()), log_path, spec.device, marker)

    # ---- messages ----------------------------------------------------------------------
    def send(self, msg: dict) -> None:
        self.send_bytes(json.dumps(msg).encode())

    def send_bytes(self, data: bytes) -> None:
        """Send an encoded request (encode before starting a clock)."""
        self.thaw()
        try:
            self.conn.send_bytes(data)
        except OSError as err:
            raise self._failure(f"cannot send: {err}; {self._ended()}", FailureKind.CRASHED) from None

    def wait_ready(self, timeout: float) -> None:
        """Block until a reply (or EOF) is readable; raise TIMEOUT otherwise."""
        if not self.conn.poll(timeout):
            raise self._failure(f"no reply within {timeout:.0f} s", FailureKind.TIMEOUT)

    def receive(self) -> dict:
        """Read one reply after `wait_ready`; raise unless it is {"ok": true, ...}."""
        try:
            raw = self.conn.recv_bytes(MAX_REPLY_BYTES)
        except (EOFError, OSError):
            raise self._failure(f"died: {self._ended()}", FailureKind.CRASHED) from None
        try:
            reply = json.loads(raw)
        except (UnicodeDecodeError, ValueError):
            raise self._failure("sent a reply that is not JSON", FailureKind.PROTOCOL) from None
        if not isinstance(reply, dict) or "ok" not in reply:
            raise self._failure("sent a reply without 'ok'", FailureKind.PROTOCOL)
        if reply["ok"] is not True:
            raise self._failure(f"raised {reply.get('error', '?')}", FailureKind.RAISED, reply.get("traceback", ""))
        return reply

    def request(self, msg: dict, timeout: float) -> dict:
        self.send(msg)
        self.wait_ready(timeout)
        return self.receive()

    # ---- process control -----------------------------------------------------------------
    def track(self, table: dict | None = None) -> dict[int, int]:
        """{pid: start} of the worker's live descendants now (from `table`, else a fresh scan);
        remembered in `tracked`."""
        tree = {pid: p.start for pid, p in descendants(process_table() if table is None else table,
                                                       self.proc.pid).items()}
        self.tracked.update(tree)
        return tree

    def freeze(self) -> None:
        """Stop the worker and every process of its tree (not only its process group)."""
        if not self.frozen and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGSTOP)  # first the worker: it starts nothing more
            self._stopped = stop_tree(self.proc.pid)
            self.tracked.update(self._stopped)
            self.frozen = True

    def thaw(self) -> None:
        if self.frozen:
            for pid, start in self._stopped.items():
                signal_process(pid, start, signal.SIGCONT)
            self._stopped = {}
            if self.proc.poll() is None:
                os.killpg(self.proc.pid, signal.SIGCONT)
            self.frozen = False

    def close(self, grace: float = 5.0) -> None:
        """Kill every process the worker started, ask it to exit, kill its process group if it
        does not within `grace` s; then kill whatever was ever seen in its tree and still lives."""
        try:
            if self.proc.poll() is None:
                kill_tree(self.proc.pid, self.tracked)  # while the worker lives its tree is whole
                try:
                    self.request({"op": "close"}, grace)
                    self.proc.wait(grace)
                except (WorkerError, subprocess.TimeoutExpired):
                    pass
        finally:
            if self.proc.poll() is None:
                try:
                    os.killpg(self.proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                self.proc.wait()
            kill_tree(None, self.tracked)
            self.conn.close()

    def _failure(self, what: str, kind: FailureKind, detail: str = "") -> WorkerError:
        tail = detail.strip().splitlines()[-1:] if detail else self._log_tail()
        suffix = f" ({tail[-1].strip()})" if tail else ""
        if kind is FailureKind.CRASHED:
            self.crashed = True
            suffix += f"; its output: {self.log_path}"
        return WorkerError(f"worker {self.label} ({self.spec.name}) {what}{suffix}", kind)

    def _ended(self, wait: float = 1.0) -> str:
        """How the process ended ("killed by SIGKILL", "exit status 1"), waiting up to `wait` s for it."""
        try:
            code = self.proc.wait(wait)
        except subprocess.TimeoutExpired:
            return "the process is still running"
        if code < 0:
            try:
                return f"killed by {signal.Signals(-code).name}"
            except ValueError:
                return f"killed by signal {-code}"
        return f"exit status {code}"

    def _log_tail(self, lines: int = 1) -> list[str]:
        time.sleep(0.05)  # let a dying process flush its last line
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return []
        return [line for line in text.splitlines() if line.strip()][-lines:]
