"""A run keeps to its budget and says up front what fits (`loop.run`, `loop.budget_plan`).

On a bare run context (no models, no workers; a fake clock, rounds that take what they are told): the
plan is said before the first round, rounds keep the final measurement's time, a promoted incumbent's
cost table is not measured when it and the final cannot both fit, the final measurement is skipped
when it does not fit, and a wait for another run's timing lock is not counted. End to end on the tiny
deployment: a budget too short for the final measurement skips it, with the reason in the report.
"""

from __future__ import annotations

import io
import threading
import time
from dataclasses import replace
from types import SimpleNamespace

import pytest
from loop_fixtures import CONFIG, DEPLOYMENT, STOCK, cost_table, evaluation, fingerprint, run_context

from specpilot.config import System
from specpilot.control.config import Placement
from specpilot.control.controller import RoundResult
from specpilot.control.load import FixedProbe, Load
from specpilot.control.rule import Outcome
from specpilot.control.timing_lock import TimingLock
from specpilot.loop import budget as loop_budget
from specpilot.loop import run as loop_run
from specpilot.loop.agents.base import LoopSetup, Proposal, Proposer
from specpilot.loop.budget import Budget
from specpilot.loop.budget_plan import plan_line
from specpilot.loop.config import LoopConfig, SlotPolicy, StopReason
from specpilot.loop.context import RunContext, RunOptions, uncount_wait
from specpilot.loop.journal import EventKind
from specpilot.loop.noise import NoiseChoice
from specpilot.loop.reporter import Reporter
from specpilot.loop.rounds import RoundState, run_round
from specpilot.loop.run import finish, run_loop, run_rounds
from specpilot.loop.systems import Candidate, Incumbent
from specpilot.memory.store import Memory

FINAL_S = 20.0  # every final-measurement estimate in these tests


class Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class Log:
    """The journal: every line said or emitted, in order, with the rounds run between them."""

    def __init__(self):
        self.lines: list[str] = []
        self.events: list[tuple[EventKind, str, dict]] = []

    def say(self, text):
        self.lines.append(text)

    def emit(self, kind, text, round=0, **data):
        self.lines.append(text)
        self.events.append((kind, text, data))


@pytest.fixture
def clock(monkeypatch):
    c = Clock()
    fake = SimpleNamespace(monotonic=c)
    monkeypatch.setattr(loop_budget, "time", fake)
    monkeypatch.setattr(loop_run, "time", fake, raising=False)
    monkeypatch.setattr(loop_run, "final_seconds", lambda *args, **kwargs: FINAL_S)
    return c


class Run:
    """A bare run: its context, its rounds' state, and when its cost tables were measured."""

    def __init__(self, ctx: RunContext, state: RoundState):
        self.ctx, self.state, self.journal, self.measured = ctx, state, ctx.journal, []

    def rounds(self):
        """(incumbent, outcomes, stop, cost) after the rounds."""
        self.state, stop = run_rounds(self.ctx, self.state)
        return self.state.incumbent, list(self.state.outcomes), stop, self.state.cost

    def finish(self, incumbent, cost, stop):
        return finish(self.ctx, replace(self.state, incumbent=incumbent, cost=cost), stop)


def bare_run(monkeypatch, budget_minutes: float | None, clock: Clock, rounds_s: list[float], measure_s: float = 2.0,
             promote: bool = False, rounds: int = 3, agents=(), left_out=()) -> Run:
    """A run of `rounds` rounds of 3 candidates (10 s an evaluation: a first round of ~45 s) whose
    rounds take `rounds_s` seconds and whose cost tables take `measure_s`; `agents` (names) are on;
    a round with `left_out` times nothing and leaves them out."""
    config = LoopConfig(rounds=rounds, budget_minutes=budget_minutes, max_candidates=3, patience=5)
    incumbent = Incumbent(Candidate(STOCK))

    class Window:
        load = Load("cpu", 1.0, 0.0, 0.0, 2)

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            pass

    ctx = run_context(config=config, options=RunOptions(), budget=Budget(config.budget_s), journal=Log(),
                      deployment=DEPLOYMENT, device="cpu", backend=SimpleNamespace(parallelism=1),
                      paths=SimpleNamespace(run_id="run"), memory=SimpleNamespace(tag_load=lambda ids, load: None),
                      lock=SimpleNamespace(window=Window), agents=tuple(SimpleNamespace(name=a) for a in agents),
                      seeds=(), patches_stored=False,
                      stock=Candidate(STOCK))
    noise = NoiseChoice(floor=None, id=None, load=None, per_evaluation=10.0)
    r = Run(ctx, RoundState(index=1, done=0, incumbent=incumbent, noise=noise))

    def measure(self, candidate):
        r.measured.append(clock.now)
        clock.now += measure_s
        return cost_table(STOCK)

    monkeypatch.setattr(RunContext, "measure", measure)
    took = iter(rounds_s)

    def run_round(ctx, state, candidates, choose_noise=None):
        seconds = next(took)
        ctx.journal.lines.append(f"ROUND {state.index} of {candidates} candidate(s)")
        clock.now += seconds
        return SimpleNamespace(seconds=seconds, nothing_new=bool(left_out), evaluated=(), incumbent_before=incumbent,
                               incumbent_after=incumbent, cost=cost_table(STOCK), promoted=promote or None,
                               left_out=tuple(left_out))

    monkeypatch.setattr(loop_run, "run_round", run_round)
    return r


