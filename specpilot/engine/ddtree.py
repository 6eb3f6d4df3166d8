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

Every shape is fixed by (B, K, V, budget) and nothing syncs with the host, so a round that builds
its tree here stays one CUDA graph. Does not own drafting the distributions or verifying the tree.
"""

from __future__ import annotations

import torch

from specpilot.config import TreeConstruction
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


def chain_tree(logprobs: torch.Tensor, roots: torch.Tensor, budget: int) -> DraftTree:
    """logprobs [B,K,V]; the argmax chain of min(budget, K) drafts under roots [B]."""
    n = min(budget, logprobs.shape[1])
    return DraftTree.chain(torch.cat([roots[:, None], logprobs[:, :n].argmax(-1)], 1))


def block_tree(logprobs: torch.Tensor, roots: torch.Tensor, budget: int, spine_first: bool = False) -> DraftTree:
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
        is_spine = (rank == 0) & prev_spine.gather(1, parent_local)
        spine.append(is_spine)
        offset = 0 if d == 0 else offset + prev.shape[1]
        prev, prev_spine = s, is_spine
    scores, tokens = torch.cat(scores, 1), torch.cat(tokens, 1)  # [B,M]
    parents, spine = torch.cat(parents, 1), torch.cat(spine, 1)
    M = scores.shape[1]
    n = min(budget, M)
    # Stable sort over candidates laid out depth by depth: a parent precedes an equal-score child.
    key = torch.where(spine, torch.full_like(scores, float("inf")), scores) if spine_first else scores
    chosen = torch.sort(key, dim=1, descending=True, stable=True).indices[:, :n]
    chosen = chosen.sort(dim=1).values  # depth order = topological order
    inv = torch.full((B, M), -1, dtype=torch.int64, device=dev)
    inv.scatter_(1, chosen, torch.arange(1, n + 1, device=dev).expand(B, n))
    p = parents.gather(1, chosen)
    node_parent = torch.where(p < 0, torch.zeros_like(p), inv.gather(1, p.clamp(min=0)))
    tree_tokens = torch.cat([roots[:, None], tokens.gather(1, chosen)], 1)
    tree_parents = torch.cat([torch.full((B, 1), -1, dtype=torch.int64, device=dev), node_parent], 1)
    return DraftTree(tree_tokens, tree_parents, max_depth=K)


def build_tree(construction: TreeConstruction, logprobs: torch.Tensor, roots: torch.Tensor, budget: int) -> DraftTree:
    """The draft tree of `construction` over logprobs [B,K,V] (float32 log-softmax) under roots [B]."""
    if construction is TreeConstruction.CHAIN:
        return chain_tree(logprobs, roots, budget)
    return block_tree(logprobs, roots, budget, spine_first=construction is TreeConstruction.SPINE_FIRST)
