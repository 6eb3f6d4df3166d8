"""Gap-driven rounds: slots in proportion to what each agent's gaps would save, exploration, the record."""

from dataclasses import replace
from types import SimpleNamespace

import pytest
from loop_fixtures import CONFIG, DEPLOYMENT, STOCK, cost_table, evaluation, fingerprint, run_context

from specpilot.config import System
from specpilot.control.controller import RoundResult
from specpilot.control.rule import Outcome
from specpilot.control.stats import GainEstimate, NoiseFloor
from specpilot.loop.agents.base import LoopSetup, Proposal, Proposer
from specpilot.loop.budget import Budget
from specpilot.loop.config import LoopConfig, SlotPolicy
from specpilot.loop.context import RunOptions
from specpilot.loop.cost_model import Gap, GapKind
from specpilot.loop.journal import EventKind, Journal
from specpilot.loop.report import render_slots, rounds_from_journal
from specpilot.loop.noise import NoiseChoice
from specpilot.loop.rounds import RoundState, run_round, select
from specpilot.loop.recall import Recall
from specpilot.loop.slots import CLOSERS, allocate, closes
from specpilot.loop.systems import Candidate, Incumbent
from specpilot.memory.store import Memory

A, V, D, O = GapKind.ACCEPTANCE, GapKind.VERIFY_KERNELS, GapKind.DRAFT_KERNELS, GapKind.OVERHEAD


def table(**savings):
    """The fixture's cost table with its gaps replaced: {kind value with _ for -: ms/token saved}."""
    gaps = [Gap(GapKind(k.replace("_", "-")), 1.0, 0.5, v) for k, v in savings.items()]
    gaps.sort(key=lambda g: g.saving_ms_per_token, reverse=True)
    return replace(cost_table(), gaps=tuple(gaps))


class Fake(Proposer):
    """Proposes `depth` moves 1, 2, 3 ... named after itself; records the limit it was given."""

    def __init__(self, name: str, gaps=None, moves: int = 4):
        super().__init__()
        self.name, self.moves, self.asked = name, moves, []
        if gaps is not None:
            self.gaps = frozenset(gaps)

    def propose(self, ctx):
        self.asked.append(ctx.limit)
        offset = {"knob": 1, "kernel": 20, "coding": 40}.get(self.name, 60)
        return [Proposal(self.name, Candidate(STOCK.with_changes(name=f"{self.name}{i}", depth=offset + i)),
                         f"move {i}", sorted(closes(self), key=lambda k: k.value)[0]) for i in range(self.moves)]


def test_slots_follow_what_each_agents_gaps_would_save():
    cost = table(acceptance=0.19, verify_kernels=0.17, draft_kernels=0.0, overhead=0.0)
    agents = [(n, closes(Fake(n))) for n in ("knob", "kernel")]
    plan = allocate(cost, agents, 3, round=1)
    # acceptance is the knob agent's alone (0.19); verify-kernels is shared by kernel and knob (0.085 each)
    assert [(s.agent, s.slots, s.gap) for s in plan.shares] == [("knob", 2, A), ("kernel", 1, V)]
    assert plan.shares[0].weight == pytest.approx(0.19 + 0.085)
    assert plan.line() == "slots: knob 2 (acceptance 0.190 ms/tok), kernel 1 (verify-kernels 0.170 ms/tok)"
    # declared gaps, nothing shared: 0.3 against 0.1 ms/token over 8 slots is 6 against 2
    plan = allocate(table(acceptance=0.3, overhead=0.1), [("a", frozenset({A})), ("b", frozenset({O}))], 8, 1)
    assert [s.slots for s in plan.shares] == [6, 2] and plan.active == ("a", "b")
    # a disabled agent is not in the list: its gap's time goes to those that can act on it
    plan = allocate(cost, [("knob", closes(Fake("knob")))], 3, 1)
    assert [(s.agent, s.slots) for s in plan.shares] == [("knob", 3)]
    # no gap saves anything: the slots are shared equally
    plan = allocate(table(acceptance=0.0, overhead=0.0), [("a", frozenset({A})), ("b", frozenset({O}))], 2, 1)
    assert [s.slots for s in plan.shares] == [1, 1] and all(s.gap is None for s in plan.shares)


def test_the_gap_table_and_agents_that_name_no_gap():
    assert set(CLOSERS) == set(GapKind) and all(CLOSERS.values())  # every gap some shipped agent can close
    assert closes(Fake("kernel")) == {V, D} and closes(Fake("knob")) == set(GapKind)
    assert closes(Fake("coding")) == {V, D, O}
    assert closes(Fake("integration")) == set(GapKind)  # stacks changes measured on any gap
    assert closes(Fake("plug-in")) == set(GapKind) and closes(Fake("plug-in", gaps={O})) == {O}


