"""The EAGLE-3 head against a plain re-derivation of the public layer (SafeAILab `cnets.py`), the
target's layer-input capture, the public checkpoint layout (round trip, both layer-id
conventions, d2t/t2d, detection, one-line mismatch errors) and exact width expansion."""

import json

import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file

from specpilot.models.kv_cache import KVCache
from specpilot.errors import CheckpointError
from specpilot.models.eagle3 import default_layer_ids, expand_eagle3, random_eagle3
from specpilot.models.eagle3_checkpoint import is_eagle3_dir, load_eagle3, read_eagle3_config, to_public_state, write_eagle3
from specpilot.models.loading import load_model
from specpilot.models.ops import rms_norm, rotate_half


@pytest.fixture(scope="module")
def target(target_dir):
    return load_model(target_dir)


def draft_vocab(n: int = 1000, seed: int = 1) -> torch.Tensor:
    return torch.randperm(4096, generator=torch.Generator().manual_seed(seed))[:n].sort().values


def test_default_layer_ids_and_capture_of_layer_inputs(target):
    assert default_layer_ids(32) == (2, 16, 29) and default_layer_ids(13) == (2, 6, 10)
    head = random_eagle3(target.config)  # 3 target layers: inputs of 2, 1, 0 (the embedding)
    assert head.spec.layer_ids == (2, 1, 0) and head.feature_layers == (1, 0, -1)
    T = 7
    tokens = torch.randint(1, 4096, (2, T), generator=torch.Generator().manual_seed(0))
    pos = torch.arange(T).expand(2, T)
    cache = KVCache.allocate(target.config, 2, 16, "cpu", torch.float32)
    causal = (torch.arange(16)[None, :] <= torch.arange(T)[:, None])[None, None].expand(2, 1, T, 16)
    with torch.no_grad():
        _, feats = target(tokens, pos, cache, pos, causal, capture=head.feature_layers)
        cos, sin = target._rope(pos, torch.float32)
        h, inputs = target.embed_tokens(tokens), []
        for layer in target.layers:  # the residual stream entering each layer
            inputs.append(h)
            h = h + layer.self_attn.forward_causal(layer.input_layernorm(h), cos, sin)
            h = h + layer.mlp(layer.post_attention_layernorm(h))
    C = target.config.hidden_size
    for j, i in enumerate(head.spec.layer_ids):
        assert (feats[..., j * C : (j + 1) * C] - inputs[i]).abs().max() < 1e-4


