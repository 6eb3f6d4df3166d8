"""The DFlash block drafter: one draft forward per round proposes a whole block.

Each round, with P = the root's slot (`state.cache_prefix()`):
1. *Draft*: the block [root, MASK x (block_size - 1)] at positions P..P+block_size-1 runs through
   the draft layers (`DFlashModel.block_forward`); every block token sees the draft cache's
   context slots < P and the whole block (mask `(s < P) | (P <= s < P + block_size)`). The
   target's `lm_head` on outputs 1..block_size-1 gives one distribution per depth.
2. *Tree*: `engine.ddtree.build_tree` turns them into a chain, a best-first (DDTree) or a
   spine-first tree of a fixed node count; the generator verifies it in one target forward.
3. *Observe* (`observe`, run by the generator right after verification, inside the same round):
   the target features of the accepted path — root first, captured in the verify forward —
   become context K/V at slots P..P+K. Entries past the accepted length are junk at slots >= the
   new P: masked next round and overwritten later (the engine's stale-slot rule); the block's own
   K/V written in step 1 lie in the same region and are overwritten the same way.
The prompt's context K/V come from the features captured during the target's prefill (`start`).

Batch mechanisms (`engine/selection.py`):
- *per-request block depth* (`row_depth_margin` = m > 0): a row drafts no deeper than its cap,
  ceil(mean accepted drafts of its last rounds) + m rounded UP to a depth tier
  (`depth_tiers`: block_size, 3/4 and 1/2 of it in positions, root included — the 16/12/8
  positions of a block of 16, i.e. depths 15/11/7); log-probs of deeper positions become -inf
  before the tree builder, so best-first trees spend their nodes above the cap and a chain stops
  there (its nodes below are padding, never accepted: `ddtree.py`). The draft forward itself
  still runs the whole block (one static shape).
- *shared budget* (`shared_budget` = s > 0; best-first and chain trees): the batch's rows split
  B x s of the tree's nodes by path score; the verify forward packs the valid nodes and still
  captures their features (every node of an accepted path is valid, hence packed).

The draft cache holds context K/V only at committed slots, so it needs no catch-up and no per-row
bookkeeping; every shape is fixed by (batch, capacity, block_size, tree budget), so the round is
graph-capturable with the generator's single host sync.
"""

from __future__ import annotations

import torch

from specpilot.config import TreeConstruction
from specpilot.engine.ddtree import build_tree, num_draft_nodes
from specpilot.engine.drafters.base import Drafter, WorkspaceCaches
from specpilot.models.kv_cache import KVCache
from specpilot.engine.packed_prefill import Chunk, to_device, with_features
from specpilot.engine.selection import row_caps, share_rows
from specpilot.engine.state import DecodeState
from specpilot.engine.tree import DraftTree
from specpilot.engine.verify import Acceptance
from specpilot.errors import ConfigError
from specpilot.models import ops
from specpilot.models.dflash import DFlashModel
from specpilot.models.transformer import Transformer


