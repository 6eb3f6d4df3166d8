"""The greedy acceptance walk on hand-built trees and its KV commit."""

import torch

from specpilot.models.kv_cache import KVCache
from specpilot.engine.tree import DraftTree
from specpilot.engine.verify import commit, greedy_accept
from specpilot.models.random_checkpoint import tiny_config


def tree():
    # root 0 -> {1: 11, 2: 12}; 1 -> {3: 13, 4: 14}; 3 -> {5: 15}
    parents = torch.tensor([[-1, 0, 0, 1, 1, 3]])
    tokens = torch.tensor([[10, 11, 12, 13, 14, 15]])
    return DraftTree(tokens, parents, max_depth=3)


def test_accepts_longest_matching_path_plus_bonus():
    t = tree()
    # target argmax at each node: root->11 (node 1 ok), node1->13 (node 3 ok), node3->99 (node 5 wrong)
    argmax = torch.tensor([[11, 13, 0, 99, 0, 0]])
    acc = greedy_accept(t, argmax)
    assert acc.accept_len.tolist() == [2]
    assert acc.path[0].tolist() == [0, 1, 3, -1]
    assert acc.bonus.tolist() == [99]
    assert acc.new_tokens[0, :3].tolist() == [11, 13, 99]


def test_rejected_root_children_commit_only_the_bonus():
    t = tree()
    argmax = torch.tensor([[7, 13, 0, 15, 0, 1]])  # root predicts 7: no child matches
    acc = greedy_accept(t, argmax)
    assert acc.accept_len.tolist() == [0]
    assert acc.new_tokens[0, 0].item() == 7


def test_a_correct_node_under_a_wrong_parent_is_not_accepted():
    t = tree()
    argmax = torch.tensor([[12, 13, 0, 15, 0, 5]])  # node 2 ok (depth 1); node 3 matches its parent but 1 is wrong
    acc = greedy_accept(t, argmax)
    assert acc.accept_len.tolist() == [1]
    assert acc.path[0, :2].tolist() == [0, 2]
    assert acc.bonus.tolist() == [0]


def test_accept_unverified_fault_takes_the_deepest_node_unchecked():
    t = tree()
    argmax = torch.tensor([[11, 13, 0, 99, 0, 42]])  # node 5 (deepest, token 15) is wrong
    acc = greedy_accept(t, argmax, accept_unverified=True)
    assert acc.accept_len.tolist() == [3]
    assert acc.new_tokens[0].tolist() == [11, 13, 15, 42]


def test_commit_moves_accepted_entries_to_contiguous_slots():
    cfg = tiny_config(num_layers=1)
    cache = KVCache.allocate(cfg, 1, 16, "cpu", torch.float32)
    for s in range(16):
        cache.k[0][:, :, s] = s
        cache.v[0][:, :, s] = -s
    t = tree()
    acc = greedy_accept(t, torch.tensor([[11, 13, 0, 99, 0, 0]]))  # path 0 -> 1 -> 3
    prefix = torch.tensor([4])  # root at slot 4, node j at slot 4 + j
    commit(cache, prefix, acc, torch.tensor([True]))
    got = cache.k[0][0, 0, :, 0].tolist()
    assert got[4:7] == [4, 5, 7]  # root, node 1 (slot 5), node 3 (was at slot 7)
    assert cache.v[0][0, 0, 6, 0].item() == -7
    assert got[:4] == [0, 1, 2, 3]
