"""What a run's time budget holds, said before its first round: the rounds and the final
measurement that fit in the time left, by the estimates of `budget.py`.

The rule the run keeps (`run.py`): the budget's clock does not count the wait for another run's
timing lock (`waited_line`). The noise floor, when it must be measured, and the incumbent's first
cost table are measured whatever is left — nothing can be estimated before them — and right after
them the run says what fits (`plan_line`). From then on nothing starts that its estimate says
cannot finish inside the budget: a round (a smaller one when only that fits), a candidate's
comparisons (once a round's candidates are known, it times only those that fit with the final
measurement after them, each by its own estimate, compile warm-up included, and says which it
left out: `budget.fitting_selection`), the cost table of a newly promoted incumbent, the final
measurement (skipped, with a line saying so). The final measurement kept is the one the round may
leave: a candidate that would compile as the final system reserves that warm-up too.

Owns: the plan's arithmetic and its lines. Does not own the estimates (`budget.py`) or stopping.
"""

from __future__ import annotations

import math

from specpilot.loop.config import BUDGET_ROUNDS


def rounds_that_fit(left: float, rounds: int, estimate: float, reserve: float) -> int:
    """Whole rounds of `estimate` seconds that fit in `left` seconds with `reserve` kept for the
    final measurement, at most `rounds`."""
    if math.isinf(left) or estimate <= 0:
        return rounds
    return max(0, min(rounds, math.floor((left - reserve) / estimate)))


def plan_line(left: float, rounds: int, estimate: float, reserve: float | None, fitting: int,
              candidates: int) -> str:
    """The budget's plan before the first round: `rounds` still to run of ~`estimate` s each,
    `reserve` s for the final measurement (None: no final measurement), and the candidates of the
    next round that fit (`fitting`, `budget.fitting_candidates`; `candidates` in a full round)."""
    final = f" and the final measurement (~{reserve:.0f} s)" if reserve is not None else ""
    beside = f" beside the final measurement (~{reserve:.0f} s)" if reserve is not None else ""
    head = f"budget: {left:.0f} s left" if left > 0 else f"budget: used up ({-left:.0f} s over)"
    n = rounds_that_fit(left, rounds, estimate, reserve or 0.0)
    if n and rounds >= BUDGET_ROUNDS:  # the run is sized by its budget (`config.for_device`)
        return (f"{head}: about {n} round(s) (~{estimate:.0f} s each){final} fit; the budget sizes the run "
                f"(shorter rounds leave room for more)")
    if n == rounds:
        return f"{head}: the {rounds} round(s) (~{estimate:.0f} s each){final} fit"
    if n:
        return f"{head}: {n} of the {rounds} round(s) (~{estimate:.0f} s each){final} fit"
    if 0 < fitting < candidates:
        return (f"{head}: a full round (~{estimate:.0f} s) does not fit{beside}; a round of {fitting} candidate(s) "
                f"instead of {candidates} does")
    if reserve is None:
        return f"{head}: no round (~{estimate:.0f} s) fits: the run stops without one and writes its report"
    if reserve <= left:
        return (f"{head}: no round (~{estimate:.0f} s) fits{beside}: the run goes on to the final measurement "
                "without one")
    return (f"{head}: no round (~{estimate:.0f} s) fits, nor the final measurement (~{reserve:.0f} s): the run "
            "stops without either and writes its report")


def waited_line(waited: float, left: float, budget: float) -> str:
    """What a run that waited `waited` s for the timing lock has left of its `budget` s: the wait
    is not counted."""
    return (f"budget: waited {waited:.0f} s for another timing run; the wait is not counted: {left:.0f} s of the "
            f"{budget:.0f} s left")
