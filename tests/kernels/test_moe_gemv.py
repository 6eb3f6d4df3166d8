"""Pair-wise MoE expert kernels (`kernels/moe_gemv.py`): against the pure-torch reference over odd
sizes and k in {1, 2, 8}; batch invariance (a token's output bit for bit the same at any number of
pairs, in any slot order); `Experts.forward`'s dispatch; a tiny MoE decoder's greedy tokens through
the kernels, AR and speculative.

Bounds (float32 arithmetic in another order than torch's):
- float32: |out - ref| <= 1e-5 max |ref|: sums of at most 64 products per projection in another
  order (2^-24 each), through a SiLU and a second projection (measured under the interpreter: <= 6.2e-7;
  BF16: 0, the same roundings as torch's at these shapes).
- BF16: |out - ref| <= 2^-6 max |ref|: a projection's float32 sum may round to the other BF16
  neighbour than torch's (one BF16 ulp, 2^-8 relative), carried through the SiLU, the down
  projection and the sum.
"""

import pytest
import torch

from specpilot.engine.drafters.draft_model import DraftModelDrafter
from specpilot.engine.generator import Generator
from specpilot.kernels import moe_gemv as K
from specpilot.models.moe import MoETransformer, SparseMoE
from specpilot.models.random_checkpoint import random_model, tiny_config

# (T, k, C, I, E): C and I not multiples of any block, besides even ones
SHAPES = [(1, 1, 33, 17, 3), (3, 2, 33, 17, 5), (1, 8, 40, 24, 11), (3, 8, 24, 20, 9), (3, 2, 64, 32, 4)]
REL = {torch.float32: 1e-5, torch.bfloat16: 2.0**-6}


def experts(E: int, C: int, I: int, dtype, device, seed: int = 0):
    """gate_up_proj [E,2I,C], down_proj [E,C,I] with N(0, 1/fan_in) weights."""
    g = torch.Generator().manual_seed(seed)
    gate_up = torch.randn(E, 2 * I, C, generator=g) / C**0.5
    down = torch.randn(E, C, I, generator=g) / I**0.5
    return gate_up.to(device=device, dtype=dtype), down.to(device=device, dtype=dtype)


def routing(T: int, k: int, E: int, dtype, device, seed: int = 1):
    """x-independent routing: k distinct experts per token in random slot order, weights in (0, 1)."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.stack([torch.randperm(E, generator=g)[:k] for _ in range(T)])
    weights = torch.rand(T, k, generator=g) + 0.05
    return weights.to(device=device, dtype=dtype), ids.to(device)


def inputs(T, k, C, I, E, dtype, device, seed=0):
    x = torch.randn(T, C, generator=torch.Generator().manual_seed(seed + 7)).to(device=device, dtype=dtype)
    return (x, *routing(T, k, E, dtype, device, seed + 1), *experts(E, C, I, dtype, device, seed))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "T{}k{}C{}I{}E{}".format(*s))
def test_the_kernels_match_the_reference(shape, dtype, device):
    x, weights, ids, gate_up, down = inputs(*shape, dtype, device)
    out = K.moe_experts(x, weights, ids, gate_up, down)
    ref = K.reference(x.cpu(), weights.cpu(), ids.cpu(), gate_up.cpu(), down.cpu())
    assert out.dtype == dtype and out.shape == x.shape
    err = (out.cpu().float() - ref.float()).abs().max()
    assert err <= REL[dtype] * ref.float().abs().max(), f"{err} vs max {ref.abs().max()}"


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_tokens_output_does_not_depend_on_the_other_pairs_or_the_slot_order(dtype, device):
    """Batch invariance: each token alone (T=1, a decode step) gives bit for bit its row of a
    T=5 call (a verify), and reordering a token's slots (ids with their weights) changes nothing."""
    T, k, C, I, E = 5, 8, 40, 24, 16
    x, weights, ids, gate_up, down = inputs(T, k, C, I, E, dtype, device, seed=3)
    ids[3] = ids[1]  # two tokens on the same experts: their pairs read the same rows side by side
    out = K.moe_experts(x, weights, ids, gate_up, down)
    for t in range(T):
        alone = K.moe_experts(x[t:t + 1], weights[t:t + 1], ids[t:t + 1], gate_up, down)
        assert torch.equal(alone.view(-1).view(torch.int16 if dtype != torch.float32 else torch.int32),
                           out[t].view(torch.int16 if dtype != torch.float32 else torch.int32)), t
    perm = torch.stack([torch.randperm(k, generator=torch.Generator().manual_seed(t)) for t in range(T)]).to(device)
    shuffled = K.moe_experts(x, weights.gather(1, perm), ids.gather(1, perm), gate_up, down)
    assert torch.equal(shuffled, out)


