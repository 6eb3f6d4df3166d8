"""The Gemma-3 and Gemma-4 text decoders equal transformers on checkpoints transformers saved (CPU
float32): whole-sequence logits, the cached chunk forward, and a tree verification whose paths run
past the sliding window; Gemma-4's variants (per-layer inputs, wider global heads, KV-shared
layers, values from keys, double-wide MLPs); the multimodal wrappers' text models; what we save
loads in transformers; unsupported variants are refused with one line.

transformers is a test-only dependency; the runtime never imports it.
"""

import json

import pytest
import torch

from specpilot.engine.steps import chunk_forward, tree_forward
from specpilot.engine.tree import DraftTree
from specpilot.errors import CheckpointError
from specpilot.models.config import ModelConfig
from specpilot.models.gemma import GemmaCache, GemmaTransformer
from specpilot.models.loading import load_model, save_model
from specpilot.models.random_checkpoint import copy_tokenizer
from specpilot.models.transformer import Transformer

transformers = pytest.importorskip("transformers")

SLIDING, FULL = "sliding_attention", "full_attention"
WINDOW = 8  # well below the sequences below, so every sliding layer drops keys
COMMON = dict(vocab_size=4096, hidden_size=64, intermediate_size=128, num_attention_heads=4, num_key_value_heads=2,
              head_dim=16, sliding_window=WINDOW, max_position_embeddings=512, eos_token_id=0, bos_token_id=1,
              pad_token_id=0)
VARIANTS = {
    # query_pre_attn_scalar off head_dim, linear RoPE scaling on the global layer, soft-capped logits;
    # attn_logit_softcapping is set but transformers' Gemma-3 attention reads nothing of it
    "gemma3": dict(num_hidden_layers=4, layer_types=[SLIDING, SLIDING, FULL, SLIDING], query_pre_attn_scalar=24,
                   final_logit_softcapping=30.0, attn_logit_softcapping=50.0,
                   rope_parameters={FULL: {"rope_type": "linear", "factor": 4.0, "rope_theta": 1e6},
                                    SLIDING: {"rope_type": "default", "rope_theta": 1e4}}),
    # transformers' defaults at small size: per-layer inputs, global heads twice as wide, proportional RoPE
    "gemma4": dict(num_hidden_layers=4, layer_types=[SLIDING, SLIDING, FULL, FULL], hidden_size_per_layer_input=8,
                   vocab_size_per_layer_input=4096, global_head_dim=32, final_logit_softcapping=30.0),
    # the last two layers reuse layers 2 and 3's K/V (and have double-wide MLPs); global layers take
    # values from their keys, with one K/V head
    "gemma4_shared": dict(num_hidden_layers=6, layer_types=[SLIDING, SLIDING, FULL, SLIDING, SLIDING, FULL],
                          hidden_size_per_layer_input=0, global_head_dim=32, num_kv_shared_layers=2,
                          attention_k_eq_v=True, num_global_key_value_heads=1, use_double_wide_mlp=True),
}


def hf_model(variant: str, seed: int = 0, **change):
    """A tiny random transformers model of `variant` (its config fields `change`d), its weights spread
    so that logits do not tie: norms off their init, projections ~1/sqrt(fan_in), unit embeddings, a
    larger untied head, layer scalars off 1."""
    fields = {**COMMON, **VARIANTS[variant], **change}
    if variant == "gemma3":
        model = transformers.Gemma3ForCausalLM(transformers.Gemma3TextConfig(**fields))
    else:
        model = transformers.Gemma4ForCausalLM(transformers.Gemma4TextConfig(**fields))
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.add_(0.2 * torch.randn(p.shape, generator=g))
            elif "embed" in name:
                p.copy_(torch.randn(p.shape, generator=g))
            elif name == "lm_head.weight":
                p.copy_(torch.randn(p.shape, generator=g) * 3 / p.shape[1] ** 0.5)
            else:
                p.copy_(torch.randn(p.shape, generator=g) / p.shape[-1] ** 0.5)
        for name, b in model.named_buffers():
            if name.endswith("layer_scalar"):
                b.copy_(torch.empty(b.shape).uniform_(0.6, 1.4, generator=g))
    return model.eval()