def test_what_fits_is_said_before_the_first_round_and_the_final_keeps_its_time(clock, monkeypatch):
    """100 s: after the 2 s cost table, one full round of ~45 s and the final (~20 s) fit in the 98 s
    left, which is said before round 1; round 2 fits only one candidate; round 3 none."""
    run = bare_run(monkeypatch, 100 / 60, clock, [45.0, 25.0])
    start = clock.now
    _, outcomes, stop, _ = run.rounds()
    lines = run.journal.lines
    plan = "budget: 98 s left: 1 of the 3 round(s) (~45 s each) and the final measurement (~20 s) fit"
    assert lines.index(plan) < lines.index("ROUND 1 of 3 candidate(s)") < lines.index("ROUND 2 of 1 candidate(s)")
    assert stop is StopReason.BUDGET and len(outcomes) == 2 and "stopping: round 3" in lines[-1]
    assert clock.now - start + FINAL_S <= 100  # what ran leaves the final measurement its time


def test_the_first_rounds_estimate_counts_the_kernel_agents_tuning(clock, monkeypatch):
    """With the kernel agent on, a first round proposes for up to its 60 s tuning budget: ~105 s, not ~45 s."""
    run = bare_run(monkeypatch, 200 / 60, clock, [105.0], agents=("knob", "kernel"))
    run.rounds()
    assert run.journal.lines[0] == ("budget: 198 s left: 1 of the 3 round(s) (~105 s each) and the final measurement "
                                    "(~20 s) fit")


def test_a_round_that_could_time_none_of_its_candidates_stops_the_run(clock, monkeypatch):
    """Not one of round 1's candidates fitted beside the final measurement: the run stops for the
    budget rather than proposing again (nor counting the round as idle)."""
    run = bare_run(monkeypatch, 100 / 60, clock, [5.0, 5.0], left_out=("compiled",))
    _, outcomes, stop, _ = run.rounds()
    assert stop is StopReason.BUDGET and len(outcomes) == 1
    assert run.journal.lines[-1] == ("stopping: no candidate of round 1 fits beside the final measurement (~20 s) "
                                     "in the 93 s left")


def test_a_budget_that_holds_a_smaller_round_or_none_says_so_first(clock, monkeypatch):
    """50 s: one candidate's round (~25 s) fits beside the final, a full one does not; 40 s: none does,
    the final does; 10 s: neither."""
    run = bare_run(monkeypatch, 50 / 60, clock, [25.0], rounds=1)
    run.rounds()
    assert run.journal.lines[:2] == [
        "budget: 48 s left: a full round (~45 s) does not fit beside the final measurement (~20 s); a round of 1 "
        "candidate(s) instead of 3 does", "round 1: 1 candidate(s) instead of 3: a full round (~45 s) and the final "
        "measurement (~20 s) would not fit in the 48 s left"]
    run = bare_run(monkeypatch, 40 / 60, clock, [])
    _, outcomes, stop, _ = run.rounds()
    assert outcomes == [] and stop is StopReason.BUDGET and run.journal.lines[0] == (
        "budget: 38 s left: no round (~45 s) fits beside the final measurement (~20 s): the run goes on to the final "
        "measurement without one")
    assert plan_line(10, 3, 45, 20, 0, 3) == ("budget: 10 s left: no round (~45 s) fits, nor the final measurement "
                                              "(~20 s): the run stops without either and writes its report")


