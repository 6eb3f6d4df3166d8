"""Ctrl-C during a run is acknowledged at once (`loop.interrupt`): the line comes before the work
under way winds down, and the interrupt still stops the run as before (issue 56: it took 10-15 s)."""

from __future__ import annotations

import io
import os
import signal
import time

import pytest

from specpilot.loop import run as loop_run
from specpilot.loop.interrupt import INTERRUPT_LINE, acknowledged_interrupts
from specpilot.loop.journal import Journal


@pytest.fixture(autouse=True)
def python_handles_ctrl_c():
    """Python's own SIGINT handler while each test runs: a test process started in the background
    by a non-interactive shell (nohup, `&`) inherits SIGINT ignored, and a run leaves that alone."""
    before = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, before)


def ctrl_c_then_wait(seen: list, stream: io.StringIO) -> None:
    """Ctrl-C to this process, then a long wait it cuts short; what `stream` held when the
    interrupted work began to wind down goes to `seen`."""
    try:
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(30)
    finally:
        seen.append(stream.getvalue())


def test_the_first_ctrl_c_is_acknowledged_before_the_work_winds_down():
    stream, seen = io.StringIO(), []
    journal = Journal(None, stream)
    start = time.monotonic()
    with pytest.raises(KeyboardInterrupt):
        with acknowledged_interrupts(journal.acknowledge):
            try:
                ctrl_c_then_wait(seen, stream)
            except KeyboardInterrupt:
                ctrl_c_then_wait(seen, stream)  # a second Ctrl-C, while winding down: not said again
    assert time.monotonic() - start < 5
    assert len(seen) == 2 and INTERRUPT_LINE in seen[0] and seen[1] == seen[0]
    assert stream.getvalue().count("Ctrl-C") == 1 and stream.getvalue().endswith(INTERRUPT_LINE + "\n")
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # Python's own handler is back


def test_a_quiet_run_still_acknowledges_and_an_ignored_ctrl_c_stays_ignored():
    stream = io.StringIO()
    with pytest.raises(KeyboardInterrupt):
        with acknowledged_interrupts(Journal(None, stream, quiet=True).acknowledge):
            ctrl_c_then_wait([], stream)
    assert stream.getvalue() == INTERRUPT_LINE + "\n"
    said = []
    before = signal.signal(signal.SIGINT, signal.SIG_IGN)  # e.g. started in the background by a shell
    try:
        with acknowledged_interrupts(said.append):
            assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.05)
    finally:
        signal.signal(signal.SIGINT, before)
    assert said == []


def test_run_loop_acknowledges_a_ctrl_c_in_its_steps(home, tmp_path, monkeypatch, target_dir):
    """`run_loop` sets the run up under the acknowledgement (stopped at its first step after the
    journal opens: no models, no workers), and still closes what it opened."""
    from specpilot.control.timing_lock import TimingLock
    from specpilot.loop.config import LoopConfig
    from specpilot.memory import fingerprint

    stream, seen, closed = io.StringIO(), [], []
    monkeypatch.setattr(fingerprint, "fingerprint_deployment", lambda *args, **kwargs: ctrl_c_then_wait(seen, stream))
    release = TimingLock.release
    monkeypatch.setattr(TimingLock, "release", lambda self: closed.append(stream.getvalue()) or release(self))
    dep = tmp_path / "tiny.toml"
    dep.write_text(f'name = "tiny"\ntarget = "{target_dir}"\ndrafter = "ngram"\nmax_new_tokens = 8\n')
    options = loop_run.RunOptions(deployment=str(dep), out=str(tmp_path / "run"), devices=("cpu",))
    with pytest.raises(KeyboardInterrupt):
        loop_run.run_loop(LoopConfig(rounds=1, agents=("knob",)), options, stream=stream)
    assert INTERRUPT_LINE in seen[0] and closed == seen
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
