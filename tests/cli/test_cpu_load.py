"""Foreign CPU load around the timing commands: the thread rule, the warning, GPU runs left alone."""

from __future__ import annotations

import pytest
import torch

from specpilot.cli.cpu_load import BUSY_SHARE, CpuLoadWatch, fitting_threads, foreign, warning_line, watched
from specpilot.control.load import FixedProbe, Load


def load(share: float | None, cpus: int = 2) -> Load:
    return Load("cpu", 1.0, share, 3.0, cpus)


def test_foreign_load_is_more_than_the_loops_comparability_band():
    assert not foreign(None) and not foreign(load(None)) and not foreign(load(BUSY_SHARE))
    assert foreign(load(BUSY_SHARE + 0.01)) and foreign(load(0.95))


@pytest.mark.parametrize("share, cpus, threads, cores, fitted", [
    (0.0, 2, 2, 2, 2),  # quiet: left alone
    (0.05, 16, 16, 16, 16),  # background below the band: left alone
    (0.99, 2, 2, 2, 1),  # the 2-core machine at load 2.4-4.9: one thread, never none
    (0.40, 2, 2, 2, 1),  # 0.8 of a core taken: 1.2 free
    (0.50, 8, 8, 8, 4),  # half of eight cores free
    (0.50, 64, 16, 16, 16),  # 32 cores free: torch's own count stays the limit
    (0.20, 64, 64, 4, 4),  # pinned to 4 cores: no more than those
])
def test_threads_fit_the_cores_the_others_leave_free(share, cpus, threads, cores, fitted):
    assert fitting_threads(load(share, cpus), threads, cores) == fitted


class NoProbe:
    """A probe that must not be read."""

    def cpu(self):
        raise AssertionError("a GPU run read the CPU load")

    loadavg = sleep = cpu


def test_a_gpu_run_is_left_alone():
    before = torch.get_num_threads()
    with watched("cuda", NoProbe()) as watch:
        assert watch.fit_threads() is None and watch.timed() is None
    assert not watch.on and watch.record() == {} and watch.warning("bench") is None
    assert torch.get_num_threads() == before


def test_under_foreign_load_threads_shrink_for_the_timing_and_come_back():
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        with watched("cpu", FixedProbe(share=0.99, loadavg=4.9)) as watch:
            assert foreign(watch.fit_threads()) and torch.get_num_threads() == 1
            assert foreign(watch.timed()) and watch.untrusted
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)
    record = watch.record()
    assert record["foreign"] and (record["torch_threads"], record["default_threads"]) == (1, 2)
    line = watch.warning("bench")
    assert line == warning_line(record, "bench") and "\n" not in line
    assert line.startswith("warning: other processes used 99% of the CPU") and "load average 4.9" in line
    assert "while bench was timed (on 1 of torch's 2 threads, to not oversubscribe)" in line


def test_a_quiet_cpu_keeps_its_threads_and_gets_no_warning():
    before = torch.get_num_threads()
    with watched("cpu", FixedProbe(share=0.01)) as watch:
        watch.fit_threads()
        assert torch.get_num_threads() == before
        watch.timed()
    assert watch.record()["foreign"] is False and watch.warning("generate") is None
    assert warning_line({}, "bench") is None


def test_load_only_during_the_timing_still_warns():
    probe = FixedProbe(share=0.0)
    watch = CpuLoadWatch("cpu", probe)
    watch.fit_threads()
    probe.share = 0.6
    watch.timed()
    watch.restore()
    assert watch.untrusted and "on " + str(watch.threads) + " threads)" in watch.warning("bench")
