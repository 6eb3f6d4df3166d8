"""The drafter interface: what a drafter is given, what it returns, the state it keeps.

A drafter proposes a `DraftTree` each round from the decoding state:
- `configure(settings)`: the generator's `DrafterSettings` (prefill padding, packed-prefill
  graphs, segment admission), once, before anything else;
- `start(prompts, state, features=None)`: a new batch begins in a workspace (bind the workspace's
  own caches, prefill them; the state is already loaded);
- `propose(state, host_tokens=None) -> DraftTree`: the tree of `num_nodes` nodes for this round,
  root = each row's last committed token, no draft deeper than `depth`.
Drafters that need the committed tokens on the host (prompt lookup) set `needs_host_tokens`; the
generator then syncs every round and passes them in `host_tokens`.
Drafters conditioned on the target's hidden states (DFlash, EAGLE-3) name the target layers in
`feature_layers` (-1: the embedding); the generator then captures those layers' outputs and hands
them over with `start(prompts, state, features)` (prefill: per row [L-1, n*C]) and
`observe(acc, prefix)` after each verification (`acc.features`: the accepted path's, inside the
graphed round). Other drafters get `features=None` and no `observe`.

Rules the round relies on:
- *Slack*: `slack()` is the most slots past a row's committed length that one round writes, in
  the target's cache (the tree) or the drafter's own (its tree region, its catch-up); the
  generator keeps that many (+ 1) free at the end of every workspace.
- *Per-workspace state*: a drafter keeps its caches per generator workspace, by
  (batch, capacity), in a `WorkspaceCaches`: made on the first `start` in a workspace, never
  reallocated (a captured round keeps pointing at them), dropped by `release(key)` with the
  workspace. The depth tiers of one drafter share one store (`share_caches`, called by the
  generator), so whichever tier drafts reads the state every tier keeps in step.
Under continuous batching (`engine.serving`) a request enters one row of a running batch:
`prefill_row(row, tokens, start, state, features)` gets its prompt chunk by chunk (the first call
has start 0 and begins the request in that row), after `start` has set the drafter up;
`prefill_rows(chunks, state, features)` gets the chunks of one sync together (row by row unless a
drafter packs them into one forward, `engine.packed_prefill`).

Drafters are built by `engine.session` from a `System`, one class per `DrafterKind`; no registry.
"""

from __future__ import annotations

import abc
from dataclasses import dataclass
from typing import Callable, ClassVar, Generic, TypeVar

from specpilot.engine.state import DecodeState
from specpilot.engine.tree import DraftTree
from specpilot.errors import ConfigError

WorkspaceKey = tuple[int, int]  # (batch, capacity) of a generator workspace
T = TypeVar("T")


@dataclass(frozen=True)
class DrafterSettings:
    """What the generator gives every drafter (`Drafter.configure`)."""

    prefill_bucket: int = 0  # prompt forwards padded to a multiple of this (`steps.prefill`); 0: none
    prefill_graphs: bool = False  # packed prompt forwards replay CUDA graphs (`packed_prefill`)
    # prompt tokens a prefilling row carries per round (`engine.segments`): a drafter sharing one
    # node budget across the batch keeps that many nodes for such a row first
    segment_tokens: int = 0


class WorkspaceCaches(Generic[T]):
    """A drafter's own state per generator workspace (module docstring), and the one in use."""

    def __init__(self):
        self.entries: dict[WorkspaceKey, T] = {}
        self.current: T | None = None  # the state of the workspace the last `bind` named

    def bind(self, key: WorkspaceKey, make: Callable[[], T]) -> T:
        """The state of workspace `key` (made by `make` the first time), now the current one."""
        if key not in self.entries:
            self.entries[key] = make()
        self.current = self.entries[key]
        return self.current

    def release(self, key: WorkspaceKey) -> None:
        self.entries.pop(key, None)


class Drafter(abc.ABC):
    name: ClassVar[str]
    needs_host_tokens: ClassVar[bool] = False
    feature_layers: tuple[int, ...] = ()  # target layers whose outputs this drafter reads (-1: embedding)
    depth: int  # K: the deepest draft node of a proposed tree (the tree's `max_depth`)
    model = None  # the drafter's own network (its weights stream each round); None: none (n-gram)
    settings: DrafterSettings = DrafterSettings()
    caches: WorkspaceCaches  # per workspace (module docstring); set by each drafter's __init__

    def configure(self, settings: DrafterSettings) -> None:
        """Take the generator's settings (before `start`)."""
        self.settings = settings

    def share_caches(self, other: "Drafter") -> None:
        """Keep per-workspace state in `other`'s store: `other` is another depth tier of this drafter."""
        self.caches = other.caches

    def release(self, key: WorkspaceKey) -> None:
        """Forget the state of a workspace the generator dropped."""
        self.caches.release(key)

    @abc.abstractmethod
    def start(self, prompts: list[list[int]], state: DecodeState, features=None) -> None: ...

    @abc.abstractmethod
    def propose(self, state: DecodeState, host_tokens: list[list[int]] | None = None) -> DraftTree: ...

    def observe(self, acc, prefix) -> None:
        """After verification, inside the round (feature-conditioned drafters only): `acc` the
        round's `Acceptance` with `acc.features`, `prefix [B]` the slot of the round's root."""

    @property
    def num_nodes(self) -> int:
        """N: nodes of every proposed tree (root included); fixed, so shapes are static."""
        raise NotImplementedError

    def slack(self) -> int:
        """Slots past a row's committed length one round writes (module docstring): the tree's nodes."""
        return self.num_nodes

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
