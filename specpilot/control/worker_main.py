"""Entry point of a worker process, isolated or shared: builds its runner and serves its requests.

Run as a script by `worker.Worker` — `python worker_main.py FD PARENT_PID` — never imported by
the controller. Until the runner is built it uses the standard library only, so a patch
candidate's worktree (`spec.workdir`) can be put first on sys.path before anything of
`specpilot` is imported: the candidate's code, not the controller's, is what runs here.

Protocol, over the socket FD (one JSON object per message; JSON, never pickle, so a hostile
worker cannot make the controller execute anything by what it sends back):

    -> {"op": "build", "spec": {...}}                    <- {"ok": true, "pid": .., "specpilot": path}
    -> {"op": "warm", "system": {..}, "prompts": [[..]], "max_new_tokens": n}     <- {"ok": true}
    -> {"op": "collect"}                                 <- {"ok": true}   (gc.collect(), untimed)
    -> {"op": "run", "system": {..}, "prompts": [[..]], "max_new_tokens": n, "stop_at_eos": bool,
        "gc_off": bool[, "seeds": [..]]}  <- {"ok": true, "outputs": [[..]], "timing": {..}, "seconds": s}
    -> {"op": "close"}                                   <- {"ok": true}, then exit
    any failure                                          <- {"ok": false, "error": "...", "traceback": "..."}

"seeds" (one per prompt) comes only under a sampled regime and is passed on as `run(..., seeds=)`.
The runner (`control/arm.py` states its contract) is asked for a system by knob dict: an isolated
worker's only ever for its own arm's, a shared worker's (`specpilot.control.shared`) for both arms
of each comparison. An isolated worker is timed by the controller from its own process: the
runner's "timing" is ignored there, and the "seconds" this process reports about its own run call
are kept for diagnostics only (a candidate could report anything). A shared worker runs the
controller's own code and no candidate's; there the runner's timing (CUDA events, prefill apart)
is what is measured.
"""

import gc
import json
import os
import signal
import sys
import time
import traceback
import types
from multiprocessing.connection import Connection


def _die_with_parent(parent_pid: int) -> None:
    """SIGKILL this worker if the controller dies (also when it is SIGSTOPped), and make it a child
    subreaper: whatever the runner starts, and orphans by a double fork or `setsid`, is re-parented
    to this worker instead of init, so it stays in the tree the controller stops and kills
    (`census.py`)."""
    try:
        import ctypes

        prctl = ctypes.CDLL(None, use_errno=True).prctl
        prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
        prctl(36, 1)  # PR_SET_CHILD_SUBREAPER
    except (OSError, AttributeError):  # not Linux: the EOF on the socket still ends the worker
        pass
    if os.getppid() != parent_pid:
        os._exit(1)


def _end_descendants() -> None:
    """On the way out: SIGKILL every process below this worker and reap the ones it inherited
    (best effort; the controller kills the tree too). Standard library only: /proc."""
    me = os.getpid()
    for _ in range(5):
        parents = {}
        try:
            names = [n for n in os.listdir("/proc") if n.isdigit()]
        except OSError:
            return
        for name in names:
            try:
                with open(f"/proc/{name}/stat", "rb") as f:
                    raw = f.read()
                parents[int(name)] = int(raw[raw.rfind(b")") + 2 :].split()[1])
            except (OSError, ValueError, IndexError):
                pass
        below, todo = set(), [me]
        while todo:
            parent = todo.pop()
            for pid, ppid in parents.items():
                if ppid == parent and pid not in below:
                    below.add(pid)
                    todo.append(pid)
        if not below:
            break
        for pid in below:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        deadline = time.monotonic() + 0.5
        while time.monotonic() < deadline:
            try:
                pid, _ = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if pid == 0:
                time.sleep(0.005)


def _load(path: str):
    module_name, _, attr = path.partition(":")
    import importlib

    obj = importlib.import_module(module_name)
    for part in attr.split("."):
        obj = getattr(obj, part)
    return obj


def _build(spec: dict):
    if spec.get("workdir"):
        sys.path.insert(0, os.path.abspath(spec["workdir"]))
    try:
        from specpilot.control.arm import ArmSpec

        spec_obj = ArmSpec.from_dict(spec)
    except ImportError:  # a worktree older than the controller: same fields, plain namespace
        spec_obj = types.SimpleNamespace(**spec)
    return _load(spec["factory"])(spec_obj)


def _handle(runner, msg: dict):
    op = msg.get("op")
    if op == "build":
        runner = _build(msg["spec"])
        package = sys.modules.get("specpilot")
        return runner, {"ok": True, "pid": os.getpid(), "specpilot": getattr(package, "__file__", None)}
    if runner is None:
        raise RuntimeError(f"op {op!r} before build")
    if op == "warm":
        runner.warm(msg["system"], msg["prompts"], msg["max_new_tokens"])
        gc.collect()
        gc.freeze()  # what is alive after warm-up (modules, compiled graphs) is never scanned again
        return runner, {"ok": True}
    if op == "collect":
        gc.collect()
        return runner, {"ok": True}
    if op == "run":
        gc_was_on = gc.isenabled()
        if msg.get("gc_off"):
            gc.disable()
        start = time.perf_counter()
        try:
            seeds = {"seeds": msg["seeds"]} if msg.get("seeds") is not None else {}  # sampled regimes only
            reply = runner.run(msg["system"], msg["prompts"], msg["max_new_tokens"], bool(msg.get("stop_at_eos", True)),
                               **seeds)
        finally:
            seconds = time.perf_counter() - start
            if gc_was_on:
                gc.enable()
        # "seconds" is this process's own account: the controller keeps it for diagnostics only.
        return runner, {**reply, "ok": True, "seconds": seconds}
    raise RuntimeError(f"unknown op {op!r}")


def _encode(reply: dict) -> bytes:
    try:
        return json.dumps(reply).encode()
    except (TypeError, ValueError) as err:
        return json.dumps({"ok": False, "error": f"reply is not plain JSON data: {err}"}).encode()


def _pin_cpus() -> None:
    """Run on the cores the controller gave this worker (`specpilot.control.cpus`; the variable is
    read here with the standard library only, before any of specpilot is imported)."""
    value = os.environ.get("SPECPILOT_WORKER_CPUS", "").strip()
    if value and hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {int(c) for c in value.split(",")})


def main(argv: list[str]) -> int:
    conn = Connection(int(argv[1]))
    _die_with_parent(int(argv[2]))
    _pin_cpus()
    runner = None
    while True:
        try:
            msg = json.loads(conn.recv_bytes())
        except EOFError:
            gc.unfreeze()  # let interpreter shutdown free the frozen objects normally
            return 0
        if msg.get("op") == "close":
            gc.unfreeze()
            conn.send_bytes(_encode({"ok": True}))
            return 0
        try:
            runner, reply = _handle(runner, msg)
        except BaseException as err:  # noqa: BLE001 - everything the runner does is reported, not fatal
            reply = {"ok": False, "error": f"{type(err).__name__}: {err}", "traceback": traceback.format_exc()}
        conn.send_bytes(_encode(reply))


if __name__ == "__main__":
    del sys.path[0]  # this script's own folder (specpilot/control) must not shadow top-level modules
    try:
        status = main(sys.argv)
    finally:
        _end_descendants()
    sys.exit(status)
