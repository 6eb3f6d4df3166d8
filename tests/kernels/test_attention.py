"""Split-KV attention (`kernels/attention.py`): softmax(q k^T * scale + bias) v over a static cache
(scale 1/sqrt(D) or a model's own), with the engine's GQA fold, against a float64 reference, at head
sizes 16 to 512 (Gemma's 256 and 512 on their own tiles), under tree and sliding-window ring masks;
the plan that cuts the keys; the op torch.compile sees."""

import math

import pytest
import torch
import torch.nn.functional as F

from specpilot.kernels.attention import (BLOCK_N, LARGE_HEAD_TILES, SMS_OFF_GPU, plan_splits, reference,
                                         split_attention)

OPS = (torch.ops.specpilot.split_attention, torch.ops.specpilot.split_attention.default)


def tree_bias(B: int, T: int, G: int, S: int, context: int, dtype, seed: int = 0) -> torch.Tensor:
    """[B,1,G*T,S] additive mask: each row's first context[b] slots, then a random tree of T nodes
    at context.. (node i's parent < i), each node seeing its ancestors and itself; -inf elsewhere."""
    g = torch.Generator().manual_seed(seed)
    mask = torch.zeros(B, 1, T, S, dtype=torch.bool)
    for b in range(B):
        ctx = context - 3 * b  # rows of different lengths
        parents = [-1] + [int(torch.randint(0, i, (1,), generator=g)) for i in range(1, T)]
        mask[b, 0, :, :ctx] = True
        for i in range(T):
            j = i
            while j >= 0:
                mask[b, 0, i, ctx + j] = True
                j = parents[j]
    bias = torch.zeros(mask.shape, dtype=dtype).masked_fill_(~mask, float("-inf"))
    return bias.expand(B, G, T, S).reshape(B, 1, G * T, S)


def ring_bias(B: int, T: int, G: int, R: int, window: int, first: int, dtype) -> torch.Tensor:
    """[B,1,G*T,R] additive mask of a sliding layer over a ring of R entries (`models.ring_cache`):
    a chain of T queries at positions first + 3b.., each admitting the entries (position % R) of
    its last `window` positions, so the admitted entries wrap around the ring's end."""
    mask = torch.zeros(B, 1, T, R, dtype=torch.bool)
    for b in range(B):
        for t in range(T):
            p = first + 3 * b + t
            for k in range(max(0, p - window + 1), p + 1):
                mask[b, 0, t, k % R] = True
    bias = torch.zeros(mask.shape, dtype=dtype).masked_fill_(~mask, float("-inf"))
    return bias.expand(B, G, T, R).reshape(B, 1, G * T, R)


def operands(B, T, H, Hkv, D, S, dtype, device, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, T, H, D, generator=g).to(dtype)
    k = torch.randn(B, Hkv, S, D, generator=g).to(dtype)
    v = torch.randn(B, Hkv, S, D, generator=g).to(dtype)
    return q.to(device), k.to(device), v.to(device)


def bound(dtype) -> float:
    """Worst |error| against float64 for unit-normal q, k, v: float32 sums; BF16 rounds the
    probabilities and the output to 8 bits (the flash kernels' rounding)."""
    return 1e-5 if dtype == torch.float32 else 2e-2


# (B, T, H, Hkv, D, S, context): one decode query, a drafter frontier, a tree past 64 folded rows,
# MHA (G = 1), a cache that is not a multiple of BLOCK_N, batch rows of different lengths, a cache
# of one key tile (one split: the output written directly, no merge)
SHAPES = [(1, 1, 4, 2, 64, 256, 100), (1, 8, 8, 2, 32, 200, 150), (1, 40, 4, 2, 16, 300, 200),
          (1, 5, 2, 2, 64, 130, 60), (3, 3, 4, 1, 16, 190, 120), (2, 3, 4, 2, 16, 60, 40)]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("shape", SHAPES)
