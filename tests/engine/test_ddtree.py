"""The static-shape DDTree beam equals the heap of `liranringel/ddtree` (re-derived here), the
chain / spine-first constructions keep their guarantees, and the batch mechanisms on block trees:
per-row depth caps (-inf log-probs) stop every construction at the cap, and a shared budget
splits the batch's nodes by score into prefix-closed sets."""

import heapq
import random

import pytest
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


def capped(lp: torch.Tensor, caps: list[int]) -> torch.Tensor:
    """lp [B,K,V] with the depths beyond each row's cap at -inf (what DFlash's per-request depth does)."""
    beyond = torch.arange(1, lp.shape[1] + 1)[None] > torch.tensor(caps)[:, None]
    return lp.masked_fill(beyond[..., None], float("-inf"))


def valid_depths(tree) -> list[int]:
    """Per row, the deepest node that can be accepted."""
    valid = tree.valid if tree.valid is not None else torch.ones_like(tree.tokens, dtype=torch.bool)
    return torch.where(valid, tree.depths(), torch.zeros_like(tree.depths())).max(1).values.tolist()


def test_depth_caps_stop_every_construction_at_the_cap():
    lp = torch.log_softmax(torch.randn(3, 9, 40, generator=torch.Generator().manual_seed(5)) * 3, -1)
    roots, caps = torch.tensor([1, 2, 3]), [2, 9, 5]
    for c in TreeConstruction:
        tree = build_tree(c, capped(lp, caps), roots, 12, capped=True)
        assert prefix_closed(tree)
        assert all(d <= cap for d, cap in zip(valid_depths(tree), caps)), c
        free = build_tree(c, lp, roots, 12)
        assert valid_depths(free)[0] > 2, c  # without the cap row 0 drafts deeper: the cap is what stops it
    chain = build_tree(TreeConstruction.CHAIN, capped(lp, caps), roots, 12, capped=True)
    assert valid_depths(chain) == caps  # the chain stops at the cap; its nodes below are padding
    assert torch.equal(chain.tokens[:, :3], build_tree(TreeConstruction.CHAIN, lp, roots, 12).tokens[:, :3])
    # best-first below the cap is the tree of the truncated block (enough prefixes above the cap)
    best = block_tree(capped(lp, caps), roots, 12, capped=True)
    assert best.valid.all()
    alone = block_tree(lp[:1, :2], roots[:1], 12)
    assert tree_prefixes(best.tokens[0].tolist(), best.parents[0].tolist()) == \
        tree_prefixes(alone.tokens[0].tolist(), alone.parents[0].tolist())


def test_too_few_prefixes_above_the_cap_leave_invalid_padding():
    lp = torch.log_softmax(torch.randn(1, 6, 3, generator=torch.Generator().manual_seed(2)), -1)  # V = 3
    tree = block_tree(capped(lp, [1]), torch.tensor([0]), 8, capped=True)  # 3 prefixes above the cap, 8 nodes
    assert tree.valid.sum() == 1 + 3 and valid_depths(tree) == [1] and tree.num_valid == 0
    spine = build_tree(TreeConstruction.SPINE_FIRST, capped(lp, [2]), torch.tensor([0]), 8, capped=True)
    assert valid_depths(spine) == [2]  # the spine (+inf) ends at the cap


def test_shared_budget_splits_block_trees_by_score():
    g = torch.Generator().manual_seed(9)
    lp = torch.log_softmax(torch.randn(4, 7, 30, generator=g) * torch.tensor([6.0, 1, 3, 0.5])[:, None, None], -1)
    roots = torch.tensor([4, 5, 6, 7])
    for c in (TreeConstruction.BEST_FIRST, TreeConstruction.CHAIN):
        alone = build_tree(c, lp, roots, 7)
        tree = build_tree(c, lp, roots, 7, shared=3, rows=torch.tensor([0, 0, -1, 0]))
        assert torch.equal(tree.tokens, alone.tokens) and torch.equal(tree.parents, alone.parents)
        assert tree.num_valid == 4 * (1 + 3) and int(tree.valid.sum()) == 4 * (1 + 3)
        assert int(tree.valid[2, 1:].sum()) == 0  # a done row gives its share away
        parents_valid = tree.valid.gather(1, tree.parents[:, 1:].clamp(min=0))
        assert (parents_valid | ~tree.valid[:, 1:]).all()  # prefix-closed
        assert len(set(tree.valid.sum(1).tolist())) > 1  # confident rows get more nodes
    with pytest.raises(ValueError, match="spine"):  # spine-first ranks by spine, not by score
        build_tree(TreeConstruction.SPINE_FIRST, lp, roots, 7, shared=3)