class DFlashDrafter(Drafter):
    name = "dflash"

    def __init__(self, model: DFlashModel, target: Transformer, block_size: int = 16, tree_budget: int = 32,
                 construction: TreeConstruction = TreeConstruction.BEST_FIRST, shared_budget: int = 0,
                 row_depth_margin: int = 0, compiled: bool = False):
        if block_size < 2:
            raise ConfigError(f"DFlash block_size must be >= 2 (got {block_size})")
        if model.config.hidden_size != target.config.hidden_size:
            raise ConfigError("DFlash drafter and target differ in hidden size")
        self.model, self.target = model, target
        # a proposal (block forward, log-probs, tree) compiled whole with static shapes, or eager;
        # prefill and the context writes of `observe` stay eager
        self._propose = ops.compiled_static(self._proposal, target.device) if compiled else self._proposal
        self.block_size = block_size
        self.depth = block_size - 1  # K: deepest draft node
        self.construction = construction
        self.budget = tree_budget
        self._drafts = num_draft_nodes(construction, self.depth, target.config.vocab_size, tree_budget)
        if shared_budget and construction is TreeConstruction.SPINE_FIRST:
            raise ConfigError("DFlash shared_budget needs tree_construction 'best_first' or 'chain'")
        self.shared = min(shared_budget, self._drafts)  # mean draft nodes per row; 0 = no sharing
        self.row_depth_margin = row_depth_margin  # 0 = every row drafts the whole block
        # ascending, the last is `depth`; on the device, as a graph capture cannot copy from the host
        self.tiers = torch.tensor(depth_tiers(block_size), device=target.device)
        self.caches: WorkspaceCaches[KVCache] = WorkspaceCaches()  # per generator workspace

    @property
    def feature_layers(self) -> tuple[int, ...]:
        return self.model.feature_layers

    @property
    def cache(self) -> KVCache | None:
        """The draft cache of the workspace in use."""
        return self.caches.current

    @property
    def num_nodes(self) -> int:
        return self._drafts + 1

    def slack(self) -> int:
        """The tree, or the block's slots P..P+block_size-1."""
        return max(self.num_nodes, self.block_size)

    def start(self, prompts: list[list[int]], state: DecodeState, features: list[torch.Tensor] | None = None) -> None:
        """Allocate this workspace's draft cache and fill the prompts' context from `features`
        (per row [L-1, n*C], from the target's prefill; None when there is no prefill, e.g. capture)."""
        key = (state.batch, state.capacity)
        self.caches.bind(key, lambda: KVCache.allocate(self.model.config, *key, self.model.device, self.model.dtype))
        if features is None:
            return
        for b, f in enumerate(features):
            if f.shape[0] == 0:
                continue
            pos = torch.arange(f.shape[0], device=f.device)[None]
            self._write_context(self.cache.row(b), f[None].to(self.model.dtype), pos)

    def prefill_row(self, row: int, tokens: list[int], start: int, state: DecodeState,
                    features: torch.Tensor | None = None) -> None:
        """Context K/V of one prompt chunk of the request entering `row`, from its target features
        [T,nC] (from the target's prefill of the chunk), at slots start..start+T-1."""
        self.prefill_rows([Chunk(row, tuple(tokens), start)], state, [features])

    def prefill_rows(self, chunks: list, state: DecodeState, features=None) -> None:
        """One sync's prompt chunks: the context K/V of every chunk with features in one call over
        their concatenated features, each token written at its row's slot (start + t)."""
        full = with_features(chunks, features)
        if not full:
            return
        rows = [c.row for c, f in full for _ in range(f.shape[0])]
        slots = [c.start + t for c, f in full for t in range(f.shape[0])]
        dev = full[0][1].device
        host = torch.tensor([rows, slots], dtype=torch.int64)
        index = to_device(host, dev)  # [2,n]
        feats = torch.cat([f for _, f in full])[None].to(self.model.dtype)  # [1,n,nC]
        self._write_context(self.cache, feats, index[1][None], index[0][None])

    def _write_context(self, cache: KVCache, features: torch.Tensor, positions: torch.Tensor,
                       rows: torch.Tensor | None = None) -> None:
        """Context K/V of features [B,T,n*C] at slots = positions [B,T] of rows [B,T] (default: row b)."""
        B, T = positions.shape
        if rows is None:
            rows = torch.arange(B, device=positions.device)[:, None].expand(B, T)
        for i, (k, v) in enumerate(self.model.context_kv(features, positions)):
            cache.k[i][rows, :, positions] = k  # [B,T,Hkv,D]
            cache.v[i][rows, :, positions] = v

    def observe(self, acc: Acceptance, prefix: torch.Tensor) -> None:
        """Context K/V of the accepted path of the round whose root sat at slot `prefix [B]`."""
        K1 = acc.features.shape[1]
        pos = prefix[:, None] + torch.arange(K1, device=prefix.device)[None]  # [B,K+1]
        self._write_context(self.cache, acc.features.to(self.model.dtype), pos.clamp(max=self.cache.capacity - 1))

    def propose(self, state: DecodeState, host_tokens=None) -> DraftTree:
        return self._propose(state)

    def _proposal(self, state: DecodeState) -> DraftTree:
        lp = self.block_logprobs(state)  # [B,K,V]
        if self.row_depth_margin:
            cap = self.depth_caps(state)  # [B]
            beyond = torch.arange(1, self.depth + 1, device=cap.device)[None] > cap[:, None]  # [B,K]
            lp = lp.masked_fill(beyond[..., None], float("-inf"))
        return build_tree(self.construction, lp, state.roots(), self.budget, shared=self.shared,
                          rows=share_rows(state, self.settings.segment_tokens) if self.shared else None,
                          capped=bool(self.row_depth_margin))

    def depth_caps(self, state: DecodeState) -> torch.Tensor:
        """[B] each row's deepest draft depth: its recent acceptance + margin, rounded up to a tier."""
        cap = row_caps(state, self.depth, self.row_depth_margin)
        return self.tiers[torch.searchsorted(self.tiers, cap).clamp(max=len(self.tiers) - 1)]

    def block_logprobs(self, state: DecodeState) -> torch.Tensor:
        """Float32 log-probs [B,K,V] of the drafts at depths 1..K after each row's root."""
        B, T = state.batch, self.block_size
        dev = state.tokens.device
        P = state.cache_prefix()  # [B] slot and position of the root
        roots = state.roots()
        embed = self.model.input_embeddings(self.target.embed_tokens, roots)[:, None]  # [B,1,C]
        noise = torch.cat([embed, self.model.mask_embedding.to(embed.dtype).expand(B, T - 1, -1)], 1)  # [B,T,C]
        pos = P[:, None] + torch.arange(T, device=dev)[None]  # [B,T]
        s = torch.arange(self.cache.capacity, device=dev)[None, :]
        visible = (s < P[:, None] + T)[:, None, None, :].expand(B, 1, T, -1)  # context and the whole block
        hidden = self.model.block_forward(noise, pos, self.cache, pos, visible)  # [B,T,C]
        logits = self.model.logits(self.target.lm_head, hidden[:, 1:])  # [B,K,V]
        return torch.log_softmax(logits.float(), dim=-1)


def depth_tiers(block_size: int) -> tuple[int, ...]:
    """Per-request block depths, ascending: blocks of 1/2, 3/4 and all of `block_size` positions
    (root included), so 7, 11, 15 for a block of 16."""
    return tuple(sorted({max(1, block_size * q // 4 - 1) for q in (2, 3, 4)}))