def hf_checkpoint(path, variant: str, seed: int = 0, **change):
    """`hf_model` saved by transformers (with the shipped test tokenizer); returns the model."""
    model = hf_model(variant, seed, **change)
    model.save_pretrained(path)
    copy_tokenizer(path)
    return model


def path_logits(hf, prefix: torch.Tensor, tree: DraftTree) -> torch.Tensor:
    """transformers' logits [N,V] at each node of a one-row tree, over the prefix and its root path."""
    out = []
    for j in range(tree.num_nodes):
        path, k = [], j
        while k >= 0:
            path.append(k)
            k = int(tree.parents[0, k])
        with torch.no_grad():
            out.append(hf(torch.cat([prefix, tree.tokens[0, path[::-1]]])[None]).logits[0, -1])
    return torch.stack(out)


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_logits_match_transformers(tmp_path, variant):
    hf = hf_checkpoint(tmp_path / "m", variant)
    ours = load_model(tmp_path / "m")
    assert isinstance(ours, GemmaTransformer) and ours.config.family == variant[:6]
    assert ours.config.sliding_window == WINDOW and ours.config.num_params == sum(p.numel() for p in ours.parameters())
    tokens = torch.randint(0, 4096, (2, 40), generator=torch.Generator().manual_seed(1))
    last = ours.config.num_layers - 1
    with torch.no_grad():
        out = hf(tokens, output_hidden_states=True)
        ref = out.logits
        causal = ours.forward_causal(tokens)
        cached, features = chunk_forward(ours, ours.new_cache(2, 64), tokens, torch.zeros(2, dtype=torch.long),
                                         capture=(-1, 1, last))
    scale = ref.abs().max()
    # the same float32 math; attention over 64 cache slots instead of 40 sums in another order
    assert (causal - ref).abs().max() <= 1e-5 * scale
    assert (cached - ref).abs().max() <= 1e-5 * scale
    want = torch.cat([out.hidden_states[i + 1] for i in (-1, 1, last)], dim=-1)  # the last one final-normed
    assert (features - want).abs().max() <= 1e-5 * want.abs().max()


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_tree_nodes_see_their_own_path_through_the_window(tmp_path, variant):
    """A 12-node tree 7 deep after 15 committed tokens: each node's sliding layers keep the last
    WINDOW positions of its own path (its ancestors, not its siblings), as transformers does on
    that path alone."""
    hf = hf_checkpoint(tmp_path / "m", variant)
    ours = load_model(tmp_path / "m")
    g = torch.Generator().manual_seed(2)
    prompt = torch.randint(0, 4096, (16,), generator=g)
    parents = torch.tensor([[-1, 0, 0, 1, 1, 2, 3, 5, 6, 8, 9, 10]])
    tokens = torch.randint(0, 4096, parents.shape, generator=g)
    tokens[0, 0] = prompt[-1]
    tree = DraftTree(tokens, parents, max_depth=7)
    cache = ours.new_cache(1, 48, nodes=12)
    with torch.no_grad():
        chunk_forward(ours, cache, prompt[None, :-1], torch.zeros(1, dtype=torch.long))
        logits = tree_forward(ours, cache, tree, torch.tensor([15]))[0]  # [N,V]
    ref = path_logits(hf, prompt[:-1], tree)
    assert (logits - ref).abs().max() <= 1e-5 * ref.abs().max()
    # a verify forward projecting a prefix-closed subset of the nodes only (a shared node budget)
    keep = torch.tensor([0, 1, 2, 3, 5, 7])
    cache = ours.new_cache(1, 48, nodes=12)
    with torch.no_grad():
        chunk_forward(ours, cache, prompt[None, :-1], torch.zeros(1, dtype=torch.long))
        packed = tree_forward(ours, cache, tree, torch.tensor([15]), pack=keep)[0]  # [M,V]
    assert (packed - ref[keep]).abs().max() <= 1e-5 * ref.abs().max()


