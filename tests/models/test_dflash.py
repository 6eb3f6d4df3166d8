"""The DFlash network against a plain re-derivation of `z-lab/dflash`'s forward, target feature
capture, and the public checkpoint layout (round trip, detection, one-line mismatch errors)."""

import json

import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import load_file

from specpilot.models.kv_cache import KVCache
from specpilot.errors import CheckpointError
from specpilot.models.dflash import build_target_layer_ids, random_dflash
from specpilot.models.dflash_checkpoint import is_dflash_dir, load_dflash, read_dflash_config, write_dflash
from specpilot.models.loading import load_model
from specpilot.models.ops import rotate_half, rms_norm


@pytest.fixture(scope="module")
def target(target_dir):
    return load_model(target_dir)


def test_build_target_layer_ids_matches_dflash_defaults():
    assert build_target_layer_ids(36, 5) == (1, 9, 17, 25, 33)  # Qwen3-8B in SpecForge's config
    assert build_target_layer_ids(13, 5) == (1, 3, 6, 8, 10)
    assert build_target_layer_ids(3, 1) == (1,)


def test_capture_returns_layer_outputs(target):
    T = 9
    tokens = torch.randint(1, 4096, (2, T), generator=torch.Generator().manual_seed(0))
    pos = torch.arange(T).expand(2, T)
    cache = KVCache.allocate(target.config, 2, 16, "cpu", torch.float32)
    causal = (torch.arange(16)[None, :] <= torch.arange(T)[:, None])[None, None].expand(2, 1, T, 16)
    with torch.no_grad():
        logits, feats = target(tokens, pos, cache, pos, causal, capture=(0, 2))
        plain = target(tokens, pos, cache, pos, causal)
        # reference: the residual stream after layers 0 and 2 (the last one final-normed, as HF)
        cos, sin = target._rope(pos, torch.float32)
        h, outs = target.embed_tokens(tokens), []
        for layer in target.layers:
            h = h + layer.self_attn.forward_causal(layer.input_layernorm(h), cos, sin)
            h = h + layer.mlp(layer.post_attention_layernorm(h))
            outs.append(h)
    assert torch.equal(logits, plain)
    C = target.config.hidden_size
    assert feats.shape == (2, T, 2 * C)
    assert (feats[..., :C] - outs[0]).abs().max() < 1e-4
    assert (feats[..., C:] - target.norm(outs[2])).abs().max() < 1e-4


