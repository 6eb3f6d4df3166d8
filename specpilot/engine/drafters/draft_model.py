"""A separate draft model (same tokenizer) drafting a chain or a best-first tree.

Each round:
1. *Catch-up*: the draft model re-reads the last W committed tokens (W = depth + 1 by default) into
   its own cache. That covers every token committed since its last round (at most depth accepted
   + 1 bonus), so its cache stays in step with the target's without tracking tree slots; its
   output at the root gives the depth-1 log-probs.
2. *Expansion* and *selection* (`best_first.py`): `depth` levels of `topk` x `topk` candidates,
   one draft-model forward per level, then the `tree_budget` best candidates form the tree.
With topk = 1 this is a greedy chain of `depth` tokens. Every shape is fixed by
(batch, depth, topk, tree_budget), so a round can be captured in a CUDA graph.

*Shared budget* (`shared_budget` = s > 0): the batch's rows split B x s draft nodes by path score
instead of taking `tree_budget` each. Each row ranks its best `tree_budget` candidates as above
(a prefix-closed ranking: parents first); all B x tree_budget ranked scores are sorted together
(`selection.select` says how the split stays prefix-closed).

*Per-request depth* (`row_depth_margin` = m > 0): a row whose last rounds accepted a drafts on
average gets candidates only down to depth ceil(a) + m (`selection.row_caps`; all depths before
it has a round): deeper candidates score -inf before selection, which keeps every set
prefix-closed and, with a shared budget, hands their nodes to other rows.
"""

from __future__ import annotations

import functools

import torch

from specpilot.engine.drafters import best_first
from specpilot.engine.drafters.base import Drafter, WorkspaceCaches
from specpilot.models.kv_cache import KVCache
from specpilot.engine.packed_prefill import PACK_ROWS, Chunk, PackingCache, packed_forward, warm
from specpilot.engine.selection import row_caps, share_rows
from specpilot.engine.state import DecodeState
from specpilot.engine.steps import prefill, prefill_chunk
from specpilot.engine.tree import DraftTree
from specpilot.models import ops
from specpilot.models.transformer import Transformer


@functools.lru_cache(maxsize=64)
def _aranges(window: int, capacity: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """[W] and [S] 0.. index tensors of the catch-up, made once (not by two kernels every round)."""
    return torch.arange(window, device=device), torch.arange(capacity, device=device)


class DraftModelDrafter(Drafter):
    name = "model"

    def __init__(self, model: Transformer, depth: int, topk: int, tree_budget: int, window: int = 0,
                 shared_budget: int = 0, row_depth_margin: int = 0, compiled: bool = False):
        self.model = model
        # a proposal (catch-up, expansion, selection) compiled whole with static shapes, or eager;
        # prefill stays eager (its lengths vary)
        self._propose = ops.compiled_static(self._proposal, model.device) if compiled else self._proposal
        self.depth, self.topk = depth, topk
        self.num_candidates = best_first.num_candidates(depth, topk)  # M
        self.budget = min(tree_budget, self.num_candidates)
        self.shared = min(shared_budget, self.budget)  # mean draft nodes per row; 0 = no sharing
        self.row_depth_margin = row_depth_margin  # 0 = every row drafts to `depth`
        self.window = window or depth + 1
        if self.window < depth + 1:
            raise ValueError("window must cover depth + 1 tokens")
        # the draft model's cache per generator workspace (`base.WorkspaceCaches`)
        self.caches: WorkspaceCaches[KVCache] = WorkspaceCaches()
        self.packings: dict[tuple[int, int], PackingCache] = {}  # per cache: packed prefill (`prefill_rows`)

    @property
    def cache(self) -> KVCache | None:
        """The draft cache of the workspace in use."""
        return self.caches.current

    @property
    def num_nodes(self) -> int:
        return self.budget + 1

    def slack(self) -> int:
        """The tree, or the tree region (M candidates from slot L) after a catch-up window of W."""
        return max(self.num_nodes, self.num_candidates + self.window)

    def start(self, prompts: list[list[int]], state: DecodeState, features=None) -> None:
        key = (state.batch, state.capacity)
        cache = self.caches.bind(key, lambda: self.model.new_cache(*key))  # the draft model's own layout
        prefill(self.model, cache, prompts, bucket=self.settings.prefill_bucket)

    def release(self, key: tuple[int, int]) -> None:
        super().release(key)
        self.packings.pop(key, None)

    def _packing(self) -> PackingCache:
        return PackingCache.of(self.packings, self.cache, self.settings.prefill_bucket, self.settings.prefill_graphs)

    def prefill_rows(self, chunks: list, state: DecodeState, features=None) -> None:
        """One sync's prompt chunks into the draft cache, packed `PACK_ROWS` to a forward."""
        full = [c for c in chunks if c.tokens]
        if not self.cache.packable:  # K/V of several shapes (`new_cache`): no batch-1 packing cache
            for c in full:
                prefill_chunk(self.model, self.cache.row(c.row), list(c.tokens), c.start, self.settings.prefill_bucket)
            return
        packing = self._packing() if full else None
        for i in range(0, len(full), PACK_ROWS):
            packed_forward(self.model, self.cache, packing, full[i : i + PACK_ROWS], self.settings.prefill_bucket)

    def warm_rows(self, limit: int) -> None:
        bucket = self.settings.prefill_bucket
        if bucket > 0 and self.cache.packable:
            warm(self.model, self.cache, self._packing(), bucket, limit)

    def prefill_row(self, row: int, tokens: list[int], start: int, state: DecodeState, features=None) -> None:
        """One prompt chunk of the request entering `row` into the draft cache (as `start` does for
        a whole batch; the first round's catch-up covers the root and what follows)."""
        self.prefill_rows([Chunk(row, tuple(tokens), start)], state)

    def _catch_up(self, state: DecodeState) -> torch.Tensor:
        """Re-read the last W committed tokens; logits at the root [B,V]."""
        W = self.window
        L = state.seq_lens
        start = (L - W).clamp(min=0)  # [B]
        # made inside the call while traced (`draft_compile`), where a cached tensor would be ignored
        w, s = (_aranges.__wrapped__ if torch.compiler.is_compiling() else _aranges)(W, self.cache.capacity, L.device)
        idx = start[:, None] + w[None, :]  # [B,W]
        tokens = state.tokens.gather(1, idx.clamp(max=state.capacity - 1))
        mask = (s[None, None, :] <= idx[..., None])[:, None]  # [B,1,W,S]
        root_at = (L - 1 - start)[:, None]  # [B,1] index of the root inside the window
        logits = self.model(tokens, idx, self.cache, idx, mask, logits_for=root_at)  # [B,1,V]
        return logits[:, 0]

    def propose(self, state: DecodeState, host_tokens=None) -> DraftTree:
        return self._propose(state)

    def _proposal(self, state: DecodeState) -> DraftTree:
        root_logits = self._catch_up(state)

        def step(tokens, carry, pos, slots, mask):
            return self.model(tokens, pos, self.cache, slots, mask), None  # [B,k,V]

        # the draft model read the root itself (slot L - 1): its tree region starts at L
        caps = row_caps(state, self.depth, self.row_depth_margin) if self.row_depth_margin else None
        return best_first.expand(state.roots(), root_logits, step, self.depth, self.topk, self.budget,
                                 base=state.seq_lens, capacity=self.cache.capacity,
                                 depth_cap=caps, shared=self.shared,
                                 rows=share_rows(state, self.settings.segment_tokens) if self.shared else None)
