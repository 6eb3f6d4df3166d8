"""A separate draft model (same tokenizer) drafting a chain or a best-first tree.

Each round:
1. *Catch-up*: the draft model re-reads the last W committed tokens (W = depth + 1 by default) into
   its own cache. That covers every token committed since its last round (at most depth accepted
   + 1 bonus), so its cache stays in step with the target's without tracking tree slots.
2. *Expansion*, `depth` levels: the frontier (the `topk` best nodes of the previous level by path
   score, the sum of draft log-probs) is run through the draft model in one forward with a tree
   mask; each frontier node contributes its `topk` most likely children as candidates.
3. *Selection*: the `tree_budget` candidates with the highest path score form the tree. A
   child's score never exceeds its parent's, and a stable sort puts a parent before an equal-score
   child, so the selected set is prefix-closed.
With topk = 1 this is a greedy chain of `depth` tokens. Every shape is fixed by
(batch, depth, topk, tree_budget), so a round can be captured in a CUDA graph.

*Shared budget* (`shared_budget` = s > 0): the batch's rows split B x s draft nodes by path score
instead of taking `tree_budget` each. Each row ranks its best `tree_budget` candidates as above
(a prefix-closed ranking: parents first); all B x tree_budget ranked scores are sorted together
(stable, so within a row a parent stays before an equal-score child) and the best B x s are kept.
A row's kept nodes are then a prefix of its ranking, hence prefix-closed; the rest are padding
(`DraftTree.valid`), never accepted and left out of the verify forward's projections. Rows not
decoding (`state.done`) rank last, so their share goes to the rows that decode.

*Per-request depth* (`row_depth_margin` = m > 0): a row whose last ROW_DEPTH_WINDOW rounds accepted
a drafts on average gets candidates only down to depth ceil(a) + m (all depths before it has a
round): deeper candidates score -inf before selection, which keeps every set prefix-closed (a
child never outscores its parent) and, with a shared budget, hands their nodes to other rows.
It reads the acceptance log in the decoding state, so it needs no state of its own.
"""

from __future__ import annotations

import torch

from specpilot.engine.drafters.base import Drafter, register
from specpilot.engine.kv_cache import KVCache
from specpilot.engine.state import DecodeState
from specpilot.engine.steps import prefill, prefill_chunk
from specpilot.engine.tree import DraftTree
from specpilot.models.transformer import Transformer

ROW_DEPTH_WINDOW = 4  # recent rounds whose mean acceptance sets a row's depth cap


