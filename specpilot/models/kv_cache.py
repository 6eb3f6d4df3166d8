"""Static KV cache: a preallocated [B, Hkv, S, D] tensor per layer for keys and for values.

Owns: allocation and the one cache mutation besides plain writes, `move_slots`, which commits an
accepted tree path by copying its entries to contiguous slots (`commit_path`, the commit every
decoder cache offers the engine). `allocate` carves every layer's
keys and values out of one [2, L, B, Hkv, S, D] buffer (`stack`), so a commit moves every layer's
entries in one gather and one scatter instead of two per layer and tensor (each a kernel launch
in every round). The model writes new entries itself (`Attention.attend_cached`); which slots are
valid is told by the attention mask, so stale entries past a row's length are harmless and never
cleared.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from specpilot.models.config import ModelConfig


@dataclass
class KVCache:
    k: list[torch.Tensor]  # per layer [B, Hkv, S, D]
    v: list[torch.Tensor]  # per layer [B, Hkv, S, D]
    # [2, L, B, Hkv, S', D] whose [0, i] is k[i] and [1, i] is v[i] (views of it), or None
    stack: torch.Tensor | None = None
    # packed prefill (`engine.packed_prefill`) may lay several rows' chunks out in one batch-1 cache
    packable = True

    @classmethod
    def allocate(cls, config: ModelConfig, batch: int, capacity: int, device, dtype) -> "KVCache":
        """Keys and values of every attention layer (`config.attention_layers`)."""
        L = len(config.attention_layers)
        stack = torch.zeros(2, L, batch, config.num_kv_heads, capacity, config.head_dim, device=device, dtype=dtype)
        return cls([stack[0, i] for i in range(L)], [stack[1, i] for i in range(L)], stack)

    @property
    def batch(self) -> int:
        return self.k[0].shape[0]

    @property
    def capacity(self) -> int:
        return self.k[0].shape[2]

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.k + self.v)

    def row(self, b: int) -> "KVCache":
        """A view of row `b` (writes go to the shared buffers)."""
        stack = None if self.stack is None else self.stack[:, :, b : b + 1]
        return KVCache([t[b : b + 1] for t in self.k], [t[b : b + 1] for t in self.v], stack)

    def span(self, n: int) -> "KVCache":
        """A view of slots 0..n-1 of every row (writes go to the shared buffers): attention over it
        reads n slots, not the whole capacity."""
        stack = None if self.stack is None else self.stack[..., :n, :]
        return KVCache([t[:, :, :n] for t in self.k], [t[:, :, :n] for t in self.v], stack)

    def move_slots(self, src: torch.Tensor, dst: torch.Tensor) -> None:
        """For each row b and j: entry at slot src[b,j] -> slot dst[b,j]. src, dst [B,J] int64.

        All sources are read before any destination is written, so overlapping ranges are safe.
        """
        B, J = src.shape
        rows = torch.arange(B, device=src.device)[:, None].expand(B, J)
        if self.stack is not None:  # one gather/scatter over every layer
            s = self.stack  # [2,L,B,Hkv,S,D]
            s[:, :, rows, :, dst] = s[:, :, rows, :, src]  # gathered [B,J,2,L,Hkv,D], then scattered
            return
        for t in self.k + self.v:
            t[rows, :, dst] = t[rows, :, src]  # gathered copy [B,J,Hkv,D], then scattered

    def commit_path(self, prefix: torch.Tensor, path: torch.Tensor, accept_len: torch.Tensor,
                    active: torch.Tensor | None = None) -> None:
        """Commit each row's accepted tree path: the entries of nodes path[b, 1..] (node j of the
        round's tree sits at slot prefix[b] + j) move to slots prefix[b] + 1.. (the root is at
        prefix[b] already). prefix, accept_len [B]; path [B,K+1] (-1 past the path). Moving the
        entries of a done row (`active` False) is harmless: its slots past its length are never
        read, so every row moves."""
        src = prefix[:, None] + path[:, 1:].clamp(min=0)  # [B,K]
        dst = prefix[:, None] + torch.arange(1, path.shape[1], device=prefix.device)
        keep = path[:, 1:] >= 0
        self.move_slots(torch.where(keep, src, dst), dst)