def test_the_sum_takes_the_experts_in_increasing_order(device):
    """float32 sums in the reference's order: the kernel equals `Experts.forward`'s ordered sum of
    its own pair outputs bit for bit (pairs computed one token-slot at a time)."""
    T, k, C, I, E = 2, 8, 24, 20, 12
    x, weights, ids, gate_up, down = inputs(T, k, C, I, E, torch.float32, device, seed=5)
    out = K.moe_experts(x, weights, ids, gate_up, down)
    sorted_ids, perm = ids.sort(dim=-1)
    sorted_w = weights.gather(1, perm)
    want = torch.zeros_like(x)
    for j in range(k):  # each pair by itself through the kernels: one slot, weight w
        pair = K.moe_experts(x, sorted_w[:, j:j + 1], sorted_ids[:, j:j + 1], gate_up, down)
        want = want + pair
    assert torch.equal(out, want)


def test_shapes_it_cannot_run_are_refused_with_the_shapes(device):
    x, weights, ids, gate_up, down = inputs(2, 2, 16, 8, 4, torch.float32, device)
    with pytest.raises(ValueError, match="moe_experts"):
        K.moe_experts(x, weights, ids.int(), gate_up, down)
    with pytest.raises(ValueError, match="moe_experts"):
        K.moe_experts(x, weights.bfloat16(), ids, gate_up, down)
    with pytest.raises(ValueError, match="moe_experts"):
        K.moe_experts(x, weights, ids, gate_up, down[:, :, :4])
    with pytest.raises(ValueError, match="moe_experts"):
        K.moe_experts(x, weights[:1], ids[:1], gate_up, down)