@register("model")
class DraftModelDrafter(Drafter):
    def __init__(self, model: Transformer, depth: int, topk: int, tree_budget: int, window: int = 0,
                 shared_budget: int = 0, row_depth_margin: int = 0):
        self.model = model
        self.depth, self.topk = depth, topk
        self.num_candidates = topk + (depth - 1) * topk * topk  # M
        self.budget = min(tree_budget, self.num_candidates)
        self.shared = min(shared_budget, self.budget)  # mean draft nodes per row; 0 = no sharing
        self.row_depth_margin = row_depth_margin  # 0 = every row drafts to `depth`
        self.window = window or depth + 1
        if self.window < depth + 1:
            raise ValueError("window must cover depth + 1 tokens")
        # one draft cache per (batch, capacity) workspace of the generator: a captured graph keeps
        # pointing at the cache it was captured with, so caches are never reallocated in place
        self.caches: dict[tuple[int, int], KVCache] = {}
        self.cache: KVCache | None = None
        self.prefill_bucket = 0  # set by the generator (see `steps.prefill`)

    @property
    def num_nodes(self) -> int:
        return self.budget + 1

    def start(self, prompts: list[list[int]], state: DecodeState) -> None:
        key = (state.batch, state.capacity)
        if key not in self.caches:
            self.caches[key] = KVCache.allocate(self.model.config, *key, self.model.device, self.model.dtype)
        self.cache = self.caches[key]
        prefill(self.model, self.cache, prompts, bucket=self.prefill_bucket)

    def prefill_row(self, row: int, tokens: list[int], start: int, state: DecodeState, features=None) -> None:
        """One prompt chunk of the request entering `row` into the draft cache (as `start` does for
        a whole batch; the first round's catch-up covers the root and what follows)."""
        if tokens:
            prefill_chunk(self.model, self.cache.row(row), tokens, start, self.prefill_bucket)

    def release(self, key: tuple[int, int]) -> None:
        """Forget the cache of a workspace the generator dropped."""
        self.caches.pop(key, None)

    def _catch_up(self, state: DecodeState) -> torch.Tensor:
        """Re-read the last W committed tokens; log-probs at the root [B,V] (float32)."""
        W = self.window
        L = state.seq_lens
        start = (L - W).clamp(min=0)  # [B]
        idx = start[:, None] + torch.arange(W, device=L.device)[None, :]  # [B,W]
        tokens = state.tokens.gather(1, idx.clamp(max=state.capacity - 1))
        s = torch.arange(self.cache.capacity, device=L.device)
        mask = (s[None, None, :] <= idx[..., None])[:, None]  # [B,1,W,S]
        root_at = (L - 1 - start)[:, None]  # [B,1] index of the root inside the window
        logits = self.model(tokens, idx, self.cache, idx, mask, logits_for=root_at)  # [B,1,V]
        return torch.log_softmax(logits[:, 0].float(), dim=-1)

    def propose(self, state: DecodeState, host_tokens=None) -> DraftTree:
        B, k, K = state.batch, self.topk, self.depth
        dev = state.tokens.device
        L = state.seq_lens  # [B]
        root_lp = self._catch_up(state)
        score, tok = root_lp.topk(k, dim=-1)  # [B,k] depth-1 candidates
        cand_tokens, cand_scores = [tok], [score]
        cand_parent = [torch.full((B, k), -1, dtype=torch.int64, device=dev)]
        frontier = torch.arange(k, device=dev).expand(B, k)  # candidate ids of the frontier
        f_tok, f_score = tok, score
        tree_slots = max(K - 1, 1) * k
        anc = torch.zeros(B, k, tree_slots, dtype=torch.bool, device=dev)  # frontier ancestors (tree region)
        s = torch.arange(self.cache.capacity, device=dev)
        rel = s[None, :] - L[:, None]  # [B,S] tree-region slot index
        in_region = (rel >= 0) & (rel < tree_slots)
        base = k
        for d in range(1, K):  # process the depth-d frontier, creating depth d+1 candidates
            own = (d - 1) * k + torch.arange(k, device=dev)  # region slots of this frontier
            # mark each frontier node's own slot (pure device ops: graph-capturable)
            anc = anc | (torch.arange(tree_slots, device=dev)[None, None, :] == own[None, :, None])
            slots = L[:, None] + own[None, :]  # [B,k]
            pos = (L - 1 + d)[:, None].expand(B, k)
            vis = anc.gather(2, rel.clamp(0, tree_slots - 1)[:, None, :].expand(B, k, s.numel()))
            mask = ((s[None, None, :] < L[:, None, None]) | (in_region[:, None, :] & vis))[:, None]
            logits = self.model(f_tok, pos, self.cache, slots, mask)  # [B,k,V]
            lp = torch.log_softmax(logits.float(), dim=-1)
            c_lp, c_tok = lp.topk(k, dim=-1)  # [B,k,k]
            c_score = (f_score[..., None] + c_lp).reshape(B, k * k)
            c_tok = c_tok.reshape(B, k * k)
            c_from = torch.arange(k, device=dev).repeat_interleave(k).expand(B, k * k)  # frontier index
            cand_tokens.append(c_tok)
            cand_scores.append(c_score)
            cand_parent.append(frontier.gather(1, c_from))
            # next frontier: the k best children (stable: earlier candidates win ties)
            order = torch.sort(c_score, dim=1, descending=True, stable=True).indices[:, :k]
            anc = anc.gather(1, c_from.gather(1, order)[..., None].expand(B, k, tree_slots))
            frontier = base + order
            f_tok, f_score = c_tok.gather(1, order), c_score.gather(1, order)
            base += k * k
        tokens = torch.cat(cand_tokens, 1)  # [B,M]
        scores = torch.cat(cand_scores, 1)
        parents = torch.cat(cand_parent, 1)
        return self._select(state, tokens, scores, parents)

    def _select(self, state, tokens, scores, parents) -> DraftTree:
        B, M = tokens.shape
        n = self.budget
        dev = tokens.device
        if self.row_depth_margin:
            k = self.topk
            levels = [torch.full((k if d == 1 else k * k,), d, device=dev) for d in range(1, self.depth + 1)]
            depth = torch.cat(levels)  # [M] each candidate's depth, in candidate order
            scores = torch.where(depth[None, :] > self.row_caps(state)[:, None], float("-inf"), scores)
        ranked = torch.sort(scores, dim=1, descending=True, stable=True).indices[:, :n]  # [B,n] best first
        chosen, rank = ranked.sort(dim=1)  # topological order (parents have smaller ids)
        valid = None
        if self.shared:
            kept = self._shared(state, scores.gather(1, ranked))  # [B,n] by rank
            valid = torch.cat([torch.ones(B, 1, dtype=torch.bool, device=dev), kept.gather(1, rank)], 1)
        inv = torch.full((B, M), -1, dtype=torch.int64, device=dev)
        inv.scatter_(1, chosen, torch.arange(1, n + 1, device=dev).expand(B, n))
        p = parents.gather(1, chosen)
        node_parent = torch.where(p < 0, torch.zeros_like(p), inv.gather(1, p.clamp(min=0)))
        tree_tokens = torch.cat([state.roots()[:, None], tokens.gather(1, chosen)], 1)
        tree_parents = torch.cat([torch.full((B, 1), -1, dtype=torch.int64, device=dev), node_parent], 1)
        if valid is None:
            return DraftTree(tree_tokens, tree_parents, max_depth=self.depth)
        return DraftTree(tree_tokens, tree_parents, max_depth=self.depth, valid=valid,
                         num_valid=B * (1 + self.shared))

    def row_caps(self, state: DecodeState) -> torch.Tensor:
        """[B] deepest candidate depth per row: ceil(mean accepted drafts of its last rounds) + margin."""
        R = state.accept_log.shape[1]
        j = state.rounds[:, None] - 1 - torch.arange(ROW_DEPTH_WINDOW, device=state.rounds.device)[None]  # [B,W]
        seen = j >= 0
        drafts = state.accept_log.gather(1, j.clamp(0, R - 1)).long() - 1  # accepted drafts of those rounds
        n = seen.sum(1)
        mean = (drafts * seen).sum(1) / n.clamp(min=1)
        cap = (torch.ceil(mean).long() + self.row_depth_margin).clamp(1, self.depth)
        return torch.where(n > 0, cap, torch.full_like(cap, self.depth))

    def _shared(self, state: DecodeState, ranked: torch.Tensor) -> torch.Tensor:
        """[B,n] bool: which of each row's ranked candidates (scores [B,n], best first) are among
        the batch's best B x shared; rows not decoding rank last."""
        B, n = ranked.shape
        ranked = torch.where(state.done[:, None], torch.full_like(ranked, float("-inf")), ranked)
        best = torch.sort(ranked.reshape(-1), descending=True, stable=True).indices[: B * self.shared]
        return torch.zeros(B * n, dtype=torch.bool, device=ranked.device).index_fill_(0, best, True).view(B, n)
