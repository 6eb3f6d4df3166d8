"""Our logits equal transformers' on the same checkpoint (CPU float32).

transformers is a test-only dependency; the runtime never imports it.
"""

import pytest
import torch

from specpilot.models.kv_cache import KVCache
from specpilot.engine.steps import chunk_forward
from specpilot.models.loading import load_model
from specpilot.models.random_checkpoint import tiny_config, write_random_checkpoint

transformers = pytest.importorskip("transformers")


def hf_logits(path, tokens):
    model = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    with torch.no_grad():
        return model(tokens).logits


@pytest.mark.parametrize("family,tied", [("qwen3", False), ("qwen3", True), ("llama", False), ("llama", True)])
def test_logits_match_transformers(tmp_path, family, tied):
    path = write_random_checkpoint(tmp_path / "m", tiny_config(family, tie_word_embeddings=tied), seed=3)
    tokens = torch.randint(0, 4096, (2, 33), generator=torch.Generator().manual_seed(0))
    ref = hf_logits(path, tokens)
    ours = load_model(path)
    with torch.no_grad():
        causal = ours.forward_causal(tokens)
        cache = KVCache.allocate(ours.config, 2, 64, "cpu", torch.float32)
        cached = chunk_forward(ours, cache, tokens, torch.zeros(2, dtype=torch.long))
    scale = ref.abs().max()
    # same math in float32: only summation order may differ (SDPA vs eager attention)
    assert (causal - ref).abs().max() <= 1e-5 * scale
    assert (cached - ref).abs().max() <= 1e-5 * scale
    assert torch.equal(causal.argmax(-1), ref.argmax(-1))


def test_llama3_rope_scaling_matches(tmp_path):
    from specpilot.models.config import RopeScaling

    cfg = tiny_config("llama", rope_scaling=RopeScaling(8.0, 1.0, 4.0, 64), rope_theta=500000.0)
    path = write_random_checkpoint(tmp_path / "m", cfg, seed=4)
    tokens = torch.randint(0, 4096, (1, 200), generator=torch.Generator().manual_seed(1))
    ref = hf_logits(path, tokens)
    with torch.no_grad():
        ours = load_model(path).forward_causal(tokens)
    assert (ours - ref).abs().max() <= 1e-5 * ref.abs().max()


def test_bf16_logits_match_transformers_on_cpu(tmp_path):
    """bf16 on CPU: the causal path runs the same eager math as transformers and equals it to the
    last bit. The cached path attends over a static cache (masked slots, GQA groups folded into
    the query axis), so its reductions have other shapes and round differently; its error against
    a float32 reference must stay within transformers' own bf16 error (x2)."""
    cfg = tiny_config(hidden_size=256, intermediate_size=512, num_layers=4, num_heads=4, num_kv_heads=2, head_dim=64)
    path = write_random_checkpoint(tmp_path / "m", cfg, seed=5, dtype=torch.bfloat16)
    tokens = torch.randint(0, 4096, (1, 40), generator=torch.Generator().manual_seed(2))
    model = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.bfloat16).eval()
    ours = load_model(path, dtype=torch.bfloat16)
    with torch.no_grad():
        ref = model(tokens).logits
        exact = load_model(path, dtype=torch.float32).forward_causal(tokens)
        cache = KVCache.allocate(ours.config, 1, 64, "cpu", torch.bfloat16)
        cached = chunk_forward(ours, cache, tokens, torch.zeros(1, dtype=torch.long))
        assert torch.equal(ours.forward_causal(tokens), ref)
    hf_error = (ref.float() - exact).abs().max()
    assert (cached.float() - exact).abs().max() <= 2 * hf_error
