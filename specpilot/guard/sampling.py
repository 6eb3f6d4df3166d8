"""The sampling guard: token forcing's analogue for sampled outputs, by the randomized PIT.

    pit_values(probs, tokens, generator, order) -> u          [T] float64, NaN where p(x) = 0
    uniformity(u, config) -> Uniformity                       one side's counts, statistic, p-value
    compare_sampled(candidate_u, stock_u, config) -> SamplingVerdict

Owns the transform, the uniformity tests and the decision rule, on probabilities the caller
supplies. The caller obtains them by teacher forcing: for each emitted token x_t of a recorded
output (candidate's or stock's), feed its context to the target on the stock engine and take the
*processed* next-token distribution p_t (temperature, top-k, top-p, min-p of the request applied,
the same processing on both sides). Does not own forcing, the records, the CLI or the engine.

The transform. With tokens in a fixed order given by p (`TokenOrder`), F(x-) the mass of tokens
before x and V ~ U(0,1) independent (drawn from the caller's seeded generator),

    u_t = F_t(x_t-) + V_t * p_t(x_t).

If x_t ~ p_t exactly then u_t ~ U(0,1), and, because V_t is fresh and p_t is a function of the
context, u_t is independent of everything before it: the u's of a whole stream are i.i.d. uniform
even though each context depends on earlier samples (the prequential / Rosenblatt argument). So,
unlike the greedy guard's sequence bootstrap, tokens are the independent units here. A token with
p_t(x_t) = 0 (outside the target's top-p/top-k/min-p support) has no u: it is NaN and is counted
as a zero-probability token, never tested for uniformity.

Order. Any order that is a function of p keeps the u's uniform under exactness; the order decides
which faults are visible in the pooled u's. `TokenOrder.PROBABILITY` (default: descending p, ties
by ascending id) puts every context's likely tokens at small u, so faults that move mass between
likely and unlikely tokens (temperature, truncation, a bias on a fixed id subset, an unrenormalised
correction) shift the pooled u's one way in every context. `TokenOrder.ID` (ascending id) is
the plain CDF; there those shifts land at random places in each context and partly average out
over contexts: at 16384 tokens it rejected the unrenormalised correction in 0/10 seeds and top-p
on the sampler only in 4/10, against 10/10 for both in probability order.

The rule (alpha = 0.05 by default; the candidate passes when no rule rejects):
1. Zero-probability rule. Reject when the candidate emitted more tokens with p(x) = 0 than stock
   did (stock should have none; any is `SamplingCaution.STOCK_ZERO_PROBABILITY`). One such token suffices.
2. Uniformity rule. Reject when the candidate's uniformity p-value is below alpha and stock's is
   not: the candidate drifts from its forced distribution more than stock does, mirroring the
   greedy guard's "more than stock" semantics. A two-sided Kolmogorov-Smirnov test against U(0,1)
   (`UniformityTest.KS`, default) or a chi-square on `bins` equal bins (`CHI_SQUARE`). If stock
   itself fails (`SamplingCaution.STOCK_NONUNIFORM`) the rule cannot reject: the scorer does not
   reproduce stock's sampling, and the verdict says so. Exact candidate and exact stock: false
   rejection rate alpha * (1 - alpha).

Token counts. Rule: N >= 16384 scored tokens per side. From the power study on synthetic
contexts (`tests/guard/test_sampling.py`: V = 256, peaky power-law logits, T = 0.7, top-p 0.95;
KS, probability order, 10 seeds per cell): speculative sampling whose rejection branch samples
p instead of the residual is the hardest fault, rejected 4/10 at 8192 tokens and 10/10 at 16384
with a noisy drafter (8/10 and 10/10 with a flatter one); temperature slips (0.7 <-> 1.0), top-p
on the sampler only and a +2 logit bias on every 7th id after 2048 tokens are rejected 10/10 at
4096. Exact samplers: 0/10 rejected at each count. Fewer scored tokens than `min_tokens` on
either side give `SamplingCaution.FEW_TOKENS`. Tokens outside the target's support (one-sided
top-p/top-k, a bias that lifts a token into the nucleus) are caught by rule 1 whatever N is.

The V's must come from a generator the sampler does not share: tokens drawn by
`torch.multinomial` from a CPU generator and V's drawn next from the same generator are
correlated, and exact streams then fail uniformity (4 of 6 at 32768 tokens in the study; 0 of 6
with V's from their own generator). The guard draws V's from its own seeded generator.
"""

from __future__ import annotations

import enum
from dataclasses import asdict, dataclass

