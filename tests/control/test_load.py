"""Load readings: others' CPU share from /proc (a fake /proc tree), when two loads are comparable."""

import os

import pytest

from specpilot.control.load import CpuTimes, FixedProbe, Load, ProcProbe, not_comparable, other_share


def load(share=0.05, contended=False, runs=0) -> Load:
    return Load("cpu", 10.0, share, 1.0, 8, runs, contended)


def test_others_share_is_busy_time_minus_our_process_tree_over_all_time():
    start, end = CpuTimes(busy=1000, total=4000, own=200), CpuTimes(busy=1800, total=6000, own=700)
    assert other_share(start, end) == pytest.approx((800 - 500) / 2000)
    assert other_share(start, CpuTimes(1100, 6000, 900)) == 0.0  # clipped: our accounting ran ahead
    assert other_share(None, end) is None and other_share(end, end) is None


def test_comparable_loads():
    assert not_comparable(load(0.05), load(0.12)) is None
    assert "20% of the CPU then and 5% now" in not_comparable(load(0.20), load(0.05))
    assert "no load record" in not_comparable(None, load())
    assert "under contention" in not_comparable(load(contended=True, runs=1), load())
    assert "another timing run is active now" in not_comparable(load(), load(contended=True, runs=1))
    assert "does not hold the timing lock" in not_comparable(load(), load(contended=True))
    assert "unknown" in not_comparable(load(None), load(0.0))
    assert not_comparable(load(None), load(None)) is None  # no /proc on either: nothing to compare
    assert not_comparable(load(0.0), load(0.3), band=0.5) is None


def test_a_load_round_trips_and_says_what_it_was():
    x = Load.between(CpuTimes(0, 100, 0), CpuTimes(30, 200, 10), device="cuda:0", seconds=2.0, loadavg=3.5, cpus=4,
                     other_timing_runs=1)
    assert x.contended and x.other_cpu_share == pytest.approx(0.2)  # another timing run: contended
    assert Load.from_dict(x.to_dict()) == x and Load.from_dict(None) is None
    assert x.describe() == "others 20% of CPU, load 3.5 on 4 cores, contended: 1 other timing run(s)"


def test_fixed_probe_reads_the_share_it_is_given():
    probe = FixedProbe(share=0.25)
    a, b = probe.cpu(), probe.cpu()
    probe.share = 0.5
    c = probe.cpu()
    assert other_share(a, b) == 0.25 and other_share(b, c) == 0.5


def write_proc(root, stat_cpu, processes):
    """A fake /proc: `stat_cpu` the first line's numbers; processes {pid: (ppid, utime, stime, cutime, cstime)}."""
    root.mkdir(exist_ok=True)
    (root / "stat").write_text("cpu  " + " ".join(map(str, stat_cpu)) + "\ncpu0 1 2 3\n")
    for pid, (ppid, *t) in processes.items():
        (root / str(pid)).mkdir(exist_ok=True)
        rest = ["0"] * 9 + [str(x) for x in t]  # pgrp .. cmajflt, then utime stime cutime cstime + ["0"] * 30
        (root / str(pid) / "stat").write_text(f"{pid} (a name) with spaces) S {ppid} " + " ".join(rest) + "\n")


def test_proc_probe_sums_our_process_tree_only(tmp_path):
    root = tmp_path / "proc"
    # user nice system idle iowait irq softirq steal guest guest_nice
    write_proc(root, (100, 10, 50, 800, 40, 5, 5, 10, 7, 0), {
        10: (1, 5, 5, 0, 0),  # us
        11: (10, 20, 10, 0, 0),  # our worker
        12: (11, 1, 1, 3, 3),  # its child, with reaped children of its own
        13: (1, 50, 50, 0, 0),  # somebody else
    })
    (root / "self").mkdir()  # not a pid: skipped
    t = ProcProbe(root, pid=10).cpu()
    assert t.busy == 100 + 10 + 50 + 5 + 5 + 10 and t.total == t.busy + 800 + 40
    assert t.own == 10 + 30 + 8


def test_proc_probe_on_this_machine_reads_something():
    if not os.path.exists("/proc/stat"):
        pytest.skip("no /proc here")
    probe = ProcProbe()
    a = probe.cpu()
    b = probe.cpu()
    assert a.total <= b.total and 0 <= a.own <= b.own and probe.loadavg() is not None
