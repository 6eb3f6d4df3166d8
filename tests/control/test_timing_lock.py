"""The timing lock: a second timing section waits for the first (one line says so), or with no wait
(or on timeout) times at once and reads contended loads; the census sees runs that did not wait."""

import json
import os
import threading
import time

import pytest

from specpilot.control.load import FixedProbe
from specpilot.control.timing_lock import TimingLock, device_key, lock_paths


@pytest.fixture
def where(tmp_path):
    return {"home": tmp_path / "home", "memory": tmp_path / "m.sqlite"}


def lock(where, lines=None, wait_s=10.0, devices=("cpu",), memory=True, probe=None) -> TimingLock:
    say = lines.append if lines is not None else (lambda line: None)
    return TimingLock(devices, where["memory"] if memory else None, wait_s=wait_s, say=say, home=where["home"],
                      poll_s=0.02, probe=probe or FixedProbe(), command="test")


def test_a_second_timing_section_waits_for_the_first(where):
    """Two sections in two threads (flock locks are per open file, so threads contend like processes)."""
    spans, lines, entered = {}, [], threading.Event()

    def section(name, hold_s, after=None):
        if after is not None:
            after.wait()
        with lock(where, lines) as held:
            assert held.held
            start = time.monotonic()
            entered.set()
            time.sleep(hold_s)
            spans[name] = (start, time.monotonic())

    first = threading.Thread(target=section, args=("first", 0.4))
    second = threading.Thread(target=section, args=("second", 0.0, entered))
    first.start()
    second.start()
    first.join(10)
    second.join(10)
    assert spans["second"][0] >= spans["first"][1]  # serialised: the second began after the first ended
    waiting = [line for line in lines if line.startswith("waiting for another timing run")]
    assert waiting == [f"waiting for another timing run (pid {os.getpid()}, started "
                       f"{waiting[0].split('started ')[1].split(')')[0]}) to finish..."]
    assert any(line.startswith("the other timing run finished") for line in lines)


def test_no_wait_times_at_once_and_marks_both_runs_contended(where):
    lines = []
    with lock(where) as first:
        t0 = time.monotonic()
        second = lock(where, lines, wait_s=0)
        assert second.acquire() is False and time.monotonic() - t0 < 1.0
        assert "not waiting (--no-wait)" in lines[-1] and "marked as measured under contention" in lines[-1]
        assert not any(line.startswith("waiting") for line in lines)
        with second.window() as w:
            pass
        assert w.load.contended and w.load.other_timing_runs == 1
        with first.window() as w:  # the run that holds the lock sees the one that did not wait
            pass
        assert w.load.contended and w.load.other_timing_runs == 1
        second.release()
        with first.window() as w:
            pass
        assert not w.load.contended and w.load.other_timing_runs == 0


def test_on_timeout_it_gives_up_waiting_and_is_contended(where):
    lines = []
    with lock(where):
        second = lock(where, lines, wait_s=0.2)
        t0 = time.monotonic()
        assert second.acquire() is False
        assert 0.2 <= time.monotonic() - t0 < 2.0
        assert lines[0].startswith("waiting for another timing run") and "gave up waiting after" in lines[1]
        assert second.current().contended
    assert second.try_acquire() is True  # the first one is gone: taken between rounds
    assert "free now" in lines[-1] and not second.current().contended
    second.release()


def test_other_devices_and_memories_do_not_contend(where, tmp_path):
    with lock(where, devices=("cuda:0",), memory=False) as first:
        other = lock({"home": where["home"], "memory": tmp_path / "other.sqlite"}, devices=("cuda:1",), wait_s=0)
        assert other.acquire() is True and not other.current().contended
        assert not first.current().contended
        other.release()


def test_the_memory_lock_alone_serialises_runs_on_other_devices(where):
    with lock(where, devices=("cuda:0",)):
        other = lock(where, devices=("cuda:1",), wait_s=0)
        assert other.acquire() is False
        other.release()


def test_a_dead_runs_census_entry_is_removed_not_counted(where):
    active = where["home"] / "locks" / "active"
    active.mkdir(parents=True)
    stale = active / "99999-dead.json"
    mine = lock(where)
    stale.write_text(json.dumps({"pid": 99999, "locks": [str(p) for p in mine.paths]}))  # nobody flocks it
    with mine:
        assert mine.others() == 0 and not stale.exists()


def test_lock_files_are_per_physical_device(where, monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,5")
    assert device_key("cuda:1") == "cuda-5" and device_key("cuda") == "cuda-3" and device_key("cpu") == "cpu"
    paths = lock_paths(["cuda:1", "cuda:0"], where["memory"], where["home"])
    assert {p.name for p in paths} == {"m.sqlite.timing.lock", "timing-cuda-3.lock", "timing-cuda-5.lock"}


def test_the_holder_is_named_in_the_lock_file(where):
    with lock(where) as held:
        for path in held.paths:
            assert json.loads(path.read_text())["pid"] == os.getpid()


def test_another_process_holding_the_lock_is_named_and_its_death_frees_it(where):
    """A stand-in timing run in another process (standard library only): it takes one lock file the
    way `TimingLock` does; this one waits, naming it, and gets the lock when it is killed."""
    import subprocess
    import sys

    said = []
    mine = lock(where, said)
    path = mine.paths[-1]
    path.parent.mkdir(parents=True, exist_ok=True)
    holder = ("import fcntl, json, os, sys, time\n"
              "fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT)\n"
              "fcntl.flock(fd, fcntl.LOCK_EX)\n"
              "os.write(fd, json.dumps({'pid': os.getpid(), 'started': 'then'}).encode())\n"
              "print('held', flush=True)\n"
              "time.sleep(60)\n")
    proc = subprocess.Popen([sys.executable, "-c", holder, str(path)], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "held"
        lines = []
        waiter = threading.Thread(target=lambda: lines.append(mine.acquire()))
        waiter.start()
        time.sleep(0.3)
        assert not lines and mine.held is False
        assert said == [f"waiting for another timing run (pid {proc.pid}, started then) to finish..."]
        proc.kill()  # the kernel drops a dead holder's flock: no stale lock
        waiter.join(10)
        assert lines == [True] and mine.held
    finally:
        proc.kill()
        proc.wait()
        mine.release()


def test_a_run_that_came_and_went_without_the_lock_marks_the_holders_window(where):
    with lock(where) as first:
        with first.window() as w:
            intruder = lock(where, wait_s=0)
            assert intruder.acquire() is False
            intruder.release()  # gone before the window closes: the census alone would miss it
        assert w.load.contended and w.load.other_timing_runs == 1
        with first.window() as w:
            pass
        assert not w.load.contended