def test_a_promoted_incumbent_is_not_measured_when_it_and_the_final_do_not_fit(clock, monkeypatch):
    """Round 1 promotes with 49 s left: the new incumbent's cost table (30 s, as the first took) and
    the final (~20 s) would not fit, so the run stops instead of measuring it, and the final
    measurement runs without it (the report goes without the gaps after the run)."""
    monkeypatch.setattr(loop_run, "run_final", lambda ctx, incumbent: "final")
    run = bare_run(monkeypatch, 124 / 60, clock, [45.0, 45.0], measure_s=30.0, promote=True)
    _, outcomes, stop, cost = run.rounds()
    assert len(run.measured) == 1 and len(outcomes) == 1 and stop is StopReason.BUDGET and cost is None
    assert run.journal.lines[-1].startswith("stopping: measuring the new incumbent (~30 s) for round 2 and the "
                                            "final measurement (~20 s) would not fit in the 49 s left")
    assert run.finish(Incumbent(Candidate(STOCK)), cost, stop) == (None, "final", stop)
    assert len(run.measured) == 1 and "no time left to measure the final system's cost table" in run.journal.lines[-1]


def test_the_final_measurement_runs_only_when_it_fits(clock, monkeypatch):
    ran = []
    monkeypatch.setattr(loop_run, "run_final", lambda ctx, incumbent: ran.append(incumbent) or "final")
    run = bare_run(monkeypatch, 30 / 60, clock, [])
    incumbent = Incumbent(Candidate(STOCK))
    clock.now += 5  # 25 s left: the final (~20 s) fits
    assert run.finish(incumbent, cost_table(STOCK), StopReason.BUDGET)[1] == "final"
    clock.now += 10  # 15 s left: it does not
    assert run.finish(incumbent, cost_table(STOCK), StopReason.BUDGET)[1] is None and len(ran) == 1
    kind, text, data = run.journal.events[-1]
    assert kind is EventKind.STOP and data["error"]
    assert text == "skipping the final measurement (~20 s): it would not fit in the 15 s left of the budget"


def test_a_wait_for_the_timing_lock_is_not_counted(tmp_path):
    """Another run holds the lock for ~1 s: the budget left after the wait is still nearly all of it,
    and a line says how long the run waited and what is left."""
    other = TimingLock(["cpu"], tmp_path / "m.sqlite", home=tmp_path / "home", probe=FixedProbe(),
                       say=lambda line: None)
    other.acquire()
    config, journal = LoopConfig(budget_minutes=0.1), Log()  # 6 s
    budget = Budget(config.budget_s)
    lock = TimingLock(["cpu"], tmp_path / "m.sqlite", home=tmp_path / "home", probe=FixedProbe(), poll_s=0.05,
                      say=journal.say)
    threading.Timer(1.0, other.release).start()
    try:
        assert lock.acquire()
        budget = uncount_wait(budget, lock, Reporter(journal), config.budget_s)
    finally:
        lock.release()
    assert lock.waited_s >= 0.9 and budget.left() > 5.5
    assert journal.lines[-1].startswith(f"budget: waited {lock.waited_s:.0f} s for another timing run; the "
                                        "wait is not counted: ")


def quiet_setup(monkeypatch):
    """No noise-floor measurement (it starts worker processes): a stored-looking one instead."""
    from specpilot.control.stats import GainEstimate, NoiseFloor

    def noise(ctx, *args, **kwargs):  # no round fits
        return NoiseChoice(floor=NoiseFloor(GainEstimate((0.001, -0.001, 0.0005, 0.0, -0.0005), resamples=500),
                                            ctx.controller.procedure), id=None, load=None, per_evaluation=1000.0)

    monkeypatch.setattr(loop_run, "choose_noise", noise)


@pytest.mark.serial
def test_a_budget_too_short_for_the_final_measurement_skips_it(home, tmp_path, monkeypatch, target_dir,
                                                                 drafter_dir):
    """The tiny deployment with 2 minutes: no round fits, nor the final measurement (estimated at
    1000 s): the run says so up front, starts neither, and its report says why it has no final."""
    quiet_setup(monkeypatch)
    stream = io.StringIO()
    monkeypatch.setattr(loop_run, "final_seconds", lambda *args, **kwargs: 1000.0)
    monkeypatch.setattr(loop_run, "run_final",
                        lambda ctx, incumbent: pytest.fail("final started: " + stream.getvalue()))
    dep = tmp_path / "tiny.toml"
    dep.write_text(f'name = "tiny"\ntarget = "{target_dir}"\ndrafter = "{drafter_dir}"\nmax_new_tokens = 8\n')
    config = LoopConfig(rounds=1, budget_minutes=2, agents=("knob",), profile_tokens=4, profile_batches=1)
    start = time.monotonic()
    result = run_loop(config, RunOptions(deployment=str(dep), out=str(tmp_path / "run"), devices=("cpu",)), stream)
    log = stream.getvalue()
    assert result.stop is StopReason.BUDGET and result.report["final"] is None and time.monotonic() - start < 120
    assert log.index("budget: ") < log.index("no round (~") < log.index("stopping: round 1") < log.index(
        "skipping the final measurement (~1000 s)")
    (error,) = result.report["run"]["errors"]
    assert error.startswith("skipping the final measurement (~1000 s): it would not fit in the ")


