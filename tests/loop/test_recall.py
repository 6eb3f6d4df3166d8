"""What the loop takes as final from the memory: need-more-data verdicts and verdicts timed under
contention are timed again (up to a cap), disqualifications and settled verdicts are reused."""

from loop_fixtures import CONFIG, STOCK, evaluation, fingerprint

from specpilot.control.load import Load
from specpilot.control.rule import Outcome, Reason
from specpilot.loop.agents.base import Proposal
from specpilot.loop.recall import MAX_RETIMES, Recall, retime_factor, unsettled
from specpilot.loop.rounds import select
from specpilot.loop.systems import Candidate, Incumbent
from specpilot.memory.store import Memory

CONTENDED = Load("cpu", 30.0, 0.4, 3.0, 8, 1, True)
QUIET = Load("cpu", 30.0, 0.02, 0.5, 8, 0, False)


def proposal(system) -> Proposal:
    return Proposal("knob", Candidate(system), "why")


def test_need_more_data_is_timed_again_until_the_cap_then_stands(tmp_path):
    undecided = STOCK.with_changes(name="undecided", depth=3)
    fp, inc = fingerprint(), Incumbent(Candidate(STOCK))
    with Memory(tmp_path / "m.sqlite") as memory:
        for timed in range(1, MAX_RETIMES + 2):
            memory.record_evaluation(fp, evaluation(undecided, gain=0.02, verdict=Outcome.NEED_MORE_DATA), CONFIG,
                                     load=QUIET)
            recall = Recall.snapshot(memory, fp)
            selected, reused, _ = select({"knob": [proposal(undecided)]}, inc, recall, limit=3)
            if timed <= MAX_RETIMES:  # not final: timed again
                assert recall.verdict(Candidate(undecided).hash) is None
                assert [p.candidate.name for p in selected] == ["undecided"] and not reused
            else:  # timed 1 + MAX_RETIMES times without a decision: the last verdict stands
                assert not selected and reused[0][1].verdict is Outcome.NEED_MORE_DATA


def test_a_decision_after_need_more_data_is_final(tmp_path):
    system = STOCK.with_changes(name="s", depth=3)
    fp = fingerprint()
    with Memory(tmp_path / "m.sqlite") as memory:
        memory.record_evaluation(fp, evaluation(system, gain=0.02, verdict=Outcome.NEED_MORE_DATA), CONFIG)
        memory.record_evaluation(fp, evaluation(system, gain=-0.05, verdict=Outcome.REJECT), CONFIG)
        assert Recall.snapshot(memory, fp).verdict(Candidate(system).hash).verdict is Outcome.REJECT


def test_verdicts_timed_under_contention_are_timed_again_unless_disqualifying(tmp_path):
    slow, broken, old = (STOCK.with_changes(name=n, depth=d) for n, d in (("slow", 3), ("broken", 4), ("old", 6)))
    fp = fingerprint()
    with Memory(tmp_path / "m.sqlite") as memory:
        memory.record_evaluation(fp, evaluation(slow, gain=-0.1, verdict=Outcome.REJECT), CONFIG, load=CONTENDED)
        memory.record_evaluation(fp, evaluation(broken, gain=None), CONFIG, load=CONTENDED)  # guard: no timing
        memory.record_evaluation(fp, evaluation(old, gain=-0.1, verdict=Outcome.REJECT), CONFIG)  # load unknown
        recall = Recall.snapshot(memory, fp)
    by_name = {r.candidate.name: r for r in recall.evaluations}
    assert unsettled(by_name["slow"]) == "timed under contention"
    assert unsettled(by_name["broken"]) is None and unsettled(by_name["old"]) is None
    assert recall.verdict(Candidate(slow).hash) is None
    assert recall.verdict(Candidate(broken).hash) is not None and recall.verdict(Candidate(old).hash) is not None


def test_undecided_against_counts_only_undecided_verdicts_of_the_system_against_that_incumbent(tmp_path):
    """Only need more data with the budget spent (`Reason.UNDECIDED`) counts towards a powered
    retime: not a void (contaminated) timing, not a screening cleared alone but not after Holm,
    not a decision, not a timing against another incumbent, not another system."""
    system, other_system = STOCK.with_changes(name="s", depth=3), STOCK.with_changes(name="o", depth=4)
    other_inc = STOCK.with_changes(name="inc2", topk=8)
    undecided = {"gain": 0.02, "verdict": Outcome.NEED_MORE_DATA}
    fp = fingerprint()
    with Memory(tmp_path / "m.sqlite") as memory:
        first = memory.record_evaluation(fp, evaluation(system, **undecided), CONFIG, round="t/r2")
        memory.record_evaluation(fp, evaluation(system, other_inc, **undecided), CONFIG, round="t/r3")
        memory.record_evaluation(fp, evaluation(other_system, **undecided), CONFIG, round="t/r3")
        memory.record_evaluation(fp, evaluation(system, gain=0.02, verdict=Outcome.NEED_MORE_DATA,
                                                reasons=(Reason.CONTAMINATED,)), CONFIG, round="t/r4")
        memory.record_evaluation(fp, evaluation(system, gain=0.02, verdict=Outcome.NEED_MORE_DATA,
                                                reasons=(Reason.CLEARS_THRESHOLD, Reason.NOT_SIGNIFICANT)),
                                 CONFIG, round="t/r5")
        last = memory.record_evaluation(fp, evaluation(system, gain=0.02, verdict=Outcome.NEED_MORE_DATA,
                                                       reasons=(Reason.UNDECIDED, Reason.REMEASURED)),
                                        CONFIG, round="t/r6")
        recall = Recall.snapshot(memory, fp)
    s, stock = Candidate(system).hash, Candidate(STOCK).hash
    assert [r.id for r in recall.undecided_against(s, stock)] == [last, first]  # newest first
    assert len(recall.undecided_against(s, Candidate(other_inc).hash)) == 1
    assert recall.undecided_against(Candidate(other_inc).hash, stock) == ()


def test_retime_factor_doubles_per_undecided_verdict_up_to_the_cap():
    assert [retime_factor(n) for n in range(5)] == [1, 2, 4, 4, 4]
