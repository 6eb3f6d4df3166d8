"""Counter-based uniforms: a pure function of (seed, emitted-token index, draw id) on tensors.

A sampled round needs fresh uniforms per row that (a) depend only on the row's own request, so a
request's output does not depend on which other requests share its batch, and (b) are computed on
the device from tensors the round already holds, so the round stays one captured CUDA graph with
no host generator advanced inside it. A keyed integer hash gives both:

    u = hash(seed, index, stream, draw) / 2^24        in [0, 1), 24 random bits (float32 exact)

`index` is the row's count of emitted tokens when the round starts: it grows by at least one every
round, so no key is ever used twice within a request, and a sequence of rounds that picks its next
key from earlier outcomes still sees i.i.d. uniforms (a random function read at distinct points).
`draw` numbers the uniforms of one round (the verifier's per-node and final draws, AR's single
draw); `stream` separates users of one round (the verifier 0, a sampling drafter 1).

The hash is Chris Wellons' `lowbias32` (xor-shift-multiply, 32-bit state), chained over the key's
words. int64 tensors hold the 32-bit words; each 32 x 32-bit product is split into 16-bit halves so
no intermediate leaves int64 (signed overflow is never relied on), on any device and under
torch.compile.

Not here: which distribution a uniform is used against (`sampling.sample_from`,
`acceptance_sampling.sampled_accept`).
"""

from __future__ import annotations

import torch

MASK32 = 0xFFFFFFFF
STREAM_VERIFY = 0  # the verifier's draws (and AR's)
STREAM_DRAFT = 1  # a drafter that samples its drafts


def _mul32(x: torch.Tensor, c: int) -> torch.Tensor:
    """(x * c) mod 2^32 for x in [0, 2^32) int64 and a 32-bit constant c, without overflow."""
    lo, hi = c & 0xFFFF, c >> 16
    return (x * lo + (((x * hi) & 0xFFFF) << 16)) & MASK32


def lowbias32(x: torch.Tensor) -> torch.Tensor:
    """The lowbias32 integer hash of x in [0, 2^32) (int64) -> [0, 2^32) (int64)."""
    x = x ^ (x >> 16)
    x = _mul32(x, 0x7FEB352D)
    x = x ^ (x >> 15)
    x = _mul32(x, 0x846CA68B)
    return x ^ (x >> 16)


def seed_key(seed: torch.Tensor) -> torch.Tensor:
    """[B] int64 seeds (any 63-bit value) -> [B] 32-bit keys mixing both halves."""
    return lowbias32((seed & MASK32) ^ lowbias32(((seed >> 32) & MASK32) ^ 0x9E3779B9))


def counter_uniforms(seed: torch.Tensor, index: torch.Tensor, draws: int, stream: int = STREAM_VERIFY) -> torch.Tensor:
    """seed [B], index [B] int64 -> [B,draws] float32 uniforms in [0, 1), one per draw id 0..draws-1."""
    key = lowbias32(seed_key(seed) ^ (index & MASK32))  # [B]
    draw = torch.arange(draws, device=seed.device, dtype=torch.int64) + (stream << 20)  # [draws]
    h = lowbias32(lowbias32(key[:, None] ^ draw[None, :]) ^ 0x632BE5AB)  # [B,draws]
    return (h >> 8).to(torch.float32) * (1.0 / (1 << 24))
