"""`FusedDecoder` (`models/fused_decoder.py`): a draft model's cached forward through the fused
draft-layer kernels against `Transformer.forward` on the same weights and cache: the logits and
every cache entry, float32 (|d| <= 1e-5 max |ref|: summation order only) and BF16 (<= 2^-5 max
|ref|: a projection may round to the other BF16 neighbour, carried through two layers), with and
without q/k norm, GQA and MHA; `logits_for`; more than 16 rows take the plain forward. The kernels
run under Triton's interpreter on CPU."""

import copy
import importlib
import importlib.util
import sys

import pytest
import torch

from specpilot.models.fused_decoder import FusedDecoder, supported, use_fused_layers
from specpilot.models.random_checkpoint import random_model, tiny_config
from specpilot.models.transformer import Transformer

# Triton fixes interpreted vs compiled when `triton.language` is first imported: without CUDA,
# import it under TRITON_INTERPRET=1 at collection (as tests/kernels/conftest.py does).
if not torch.cuda.is_available() and importlib.util.find_spec("triton") and "triton.language" not in sys.modules:
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("TRITON_INTERPRET", "1")
        importlib.import_module("triton.language")

REL = {torch.float32: 1e-5, torch.bfloat16: 2.0**-5}


@pytest.fixture
def interpreted(interpreter):
    """The kernels under the interpreter (`tests/conftest.interpreter`)."""
    interpreter("specpilot.kernels.draft_layer_kernel", "draft_gemv_kernel")


def models(dtype, **overrides):
    config = tiny_config(num_layers=2, head_dim=32, vocab_size=512, **overrides)  # few lm_head programs
    plain = random_model(config, seed=1).to(dtype).requires_grad_(False)
    return plain, use_fused_layers(copy.deepcopy(plain))


def chunk(B: int, T: int, start: int, vocab: int, S: int, seed: int = 0):
    """tokens, positions, slots, mask of a causal chunk at positions start.. of each row."""
    g = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, vocab, (B, T), generator=g)
    positions = start + torch.arange(T).expand(B, T)
    mask = (torch.arange(S)[None, None, :] <= positions[..., None])[:, None]  # [B,1,T,S]
    return tokens, positions, positions.clone(), mask


def assert_close(out, ref, dtype):
    err = (out.float() - ref.float()).abs().max()
    assert err <= REL[dtype] * ref.float().abs().max(), f"{err} vs max {ref.float().abs().max()}"


@pytest.mark.parametrize("overrides, dtype", [({}, torch.float32), ({}, torch.bfloat16),
                                              ({"qk_norm": False, "num_kv_heads": 4}, torch.float32)],
                         ids=["gqa_qknorm-float32", "gqa_qknorm-bfloat16", "mha-float32"])
def test_the_fused_forward_gives_the_reference_logits_and_cache(interpreted, overrides, dtype):
    plain, fused = models(dtype, **overrides)
    assert isinstance(fused, FusedDecoder) and supported(fused)
    assert fused.lm_head.weight.data_ptr() == fused.lm_head.weight.data_ptr()
    B, S, V = 2, 32, plain.config.vocab_size
    cache = plain.new_cache(B, S)
    prompt = chunk(B, 20, 0, V, S)
    plain(prompt[0], prompt[1], cache, prompt[2], prompt[3])  # 40 rows: a prefill, the plain forward
    ref_cache = copy.deepcopy(cache)
    tokens, positions, slots, mask = chunk(B, 4, 20, V, S, seed=1)  # 8 rows: the kernels
    ref = plain(tokens, positions, ref_cache, slots, mask)
    out = fused(tokens, positions, cache, slots, mask)
    assert out.shape == ref.shape and out.dtype == dtype
    assert_close(out, ref, dtype)
    for a, b in zip(cache.k + cache.v, ref_cache.k + ref_cache.v):
        assert_close(a, b, dtype)
        assert torch.equal(a[:, :, :20], b[:, :, :20])  # the prefill's entries untouched
    root_at = torch.tensor([[3], [1]])
    assert_close(fused(tokens, positions, cache, slots, mask, logits_for=root_at),
                 plain(tokens, positions, ref_cache, slots, mask, logits_for=root_at), dtype)


def test_more_than_sixteen_rows_run_the_plain_forward(monkeypatch, interpreted):
    """17 rows, packed rows and captured features: `Transformer.forward` itself."""
    plain, fused = models(torch.float32)
    calls = []
    monkeypatch.setattr(Transformer, "forward", lambda self, *a, **k: calls.append(len(a)) or "plain")
    tokens, positions, slots, mask = chunk(1, 17, 0, plain.config.vocab_size, 32)
    assert fused(tokens, positions, None, slots, mask) == "plain"
    assert fused(tokens[:, :4], positions[:, :4], None, slots[:, :4], mask[:, :, :4], capture=(0,)) == "plain"
    assert len(calls) == 2


def test_only_a_plain_dense_transformer_turns_fused():
    plain, _ = models(torch.float32)
    with pytest.raises(TypeError, match="dense Transformer"):
        use_fused_layers(use_fused_layers(copy.deepcopy(plain)))
    assert not supported(random_model(tiny_config(num_layers=1, head_dim=16)))  # D/2 = 8: below a tl.dot
