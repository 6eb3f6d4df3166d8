"""The EAGLE-3 drafter: a one-layer head over fused target features drafts a best-first tree.

The head's cache holds one entry per committed token but the root: slot t = (target features of
token t, embedding of token t + 1) at position t, whose output predicts token t + 2. With L
committed tokens (root at L - 1) slots 0..L-2 are filled and the output at slot L - 2 — the
*root hidden* — gives the depth-1 log-probs. Each round:
1. *Expansion* (`best_first.py`): the frontier carries the head's own output hidden states
   (EAGLE's `input_hidden = out_hidden[:, out_ids]`): a depth-d node is fed (its parent's output,
   its own token) at position L - 2 + d, in the tree region from slot L - 1 on; `depth` levels of
   `topk` x `topk` candidates, then the `tree_budget` best form the tree (topk = 1: a chain).
2. *Catch-up* (`observe`, run by the generator right after verification, inside the same round):
   the target features of the accepted path (root first, captured in the verify forward) and the
   tokens that follow them (the accepted drafts, then the bonus) fill slots P..P+K (P = the
   verified root's slot) in one causal forward; the output at P + accept_len is the next root
   hidden. Entries past the accepted length land at slots >= the new root's and are overwritten
   before anything sees them (the engine's stale-slot rule), as are the tree region's.
The prompt's slots are filled in `start` (and, under continuous batching, `prefill_row`) from the
features captured during the target's prefill, in forwards padded to a multiple of
`settings.prefill_bucket` positions as the target's are (`DrafterSettings`: a bounded set of shapes, so
an attention backend that plans per shape, cuDNN's, plans each once, not each prompt length); the
padding's entries land at slots >= the root's and are overwritten before anything sees them.
Every shape is fixed by (batch, capacity, depth, topk, budget): the round is graph-capturable with
the generator's single host sync.

The batch mechanisms work as for the draft model (`engine/selection.py`): `shared_budget` splits
B x s nodes over the batch by path score, `row_depth_margin` caps each row's depth by its recent
acceptance. A shared budget's verify forward packs the valid nodes and still captures their
features (`steps.packed_argmax`): every node of an accepted path is valid, hence packed, so the
catch-up reads the same features as from an unpacked forward.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from specpilot.engine.drafters import best_first
from specpilot.engine.drafters.base import Drafter, WorkspaceCaches
from specpilot.models.kv_cache import KVCache
from specpilot.engine.packed_prefill import PACK_ROWS, Chunk, PackingCache, pack, padded_lengths, with_features
from specpilot.engine.selection import row_caps, share_rows
from specpilot.engine.state import DecodeState
from specpilot.engine.steps import padded_length
from specpilot.engine.tree import DraftTree
from specpilot.engine.verify import Acceptance
from specpilot.errors import ConfigError
from specpilot.models import ops
from specpilot.models.eagle3 import Eagle3Model
from specpilot.models.transformer import Transformer

PROMPT_CHUNK = 512  # prompt slots per head forward in `start` (bounds the dense mask)


@dataclass
class Eagle3Cache:
    """One generator workspace's head state; never reallocated, so captured graphs stay valid."""

    kv: KVCache  # the head's one layer, [B,Hkv,S,D]
    root_hidden: torch.Tensor  # [B,C] the head's output at each row's root slot (L - 2)


