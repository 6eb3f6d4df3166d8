"""The decision: does a candidate's forcing look like stock's? `compare` and `Verdict`.

Owns the rule (written down here, where it is implemented). Given a candidate's and stock's
outputs forced through the same scorer (`forcing.py`) and a `GuardConfig`:

1. Rate rule. D = pooled mismatch rate(candidate) - pooled mismatch rate(stock), every mismatch
   counted (near-ties too). Its one-sided bounds at `confidence` come from a bootstrap over whole
   sequences, paired by prompt when both sides have the same prompts (`statistics.py`).
   - `RateTest.EXCESS` (default), H0: D <= rate_margin. Reject when lower bound > rate_margin, i.e.
     when we are `confidence` sure the candidate mismatches more than `rate_margin` (0.5 pp) above
     stock. Simulated with 40 prompts x 2048 tokens (`simulation.py`)
     it rejected 0 of 2000 equal systems, 5.8% of systems exactly at the margin and 99.4% of
     systems at +1 pp (paired; 91.5% unpaired).
   - `RateTest.NON_INFERIORITY`, H0: D >= rate_margin. Reject unless upper bound < it: the
     candidate must demonstrate closeness, so small samples are rejected.
2. Large-margin rule. A mismatch whose margin exceeds `near_tie_nats` (see `config.py`) is not
   explained by rounding. Reject when the candidate has more of them than stock (plus
   `large_margin_allowance`, default 0). Counts, not rates: with the same prompts and token limit
   both sides score about the same number of tokens, and a lossless system should have none.

The candidate passes when neither rule rejects. Stock vs stock therefore always passes (D = 0,
equal counts). Cautions (few sequences, stock's own large-margin mismatches, unpaired prompts)
are reported as enums, not folded into the decision.

Does not own forcing, the bootstrap, or the entry points that force and then compare (`gate.py`).
Does not judge output length: a system that stops early mismatches nothing (the controller checks
token counts, `specpilot.control.outputs`); both summaries carry `tokens` for that.
"""

from __future__ import annotations

import enum
from dataclasses import asdict, dataclass

import numpy as np

from specpilot.errors import ConfigError
from specpilot.guard.config import DTYPES, GuardConfig, Pairing, RateTest
from specpilot.guard.forcing import ForcingResult
from specpilot.guard.records import match_prompts
from specpilot.guard.statistics import RateDifference, SequenceCounts, rate_difference


class Rule(enum.Enum):
    RATE = "rate"  # mismatch rate above stock's by more than the margin, at the confidence
    LARGE_MARGIN = "large-margin"  # more large-margin mismatches than stock


class Caution(enum.Enum):
    FEW_SEQUENCES = "few-sequences"  # fewer than min_sequences: the bootstrap bound is optimistic
    STOCK_LARGE_MARGIN = "stock-large-margin"  # stock itself exceeds the near-tie threshold
    UNPAIRED = "unpaired"  # prompt lists differ: independent resampling (Pairing.AUTO)


@dataclass(frozen=True)
class ForcingSummary:
    """One side's counts under the verdict's near-tie threshold."""

    sequences: int
    tokens: int
    mismatches: int
    near_ties: int  # mismatches with margin <= near_tie_nats
    large_margin: int  # mismatches with margin > near_tie_nats
    rate: float  # mismatches / tokens
    max_near_tie_nats: float  # largest margin among near-ties (0 if none)
    max_margin_nats: float  # largest margin among all mismatches (0 if none)
    sequences_with_mismatch: int

    @classmethod
    def of(cls, result: ForcingResult, near_tie_nats: float) -> "ForcingSummary":
        tokens, mism, large = result.per_sequence(near_tie_nats)
        margins = result.mismatch_margins()
        near = margins[margins <= near_tie_nats]
        return cls(
            sequences=len(result.sequences),
            tokens=int(tokens.sum()),
            mismatches=int(mism.sum()),
            near_ties=int(mism.sum() - large.sum()),
            large_margin=int(large.sum()),
            rate=result.rate,
            max_near_tie_nats=float(near.max()) if near.size else 0.0,
            max_margin_nats=float(margins.max()) if margins.size else 0.0,
            sequences_with_mismatch=int((mism > 0).sum()),
        )

    def describe(self) -> str:
        return (f"{self.mismatches}/{self.tokens} mismatches = {100 * self.rate:.3f}% over {self.sequences} sequences; "
                f"{self.near_ties} near-ties (max {self.max_near_tie_nats:.3g} nats), {self.large_margin} "
                f"large-margin (max {self.max_margin_nats:.3g} nats)")


