"""The sampling guard on synthetic streams: the PIT, its size on exact samplers, its power on faults.

Contexts are a random family of target distributions: power-law (Zipf) logits over a random
permutation of the vocabulary plus Gumbel noise, a random peakiness per context, processed at
temperature 0.7 with top-p 0.95 (`_family`). Tokens are sampled from the exact processed p or
from a faulty sampler; the guard forces nothing here: it gets p and the tokens, as a caller that
teacher-forced the recorded outputs would. Stock is an independent exact stream of the same
contexts' family. Every test runs at fixed seeds.

Token counts (N scored tokens per side): every fault is rejected at N = 16384, the module's
rule; each test states the count it uses. Power measured with this family (10 seeds, V = 256,
KS, probability order): exact 0/10 rejected at 4096, 8192 and 16384 tokens; the correction
from p with a noisy drafter 4/10 at 8192, 10/10 at 16384; with a flatter drafter 8/10 at 8192,
10/10 at 16384; the temperature slips, top-p on the sampler only and the logit bias 10/10 at
4096 already.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from specpilot.guard.sampling import (SamplingCaution, SamplingGuardConfig, SamplingRule, TokenOrder,
                                      UniformityTest, compare_sampled, pit_values, uniformity)

N = 16384  # the module's token-count rule (scored tokens per side)
TEMPERATURE, TOP_P = 0.7, 0.95


def _logits(T: int, V: int, g: torch.Generator) -> torch.Tensor:
    """[T,V] raw logits: Zipf log-ranks over a random permutation, random peakiness, Gumbel noise."""
    rank = torch.argsort(torch.rand(T, V, generator=g), dim=1).double() + 1.0  # [T,V] in 1..V
    slope = 1.0 + 1.5 * torch.rand(T, 1, generator=g, dtype=torch.float64)  # [T,1]
    gumbel = -torch.log(-torch.log(torch.rand(T, V, generator=g, dtype=torch.float64).clamp_min(1e-300)))
    # processed at 0.7 / 0.95: median top probability ~0.67, median entropy ~0.9 nats, nucleus ~5 tokens
    return -slope * torch.log(rank) + gumbel  # [T,V]


def _process(logits: torch.Tensor, temperature: float = TEMPERATURE, top_p: float | None = TOP_P) -> torch.Tensor:
    """[T,V] logits -> [T,V] probabilities: temperature, then top-p (smallest set with mass >= top_p)."""
    p = torch.softmax(logits / temperature, dim=1)
    if top_p is None:
        return p
    sp, idx = torch.sort(p, dim=1, descending=True)
    keep = (sp.cumsum(dim=1) - sp) < top_p  # [T,V] the mass before a token is below top_p
    sp = torch.where(keep, sp, torch.zeros_like(sp))
    out = torch.zeros_like(p).scatter_(1, idx, sp)
    return out / out.sum(dim=1, keepdim=True)


def _sample(m: torch.Tensor, g: torch.Generator) -> torch.Tensor:
    """[T,V] probabilities -> [T] int64 tokens, one per row, by inverse CDF in float64."""
    cdf = m.double().cumsum(dim=1)  # [T,V]
    r = torch.rand(m.shape[0], 1, generator=g, dtype=torch.float64) * cdf[:, -1:]  # [T,1]
    x = torch.searchsorted(cdf, r, right=True)[:, 0]  # [T] first id whose CDF exceeds r
    return x.clamp_(max=m.shape[1] - 1)


def _bias(logits: torch.Tensor, after: int = 2048, every: int = 7, value: float = 2.0) -> torch.Tensor:
    """The article's fault: +value on every `every`-th vocabulary id, from stream position `after` on."""
    biased = logits.clone()
    biased[after:, ::every] += value
    return biased