def test_an_agent_outside_the_top_gap_explores_every_few_rounds_deterministically():
    cost = table(acceptance=0.5, overhead=0.01)
    agents = [("knob", frozenset({A, O})), ("tuner", frozenset({O})), ("writer", frozenset({O}))]
    plans = [allocate(cost, agents, 2, round=i, seed=0) for i in range(1, 10)]
    explored = [(i + 1, p.active) for i, p in enumerate(plans) if len(p.active) > 1]
    assert [i for i, _ in explored] == [3, 6, 9]  # one round in three
    for _, active in explored:
        assert active[0] == "knob" and active[1] in ("tuner", "writer")
    plan = plans[2]
    assert [s.slots for s in plan.shares if s.agent == "knob"] == [1]
    assert "exploration" in plan.line()
    # the same seed gives the same rounds and the same agents; another seed other rounds
    assert [allocate(cost, agents, 2, round=i, seed=0).active for i in range(1, 10)] == [p.active for p in plans]
    other = [i for i in range(1, 10) if len(allocate(cost, agents, 2, round=i, seed=1).active) > 1]
    assert other == [2, 5, 8]
    # an agent outside the top gap that already holds a slot needs no exploration slot
    plan = allocate(table(acceptance=0.3, overhead=0.28), agents[:2], 3, round=3)
    assert [s.slots for s in plan.shares] == [2, 1] and not any(s.explore for s in plan.shares)


def test_selection_fills_each_agents_slots_then_hands_unused_ones_on(tmp_path):
    recall = Recall("fx", (), ())
    inc = Incumbent(Candidate(STOCK))

    def moves(agent, depths):
        return [Proposal(agent, Candidate(STOCK.with_changes(name=f"{agent}{d}", depth=d)), "") for d in depths]

    lists = {"knob": moves("knob", [1, 2, 3]), "kernel": moves("kernel", [2, 9])}  # kernel's first is a repeat
    selected, _, dropped = select(lists, inc, recall, 4, {"knob": 2, "kernel": 1})
    assert [p.candidate.system.depth for p in selected] == [1, 2, 9, 3]  # the last slot went round-robin
    assert len(dropped) == 1
    seed = moves("memory", [7])
    selected, _, _ = select(lists, inc, recall, 2, {"knob": 1}, first=seed)
    assert [p.candidate.system.depth for p in selected] == [7, 1]


class Controller:
    """Rejects every candidate, untimed work: what the round does with slots is under test here."""

    def __init__(self):
        self.noises = []  # the noise floor of each round it timed

    def evaluate_round(self, incumbent, specs, noise, factors=None):
        self.noises.append(noise)
        systems = [System.from_dict({k: v for k, v in s.system.items() if k != "name"}, name=s.system["name"])
                   for s in specs]
        evs = tuple(evaluation(system, gain=-0.05, verdict=Outcome.REJECT) for system in systems)
        return RoundResult(evs, None)


def noise_floor(spread: float = 0.001) -> NoiseFloor:
    return NoiseFloor(GainEstimate((spread, -spread, 0.0005, 0.0, -0.0005), resamples=500), "p")


def run(tmp_path, agents, cost, seeds=(), policy=SlotPolicy.GAPS, index=1, choose_noise=None, controller=None):
    journal = Journal(tmp_path / "decisions.jsonl", quiet=True)
    setup = LoopSetup(DEPLOYMENT, "cuda", "NVIDIA H200", None, tmp_path)
    with Memory(tmp_path / "m.sqlite") as memory:
        ctx = run_context(config=LoopConfig(slots=policy, seed=0), options=RunOptions(runner="x:y"),
                          budget=Budget(None), deployment_file="fx", controller_config=CONFIG, memory=memory,
                          paths=SimpleNamespace(run_id="t"), journal=journal, fingerprint=fingerprint(),
                          controller=controller or Controller(), setup=setup, stock=Candidate(STOCK),
                          agents=tuple(agents), seeds=tuple(seeds))
        state = RoundState(index=index, done=index - 1, incumbent=Incumbent(Candidate(STOCK)), cost=cost,
                           noise=NoiseChoice(floor=noise_floor(), id=None, load=None, per_evaluation=1.0))
        outcome = run_round(ctx, state, 3, choose_noise)
    return outcome, Journal.read(tmp_path / "decisions.jsonl")


def test_the_noise_floor_is_chosen_only_when_the_round_has_candidates_to_time(tmp_path):
    """A round with nothing new to time measures no noise (the loop re-chooses it there when the
    load changed); one with candidates judges them by the floor chosen for it."""
    chosen, again = [], noise_floor(0.01)

    def choose():
        chosen.append(1)
        return NoiseChoice(floor=again, id=None, load=None, per_evaluation=1.0)

    _, events = run(tmp_path / "a", [Fake("knob", moves=0)], table(acceptance=0.5), choose_noise=choose)
    assert chosen == [] and any(e.data.get("nothing_new") for e in events if e.kind is EventKind.ROUND_END)
    controller = Controller()
    outcome, _ = run(tmp_path / "b", [Fake("knob")], table(acceptance=0.5), choose_noise=choose,
                     controller=controller)
    assert chosen == [1] and controller.noises == [again] and len(outcome.evaluated) == 3


