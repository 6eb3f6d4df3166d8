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

    from specpilot.loop.rounds import evaluation_line

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
    from specpilot.loop.rounds import evaluation_line

    p = proposal("knob", verify_compile=True)
    e = evaluation(p.candidate.system)
    assert "timed outputs" not in evaluation_line(p, e, 1)  # the timed sample was not drawn
    assert "timed outputs pass" in evaluation_line(p, replace(e, forced=GateResult(True, {})), 1)
    failed = replace(e, forced=GateResult(False, {}, "mismatch rate 0.8% > stock's 0.4%"),
                     decision=e.decision.with_verdict(Outcome.REJECT, Reason.GUARD_FAILED))
    line = evaluation_line(p, failed, 1)
    assert "guard pass; timed outputs FAILED the guard: mismatch rate 0.8% > stock's 0.4%" in line
    assert line.lstrip().startswith("[x] REJECT")
