"""Fake runners for the controller's tests. Standard library only: they run inside worker processes.

Each follows the runner contract (`factory(spec)`, `warm`, `run`: `specpilot.control.arm`) for its
own arm's system, serving `run` from `generate` (what the subclasses vary), and reads its
behaviour from knobs in `spec.system`:

    seconds   sleep per prompt of a request (the runner's "speed")
    jitter    relative sd of a per-request lognormal jitter; `spike` adds a rare x(1+spike) outlier
    seed      seeds the jitter (deterministic per runner)

WORKDIR is the folder to give `ArmSpec.workdir` so a worker can import this module.
"""

from __future__ import annotations

import gc
import math
import os
import pickle
import random
import threading
import time
from pathlib import Path

WORKDIR = str(Path(__file__).resolve().parent)
TOKENS = 6  # tokens per output (capped by max_new_tokens)


def expected_tokens(prompt: list[int], max_new_tokens: int) -> list[int]:
    """What a lossless system generates for `prompt` in these tests."""
    return [(sum(prompt) * 31 + i) % 997 for i in range(min(TOKENS, max_new_tokens))]


def random_prompts(count: int, seed: int) -> list[list[int]]:
    """A PromptSource: `count` prompts of 3..10 ids, deterministic in seed."""
    rng = random.Random(seed)
    return [[rng.randrange(1, 500) for _ in range(rng.randint(3, 10))] for _ in range(count)]


def prompt_source_factory(deployment):
    """The CLI's prompt-source factory signature: (Deployment) -> PromptSource."""
    return random_prompts


class SpeedRunner:
    """Sleeps `seconds` per prompt (with jitter) and returns the expected tokens."""

    def __init__(self, spec):
        knobs = spec.system
        self.seconds = float(knobs.get("seconds", 0.01))
        self.jitter = float(knobs.get("jitter", 0.0))
        self.spike = float(knobs.get("spike", 0.0))
        self.rng = random.Random(int(knobs.get("seed", 0)))
        self.device = spec.device

    def warm(self, system, prompts, max_new_tokens):
        self.run(system, prompts, max_new_tokens)

    def run(self, system, prompts, max_new_tokens, stop_at_eos=True):
        return {"outputs": self.generate(prompts, max_new_tokens)}

    def _sleep(self, n_prompts: int) -> None:
        factor = math.exp(self.rng.gauss(0.0, self.jitter)) if self.jitter else 1.0
        if self.spike and self.rng.random() < 0.05:
            factor *= 1 + self.spike
        time.sleep(self.seconds * n_prompts * factor)

    def generate(self, prompts, max_new_tokens):
        self._sleep(len(prompts))
        return [expected_tokens(p, max_new_tokens) for p in prompts]


