"""The rate comparison: a sequence-level bootstrap of the difference in mismatch rates.

Owns: `SequenceCounts` (tokens and mismatches per sequence), `RateDifference` (the estimate and
its one-sided bounds) and `rate_difference`, the bootstrap itself.

The quantity. A system's mismatch rate is the pooled ratio r = sum_i m_i / sum_i n_i over its
sequences i (m_i mismatches among n_i generated tokens), estimating the ratio of expected
mismatches to expected tokens over the prompt distribution. D = r_candidate - r_stock.

Why whole sequences. Mismatches inside one sequence are not independent: near-ties cluster in
some prompts (code with interchangeable identifiers, lists) and a flipped token changes the rest
of the text. A token-level binomial test would treat 100k tokens as 100k independent trials and
overstate the evidence. Resampling whole sequences keeps every within-sequence dependence, and
the prompts are the independent units.

Pairing. When candidate and stock outputs are for the same prompts, prompt i is resampled as a
unit with both its sequences (paired bootstrap): how prone a prompt is to near-ties affects both
systems alike and cancels in D, which narrows the interval. Otherwise the two sets are resampled
independently.

Bounds. Percentile bootstrap: `lower` is the (1 - confidence) quantile of the resampled D,
`upper` its `confidence` quantile; each is a one-sided bound at `confidence`. Simulated at the
boundary of H0 (`simulation.py`, 2000 experiments each, clustered mismatches, stock 0.72%, +0.5 pp,
2048 tokens per prompt) a 95% lower bound exceeds the margin in 5.8% of experiments with 40
prompts, 5.5% with 20 and 7.4% with 10: close to nominal with tens of prompts, optimistic below
~20, where the verdict warns. For contrast, a token-level binomial z-test on the same data
rejects 24% of the time: it treats clustered mismatches as independent evidence.

Does not own what is counted (`forcing.py`) or the decision rule (`verdict.py`).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np

from specpilot.errors import SpecPilotError

_BLOCK_ELEMENTS = 1 << 22  # resample in blocks of about this many indices to bound memory


@dataclass(frozen=True, eq=False)
class SequenceCounts:
    tokens: np.ndarray  # [n] int64 generated tokens per sequence
    mismatches: np.ndarray  # [n] int64 mismatches per sequence

    def __post_init__(self):
        if self.tokens.shape != self.mismatches.shape or self.tokens.ndim != 1:
            raise ValueError("tokens and mismatches must be 1-D arrays of one shape")
        if (self.mismatches > self.tokens).any() or (self.mismatches < 0).any():
            raise ValueError("need 0 <= mismatches <= tokens per sequence")

    @property
    def num_sequences(self) -> int:
        return int(self.tokens.shape[0])

    @property
    def rate(self) -> float:
        n = int(self.tokens.sum())
        return int(self.mismatches.sum()) / n if n else 0.0

    def take(self, index: np.ndarray) -> "SequenceCounts":
        return SequenceCounts(self.tokens[index], self.mismatches[index])


@dataclass(frozen=True)
class RateDifference:
    candidate_rate: float
    stock_rate: float
    difference: float  # candidate_rate - stock_rate (point estimate on the data)
    lower: float  # one-sided lower bound of the difference at `confidence`
    upper: float  # one-sided upper bound of the difference at `confidence`
    standard_error: float  # standard deviation of the bootstrap differences
    confidence: float
    resamples: int
    paired: bool
    candidate_sequences: int
    stock_sequences: int

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "RateDifference":
        return cls(**d)


def _resampled_rates(counts: SequenceCounts, index: np.ndarray) -> np.ndarray:
    """index [R,n] of sequences -> [R] pooled rates of each resample (0 where it has no tokens)."""
    n = counts.tokens[index].sum(axis=1)
    m = counts.mismatches[index].sum(axis=1)
    return np.divide(m, n, out=np.zeros(n.shape, dtype=np.float64), where=n > 0)


def bootstrap_differences(candidate: SequenceCounts, stock: SequenceCounts, paired: bool,
                          resamples: int, seed: int) -> np.ndarray:
    """[resamples] differences of pooled rates, resampling whole sequences (jointly when paired)."""
    nc, ns = candidate.num_sequences, stock.num_sequences
    if nc == 0 or ns == 0:
        raise SpecPilotError("the rate comparison needs at least one sequence on each side")
    if paired and nc != ns:
        raise ValueError("a paired bootstrap needs the same number of sequences on both sides")
    rng = np.random.default_rng(seed)
    out = np.empty(resamples, dtype=np.float64)
    block = max(1, _BLOCK_ELEMENTS // max(nc, ns))
    for s in range(0, resamples, block):
        R = min(block, resamples - s)
        ic = rng.integers(0, nc, size=(R, nc))  # [R,nc]
        is_ = ic if paired else rng.integers(0, ns, size=(R, ns))  # [R,ns]
        out[s : s + R] = _resampled_rates(candidate, ic) - _resampled_rates(stock, is_)
    return out


def rate_difference(candidate: SequenceCounts, stock: SequenceCounts, paired: bool,
                    confidence: float = 0.95, resamples: int = 10_000, seed: int = 0) -> RateDifference:
    """Point estimate and one-sided percentile-bootstrap bounds of rate(candidate) - rate(stock).

    When `paired`, candidate[i] and stock[i] are outputs for the same prompt.
    """
    diffs = bootstrap_differences(candidate, stock, paired, resamples, seed)
    lower, upper = np.quantile(diffs, [1.0 - confidence, confidence])
    rc, rs = candidate.rate, stock.rate
    return RateDifference(
        candidate_rate=rc,
        stock_rate=rs,
        difference=rc - rs,
        lower=float(lower),
        upper=float(upper),
        standard_error=float(diffs.std(ddof=1)),
        confidence=confidence,
        resamples=resamples,
        paired=paired,
        candidate_sequences=candidate.num_sequences,
        stock_sequences=stock.num_sequences,
    )
