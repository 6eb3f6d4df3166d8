"""A ring of cache slots for sliding-window layers: K/V of the last R slots, R = window + slack.

The engine addresses the cache by absolute slots (a row's token at position p sits at slot p, a
tree's nodes at the slots after the committed prefix) and masks over all of them ([B,1,T,S]).
A ring keeps slot s at ring entry s % R and remembers which slot each entry holds (`held`, -1:
none), so a sliding layer's K/V take R slots per row instead of the cache's capacity, and attention
reads R entries. The rules that make it exact:

- A forward of T <= slack tokens writes its slots first and then attends over the ring, with the
  engine's mask (already cut to the window, `gemma.window_mask`) gathered at the held slots
  (`columns`). A written slot s overwrites the entry of s - kR only; since every written slot lies
  within `slack` of the forward's first slot, s - R < first - window: a slot no query of this or
  any later forward keeps in its window (each sees at least `window` visible keys after it).
- A longer forward (a prefill chunk) attends over the ring *as it was* plus the chunk's own keys,
  and writes the chunk's last R slots afterwards. Entries holding slots at or past the chunk's
  first slot are stale (a reused row, an earlier tree's nodes) and masked.
- A chunk padded past its real tokens (the engine's prefill buckets) must pad by at most `slack`
  slots, so its padding never evicts a slot the next real token keeps in its window.
- `move_slots` (a tree path's commit) moves entries between ring entries of the same slots and
  records the destinations; sources and destinations lie within one forward's slots (< R apart).

Owns: the ring's buffers, `held`, its writes' bookkeeping (`record`), the column map
(`columns`) and the commit. Does not own the window rule or the attention (`models.gemma`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from specpilot.models.kv_cache import KVCache

RING_SLACK = 64  # slots a forward may write past its first in write-then-attend mode, at least
# (>= the engine's prefill bucket, so a padded chunk's padding never evicts a slot in the window)


def ring_slots(window: int, capacity: int, nodes: int) -> int:
    """R for a sliding layer of `window` in a cache of `capacity` slots whose forwards write up to
    `nodes` slots in write mode; 0 when a ring would not be smaller than the cache."""
    R = window + max(nodes, RING_SLACK)
    return R if R < capacity else 0


@dataclass
class RingCache:
    kv: KVCache  # per sliding cache layer [B,Hkv,R,D]
    held: torch.Tensor  # [B,R] int64: the absolute slot each entry holds, -1 for none
    slack: int  # a forward of at most this many tokens writes, then attends
    packable = False  # packed prefill lays rows out in absolute slots

    @classmethod
    def allocate(cls, layers: int, batch: int, Hkv: int, D: int, window: int, R: int,
                 device, dtype) -> "RingCache":
        stack = torch.zeros(2, layers, batch, Hkv, R, D, device=device, dtype=dtype)
        kv = KVCache([stack[0, i] for i in range(layers)], [stack[1, i] for i in range(layers)], stack)
        held = torch.full((batch, R), -1, dtype=torch.int64, device=device)
        return cls(kv, held, R - window)

    @property
    def k(self) -> list[torch.Tensor]:
        return self.kv.k

    @property
    def v(self) -> list[torch.Tensor]:
        return self.kv.v

    @property
    def size(self) -> int:
        return self.held.shape[1]

    @property
    def batch(self) -> int:
        return self.held.shape[0]

    def nbytes(self) -> int:
        return self.kv.nbytes() + self.held.numel() * self.held.element_size()

    def row(self, b: int) -> "RingCache":
        """A view of row `b` (writes go to the shared buffers)."""
        return RingCache(self.kv.row(b), self.held[b : b + 1], self.slack)

    def entries(self, slots: torch.Tensor) -> torch.Tensor:
        """Ring entries [..] of absolute slots [..]."""
        return slots % self.size

    def record(self, rows: torch.Tensor, slots: torch.Tensor) -> None:
        """Note that slots [B,T] of rows [B,T] were written (their last R when T > R)."""
        rows, slots = rows[:, -self.size :], slots[:, -self.size :]
        self.held[rows, self.entries(slots)] = slots

    def columns(self, before: torch.Tensor | None = None) -> torch.Tensor:
        """[B,R] the absolute slot each entry holds (-1: none); with `before` [B], entries holding
        slots >= before[b] count as none (a chunk about to rewrite them)."""
        if before is None:
            return self.held
        return torch.where(self.held < before[:, None], self.held, -1)

    def move_slots(self, src: torch.Tensor, dst: torch.Tensor) -> None:
        """Entry of slot src[b,j] -> entry of slot dst[b,j]; src, dst [B,J] int64."""
        self.kv.move_slots(self.entries(src), self.entries(dst))
        rows = torch.arange(src.shape[0], device=src.device)[:, None].expand_as(dst)
        self.held[rows, self.entries(dst)] = dst

    commit_path = KVCache.commit_path  # its moves go through `move_slots` above


def gather_columns(mask: torch.Tensor, cols: torch.Tensor) -> torch.Tensor:
    """mask [B,1,T,S] bool at columns cols [B,C] (-1 or >= S: False) -> [B,1,T,C]."""
    B, _, T, S = mask.shape
    valid = (cols >= 0) & (cols < S)  # [B,C]
    idx = cols.clamp(0, S - 1)[:, None, None, :].expand(B, 1, T, cols.shape[1])
    return torch.gather(mask, 3, idx) & valid[:, None, None, :]