class Listed(Proposer):
    """Proposes the systems it is given, in order."""

    name = "knob"

    def __init__(self, systems):
        super().__init__()
        self.systems = systems

    def propose(self, ctx):
        return [Proposal(self.name, Candidate(s), "listed") for s in self.systems]


class Rejecting:
    """Times nothing: rejects every candidate it is given, and keeps their names."""

    def __init__(self):
        self.timed = []

    def evaluate_round(self, incumbent, specs, noise, factors=None):
        self.timed.append([s.system["name"] for s in specs])
        systems = [System.from_dict({k: v for k, v in s.system.items() if k != "name"}, name=s.system["name"])
                   for s in specs]
        return RoundResult(tuple(evaluation(x, gain=-0.05, verdict=Outcome.REJECT) for x in systems), None)


def budget_round(tmp_path, systems, left: float, reserve: float = 40.0, per_evaluation: float = 20.0,
                 incumbent=STOCK):
    """Round 1 on cuda (one device, a shared worker) of the `systems` proposed, with `left` s of the
    budget and a final measurement of ~`reserve` s: (outcome, what was timed, the journal's lines)."""
    journal, controller = Log(), Rejecting()
    with Memory(tmp_path / "m.sqlite") as memory:
        ctx = run_context(config=LoopConfig(slots=SlotPolicy.ROUND_ROBIN, max_candidates=3), options=RunOptions(),
                          budget=Budget(left), deployment_file="fx", deployment=DEPLOYMENT, device="cuda",
                          controller_config=CONFIG, memory=memory, paths=SimpleNamespace(run_id="t"),
                          journal=journal, fingerprint=fingerprint(), controller=controller,
                          backend=SimpleNamespace(parallelism=1, placement=Placement.ALTERNATE),
                          setup=LoopSetup(DEPLOYMENT, "cuda", "NVIDIA H100", None, tmp_path), stock=Candidate(STOCK),
                          agents=(Listed(systems),), seeds=())
        noise = NoiseChoice(floor=None, id=None, load=None, per_evaluation=per_evaluation)
        state = RoundState(index=1, done=0, incumbent=Incumbent(Candidate(incumbent)), noise=noise,
                           cost=cost_table(incumbent), reserve=reserve)
        outcome = run_round(ctx, state, 3)
    return outcome, controller.timed, journal.lines


def test_a_round_times_only_the_candidates_that_fit_beside_the_final(tmp_path):
    """150 s left on cuda, the final ~40 s, 20 s an evaluation: a candidate that turns on
    torch.compile costs its ~90 s warm-up to open (110 s to screen), so it and its final (~130 s,
    should it be the final system) do not fit; the plain candidate after it does (20 + 20 + 40 s) and
    is the only one timed, with a line saying which was left out and why."""
    dear = STOCK.with_changes(name="knob:draft_compile=true", draft_compile=True)
    plain = STOCK.with_changes(name="knob:depth=3", depth=3)
    outcome, timed, lines = budget_round(tmp_path / "a", [dear, plain], 150.0)
    assert timed == [["knob:depth=3"]]
    assert [p.candidate.name for p in outcome.selected] == ["knob:depth=3"]
    assert [p.candidate.name for p in outcome.left_out] == ["knob:draft_compile=true"]
    assert ("round 1: leaving out 1 of 2 candidate(s), whose comparisons would not fit beside the final measurement "
            "(~40 s) in the 150 s left: knob:draft_compile=true (~110 s, a compile warm-up of ~90 s included; the "
            "final measurement ~130 s after it); timing the 1 that fit (~40 s)") in lines
    # room for both: nothing is left out, and nothing said
    outcome, timed, lines = budget_round(tmp_path / "b", [dear, plain], 300.0)
    assert timed == [["knob:draft_compile=true", "knob:depth=3"]] and outcome.left_out == ()
    assert not any("leaving out" in line for line in lines)
    # a compiled incumbent the run has not timed yet: its shared worker compiles it once, first
    outcome, timed, lines = budget_round(tmp_path / "c", [plain], 150.0, incumbent=dear)
    assert timed == [] and outcome.nothing_new and [p.candidate.name for p in outcome.left_out] == ["knob:depth=3"]
    assert "round 1: nothing timed: no candidate fits in the budget's time left" in lines
