"""The drafter interface and its registry.

A drafter proposes a `DraftTree` each round from the decoding state. Two methods:
- `start(prompts, state)`: a new batch begins (prefill own caches; the state is already loaded);
- `propose(state) -> DraftTree`: the tree for this round, root = each row's last committed token.
Drafters that need the committed tokens on the host (prompt lookup) set `needs_host_tokens`; the
generator then syncs every round and passes them in `state_host`.
Drafters conditioned on the target's hidden states (DFlash, EAGLE-3) name the target layers in
`feature_layers` (-1: the embedding); the generator then captures those layers' outputs and hands them over with
`start(prompts, state, features)` (prefill: per row [L-1, n*C]) and `observe(acc, prefix)` after
each verification (`acc.features`: the accepted path's, inside the graphed round).
Under continuous batching (`engine.serving`) a request enters one row of a running batch:
`prefill_row(row, tokens, start, state, features)` gets its prompt chunk by chunk (the first call
has start 0 and begins the request in that row), after `start` has set the drafter up;
`prefill_rows(chunks, state, features)` gets the chunks of one sync together (row by row unless a
drafter packs them into one forward, `engine.packed_prefill`).
"""

from __future__ import annotations

import abc
from typing import Callable, ClassVar

from specpilot.engine.state import DecodeState
from specpilot.engine.tree import DraftTree
from specpilot.errors import ConfigError


class Drafter(abc.ABC):
    name: ClassVar[str]
    needs_host_tokens: ClassVar[bool] = False
    feature_layers: tuple[int, ...] = ()  # target layers whose outputs this drafter reads (-1: embedding)
    # prompt tokens a prefilling row carries per round (`engine.segments`), set by the generator: a
    # drafter sharing one node budget across the batch keeps that many nodes for such a row first
    segment_tokens: int = 0

    @abc.abstractmethod
    def start(self, prompts: list[list[int]], state: DecodeState) -> None: ...

    @abc.abstractmethod
    def propose(self, state: DecodeState, host_tokens: list[list[int]] | None = None) -> DraftTree: ...

    def prefill_row(self, row: int, tokens: list[int], start: int, state: DecodeState, features=None) -> None:
        """Continuous batching: prompt body tokens at slots start.. of the request entering `row`
        (`features [T,nC]` of them for a feature-conditioned drafter); start 0 resets the row."""
        raise ConfigError(f"drafter {self.name!r} does not support continuous batching")

    def prefill_rows(self, chunks: list, state: DecodeState, features: list | None = None) -> None:
        """The prompt chunks of one sync (`packed_prefill.Chunk`s; `features[i]` [T,nC] of chunk i,
        None for a chunk without tokens), in order: row by row here."""
        for i, c in enumerate(chunks):
            self.prefill_row(c.row, list(c.tokens), c.start, state, None if features is None else features[i])

    def warm_rows(self, limit: int) -> None:
        """Run the shapes `prefill_rows` will run for chunks of up to `limit` tokens (after `start`)."""

    @property
    def num_nodes(self) -> int:
        """N: nodes of every proposed tree (root included); fixed, so shapes are static."""
        raise NotImplementedError


DRAFTERS: dict[str, Callable[..., Drafter]] = {}


def register(name: str):
    def wrap(cls):
        cls.name = name
        DRAFTERS[name] = cls
        return cls

    return wrap
