"""Draft trees from per-position distributions (a block drafter's output), built on the device.

A block drafter (DFlash) gives, for depths 1..K, a distribution over the token at that depth that
does not depend on the tokens chosen before it. The score of a prefix is the sum of its tokens'
log-probs, so the best prefixes can be found exactly without a heap:

- `chain`: the argmax at each depth.
- `best_first` (DDTree, `liranringel/ddtree`): the `budget` most probable prefixes. A depth-d
  prefix among the top `budget` of its depth has its parent among the top `budget` of depth d-1
  and its token among the top `budget` of depth d (otherwise `budget` better ones exist), so a
  static beam of width `budget` per depth, then one stable sort over all depths, gives exactly the
  heap's node set (tested against a heap in tests/engine/test_ddtree.py).
- `spine_first` (SGLang's depth-first / JetSpec): the argmax chain first (up to `budget` nodes),
  then the most probable remaining prefixes; the tree contains the chain, so it accepts at least
  as much as the chain.

The candidates of every construction (the chain's K, the beams' nodes) are laid out depth by
depth with their scores and go through `selection.select`, which also does the batch mechanisms:
- a *shared budget* (`shared` = s > 0, best-first and chain): the batch's rows split B x s draft
  nodes by path score (a chain then stops where its row's share ends);
- *per-row depth caps* (`capped`): the drafter sets log-probs of depths beyond a row's cap to
  -inf. Best-first beams then score those prefixes -inf and select them only when a row has fewer
  finite prefixes than its budget; the chain's argmax there is an arbitrary token; a spine stops
  at the cap. Either way such nodes are marked invalid, never accepted, so the chain just stops
  earlier and the trees stay prefix-closed.

Every shape is fixed by (B, K, V, budget) and nothing syncs with the host, so a round that builds
its tree here stays one CUDA graph. Does not own drafting the distributions or verifying the tree.
"""

from __future__ import annotations

import torch

from specpilot.config import TreeConstruction
from specpilot.engine.selection import select
from specpilot.engine.tree import DraftTree


def beam_sizes(K: int, V: int, budget: int) -> list[int]:
    """Candidates kept at each depth 1..K: min(budget, all prefixes of that depth)."""
    sizes, width = [], 1
    for _ in range(K):
        width = min(budget, width * min(budget, V))
        sizes.append(width)
    return sizes


def num_draft_nodes(construction: TreeConstruction, K: int, V: int, budget: int) -> int:
    """Draft nodes (root excluded) of every tree this construction builds."""
    if construction is TreeConstruction.CHAIN:
        return min(budget, K)
    return min(budget, sum(beam_sizes(K, V, budget)))


def chain_tree(logprobs: torch.Tensor, roots: torch.Tensor, budget: int, shared: int = 0,
               rows: torch.Tensor | None = None, capped: bool = False) -> DraftTree:
    """logprobs [B,K,V]; the argmax chain of min(budget, K) drafts under roots [B]."""
    n = min(budget, logprobs.shape[1])
    tokens = logprobs[:, :n].argmax(-1)  # [B,n]
    if not (shared or capped):
        return DraftTree.chain(torch.cat([roots[:, None], tokens], 1))
    scores = logprobs[:, :n].gather(2, tokens[..., None])[..., 0].cumsum(1)  # [B,n] path scores
    parents = (torch.arange(n, device=tokens.device) - 1).expand_as(tokens)  # -1: the root
    return select(roots, tokens, scores, parents, n, n, shared, rows, capped)


def block_tree(logprobs: torch.Tensor, roots: torch.Tensor, budget: int, spine_first: bool = False,
               shared: int = 0, rows: torch.Tensor | None = None, capped: bool = False) -> DraftTree:
    """logprobs [B,K,V] -> the best-first (or spine-first) tree of `num_draft_nodes` drafts."""
    B, K, V = logprobs.shape
    dev = logprobs.device
    k = min(budget, V)
    val, idx = logprobs.topk(k, dim=-1)  # [B,K,k]
    prev = torch.zeros(B, 1, dtype=val.dtype, device=dev)  # scores of the previous level's beam
    prev_spine = torch.ones(B, 1, dtype=torch.bool, device=dev)
    scores, tokens, parents, spine = [], [], [], []
    offset = -1  # global candidate index of the previous level's first entry (-1: the root)
    for d in range(K):
        cand = (prev[:, :, None] + val[:, d, None, :]).flatten(1)  # [B,W*k]
        width = min(budget, cand.shape[1])
        s, j = cand.topk(width, dim=1)  # [B,width]
        parent_local, rank = j // k, j % k
        scores.append(s)
        tokens.append(idx[:, d].gather(1, rank))
        parents.append(torch.full_like(j, -1) if d == 0 else offset + parent_local)
        is_spine = (rank == 0) & prev_spine.gather(1, parent_local) & (s > float("-inf"))  # ends at a cap
        spine.append(is_spine)
        offset = 0 if d == 0 else offset + prev.shape[1]
        prev, prev_spine = s, is_spine
    scores, tokens = torch.cat(scores, 1), torch.cat(tokens, 1)  # [B,M]
    parents, spine = torch.cat(parents, 1), torch.cat(spine, 1)
    n = min(budget, scores.shape[1])
    # Candidates are laid out depth by depth: `select`'s stable sort puts a parent before an
    # equal-score child; the spine (+inf) ranks first.
    key = torch.where(spine, torch.full_like(scores, float("inf")), scores) if spine_first else scores
    return select(roots, tokens, key, parents, n, K, shared, rows, capped)


def build_tree(construction: TreeConstruction, logprobs: torch.Tensor, roots: torch.Tensor, budget: int,
               shared: int = 0, rows: torch.Tensor | None = None, capped: bool = False) -> DraftTree:
    """The draft tree of `construction` over logprobs [B,K,V] (float32 log-softmax) under roots [B];
    `shared`, `rows` and `capped` as in the module docstring (no shared budget for spine-first)."""
    if construction is TreeConstruction.CHAIN:
        return chain_tree(logprobs, roots, budget, shared, rows, capped)
    if shared and construction is TreeConstruction.SPINE_FIRST:
        raise ValueError("a shared budget splits nodes by path score: spine-first trees rank by spine")
    return block_tree(logprobs, roots, budget, construction is TreeConstruction.SPINE_FIRST, shared, rows, capped)