class Eagle3Drafter(Drafter):
    name = "eagle3"

    def __init__(self, model: Eagle3Model, target: Transformer, depth: int, topk: int, tree_budget: int,
                 shared_budget: int = 0, row_depth_margin: int = 0, compiled: bool = False):
        if min(depth, topk, tree_budget) < 1:
            raise ConfigError(f"EAGLE-3 needs depth, topk and tree_budget >= 1 (got {depth}, {topk}, {tree_budget})")
        if model.spec.target_hidden_size != target.config.hidden_size:
            raise ConfigError("EAGLE-3 head and target differ in hidden size")
        self.model, self.target = model, target
        self.depth, self.topk = depth, topk
        self.num_candidates = best_first.num_candidates(depth, topk)  # M
        self.budget = min(tree_budget, self.num_candidates)
        self.shared = min(shared_budget, self.budget)  # mean draft nodes per row; 0 = no sharing
        self.row_depth_margin = row_depth_margin  # 0 = every row drafts to `depth`
        self.window = depth + 1  # slots a catch-up writes (the generator sizes its slack with this)
        self.embed = model.embed_tokens if model.embed_tokens is not None else target.embed_tokens
        self.token_ids = model.token_ids()  # [Vd] target id per draft id, None if the same vocabulary
        self.caches: WorkspaceCaches[Eagle3Cache] = WorkspaceCaches()  # per workspace, shared by depth tiers
        self.packings: dict[tuple[int, int], PackingCache] = {}  # per workspace: packed prompt forwards
        # a proposal (expansion and selection) compiled whole with static shapes, or eager
        self._propose = ops.compiled_static(self._proposal, target.device) if compiled else self._proposal

    @property
    def feature_layers(self) -> tuple[int, ...]:
        return self.model.feature_layers

    @property
    def cache(self) -> Eagle3Cache | None:
        """The head state of the workspace in use."""
        return self.caches.current

    @property
    def num_nodes(self) -> int:
        return self.budget + 1

    def slack(self) -> int:
        """The tree, or the tree region (M candidates) after the catch-up's `window` slots."""
        return max(self.num_nodes, self.num_candidates + self.window)

    def release(self, key: tuple[int, int]) -> None:
        super().release(key)
        self.packings.pop(key, None)

    def start(self, prompts: list[list[int]], state: DecodeState, features: list[torch.Tensor] | None = None) -> None:
        """Allocate this workspace's head cache and fill the prompts' slots from `features` (per row
        [len - 1, n*C], from the target's prefill; None when there is no prefill, e.g. capture)."""
        key = (state.batch, state.capacity)
        m = self.model
        self.caches.bind(key, lambda: Eagle3Cache(KVCache.allocate(m.config, *key, m.device, m.dtype), torch.zeros(
            state.batch, m.config.hidden_size, device=m.device, dtype=m.dtype)))
        if features is None:
            return
        self.cache.root_hidden.zero_()  # a one-token prompt has no slot: its first round drafts from zeros
        dev = m.device
        for b, (p, f) in enumerate(zip(prompts, features)):
            row = self.cache.kv.row(b)
            nxt = torch.tensor(p[1:], dtype=torch.int64, device=dev)  # token t + 1 of slot t
            for s in range(0, f.shape[0], PROMPT_CHUNK):
                e = min(s + PROMPT_CHUNK, f.shape[0])
                self.cache.root_hidden[b] = self._prompt_forward(row, f[s:e], nxt[s:e], s)

    def prefill_row(self, row: int, tokens: list[int], start: int, state: DecodeState,
                    features: torch.Tensor | None = None) -> None:
        """Continuous batching: the head's slots start..start+T-1 of the request entering `row` from
        the target features [T,nC] of that prompt chunk, each paired with the next prompt token
        (already in `state.tokens`); start 0 resets the row's root hidden."""
        self.prefill_rows([Chunk(row, tuple(tokens), start)], state, [features])

    def prefill_rows(self, chunks: list, state: DecodeState, features=None) -> None:
        """One sync's prompt chunks (continuous batching): rows starting a prompt get their root
        hidden reset; the chunks with features fill their head slots in packed forwards
        (`engine.packed_prefill`), `PACK_ROWS` to a forward, each row's root hidden read at its
        chunk's last slot, as `prefill_row` does one row at a time."""
        for c in chunks:
            if c.start == 0:
                self.cache.root_hidden[c.row].zero_()
        full = with_features(chunks, features)
        for i in range(0, len(full), PACK_ROWS):
            self._packed_prompt_forward(full[i : i + PACK_ROWS], state)

    def _packed_prompt_forward(self, group: list, state: DecodeState | None) -> None:
        """Head slots of (chunk, features [T,nC]) pairs in one forward, each slot paired with the
        prompt token after it (from `state.tokens`; zeros without a state: warm-up)."""
        m, kv, packing = self.model, self.cache.kv, self._packing()
        p = pack(kv, packing, [c for c, _ in group], self.settings.prefill_bucket)
        S = p.tokens.shape[1]
        nxt = state.tokens[p.rows, p.row_slots + 1] if state is not None else p.tokens[0, : p.n]  # [n]
        tokens = torch.cat([nxt, nxt.new_zeros(S - p.n)])[None]  # [1,S]
        feats = torch.cat([f for _, f in group])
        feats = torch.cat([feats, feats.new_zeros(S - p.n, feats.shape[1])])[None].to(m.dtype)  # [1,S,nC]
        out = m.forward_cached(self.embed(tokens), m.fuse(feats), p.positions, packing.cache, p.slots, p.mask)
        p.write_back(kv, packing)
        for o, (c, f) in zip(p.offsets, group):
            self.cache.root_hidden[c.row] = out[0, o + f.shape[0] - 1]

    def _packing(self) -> PackingCache:
        return PackingCache.of(self.packings, self.cache.kv, self.settings.prefill_bucket)

    def warm_rows(self, limit: int) -> None:
        """Every packed length up to `limit` once (row 0, free before admission), as the target's."""
        width = len(self.feature_layers) * self.target.config.hidden_size
        for S in padded_lengths(self.settings.prefill_bucket, limit, self.cache.kv.capacity):
            f = torch.zeros(S, width, device=self.target.device, dtype=self.target.dtype)
            self._packed_prompt_forward([(Chunk(0, (0,) * S, 0), f)], None)

    def _prompt_forward(self, row: KVCache, features: torch.Tensor, nxt: torch.Tensor, start: int) -> torch.Tensor:
        """Slots start..start+T-1 of a one-row head cache from features [T,nC] and next tokens [T],
        padded to the bucket; the output [C] at the last real slot."""
        m, T = self.model, features.shape[0]
        Tp = padded_length(T, start, row.capacity, self.settings.prefill_bucket)
        if Tp > T:
            features = torch.cat([features, features.new_zeros(Tp - T, features.shape[1])])
            nxt = torch.cat([nxt, nxt.new_zeros(Tp - T)])
        pos = torch.arange(start, start + Tp, device=m.device)[None]  # [1,Tp]
        mask = (torch.arange(row.capacity, device=m.device)[None, None, :] <= pos[..., None])[:, None]
        out = self._forward(row, features[None].to(m.dtype), nxt[None], pos, mask)  # [1,Tp,C]
        return out[0, T - 1]

    def _forward(self, kv: KVCache, features, tokens, positions, mask) -> torch.Tensor:
        """Head outputs [B,T,C] of slots (features [B,T,n*C], next tokens [B,T]) at positions = slots."""
        return self.model.forward_cached(self.embed(tokens), self.model.fuse(features), positions, kv, positions, mask)

    def observe(self, acc: Acceptance, prefix: torch.Tensor) -> None:
        """Catch up on the round whose root sat at slot `prefix [B]` (see the module docstring)."""
        K1 = acc.features.shape[1]
        kv = self.cache.kv
        pos = (prefix[:, None] + torch.arange(K1, device=prefix.device)[None]).clamp(max=kv.capacity - 1)  # [B,K+1]
        mask = (torch.arange(kv.capacity, device=pos.device)[None, None, :] <= pos[..., None])[:, None]
        out = self._forward(kv, acc.features.to(self.model.dtype), acc.new_tokens, pos, mask)  # [B,K+1,C]
        at = acc.accept_len[:, None, None].expand(-1, 1, out.shape[-1])
        self.cache.root_hidden.copy_(out.gather(1, at)[:, 0])

    def propose(self, state: DecodeState, host_tokens=None) -> DraftTree:
        return self._propose(state)

    def _proposal(self, state: DecodeState) -> DraftTree:
        B, k = state.batch, self.topk
        root = self.cache.root_hidden  # [B,C]
        root_logits = self.model.logits(root)  # [B,Vd]
        caps = row_caps(state, self.depth, self.row_depth_margin) if self.row_depth_margin else None
        # the root's own slot (L - 1) is filled by the next catch-up: the tree region starts there
        return best_first.expand(state.roots(), root_logits, self._step, self.depth, k, self.budget,
                                 base=state.cache_prefix(), capacity=self.cache.kv.capacity,
                                 carry=root[:, None].expand(B, k, -1), token_ids=self.token_ids,
                                 depth_cap=caps, shared=self.shared,
                                 rows=share_rows(state, self.settings.segment_tokens) if self.shared else None)

    def _step(self, tokens, carry, positions, slots, mask):
        """One frontier level: (logits [B,k,Vd], the nodes' output hidden states [B,k,C])."""
        hidden = self.model.forward_cached(self.embed(tokens), carry, positions, self.cache.kv, slots, mask)
        return self.model.logits(hidden), hidden
