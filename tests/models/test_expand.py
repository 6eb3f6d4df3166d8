"""Exact width expansion: same function, bit-exact weight copies, GQA layout, loading paths.

Logit bound. Expansion changes only summation length and order (f·C terms instead of C, a mean
over f·C squares in RMSNorm), so in float32 the logits differ by accumulated rounding: each dot
product of length n carries ~sqrt(n)·2^-24 relative error, compounded over a few layers. We assert
max|Δlogits| <= 2^-16 · max|logits| (256 float32 ulps at the logit scale); measured differences
are ~2^-20 of the scale. Greedy tokens must be identical: the random checkpoints spread their
logits over several units, so no near-tie can be flipped by that rounding.
"""

from __future__ import annotations

import pytest
import torch

from specpilot.engine.drafters.draft_model import DraftModelDrafter
from specpilot.engine.generator import Generator
from specpilot.errors import CheckpointError
from specpilot.models.expand import ModelSize, expand, expand_state, expanded_config, load_expanded
from specpilot.models.loading import load_model, save_model
from specpilot.models.random_checkpoint import tiny_config, write_random_checkpoint, write_truncated_drafter

LOGIT_BOUND = 2.0**-16

CONFIGS = {
    "qwen3-gqa": tiny_config("qwen3"),
    "qwen3-gqa-tied": tiny_config("qwen3", tie_word_embeddings=True),
    "qwen3-mha": tiny_config("qwen3", num_kv_heads=4),
    "llama-gqa": tiny_config("llama"),
}
PROMPTS = [[5, 17, 300, 42, 9], [1000, 7, 7, 7], [3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5]]


@pytest.fixture(scope="module", params=list(CONFIGS))
def checkpoint(request, tmp_path_factory):
    return write_random_checkpoint(tmp_path_factory.mktemp(request.param), CONFIGS[request.param], seed=3)


