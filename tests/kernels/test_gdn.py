"""Gated DeltaNet kernels (`kernels/gdn.py`): the causal conv and the fused recurrence against the
independent PyTorch reference of `gdn_spec.py`, chunks and trees; a tree node bit for bit the chunk of its
root path; strided gate inputs; the pure-torch fallbacks; the ops torch.compile sees.

Bounds (float32 arithmetic in another order than torch's):
- conv: |y - y_ref| <= 1.1 (2 K 2^-24 sum_j |w_j x_j| + ulp(z)) + ulp(y_ref) + 2^-20 |y_ref| elementwise,
  ulp in the model dtype: both sums are within K float32 roundings of the exact conv z, each may
  then round to the other side of a dtype boundary, |silu'| <= 1.1, and the SiLU rounds once more.
- recurrence: max |S - S_ref| <= 4e-6 max |S_ref| over the float32 states (committed or per node),
  and the same normwise bound on float32 outputs: 64 float32 roundings (2^-24). Measured under the
  interpreter over these cases (up to 40 tokens): states <= 3.2e-7, outputs <= 2.6e-7 for Dk <= 32
  and 1.0e-6 for Dk = 128 (sums of 128 terms that cancel). BF16 outputs may also round to the other
  neighbour (one BF16 ulp, <= 2^-8 |o_ref|).
"""

from types import SimpleNamespace

import pytest
import torch

from specpilot.kernels import gdn as K
from tests.kernels import gdn_spec as M
from specpilot.models.recurrence import Recurrence

REL = 4e-6  # normwise bound on float32 states and outputs (module docstring)
CONV_K = 4


