"""Token-for-token comparison of two systems' outputs, with the scorer's margin at each first divergence.

Owns: `first_divergence`, `Divergence` (one prompt) and `DivergenceReport` (all prompts), built from
two forcings of the same prompts by one scorer (`compare_outputs`).

At the first index j where outputs a and b differ, both sequences share the prefix prompt + a[:j],
so the scorer's distribution there is the same for both and the gap between the two emitted tokens
is |log p(a[j]) - log p(b[j])| (each side's `emitted_logprob[j]`). For a lossless system against
AR this is what the article reports ("at each first divergence the two tokens' log-probs differed
by at most 0.232 nats"): a flip between near-tied tokens. After the first divergence the texts
differ and position-wise comparison means nothing; token forcing covers the rest.

Does not own the decision (`verdict.py`).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING

import numpy as np

from specpilot.errors import ConfigError
from specpilot.guard.records import match_prompts

if TYPE_CHECKING:  # forcing needs torch and the engine; `first_divergence` users do not
    from specpilot.guard.forcing import ForcingResult


def first_divergence(a: tuple[int, ...], b: tuple[int, ...]) -> int | None:
    """First index where a and b differ (the shorter length if one is a prefix); None if equal."""
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


@dataclass(frozen=True)
class Divergence:
    index: int | None  # first differing generated position; None when the outputs are identical
    nats: float | None  # |log p(a[j]) - log p(b[j])| there; None if identical or one is a prefix
    common_tokens: int  # generated tokens before the divergence (the whole output if identical)


@dataclass(frozen=True)
class DivergenceReport:
    pairs: int
    identical: int  # prompts whose two outputs are equal token for token
    common_tokens: int  # generated tokens before the first divergence, summed over prompts
    tokens: int  # generated tokens of side a, summed over prompts
    max_nats: float  # largest log-prob gap at a first divergence (0 if none)
    median_index: float | None  # median first-divergence position over diverging prompts
    divergences: tuple[Divergence, ...]  # one per prompt, in the order of side a

    def to_dict(self) -> dict:
        return asdict(self)


def compare_outputs(a: ForcingResult, b: ForcingResult) -> DivergenceReport:
    """Pair two forcings of the same prompts and describe where their outputs part."""
    if a.dtype != b.dtype:
        raise ConfigError(f"outputs forced in {a.dtype} and {b.dtype}; use one scorer")
    matched = match_prompts(a.prompts, b.prompts)
    if matched is None:
        raise ConfigError("token-for-token comparison needs outputs for the same prompts")
    divs = []
    for i, j in sorted(zip(*matched)):  # in a's order
        sa, sb = a.sequences[i], b.sequences[j]
        k = first_divergence(sa.output_ids, sb.output_ids)
        if k is None:
            divs.append(Divergence(None, None, sa.num_tokens))
        elif k < min(sa.num_tokens, sb.num_tokens):
            gap = abs(float(sa.emitted_logprob[k]) - float(sb.emitted_logprob[k]))
            divs.append(Divergence(k, gap, k))
        else:
            divs.append(Divergence(k, None, k))
    gaps = [d.nats for d in divs if d.nats is not None]
    idx = [d.index for d in divs if d.index is not None]
    return DivergenceReport(
        pairs=len(divs),
        identical=sum(d.index is None for d in divs),
        common_tokens=sum(d.common_tokens for d in divs),
        tokens=a.num_tokens,
        max_nats=max(gaps) if gaps else 0.0,
        median_index=float(np.median(idx)) if idx else None,
        divergences=tuple(divs),
    )
