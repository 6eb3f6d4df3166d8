"""Worker processes seen from the controller: how they are started."""

from __future__ import annotations

import sys
import threading
import time

import pytest

from fake_runners import WORKDIR

from specpilot.control.arm import ArmSpec
from specpilot.control.worker import Worker

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")


def test_a_worker_started_from_a_thread_outlives_that_thread(tmp_path):
    # A worker is SIGKILLed when the thread that forked it exits (PR_SET_PDEATHSIG), so one started
    # from a round's screening pool died when the pool closed, before the winner's re-measure.
    spec = ArmSpec("fixture", {"name": "w", "seconds": 0.0}, workdir=WORKDIR, factory="fake_runners:SpeedRunner")
    started = {}

    def start_and_build():
        w = Worker.start(spec.placed("cpu"), "t", tmp_path)
        started["worker"] = w
        w.request({"op": "build", "spec": w.spec.to_dict()}, 60)

    thread = threading.Thread(target=start_and_build)
    thread.start()
    thread.join()
    w = started["worker"]
    try:
        time.sleep(0.5)  # a death signal would have landed by now
        assert w.proc.poll() is None, (tmp_path / "t.log").read_text()
        reply = w.request({"op": "run", "system": spec.system, "prompts": [[4, 5, 6]], "max_new_tokens": 4}, 30)
        assert reply
    finally:
        w.close()


def test_a_forked_child_starts_its_own_spawner():
    import os

    from specpilot.control import worker

    assert worker.spawn(lambda: 1) == 1 and worker._spawner is not None
    pid = os.fork()
    if pid == 0:  # the child: its parent's spawner thread does not exist here
        __import__("signal").alarm(10)  # a spawn waiting on the parent's thread would hang: killed instead
        code = 0 if worker._spawner is None and worker.spawn(lambda: 2) == 2 else 1
        os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
