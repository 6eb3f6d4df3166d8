"""Token data for fixture training: held-out split, tokenization, the source mixture, batches.

Owns: splitting each corpus source into train and held-out documents (deterministic for a seed),
choosing the tokenizer's training sample, encoding documents (EOS after each), the per-source
token streams on the training device, and drawing training windows from the mixture.

Does not own: which text is in the corpus (`corpus.py`), decontamination (`leakcheck.py`), or
models and optimisation (`train_fixture.py`).

Mixture: each source s is sampled with probability proportional to tokens_s * upsample_s, so
`upsample` is how many more epochs of s than of a weight-1 source a run sees. A training row is
a window of T + 1 consecutive tokens of one source's stream starting at a uniform offset;
windows cross document boundaries, which EOS tokens mark.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

import torch

EOS_ID = 0  # `<|endoftext|>` is the tokenizer's first (and only) special token


def split_heldout(
    by_source: dict[str, list[str]], fraction: float, min_docs: int, seed: int
) -> tuple[dict[str, list[str]], dict[str, list[str]]]:
    """(train, held-out) documents per source; held-out is max(fraction, min_docs), at most half."""
    train, held = {}, {}
    for source, docs in by_source.items():
        order = list(range(len(docs)))
        random.Random(f"heldout-{source}-{seed}").shuffle(order)
        n = min(max(math.ceil(fraction * len(docs)), min_docs), len(docs) // 2)
        chosen = set(order[:n])
        held[source] = [docs[i] for i in order[:n]]
        train[source] = [d for i, d in enumerate(docs) if i not in chosen]
    return train, held


def tokenizer_sample(by_source: dict[str, list[str]], weights: dict[str, float], chars: int, seed: int) -> list[str]:
    """Documents for BPE training: about `chars` characters, split across sources by `weights`."""
    out = []
    total = sum(weights.values())
    for source, docs in by_source.items():
        budget = chars * weights.get(source, 0.0) / total
        order = list(range(len(docs)))
        random.Random(f"tokenizer-{source}-{seed}").shuffle(order)
        used = 0
        for i in order:
            if used >= budget:
                break
            out.append(docs[i])
            used += len(docs[i])
    return out


def encode(tokenizer, docs: list[str], chunk: int = 512) -> torch.Tensor:
    """One int32 stream [T]: each document's ids followed by EOS."""
    fast = getattr(tokenizer, "encode_batch_fast", None) or tokenizer.encode_batch
    parts = []
    for i in range(0, len(docs), chunk):
        for enc in fast(docs[i : i + chunk], add_special_tokens=False):
            parts.append(torch.tensor(enc.ids + [EOS_ID], dtype=torch.int32))
    return torch.cat(parts) if parts else torch.zeros(0, dtype=torch.int32)


@dataclass
class TokenData:
    """Per-source token streams concatenated on one device, and the sampling mixture."""

    tokens: torch.Tensor  # [sum T_s] int32 on the training device
    names: list[str]
    offsets: list[int]  # start of each source in `tokens`
    lengths: list[int]
    weights: torch.Tensor  # [S] float64 sampling probabilities (CPU)

    @classmethod
    def build(cls, streams: dict[str, torch.Tensor], upsample: dict[str, float], min_len: int, device) -> TokenData:
        names = [s for s, t in streams.items() if t.numel() >= min_len and upsample.get(s, 0) > 0]
        dropped = sorted(set(streams) - set(names))
        if dropped:
            print(f"[data] not sampled (shorter than {min_len} tokens or weight 0): {dropped}", flush=True)
        if not names:
            raise RuntimeError(f"no source has the {min_len} tokens a training window needs")
        lengths = [streams[s].numel() for s in names]
        offsets = [sum(lengths[:i]) for i in range(len(names))]
        raw = torch.tensor([n * upsample[s] for s, n in zip(names, lengths)], dtype=torch.float64)
        tokens = torch.cat([streams[s] for s in names]).to(device)
        return cls(tokens, names, offsets, lengths, raw / raw.sum())

    def mixture(self) -> dict[str, dict]:
        return {
            s: {"tokens": n, "probability": round(float(p), 4)}
            for s, n, p in zip(self.names, self.lengths, self.weights.tolist())
        }

    def epochs(self, tokens_seen: int) -> dict[str, float]:
        """Expected passes over each source after `tokens_seen` training tokens."""
        return {s: round(tokens_seen * float(p) / n, 2) for s, n, p in zip(self.names, self.lengths, self.weights)}

    def batch(self, B: int, T: int, gen: torch.Generator) -> torch.Tensor:
        """[B, T + 1] int64 windows on the data's device (randomness from the CPU generator `gen`)."""
        src = torch.multinomial(self.weights, B, replacement=True, generator=gen)  # [B]
        u = torch.rand(B, generator=gen, dtype=torch.float64)
        span = torch.tensor(self.lengths, dtype=torch.float64)[src] - (T + 1)
        start = torch.tensor(self.offsets, dtype=torch.int64)[src] + (u * (span + 1)).floor().long()
        idx = start.to(self.tokens.device)[:, None] + torch.arange(T + 1, device=self.tokens.device)
        return self.tokens[idx].long()


def windows(stream: torch.Tensor, T: int) -> list[torch.Tensor]:
    """Consecutive evaluation windows of at most T + 1 tokens (overlapping by one) over a stream."""
    out = []
    for s in range(0, max(stream.numel() - 1, 0), T):
        w = stream[s : s + T + 1]
        if w.numel() >= 2:
            out.append(w.long())
    return out
