"""The Gated DeltaNet layer on its reference path (CPU, no interpreter): a tree node's state,
output and conv inputs are exactly what a sequential pass over its root path computes; the chunked
parallel form equals the sequential rule to float32 rounding; committing a chunk keeps the right
conv inputs. (The kernels' own tests, interpreted, are tests/kernels/test_gdn.py.)"""

import pytest
import torch

from specpilot.engine.tree import DraftTree
from specpilot.kernels import gdn as kernels
from specpilot.kernels.gdn import commit_window
from specpilot.models.gdn_chunked import chunked_scan

Hk, Hv, Dk, Dv, K = 2, 4, 8, 4, 4
Cc = 2 * Hk * Dk + Hv * Dv


@pytest.fixture(autouse=True)
def reference_path(monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)


def random_tree(B: int, N: int, seed: int, shape: str = "random") -> DraftTree:
    g = torch.Generator().manual_seed(seed)
    parents = torch.full((B, N), -1, dtype=torch.int64)
    for j in range(1, N):
        parents[:, j] = {"chain": j - 1, "star": 0}.get(shape, int(torch.randint(0, j, (1,), generator=g)))
    return DraftTree(torch.zeros(B, N, dtype=torch.int64), parents, max_depth=N - 1)


def root_path(parents: torch.Tensor, node: int) -> list[int]:
    path = [node]
    while parents[path[-1]] >= 0:
        path.append(int(parents[path[-1]]))
    return path[::-1]


def layer_inputs(B, T, seed, decay=2.0):
    g = torch.Generator().manual_seed(seed)
    y = torch.randn(B, T, Cc, generator=g)
    a = torch.randn(B, T, Hv, generator=g) * decay
    b = torch.randn(B, T, Hv, generator=g)
    A_log = torch.empty(Hv).uniform_(0.0, 2.5, generator=g)
    dt_bias = torch.randn(Hv, generator=g)
    return y, a, b, A_log, dt_bias


@pytest.mark.parametrize("shape", ["random", "chain", "star"])
@pytest.mark.parametrize("decay", [0.05, 8.0])
def test_tree_node_equals_a_sequential_pass_over_its_root_path(shape, decay):
    """To float32 rounding: torch's CPU reductions may sum a batch of 3 rows in another order than
    one row (the kernels are bit-exact here, batch-invariant by construction: tests/kernels)."""
    B, N = 3, 17
    tree = random_tree(B, N, seed=1, shape=shape)
    y, a, b, A_log, dt_bias = layer_inputs(B, N, seed=2, decay=decay)
    S0 = torch.randn(B, Hv, Dk, Dv, generator=torch.Generator().manual_seed(3))
    fresh = torch.tensor([False, True, False])
    nodes = torch.zeros(B, N, Hv, Dk, Dv)
    out = kernels.gdn_recurrence(y, a, b, A_log, dt_bias, S0.clone(), fresh, Hk, parents=tree.parents, node_state=nodes)
    for bi in range(B):
        for j in range(N):
            path = root_path(tree.parents[bi], j)
            sel = lambda x: x[bi : bi + 1, path]  # noqa: E731
            S = S0[bi : bi + 1].clone()
            o = kernels.gdn_recurrence(sel(y), sel(a), sel(b), A_log, dt_bias, S, fresh[bi : bi + 1], Hk,
                                       commit=torch.tensor([len(path) - 1]))
            assert (nodes[bi, j] - S[0]).abs().max() <= 1e-6 * S.abs().max(), (bi, j)
            assert (out[bi, j] - o[0, -1]).abs().max() <= 1e-6 * max(o.abs().max(), 1e-3), (bi, j)


def test_conv_follows_the_root_path_then_the_committed_window():
    B, N = 2, 12
    tree = random_tree(B, N, seed=4)
    x = torch.randn(B, N, Cc)
    window = torch.randn(B, K - 1, Cc)
    weight = torch.randn(Cc, K)
    positions = torch.tensor([[5], [1]]) + tree.depths()  # row 1: its root sits at position 1
    y = kernels.gdn_conv(x, window, positions, weight, tree.parents, tree.depths())
    for b in range(B):
        for j in range(N):
            path = root_path(tree.parents[b], j)
            want = kernels.gdn_conv(x[b : b + 1, path], window[b : b + 1], positions[b : b + 1, path], weight)
            assert torch.allclose(y[b, j], want[0, -1], rtol=1e-6, atol=1e-7), (b, j)  # CPU: batch of 2 vs 1
            history = torch.cat([window[b], x[b, path]])[-K:]  # oldest first
            first = int(positions[b, j]) - (K - 1)
            live = torch.tensor([first + i >= 0 for i in range(K)], dtype=x.dtype)
            direct = torch.nn.functional.silu(((history * live[:, None]) * weight.t()).sum(0))
            assert torch.allclose(y[b, j], direct, rtol=1e-5, atol=1e-6)


def test_commit_window():
    B, T = 2, 6
    x = torch.randn(B, T, 3)
    window = torch.randn(B, K - 1, 3)
    kept = commit_window(window, x, torch.tensor([-1, 1]))
    assert torch.equal(kept[0], window[0])  # -1: the row is left alone
    assert torch.equal(kept[1], torch.cat([window[1, 2:], x[1, :2]]))


def sequential(q, k, v, g, beta, S):
    """The gated delta rule token by token (the definition)."""
    out = []
    for t in range(q.shape[1]):
        S = S * g[:, t].exp()[..., None, None]
        kv = (S * k[:, t, ..., None]).sum(-2)
        S = S + k[:, t, ..., None] * ((v[:, t] - kv) * beta[:, t, :, None])[..., None, :]
        out.append((S * q[:, t, ..., None]).sum(-2))
    return torch.stack(out, 1), S


@pytest.mark.parametrize("decay", [0.5, 20.0])
def test_chunked_form_equals_the_sequential_rule_to_rounding(decay):
    B, T, H = 2, 150, 3
    g = torch.Generator().manual_seed(5)
    norm = lambda x: x * torch.rsqrt((x * x).sum(-1, keepdim=True) + 1e-6)  # noqa: E731
    q = norm(torch.randn(B, T, H, 16, generator=g)) * 16**-0.5
    k = norm(torch.randn(B, T, H, 16, generator=g))
    v = torch.randn(B, T, H, 8, generator=g)
    lg, beta = -torch.rand(B, T, H, generator=g) * decay, torch.rand(B, T, H, generator=g)
    S0 = torch.randn(B, H, 16, 8, generator=g)
    o1, S1 = sequential(q, k, v, lg, beta, S0)
    o2, S2 = chunked_scan(q, k, v, lg, beta, S0, chunk=64)
    # float32: the solve and the matmuls sum in other orders; state and outputs are O(1)
    assert (o1 - o2).abs().max() <= 1e-5 * max(1.0, o1.abs().max())
    assert (S1 - S2).abs().max() <= 1e-5 * max(1.0, S1.abs().max())
