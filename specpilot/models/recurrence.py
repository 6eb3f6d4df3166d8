"""How the tokens of one forward continue each row's recurrent state.

A decoder with recurrent layers (Gated DeltaNet, `models/gdn.py`) keeps, per row of its cache, a
*committed* state: the state after the row's last committed token. Attention layers find their
context through the mask; a recurrent layer must know, for every token of a forward, which state it
continues. `Recurrence` says it, in one of two shapes:

- a **causal chunk** (`parents` None): token t continues token t - 1, token 0 the committed state.
  Prefill, token forcing and the AR step are chunks. The forward commits, in place, the state after
  token `commit[b]` of each row (-1: leaves the row alone, e.g. a row that is done), so nothing
  else is needed afterwards.
- a **tree** (`parents` [B,T]): token t continues its parent (an index into the same forward),
  and a token with parent -1 (the root) the committed state. The forward commits nothing; it keeps
  every node's state in the cache's scratch, and after verification the engine commits the
  accepted path (`commit_path` of the engine's cache), whose last node's state becomes the
  committed one.

In both shapes a token at RoPE position 0 starts a sequence: it continues the zero state, and
conv inputs before position 0 are zeros, whatever the row held before (rows are reused across
requests without being cleared). Dense decoders ignore `Recurrence`.

The cache object a recurrent layer reads and writes (`RecurrentCache`) is allocated by the engine;
this module only states what the layers expect of it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch


@dataclass
class Recurrence:
    parents: torch.Tensor | None = None  # [B,T] int64 tree parents (-1: the committed state); None: causal chunk
    depths: torch.Tensor | None = None  # [B,T] int64 depth of each tree node (root 0)
    max_depth: int = 0  # static bound on depths (trees)
    commit: torch.Tensor | None = None  # [B] int64 causal chunks: the token whose state is committed (-1: none)

    @property
    def is_tree(self) -> bool:
        return self.parents is not None

    @classmethod
    def chunk(cls, commit: torch.Tensor) -> "Recurrence":
        return cls(commit=commit)

    @classmethod
    def tree(cls, parents: torch.Tensor, depths: torch.Tensor, max_depth: int) -> "Recurrence":
        return cls(parents=parents, depths=depths, max_depth=max_depth)


class RecurrentCache(Protocol):
    """What recurrent layers read and write, per recurrent layer j (views of preallocated buffers)."""

    state: list[torch.Tensor]  # [B,Hv,Dk,Dv] float32 committed recurrent state
    window: list[torch.Tensor]  # [B,K-1,Cc] conv inputs of the last K-1 committed tokens, oldest first
    node_state: list[torch.Tensor]  # [B,Nmax,Hv,Dk,Dv] float32 states of the last tree forward's nodes
    node_input: list[torch.Tensor]  # [B,Nmax,Cc] conv inputs of the last tree forward's nodes
