"""The Gated DeltaNet reference: a tree node's state, output and conv window are exactly what a
sequential pass over its root path computes; the chunked parallel form equals the sequential scan
to float32 rounding; committing a chunk keeps the right conv inputs."""

import pytest
import torch

from specpilot.engine.tree import DraftTree
from specpilot.models import gdn
from specpilot.models.gdn_chunked import chunked_scan
from specpilot.models.recurrence import Recurrence


def random_tree(B: int, N: int, seed: int, shape: str = "random") -> DraftTree:
    g = torch.Generator().manual_seed(seed)
    parents = torch.full((B, N), -1, dtype=torch.int64)
    for b in range(B):
        for j in range(1, N):
            if shape == "chain":
                parents[b, j] = j - 1
            elif shape == "star":
                parents[b, j] = 0
            else:
                parents[b, j] = int(torch.randint(0, j, (1,), generator=g))
    return DraftTree(torch.zeros(B, N, dtype=torch.int64), parents, max_depth=N - 1)


def inputs(B, T, H, Dk, Dv, seed, decay=2.0):
    g = torch.Generator().manual_seed(seed)
    q = gdn.l2norm(torch.randn(B, T, H, Dk, generator=g)) * Dk**-0.5
    k = gdn.l2norm(torch.randn(B, T, H, Dk, generator=g))
    v = torch.randn(B, T, H, Dv, generator=g)
    lg = -torch.rand(B, T, H, generator=g) * decay
    beta = torch.rand(B, T, H, generator=g)
    return q, k, v, lg, beta


def root_path(parents: torch.Tensor, node: int) -> list[int]:
    path = [node]
    while parents[path[-1]] >= 0:
        path.append(int(parents[path[-1]]))
    return path[::-1]


@pytest.mark.parametrize("shape", ["random", "chain", "star"])
@pytest.mark.parametrize("decay", [0.05, 20.0])
def test_tree_scan_equals_a_sequential_pass_over_each_root_path_bit_for_bit(shape, decay):
    B, N, H, Dk, Dv = 3, 17, 2, 8, 4
    tree = random_tree(B, N, seed=1, shape=shape)
    q, k, v, lg, beta = inputs(B, N, H, Dk, Dv, seed=2, decay=decay)
    S0 = torch.randn(B, H, Dk, Dv, generator=torch.Generator().manual_seed(3))
    out, nodes = gdn.tree_scan(q, k, v, lg, beta, S0, tree.parents, tree.depths(), tree.max_depth)
    for b in range(B):
        for j in range(N):
            path = root_path(tree.parents[b], j)
            sel = lambda x: x[b : b + 1, path]  # noqa: E731
            o, S = gdn.chunk_scan(sel(q), sel(k), sel(v), sel(lg), sel(beta), S0[b : b + 1],
                                  torch.tensor([len(path) - 1]))
            assert torch.equal(nodes[b, j], S[0]), (b, j)
            assert torch.equal(out[b, j], o[0, -1]), (b, j)


def test_conv_windows_follow_the_root_path_then_the_committed_window():
    B, N, Cc, K = 2, 12, 5, 4
    tree = random_tree(B, N, seed=4)
    x = torch.randn(B, N, Cc)
    window = torch.randn(B, K - 1, Cc)
    positions = torch.tensor([[5], [1]]) + tree.depths()  # row 1: its root sits at position 1
    rec = Recurrence.tree(tree.parents, tree.depths(), tree.max_depth)
    win = gdn.conv_windows(x, window, positions, rec)  # [B,N,K,Cc]
    for b in range(B):
        for j in range(N):
            history = torch.cat([window[b], x[b, root_path(tree.parents[b], j)]])  # oldest first
            want = history[-K:].clone()
            first = int(positions[b, j]) - (K - 1)  # position of want[0]
            for i in range(K):
                if first + i < 0:
                    want[i] = 0  # before the sequence's start
            assert torch.equal(win[b, j], want), (b, j)


def test_chunk_windows_and_commit():
    B, T, Cc, K = 2, 6, 3, 4
    x = torch.randn(B, T, Cc)
    window = torch.randn(B, K - 1, Cc)
    positions = torch.tensor([[0], [9]]) + torch.arange(T)
    win = gdn.conv_windows(x, window, positions, Recurrence.chunk(torch.tensor([T - 1, 2])))
    assert torch.equal(win[1, 0], torch.cat([window[1], x[1, :1]]))
    assert torch.equal(win[0, 1], torch.cat([torch.zeros(2, Cc), x[0, :2]]))  # row 0 starts at position 0
    kept = gdn.commit_window(window, x, torch.tensor([-1, 1]))
    assert torch.equal(kept[0], window[0])  # -1: the row is left alone
    assert torch.equal(kept[1], torch.cat([window[1, 2:], x[1, :2]]))


@pytest.mark.parametrize("decay", [0.5, 20.0])
def test_chunked_form_equals_the_sequential_scan_to_rounding(decay):
    B, T, H, Dk, Dv = 2, 150, 3, 16, 8
    q, k, v, lg, beta = inputs(B, T, H, Dk, Dv, seed=5, decay=decay)
    S0 = torch.randn(B, H, Dk, Dv, generator=torch.Generator().manual_seed(6))
    o1, S1 = gdn.chunk_scan(q, k, v, lg, beta, S0, torch.full((B,), T - 1))
    o2, S2 = chunked_scan(q, k, v, lg, beta, S0, chunk=64)
    # float32: the solve and the matmuls sum in other orders; state and outputs are O(1)
    assert (o1 - o2).abs().max() <= 1e-5 * max(1.0, o1.abs().max())
    assert (S1 - S2).abs().max() <= 1e-5 * max(1.0, S1.abs().max())


def test_chunk_scan_keeps_the_named_state():
    B, T, H, Dk, Dv = 2, 5, 1, 4, 4
    q, k, v, lg, beta = inputs(B, T, H, Dk, Dv, seed=7)
    S0 = torch.randn(B, H, Dk, Dv)
    _, kept = gdn.chunk_scan(q, k, v, lg, beta, S0, torch.tensor([2, -1]))
    _, S = gdn.chunk_scan(q[:1, :3], k[:1, :3], v[:1, :3], lg[:1, :3], beta[:1, :3], S0[:1], torch.tensor([2]))
    assert torch.equal(kept[0], S[0]) and torch.equal(kept[1], S0[1])
