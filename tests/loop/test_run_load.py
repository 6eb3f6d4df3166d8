"""Before a round times its candidates the loop takes the timing lock if it came free and chooses the
noise floor again when the load changed (`noise.noise_for_round`, on a bare run context: no models,
injected loads); the round judges by the floor it returns."""

from dataclasses import replace

import pytest
from loop_fixtures import run_context

from specpilot.control.load import FixedProbe, Load
from specpilot.control.timing_lock import TimingLock
from specpilot.loop import noise as loop_noise
from specpilot.loop.budget import Budget
from specpilot.loop.noise import NoiseChoice, noise_for_round
from specpilot.loop.rounds import RoundState


def load(share=0.05, contended=False, runs=0) -> Load:
    return Load("cpu", 30.0, share, 1.0, 8, runs, contended)


class Said:
    def __init__(self):
        self.lines = []

    def say(self, line):
        self.lines.append(line)


class Run:
    """A bare run: its context, the state before a round, and the floors chosen again (named after
    the call that chose them)."""

    def __init__(self, tmp_path, monkeypatch):
        self.journal, self.chosen = Said(), []
        lock = TimingLock(["cpu"], tmp_path / "m.sqlite", home=tmp_path / "home", probe=FixedProbe(share=0.05),
                          say=self.journal.say)
        self.ctx = run_context(journal=self.journal, budget=Budget(None), lock=lock)
        self.lock = lock
        self.state = RoundState(index=1, done=0, incumbent=None, noise=self.floor("floor 0", 0, load(0.05)))

        def choose(ctx, now, index):  # records the call
            self.chosen.append((now, index))
            return self.floor(f"floor {len(self.chosen)}", len(self.chosen), self.state.noise.load)

        monkeypatch.setattr(loop_noise, "choose_noise", choose)

    @staticmethod
    def floor(name, id, measured_under) -> NoiseChoice:
        return NoiseChoice(floor=name, id=id, load=measured_under, per_evaluation=10.0)

    def noise_for_round(self, index: int) -> tuple:
        """(floor, id) round `index` judges by; the state keeps it, as the run does."""
        self.state = replace(self.state, index=index)
        self.state = replace(self.state, noise=noise_for_round(self.ctx, self.state))
        return self.state.noise.floor, self.state.noise.id

    def set(self, **changes) -> None:
        """Change the state: `last_load`, or `noise_load` (the load the floor was measured under)."""
        if "noise_load" in changes:
            self.state = replace(self.state, noise=replace(self.state.noise, load=changes.pop("noise_load")))
        self.state = replace(self.state, **changes)


@pytest.fixture
def run(tmp_path, monkeypatch):
    r = Run(tmp_path, monkeypatch)
    yield r
    r.lock.release()


def test_nothing_is_chosen_again_before_a_round_ran_or_under_a_comparable_load(run):
    run.lock.acquire()
    assert run.noise_for_round(1) == ("floor 0", 0)
    run.set(last_load=load(0.12))
    assert run.noise_for_round(2) == ("floor 0", 0)
    assert run.chosen == []


def test_a_busier_machine_chooses_the_noise_floor_again(run):
    run.lock.acquire()
    run.set(last_load=load(0.5))
    assert run.noise_for_round(3) == ("floor 1", 1)  # the round judges by the floor chosen again
    assert run.chosen == [(load(0.5), 3)] and "5% of the CPU then and 50% now" in run.journal.lines[-1]


def test_contention_that_starts_mid_run_chooses_again_once_and_then_keeps_it(run):
    run.lock.acquire()
    run.set(last_load=load(0.05, contended=True, runs=1))  # a --no-wait run started during the last round
    run.noise_for_round(2)
    assert len(run.chosen) == 1 and "another timing run is active now" in run.journal.lines[-1]
    run.set(noise_load=run.state.last_load)  # the floor measured under that contention
    run.noise_for_round(3)
    assert len(run.chosen) == 1


def test_a_run_that_did_not_wait_takes_the_lock_when_it_comes_free(run, tmp_path):
    other = TimingLock(["cpu"], tmp_path / "m.sqlite", home=tmp_path / "home", probe=FixedProbe(),
                       say=lambda line: None)
    other.acquire()
    run.lock.wait_s = 0
    assert run.lock.acquire() is False
    run.set(noise_load=load(0.05, contended=True, runs=1), last_load=load(0.05, contended=True, runs=1))
    run.noise_for_round(2)
    assert run.chosen == [] and not run.lock.held  # still contended, as the floor was
    other.release()
    run.noise_for_round(3)
    assert run.lock.held and "free now" in run.journal.lines[-2]
    (now, index), = run.chosen
    assert index == 3 and not now.contended  # read afresh, not the last (contended) round's


def test_no_budget_left_keeps_the_floor(run):
    run.lock.acquire()
    run.ctx = replace(run.ctx, budget=Budget(1.0))
    run.set(last_load=load(0.6))
    assert run.noise_for_round(4) == ("floor 0", 0)
    assert run.chosen == [] and "keeping it" in run.journal.lines[-1]