def ulp(v: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """The spacing of `dtype` values at |v| (float64)."""
    mant = {torch.float32: 23, torch.bfloat16: 7, torch.float16: 10}[dtype]
    return torch.exp2(torch.floor(torch.log2(v.double().abs().clamp(min=2.0**-126))) - mant)


def tree(N: int, shape: str, seed: int) -> list[int]:
    """Parents of an N-node tree: a chain, a star under node 0, or random parents < t with more
    roots (parent -1: node N // 2 and others now and then), which continue the committed state again."""
    g = torch.Generator().manual_seed(seed)
    if shape == "chain":
        return list(range(-1, N - 1))
    if shape == "star":
        return [-1] + [0] * (N - 1)
    return [-1] + [-1 if t == N // 2 or torch.rand(1, generator=g).item() < 0.1
                   else int(torch.randint(0, t, (1,), generator=g)) for t in range(1, N)]


def tree_tensors(B: int, N: int, shape: str, seed: int, device):
    """parents, depths [B,N] (a different tree per row) and the max depth."""
    parents = torch.tensor([tree(N, shape, seed + b) for b in range(B)])
    depths = torch.zeros_like(parents)
    for t in range(N):
        p = parents[:, t]
        depths[:, t] = torch.where(p >= 0, depths.gather(1, p.clamp(min=0)[:, None])[:, 0] + 1, 0)
    return parents.to(device), depths.to(device), int(depths.max())


def layer(B, T, Hk, Hv, Dk, Dv, dtype, device, seed=0, extra=3):
    """A projection's pieces as the layer splits them: x [B,T,Cc], b, a [B,T,Hv] (views of one
    [B,T,Cc+2Hv+extra] tensor), window, conv weight, A_log, dt_bias (decays near 0, near -20 and
    in between, by head) and a committed state."""
    g = torch.Generator().manual_seed(seed)
    Cc = 2 * Hk * Dk + Hv * Dv
    proj = torch.randn(B, T, Cc + 2 * Hv + extra, generator=g).to(dtype)
    x, b, a = proj[..., :Cc], proj[..., Cc:Cc + Hv], proj[..., Cc + Hv:Cc + 2 * Hv]
    window = torch.randn(B, CONV_K - 1, Cc, generator=g).to(dtype)
    weight = torch.randn(Cc, CONV_K, generator=g) * 0.5
    kind = torch.arange(Hv) % 3  # g ~ -1e-7 (softplus far in its log1p range), g ~ -20, g ~ -1
    A_log = torch.where(kind == 0, 2.3, torch.where(kind == 1, 2.3, torch.randn(Hv, generator=g)))
    dt_bias = torch.where(kind == 0, -18.0, torch.where(kind == 1, 2.0, torch.randn(Hv, generator=g)))
    state = torch.randn(B, Hv, Dk, Dv, generator=g) * 0.5
    out = dict(proj=proj, x=x, b=b, a=a, window=window, weight=weight, A_log=A_log, dt_bias=dt_bias, state=state)
    return {k: v.to(device) for k, v in out.items()}


def config(Hk, Hv, Dk, Dv):
    return SimpleNamespace(linear_num_key_heads=Hk, linear_num_value_heads=Hv, linear_key_head_dim=Dk,
                           linear_value_head_dim=Dv)


def reference_recurrence(y, a, b, A_log, dt_bias, state, fresh, Hk, parents=None, depths=None, max_depth=0,
                         commit=None):
    """gdn_spec's heads, gates and scan: (o float32 [B,T,Hv,Dv], the committed state after a
    chunk or the node states [B,T,Hv,Dk,Dv] of a tree)."""
    _, Hv, Dk, Dv = state.shape
    q, k, v = M.heads(y, config(Hk, Hv, Dk, Dv))
    g, beta = M.gates(a, b, A_log, dt_bias)
    S0 = torch.where(fresh[:, None, None, None], torch.zeros_like(state), state)
    if parents is not None:
        return M.tree_scan(q, k, v, g, beta, S0, parents, depths, max_depth)
    o, kept = M.chunk_scan(q, k, v, g, beta, S0, commit)
    return o, torch.where((commit >= 0)[:, None, None, None], kept, state)


def assert_close_states(got: torch.Tensor, want: torch.Tensor) -> None:
    got, want = got.cpu().double(), want.cpu().double()
    err = (got - want).abs().max().item()
    assert err <= REL * want.abs().max().item(), f"state error {err:.3g}, scale {want.abs().max().item():.3g}"


def check_outputs(o: torch.Tensor, o_ref32: torch.Tensor) -> None:
    ref = o_ref32.cpu().double()
    err = (o.cpu().double() - ref).abs()
    bound = REL * ref.abs().max() + (2.0**-8 * ref.abs() if o.dtype == torch.bfloat16 else 0.0)
    assert (err <= bound).all(), f"output error {err.max().item():.3g} (scale {ref.abs().max().item():.3g})"


# ---- the conv ----------------------------------------------------------------------------------

def check_conv(y, x, window, positions, weight, rec):
    win = M.conv_windows(x, window, positions, rec)
    want = M.causal_conv(win, weight)
    prod = win.double() * weight.double().t()
    z, mass = prod.sum(2), prod.abs().sum(2)
    bound = 1.1 * (2 * CONV_K * 2.0**-24 * mass + ulp(z, x.dtype)) + ulp(want, x.dtype) + 2.0**-20 * want.double().abs()
    assert y.dtype == x.dtype and y.shape == x.shape
    err = (y.double() - want.double()).abs()
    assert (err <= bound).all(), f"conv error {(err / bound).max().item():.3g}x the bound"


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("T", [1, 6])
def test_conv_of_a_chunk_matches_the_reference(T, dtype, device):
    """Rows at positions 0.. (fresh: the window is before position 0), 1.. (partly) and 10..; x a
    strided view of the projection."""
    d = layer(3, T, 2, 4, 16, 16, dtype, device, seed=T)
    positions = torch.tensor([0, 1, 10], device=device)[:, None] + torch.arange(T, device=device)
    y = K.gdn_conv(d["x"], d["window"], positions, d["weight"])
    check_conv(y, d["x"], d["window"], positions, d["weight"], Recurrence.chunk(None))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_decode_step_moves_the_window_on_in_the_conv_kernel(dtype, device):
    """One-token chunk with `commit`: the same outputs as without, and the window becomes
    `commit_window`'s bit for bit (rows committing 0 move on, rows at -1 keep theirs); more than one
    token with a commit is refused."""
    d = layer(3, 1, 2, 4, 16, 16, dtype, device, seed=5)
    positions = torch.tensor([[0], [2], [10]], device=device)
    commit = torch.tensor([0, -1, 0], device=device)
    want_y = K.gdn_conv(d["x"], d["window"], positions, d["weight"])
    want_window = K.commit_window(d["window"], d["x"], commit)
    window = d["window"].clone()
    y = K.gdn_conv(d["x"], window, positions, d["weight"], commit=commit)
    assert torch.equal(y, want_y)
    assert torch.equal(window, want_window) and torch.equal(window[1], d["window"][1])
    two = layer(3, 2, 2, 4, 16, 16, dtype, device, seed=6)
    with pytest.raises(ValueError, match="one-token chunk"):
        K.gdn_conv(two["x"], two["window"].clone(), positions.expand(3, 2).contiguous(), two["weight"], commit=commit)


@pytest.mark.parametrize("shape, N", [("chain", 8), ("star", 8), ("random", 33), ("random", 1)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_conv_of_a_tree_walks_the_ancestors_then_the_committed_window(shape, N, dtype, device):
    B = 3
    d = layer(B, N, 1, 2, 16, 16, dtype, device, seed=N)
    parents, depths, max_depth = tree_tensors(B, N, shape, 7, device)
    positions = torch.tensor([0, 1, 10], device=device)[:, None] + depths
    y = K.gdn_conv(d["x"], d["window"], positions, d["weight"], parents, depths)
    check_conv(y, d["x"], d["window"], positions, d["weight"], Recurrence.tree(parents, depths, max_depth))


def test_bf16_conv_rounds_before_the_silu_as_the_reference_does(device):
    """Inputs and weights on grids of 2^-6 (|x|, |w| <= 1): every float32 sum is exact, so the
    kernel equals the reference bit for bit, which holds only if the conv (up to 15 significant
    bits) is rounded to BF16 before the SiLU and the SiLU's output rounded once."""
    g = torch.Generator().manual_seed(3)
    B, T, Cc = 2, 5, 300
    x = (torch.randint(-64, 65, (B, T, Cc), generator=g) / 64).bfloat16().to(device)  # 7 bits: exact in BF16
    window = (torch.randint(-64, 65, (B, CONV_K - 1, Cc), generator=g) / 64).bfloat16().to(device)
    weight = (torch.randint(-64, 65, (Cc, CONV_K), generator=g) / 64).to(device)
    positions = torch.tensor([[0], [7]], device=device) + torch.arange(T, device=device)
    want = M.causal_conv(M.conv_windows(x, window, positions, Recurrence.chunk(None)), weight)
    assert torch.equal(K.gdn_conv(x, window, positions, weight), want)


def test_conv_of_a_chain_tree_is_the_chunks_bit_for_bit(device):
    d = layer(2, 7, 1, 2, 16, 16, torch.bfloat16, device)
    parents, depths, _ = tree_tensors(2, 7, "chain", 0, device)
    positions = torch.tensor([2, 30], device=device)[:, None] + depths
    chunk = K.gdn_conv(d["x"], d["window"], positions, d["weight"])
    assert torch.equal(K.gdn_conv(d["x"], d["window"], positions, d["weight"], parents, depths), chunk)


# ---- the recurrence ------------------------------------------------------------------------------

# (B, T, Hk, Hv, Dk, Dv, input scale): one decode token; Hv = Hk and = 2 Hk; a 40-token chunk; dims
# that are not powers of two (the tiny hybrid's Dv = 8, Dk = 24) with inputs so small that the norm's
# eps weighs (|k|^2 ~ 6 eps); Dk = Dv = 128 (Qwen3.5's)
CHUNKS = [(3, 1, 2, 4, 16, 16, 1.0), (3, 7, 2, 2, 16, 32, 1.0), (2, 40, 1, 2, 16, 16, 1.0),
          (2, 5, 2, 4, 24, 8, 1e-3), (1, 2, 1, 1, 128, 128, 1.0)]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("shape", CHUNKS, ids=lambda s: "x".join(map(str, s[:-1])) + f"-scale{s[-1]:g}")
def test_recurrence_of_a_chunk_matches_the_reference_and_commits_only_named_rows(shape, dtype, device):
    B, T, Hk, Hv, Dk, Dv, scale = shape
    d = layer(B, T, Hk, Hv, Dk, Dv, dtype, device, seed=T)
    y = M.causal_conv(M.conv_windows(d["x"] * scale, d["window"], torch.arange(T, device=device).expand(B, T),
                                     Recurrence.chunk(None)), d["weight"])
    fresh = torch.tensor([True, False, False][:B], device=device)
    commit = torch.tensor([T - 1, -1, T // 2][:B], device=device)
    state = d["state"].clone()
    o = K.gdn_recurrence(y, d["a"], d["b"], d["A_log"], d["dt_bias"], state, fresh, Hk, commit=commit)
    o_ref, state_ref = reference_recurrence(y, d["a"], d["b"], d["A_log"], d["dt_bias"], d["state"], fresh, Hk,
                                            commit=commit)
    assert o.dtype == dtype and o.shape == (B, T, Hv, Dv)
    check_outputs(o, o_ref)
    assert_close_states(state, state_ref)
    untouched = commit < 0
    assert torch.equal(state[untouched], d["state"][untouched])


# (shape, N, B, Hv / Hk): every shape at every N, each batch size and head ratio with each shape
TREES = [("chain", 1, 1, 1), ("chain", 8, 3, 2), ("chain", 33, 1, 2), ("star", 1, 3, 2), ("star", 8, 1, 1),
         ("star", 33, 3, 1), ("random", 1, 1, 2), ("random", 8, 3, 1), ("random", 33, 3, 2)]


@pytest.mark.parametrize("shape, N, B, G", TREES)
def test_recurrence_of_a_tree_matches_the_reference_node_by_node(shape, N, B, G, device):
    Hk, Dk, Dv = 2, 16, 16
    Hv = G * Hk
    d = layer(B, N, Hk, Hv, Dk, Dv, torch.bfloat16, device, seed=N + B)
    parents, depths, max_depth = tree_tensors(B, N, shape, N, device)
    y = d["x"].contiguous()
    fresh = torch.tensor([N == 8, True, False][:B], device=device)  # B = 3: row 1; B = 1: the 8-node star
    state = d["state"].clone()
    nodes = torch.full((B, N + 2, Hv, Dk, Dv), float("nan"), device=device)  # a larger scratch
    o = K.gdn_recurrence(y, d["a"], d["b"], d["A_log"], d["dt_bias"], state, fresh, Hk, parents=parents,
                         node_state=nodes)
    o_ref, nodes_ref = reference_recurrence(y, d["a"], d["b"], d["A_log"], d["dt_bias"], d["state"], fresh, Hk,
                                            parents, depths, max_depth)
    check_outputs(o, o_ref)
    assert_close_states(nodes[:, :N], nodes_ref)
    assert torch.equal(state, d["state"])  # a tree commits nothing
    assert nodes[:, N:].isnan().all()


def root_path_chunks(parents: torch.Tensor, depths: torch.Tensor, *per_token: torch.Tensor):
    """Each node of each row as a chunk row (row b * N + n) holding its root path, root first:
    the per-token tensors [B,N,...] gathered along the paths (zeros past the path's end), and the
    index of the node in its chunk (its depth)."""
    B, N = parents.shape
    T = int(depths.max()) + 1
    idx = torch.zeros(B * N, T, dtype=torch.long)
    for b in range(B):
        for n in range(N):
            path, j = [], n
            while j >= 0:
                path.append(j)
                j = int(parents[b, j])
            idx[b * N + n, : len(path)] = torch.tensor(path[::-1]) + b * N
    idx = idx.to(parents.device)
    live = (torch.arange(T, device=parents.device) <= depths.reshape(-1, 1))
    out = []
    for t in per_token:
        flat = t.reshape(B * N, *t.shape[2:])[idx]  # [B*N, T, ...]
        out.append(flat * live.reshape(B * N, T, *[1] * (t.dim() - 2)).to(t.dtype))
    return out, depths.reshape(-1)


@pytest.mark.parametrize("shape", ["chain", "star", "random"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_tree_node_is_bit_for_bit_the_chunk_of_its_root_path(shape, dtype, device):
    """Every node's state and output equal those of a chunk over its root path (the committed
    state, or zero for a fresh row, continued token by token), with torch.equal."""
    B, N, Hk, Hv, Dk, Dv = 2, 10, 1, 2, 16, 16
    d = layer(B, N, Hk, Hv, Dk, Dv, dtype, device, seed=5)
    parents, depths, _ = tree_tensors(B, N, shape, 11, device)
    fresh = torch.tensor([True, False], device=device)
    y = d["x"].contiguous()
    nodes = torch.empty(B, N, Hv, Dk, Dv, device=device)
    o = K.gdn_recurrence(y, d["a"], d["b"], d["A_log"], d["dt_bias"], d["state"], fresh, Hk, parents=parents,
                         node_state=nodes)
    (yc, ac, bc), last = root_path_chunks(parents, depths, y, d["a"], d["b"])
    rows = torch.arange(B, device=device).repeat_interleave(N)
    state = d["state"][rows].clone()
    oc = K.gdn_recurrence(yc, ac, bc, d["A_log"], d["dt_bias"], state, fresh[rows], Hk, commit=last)
    assert torch.equal(state, nodes.reshape(B * N, Hv, Dk, Dv))
    assert torch.equal(oc[torch.arange(B * N, device=device), last], o.reshape(B * N, Hv, Dv))


def test_strided_gate_inputs_read_as_contiguous_ones(device):
    """a, b as views of the projection (row stride Cc + 2 Hv + 3) give the contiguous copies' output."""
    B, T, Hk, Hv, Dk, Dv = 2, 3, 1, 2, 16, 16
    d = layer(B, T, Hk, Hv, Dk, Dv, torch.bfloat16, device)
    assert d["a"].stride(1) != Hv
    fresh = torch.tensor([False, True], device=device)
    commit = torch.tensor([1, 2], device=device)
    runs = []
    for a, b in ((d["a"], d["b"]), (d["a"].contiguous(), d["b"].contiguous())):
        state = d["state"].clone()
        runs.append((K.gdn_recurrence(d["x"], a, b, d["A_log"], d["dt_bias"], state, fresh, Hk, commit=commit), state))
    assert torch.equal(runs[0][0], runs[1][0]) and torch.equal(runs[0][1], runs[1][1])


def test_shapes_it_cannot_run_are_refused_with_the_shapes(device):
    d = layer(1, 2, 2, 4, 16, 16, torch.float32, device)
    fresh = torch.tensor([False], device=device)
    args = (d["x"], d["a"], d["b"], d["A_log"], d["dt_bias"])
    with pytest.raises(ValueError, match="gdn_recurrence"):  # Cc is not 2 Hk Dk + Hv Dv for Hk = 1
        K.gdn_recurrence(*args, d["state"], fresh, 1)
    with pytest.raises(ValueError, match="gdn_recurrence"):  # a tree needs its node scratch
        K.gdn_recurrence(*args, d["state"], fresh, 2, parents=torch.tensor([[-1, 0]], device=device))
    with pytest.raises(ValueError, match="gdn_recurrence"):  # states are float32
        K.gdn_recurrence(*args, d["state"].bfloat16(), fresh, 2)
    with pytest.raises(ValueError, match="gdn_conv"):
        K.gdn_conv(d["x"], d["window"][:, :2], torch.zeros(1, 2, dtype=torch.long, device=device), d["weight"])


# ---- fallbacks and ops ---------------------------------------------------------------------------

def test_without_the_kernels_the_fallbacks_compute_the_reference(monkeypatch):
    """On CPU without the interpreter the wrappers run plain torch: the reference's values (the
    chunk's bit for bit, the tree's within the bound)."""
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    B, T, Hk, Hv, Dk, Dv = 2, 6, 1, 2, 16, 8
    d = layer(B, T, Hk, Hv, Dk, Dv, torch.float32, "cpu")
    positions = torch.tensor([[0], [4]]) + torch.arange(T)
    y = K.gdn_conv(d["x"], d["window"], positions, d["weight"])
    assert torch.equal(y, M.causal_conv(M.conv_windows(d["x"], d["window"], positions, Recurrence.chunk(None)),
                                        d["weight"]))
    fresh, commit = torch.tensor([True, False]), torch.tensor([3, -1])
    state = d["state"].clone()
    o = K.gdn_recurrence(y, d["a"], d["b"], d["A_log"], d["dt_bias"], state, fresh, Hk, commit=commit)
    o_ref, state_ref = reference_recurrence(y, d["a"], d["b"], d["A_log"], d["dt_bias"], d["state"], fresh, Hk,
                                            commit=commit)
    assert torch.equal(o, o_ref) and torch.equal(state, state_ref)
    parents, depths, max_depth = tree_tensors(B, T, "random", 3, "cpu")
    nodes = torch.empty(B, T, Hv, Dk, Dv)
    o = K.gdn_recurrence(y, d["a"], d["b"], d["A_log"], d["dt_bias"], d["state"], fresh, Hk, parents=parents,
                         node_state=nodes)
    o_ref, nodes_ref = reference_recurrence(y, d["a"], d["b"], d["A_log"], d["dt_bias"], d["state"], fresh, Hk,
                                            parents, depths, max_depth)
    check_outputs(o, o_ref)
    assert_close_states(nodes, nodes_ref)


def test_the_ops_pass_opcheck(device):
    B, T, Hk, Hv, Dk, Dv = 1, 2, 1, 1, 16, 16
    d = layer(B, T, Hk, Hv, Dk, Dv, torch.float32, device)
    positions = torch.tensor([[3, 4]], device=device)
    parents, depths = torch.tensor([[-1, 0]], device=device), torch.tensor([[0, 1]], device=device)
    torch.library.opcheck(torch.ops.specpilot.gdn_conv.default,
                          (d["x"], d["window"], positions, d["weight"], parents, depths))
    nodes = torch.zeros(B, T, Hv, Dk, Dv, device=device)
    fresh = torch.tensor([False], device=device)
    step = layer(2, 1, 1, 2, 16, 16, torch.float32, device, seed=7)
    torch.library.opcheck(torch.ops.specpilot.gdn_conv_commit.default,
                          (step["x"], step["window"].clone(), torch.tensor([[0], [3]], device=device), step["weight"],
                           torch.tensor([0, -1], device=device)))
    torch.library.opcheck(torch.ops.specpilot.gdn_recurrence.default,
                          (d["x"], d["a"], d["b"], d["A_log"], d["dt_bias"], d["state"].clone(), fresh, Hk,
                           parents, None, nodes))


@pytest.mark.gpu
def test_on_the_gpu_a_tree_node_is_the_chunk_of_its_root_path_at_the_fixtures_shapes():
    """Compiled (FMA contraction and all): the fixture-x16 layer's heads, a 33-node random tree."""
    device = "cuda"
    B, N, Hk, Hv, Dk, Dv = 1, 33, 32, 64, 64, 64
    d = layer(B, N, Hk, Hv, Dk, Dv, torch.bfloat16, device, seed=2)
    parents, depths, max_depth = tree_tensors(B, N, "random", 4, device)
    fresh = torch.tensor([False], device=device)
    y = d["x"].contiguous()
    nodes = torch.empty(B, N, Hv, Dk, Dv, device=device)
    o = K.gdn_recurrence(y, d["a"], d["b"], d["A_log"], d["dt_bias"], d["state"], fresh, Hk, parents=parents,
                         node_state=nodes)
    (yc, ac, bc), last = root_path_chunks(parents, depths, y, d["a"], d["b"])
    state = d["state"].expand(N, Hv, Dk, Dv).clone()
    oc = K.gdn_recurrence(yc, ac, bc, d["A_log"], d["dt_bias"], state, fresh.expand(N), Hk, commit=last)
    assert torch.equal(state, nodes[0]) and torch.equal(oc[torch.arange(N, device=device), last], o[0])
    o_ref, nodes_ref = reference_recurrence(y, d["a"], d["b"], d["A_log"], d["dt_bias"], d["state"], fresh, Hk,
                                            parents, depths, max_depth)
    check_outputs(o, o_ref)
    assert_close_states(nodes, nodes_ref)
