"""Token forcing: a system's outputs fed back through the target on the stock path.

Owns: `force(target, records)` and its result types. For each record the prompt is prefilled
exactly as AR decoding prefills it (`steps.prefill`: prompt[:-1] into the cache), then the
stream `[prompt[-1]] + output[:-1]` is teacher-forced in causal chunks (`steps.chunk_forward`,
the engine's stock path, plain cuBLAS target, same dtype) and every generated position is scored:

    z = the scorer's logits predicting output[t]            [V], cast to float32
    argmax[t] = argmax z                                    (first index among equal logits)
    margin[t] = max z - z[output[t]]    >= 0, in nats       (= log p(argmax) - log p(output[t]):
                                                             the softmax normaliser cancels)
    emitted_logprob[t] = z[output[t]] - logsumexp z

A position is a *mismatch* when output[t] != argmax[t] (a mismatch can have margin 0: an exact tie
the scorer broke the other way). With chunk = 1 the forward shapes are those of an AR step, so
forcing stock AR outputs reproduces AR's argmax bit for bit; larger chunks are the usual
batched-GEMM path whose rounding differs, which is what near-ties are (see `config.py`).

Records are scored one at a time (batch 1), so a sequence's scores never depend on which other
sequences share its file: the same sequence scores identically in a candidate and a stock run.

Does not own the statistics or the decision (`statistics.py`, `verdict.py`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np
import torch

from specpilot.engine.steps import chunk_forward, prefill
from specpilot.errors import SpecPilotError
from specpilot.guard.records import OutputRecord
from specpilot.models.transformer import Transformer


@dataclass(frozen=True, eq=False)
class ForcedSequence:
    """One record's scores; arrays have one entry per generated token (T = len(output_ids))."""

    prompt_ids: tuple[int, ...]
    output_ids: tuple[int, ...]
    argmax: np.ndarray  # [T] int64 scorer's argmax
    margin: np.ndarray  # [T] float32 nats, top logit - emitted token's logit
    emitted_logprob: np.ndarray  # [T] float32 log p(output[t]) under the scorer

    @property
    def num_tokens(self) -> int:
        return len(self.output_ids)

    @property
    def mismatch(self) -> np.ndarray:
        """[T] bool: the emitted token is not the scorer's argmax."""
        return self.argmax != np.asarray(self.output_ids, dtype=np.int64)

    @property
    def num_mismatches(self) -> int:
        return int(self.mismatch.sum())

    def num_large_margin(self, near_tie_nats: float) -> int:
        """Mismatches whose margin exceeds the near-tie threshold (not explained by rounding)."""
        return int((self.mismatch & (self.margin > near_tie_nats)).sum())

    def first_mismatch(self) -> int | None:
        idx = np.flatnonzero(self.mismatch)
        return int(idx[0]) if idx.size else None


