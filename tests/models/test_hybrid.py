"""The hybrid Gated DeltaNet decoder equals transformers on checkpoints transformers saved, in both
public layouts (Qwen3-Next's fused in_proj_qkvz / in_proj_ba, Qwen3.5's split projections), and
the Qwen3.5 multimodal wrapper's text model loads from its own names (CPU float32).

transformers is a test-only dependency; the runtime never imports it.
"""

import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from specpilot.engine.generator import Generator
from specpilot.engine.steps import chunk_forward
from specpilot.errors import CheckpointError
from specpilot.models.config import ModelConfig
from specpilot.models.expand import load_expanded
from specpilot.models.hybrid import HybridTransformer
from specpilot.models.loading import load_model, save_model
from specpilot.models.random_checkpoint import copy_tokenizer, random_hybrid, tiny_hybrid_config

transformers = pytest.importorskip("transformers")

DIMS = dict(vocab_size=4096, hidden_size=64, intermediate_size=128, num_hidden_layers=4, num_attention_heads=4,
            num_key_value_heads=2, head_dim=16, linear_num_key_heads=2, linear_num_value_heads=4,
            linear_key_head_dim=16, linear_value_head_dim=8, max_position_embeddings=512, eos_token_id=0)


def spread_weights(model, seed: int, scale=lambda name: 1.0) -> None:
    """Random weights spread so that logits do not tie: norms off their init, GDN gates in range,
    projections ~scale(name)/sqrt(fan_in), a larger lm_head."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.add_(0.2 * torch.randn(p.shape, generator=g))
            elif name.endswith("A_log"):
                p.copy_(torch.empty(p.shape).uniform_(1.0, 16.0, generator=g).log())
            elif name.endswith("dt_bias"):
                p.copy_(torch.randn(p.shape, generator=g) - 1.0)
            elif "embed" in name:
                p.copy_(torch.randn(p.shape, generator=g))
            elif name == "lm_head.weight":
                p.copy_(torch.randn(p.shape, generator=g) * 3 / p.shape[1] ** 0.5)
            else:
                p.copy_(torch.randn(p.shape, generator=g) * scale(name) / p.shape[-1] ** 0.5)


def hf_checkpoint(path, layout: str, seed: int = 0):
    """A tiny random model saved by transformers, its weights spread so that logits do not tie:
    norms off their init, projections ~1/sqrt(fan_in), a larger lm_head."""
    if layout == "qwen3_next":
        config = transformers.Qwen3NextConfig(num_experts=0, **DIMS)
        model = transformers.Qwen3NextForCausalLM(config)
    else:
        from transformers.models.qwen3_5 import Qwen3_5ForCausalLM, Qwen3_5TextConfig

        model = Qwen3_5ForCausalLM(Qwen3_5TextConfig(**DIMS))
    spread_weights(model, seed)
    model.save_pretrained(path)
    copy_tokenizer(path)
    return model.eval()


@pytest.mark.parametrize("layout", ["qwen3_next", "qwen3_5"])
def test_logits_and_greedy_tokens_match_transformers(tmp_path, layout):
    hf = hf_checkpoint(tmp_path / "m", layout)
    ours = load_model(tmp_path / "m")
    assert isinstance(ours, HybridTransformer) and ours.config.family == layout
    tokens = torch.randint(0, 4096, (2, 70), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        ref = hf(tokens).logits
        causal = ours.forward_causal(tokens)
        cached = chunk_forward(ours, ours.new_cache(2, 128), tokens, torch.zeros(2, dtype=torch.long))
    scale = ref.abs().max()
    # the same math in float32; only summation orders differ (the recurrence in chunks or token by
    # token, attention through SDPA), compounded over 70 recurrent steps
    assert (causal - ref).abs().max() <= 1e-4 * scale
    assert (cached - ref).abs().max() <= 1e-4 * scale
    prompts = [[5, 17, 300, 2, 9, 44], [7], list(range(1, 30))]
    with torch.no_grad():
        want = [hf.generate(torch.tensor([p]), max_new_tokens=24, do_sample=False, eos_token_id=None)[0, len(p):]
                .tolist() for p in prompts]
    assert Generator(ours).generate(prompts, 24, stop_at_eos=False).outputs == want


@pytest.mark.parametrize("family", ["qwen3_next", "qwen3_5"])
def test_saved_checkpoints_load_in_transformers(tmp_path, family):
    """`save_model` writes the family's own HF layout (Qwen3-Next's interleaved rows regrouped back)."""
    model = random_hybrid(tiny_hybrid_config(family), seed=2)
    save_model(model, tmp_path / "m", dtype=torch.float32)
    hf = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "m", dtype=torch.float32).eval()
    tokens = torch.randint(0, 4096, (1, 40), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        ref, ours = hf(tokens).logits, model.forward_causal(tokens)
    assert (ours - ref).abs().max() <= 2e-5 * ref.abs().max()
    again = load_model(tmp_path / "m")
    for name, p in model.state_dict().items():
        assert torch.equal(again.state_dict()[name], p), name


def test_multimodal_wrapper_loads_its_text_model(tmp_path):
    """A Qwen3_5ForConditionalGeneration directory: config under text_config, tensors under
    model.language_model., a vision tower we leave on disk."""
    hf_checkpoint(tmp_path / "m", "qwen3_5")
    cfg = json.loads((tmp_path / "m" / "config.json").read_text())
    wrapped = tmp_path / "vl"
    wrapped.mkdir()
    (wrapped / "config.json").write_text(json.dumps({
        "architectures": ["Qwen3_5ForConditionalGeneration"], "model_type": "qwen3_5", "text_config": cfg,
        "vision_config": {"model_type": "qwen3_5_vision"}, "tie_word_embeddings": False}))
    tensors = load_file(str(tmp_path / "m" / "model.safetensors"))
    renamed = {("model.language_model." + k[len("model."):] if k.startswith("model.") else k): v
               for k, v in tensors.items()}
    renamed["model.visual.patch_embed.proj.weight"] = torch.zeros(4, 4)
    save_file(renamed, str(wrapped / "model.safetensors"))
    copy_tokenizer(wrapped)
    a, b = load_model(tmp_path / "m"), load_model(wrapped)
    tokens = torch.randint(0, 4096, (1, 20), generator=torch.Generator().manual_seed(4))
    assert torch.equal(a.forward_causal(tokens), b.forward_causal(tokens))


def test_config_fields_and_refusals():
    hf = {"architectures": ["Qwen3NextForCausalLM"], "model_type": "qwen3_next", "vocab_size": 64, "hidden_size": 32,
          "intermediate_size": 64, "num_hidden_layers": 8, "num_attention_heads": 4, "num_key_value_heads": 2,
          "head_dim": 8, "full_attention_interval": 4, "num_experts": 0, "linear_num_key_heads": 2,
          "linear_num_value_heads": 4, "linear_key_head_dim": 8, "linear_value_head_dim": 8,
          "rope_parameters": {"rope_theta": 10000.0, "partial_rotary_factor": 0.25}}
    c = ModelConfig.from_hf_dict(hf)
    assert c.hybrid and c.attention_layers == (3, 7) and c.linear_layers == (0, 1, 2, 4, 5, 6)
    assert c.rotary_dim == 2 and c.conv_dim == 2 * 16 + 32 and c.linear_conv_kernel_dim == 4
    assert ModelConfig.from_hf_dict({**hf, "num_experts": 8, "num_experts_per_tok": 2}).moe_layers == tuple(range(8))
    with pytest.raises(CheckpointError, match="mixture-of-experts"):  # Qwen3-Next's sparse layers load (test_moe)
        ModelConfig.from_hf_dict({**hf, "architectures": ["Qwen3_5ForCausalLM"], "model_type": "qwen3_5_text",
                                  "num_experts": 8})
    with pytest.raises(CheckpointError, match="layer_types"):
        ModelConfig.from_hf_dict({**hf, "layer_types": ["linear_attention"] * 3})
    with pytest.raises(CheckpointError, match="multiple of linear_num_key_heads"):
        ModelConfig.from_hf_dict({**hf, "linear_num_value_heads": 3})


def test_num_params_counts_every_tensor():
    for family in ("qwen3_next", "qwen3_5"):
        c = tiny_hybrid_config(family)
        model = random_hybrid(c)
        assert c.num_params == sum(p.numel() for p in model.parameters())


@pytest.mark.parametrize("factor", [2, 4])
def test_width_expansion_keeps_the_function(tmp_path, factor):
    path = tmp_path / "m"
    save_model(random_hybrid(tiny_hybrid_config(), seed=5), path, dtype=torch.float32)
    copy_tokenizer(path)
    small, wide = load_model(path), load_expanded(path, factor)
    assert wide.config.linear_num_value_heads == factor * small.config.linear_num_value_heads
    tokens = torch.randint(0, 4096, (2, 40), generator=torch.Generator().manual_seed(6))
    with torch.no_grad():
        a, b = small.forward_causal(tokens), wide.forward_causal(tokens)
        z = torch.zeros(2, dtype=torch.long)
        c = chunk_forward(wide, wide.new_cache(2, 64), tokens, z)
    # exact in real arithmetic: sums over f copies round differently, nothing else (as the dense test)
    assert (a - b).abs().max() <= 1e-5 * a.abs().max()
    assert (a - c).abs().max() <= 1e-5 * a.abs().max()
    assert torch.equal(a.argmax(-1), b.argmax(-1))


@pytest.mark.parametrize("family", ["qwen3_next", "qwen3_5"])
def test_w12_checkpoint_runs_the_same_function(tmp_path, family, monkeypatch):
    """`w12 convert` takes the GDN projections; loading regroups W12 rows (Qwen3-Next's interleaved
    in_proj, the gate rows of q_proj) exactly, so the W12 model equals the BF16 one bit for bit."""
    from specpilot.models.convert import convert_checkpoint
    from specpilot.models.random_checkpoint import write_random_hybrid
    from specpilot.models.w12_linear import W12Linear

    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    src = write_random_hybrid(tmp_path / "src", tiny_hybrid_config(family), dtype=torch.bfloat16)
    convert_checkpoint(src, tmp_path / "w12")
    a = load_model(src, dtype=torch.bfloat16)
    with pytest.warns(Warning):
        b = load_model(tmp_path / "w12", dtype=torch.bfloat16)
    assert isinstance(b.layers[0].linear_attn.in_proj, W12Linear)
    tokens = torch.randint(0, 4096, (1, 20), generator=torch.Generator().manual_seed(7))
    with torch.no_grad():
        assert torch.equal(a.forward_causal(tokens), b.forward_causal(tokens))
