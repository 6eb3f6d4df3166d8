"""Sampling parameters, the one logit processor, and seeded draws.

`process_logits` turns logits into the distribution a request samples from. The same function,
with the same `SamplingParams`, is applied to the target's logits and to the drafter's: the
acceptance rule (`acceptance_sampling`) is exact for any draft distribution q, so a mismatch on
the drafter's side only costs acceptance, while any difference on the target's side changes what
is emitted.

Order of operations (each step renormalises what it keeps):

    1. temperature: softmax(logits / T); T == 0 is greedy, the point mass on argmax (first
       index among equal logits, as `torch.argmax`), so every sampling path reduces to greedy;
    2. top-k: keep tokens whose probability is >= the k-th largest (ties at the k-th kept);
    3. top-p: in descending order keep the smallest prefix whose mass reaches top_p, then every
       token tied with the last one kept (so the kept set does not depend on token ids);
       the mass is that of the top-k survivors, renormalised;
    4. min-p: keep tokens with probability >= min_p * the largest probability.

This is the order of Hugging Face `GenerationMixin._get_logits_processor` (Temperature, TopK,
TopP, MinP warpers, each on the previous one's output) and of SGLang's flashinfer path when min-p
is set (`top_k_renorm_prob` -> `top_p_renorm_prob` -> `min_p_sampling_from_probs`). vLLM v1
applies min-p before top-k/top-p and SGLang's joint path applies top-k and top-p to the same
unfiltered distribution; those differ from this order only when top-p is combined with top-k
or min-p.

Draws are by inverse CDF from uniforms (`sample_from`), so a draw is a pure function of the
probabilities and a uniform that a seeded `torch.Generator` (`request_generator`) produced.
Not here: penalties, logit bias, and wiring into the generator.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from specpilot.errors import ConfigError


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 0.0  # 0: greedy
    top_k: int = 0  # 0: off
    top_p: float = 1.0  # 1: off
    min_p: float = 0.0  # 0: off
    seed: int | None = None  # None: the process's default generator

    def __post_init__(self):
        if not (math.isfinite(self.temperature) and self.temperature >= 0):
            raise ConfigError(f"sampling: temperature must be a finite number >= 0 (got {self.temperature})")
        if isinstance(self.top_k, bool) or not isinstance(self.top_k, int) or self.top_k < 0:
            raise ConfigError(f"sampling: top_k must be an integer >= 0, 0 = off (got {self.top_k})")
        if not (0 < self.top_p <= 1):
            raise ConfigError(f"sampling: top_p must be in (0, 1], 1 = off (got {self.top_p})")
        if not (0 <= self.min_p <= 1):
            raise ConfigError(f"sampling: min_p must be in [0, 1], 0 = off (got {self.min_p})")
        if self.seed is not None and (isinstance(self.seed, bool) or not isinstance(self.seed, int) or self.seed < 0):
            raise ConfigError(f"sampling: seed must be an integer >= 0 (got {self.seed})")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


def _keep_from(probs: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
    """Zero the tokens outside `keep` and renormalise. probs, keep [...,V]."""
    kept = torch.where(keep, probs, torch.zeros_like(probs))
    return kept / kept.sum(-1, keepdim=True)


def top_k_filter(probs: torch.Tensor, k: int) -> torch.Tensor:
    """probs [...,V] -> [...,V]: tokens at least as likely as the k-th most likely, renormalised."""
    if k <= 0 or k >= probs.shape[-1]:
        return probs
    kth = probs.topk(k, dim=-1).values[..., -1:]  # [...,1]
    return _keep_from(probs, probs >= kth)


def top_p_filter(probs: torch.Tensor, p: float) -> torch.Tensor:
    """probs [...,V] -> [...,V]: the smallest most-likely set of mass >= p, ties with its least
    likely member included, renormalised."""
    if p >= 1:
        return probs
    sorted_probs = probs.sort(dim=-1, descending=True).values  # [...,V]
    before = sorted_probs.cumsum(-1) - sorted_probs  # [...,V] mass strictly ahead in the order
    last = (before < p).sum(-1, keepdim=True) - 1  # [...,1] rank of the last token kept (>= 0)
    threshold = sorted_probs.gather(-1, last)  # [...,1]
    return _keep_from(probs, probs >= threshold)


def min_p_filter(probs: torch.Tensor, min_p: float) -> torch.Tensor:
    """probs [...,V] -> [...,V]: tokens with probability >= min_p * max, renormalised."""
    if min_p <= 0:
        return probs
    return _keep_from(probs, probs >= min_p * probs.amax(-1, keepdim=True))


def process_logits(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """logits [...,V] -> probs [...,V] float32 by the order in the module docstring."""
    logits = logits.float()
    if params.greedy:
        return torch.nn.functional.one_hot(logits.argmax(-1), logits.shape[-1]).float()
    probs = torch.softmax(logits / params.temperature, dim=-1)
    probs = top_k_filter(probs, params.top_k)
    probs = top_p_filter(probs, params.top_p)
    return min_p_filter(probs, params.min_p)


def request_generator(params: SamplingParams, device: torch.device | str = "cpu") -> torch.Generator | None:
    """A generator seeded with the request's seed (None when the request has none: use the
    default generator). One per request, so a request's draws do not depend on its batch."""
    if params.seed is None:
        return None
    g = torch.Generator(device=device)
    g.manual_seed(params.seed)
    return g


def inverse_cdf(weights: torch.Tensor, threshold: torch.Tensor) -> torch.Tensor:
    """weights [...,V] >= 0, threshold [...] -> [...] int64: the first token whose cumulative weight
    exceeds the threshold. A threshold at or past the total (rounding) lands on the last token of
    positive weight, never on one of weight 0."""
    cdf = weights.cumsum(-1)  # [...,V]
    idx = (cdf <= threshold[..., None]).sum(-1)  # [...]
    last_positive = weights.shape[-1] - 1 - (weights > 0).flip(-1).float().argmax(-1)  # [...]
    return torch.minimum(idx, last_positive)


def sample_from(weights: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """Draw from weights [...,V] >= 0 (not necessarily normalised) with uniforms u [...] in [0,1)
    -> [...] int64, by inverse CDF against u * total weight."""
    return inverse_cdf(weights, u * weights.sum(-1))


def sample(probs: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
    """probs [...,V] -> [...] int64, one draw per row with uniforms from `generator`."""
    u = torch.rand(probs.shape[:-1], generator=generator, device=probs.device)
    return sample_from(probs, u)