@dataclass(frozen=True, eq=False)
class ForcingResult:
    """Every record of one system forced through one scorer."""

    sequences: tuple[ForcedSequence, ...]
    dtype: str  # the scorer's dtype, e.g. "bfloat16"
    device: str
    chunk: int

    @property
    def num_tokens(self) -> int:
        return sum(s.num_tokens for s in self.sequences)

    @property
    def num_mismatches(self) -> int:
        return sum(s.num_mismatches for s in self.sequences)

    @property
    def rate(self) -> float:
        """Pooled mismatch rate: mismatches / tokens over all sequences."""
        n = self.num_tokens
        return self.num_mismatches / n if n else 0.0

    @property
    def prompts(self) -> list[tuple[int, ...]]:
        return [s.prompt_ids for s in self.sequences]

    def per_sequence(self, near_tie_nats: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(tokens, mismatches, large-margin mismatches), each [n] int64, one entry per sequence."""
        tokens = np.array([s.num_tokens for s in self.sequences], dtype=np.int64)
        mism = np.array([s.num_mismatches for s in self.sequences], dtype=np.int64)
        large = np.array([s.num_large_margin(near_tie_nats) for s in self.sequences], dtype=np.int64)
        return tokens, mism, large

    def mismatch_margins(self) -> np.ndarray:
        """[M] float32 margins (nats) of every mismatch, in sequence order."""
        parts = [s.margin[s.mismatch] for s in self.sequences]
        return np.concatenate(parts) if parts else np.zeros(0, dtype=np.float32)

    def records(self) -> list[OutputRecord]:
        return [OutputRecord(s.prompt_ids, s.output_ids) for s in self.sequences]


def check_records(target: Transformer, records: Sequence[OutputRecord], what: str = "outputs") -> None:
    """One clear error for records the scorer cannot score (empty, ids outside V, too long)."""
    if not records:
        raise SpecPilotError(f"{what}: no records to force")
    V = target.config.vocab_size
    limit = target.rope_cos.shape[0]
    for n, r in enumerate(records, 1):
        if not r.prompt_ids:
            raise SpecPilotError(f"{what}: record {n} has an empty prompt")
        for name, ids in (("prompt_ids", r.prompt_ids), ("output_ids", r.output_ids)):
            if any(t < 0 or t >= V for t in ids):
                raise SpecPilotError(f"{what}: record {n} {name} has ids outside the vocabulary (size {V})")
        if len(r.prompt_ids) + len(r.output_ids) > limit:
            raise SpecPilotError(
                f"{what}: record {n} has {len(r.prompt_ids) + len(r.output_ids)} tokens, "
                f"more than the target's {limit} positions"
            )
    if not any(r.output_ids for r in records):
        raise SpecPilotError(f"{what}: no generated tokens to force")


@torch.inference_mode()
def force(target: Transformer, records: Sequence[OutputRecord], chunk: int = 512) -> ForcingResult:
    """Teacher-force every record through `target` (the stock model, in the systems' dtype)."""
    if chunk < 1:
        raise SpecPilotError(f"forcing chunk must be >= 1 (got {chunk})")
    check_records(target, records)
    dev = target.device
    longest = max(len(r.prompt_ids) + len(r.output_ids) for r in records)
    capacity = (longest + 255) // 256 * 256
    cache = target.new_cache(1, capacity)  # reused: the mask hides stale slots, a chunk at position 0 starts afresh
    sequences = []
    for r in records:
        sequences.append(_force_one(target, cache, r, chunk))
    return ForcingResult(tuple(sequences), str(target.dtype).removeprefix("torch."), str(dev), chunk)


def _force_one(target: Transformer, cache, record: OutputRecord, chunk: int) -> ForcedSequence:
    dev = target.device
    prompt, output = list(record.prompt_ids), list(record.output_ids)
    T = len(output)
    argmax = np.zeros(T, dtype=np.int64)
    margin = np.zeros(T, dtype=np.float32)
    emitted_lp = np.zeros(T, dtype=np.float32)
    if T:
        prefill(target, cache, [prompt])
        stream = torch.tensor([prompt[-1]] + output[:-1], dtype=torch.int64, device=dev)  # [T]
        emitted = torch.tensor(output, dtype=torch.int64, device=dev)  # [T]
        start = len(prompt) - 1
        for s in range(0, T, chunk):
            e = min(s + chunk, T)
            logits = chunk_forward(target, cache, stream[None, s:e], torch.tensor([start + s], device=dev))
            arg = logits[0].argmax(dim=-1)  # [t] in the scorer's dtype, as the engine takes it
            z = logits[0].float()  # [t,V] (exact cast)
            top = z.gather(1, arg[:, None])[:, 0]  # [t]
            z_emit = z.gather(1, emitted[s:e, None])[:, 0]  # [t]
            lse = torch.logsumexp(z, dim=-1)  # [t]
            argmax[s:e] = arg.cpu().numpy()
            margin[s:e] = (top - z_emit).cpu().numpy()
            emitted_lp[s:e] = (z_emit - lse).cpu().numpy()
    return ForcedSequence(tuple(prompt), tuple(output), argmax, margin, emitted_lp)
