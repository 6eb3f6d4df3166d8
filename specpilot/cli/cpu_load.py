"""Foreign CPU load around the timing commands (`generate`, `bench`) on a CPU run: a helper of
theirs, not a command.

On a CPU a forward runs on torch's intra-op threads, one per core by default. When other
processes keep cores busy those threads oversubscribe them: each forward waits on its slowest
thread, by an amount that depends on the forward's shape, so AR and speculation slow down
unequally and a speedup can come out in the wrong direction (issue 56: above 1 on two busy cores
where a quiet machine measures below 1). The loop times under a `control.load.Load`; these
commands read the same `Load`, from the same probe (`control.load.default_probe`), over two
stretches:

1. while the models load: if others used more than `BUSY_SHARE` of the machine's CPU, torch gets
   `fitting_threads` threads for the timing, the cores left free by the others (at most the cores
   this process may run on, at least one); on a quiet machine its thread count is left alone;
2. over the warm-up and the timed runs: if others used more than `BUSY_SHARE` there, the command
   prints one `warning:` line on stderr saying that the timing is not to be trusted.

`BUSY_SHARE` is the loop's `SHARE_BAND`: a load further than that from a quiet machine's is one the
loop would not compare with it. Each command's docstring says what it still prints under load.

Only CPU runs are watched: on a GPU nothing here reads, sets or prints anything.

Owns: the thread rule, the foreign-load rule, the warning and the record stored with results.
Does not own reading the load (`control.load`) or what the commands print besides the warning.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterator
from contextlib import contextmanager

from specpilot.control import load as loads
from specpilot.control.cpus import available_cpus
from specpilot.control.load import SHARE_BAND, Load, LoadProbe

BUSY_SHARE = SHARE_BAND  # others' share of the machine's CPU above which a CPU timing is not trusted
MIN_WINDOW_S = 0.25  # the loading stretch is read over at least this long (/proc counts in clock ticks)


def foreign(load: Load | None) -> bool:
    """Whether other processes used more than `BUSY_SHARE` of the machine's CPU over `load`'s window."""
    return load is not None and load.other_cpu_share is not None and load.other_cpu_share > BUSY_SHARE


def fitting_threads(load: Load | None, threads: int, cores: int) -> int:
    """Torch threads for a timing under `load`: `threads` without foreign load, else no more than the
    cores the others left free nor than `cores` (this process's), and at least one."""
    if not foreign(load):
        return threads
    free = math.floor(load.cpus * (1.0 - load.other_cpu_share) + 1e-9)
    return max(1, min(threads, cores, free))


class CpuLoadWatch:
    """The foreign load over one command's loading and timing stretches (see the module docstring);
    inert unless `device` is the CPU. Puts torch's thread count back on `restore`."""

    def __init__(self, device, probe: LoadProbe | None = None):
        import torch

        self.on = torch.device(device).type == "cpu"
        self.probe = probe or loads.default_probe()
        self.threads_before = torch.get_num_threads()
        self.threads = self.threads_before  # what the timing runs on
        self.timing: Load | None = None  # the load over the timing stretch, once read
        self._mark()

    def _mark(self) -> None:
        self._t0, self._cpu = time.monotonic(), self.probe.cpu() if self.on else None

    def _read(self, min_seconds: float = 0.0) -> Load:
        """The load since the last mark (marking again)."""
        short = min_seconds - (time.monotonic() - self._t0)
        if short > 0:
            self.probe.sleep(short)
        load = Load.between(self._cpu, self.probe.cpu(), device="cpu", seconds=time.monotonic() - self._t0,
                            loadavg=self.probe.loadavg())
        self._mark()
        return load

    def fit_threads(self) -> Load | None:
        """After loading, before timing: torch's threads from the load since this watch began (CPU only)."""
        if not self.on:
            return None
        import torch

        load = self._read(MIN_WINDOW_S)
        self.threads = fitting_threads(load, self.threads_before, len(available_cpus()))
        if self.threads != torch.get_num_threads():
            torch.set_num_threads(self.threads)
        return load

    def timed(self) -> Load | None:
        """After timing: the load since `fit_threads` (CPU only), kept in `timing`."""
        if self.on:
            self.timing = self._read()
        return self.timing

    def restore(self) -> None:
        if self.on:
            import torch

            torch.set_num_threads(self.threads_before)

    @property
    def untrusted(self) -> bool:
        """The timing stretch ran under foreign load."""
        return foreign(self.timing)

    def record(self) -> dict:
        """Plain JSON for a results file ({} off the CPU or before `timed`)."""
        if not self.on or self.timing is None:
            return {}
        t = self.timing
        return {"other_cpu_share": t.other_cpu_share, "loadavg": t.loadavg, "cpus": t.cpus, "seconds": t.seconds,
                "torch_threads": self.threads, "default_threads": self.threads_before, "foreign": self.untrusted}

    def warning(self, what: str) -> str | None:
        """One line for stderr when `what` was timed under foreign load, else None."""
        if not self.untrusted:
            return None
        return warning_line(self.record(), what)


def warning_line(record: dict, what: str) -> str | None:
    """The warning for a `CpuLoadWatch.record` taken under foreign load, else None."""
    if not record.get("foreign"):
        return None
    load = f", load average {record['loadavg']:.1f}" if record.get("loadavg") is not None else ""
    ran, default = record["torch_threads"], record["default_threads"]
    threads = f"on {ran} of torch's {default} threads, to not oversubscribe" if ran < default else f"on {ran} threads"
    return (f"warning: other processes used {record['other_cpu_share']:.0%} of the CPU ({record['cpus']} cores{load}) "
            f"while {what} was timed ({threads}): the timing is not trustworthy; time on a quiet machine")


@contextmanager
def watched(device, probe: LoadProbe | None = None) -> Iterator[CpuLoadWatch]:
    """A `CpuLoadWatch` begun now, torch's thread count put back on exit."""
    watch = CpuLoadWatch(device, probe)
    try:
        yield watch
    finally:
        watch.restore()