def test_without_the_kernels_the_fallback_is_the_reference(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    args = inputs(3, 2, 16, 8, 4, torch.float32, "cpu")
    assert not K.applies(args[0], args[3], 6)
    assert torch.equal(K.moe_experts(*args), K.reference(*args))


def test_the_op_passes_opcheck(device):
    args = inputs(2, 2, 16, 8, 4, torch.float32, device)
    torch.library.opcheck(torch.ops.specpilot.moe_experts.default, args)


# ---- the layer and a decoder ---------------------------------------------------------------------

def sparse_layer(E: int, k: int, I: int, dtype=torch.float32) -> SparseMoE:
    cfg = tiny_config("qwen3_moe", hidden_size=24, num_experts=E, num_experts_per_tok=k, moe_intermediate_size=I)
    torch.manual_seed(0)
    moe = SparseMoE(cfg)
    for p in moe.parameters():
        torch.nn.init.normal_(p, std=0.3)
    return moe.to(dtype)


def test_experts_forward_runs_the_kernels_up_to_max_pairs_and_gives_the_per_expert_loop(device, monkeypatch):
    moe = sparse_layer(E=8, k=3, I=20).to(device)
    calls = []
    real = K.moe_experts_eager
    monkeypatch.setattr(K, "moe_experts_eager", lambda *a, **kw: calls.append(a[0].shape[0]) or real(*a, **kw))
    for T in (1, 5, K.MAX_PAIRS // 3 + 1):
        x = torch.randn(T, 24, device=device)
        weights, ids = moe.route(x)
        via = moe.experts(x, weights, ids)
        loop = moe.experts(x, weights, ids, kernel=False, grouped=False, masked=False)
        torch.testing.assert_close(via, loop, rtol=1e-5, atol=1e-6)
    assert calls == [1, 5]  # 22 tokens x 3 = 66 pairs > MAX_PAIRS: the per-expert loop
    x = torch.randn(2, 24, device=device)
    weights, ids = moe.route(x)
    calls.clear()
    moe.experts(x, weights, ids, act=lambda gu: gu.chunk(2, -1)[1])  # not the SwiGLU: never the kernels
    assert calls == []


def moe_decoder(num_layers: int, seed: int = 0) -> MoETransformer:
    """A tiny float32 Qwen3-MoE decoder (8 experts of 32, top 2, a dense first layer) with random
    weights (`random_model`), the router's sharper, so that routing and logits do not tie."""
    cfg = tiny_config("qwen3_moe", num_layers=num_layers, num_experts=8, num_experts_per_tok=2,
                      moe_intermediate_size=32, mlp_only_layers=(0,))
    return random_model(cfg, seed, router_scale=4.0).eval()


def test_a_moe_decoder_decodes_the_same_tokens_through_the_kernels_ar_and_speculative(device, monkeypatch):
    """Greedy tokens through the kernels (decode steps and verifies: <= MAX_PAIRS pairs; prefill
    takes the loop) equal those of the per-expert loop everywhere, and speculation equals AR."""
    target = moe_decoder(3).to(device)
    draft = moe_decoder(2).to(device)  # the target's first two layers, embeddings and head
    draft.load_state_dict({n: v for n, v in target.state_dict().items() if not n.startswith("layers.2.")})
    prompts = [[5, 17, 300, 2, 9, 44], [7]]
    new = 6
    # one row block per pair (the interpreter's cost is per program); any blocking fixed by (C, I) is batch invariant
    monkeypatch.setattr(K, "blocking", lambda C, I: K.Blocking(64, 64, 64, 64, 64))
    calls = []
    real = K.moe_experts_eager
    monkeypatch.setattr(K, "moe_experts_eager", lambda *a, **kw: calls.append(a[0].shape[0]) or real(*a, **kw))
    ar = Generator(target, cuda_graphs=False).generate(prompts, new, stop_at_eos=False).outputs
    spec = Generator(target, {3: DraftModelDrafter(draft, 3, 2, 5)}, cuda_graphs=False).generate(
        prompts, new, stop_at_eos=False).outputs
    assert calls and max(calls) > 1  # decode steps (1 token per row) and verifies (several)
    monkeypatch.setattr(K, "MAX_PAIRS", 0)  # the per-expert loop only
    calls.clear()
    loop = Generator(target, cuda_graphs=False).generate(prompts, new, stop_at_eos=False).outputs
    assert calls == []
    assert ar == loop and spec == ar


@pytest.mark.gpu
def test_on_the_gpu_a_tree_of_pairs_is_the_decode_step_bit_for_bit_at_a_qwen3_moe_layer():
    """Compiled (FMA contraction and all), BF16, C=2048, I=768, E=128, k=8: 8 tokens at once equal
    each token alone."""
    x, weights, ids, gate_up, down = inputs(8, 8, 2048, 768, 128, torch.bfloat16, "cuda")
    out = K.moe_experts(x, weights, ids, gate_up, down)
    for t in range(8):
        assert torch.equal(K.moe_experts(x[t:t + 1], weights[t:t + 1], ids[t:t + 1], gate_up, down)[0], out[t])
    ref = K.reference(x, weights, ids, gate_up, down)
    assert (out.float() - ref.float()).abs().max() <= REL[torch.bfloat16] * ref.float().abs().max()