class ClockCheatRunner(SpeedRunner):
    """Slow for real, but patches every clock of its own process to run 100x slower (to look fast)."""

    def __init__(self, spec):
        super().__init__(spec)
        real = {name: getattr(time, name) for name in ("perf_counter", "time", "monotonic")}
        real_ns = {name: getattr(time, name) for name in ("perf_counter_ns", "time_ns", "monotonic_ns")}
        t0 = {name: f() for name, f in real.items()}
        t0_ns = {name: f() for name, f in real_ns.items()}
        for name, f in real.items():
            setattr(time, name, lambda f=f, base=t0[name]: base + (f() - base) / 100)
        for name, f in real_ns.items():
            setattr(time, name, lambda f=f, base=t0_ns[name]: base + (f() - base) // 100)


class WrongTokensRunner(SpeedRunner):
    """Fast, but generates different tokens (a lossy "optimization")."""

    def generate(self, prompts, max_new_tokens):
        self._sleep(len(prompts))
        return [[(t + 1) % 997 for t in expected_tokens(p, max_new_tokens)] for p in prompts]


class ShortOutputRunner(SpeedRunner):
    """Fast because it stops after one token."""

    def generate(self, prompts, max_new_tokens):
        self._sleep(len(prompts))
        return [expected_tokens(p, max_new_tokens)[:1] for p in prompts]


class BadOutputRunner(SpeedRunner):
    """Returns strings instead of token ids."""

    def generate(self, prompts, max_new_tokens):
        return [["x"] for _ in prompts]


class CrashRunner(SpeedRunner):
    """Dies in the middle of its second request."""

    calls = 0

    def generate(self, prompts, max_new_tokens):
        CrashRunner.calls += 1
        if CrashRunner.calls > 1:
            os._exit(7)
        return super().generate(prompts, max_new_tokens)


class BuildFailRunner:
    def __init__(self, spec):
        raise RuntimeError("cannot load the model")


class _Exploit:
    """Unpickling this would write the marker file: what a hostile worker would love the controller to do."""

    def __init__(self, path: str):
        self.path = path

    def __reduce__(self):
        return (Path.write_text, (Path(self.path), "pwned"))


class PickleAttackRunner(SpeedRunner):
    """Finds its own socket and answers with a pickle that runs code where it is unpickled."""

    def generate(self, prompts, max_new_tokens):
        from multiprocessing.connection import Connection

        conn = next(o for o in gc.get_objects() if isinstance(o, Connection))
        conn.send_bytes(pickle.dumps(_Exploit(self_marker())))
        time.sleep(0.2)
        return super().generate(prompts, max_new_tokens)


def self_marker() -> str:
    return os.path.join(os.path.dirname(os.path.abspath(__file__)), ".pickle_attack_marker")


class PidFileRunner(SpeedRunner):
    """Writes its pid to `pid_file` and keeps a busy background thread (it would steal CPU)."""

    def __init__(self, spec):
        super().__init__(spec)
        Path(spec.system["pid_file"]).write_text(str(os.getpid()))
        threading.Thread(target=self._spin, daemon=True).start()

    @staticmethod
    def _spin():
        x = 0
        while True:
            x += 1
            if x % 100000 == 0:
                time.sleep(0.001)


class WatcherRunner(SpeedRunner):
    """Records, while it serves a request, the scheduler state of the process in `watch_pid_file`."""

    def __init__(self, spec):
        super().__init__(spec)
        self.watch = Path(spec.system["watch_pid_file"])
        self.log = Path(spec.system["log_file"])

    def warm(self, system, prompts, max_new_tokens):  # every worker warms up at once: nothing to watch
        SpeedRunner.generate(self, prompts, max_new_tokens)

    def generate(self, prompts, max_new_tokens):
        out = super().generate(prompts, max_new_tokens)
        if self.watch.exists():
            pid = self.watch.read_text().strip()
            # a stop signal takes effect when the target is next scheduled: on a busy machine a
            # frozen process can read 'R' for a moment, so wait briefly for 'T'
            deadline = time.monotonic() + 0.2
            while True:
                try:
                    state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
                except OSError:
                    state = "?"
                if state == "T" or time.monotonic() > deadline:
                    break
                time.sleep(0.002)
            with open(self.log, "a") as f:
                f.write(state + "\n")
        return out


class SysPathRunner(SpeedRunner):
    """Returns, as tokens, a flag: 1 if `specpilot` was imported from the worktree, else 0."""

    def generate(self, prompts, max_new_tokens):
        import specpilot

        flag = int(getattr(specpilot, "PATCHED", False))
        return [[flag] for _ in prompts]


class KnobSpeedRunner(SpeedRunner):
    """Speed from a real System knob, for CLI tests: `seconds` = 0.1 / depth per prompt."""

    def __init__(self, spec):
        super().__init__(spec)
        self.seconds = 0.1 / int(spec.system["depth"])


class GarbageRunner(SpeedRunner):
    """Makes reference cycles on every request and records, per request, whether Python's cyclic
    GC was enabled while it ran and how many collections happened since the previous request."""

    def __init__(self, spec):
        super().__init__(spec)
        self.log = Path(spec.system["log"])

    def generate(self, prompts, max_new_tokens):
        enabled = gc.isenabled()
        collections = sum(s["collections"] for s in gc.get_stats())
        for _ in range(2000):  # garbage only the cyclic collector can free
            a = []
            a.append(a)
        with self.log.open("a") as f:
            f.write(f"{int(enabled)} {collections}\n")
        return super().generate(prompts, max_new_tokens)


class AffinityRunner(SpeedRunner):
    """Returns the CPU cores its process may run on, as the tokens of every output."""

    def generate(self, prompts, max_new_tokens):
        cores = sorted(os.sched_getaffinity(0))[:max_new_tokens]
        return [list(cores) for _ in prompts]


def _proc_state(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0]
    except OSError:
        return "?"


def _detach(target) -> None:
    """Run `target()` in a grandchild in a session of its own (double fork, setsid): it outlives
    its parent and a signal to the parent's process group does not reach it."""
    pid = os.fork()
    if pid == 0:
        try:
            os.setsid()
            if os.fork() == 0:
                try:
                    os.closerange(3, 4096)  # not the worker's socket: its EOF must still reach the controller
                    target()
                finally:
                    os._exit(0)
        finally:
            os._exit(0)
    os.waitpid(pid, 0)


def _burn_while_stopped(worker: int, pid_file: str, lifetime: float) -> None:
    """Append this pid to `pid_file`; then, for `lifetime` s, burn CPU whenever `worker` is stopped
    (its arm is idle: the other arm is being timed) and idle otherwise, even after it is gone."""
    with open(pid_file, "a") as f:
        f.write(f"{os.getpid()}\n")
    end = time.monotonic() + lifetime
    while time.monotonic() < end:
        if _proc_state(worker) == "T":
            spin = time.perf_counter() + 0.005
            while time.perf_counter() < spin:
                pass
        else:
            time.sleep(0.001)


class DetachedBurnerRunner(SpeedRunner):
    """Stock speed and tokens, but starts `burners` detached processes (double fork, setsid) that
    burn CPU only while this worker is stopped, i.e. while the incumbent is timed. With `escape`, it
    first switches off its worker's child-subreaper flag, so the burners are orphaned to init.
    Knobs: pid_file (burners append their pids), burners, escape, lifetime (s; a safety cap)."""

    def __init__(self, spec):
        super().__init__(spec)
        knobs = spec.system
        worker = os.getpid()
        if knobs.get("escape"):
            import ctypes

            ctypes.CDLL(None).prctl(36, 0)  # PR_SET_CHILD_SUBREAPER off
        for _ in range(int(knobs.get("burners", 1))):
            _detach(lambda: _burn_while_stopped(worker, knobs["pid_file"], float(knobs.get("lifetime", 60))))


class HonestFirstRunner(SpeedRunner):
    """Lossless on its first `honest` generate calls (the gate's), lossy on every later one."""

    def __init__(self, spec):
        super().__init__(spec)
        self.honest = int(spec.system.get("honest", 1))
        self.calls = 0

    def warm(self, system, prompts, max_new_tokens):  # not counted: warm-up is not a run request
        SpeedRunner.generate(self, prompts, max_new_tokens)

    def generate(self, prompts, max_new_tokens):
        self.calls += 1
        out = super().generate(prompts, max_new_tokens)
        if self.calls <= self.honest:
            return out
        return [[(t + 1) % 997 for t in o] for o in out]
