"""Simulated mismatch counts, to measure how often the rate rule rejects (size and power).

Owns: `Scenario` (a generative model of per-sequence mismatch counts for a stock/candidate pair)
and `rejection_rate` (the fraction of simulated experiments whose rate rule rejects).

The model is built to be harder than independent tokens, since real mismatches are not:
- prompt heterogeneity: prompt i has its own stock near-tie rate p_i ~ Gamma(shape k, mean p);
  both systems see the same prompt (so the paired bootstrap has something to cancel);
- within-sequence clustering: mismatches arrive in bursts, a Poisson number of clusters per
  sequence, each of Geometric(mean c) consecutive mismatches (a flip often puts the text into a
  region of further near-ties), so var(m_i) is ~(2c - 1) times the binomial variance;
- the candidate's rate is p_i + delta (its extra mismatches cluster the same way);
- lengths: n_i tokens, fixed or uniform between a minimum and the limit (early EOS).
The defaults follow the article: p = 0.72% stock rate, 40 prompts x 2048 tokens.

Does not own the test itself (`statistics.py`); it only drives it.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from specpilot.guard.config import GuardConfig
from specpilot.guard.statistics import SequenceCounts, rate_difference
from specpilot.guard.verdict import rate_rule_rejects


@dataclass(frozen=True)
class Scenario:
    delta: float  # true candidate rate minus stock rate (0.01 = 1 percentage point)
    sequences: int = 40
    max_tokens: int = 2048
    min_tokens: int = 2048  # < max_tokens: lengths uniform in [min_tokens, max_tokens]
    stock_rate: float = 0.0072
    heterogeneity: float = 2.0  # Gamma shape k of the per-prompt rate (CV = 1/sqrt(k))
    cluster: float = 3.0  # mean mismatches per burst (1 = no clustering)
    paired: bool = True  # both sides for the same prompts

    def _counts(self, rng: np.random.Generator, rates: np.ndarray, tokens: np.ndarray) -> np.ndarray:
        bursts = rng.poisson(rates * tokens / self.cluster)  # [n]
        # a sum of b Geometric(1/c) variables is b + NegativeBinomial(b, 1/c); 0 when b = 0
        extra = rng.negative_binomial(np.maximum(bursts, 1), 1.0 / self.cluster) * (bursts > 0)
        return np.minimum(bursts + extra, tokens)

    def sample(self, rng: np.random.Generator) -> tuple[SequenceCounts, SequenceCounts]:
        """(candidate, stock) counts of one simulated experiment."""
        n = self.sequences

        def lengths():
            return rng.integers(self.min_tokens, self.max_tokens + 1, size=n)

        def prompt_rates():
            return rng.gamma(self.heterogeneity, self.stock_rate / self.heterogeneity, size=n)

        p_s = prompt_rates()
        p_c = p_s if self.paired else prompt_rates()
        n_s, n_c = lengths(), lengths()
        stock = SequenceCounts(n_s, self._counts(rng, p_s, n_s))
        cand = SequenceCounts(n_c, self._counts(rng, p_c + self.delta, n_c))
        return cand, stock


def rejection_rate(scenario: Scenario, config: GuardConfig = GuardConfig(resamples=2000),
                   replicates: int = 400, seed: int = 0) -> float:
    """Fraction of `replicates` simulated experiments in which the rate rule rejects."""
    rng = np.random.default_rng(seed)
    rejected = 0
    for r in range(replicates):
        cand, stock = scenario.sample(rng)
        diff = rate_difference(cand, stock, paired=scenario.paired, confidence=config.confidence,
                               resamples=config.resamples, seed=config.seed + r)
        rejected += rate_rule_rejects(diff, config)
    return rejected / replicates
