"""The report's reading of the journal."""

from specpilot.loop.journal import Event, EventKind
from specpilot.loop.report import rounds_from_journal


def event(kind, round, **data):
    return Event(kind, round, 0.0, "2026-12-01T00:00:00+00:00", kind.value, data)


def test_a_stop_before_a_round_is_not_a_round():
    """The loop stops before round 6 when it would not fit (run4 on the H200 rendered a phantom
    'Round 6: incumbent None (cut short)' from that stop event)."""
    events = [event(EventKind.MEASURE, 5, incumbent={"name": "stock"}), event(EventKind.ROUND_END, 5, seconds=44.0),
              event(EventKind.STOP, 6, reason="budget")]
    rounds = rounds_from_journal(events)
    assert [r["index"] for r in rounds] == [5]
    assert rounds[0]["completed"]


def test_a_round_cut_short_stays_in_the_report():
    events = [event(EventKind.MEASURE, 1, incumbent={"name": "stock"}), event(EventKind.PROPOSALS, 1, counts={"knob": 3})]
    (only,) = rounds_from_journal(events)
    assert only["index"] == 1 and not only["completed"] and only["proposals"] == {"knob": 3}
