"""Training-free n-gram (prompt lookup) drafter.

For each row it keeps an index from every n-gram (ngram_min <= n <= ngram_max) of the committed
tokens to the positions that followed it. A round looks up the longest suffix of the sequence that
occurred before and proposes what followed: with topk = 1 the continuation of the most recent
match (a chain of up to `depth` tokens); with topk > 1 the continuations of up to `topk` distinct
earlier matches merged into a trie. Unused nodes up to the fixed budget are padded with copies of
the root token hung under the root: they are verified like any node, so padding cannot make the
output wrong, only waste verification width.

The rows' indexes are this drafter's per-workspace state (`base.WorkspaceCaches`, as the draft
model keeps its KV caches): an index does not depend on the depth, so the drafters of adaptive
depth tiers share it as those of a draft model share theirs (`Drafter.share_caches`). Whichever
tier proposes extends it with the tokens committed since.
"""

from __future__ import annotations

import torch

from specpilot.engine.drafters.base import Drafter, WorkspaceCaches
from specpilot.engine.state import DecodeState
from specpilot.engine.tree import DraftTree


class NgramIndex:
    """n-gram -> list of positions right after its occurrences, extended incrementally."""

    def __init__(self, n_min: int, n_max: int):
        self.n_min, self.n_max = n_min, n_max
        self.tokens: list[int] = []
        self.table: dict[tuple[int, ...], list[int]] = {}

    def extend(self, new: list[int]) -> None:
        for t in new:
            self.tokens.append(t)
            end = len(self.tokens)
            for n in range(self.n_min, self.n_max + 1):
                if end - n < 0:
                    break
                # the n-gram ending at end-1 is followed by position `end` (filled later)
                self.table.setdefault(tuple(self.tokens[end - n : end]), []).append(end)

    def continuations(self, depth: int, limit: int) -> list[list[int]]:
        """Up to `limit` distinct continuations of the longest previously seen suffix."""
        toks, L = self.tokens, len(self.tokens)
        for n in range(min(self.n_max, L), self.n_min - 1, -1):
            hits = self.table.get(tuple(toks[L - n :]), [])
            found, seen = [], set()
            for start in reversed(hits):  # most recent first
                if start >= L:
                    continue  # this is the suffix itself
                cont = tuple(toks[start : start + depth])
                if cont and cont not in seen:
                    seen.add(cont)
                    found.append(list(cont))
                    if len(found) == limit:
                        break
            if found:
                return found
        return []


def build_trie(root: int, branches: list[list[int]], budget: int) -> tuple[list[int], list[int]]:
    """Merge branches into a trie of at most budget draft nodes; (tokens, parents), root first."""
    tokens, parents = [root], [-1]
    children: dict[tuple[int, int], int] = {}
    for branch in branches:
        parent = 0
        for t in branch:
            node = children.get((parent, t))
            if node is None:
                if len(tokens) - 1 >= budget:
                    break
                node = len(tokens)
                tokens.append(t)
                parents.append(parent)
                children[(parent, t)] = node
            parent = node
    while len(tokens) - 1 < budget:  # pad: root copies under the root
        tokens.append(root)
        parents.append(0)
    return tokens, parents


class NgramDrafter(Drafter):
    name = "ngram"
    needs_host_tokens = True

    def __init__(self, depth: int, topk: int, tree_budget: int, ngram_min: int = 1, ngram_max: int = 4):
        self.depth, self.topk = depth, topk
        self.budget = min(tree_budget, depth * topk)
        self.n_min, self.n_max = ngram_min, ngram_max
        self.caches: WorkspaceCaches[list[NgramIndex]] = WorkspaceCaches()  # the rows' indexes per workspace

    @property
    def cache(self) -> list[NgramIndex] | None:
        """The rows' indexes of the current batch."""
        return self.caches.current

    @property
    def num_nodes(self) -> int:
        return self.budget + 1

    @property
    def indexes(self) -> list[NgramIndex]:
        """The rows' indexes of the current batch (empty before `start`)."""
        return self.cache if self.cache is not None else []

    def start(self, prompts: list[list[int]], state: DecodeState, features=None) -> None:
        indexes = self.caches.bind((state.batch, state.capacity), list)
        indexes.clear()  # a new batch: every row's index from its prompt
        for p in prompts:
            idx = NgramIndex(self.n_min, self.n_max)
            idx.extend(p)
            indexes.append(idx)

    def prefill_row(self, row: int, tokens: list[int], start: int, state: DecodeState, features=None) -> None:
        """A new request in `row`: an empty index, filled from the host tokens on the next `propose`."""
        if start == 0:
            self.cache[row] = NgramIndex(self.n_min, self.n_max)

    def propose(self, state: DecodeState, host_tokens: list[list[int]] | None = None) -> DraftTree:
        assert host_tokens is not None, "the n-gram drafter needs the committed tokens on the host"
        assert self.cache is not None and len(self.cache) == len(host_tokens), "propose before start"
        all_tokens, all_parents = [], []
        for idx, seq in zip(self.cache, host_tokens):
            if len(seq) > len(idx.tokens):
                idx.extend(seq[len(idx.tokens) :])
            branches = idx.continuations(self.depth, self.topk)
            t, p = build_trie(seq[-1], branches, self.budget)
            all_tokens.append(t)
            all_parents.append(p)
        dev = state.tokens.device
        tokens = torch.tensor(all_tokens, dtype=torch.int64, device=dev)
        parents = torch.tensor(all_parents, dtype=torch.int64, device=dev)
        return DraftTree(tokens, parents, max_depth=self.depth)