def test_greedy_tokens_match_transformers(tmp_path):
    """AR generation past the window (engine prefill, then one token per step)."""
    from specpilot.engine.generator import Generator

    hf = hf_checkpoint(tmp_path / "m", "gemma4")
    ours = load_model(tmp_path / "m")
    prompts = [[5, 17, 300, 2, 9, 44], [7], list(range(1, 20))]
    with torch.no_grad():
        want = [hf.generate(torch.tensor([p]), max_new_tokens=20, do_sample=False, eos_token_id=None)[0, len(p):]
                .tolist() for p in prompts]
    assert Generator(ours).generate(prompts, 20, stop_at_eos=False).outputs == want


def test_global_layers_of_another_shape_get_their_own_cache_group(tmp_path):
    """Gemma-4 (global head dim 32, one K/V head, two KV-shared layers): one stacked buffer per
    K/V shape, none for the shared layers; one shape only is what packed prefill can lay out."""
    hf_checkpoint(tmp_path / "m", "gemma4_shared")
    ours = load_model(tmp_path / "m")
    cache = ours.new_cache(2, 32)
    assert isinstance(cache, GemmaCache) and not cache.packable
    assert [tuple(k.shape) for k in cache.k] == [(2, 2, 32, 16), (2, 2, 32, 16), (2, 1, 32, 32), (2, 2, 32, 16)]
    assert ours.config.kv_layers == (0, 1, 2, 3, 3, 2)
    assert cache.nbytes() == 4 * 2 * 2 * 32 * (3 * 2 * 16 + 32)
    hf_checkpoint(tmp_path / "g3", "gemma3")
    assert load_model(tmp_path / "g3").new_cache(1, 8).packable


