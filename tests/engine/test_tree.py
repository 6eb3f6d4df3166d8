"""Pure tree functions: ancestors, depths, positions, slots, masks, root paths."""

import torch

from specpilot.engine import tree as T
from specpilot.engine.steps import causal_mask


def example_tree():
    #        0
    #      /   \
    #     1     2
    #    / \     \
    #   3   4     5
    #   |
    #   6
    parents = torch.tensor([[-1, 0, 0, 1, 1, 2, 3]])
    tokens = torch.tensor([[10, 11, 12, 13, 14, 15, 16]])
    return T.DraftTree(tokens, parents, max_depth=3)


def test_ancestors_and_depths():
    t = example_tree()
    anc = t.ancestors()[0].int()
    expected = torch.tensor([
        [1, 0, 0, 0, 0, 0, 0],
        [1, 1, 0, 0, 0, 0, 0],
        [1, 0, 1, 0, 0, 0, 0],
        [1, 1, 0, 1, 0, 0, 0],
        [1, 1, 0, 0, 1, 0, 0],
        [1, 0, 1, 0, 0, 1, 0],
        [1, 1, 0, 1, 0, 0, 1],
    ])
    assert torch.equal(anc, expected)
    assert t.depths()[0].tolist() == [0, 1, 1, 2, 2, 2, 3]


def test_positions_and_slots_follow_prefix():
    t = example_tree()
    prefix = torch.tensor([5])
    assert T.positions(t, prefix)[0].tolist() == [5, 6, 6, 7, 7, 7, 8]
    assert T.slots(t, prefix)[0].tolist() == [5, 6, 7, 8, 9, 10, 11]


def test_mask_sees_committed_prefix_and_ancestors_only():
    t = example_tree()
    prefix = torch.tensor([3])
    m = T.attention_mask(t, prefix, capacity=16)[0, 0]  # [N,S]
    assert m.shape == (7, 16)
    assert m[:, :3].all()  # committed cache entries are visible to every node
    assert not m[:, 10:].any()  # nothing past the tree window
    window = m[:, 3:10].int()
    assert torch.equal(window, t.ancestors()[0].int())


def test_chain_mask_equals_causal_mask():
    tokens = torch.arange(6)[None].repeat(2, 1)
    chain = T.DraftTree.chain(tokens)
    prefix = torch.tensor([0, 4])
    assert torch.equal(T.attention_mask(chain, prefix, 20), causal_mask(prefix, 6, 20))
    assert torch.equal(T.positions(chain, prefix), T.slots(chain, prefix))


def test_path_nodes_by_depth():
    t = example_tree()
    paths = T.path_nodes(t, torch.tensor([6]))
    assert paths[0].tolist() == [0, 1, 3, 6]
    paths = T.path_nodes(t, torch.tensor([5]))
    assert paths[0].tolist() == [0, 2, 5, -1]
    assert T.path_nodes(t, torch.tensor([0]))[0].tolist() == [0, -1, -1, -1]


def test_batched_trees_are_independent():
    a = example_tree()
    chain_parents = torch.tensor([[-1, 0, 1, 2, 3, 4, 5]])
    tokens = torch.cat([a.tokens, a.tokens])
    parents = torch.cat([a.parents, chain_parents])
    t = T.DraftTree(tokens, parents, max_depth=6)
    assert t.depths().tolist() == [[0, 1, 1, 2, 2, 2, 3], [0, 1, 2, 3, 4, 5, 6]]
    assert T.prefix_closed(t)
    bad = T.DraftTree(tokens[:1], torch.tensor([[-1, 0, 3, 1, 1, 2, 3]]), max_depth=3)
    assert not T.prefix_closed(bad)


def random_trees(B: int, N: int, seed: int, max_depth: int | None = None) -> torch.Tensor:
    """parents [B,N] of random prefix-closed trees (each node's parent precedes it), optionally no
    deeper than max_depth."""
    g = torch.Generator().manual_seed(seed)
    parents = torch.full((B, N), -1, dtype=torch.int64)
    depth = torch.zeros(B, N, dtype=torch.int64)
    for b in range(B):
        for j in range(1, N):
            allowed = [i for i in range(j) if max_depth is None or depth[b, i] < max_depth]
            p = allowed[int(torch.randint(len(allowed), (1,), generator=g))]
            parents[b, j], depth[b, j] = p, depth[b, p] + 1
    return parents


def test_path_doubling_equals_walking_up():
    for N, max_depth, seed in [(17, 6, 0), (33, 5, 1), (129, 7, 2), (12, 11, 3), (2, 1, 4), (9, None, 5)]:
        parents = random_trees(4, N, seed, max_depth)
        depth = max_depth if max_depth is not None else N - 1
        assert torch.equal(T.ancestors_of(parents, depth), T.ancestors_walk(parents, depth)), (N, depth)
    chain = (torch.arange(20) - 1)[None]  # the deepest tree of 20 nodes: a chain of depth 19
    assert torch.equal(T.ancestors_of(chain, 19), torch.ones(20, 20).tril().bool()[None])
