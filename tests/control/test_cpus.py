"""Each worker on its own equal set of cores, the lowest core left to the controller."""

import os

import pytest

from fake_runners import WORKDIR
from specpilot.control.cpus import MAX_CPUS_PER_WORKER, plan_cpus
from specpilot.control.arm import ArmSpec
from specpilot.control.worker import Worker


def test_plan_gives_disjoint_equal_sets_and_spares_the_first_core():
    assert plan_cpus(2, range(16)) == [(1, 2, 3, 4), (5, 6, 7, 8)]  # capped at MAX_CPUS_PER_WORKER
    four = plan_cpus(4, range(16))
    assert [len(s) for s in four] == [3, 3, 3, 3] and 0 not in {c for s in four for c in s}
    assert len({c for s in four for c in s}) == 12
    assert plan_cpus(2, [3, 7, 9]) == [(7,), (9,)]  # whatever cores this process may use
    assert plan_cpus(2, [0, 1]) is None  # not enough to give each worker its own core
    assert plan_cpus(1, [0, 1]) == [(1,)]
    assert max(len(s) for s in plan_cpus(1, range(64))) == MAX_CPUS_PER_WORKER


@pytest.mark.skipif(not hasattr(os, "sched_getaffinity") or len(os.sched_getaffinity(0)) < 2,
                    reason="needs Linux and two cores")
def test_worker_runs_on_the_cores_it_was_given(tmp_path):
    core = max(os.sched_getaffinity(0))
    spec = ArmSpec("fixture", {"name": "a", "seconds": 0.0}, workdir=WORKDIR, factory="fake_runners:AffinityRunner")
    w = Worker.start(spec, "a0", tmp_path, cpus=(core,))
    try:
        w.request({"op": "build", "spec": w.spec.to_dict()}, 60)
        reply = w.request({"op": "run", "system": spec.system, "prompts": [[1, 2]], "max_new_tokens": 8}, 60)
    finally:
        w.close()
    assert reply["outputs"] == [[core]]
