"""Which CPU cores each worker process of a comparison may run on.

Arms are timed from outside on request-to-response time, and on one GPU a decode loop with a host
sync every round is partly CPU-bound: a worker that shares its cores with the other arm, the
controller or a busy neighbour runs slower *as a process*, a bias that alternating the arms' order
does not cancel (unpinned, one copy of stock can run consistently faster than another: the
stock-vs-stock noise floor of `scripts/controller_noise.py` shows it). So each worker gets its own
disjoint set of cores, the lowest core of this process's set stays free for the controller, and all
sets have the same size. With too few cores for that (fewer than workers + 1) nothing is pinned.

Owns: `plan_cpus` and the name of the environment variable that carries a worker's cores
(`CPUS_ENV`). Does not own starting workers (`worker.py`) or pinning (`worker_main._pin_cpus`, which
reads the variable with the standard library only, before any of specpilot is imported).
"""

from __future__ import annotations

import os
from typing import Sequence

CPUS_ENV = "SPECPILOT_WORKER_CPUS"  # comma-separated core ids the worker pins itself to at start
MAX_CPUS_PER_WORKER = 4  # a decode loop uses one thread; a few more for the runtime's helpers


def available_cpus() -> list[int]:
    """The cores this process may run on, ascending."""
    try:
        return sorted(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return list(range(os.cpu_count() or 1))


def plan_cpus(workers: int, cpus: Sequence[int] | None = None) -> list[tuple[int, ...]] | None:
    """Disjoint, equal core sets for `workers` workers (the lowest core left to the controller), or
    None when there are not enough cores to give each its own."""
    cpus = sorted(cpus if cpus is not None else available_cpus())
    if workers < 1 or len(cpus) < workers + 1:
        return None
    rest = cpus[1:]
    size = min(MAX_CPUS_PER_WORKER, len(rest) // workers)
    return [tuple(rest[i * size : (i + 1) * size]) for i in range(workers)]