def reference_block(model, lm_head, features, noise, ctx_pos, block_pos):
    """z-lab's DFlashDraftModel.forward written out: no cache, [ctx ; block] keys, non-causal."""
    c = model.config
    H, Hkv, D = c.num_heads, c.num_kv_heads, c.head_dim
    ctx = model.hidden_norm(model.fc(features))
    pos = torch.cat([ctx_pos, block_pos], 1)
    cos, sin = model.rope_cos[pos][:, None], model.rope_sin[pos][:, None]  # [B,1,S,D]
    h = noise
    B, T, _ = h.shape
    for layer in model.layers:
        a = layer.self_attn
        wq, wk, wv = a.qkv_proj.weight.split([H * D, Hkv * D, Hkv * D])
        x = layer.input_layernorm(h)
        q = rms_norm((x @ wq.T).view(B, T, H, D), a.q_norm.weight, c.rms_norm_eps).transpose(1, 2)
        kx = torch.cat([ctx @ wk.T, x @ wk.T], 1).view(B, -1, Hkv, D)
        v = torch.cat([ctx @ wv.T, x @ wv.T], 1).view(B, -1, Hkv, D).transpose(1, 2)
        k = rms_norm(kx, a.k_norm.weight, c.rms_norm_eps).transpose(1, 2)
        q = q * cos[:, :, -T:] + rotate_half(q) * sin[:, :, -T:]
        k = k * cos + rotate_half(k) * sin
        k, v = k.repeat_interleave(H // Hkv, 1), v.repeat_interleave(H // Hkv, 1)
        o = F.scaled_dot_product_attention(q, k, v)  # non-causal
        h = h + a.o_proj(o.transpose(1, 2).reshape(B, T, H * D))
        h = h + layer.mlp(layer.post_attention_layernorm(h))
    return lm_head(model.norm(h))


def test_block_forward_matches_reference(target):
    model = random_dflash(target.config, num_layers=2, block_size=6, seed=1)
    B, Tc, T = 2, 11, 6
    C = target.config.hidden_size
    g = torch.Generator().manual_seed(2)
    features = torch.randn(B, Tc, len(model.feature_layers) * C, generator=g)
    noise = torch.randn(B, T, C, generator=g)
    ctx_pos = torch.arange(Tc).expand(B, Tc)
    block_pos = Tc + torch.arange(T).expand(B, T)
    cache = KVCache.allocate(model.config, B, 32, "cpu", torch.float32)
    with torch.no_grad():
        rows = torch.arange(B)[:, None].expand(B, Tc)
        for i, (k, v) in enumerate(model.context_kv(features, ctx_pos)):
            cache.k[i][rows, :, ctx_pos], cache.v[i][rows, :, ctx_pos] = k, v
        visible = (torch.arange(32) < Tc + T)[None, None, None].expand(B, 1, T, 32)
        ours = target.lm_head(model.block_forward(noise, block_pos, cache, block_pos, visible))
        ref = reference_block(model, target.lm_head, features, noise, ctx_pos, block_pos)
    assert (ours - ref).abs().max() < 1e-4


def test_public_layout_round_trip(target, tmp_path):
    model = random_dflash(target.config, num_layers=2, block_size=16, mask_token_id=7, seed=4)
    write_dflash(model, tmp_path / "d", dtype=torch.float32)
    cfg = json.loads((tmp_path / "d" / "config.json").read_text())
    assert cfg["architectures"] == ["DFlashDraftModel"] and cfg["block_size"] == 16
    assert cfg["dflash_config"] == {"target_layer_ids": list(model.feature_layers), "mask_token_id": 7}
    names = set(load_file(str(tmp_path / "d" / "model.safetensors")))
    assert {"fc.weight", "hidden_norm.weight", "norm.weight", "layers.1.self_attn.q_proj.weight",
            "layers.0.mlp.gate_proj.weight", "layers.0.self_attn.k_norm.weight"} <= names
    assert "mask_embedding" not in names  # a mask token: the target's embedding of it
    assert is_dflash_dir(tmp_path / "d")
    loaded = load_dflash(tmp_path / "d", target)
    for (name, a), (_, b) in zip(model.state_dict().items(), loaded.state_dict().items()):
        if name != "mask_embedding":
            assert torch.equal(a, b), name
    assert torch.equal(loaded.mask_embedding, target.embed_tokens.weight[7])


def test_learned_mask_and_hf_prefix_and_defaults(target, tmp_path):
    model = random_dflash(target.config, num_layers=1, seed=5)
    write_dflash(model, tmp_path / "d", dtype=torch.float32)
    assert torch.equal(load_dflash(tmp_path / "d", target).mask_embedding, model.mask_embedding)
    # an export without dflash_config.target_layer_ids: the default from num_target_layers
    cfg = json.loads((tmp_path / "d" / "config.json").read_text())
    del cfg["dflash_config"]["target_layer_ids"]
    (tmp_path / "d" / "config.json").write_text(json.dumps(cfg))
    assert read_dflash_config(tmp_path / "d")[1].target_layer_ids == build_target_layer_ids(3, 1)


@pytest.mark.parametrize("change,message", [
    (dict(hidden_size=32), "hidden_size 32 != target hidden_size 64"),
    (dict(vocab_size=100), "vocab_size 100 != target vocab_size 4096"),
    (dict(dflash_config={"target_layer_ids": [0, 5], "mask_token_id": 1}), "outside the target's 3 layers"),
])
def test_mismatched_target_is_one_line(target, tmp_path, change, message):
    write_dflash(random_dflash(target.config, num_layers=1, mask_token_id=1), tmp_path / "d", dtype=torch.float32)
    cfg = json.loads((tmp_path / "d" / "config.json").read_text())
    cfg.update(change)
    (tmp_path / "d" / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(CheckpointError, match=message) as err:
        load_dflash(tmp_path / "d", target)
    assert "\n" not in str(err.value)


def test_missing_tensor_and_plain_model_dir(target, target_dir, tmp_path):
    assert not is_dflash_dir(target_dir)
    model = random_dflash(target.config, num_layers=1, mask_token_id=1)
    write_dflash(model, tmp_path / "d", dtype=torch.float32)
    from safetensors.torch import save_file

    tensors = load_file(str(tmp_path / "d" / "model.safetensors"))
    del tensors["fc.weight"]
    save_file(tensors, str(tmp_path / "d" / "model.safetensors"))
    with pytest.raises(CheckpointError, match="fc.weight is missing"):
        load_dflash(tmp_path / "d", target)


def test_dense_training_forward_equals_cached_block_forward(target):
    """Two blocks side by side in the training forward see what each sees alone at inference."""
    model = random_dflash(target.config, num_layers=2, block_size=4, seed=6)
    C, T, S = target.config.hidden_size, 4, 10
    g = torch.Generator().manual_seed(3)
    features = torch.randn(1, S, len(model.feature_layers) * C, generator=g)
    noise = torch.randn(1, 2 * T, C, generator=g)
    anchors = [3, 6]
    positions = torch.tensor([[a + k for a in anchors for k in range(T)]])
    q_anchor = torch.tensor([a for a in anchors for _ in range(T)])
    block_id = torch.arange(2 * T) // T
    ctx_ok = torch.arange(S)[None, :] < q_anchor[:, None]
    mask = torch.cat([ctx_ok, block_id[:, None] == block_id[None, :]], 1)[None, None]
    with torch.no_grad():
        dense = model.forward_dense(features, torch.arange(S)[None], noise, positions, mask)
        for b, a in enumerate(anchors):
            cache = KVCache.allocate(model.config, 1, 32, "cpu", torch.float32)
            ctx_pos = torch.arange(a)[None]
            for i, (k, v) in enumerate(model.context_kv(features[:, :a], ctx_pos)):
                cache.k[i][0, :, :a], cache.v[i][0, :, :a] = k[0].transpose(0, 1), v[0].transpose(0, 1)
            pos = positions[:, b * T : (b + 1) * T]
            visible = (torch.arange(32) < a + T)[None, None, None].expand(1, 1, T, 32)
            cached = model.block_forward(noise[:, b * T : (b + 1) * T], pos, cache, pos, visible)
            assert (dense[:, b * T : (b + 1) * T] - cached).abs().max() < 1e-4


def test_expanded_drafter_drafts_what_the_small_one_does(target):
    """x2 drafter beside the x2 target: the same block distributions (float32 rounding only)."""
    from specpilot.config import TreeConstruction
    from specpilot.engine.drafters.dflash import DFlashDrafter
    from specpilot.engine.state import DecodeState
    from specpilot.engine.steps import prefill
    from specpilot.models.dflash import expand_dflash
    from specpilot.models.expand import expand

    small = random_dflash(target.config, num_layers=2, block_size=5, seed=8)
    wide_target, wide = expand(target, 2), expand_dflash(small, 2)
    seq = torch.randint(1, 4096, (13,), generator=torch.Generator().manual_seed(4)).tolist()
    out = []
    for t, d in ((target, small), (wide_target, wide)):
        state = DecodeState.allocate(1, 32, 8, "cpu")
        state.reset([seq], (), 10)
        cache = KVCache.allocate(t.config, 1, 32, "cpu", torch.float32)
        drafter = DFlashDrafter(d, t, 5, 4, TreeConstruction.CHAIN)
        with torch.inference_mode():
            drafter.start([seq], state, prefill(t, cache, [seq], capture=d.feature_layers))
            out.append(drafter.block_logprobs(state))
    assert (out[0] - out[1]).abs().max() < 1e-4