def logits_of(model, tokens: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return model.forward_causal(tokens)


@pytest.mark.parametrize("factor", [2, 4])
def test_expanded_logits_match(checkpoint, factor):
    model = load_model(checkpoint)
    wide = expand(model, factor)
    tokens = torch.randint(0, model.config.vocab_size, (2, 48), generator=torch.Generator().manual_seed(0))
    a, b = logits_of(model, tokens), logits_of(wide, tokens)
    assert (a - b).abs().max() <= LOGIT_BOUND * a.abs().max()
    assert torch.equal(a.argmax(-1), b.argmax(-1))


@pytest.mark.parametrize("factor", [2, 4])
def test_expanded_greedy_tokens_match(checkpoint, factor):
    model = load_model(checkpoint)
    wide = load_expanded(checkpoint, factor)
    want = Generator(model, cuda_graphs=False).generate(PROMPTS, 24).outputs
    got = Generator(wide, cuda_graphs=False).generate(PROMPTS, 24).outputs
    assert got == want


def test_expanded_target_and_drafter_decode_like_the_original(tmp_path):
    target_dir = write_random_checkpoint(tmp_path / "t", tiny_config("qwen3", num_layers=4), seed=5)
    drafter_dir = write_truncated_drafter(target_dir, tmp_path / "d", num_layers=2)
    want = Generator(load_model(target_dir), cuda_graphs=False).generate(PROMPTS, 20).outputs
    target, drafter = load_expanded(target_dir, 4), load_expanded(drafter_dir, 2)
    spec = Generator(target, {3: DraftModelDrafter(drafter, depth=3, topk=2, tree_budget=5)}, cuda_graphs=False)
    result = spec.generate(PROMPTS, 20)
    assert result.outputs == want
    assert result.mean_accepted_length > 1.0  # the truncated drafter is accepted sometimes


def test_weights_are_exact_scaled_copies(checkpoint):
    """Copy-major blocks: producers copied as is, consumers w / f in every block, bit for bit."""
    model = load_model(checkpoint)
    c = model.config
    f = 4
    _, wide = expand_state(c, model.state_dict(), f)
    C, I, D, H, Hkv = c.hidden_size, c.intermediate_size, c.head_dim, c.num_heads, c.num_kv_heads
    embed = model.state_dict()["embed_tokens.weight"]
    for j in range(f):
        assert torch.equal(wide["embed_tokens.weight"][:, j * C : (j + 1) * C], embed)
        assert torch.equal(wide["lm_head.weight"][:, j * C : (j + 1) * C] * f, model.lm_head.weight)
        assert torch.equal(wide["norm.weight"][j * C : (j + 1) * C], model.norm.weight)
    w = model.layers[0].self_attn.qkv_proj.weight  # [(H + 2Hkv)D, C]
    ww = wide["layers.0.self_attn.qkv_proj.weight"]  # [f(H + 2Hkv)D, fC]
    q, k, v = w.split([H * D, Hkv * D, Hkv * D])
    wq, wk, wv = ww.split([f * H * D, f * Hkv * D, f * Hkv * D])
    for small, big in ((q, wq), (k, wk), (v, wv)):
        R = small.shape[0]
        for j in range(f):
            for i in range(f):
                assert torch.equal(big[j * R : (j + 1) * R, i * C : (i + 1) * C] * f, small)
    down = model.layers[0].mlp.down_proj.weight  # [C, I]
    for j in range(f):
        for i in range(f):
            block = wide["layers.0.mlp.down_proj.weight"][j * C : (j + 1) * C, i * I : (i + 1) * I]
            assert torch.equal(block * f, down)
    if c.qk_norm:
        assert torch.equal(wide["layers.0.self_attn.q_norm.weight"], model.layers[0].self_attn.q_norm.weight)


def test_gqa_mapping_is_kept():
    """Expanded query head j·H + h must read copy j of kv head h // G: its attention output equals
    head h's. Checked on the per-head attention outputs of layer 0."""
    config = tiny_config("qwen3", num_heads=4, num_kv_heads=2, num_layers=1)
    from specpilot.models.random_checkpoint import random_model

    model = random_model(config, seed=1).eval()
    f = 2
    wide = expand(model, f)
    x = torch.randn(1, 6, config.hidden_size, generator=torch.Generator().manual_seed(2))
    xw = x.repeat(1, 1, f)  # the widened residual stream: f copies of the features
    cos, sin = model._rope(torch.arange(6)[None], x.dtype)
    heads = []
    for m, inp in ((model, x), (wide, xw)):
        attn = m.layers[0].self_attn
        q, k, v = attn.project(inp, cos, sin)
        G = attn.config.num_heads // attn.config.num_kv_heads
        k, v = k.repeat_interleave(G, dim=2), v.repeat_interleave(G, dim=2)
        o = torch.nn.functional.scaled_dot_product_attention(
            q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True
        )  # [1,H,T,D]
        heads.append(o[0])
    small, big = heads
    H = config.num_heads
    for j in range(f):
        torch.testing.assert_close(big[j * H : (j + 1) * H], small, rtol=0, atol=1e-6)


def test_config_and_sizes():
    c = tiny_config("qwen3", tie_word_embeddings=True)
    w = expanded_config(c, 4)
    assert (w.hidden_size, w.intermediate_size, w.num_heads, w.num_kv_heads, w.head_dim) == (
        4 * c.hidden_size, 4 * c.intermediate_size, 4 * c.num_heads, 4 * c.num_kv_heads, c.head_dim)
    assert not w.tie_word_embeddings
    embed = c.vocab_size * c.hidden_size
    blocks = c.num_params - embed - c.hidden_size  # tied: one table; final norm counted apart
    layer_norms = c.num_layers * (2 * c.hidden_size + 2 * c.head_dim)
    matrices = blocks - layer_norms
    expected = 16 * matrices + c.num_layers * (2 * 4 * c.hidden_size + 2 * c.head_dim) + 2 * 4 * embed + 4 * c.hidden_size
    assert w.num_params == expected
    size = ModelSize.of(w)
    assert size.bytes() == 2 * w.num_params
    assert size.decode_bytes() == 2 * (w.num_params - w.vocab_size * w.hidden_size)
    assert ModelSize.of(c).decode_bytes() == ModelSize.of(c).bytes()  # tied table is lm_head too


def test_factor_one_and_bad_factors(checkpoint):
    model = load_model(checkpoint)
    assert expand(model, 1) is model
    for bad in (0, 3, 6, -2):
        with pytest.raises(CheckpointError, match="power of two"):
            expand(model, bad)


def test_expanded_checkpoint_loads_in_transformers(tmp_path):
    """The expanded config maps onto HF's: transformers computes the same logits from it."""
    transformers = pytest.importorskip("transformers")
    src = write_random_checkpoint(tmp_path / "small", tiny_config("qwen3", tie_word_embeddings=True), seed=4)
    wide = load_expanded(src, 2)
    save_model(wide, tmp_path / "wide", dtype=torch.float32)
    hf = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "wide", dtype=torch.float32).eval()
    tokens = torch.tensor([PROMPTS[2]])
    with torch.no_grad():
        ours, theirs = wide.forward_causal(tokens), hf(tokens).logits
    assert (ours - theirs).abs().max() <= LOGIT_BOUND * ours.abs().max()