@dataclass(frozen=True)
class Verdict:
    passed: bool
    violated: tuple[Rule, ...]  # empty when passed
    candidate: ForcingSummary
    stock: ForcingSummary
    rate: RateDifference
    rate_margin: float  # allowed excess rate (fraction of tokens)
    rate_test: RateTest
    near_tie_nats: float
    large_margin_allowance: int
    dtype: str  # the scorer's dtype
    cautions: tuple[Caution, ...] = ()

    @property
    def difference(self) -> float:
        return self.rate.difference

    @property
    def bound(self) -> float:
        """The bound the rate rule compared with the margin (lower for EXCESS, upper otherwise)."""
        return self.rate.lower if self.rate_test is RateTest.EXCESS else self.rate.upper

    def summary(self) -> str:
        """A few human lines; the fields, not this text, are what programs read."""
        c, s, r = self.candidate, self.stock, self.rate
        word = "PASS" if self.passed else "REJECT (" + ", ".join(v.value for v in self.violated) + ")"
        side = "lower" if self.rate_test is RateTest.EXCESS else "upper"
        lines = [
            f"token forcing ({self.dtype} scorer): {word}",
            f"  candidate: {c.describe()}",
            f"  stock:     {s.describe()}",
            f"  difference {100 * r.difference:+.3f} pp, {side} {100 * r.confidence:.0f}% bound "
            f"{100 * self.bound:+.3f} pp vs margin {100 * self.rate_margin:.2f} pp "
            f"({'paired' if r.paired else 'independent'} bootstrap, {r.resamples} resamples)",
            f"  large-margin (> {self.near_tie_nats:g} nats): candidate {c.large_margin} vs stock {s.large_margin}"
            + (f" + {self.large_margin_allowance} allowed" if self.large_margin_allowance else ""),
        ]
        lines += [f"  caution: {_CAUTION_TEXT[k]}" for k in self.cautions]
        return "\n".join(lines)

    def to_dict(self) -> dict:
        d = asdict(self)
        d["violated"] = [v.value for v in self.violated]
        d["cautions"] = [k.value for k in self.cautions]
        d["rate_test"] = self.rate_test.value
        d["difference"], d["bound"] = self.difference, self.bound
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "Verdict":
        d = {k: v for k, v in d.items() if k not in ("difference", "bound")}
        return cls(
            **{**d,
               "violated": tuple(Rule(v) for v in d["violated"]),
               "cautions": tuple(Caution(k) for k in d.get("cautions", ())),
               "rate_test": RateTest(d["rate_test"]),
               "candidate": ForcingSummary(**d["candidate"]),
               "stock": ForcingSummary(**d["stock"]),
               "rate": RateDifference.from_dict(d["rate"])}
        )


_CAUTION_TEXT = {
    Caution.FEW_SEQUENCES: "few sequences: the percentile-bootstrap bound is optimistic below ~20 prompts",
    Caution.STOCK_LARGE_MARGIN: "stock itself has large-margin mismatches: the near-tie threshold may be "
                                "too tight for this hardware, or the scorer and the stock engine disagree",
    Caution.UNPAIRED: "candidate and stock prompts differ: sequences resampled independently",
}


def rate_rule_rejects(rate: RateDifference, config: GuardConfig) -> bool:
    """Rule 1 of the module docstring."""
    if config.rate_test is RateTest.EXCESS:
        return rate.lower > config.rate_margin
    return not rate.upper < config.rate_margin


def pair_prompts(candidate: list[tuple[int, ...]], stock: list[tuple[int, ...]], pairing: Pairing):
    """Index lists (ic, is) putting sequences of equal prompts at equal positions, or None for
    independent resampling. Raises (exit 2) when `Pairing.REQUIRED` and the prompts differ."""
    if pairing is Pairing.INDEPENDENT:
        return None
    matched = match_prompts(candidate, stock)
    if matched is None and pairing is Pairing.REQUIRED:
        raise ConfigError(
            f"candidate and stock outputs are not for the same prompts ({len(candidate)} vs "
            f"{len(stock)} records); generate both from one prompt list"
        )
    return matched


def _by_prompt(prompts: list[tuple[int, ...]]) -> list[int]:
    return sorted(range(len(prompts)), key=lambda i: (prompts[i], i))


def compare(candidate: ForcingResult, stock: ForcingResult, config: GuardConfig = GuardConfig()) -> Verdict:
    """Apply the two rules of the module docstring to two forcings by the same scorer."""
    if candidate.dtype != stock.dtype:
        raise ConfigError(f"candidate forced in {candidate.dtype} but stock in {stock.dtype}; use one scorer")
    tau = config.near_tie_for(DTYPES.get(candidate.dtype))
    matched = pair_prompts(candidate.prompts, stock.prompts, config.pairing)
    paired = matched is not None
    # sorted by prompt either way, so the resamples (and the verdict) do not depend on line order
    ic, is_ = matched if paired else (_by_prompt(candidate.prompts), _by_prompt(stock.prompts))
    n_c, m_c, _ = candidate.per_sequence(tau)
    n_s, m_s, _ = stock.per_sequence(tau)
    c_counts = SequenceCounts(n_c, m_c).take(np.array(ic, dtype=np.int64))
    s_counts = SequenceCounts(n_s, m_s).take(np.array(is_, dtype=np.int64))
    rate = rate_difference(c_counts, s_counts, paired=paired, confidence=config.confidence,
                           resamples=config.resamples, seed=config.seed)
    c_sum, s_sum = ForcingSummary.of(candidate, tau), ForcingSummary.of(stock, tau)
    violated = [Rule.RATE] if rate_rule_rejects(rate, config) else []
    if c_sum.large_margin > s_sum.large_margin + config.large_margin_allowance:
        violated.append(Rule.LARGE_MARGIN)
    cautions = []
    if min(c_sum.sequences, s_sum.sequences) < config.min_sequences:
        cautions.append(Caution.FEW_SEQUENCES)
    if s_sum.large_margin > 0:
        cautions.append(Caution.STOCK_LARGE_MARGIN)
    if not paired and config.pairing is Pairing.AUTO:
        cautions.append(Caution.UNPAIRED)
    return Verdict(
        passed=not violated,
        violated=tuple(violated),
        candidate=c_sum,
        stock=s_sum,
        rate=rate,
        rate_margin=config.rate_margin,
        rate_test=config.rate_test,
        near_tie_nats=tau,
        large_margin_allowance=config.large_margin_allowance,
        dtype=candidate.dtype,
        cautions=tuple(cautions),
    )
