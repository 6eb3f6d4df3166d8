"""Two-level verification (TLV): a cheap 8-bit view of the target proposes a chain beside the
drafter's tree, and one exact verify forward checks their union.

Each round the view (`models.view.fp8_view`: the target with FP8 per-channel projections) drafts
a greedy chain of `chain` tokens from the current state, as a draft model does (`DraftModelDrafter`,
topk 1, its catch-up window covering the deepest path either part can accept). The inner drafter
(a draft model, an EAGLE-3 head, a DFlash block; or none: the view alone) proposes its tree as
always. The round's tree is the union: the inner tree's N1 nodes, then the chain's `chain` nodes
hung from the shared root (chain node i's parent is chain node i-1, the first's the root). The
verify forward runs all N1 + chain nodes and accepts the longest verified path; the view accepts
nothing on its own, so the output is the target's whatever the view computes (lossless by
construction; where both parts propose the same path the duplicate costs a node and changes
nothing, as a repeated sibling does under greedy acceptance).

The view keeps its own KV cache: its K/V differ from the target's (FP8 rounding), so writing them
into the exact cache would change what the target reads; reading the exact cache with the view's
writes in the tree region would save the catch-up and the memory, but needs the target's cache
inside the drafter (a later step). Memory: the view's FP8 weights (`models.view.view_bytes`)
plus a KV cache of the target's shape.

Owns: the union tree and passing the generator's calls to both parts. Does not own drafting
(the parts) or the view's construction (`models.view`).
"""

from __future__ import annotations

import torch

from specpilot.engine.drafters.base import Drafter, DrafterSettings
from specpilot.engine.drafters.draft_model import DraftModelDrafter
from specpilot.engine.state import DecodeState
from specpilot.engine.tree import DraftTree


def union(first: DraftTree, chain: DraftTree) -> DraftTree:
    """`first`'s nodes, then `chain`'s drafts hung from the shared root (both [B,..], same roots)."""
    B, N1 = first.tokens.shape
    c = chain.num_nodes - 1
    p = chain.parents[:, 1:]  # [B,c] 0 = the root
    parents = torch.cat([first.parents, torch.where(p == 0, p, p + N1 - 1)], 1)  # [B,N1+c]
    tokens = torch.cat([first.tokens, chain.tokens[:, 1:]], 1)
    valid = None if first.valid is None else torch.cat([first.valid, first.valid.new_ones(B, c)], 1)
    num_valid = first.num_valid + B * c if first.num_valid else 0
    return DraftTree(tokens, parents, max(first.max_depth, chain.max_depth), valid, num_valid)


class TwoLevelDrafter(Drafter):
    name = "tlv"

    def __init__(self, inner: Drafter | None, view, chain: int):
        if chain < 1:
            raise ValueError(f"a two-level chain needs >= 1 token (got {chain})")
        if inner is not None and inner.needs_host_tokens:
            raise ValueError(f"two-level verification drafts on the device; drafter {inner.name!r} needs host tokens")
        self.inner, self.chain = inner, chain
        deepest = max(chain, inner.depth if inner is not None else 0)
        self.view = DraftModelDrafter(view, chain, 1, chain, window=deepest + 1)
        self.depth = deepest
        self.feature_layers = inner.feature_layers if inner is not None else ()

    @property
    def parts(self) -> list[Drafter]:
        return [self.view] if self.inner is None else [self.inner, self.view]

    @property
    def num_nodes(self) -> int:
        return (self.inner.num_nodes if self.inner is not None else 1) + self.chain

    def slack(self) -> int:
        """The union tree, or the most slots either part's round writes in its own cache."""
        return max(self.num_nodes, *(d.slack() for d in self.parts))

    def configure(self, settings: DrafterSettings) -> None:
        super().configure(settings)
        for d in self.parts:
            d.configure(settings)

    def share_caches(self, other: "TwoLevelDrafter") -> None:
        for mine, theirs in zip(self.parts, other.parts):
            mine.share_caches(theirs)

    def release(self, key: tuple[int, int]) -> None:
        for d in self.parts:
            d.release(key)

    def start(self, prompts: list[list[int]], state: DecodeState, features=None) -> None:
        if self.inner is not None:
            self.inner.start(prompts, state, features)
        self.view.start(prompts, state)

    def prefill_rows(self, chunks: list, state: DecodeState, features: list | None = None) -> None:
        if self.inner is not None:
            self.inner.prefill_rows(chunks, state, features)
        self.view.prefill_rows(chunks, state)

    def prefill_row(self, row: int, tokens: list[int], start: int, state: DecodeState, features=None) -> None:
        from specpilot.engine.packed_prefill import Chunk

        self.prefill_rows([Chunk(row, tuple(tokens), start)], state, None if features is None else [features])

    def warm_rows(self, limit: int) -> None:
        for d in self.parts:
            d.warm_rows(limit)

    def observe(self, acc, prefix: torch.Tensor) -> None:
        self.inner.observe(acc, prefix)  # called only with feature_layers: an inner drafter reads them

    def propose(self, state: DecodeState, host_tokens=None) -> DraftTree:
        chain = self.view.propose(state)
        return chain if self.inner is None else union(self.inner.propose(state), chain)
