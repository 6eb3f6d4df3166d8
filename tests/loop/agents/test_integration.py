"""The integration agent: stacks independent changes that were measured as gains, and only those."""

import pytest
from loop_fixtures import CONFIG, STOCK, context, evaluation, fingerprint

from specpilot.control.rule import Reason, Outcome
from specpilot.loop.agents.integration import IntegrationAgent
from specpilot.loop.recall import Recall
from specpilot.loop.systems import Candidate, Incumbent
from specpilot.memory.store import Memory


def recall_of(tmp_path, evaluations) -> Recall:
    fp = fingerprint()
    with Memory(tmp_path / "m.sqlite") as memory:
        for e in evaluations:
            memory.record_evaluation(fp, e, CONFIG)
        return Recall.snapshot(memory, fp)


def test_stacks_the_best_change_of_each_group_and_proposes_the_best_alone(tmp_path):
    wider = STOCK.with_changes(name="wider", tree_budget=12)
    wider_more = STOCK.with_changes(name="wider-more", tree_budget=16)  # same group, smaller gain: left out
    syncs = STOCK.with_changes(name="syncs", sync_every=2)
    recall = recall_of(tmp_path, [
        evaluation(wider, gain=0.04, verdict=Outcome.NEED_MORE_DATA),  # below the bar: a small gain
        evaluation(wider_more, gain=0.03, verdict=Outcome.NEED_MORE_DATA),
        evaluation(syncs, gain=0.02, verdict=Outcome.REJECT, reasons=(Reason.CLEARS_THRESHOLD, Reason.NOT_SELECTED)),
        evaluation(STOCK.with_changes(name="slower", depth=3), gain=-0.05, verdict=Outcome.REJECT),
        evaluation(STOCK.with_changes(name="lossy", fault="accept-unverified"), gain=None),
    ])
    stack, single = IntegrationAgent().propose(context(recall=recall))
    s = stack.candidate.system
    assert (s.tree_budget, s.sync_every, s.depth, s.fault) == (12, 2, 5, "")
    gains = {r.id: r.gain for r in recall.evaluations}
    assert stack.details["entries"] == [1, 3]
    assert stack.details["estimated_gain"] == pytest.approx((1 + gains[1]) * (1 + gains[3]) - 1, rel=1e-12)
    assert stack.rationale.startswith("stack of tree_budget 7->12") and stack.candidate.patch is None
    assert (single.candidate.system.tree_budget, single.candidate.system.sync_every) == (12, 1)


def test_a_change_measured_on_another_tree_does_not_transfer(tmp_path):
    wider = STOCK.with_changes(name="wider", tree_budget=12)
    syncs = STOCK.with_changes(name="syncs", sync_every=2)
    recall = recall_of(tmp_path, [evaluation(wider, gain=0.04, verdict=Outcome.NEED_MORE_DATA),
                                  evaluation(syncs, gain=0.02, verdict=Outcome.NEED_MORE_DATA)])
    deeper = Incumbent(Candidate(STOCK.with_changes(name="deeper", depth=7)), 9, 0.1)  # the tree group moved since
    out = IntegrationAgent().propose(context(incumbent=deeper, recall=recall))
    assert len(out) == 1 and out[0].candidate.system.sync_every == 2 and out[0].candidate.system.depth == 7
    already = Incumbent(Candidate(STOCK.with_changes(name="synced", sync_every=2)), 9, 0.1)
    out = IntegrationAgent().propose(context(incumbent=already, recall=recall))
    assert [p.candidate.system.tree_budget for p in out] == [12] and out[0].candidate.system.sync_every == 2