import numpy as np
import torch
from scipy import stats

from specpilot.errors import ConfigError


class TokenOrder(enum.Enum):
    PROBABILITY = "probability"  # descending p, ties by ascending id
    ID = "id"  # ascending token id


class UniformityTest(enum.Enum):
    KS = "ks"  # two-sided Kolmogorov-Smirnov against U(0,1)
    CHI_SQUARE = "chi-square"  # Pearson chi-square on `bins` equal bins


class SamplingRule(enum.Enum):
    ZERO_PROBABILITY = "zero-probability"  # emitted tokens the target gives probability 0, more than stock
    UNIFORMITY = "uniformity"  # candidate's u's not uniform at alpha while stock's are


class SamplingCaution(enum.Enum):
    FEW_TOKENS = "few-tokens"  # fewer scored tokens than min_tokens on a side: low power
    STOCK_NONUNIFORM = "stock-nonuniform"  # stock fails the uniformity test itself: the rule cannot reject
    STOCK_ZERO_PROBABILITY = "stock-zero-probability"  # stock emitted tokens outside the scorer's support


@dataclass(frozen=True)
class SamplingGuardConfig:
    alpha: float = 0.05  # significance of the uniformity test (95% confidence)
    test: UniformityTest = UniformityTest.KS
    bins: int = 20  # chi-square bins (B equal bins of [0, 1])
    order: TokenOrder = TokenOrder.PROBABILITY
    min_tokens: int = 16384  # fewer scored tokens per side: Caution.FEW_TOKENS (see module doc)
    seed: int = 0  # seeds the V's of the transform when the caller does not pass a generator

    def __post_init__(self):
        if not 0.0 < self.alpha < 1.0:
            raise ConfigError(f"alpha must be in (0, 1), got {self.alpha}")
        if self.bins < 2:
            raise ConfigError(f"need at least 2 bins, got {self.bins}")

    def generator(self) -> torch.Generator:
        return torch.Generator().manual_seed(self.seed)


def pit_values(probs: torch.Tensor, tokens: torch.Tensor, generator: torch.Generator,
               order: TokenOrder = TokenOrder.PROBABILITY) -> torch.Tensor:
    """Randomized PIT u = F(x-) + V p(x) of each token under its row of probs (module docstring).

    probs [T,V] (rows are renormalised in float64), tokens [T] int64 -> u [T] float64; NaN where
    p(x) = 0. One V per token is drawn from `generator` (on the CPU), zero-probability ones included,
    so the draws do not depend on the data; it must not be the generator that sampled the tokens.
    """
    if probs.ndim != 2 or tokens.shape != probs.shape[:1]:
        raise ValueError(f"need probs [T,V] and tokens [T], got {tuple(probs.shape)} and {tuple(tokens.shape)}")
    p = probs.detach().to("cpu", torch.float64)  # [T,V]
    x = tokens.detach().to("cpu", torch.int64)  # [T]
    if (p < 0).any() or not torch.isfinite(p).all():
        raise ValueError("probabilities must be finite and non-negative")
    if ((x < 0) | (x >= p.shape[1])).any():
        raise ValueError(f"token ids must lie in [0, {p.shape[1]})")
    p = p / p.sum(dim=1, keepdim=True)
    v = torch.rand(x.shape, generator=generator, dtype=torch.float64)  # [T]
    px = p.gather(1, x[:, None])[:, 0]  # [T]
    if order is TokenOrder.ID:
        before = (p.cumsum(dim=1) - p).gather(1, x[:, None])[:, 0]  # [T] F(x-)
    else:
        # stable sort of -p: descending p, equal p in ascending id
        idx = torch.sort(-p, dim=1, stable=True).indices  # [T,V]
        sorted_p = p.gather(1, idx)  # [T,V]
        rank = torch.argsort(idx, dim=1).gather(1, x[:, None])  # [T,1] position of x in the order
        before = (sorted_p.cumsum(dim=1) - sorted_p).gather(1, rank)[:, 0]  # [T]
    u = (before + v * px).clamp_(0.0, 1.0)
    return torch.where(px > 0, u, torch.full_like(u, float("nan")))


@dataclass(frozen=True)
class Uniformity:
    """One side's tokens and its uniformity test."""

    tokens: int  # all emitted tokens
    scored: int  # tokens with p(x) > 0, the ones tested
    zero_probability: int  # tokens with p(x) = 0 (u undefined)
    test: UniformityTest
    statistic: float  # KS D, or the chi-square statistic
    p_value: float  # 1.0 when nothing was scored
    bins: int  # chi-square bins (reported for KS too, unused)

    def describe(self) -> str:
        name = "KS D" if self.test is UniformityTest.KS else f"chi2({self.bins - 1})"
        return (f"{self.scored}/{self.tokens} tokens scored, {self.zero_probability} with p(x) = 0; "
                f"{name} = {self.statistic:.4g}, p = {self.p_value:.3g}")