def test_a_round_asks_only_the_agents_with_slots_and_records_the_split(tmp_path):
    knob, kernel, coding = Fake("knob"), Fake("kernel"), Fake("coding")
    cost = table(acceptance=0.19, verify_kernels=0.17, draft_kernels=0.01, overhead=0.0)
    outcome, events = run(tmp_path, [knob, kernel, coding], cost)
    assert knob.asked == [2] and kernel.asked == [1] and coding.asked == []  # coding's share rounds to 0
    assert [p.agent for p in outcome.selected] == ["knob", "knob", "kernel"]
    (slots,) = [e for e in events if e.kind is EventKind.SLOTS]
    assert slots.text.startswith("slots: knob 2 (acceptance 0.190 ms/tok), kernel 1 (verify-kernels 0.170 ms/tok)")
    assert "no slot: coding" in slots.text
    (selected,) = [e for e in events if e.kind is EventKind.SELECTED]
    assert "[kernel -> draft-kernels]" in selected.text and all(c["gap"] for c in selected.data["candidates"])
    evaluations = [e.data for e in events if e.kind is EventKind.EVALUATION]
    assert [e["gap"] for e in evaluations] == ["acceptance", "acceptance", "draft-kernels"]
    (rd,) = rounds_from_journal(events)
    assert render_slots(rd["slots"]).startswith("Slots: knob 2 (acceptance 0.190 ms/tok), kernel 1")
    assert {s["agent"]: s["slots"] for s in rd["slots"]["shares"]} == {"knob": 2, "kernel": 1, "coding": 0}


def test_seeds_go_first_and_round_robin_asks_everyone(tmp_path):
    knob, kernel = Fake("knob"), Fake("kernel")
    cost = table(acceptance=0.19, verify_kernels=0.17)
    seed = Proposal("memory", Candidate(STOCK.with_changes(name="seed-other", depth=8)), "validated elsewhere")
    outcome, events = run(tmp_path / "a", [knob, kernel], cost, seeds=[seed])
    assert outcome.selected[0] is seed and len(outcome.selected) == 3
    assert sum(s.slots for s in outcome.plan.shares) == 2
    assert next(e for e in events if e.kind is EventKind.SLOTS).text.startswith("seeds 1; slots: ")
    knob, kernel, coding = Fake("knob"), Fake("kernel"), Fake("coding")
    outcome, events = run(tmp_path / "b", [knob, kernel, coding], cost, policy=SlotPolicy.ROUND_ROBIN)
    assert knob.asked == kernel.asked == coding.asked == [3] and outcome.plan is None
    assert [p.agent for p in outcome.selected] == ["knob", "kernel", "coding"]
    (rd,) = rounds_from_journal(events)
    assert render_slots(rd["slots"]) == "Slots: round-robin over knob, kernel, coding"


def test_when_the_chosen_agents_have_nothing_new_the_others_are_asked(tmp_path):
    knob, coding = Fake("knob", moves=0), Fake("coding")
    outcome, events = run(tmp_path, [knob, coding], table(acceptance=0.5))  # acceptance: the knob agent's alone
    assert knob.asked == [3] and coding.asked == [3]
    assert [p.agent for p in outcome.selected] == ["coding"] * 3
    (proposals,) = [e for e in events if e.kind is EventKind.PROPOSALS]
    assert proposals.data["asked_without_slot"] == ["coding"] and proposals.data["counts"] == {"knob": 0, "coding": 4}


def test_no_slots_to_share_gives_no_one_a_slot():
    plan = allocate(table(acceptance=0.5, overhead=0.1), [("knob", frozenset({A})), ("x", frozenset({O}))], 0, 3)
    assert [s.slots for s in plan.shares] == [0, 0] and plan.active == ()


def test_slots_the_chosen_agents_leave_empty_go_to_the_others(tmp_path):
    """A seed and one agent with one move cannot fill three slots: the agent without a slot is asked
    for the rest rather than the round timing fewer candidates than it may."""
    seed = Proposal("memory", Candidate(STOCK.with_changes(name="seed-other", depth=8)), "validated elsewhere")
    kernel, coding = Fake("kernel", gaps={V}, moves=1), Fake("coding", gaps={O})
    outcome, events = run(tmp_path, [kernel, coding], table(verify_kernels=0.5, overhead=0.0), seeds=[seed])
    assert kernel.asked == [2] and coding.asked == [3]  # coding held no slot; asked once the others came up short
    assert [p.agent for p in outcome.selected] == ["memory", "kernel", "coding"]
    (proposals,) = [e for e in events if e.kind is EventKind.PROPOSALS]
    assert proposals.data["asked_without_slot"] == ["coding"]