def reference_logits(public, spec, config, emb, hidden, positions):
    """`LlamaDecoderLayeremb` + norm + lm_head written out from the public tensors, causal, no cache."""
    H, Hkv, D, eps = config.num_heads, config.num_kv_heads, config.head_dim, config.rms_norm_eps
    w = lambda n: public["midlayer." + n + ".weight"]  # noqa: E731
    B, T, _ = emb.shape
    x = torch.cat([rms_norm(emb, w("input_layernorm"), eps), rms_norm(hidden, w("hidden_norm"), eps)], -1)
    q = (x @ w("self_attn.q_proj").T).view(B, T, H, D).transpose(1, 2)
    k = (x @ w("self_attn.k_proj").T).view(B, T, Hkv, D).transpose(1, 2)
    v = (x @ w("self_attn.v_proj").T).view(B, T, Hkv, D).transpose(1, 2)
    from specpilot.models.transformer import rope_tables

    cos, sin = (t[positions][:, None] for t in rope_tables(config, 64))
    q, k = q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin
    k, v = k.repeat_interleave(H // Hkv, 1), v.repeat_interleave(H // Hkv, 1)
    o = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(B, T, H * D)
    h = hidden + o @ w("self_attn.o_proj").T
    m = rms_norm(h, w("post_attention_layernorm"), eps)
    h = h + (F.silu(m @ w("mlp.gate_proj").T) * (m @ w("mlp.up_proj").T)) @ w("mlp.down_proj").T
    return rms_norm(h, public["norm.weight"], eps) @ public["lm_head.weight"].T


def test_cached_forward_matches_reference(target):
    head = random_eagle3(target.config, draft_vocab=draft_vocab(), seed=1)
    B, T, C = 2, 9, target.config.hidden_size
    g = torch.Generator().manual_seed(2)
    features = torch.randn(B, T, 3 * C, generator=g)
    emb = torch.randn(B, T, C, generator=g)
    pos = torch.arange(T).expand(B, T)
    cache = KVCache.allocate(head.config, B, 32, "cpu", torch.float32)
    mask = (torch.arange(32)[None, :] <= torch.arange(T)[:, None])[None, None].expand(B, 1, T, 32)
    with torch.no_grad():
        hidden = head.fuse(features)
        ours = head.logits(head.forward_cached(emb, hidden, pos, cache, pos, mask))
        public = to_public_state(head)
        assert torch.equal(hidden, features @ public["fc.weight"].T)
        ref = reference_logits(public, head.spec, head.config, emb, hidden, pos)
    assert ours.shape == (B, T, 1000)
    assert (ours - ref).abs().max() < 1e-4


@pytest.mark.parametrize("reduced", [True, False])
def test_public_layout_round_trip(target, tmp_path, reduced):
    head = random_eagle3(target.config, draft_vocab=draft_vocab() if reduced else None, intermediate_size=96, seed=4)
    write_eagle3(head, tmp_path / "e", dtype=torch.float32)
    cfg = json.loads((tmp_path / "e" / "config.json").read_text())
    assert cfg["architectures"] == ["LlamaForCausalLMEagle3"] and cfg["num_hidden_layers"] == 1
    assert cfg["draft_vocab_size"] == (1000 if reduced else 4096) and cfg["vocab_size"] == 4096
    assert cfg["intermediate_size"] == 96 and "eagle_config" not in cfg  # default ids: left to the engines
    assert "target_hidden_size" not in cfg
    tensors = load_file(str(tmp_path / "e" / "model.safetensors"))
    layer = {f"midlayer.{n}.weight" for n in ("input_layernorm", "hidden_norm", "post_attention_layernorm")}
    layer |= {f"midlayer.self_attn.{n}_proj.weight" for n in "qkvo"}
    layer |= {f"midlayer.mlp.{n}_proj.weight" for n in ("gate", "up", "down")}
    assert set(tensors) == layer | {"fc.weight", "norm.weight", "lm_head.weight", "d2t", "t2d"}
    assert tensors["midlayer.self_attn.q_proj.weight"].shape == (64, 128) and tensors["fc.weight"].shape == (64, 192)
    assert tensors["d2t"].dtype == torch.int64 and tensors["t2d"].dtype == torch.bool
    assert is_eagle3_dir(tmp_path / "e")
    if not reduced:  # a full-vocabulary head may carry no map at all
        save_file({k: v for k, v in tensors.items() if k not in ("d2t", "t2d")}, str(tmp_path / "e" / "model.safetensors"))
    loaded = load_eagle3(tmp_path / "e", target)
    for (name, a), (_, b) in zip(head.state_dict().items(), loaded.state_dict().items()):
        assert torch.equal(a, b), name
    if reduced:
        ids = loaded.token_ids()
        assert torch.equal(ids, draft_vocab()) and int(loaded.t2d.sum()) == 1000 and bool(loaded.t2d[ids].all())
    else:
        assert loaded.token_ids() is None


def test_layer_id_conventions_and_aliases(target, tmp_path):
    head = random_eagle3(target.config, layer_ids=(1, 2, 2), seed=5)
    write_eagle3(head, tmp_path / "e", dtype=torch.float32)
    cfg = json.loads((tmp_path / "e" / "config.json").read_text())
    assert cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [0, 1, 1]  # SpecForge: layer outputs
    assert read_eagle3_config(tmp_path / "e", 3)[1].layer_ids == (1, 2, 2)
    del cfg["eagle_config"]
    cfg["eagle_aux_hidden_state_layer_ids"] = [0, 2, 1]  # vLLM / speculators: layer inputs
    (tmp_path / "e" / "config.json").write_text(json.dumps(cfg))
    assert read_eagle3_config(tmp_path / "e", 3)[1].layer_ids == (0, 2, 1)
    del cfg["eagle_aux_hidden_state_layer_ids"]
    (tmp_path / "e" / "config.json").write_text(json.dumps(cfg))
    assert read_eagle3_config(tmp_path / "e", 40)[1].layer_ids == (2, 20, 37)
    # `model.` prefixes and vLLM's `layers.0.` for `midlayer.` load the same tensors
    tensors = load_file(str(tmp_path / "e" / "model.safetensors"))
    renamed = {"model." + k.replace("midlayer.", "layers.0."): v for k, v in tensors.items()}
    save_file(renamed, str(tmp_path / "e" / "model.safetensors"))
    loaded = load_eagle3(tmp_path / "e", target)
    assert torch.equal(loaded.midlayer.self_attn.qkv_proj.weight, head.midlayer.self_attn.qkv_proj.weight)


def test_safeailab_pytorch_bin(target, tmp_path):
    head = random_eagle3(target.config, draft_vocab=draft_vocab(), seed=7)
    write_eagle3(head, tmp_path / "e", dtype=torch.float32)
    file = tmp_path / "e" / "model.safetensors"
    torch.save(load_file(str(file)), tmp_path / "e" / "pytorch_model.bin")
    file.unlink()
    loaded = load_eagle3(tmp_path / "e", target)
    assert torch.equal(loaded.fc.weight, head.fc.weight) and torch.equal(loaded.d2t, head.d2t)
    (tmp_path / "e" / "pytorch_model.bin").write_bytes(b"not a state dict")
    with pytest.raises(CheckpointError, match="not a readable PyTorch state dict"):
        load_eagle3(tmp_path / "e", target)


def rewrite(path, config=None, tensors=None):
    if config is not None:
        cfg = json.loads((path / "config.json").read_text())
        cfg.update(config)
        (path / "config.json").write_text(json.dumps(cfg))
    if tensors is not None:
        t = load_file(str(path / "model.safetensors"))
        tensors(t)
        save_file(t, str(path / "model.safetensors"))


def _bad_d2t(t):
    t["d2t"][3] = 5000


@pytest.mark.parametrize("config,tensors,message", [
    (dict(target_hidden_size=32), None, "target_hidden_size 32 != target hidden_size 64"),
    (dict(vocab_size=100, draft_vocab_size=100), None, "vocab_size 100 != target vocab_size 4096"),
    (dict(eagle_config={"eagle_aux_hidden_state_layer_ids": [0, 1, 4]}), None, "outside the target's 3 layers"),
    (dict(num_hidden_layers=2), None, "only one-layer EAGLE-3 heads"),
    (None, lambda t: t.pop("fc.weight"), "fc.weight is missing"),
    (None, lambda t: t.pop("d2t"), "no d2t tensor"),
    (None, _bad_d2t, "d2t maps draft ids outside the target vocabulary"),
    (None, lambda t: t["t2d"].fill_(True), "t2d does not mark exactly"),
    (dict(eagle_config={"eagle_aux_hidden_state_layer_ids": [0, 1]}), None, "fc.weight has shape"),
])
def test_mismatched_target_is_one_line(target, tmp_path, config, tensors, message):
    write_eagle3(random_eagle3(target.config, draft_vocab=draft_vocab()), tmp_path / "e", dtype=torch.float32)
    rewrite(tmp_path / "e", config, tensors)
    with pytest.raises(CheckpointError, match=message) as err:
        load_eagle3(tmp_path / "e", target)
    assert "\n" not in str(err.value)


def test_detection(target, target_dir, tmp_path):
    from specpilot.models.dflash import random_dflash
    from specpilot.models.dflash_checkpoint import write_dflash

    assert not is_eagle3_dir(target_dir) and not is_eagle3_dir(tmp_path / "missing")
    write_dflash(random_dflash(target.config, num_layers=1, mask_token_id=1), tmp_path / "d", dtype=torch.float32)
    assert not is_eagle3_dir(tmp_path / "d")


def test_own_embedding_and_missing_lm_head(target, tmp_path):
    """A head with its own `embed_tokens` keeps it; a full-vocabulary head without `lm_head`
    uses the target's (SGLang's load_lm_head_from_target)."""
    head = random_eagle3(target.config, own_embedding=True, seed=6)
    write_eagle3(head, tmp_path / "e", dtype=torch.float32)
    rewrite(tmp_path / "e", tensors=lambda t: t.pop("lm_head.weight"))
    loaded = load_eagle3(tmp_path / "e", target)
    assert torch.equal(loaded.embed_tokens.weight, head.embed_tokens.weight)
    assert torch.equal(loaded.lm_head.weight, target.lm_head.weight)


def test_expanded_head_drafts_what_the_small_one_does(target):
    """x2 head beside the x2 target: the same root and frontier distributions (float32 rounding only)."""
    from specpilot.engine.drafters.eagle3 import Eagle3Drafter
    from specpilot.engine.state import DecodeState
    from specpilot.engine.steps import prefill
    from specpilot.models.expand import expand

    small = random_eagle3(target.config, draft_vocab=draft_vocab(), own_embedding=True, seed=8)
    wide_target, wide = expand(target, 2), expand_eagle3(small, 2)
    assert wide.config.hidden_size == 128 and wide.spec.target_hidden_size == 128
    seq = torch.randint(1, 4096, (13,), generator=torch.Generator().manual_seed(4)).tolist()
    out = []
    for t, h in ((target, small), (wide_target, wide)):
        state = DecodeState.allocate(1, 64, 8, "cpu")
        state.reset([seq], (), 10)
        cache = KVCache.allocate(t.config, 1, 64, "cpu", torch.float32)
        drafter = Eagle3Drafter(h, t, 3, 2, 6)
        with torch.inference_mode():
            drafter.start([seq], state, prefill(t, cache, [seq], capture=h.feature_layers))
            root = torch.log_softmax(h.logits(drafter.cache.root_hidden), -1)
            tree = drafter.propose(state)
            # two depth-1 nodes fed the root hidden, at position 12 in slots 12 and 13 (tree region)
            s = torch.arange(64)
            mask = ((s < 12)[None, :] | (s[None, :] == torch.tensor([[12], [13]])))[None, None]
            frontier = h.forward_cached(drafter.embed(torch.tensor([[5, 9]])),
                                        drafter.cache.root_hidden[:, None].expand(1, 2, -1), torch.full((1, 2), 12),
                                        drafter.cache.kv, torch.tensor([[12, 13]]), mask)
        out.append((root, tree.tokens, torch.log_softmax(h.logits(frontier), -1)))
    assert (out[0][0] - out[1][0]).abs().max() < 1e-4
    assert torch.equal(out[0][1], out[1][1])
    assert (out[0][2] - out[1][2]).abs().max() < 1e-4
