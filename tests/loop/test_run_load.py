"""Before a round times its candidates the loop takes the timing lock if it came free and chooses the
noise floor again when the load changed (`_Run._check_load`, on a bare run object: no models,
injected loads); the round judges by the floor `_Run._noise_for_round` returns after it."""

import pytest

from specpilot.control.load import FixedProbe, Load
from specpilot.control.timing_lock import TimingLock
from specpilot.loop.budget import Budget
from specpilot.loop.run import _Run


def load(share=0.05, contended=False, runs=0) -> Load:
    return Load("cpu", 30.0, share, 1.0, 8, runs, contended)


class Said:
    def __init__(self):
        self.lines = []

    def say(self, line):
        self.lines.append(line)


@pytest.fixture
def run(tmp_path):
    r = object.__new__(_Run)
    r.journal, r.budget, r.per_evaluation = Said(), Budget(None), 10.0
    r.lock = TimingLock(["cpu"], tmp_path / "m.sqlite", home=tmp_path / "home", probe=FixedProbe(share=0.05),
                        say=r.journal.say)
    r.last_load, r.noise_load, r.chosen = None, load(0.05), []
    r.noise, r.noise_id = "floor 0", 0

    def choose(now, index):  # records the call; the floor chosen is named after it
        r.chosen.append((now, index))
        r.noise, r.noise_id = f"floor {len(r.chosen)}", len(r.chosen)

    r._noise = choose
    yield r
    r.lock.release()


def test_nothing_is_chosen_again_before_a_round_ran_or_under_a_comparable_load(run):
    run.lock.acquire()
    assert run._noise_for_round(1) == ("floor 0", 0)
    run.last_load = load(0.12)
    assert run._noise_for_round(2) == ("floor 0", 0)
    assert run.chosen == []


def test_a_busier_machine_chooses_the_noise_floor_again(run):
    run.lock.acquire()
    run.last_load = load(0.5)
    assert run._noise_for_round(3) == ("floor 1", 1)  # the round judges by the floor chosen again
    assert run.chosen == [(load(0.5), 3)] and "5% of the CPU then and 50% now" in run.journal.lines[-1]


def test_contention_that_starts_mid_run_chooses_again_once_and_then_keeps_it(run):
    run.lock.acquire()
    run.last_load = load(0.05, contended=True, runs=1)  # a --no-wait run started during the last round
    run._check_load(2)
    assert len(run.chosen) == 1 and "another timing run is active now" in run.journal.lines[-1]
    run.noise_load = run.last_load  # the floor measured under that contention
    run._check_load(3)
    assert len(run.chosen) == 1


def test_a_run_that_did_not_wait_takes_the_lock_when_it_comes_free(run, tmp_path):
    other = TimingLock(["cpu"], tmp_path / "m.sqlite", home=tmp_path / "home", probe=FixedProbe(),
                       say=lambda line: None)
    other.acquire()
    run.lock.wait_s = 0
    assert run.lock.acquire() is False
    run.noise_load = run.last_load = load(0.05, contended=True, runs=1)
    run._check_load(2)
    assert run.chosen == [] and not run.lock.held  # still contended, as the floor was
    other.release()
    run._check_load(3)
    assert run.lock.held and "free now" in run.journal.lines[-2]
    (now, index), = run.chosen
    assert index == 3 and not now.contended  # read afresh, not the last (contended) round's


def test_no_budget_left_keeps_the_floor(run):
    run.lock.acquire()
    run.budget = Budget(1.0)
    run.last_load = load(0.6)
    assert run._noise_for_round(4) == ("floor 0", 0)
    assert run.chosen == [] and "keeping it" in run.journal.lines[-1]
