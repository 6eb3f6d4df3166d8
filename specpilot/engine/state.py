"""Device-side decoding state shared by the target, the drafter and the host loop.

Owns: the committed token buffer, per-row lengths, done flags and per-round statistics, and the
one way to append committed tokens (`commit_tokens`), which also detects EOS and the new-token
limit on the device. Every field is a preallocated tensor mutated in place, so a decoding round
captured in a CUDA graph keeps pointing at the right memory across requests.

Convention: a row has `seq_lens[b] = L` committed tokens (prompt included); the last one, the
*root*, is not yet in the target's KV cache, which holds L - 1 entries.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class DecodeState:
    tokens: torch.Tensor  # [B,S] int64 committed tokens, prompt first
    seq_lens: torch.Tensor  # [B] int64 committed count L (root = tokens[b, L-1])
    prompt_lens: torch.Tensor  # [B] int64
    done: torch.Tensor  # [B] bool: EOS emitted or max_new reached
    eos: torch.Tensor  # [E] int64 (E >= 1; -1 pads an empty list)
    max_new: torch.Tensor  # [B] int64 new-token limit per row
    rounds: torch.Tensor  # [B] int64 target forwards while the row was active
    accept_log: torch.Tensor  # [B,R] int16: tokens committed per round (accepted + 1)

    @classmethod
    def allocate(cls, batch: int, capacity: int, max_rounds: int, device) -> "DecodeState":
        z = lambda *s, dt=torch.int64: torch.zeros(*s, dtype=dt, device=device)  # noqa: E731
        return cls(
            tokens=z(batch, capacity),
            seq_lens=z(batch),
            prompt_lens=z(batch),
            done=z(batch, dt=torch.bool),
            eos=torch.full((8,), -1, dtype=torch.int64, device=device),
            max_new=z(batch),
            rounds=z(batch),
            accept_log=z(batch, max_rounds, dt=torch.int16),
        )

    @property
    def batch(self) -> int:
        return self.tokens.shape[0]

    @property
    def capacity(self) -> int:
        return self.tokens.shape[1]

    def reset(self, prompts: list[list[int]], eos_ids: tuple[int, ...], max_new: int) -> None:
        """Load a new batch of prompts, in place."""
        if len(eos_ids) > self.eos.numel():
            raise ValueError(f"at most {self.eos.numel()} EOS ids supported")
        dev = self.tokens.device
        self.tokens.zero_()
        for b, p in enumerate(prompts):
            self.tokens[b, : len(p)] = torch.tensor(p, dtype=torch.int64, device=dev)
        lens = torch.tensor([len(p) for p in prompts], dtype=torch.int64, device=dev)
        self.seq_lens.copy_(lens)
        self.prompt_lens.copy_(lens)
        self.done.zero_()
        self.eos.fill_(-1)
        if eos_ids:
            self.eos[: len(eos_ids)] = torch.tensor(eos_ids, dtype=torch.int64, device=dev)
        self.max_new.fill_(max_new)
        self.rounds.zero_()
        self.accept_log.zero_()

    def load_row(self, b: int, prompt: list[int], max_new: int) -> None:
        """Load one request into row `b` (continuous batching), in place, leaving it `done`: the
        caller clears `done[b]` once the row's prefill is in the caches."""
        p = torch.tensor(prompt, dtype=torch.int64, device=self.tokens.device)
        self.tokens[b].zero_()
        self.tokens[b, : len(prompt)] = p
        self.seq_lens[b] = len(prompt)
        self.prompt_lens[b] = len(prompt)
        self.done[b] = True
        self.max_new[b] = max_new
        self.rounds[b] = 0
        self.accept_log[b].zero_()

    def roots(self) -> torch.Tensor:
        """[B] the last committed token of each row."""
        return self.tokens.gather(1, (self.seq_lens - 1)[:, None])[:, 0]

    def cache_prefix(self) -> torch.Tensor:
        """[B] number of committed entries in the target cache (= slot of the root)."""
        return self.seq_lens - 1


def commit_tokens(state: DecodeState, new: torch.Tensor, count: torch.Tensor) -> None:
    """Append new[b, :count[b]] to every active row; mark rows done on EOS or the token limit.

    new [B,T] int64; count [B] int64 in 1..T. Rows already done are left untouched. Tokens that
    land inside a row's prompt (segment admission, `engine.segments`: they are the prompt's own)
    neither stop the row on EOS nor count as decoding: `rounds` and `accept_log` record only the
    rounds that generated tokens, with how many they generated.
    """
    B, T = new.shape
    active = ~state.done
    j = torch.arange(T, device=new.device)[None, :]
    pos = state.seq_lens[:, None] + j  # [B,T]
    valid = (j < count[:, None]) & active[:, None]  # [B,T]
    idx = pos.clamp(max=state.capacity - 1)
    old = state.tokens.gather(1, idx)
    state.tokens.scatter_(1, idx, torch.where(valid, new, old))
    generated = valid & (pos >= state.prompt_lens[:, None])  # [B,T]
    # Outputs are cut at the first EOS / at max_new afterwards; here we only stop rows.
    hit_eos = ((new[..., None] == state.eos).any(-1) & generated).any(-1)
    made = generated.sum(1)  # [B] generated tokens this round (= count outside a prompt)
    logged = made > 0
    rounds = state.rounds.clamp(max=state.accept_log.shape[1] - 1)
    log = state.accept_log.gather(1, rounds[:, None])
    state.accept_log.scatter_(1, rounds[:, None], torch.where(logged[:, None], made[:, None].to(log.dtype), log))
    state.rounds.add_(logged.long())
    state.seq_lens.add_(torch.where(active, count, torch.zeros_like(count)))
    limit = (state.seq_lens - state.prompt_lens) >= state.max_new
    state.done.logical_or_(hit_eos | limit)


def cut_output(generated: list[int], eos_ids, max_new: int) -> list[int]:
    """A row's generated tokens cut after the first EOS (kept) and at max_new (rounds overshoot)."""
    gen = generated[:max_new]
    eos = set(eos_ids)
    for i, t in enumerate(gen):
        if t in eos:
            return gen[: i + 1]
    return gen


def extract_outputs(state: DecodeState, eos_ids: tuple[int, ...], max_new: int) -> list[list[int]]:
    """Generated tokens per row (host), cut after the first EOS (kept) and at max_new."""
    tokens = state.tokens.cpu().tolist()
    lens = state.seq_lens.cpu().tolist()
    starts = state.prompt_lens.cpu().tolist()
    return [cut_output(row[s:L], eos_ids, max_new) for row, L, s in zip(tokens, lens, starts)]
