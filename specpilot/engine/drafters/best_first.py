"""The best-first draft tree of a fixed envelope (EAGLE-2's tree), shared by the drafters that
expand it one level per forward: the draft model (`draft_model.py`) and the EAGLE-3 head
(`eagle3.py`).

Given the logits of depth-1 tokens after each row's root:
1. *Expansion*, `depth` levels: the frontier (the `topk` best nodes of the previous level by path
   score, the sum of draft log-probs) goes through one draft forward (`step`) with a tree mask;
   each frontier node contributes its `topk` most likely children as candidates. A drafter may
   carry a per-node state along the frontier (EAGLE-3: the head's own hidden state), which
   follows each selected node from the forward that produced it.
2. *Selection*: the `budget` candidates with the highest path score form the tree. A child's score
   never exceeds its parent's, and a stable sort puts a parent before an equal-score child, so the
   selected set is prefix-closed.
With topk = 1 this is a greedy chain of `depth` tokens. Every shape is fixed by
(batch, depth, topk, budget), so a round can be captured in a CUDA graph.

Selection and the batch mechanisms on it (a shared node budget, per-row depth caps: `depth_cap`,
`shared`, `rows`) are `engine/selection.py`'s.

Where the frontier lives in the draft cache: the depth-d frontier is written at slots
`base + (d-1)*topk + [0, topk)` (the *tree region*) at RoPE position `base - 1 + d`; it sees the
committed draft slots `< base` and the region slots of its own ancestors and itself. Region slots
are past what the drafter has committed, so later writes overwrite them (the stale-slot rule).

Owns: expansion. Does not own selection (`engine/selection.py`), the forward of a level (`step`)
or the caches.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Callable

import torch

from specpilot.engine.selection import select
from specpilot.engine.tree import DraftTree
from specpilot.kernels.topk import top_log_probs

# step(tokens [B,k], carry [B,k,...] | None, positions [B,k], slots [B,k], mask [B,1,k,S])
#   -> (logits [B,k,V'], carry of these nodes [B,k,...] | None); a node's children are the top k
#   of its log-softmax (`kernels.topk`: one fused kernel on CUDA)
Step = Callable[..., tuple[torch.Tensor, torch.Tensor | None]]


def num_candidates(depth: int, topk: int) -> int:
    """M: candidates an expansion produces (topk at depth 1, topk^2 per deeper level)."""
    return topk + (depth - 1) * topk * topk


@dataclass(frozen=True)
class _Constants:
    """Index tensors an expansion of (topk, depth, capacity) uses every round: made once per device
    (the first, eager call) instead of by kernels inside each captured round."""

    no_parent: torch.Tensor  # [k] -1
    first_ids: torch.Tensor  # [k] candidate ids of the depth-1 frontier
    own: torch.Tensor  # [1,K-1,k] tree-region slot of frontier node j of depth d (at [0, d-1, j])
    level_depth: torch.Tensor  # [1,K-1] d at [0, d-1] (the depth-d frontier sits at RoPE position base - 1 + d)
    child_of: torch.Tensor  # [k*k] frontier index of each candidate of a level
    cand_depth: torch.Tensor  # [M] depth of each candidate, in candidate order
    slots: torch.Tensor  # [S] 0..capacity-1


@functools.lru_cache(maxsize=64)
def _constants(k: int, K: int, capacity: int, device: torch.device) -> _Constants:
    ids = torch.arange(k, device=device)
    own = torch.arange(max(K - 1, 1) * k, device=device).view(1, -1, k)
    levels = [torch.full((k if d == 1 else k * k,), d, device=device) for d in range(1, K + 1)]
    return _Constants(torch.full((k,), -1, dtype=torch.int64, device=device), ids, own,
                      torch.arange(1, max(K, 2), device=device)[None], ids.repeat_interleave(k), torch.cat(levels),
                      torch.arange(capacity, device=device))


def expand(
    roots: torch.Tensor,  # [B] each row's root token
    root_logits: torch.Tensor,  # [B,V'] logits of depth-1 tokens
    step: Step,
    depth: int,
    topk: int,
    budget: int,
    base: torch.Tensor,  # [B] first slot of the tree region; committed draft slots are < base
    capacity: int,  # S: slots of the draft cache
    carry: torch.Tensor | None = None,  # [B,k,...] the depth-1 frontier's carried state
    token_ids: torch.Tensor | None = None,  # [V'] target token of each draft-vocabulary index (None: same)
    depth_cap: torch.Tensor | None = None,  # [B] deepest candidate depth per row (None: depth)
    shared: int = 0,  # > 0: the batch's rows split B x shared draft nodes (see `select`)
    rows: torch.Tensor | None = None,  # [B] each row's part in a shared budget (`selection.share_rows`)
) -> DraftTree:
    """The best-first tree of `budget` draft nodes (+ the root) described in the module docstring."""
    B, k, K = roots.shape[0], topk, depth
    dev = roots.device
    to_target = (lambda i: i) if token_ids is None else (lambda i: token_ids[i])  # noqa: E731
    score, idx = top_log_probs(root_logits, k)  # [B,k] depth-1 candidates and their log-probs
    tok = to_target(idx)
    cand_tokens, cand_scores = [tok], [score]
    # traced into the graph under torch.compile (`draft_compile`), where the cache would be ignored
    c = (_constants.__wrapped__ if torch.compiler.is_compiling() else _constants)(k, K, capacity, dev)
    cand_parent = [c.no_parent.expand(B, k)]
    frontier = c.first_ids.expand(B, k)  # candidate ids of the frontier
    f_tok, f_score = tok, score
    # every level's slots and positions at once; per level only its mask is built (two kernels)
    all_slots = (base[:, None, None] + c.own).clamp(max=capacity - 1)  # [B,K-1,k]
    all_pos = base[:, None] - 1 + c.level_depth  # [B,K-1]
    rel = c.slots[None, :] - base[:, None]  # [B,S] tree-region slot index (< 0: committed)
    mask = rel[:, None, :] < 0  # [B,1,S] the committed slots; each level adds its frontier's own slot
    first = k
    for d in range(1, K):  # process the depth-d frontier, creating depth d+1 candidates
        # the frontier node j sees what its parent saw and its own region slot (a parent's mask
        # already holds the parent's ancestors)
        mask = mask | (rel[:, None, :] == c.own[0, d - 1][None, :, None])  # [B,k,S]
        slots = all_slots[:, d - 1]  # [B,k]
        pos = all_pos[:, d - 1, None].expand(B, k)
        logits, out = step(f_tok, carry, pos, slots, mask[:, None])  # [B,k,V'], [B,k,...]
        c_lp, c_idx = top_log_probs(logits, k)  # [B,k,k]
        c_score = (f_score[..., None] + c_lp).reshape(B, k * k)
        c_tok = to_target(c_idx).reshape(B, k * k)
        c_from = c.child_of.expand(B, k * k)  # frontier index of each candidate
        cand_tokens.append(c_tok)
        cand_scores.append(c_score)
        cand_parent.append(frontier.gather(1, c_from))
        # next frontier: the k best children (stable: earlier candidates win ties)
        order = torch.sort(c_score, dim=1, descending=True, stable=True).indices[:, :k]
        parent = c_from.gather(1, order)  # [B,k] the frontier node each new frontier node came from
        if d + 1 < K:
            mask = mask.gather(1, parent[..., None].expand(B, k, mask.shape[-1]))
        if out is not None:
            carry = out.gather(1, parent.view(B, k, *([1] * (out.dim() - 2))).expand_as(out))
        frontier = first + order
        f_tok, f_score = c_tok.gather(1, order), c_score.gather(1, order)
        first += k * k
    tokens = torch.cat(cand_tokens, 1)  # [B,M]
    scores = torch.cat(cand_scores, 1)
    parents = torch.cat(cand_parent, 1)
    if depth_cap is not None:
        scores = torch.where(c.cand_depth[None, :] > depth_cap[:, None], float("-inf"), scores)
    return select(roots, tokens, scores, parents, budget, depth, shared, rows, capped=depth_cap is not None)