def test_split_attention_matches_the_float64_reference(shape, dtype, device):
    B, T, H, Hkv, D, S, context = shape
    q, k, v = operands(B, T, H, Hkv, D, S, dtype, device)
    bias = tree_bias(B, T, H // Hkv, S, context, dtype).to(device)
    out = split_attention(q, k, v, bias)
    assert out.shape == q.shape and out.dtype == dtype
    err = (out.cpu().double() - reference(q.cpu(), k.cpu(), v.cpu(), bias.cpu())).abs().max().item()
    assert err <= bound(dtype)


# (B, T, H, Hkv, D, S, context, scale): Gemma's head sizes and scales (query_pre_attn_scalar ** -0.5,
# Gemma-3 27B's 168 among them; Gemma-4: 1 on normed q and k, here q scaled by D ** -0.5): one decode
# query, trees of 20 and 40 folded rows (query tiles of 32 and 64 rows, on their own key tiles), a
# 512-wide head over two batch rows (MHA) and over two query tiles of 16 rows
LARGE_HEADS = [(1, 1, 4, 2, 256, 200, 150, None), (1, 10, 4, 2, 256, 140, 90, 168**-0.5),
               (1, 20, 4, 2, 256, 100, 60, 1.0), (2, 3, 2, 2, 512, 160, 120, 1.0), (1, 9, 4, 2, 512, 70, 40, 0.1)]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("shape", LARGE_HEADS)
def test_large_heads_with_a_models_scale_match_the_float64_reference(shape, dtype, device):
    B, T, H, Hkv, D, S, context, scale = shape
    q, k, v = operands(B, T, H, Hkv, D, S, dtype, device, seed=D)
    if scale == 1.0:
        q = (q.float() * D**-0.5).to(dtype)
    bias = tree_bias(B, T, H // Hkv, S, context, dtype).to(device)
    out = split_attention(q, k, v, bias, scale)
    assert out.shape == q.shape and out.dtype == dtype
    err = (out.cpu().double() - reference(q.cpu(), k.cpu(), v.cpu(), bias.cpu(), scale)).abs().max().item()
    assert err <= bound(dtype)


def test_the_large_heads_run_each_of_their_tiles(device):
    sms = SMS_OFF_GPU if device == "cpu" else 132
    plans = {(D, plan_splits(B * Hkv, (H // Hkv) * T, S, sms, D).block_m) for B, T, H, Hkv, D, S, *_ in LARGE_HEADS}
    assert set(LARGE_HEAD_TILES) <= plans


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("D", [64, 256, 512])
def test_a_sliding_window_over_a_ring_is_just_a_bias(D, dtype, device):
    """A sliding layer's ring (R = window + slack entries, positions past R wrapping to its start):
    each query admits two runs of entries, one at each end of the ring."""
    B, T, H, Hkv, R, window = 2, 5, 4, 2, 72, 8
    q, k, v = operands(B, T, H, Hkv, D, R, dtype, device, seed=7)
    bias = ring_bias(B, T, H // Hkv, R, window, 146, dtype).to(device)  # query 0 sees positions 139..146: entries 67..2
    assert bias[0, 0, 0, 0] == 0 and bias[0, 0, 0, R - 1] == 0 and bias[0, 0, 0, R // 2] == float("-inf")
    out = split_attention(q, k, v, bias, 0.0625)
    err = (out.cpu().double() - reference(q.cpu(), k.cpu(), v.cpu(), bias.cpu(), 0.0625)).abs().max().item()
    assert err <= bound(dtype)


def test_a_scale_is_sdpas_scale_at_gemmas_head_sizes_in_float32(device):
    """Gemma's call: the engine's fold, the config's scale, SDPA's output (float32, heads of 256 and 512)."""
    for D, scale in ((256, 168**-0.5), (512, 1.0 / 32)):
        B, T, H, Hkv, S = 1, 6, 4, 2, 130
        q, k, v = operands(B, T, H, Hkv, D, S, torch.float32, device, seed=D + 1)
        bias = tree_bias(B, T, H // Hkv, S, 100, torch.float32, seed=3).to(device)
        qf = q.permute(0, 2, 1, 3).reshape(B, Hkv, (H // Hkv) * T, D)
        sdpa = F.scaled_dot_product_attention(qf, k, v, attn_mask=bias, scale=scale)
        sdpa = sdpa.reshape(B, H, T, D).transpose(1, 2)
        torch.testing.assert_close(split_attention(q, k, v, bias, scale), sdpa, rtol=0, atol=1e-5)


def test_the_shapes_take_both_paths_several_splits_merged_and_one_split_direct(device):
    splits = {plan_splits(B * Hkv, (H // Hkv) * T, S, SMS_OFF_GPU if device == "cpu" else 132).n_split
              for B, T, H, Hkv, D, S, _ in SHAPES}
    assert 1 in splits and max(splits) > 1


def test_split_attention_is_sdpa_under_the_engines_fold_in_float32(device):
    """The fold of `Attention.attend_cached`: query row g*T + t of KV head j is query t of head j*G + g."""
    B, T, H, Hkv, D, S = 2, 6, 8, 2, 32, 192
    q, k, v = operands(B, T, H, Hkv, D, S, torch.float32, device, seed=3)
    bias = tree_bias(B, T, H // Hkv, S, 120, torch.float32, seed=3).to(device)
    qf = q.permute(0, 2, 1, 3).reshape(B, Hkv, (H // Hkv) * T, D)
    sdpa = F.scaled_dot_product_attention(qf, k, v, attn_mask=bias).reshape(B, H, T, D).transpose(1, 2)
    torch.testing.assert_close(split_attention(q, k, v, bias), sdpa, rtol=0, atol=1e-5)


def test_strided_queries_and_a_cache_span_read_as_contiguous_ones(device):
    """q as `project` leaves it (a view of the fused qkv output) and a cache cut to its first slots
    (`KVCache.span`) give the contiguous operands' output."""
    B, T, H, Hkv, D, S = 1, 4, 4, 2, 16, 256
    qkv = torch.randn(B, T, (H + 2 * Hkv) * D).to(device)
    q = qkv[..., : H * D].view(B, T, H, D)
    _, k, v = operands(B, T, H, Hkv, D, S, torch.float32, device)
    bias = tree_bias(B, T, H // Hkv, 128, 90, torch.float32).to(device)
    got = split_attention(q, k[:, :, :128], v[:, :, :128], bias)
    want = split_attention(q.contiguous(), k[:, :, :128].contiguous(), v[:, :, :128].contiguous(), bias)
    assert torch.equal(got, want)


def test_a_query_no_key_admits_gets_zeros_and_the_others_are_unchanged(device):
    B, T, H, Hkv, D, S = 1, 3, 2, 1, 16, 128
    q, k, v = operands(B, T, H, Hkv, D, S, torch.float32, device)
    bias = tree_bias(B, T, 2, S, 50, torch.float32).to(device)
    blind = bias.clone()
    blind[0, 0, 1] = float("-inf")  # query t = 1 of head 0
    out = split_attention(q, k, v, blind)
    assert torch.equal(out[0, 1, 0], torch.zeros(D, device=device))
    keep = torch.ones(T, H, dtype=torch.bool)
    keep[1, 0] = False
    torch.testing.assert_close(out[0][keep], split_attention(q, k, v, bias)[0][keep], rtol=0, atol=1e-6)


@pytest.mark.parametrize("rows, queries, keys", [(8, 1, 1024), (8, 16, 1024), (32, 130, 1024), (8, 4, 2048),
                                                 (256, 64, 2560), (1, 1, 64), (2, 3, 100)])
def test_the_plan_covers_the_keys_once_and_fills_two_waves_where_the_keys_allow(rows, queries, keys):
    sms = 132
    p = plan_splits(rows, queries, keys, sms)
    assert p.chunk % BLOCK_N == 0 and p.chunk >= BLOCK_N
    assert (p.n_split - 1) * p.chunk < keys <= p.n_split * p.chunk  # every key in exactly one split
    assert p.block_m >= min(queries, 16) and (p.block_m >= queries or p.block_m == 64)
    per_split = rows * math.ceil(queries / p.block_m)  # programs
    tiles = math.ceil(keys / BLOCK_N)
    need = min(tiles, math.ceil(2 * sms / per_split))  # splits for two waves, if the keys allow
    assert need <= p.n_split < 2 * need


@pytest.mark.parametrize("D, queries", [(256, 4), (256, 30), (256, 130), (512, 2), (512, 100)])
def test_large_heads_plan_their_own_tiles_and_still_cover_the_keys_once(D, queries):
    p = plan_splits(16, queries, 4096, 132, D)
    assert (p.block_n, p.num_warps) == LARGE_HEAD_TILES.get((D, p.block_m), (BLOCK_N, 4))
    assert p.block_m == 16 if D == 512 else p.block_m >= min(queries, 64)
    assert p.chunk % p.block_n == 0 and (p.n_split - 1) * p.chunk < 4096 <= p.n_split * p.chunk


def test_an_ar_step_of_an_8b_model_is_cut_into_sixteen_splits():
    """Qwen3-8B decoding one token: 8 KV heads, 4 folded query rows, a cache of 1024 slots. Torch's
    fused kernels run 8 programs over the whole cache; the plan runs 128 of one key tile each."""
    p = plan_splits(8, 4, 1024, 132)
    assert (p.block_m, p.chunk, p.n_split) == (16, 64, 16)


def capture(graphs: list):
    def backend(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    return backend


def test_under_torch_compile_the_attention_is_one_opaque_op_with_the_eager_output(device):
    """fullgraph: no break; the graph calls `specpilot::split_attention` and holds nothing of the
    kernels; the output is the eager call's bit for bit."""
    B, T, H, Hkv, D, S = 1, 5, 4, 2, 16, 128
    q, k, v = operands(B, T, H, Hkv, D, S, torch.float32, device)
    bias = tree_bias(B, T, H // Hkv, S, 70, torch.float32).to(device)

    def attend(q, k, v, bias):  # the fold's neighbours as the engine has them
        return split_attention(q * 1.0, k, v, bias).reshape(B, T, H * D) + 1

    graphs = []
    torch._dynamo.reset()
    try:
        got = torch.compile(attend, backend=capture(graphs), fullgraph=True, dynamic=False)(q, k, v, bias)
    finally:
        torch._dynamo.reset()
    assert torch.equal(got, attend(q, k, v, bias))
    (gm,) = graphs
    calls = [n for n in gm.graph.nodes if n.op == "call_function"]
    assert sum(n.target in OPS for n in calls) == 1
    assert not any("triton" in str(n.target) for n in calls)


def test_the_op_passes_opcheck(device):
    B, T, H, Hkv, D, S = 1, 2, 4, 2, 16, 64
    q, k, v = operands(B, T, H, Hkv, D, S, torch.float32, device)
    bias = tree_bias(B, T, H // Hkv, S, 30, torch.float32).to(device)
    torch.library.opcheck(torch.ops.specpilot.split_attention.default, (q, k, v, bias, 0.3))


def test_shapes_it_cannot_fold_are_refused_with_the_shapes(device):
    q, k, v = operands(1, 2, 3, 2, 16, 64, torch.float32, device)  # 3 heads over 2 KV heads
    with pytest.raises(ValueError, match="split_attention"):
        split_attention(q, k, v, torch.zeros(1, 1, 2, 64, device=device))
    q, k, v = operands(1, 1, 2, 1, 1024, 64, torch.float32, device)  # a head wider than 512
    with pytest.raises(ValueError, match="split_attention"):
        split_attention(q, k, v, torch.zeros(1, 1, 2, 64, device=device))


def test_key_tiles_no_query_may_see_are_never_read(device):
    """NaN in the K/V of whole key tiles past every row's reach (the unfilled end of the cache)
    leaves the output bit-identical: those tiles are skipped, not masked after the product."""
    B, T, H, Hkv, D, S = 1, 4, 4, 2, 16, 320
    q, k, v = operands(B, T, H, Hkv, D, S, torch.float32, device)
    bias = tree_bias(B, T, H // Hkv, S, 100, torch.float32).to(device)  # reach: slots < 104, tiles 0-1
    clean = split_attention(q, k, v, bias)
    k[:, :, 128:], v[:, :, 128:] = float("nan"), float("nan")
    assert torch.equal(split_attention(q, k, v, bias), clean)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_last_split_merges_as_the_second_launch_would_and_leaves_its_counters_at_zero(dtype, device,
                                                                                        monkeypatch):
    """The split kernel's own merge (the last split of a tile to arrive) gives the merge kernel's
    output bit for bit, run after run; its counters are zero again after each launch; where the
    counters would not fit, the second launch merges."""
    from specpilot.kernels import attention, attention_kernel
    from specpilot.kernels.workspace import shared_workspace

    B, T, H, Hkv, D, S = 2, 3, 4, 2, 16, 320
    q, k, v = operands(B, T, H, Hkv, D, S, dtype, device, seed=3)
    bias = tree_bias(B, T, H // Hkv, S, 200, dtype).to(device)
    assert attention.plan_splits(B * Hkv, 2 * T, S, SMS_OFF_GPU if device == "cpu" else 132).n_split > 1
    launched = []
    merge = attention_kernel.merge_splits_kernel
    monkeypatch.setattr(attention_kernel, "merge_splits_kernel",
                        type("Spy", (), {"__getitem__": lambda self, grid: launched.append(grid) or merge[grid]})())
    fused = [split_attention(q, k, v, bias) for _ in range(2)]
    assert not launched and torch.equal(fused[0], fused[1])
    assert not shared_workspace(q.device).counters.any()
    monkeypatch.setattr(attention, "shared_workspace",
                        lambda device: type("W", (), {"counters": torch.zeros(1, dtype=torch.int32, device=device)}))
    second = split_attention(q, k, v, bias)
    assert launched and torch.equal(second, fused[0])
    err = (second.cpu().double() - reference(q.cpu(), k.cpu(), v.cpu(), bias.cpu())).abs().max().item()
    assert err <= bound(dtype)
