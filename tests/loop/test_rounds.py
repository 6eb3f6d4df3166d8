"""Selecting a round's candidates: round-robin over agents, the memory's verdicts reused, limits."""

from loop_fixtures import CONFIG, STOCK, evaluation, fingerprint

from specpilot.loop.agents.base import Proposal
from specpilot.loop.recall import Recall
from specpilot.loop.rounds import select
from specpilot.loop.systems import Candidate, Incumbent
from specpilot.memory.store import Memory


def proposal(agent: str, **knobs) -> Proposal:
    return Proposal(agent, Candidate(STOCK.with_changes(name=f"{agent}-{knobs}", **knobs)), "why")


def test_round_robin_over_agents_skips_what_is_known_settled_or_repeated(tmp_path):
    judged = STOCK.with_changes(name="judged", depth=3)
    fp = fingerprint()
    with Memory(tmp_path / "m.sqlite") as memory:
        entry = memory.record_evaluation(fp, evaluation(judged, gain=-0.1), CONFIG)
        recall = Recall.snapshot(memory, fp)
    ancestor = STOCK.with_changes(name="ancestor", topk=2)
    inc = Incumbent(Candidate(STOCK.with_changes(name="inc", depth=6)), 7, 0.2,
                    lineage=frozenset({Candidate(STOCK).hash, Candidate(ancestor).hash}))
    lists = {
        "knob": [proposal("knob", depth=3), proposal("knob", depth=6), proposal("knob", depth=4),
                 proposal("knob", depth=2)],
        "coding": [proposal("coding", topk=2), proposal("coding", depth=4), proposal("coding", tree_budget=9)],
    }
    selected, reused, dropped = select(lists, inc, recall, limit=2)
    # knob depth 3: judged; coding topk 2: an ancestor; knob depth 6: the incumbent; coding depth 4: a repeat
    assert [p.candidate.system.depth for p in selected] == [4, 5] and selected[1].candidate.system.tree_budget == 9
    assert [(p.candidate.system.depth, r.id) for p, r in reused] == [(3, entry)]
    assert len(dropped) == 5 and all(p not in selected for p in dropped)


def test_the_evaluation_line_says_when_pairs_were_compared_on_saturated_stretches():
    from dataclasses import replace

    from specpilot.loop.reporter import evaluation_line

    p = proposal("knob", tree_budget=16)
    e = evaluation(p.candidate.system)
    assert "saturated" not in evaluation_line(p, e, 1) and e.saturated == (0, 0)
    block = {"incumbent": [[1.0, 1.0]], "candidate": [[1.0, 1.0]],
             "incumbent_saturated": [[[0.5, 40], [0.0, 0]]], "candidate_saturated": [[[0.4, 40], [0.3, 20]]]}
    e = replace(e, timings=(block, block))
    assert e.saturated == (2, 4)
    assert "over 6 blocks (2/4 request pairs on saturated stretches)" in evaluation_line(p, e, 1)


def test_the_evaluation_line_says_whether_the_timed_outputs_passed_the_guard():
    from dataclasses import replace

    from specpilot.control.gate import GateResult
    from specpilot.control.rule import Outcome, Reason
    from specpilot.loop.reporter import evaluation_line

    p = proposal("knob", verify_compile=True)
    e = evaluation(p.candidate.system)
    assert "timed outputs" not in evaluation_line(p, e, 1)  # the timed sample was not drawn
    assert "timed outputs pass" in evaluation_line(p, replace(e, forced=GateResult(True, {})), 1)
    failed = replace(e, forced=GateResult(False, {}, "mismatch rate 0.8% > stock's 0.4%"),
                     decision=e.decision.with_verdict(Outcome.REJECT, Reason.GUARD_FAILED))
    line = evaluation_line(p, failed, 1)
    assert "guard pass; timed outputs FAILED the guard: mismatch rate 0.8% > stock's 0.4%" in line
    assert line.lstrip().startswith("[x] REJECT")


def test_each_round_gives_the_next_state():
    """`RoundState.after`: the numbering goes on, the incumbent's cost table is kept unless a new
    incumbent was promoted, history and outcomes grow, idle rounds count until one times something."""
    from types import SimpleNamespace

    from loop_fixtures import cost_table

    from specpilot.control.load import Load
    from specpilot.loop.noise import NoiseChoice
    from specpilot.loop.rounds import RoundOutcome, RoundState

    stock, other = Incumbent(Candidate(STOCK)), Incumbent(Candidate(STOCK.with_changes(name="d3", depth=3)))
    cost, load = cost_table(), Load("cpu", 1.0, 0.0, 0.0, 2)
    state = RoundState(index=4, done=3, incumbent=stock, cost=cost, idle=1,
                       noise=NoiseChoice(floor=None, id=None, load=None, per_evaluation=1.0))
    idle = RoundOutcome(index=4, label="r/r4", incumbent_before=stock, incumbent_after=stock, cost=cost, proposals=0)
    after = state.after(idle, load)
    assert (after.index, after.done, after.idle, after.cost, after.last_load) == (5, 4, 2, cost, load)
    assert after.history == ((STOCK, cost),) and after.outcomes == (idle,) and not after.first
    promoted = RoundOutcome(index=5, label="r/r5", incumbent_before=stock, incumbent_after=other, cost=cost,
                            proposals=3, selected=(proposal("knob", depth=3),), promoted=SimpleNamespace())
    again = after.after(promoted, load)
    assert (again.index, again.idle, again.incumbent, again.cost) == (6, 0, other, None)
    assert len(again.history) == 2 and state.first and state.index == 4  # frozen: the old state is unchanged
