"""The promotion rule and its bounded sequential policy.

The rule (from the SpecPilot article): promote a candidate only if

    (1) it passed the token-forcing guard (checked first, on a cheap subset, before any timing),
    (2) its outputs are comparable to the incumbent's (well-formed, not materially shorter), and
    (3) the lower confidence bound of its gain exceeds  threshold = min_gain + noise_multiplier * noise
        (defaults 1% + 2 x the stock-vs-stock noise floor of `stats.NoiseFloor`).

Sequential policy. Decisions are taken at K = `config.looks` pre-declared looks: the first after
`blocks` blocks, then after each `extra_step` further blocks until the `extra_blocks` budget is
spent. At look k:

    PROMOTE          if L_k > threshold, L_k = `GainEstimate.lower_bound(alpha / K)` (the smaller of
                     the one-sided BCa and Student-t bounds, see stats.py)
    REJECT           if U < threshold, U the upper end of the two-sided `level` interval
                     (more blocks are unlikely to lift it over the bar)
    NEED_MORE_DATA   otherwise: measure the next step, or report it if the budget is spent.

alpha = (1 - level) / 2 is the one-sided error of the article's "95% lower bound". Spending it as
alpha / K per look (Bonferroni over looks) keeps the chance of a false promotion over all looks
<= alpha whatever the stopping; with no extra budget (K = 1), L is the lower end of the reported
95% interval, as in the article.
Stopping early to reject only lowers the false-promotion rate.

Owns: `Outcome`, `Reason`, `Decision`, `promotion_threshold`, `decide` and `run_sequential`, all
pure (no processes), so simulation tests drive the same code the controller runs. Does not own
the statistics (`stats.py`) or multiplicity across candidates (`multiplicity.py`).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Callable, Sequence

from specpilot.control.config import ControllerConfig
from specpilot.control.stats import GainEstimate, NoiseFloor


class Outcome(enum.Enum):
    PROMOTE = "promote"
    REJECT = "reject"
    NEED_MORE_DATA = "need-more-data"

    @property
    def exit_code(self) -> int:
        """The CLI's exit status: 0 promote, 1 reject, 3 need more data (2 is bad input)."""
        return {Outcome.PROMOTE: 0, Outcome.REJECT: 1, Outcome.NEED_MORE_DATA: 3}[self]


class Reason(enum.Enum):
    CLEARS_THRESHOLD = "clears-threshold"  # lower bound above the threshold
    BELOW_THRESHOLD = "below-threshold"  # upper bound below the threshold
    UNDECIDED = "undecided"  # interval straddles the threshold and the extra-block budget is spent
    GUARD_FAILED = "guard-failed"  # the token-forcing gate rejected it; never timed
    OUTPUTS_SHORTER = "outputs-shorter"  # returned materially fewer tokens than the incumbent
    BAD_OUTPUT = "bad-output"  # malformed response (shape, types, lengths)
    WORKER_FAILED = "worker-failed"  # the candidate's worker raised, crashed or timed out
    NOT_SIGNIFICANT = "not-significant-after-multiplicity"  # cleared alone, not after Holm / BH
    NOT_SELECTED = "not-selected"  # significant, but another candidate of the round won
    REMEASURED = "remeasured"  # the round's winner: numbers are from fresh blocks
    CONTAMINATED = "contaminated"  # too many void blocks (a foreign process ran while arms were timed)


# reasons that say the candidate is broken, not merely slow (no gain can stand for it)
DISQUALIFYING = frozenset({Reason.GUARD_FAILED, Reason.OUTPUTS_SHORTER, Reason.BAD_OUTPUT, Reason.WORKER_FAILED})


@dataclass(frozen=True)
class Decision:
    verdict: Outcome
    reasons: tuple[Reason, ...]
    threshold: float  # gain the lower bound had to exceed
    lower_bound: float | None = None  # the bound compared with it (error alpha_look); None if never timed
    alpha_look: float | None = None  # one-sided error spent at this look
    look: int = 0  # 1-based look the decision was taken at (0: not timed)
    looks: int = 0  # pre-declared number of looks
    p_value: float | None = None  # one-sided p of H0: gain <= threshold, Bonferroni-adjusted over looks

    @property
    def promoted(self) -> bool:
        return self.verdict is Outcome.PROMOTE

    def with_verdict(self, verdict: Outcome, *reasons: Reason) -> "Decision":
        """The same numbers under another verdict (multiplicity, selection, output checks)."""
        return Decision(verdict, tuple(dict.fromkeys(self.reasons + reasons)), self.threshold,
                        self.lower_bound, self.alpha_look, self.look, self.looks, self.p_value)

    def to_dict(self) -> dict:
        return {
            "verdict": self.verdict.value,
            "reasons": [r.value for r in self.reasons],
            "threshold": self.threshold,
            "lower_bound": self.lower_bound,
            "alpha_look": self.alpha_look,
            "look": self.look,
            "looks": self.looks,
            "p_value": self.p_value,
        }

    @classmethod
    def from_dict(cls, d: dict) -> "Decision":
        return cls(Outcome(d["verdict"]), tuple(Reason(r) for r in d["reasons"]), d["threshold"],
                   d.get("lower_bound"), d.get("alpha_look"), d.get("look", 0), d.get("looks", 0),
                   d.get("p_value"))

    @classmethod
    def untimed(cls, verdict: Outcome, reason: Reason, threshold: float) -> "Decision":
        return cls(verdict, (reason,), threshold)


def promotion_threshold(config: ControllerConfig, noise: NoiseFloor | float) -> float:
    """min_gain + noise_multiplier * noise (noise as a NoiseFloor or its value)."""
    value = noise.value if isinstance(noise, NoiseFloor) else float(noise)
    return config.min_gain + config.noise_multiplier * value


def decide(estimate: GainEstimate, threshold: float, config: ControllerConfig, look: int) -> Decision:
    """The decision at look `look` (1-based) of `config.looks` from the timing alone."""
    K = config.looks
    if not 1 <= look <= K:
        raise ValueError(f"look {look} outside 1..{K}")
    alpha_look = config.alpha / K
    lower = estimate.lower_bound(alpha_look)
    p = min(1.0, K * estimate.p_value(threshold))
    common = dict(threshold=threshold, lower_bound=lower, alpha_look=alpha_look, look=look, looks=K, p_value=p)
    if lower > threshold:
        return Decision(Outcome.PROMOTE, (Reason.CLEARS_THRESHOLD,), **common)
    if estimate.upper < threshold:
        return Decision(Outcome.REJECT, (Reason.BELOW_THRESHOLD,), **common)
    return Decision(Outcome.NEED_MORE_DATA, (Reason.UNDECIDED,), **common)


def run_sequential(
    measure: Callable[[int, int], Sequence[float]],
    threshold: float,
    config: ControllerConfig,
) -> tuple[GainEstimate, Decision]:
    """Measure blocks look by look until a decision or the budget's end.

    `measure(start, count)` returns the log ratios of blocks start .. start+count-1.
    """
    ratios: list[float] = []
    for look in range(1, config.looks + 1):
        want = config.blocks_at_look(look)
        ratios.extend(measure(len(ratios), want - len(ratios)))
        estimate = GainEstimate(tuple(ratios), config.level, config.resamples, config.seed)
        decision = decide(estimate, threshold, config, look)
        if decision.verdict is not Outcome.NEED_MORE_DATA:
            break
    return estimate, decision