def uniformity(u: torch.Tensor | np.ndarray, config: SamplingGuardConfig = SamplingGuardConfig()) -> Uniformity:
    """Test the finite u's [T] for U(0,1) by `config.test`; NaNs are counted as zero-probability tokens."""
    u = np.asarray(u.cpu() if isinstance(u, torch.Tensor) else u, dtype=np.float64).ravel()  # [T]
    finite = u[~np.isnan(u)]
    n = int(finite.size)
    if n == 0:
        statistic, p_value = 0.0, 1.0
    elif config.test is UniformityTest.KS:
        res = stats.kstest(finite, "uniform", alternative="two-sided")
        statistic, p_value = float(res.statistic), float(res.pvalue)
    else:
        counts = np.bincount(np.minimum((finite * config.bins).astype(np.int64), config.bins - 1),
                             minlength=config.bins)  # [bins]
        res = stats.chisquare(counts)
        statistic, p_value = float(res.statistic), float(res.pvalue)
    return Uniformity(tokens=int(u.size), scored=n, zero_probability=int(u.size) - n, test=config.test,
                      statistic=statistic, p_value=p_value, bins=config.bins)


@dataclass(frozen=True)
class SamplingVerdict:
    passed: bool
    violated: tuple[SamplingRule, ...]  # empty when passed
    candidate: Uniformity
    stock: Uniformity
    alpha: float
    order: TokenOrder
    cautions: tuple[SamplingCaution, ...] = ()

    def reason(self) -> str:
        """One line naming the violated rules and their numbers ('' when the verdict passed)."""
        c, s = self.candidate, self.stock
        parts = []
        for rule in self.violated:
            if rule is SamplingRule.ZERO_PROBABILITY:
                parts.append(f"{c.zero_probability} emitted tokens have target probability 0 "
                             f"(outside the processed support) vs stock {s.zero_probability}")
            else:
                parts.append(f"u's not uniform ({c.test.value} p = {c.p_value:.3g} < alpha {self.alpha:g}) "
                             f"while stock's are (p = {s.p_value:.3g})")
        return "sampling guard: " + "; ".join(parts) if parts else ""

    def summary(self) -> str:
        """A few human lines; the fields, not this text, are what programs read."""
        word = "PASS" if self.passed else "REJECT (" + ", ".join(v.value for v in self.violated) + ")"
        lines = [f"sampling guard ({self.order.value} order, alpha {self.alpha:g}): {word}",
                 f"  candidate: {self.candidate.describe()}", f"  stock:     {self.stock.describe()}"]
        return "\n".join(lines + [f"  caution: {k.value}" for k in self.cautions])

    def to_dict(self) -> dict:
        d = asdict(self)
        d["violated"] = [v.value for v in self.violated]
        d["cautions"] = [k.value for k in self.cautions]
        d["order"] = self.order.value
        for side in ("candidate", "stock"):
            d[side]["test"] = d[side]["test"].value
        return d


def compare_sampled(candidate_u: torch.Tensor | np.ndarray, stock_u: torch.Tensor | np.ndarray,
                    config: SamplingGuardConfig = SamplingGuardConfig()) -> SamplingVerdict:
    """Apply the two rules of the module docstring to the u's [T] of each side (NaN: p(x) = 0)."""
    c, s = uniformity(candidate_u, config), uniformity(stock_u, config)
    violated = []
    if c.zero_probability > s.zero_probability:
        violated.append(SamplingRule.ZERO_PROBABILITY)
    stock_uniform = s.p_value >= config.alpha
    if c.p_value < config.alpha and stock_uniform:
        violated.append(SamplingRule.UNIFORMITY)
    cautions = []
    if min(c.scored, s.scored) < config.min_tokens:
        cautions.append(SamplingCaution.FEW_TOKENS)
    if not stock_uniform:
        cautions.append(SamplingCaution.STOCK_NONUNIFORM)
    if s.zero_probability:
        cautions.append(SamplingCaution.STOCK_ZERO_PROBABILITY)
    return SamplingVerdict(passed=not violated, violated=tuple(violated), candidate=c, stock=s,
                           alpha=config.alpha, order=config.order, cautions=tuple(cautions))