def _correction_from_p(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """Speculative sampling whose rejection branch samples p instead of the residual norm(max(0, p - q)).

    Accepting the draft x ~ q with probability min(1, p/q) yields min(p, q); the rejected mass
    r = 1 - sum min(p, q) then goes to p: min(p, q) + r p, not p.
    """
    accepted = torch.minimum(p, q)
    return accepted + (1.0 - accepted.sum(dim=1, keepdim=True)) * p


# name -> (target p, faulty sampler m) from raw logits [T,V] and a generator for the drafter's noise
FAULTS = {
    # (a) with a drafter: the target's logits plus N(0, 1) noise, processed alike
    "correction-from-p": lambda l, g: (_process(l), _correction_from_p(
        _process(l), _process(l + torch.randn(l.shape, generator=g, dtype=l.dtype))),),
    # (a) with a less confident drafter: the target's logits at temperature 1.0, same top-p
    "correction-from-p-flat-drafter": lambda l, g: (_process(l), _correction_from_p(_process(l), _process(l, 1.0))),
    # (b) the draft's temperature on the target: should be 1.0, sampled at 0.7 (support shrinks: no p = 0)
    "temperature-0.7-for-1.0": lambda l, g: (_process(l, 1.0), _process(l, 0.7)),
    # (b) ... or vice versa, without top-p so that only the uniformity rule can see it
    "temperature-1.0-for-0.7-no-top-p": lambda l, g: (_process(l, 0.7, None), _process(l, 1.0, None)),
    # (c) top-p on the sampler only: the target is untruncated (the uniformity rule must see it)
    "top-p-on-sampler-only": lambda l, g: (_process(l, top_p=None), _process(l)),
    # (d) logit bias +2 on every 7th id after 2048 tokens, without top-p (the uniformity rule alone)
    "logit-bias-no-top-p": lambda l, g: (_process(l, top_p=None), _process(_bias(l), top_p=None)),
    # (d) the same fault under top-p: boosted tokens escape the nucleus (rule 1), or shift the u's
    "logit-bias": lambda l, g: (_process(l), _process(_bias(l))),
}


def _stream(T: int, V: int, seed: int, fault: str | None = None, order: TokenOrder = TokenOrder.PROBABILITY):
    """u's [T] of one stream of T contexts: exact when fault is None, else from FAULTS[fault]."""
    g = torch.Generator().manual_seed(seed)
    logits = _logits(T, V, g)
    if fault is None:
        p = m = _process(logits)
    else:
        p, m = FAULTS[fault](logits, g)
    # the V's from their own generator: the module docstring says why
    return pit_values(p, _sample(m, g), torch.Generator().manual_seed(1_000_000 + seed), order)


def _verdict(fault: str | None, seed: int, T: int, V: int = 256, config=SamplingGuardConfig()):
    stock = _stream(T, V, 10_000 + seed, None, config.order)
    return compare_sampled(_stream(T, V, seed, fault, config.order), stock, config)


# -- the transform ---------------------------------------------------------------------------


def test_pit_of_a_point_mass_and_a_two_token_row_by_hand():
    probs = torch.tensor([[0.0, 1.0, 0.0], [0.25, 0.75, 0.0], [0.25, 0.75, 0.0]])  # [3,3]
    g = torch.Generator().manual_seed(0)
    v = torch.rand(3, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    u_id = pit_values(probs, torch.tensor([1, 0, 1]), g, TokenOrder.ID)
    assert torch.allclose(u_id, torch.stack([v[0], 0.25 * v[1], 0.25 + 0.75 * v[2]]), rtol=0, atol=1e-15)
    u_p = pit_values(probs, torch.tensor([1, 0, 1]), torch.Generator().manual_seed(0), TokenOrder.PROBABILITY)
    assert torch.allclose(u_p, torch.stack([v[0], 0.75 + 0.25 * v[1], 0.75 * v[2]]), rtol=0, atol=1e-15)


def test_zero_probability_tokens_have_no_u():
    probs = torch.tensor([[0.5, 0.5, 0.0], [0.2, 0.3, 0.5]])
    u = pit_values(probs, torch.tensor([2, 2]), torch.Generator().manual_seed(1))
    assert math.isnan(u[0]) and 0.0 <= u[1] <= 1.0


def test_ties_are_ordered_by_id_and_the_transform_is_seeded():
    probs = torch.full((4, 8), 1 / 8)
    toks = torch.arange(4)
    u = pit_values(probs, toks, torch.Generator().manual_seed(2))
    assert torch.equal(u, pit_values(probs, toks, torch.Generator().manual_seed(2), TokenOrder.ID))
    assert ((u >= toks / 8) & (u <= (toks + 1) / 8)).all()


def test_bad_inputs_are_refused():
    g = torch.Generator()
    with pytest.raises(ValueError):
        pit_values(torch.ones(3, 4) / 4, torch.tensor([0, 1]), g)
    with pytest.raises(ValueError):
        pit_values(torch.ones(2, 4) / 4, torch.tensor([0, 4]), g)


@pytest.mark.parametrize("order", list(TokenOrder))
@pytest.mark.parametrize("V", [64, 512])
def test_exact_sampling_gives_uniform_u(V, order):
    u = _stream(N // 2, V, seed=3, order=order)
    assert not torch.isnan(u).any()
    for test in UniformityTest:  # at 1%: this checks the transform, not the guard's size (next test)
        assert uniformity(u, SamplingGuardConfig(test=test)).p_value > 0.01


# -- the decision ----------------------------------------------------------------------------


def test_exact_candidate_passes_at_fixed_seeds():
    """Size: exact vs exact passes (12 seeds of 4096 tokens, V = 64; false-rejection rate alpha (1 - alpha))."""
    rejected = sum(not _verdict(None, seed, T=4096, V=64).passed for seed in range(12))
    assert rejected <= 1  # P(>= 2 of 12 at 4.75%) = 11%; the seeds are fixed, so this is deterministic


@pytest.mark.parametrize("fault", sorted(FAULTS))
def test_faults_are_rejected(fault):
    """The correction faults at N = 16384 tokens per side, the module's rule (they need it); the
    others at 4096, from where they were all rejected (the logit bias's first 2048 are unbiased)."""
    v = _verdict(fault, seed=0, T=N if fault.startswith("correction") else 4096)
    assert not v.passed, v.summary()


def test_stock_that_fails_itself_cannot_reject_and_says_so():
    bad = _stream(4096, 128, 5, "temperature-1.0-for-0.7-no-top-p")
    v = compare_sampled(bad, bad)
    assert v.passed and SamplingCaution.STOCK_NONUNIFORM in v.cautions


def test_a_token_outside_the_support_is_an_immediate_failure():
    """Top-p on the target only (the sampler is untruncated): one zero-probability token rejects."""
    g = torch.Generator().manual_seed(6)
    logits = _logits(256, 128, g)  # ~2% of untruncated draws leave the nucleus: a handful of tokens
    p, m = _process(logits), _process(logits, top_p=None)
    u = pit_values(p, _sample(m, g), torch.Generator().manual_seed(8))
    stock = _stream(256, 128, 7)
    v = compare_sampled(u, stock)
    assert not v.passed and v.violated[0] is SamplingRule.ZERO_PROBABILITY
    assert v.candidate.zero_probability > 0 and v.candidate.scored + v.candidate.zero_probability == 256
    assert "target probability 0" in v.reason()
    assert SamplingCaution.FEW_TOKENS in v.cautions


def test_the_verdict_serialises_and_chi_square_agrees():
    v = _verdict("top-p-on-sampler-only", seed=1, T=4096, config=SamplingGuardConfig(test=UniformityTest.CHI_SQUARE))
    assert not v.passed and v.violated == (SamplingRule.UNIFORMITY,)
    d = v.to_dict()
    assert d["violated"] == ["uniformity"] and d["candidate"]["test"] == "chi-square" and d["order"] == "probability"
    assert "REJECT (uniformity)" in v.summary()