@pytest.mark.parametrize("variant", ["gemma3", "gemma4"])
def test_multimodal_wrapper_loads_its_text_model(tmp_path, variant):
    """A ForConditionalGeneration directory saved by transformers (Gemma-3: a small SigLIP tower;
    Gemma-4: text only): the text model loads from its own names and computes the wrapper's logits."""
    text = hf_model(variant).config
    if variant == "gemma3":
        vision = transformers.SiglipVisionConfig(hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                                 num_attention_heads=2, image_size=28, patch_size=14)
        config = transformers.Gemma3Config(text_config=text, vision_config=vision, mm_tokens_per_image=4)
        wrapper = transformers.Gemma3ForConditionalGeneration(config)
    else:
        config = transformers.Gemma4Config(text_config=text, vision_config=None, audio_config=None)
        wrapper = transformers.Gemma4ForConditionalGeneration(config)
    wrapper.model.language_model.load_state_dict(hf_model(variant).model.state_dict())
    wrapper.save_pretrained(tmp_path / "vl")
    ours = load_model(tmp_path / "vl")
    assert ours.config.family == variant
    tokens = torch.randint(0, 4096, (1, 24), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        ref = wrapper.eval()(input_ids=tokens).logits
        assert (ours.forward_causal(tokens) - ref).abs().max() <= 1e-5 * ref.abs().max()


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_saved_checkpoints_load_in_transformers(tmp_path, variant):
    """`save_model` writes the family's HF layout and config; transformers computes the same logits,
    and loading it back gives every parameter bit for bit."""
    hf_checkpoint(tmp_path / "m", variant)
    model = load_model(tmp_path / "m")
    save_model(model, tmp_path / "again", dtype=torch.float32)
    hf = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "again", dtype=torch.float32).eval()
    tokens = torch.randint(0, 4096, (1, 30), generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        ref, ours = hf(tokens).logits, model.forward_causal(tokens)
    assert (ours - ref).abs().max() <= 1e-5 * ref.abs().max()
    again = load_model(tmp_path / "again")
    assert again.config == model.config
    for name, p in model.state_dict().items():
        assert torch.equal(again.state_dict()[name], p), name


def test_config_fields():
    c = ModelConfig.from_hf_dict(transformers.Gemma3TextConfig(**COMMON, **VARIANTS["gemma3"]).to_dict()
                                 | {"architectures": ["Gemma3ForCausalLM"]})
    assert c.family == "gemma3" and c.zero_centered_norms and c.qk_norm and c.tie_word_embeddings
    assert c.sliding_layers == (0, 1, 3) and c.attention_layers == (0, 1, 2, 3)
    assert (c.rope_theta, c.sliding_rope_theta, c.global_rope_factor) == (1e6, 1e4, 4.0)
    assert c.query_pre_attn_scalar == 24 and c.final_logit_softcapping == 30.0
    # a Hub-style Gemma-3 text_config: few fields, the older RoPE names, the layer pattern
    hub = {"architectures": ["Gemma3ForConditionalGeneration"], "model_type": "gemma3",
           "text_config": {"model_type": "gemma3_text", "hidden_size": 2560, "intermediate_size": 10240,
                           "num_hidden_layers": 34, "num_key_value_heads": 4, "sliding_window": 1024,
                           "rope_scaling": {"rope_type": "linear", "factor": 8.0}}}
    c = ModelConfig.from_hf_dict(hub)
    assert (c.vocab_size, c.head_dim, c.num_heads, c.query_pre_attn_scalar) == (262_208, 256, 8, 256)
    assert c.sliding_layers == tuple(i for i in range(34) if (i + 1) % 6) and c.global_rope_factor == 8.0
    c = ModelConfig.from_hf_dict(transformers.Gemma4TextConfig(**COMMON, **VARIANTS["gemma4_shared"]).to_dict()
                                 | {"architectures": ["Gemma4ForCausalLM"]})
    assert (c.global_head_dim, c.global_kv_heads, c.num_kv_shared_layers) == (32, 1, 2)
    assert c.attention_k_eq_v and c.double_wide_mlp and c.global_rope_proportion == 0.25
    assert c.query_pre_attn_scalar == 1.0 and not c.zero_centered_norms and c.per_layer_input_size == 0
    d = c.dense()
    assert d.family == "qwen3" and d.num_kv_shared_layers == 0 and not d.sliding_window and not d.layer_types
    assert isinstance(Transformer(d.with_changes(num_layers=1)), Transformer)


def gemma4_dict(**change) -> dict:
    return transformers.Gemma4TextConfig(**COMMON, **VARIANTS["gemma4"]).to_dict() | \
        {"architectures": ["Gemma4ForCausalLM"]} | change


@pytest.mark.parametrize("change,message", [
    ({"enable_moe_block": True, "num_experts": 4, "top_k_experts": 2, "moe_intermediate_size": 32},
     "mixture-of-experts"),
    ({"use_bidirectional_attention": "all"}, "use_bidirectional_attention='all'"),
    ({"hidden_activation": "silu"}, "hidden_activation 'silu'"),
    ({"rope_parameters": {FULL: {"rope_type": "yarn", "factor": 4.0, "rope_theta": 1e6},
                          SLIDING: {"rope_type": "default", "rope_theta": 1e4}}}, "RoPE types 'yarn'"),
    ({"per_layer_config": {"0": {"head_dim": 32}}}, "per_layer_config"),
    ({"layer_types": [SLIDING, "chunked_attention", FULL, FULL]}, "unsupported layer type 'chunked_attention'"),
])
def test_refusals(change, message):
    with pytest.raises(CheckpointError, match=message):
        ModelConfig.from_hf_dict(gemma4_dict(**change))


def test_an_unsupported_variant_is_one_error_line(tmp_path, capsys):
    """`specpilot generate` on a Gemma-4 MoE checkpoint: exit 2 and one line, before any weights load."""
    from specpilot.cli import main

    hf_checkpoint(tmp_path / "m", "gemma4")
    cfg = json.loads((tmp_path / "m" / "config.json").read_text())
    cfg.update(enable_moe_block=True, num_experts=4, top_k_experts=2, moe_intermediate_size=32)
    (tmp_path / "m" / "config.json").write_text(json.dumps(cfg))
    capsys.readouterr()  # transformers' progress bars
    code = main(["generate", "--target", str(tmp_path / "m"), "--prompt", "x", "--device", "cpu"])
    lines = [x for x in capsys.readouterr().err.splitlines() if x]
    assert code == 2 and len(lines) == 1 and lines[0].startswith("error: ")
    assert "Gemma-4 mixture-of-experts blocks (enable_moe_block) are not supported" in lines[0]


def test_a_draft_cache_of_two_shapes_prefills_rows_one_by_one(tmp_path):
    """A Gemma-4 draft model's cache holds K/V of two shapes, which no batch-1 packing cache lays
    out: `prefill_rows` runs each chunk on its row and writes what a whole-prompt prefill writes."""
    from specpilot.engine.drafters.draft_model import DraftModelDrafter
    from specpilot.engine.drafters.base import DrafterSettings
    from specpilot.engine.packed_prefill import Chunk
    from specpilot.engine.state import DecodeState

    hf_checkpoint(tmp_path / "m", "gemma4_shared")
    model = load_model(tmp_path / "m")
    p = [list(range(3, 30)), list(range(40, 52))]
    chunked, whole = DraftModelDrafter(model, 3, 1, 3), DraftModelDrafter(model, 3, 1, 3)
    state = DecodeState.allocate(2, 64, 8, model.device)
    chunked.configure(DrafterSettings(prefill_bucket=16))
    chunked.start([[1, 2]] * 2, state)
    chunked.warm_rows(32)  # nothing to warm without packing
    chunked.prefill_rows([Chunk(0, tuple(p[0][:20]), 0), Chunk(1, tuple(p[1]), 0)], state)
    chunked.prefill_rows([Chunk(0, tuple(p[0][20:]), 20)], state)
    whole.start([p[0] + [0], p[1] + [0]], DecodeState.allocate(2, 64, 8, model.device))
    assert not chunked.cache.packable
    for a, b in zip(chunked.cache.k + chunked.cache.v, whole.cache.k + whole.cache.v):
        for row, n in enumerate(map(len, p)):
            torch.testing.assert_close(a[row, :, :n], b[row, :, :n], rtol=1e-5, atol=1e-5)


def test_w12_checkpoint_runs_the_same_function(tmp_path, monkeypatch):
    """`w12 convert` takes the Gemma projections (fused to [q | k | v], [q | k] or [q] rows on load);
    the W12 model equals the BF16 one bit for bit."""
    from specpilot.models.convert import convert_checkpoint
    from specpilot.models.w12_linear import W12Linear

    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    hf_checkpoint(tmp_path / "f32", "gemma4_shared")
    save_model(load_model(tmp_path / "f32"), tmp_path / "src", dtype=torch.bfloat16)
    copy_tokenizer(tmp_path / "src")
    convert_checkpoint(tmp_path / "src", tmp_path / "w12")
    a = load_model(tmp_path / "src", dtype=torch.bfloat16)
    with pytest.warns(Warning):
        b = load_model(tmp_path / "w12", dtype=torch.bfloat16)
    assert isinstance(b.layers[5].self_attn.qkv_proj, W12Linear)
    tokens = torch.randint(0, 4096, (1, 20), generator=torch.Generator().manual_seed(7))
    with torch.no_grad():
        assert torch.equal(a.forward_causal(tokens), b.forward_causal(tokens))
