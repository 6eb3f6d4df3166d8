"""The static-shape DDTree beam equals the heap of `liranringel/ddtree` (re-derived here), and the
chain / spine-first constructions keep their guarantees."""

import heapq
import random

import torch

from specpilot.config import TreeConstruction
from specpilot.engine.ddtree import block_tree, build_tree, num_draft_nodes
from specpilot.engine.tree import prefix_closed


def heap_prefixes(lp: torch.Tensor, budget: int) -> set[tuple[int, ...]]:
    """The `budget` most probable prefixes by a max-heap over per-depth rank tuples."""
    K, V = lp.shape
    k = min(budget, V)
    val, idx = lp.topk(k, dim=-1)
    val, idx = val.tolist(), idx.tolist()
    heap = [(-val[0][0], (0,))]
    out = set()
    while heap and len(out) < budget:
        neg, ranks = heapq.heappop(heap)
        out.add(tuple(idx[d][r] for d, r in enumerate(ranks)))
        d = len(ranks) - 1
        if ranks[-1] + 1 < k:  # next sibling: same parent, next rank at this depth
            heapq.heappush(heap, (neg + val[d][ranks[-1]] - val[d][ranks[-1] + 1], ranks[:-1] + (ranks[-1] + 1,)))
        if d + 1 < K:  # first child
            heapq.heappush(heap, (neg - val[d + 1][0], ranks + (0,)))
    return out


def tree_prefixes(tokens: list[int], parents: list[int]) -> set[tuple[int, ...]]:
    paths = {0: ()}
    for j in range(1, len(tokens)):
        paths[j] = paths[parents[j]] + (tokens[j],)
    return {paths[j] for j in range(1, len(tokens))}


def test_beam_matches_heap_on_random_cases():
    rnd = random.Random(0)
    for case in range(300):
        K, V, budget = rnd.randint(1, 15), rnd.randint(2, 50), rnd.randint(1, 63)
        lp = torch.log_softmax(torch.randn(2, K, V, generator=torch.Generator().manual_seed(case)) * 3, -1)
        tree = block_tree(lp, torch.tensor([7, 9]), budget)
        assert prefix_closed(tree)
        assert tree.num_nodes == 1 + num_draft_nodes(TreeConstruction.BEST_FIRST, K, V, budget)
        for b in range(2):
            got = tree_prefixes(tree.tokens[b].tolist(), tree.parents[b].tolist())
            assert got == heap_prefixes(lp[b], budget), (case, K, V, budget)


def test_spine_first_contains_the_chain_and_chain_is_argmax():
    rnd = random.Random(1)
    for case in range(100):
        K, V, budget = rnd.randint(1, 15), rnd.randint(2, 50), rnd.randint(1, 63)
        lp = torch.log_softmax(torch.randn(1, K, V, generator=torch.Generator().manual_seed(case)) * 3, -1)
        roots = torch.tensor([3])
        chain = build_tree(TreeConstruction.CHAIN, lp, roots, budget)
        spine = build_tree(TreeConstruction.SPINE_FIRST, lp, roots, budget)
        assert prefix_closed(spine)
        assert spine.num_nodes == 1 + num_draft_nodes(TreeConstruction.SPINE_FIRST, K, V, budget)
        argmax = tuple(lp[0].argmax(-1).tolist())
        assert chain.tokens[0, 1:].tolist() == list(argmax[: min(budget, K)])
        got = tree_prefixes(spine.tokens[0].tolist(), spine.parents[0].tolist())
        assert all(argmax[:d] in got for d in range(1, min(budget, K) + 1))
        # the rest are the most probable non-spine prefixes
        best = heap_prefixes(lp[0], budget)
        assert len(got) == len(best)
