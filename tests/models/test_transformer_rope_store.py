"""`rope_store` in `Transformer.forward` (`use_rope_store`): each layer's q/k norm, RoPE and cache
write by the kernel against the fused op and the indexed writes, on the same weights and cache:
a prefill, an AR step and a tree (its own positions and ancestor mask), float32, with and without
q/k norm, GQA. The logits and every cache entry within 1e-5 of the largest (summation order only),
the same greedy tokens; packed rows and head sizes the kernel does not take keep the old path.
The kernel runs under Triton's interpreter on CPU."""

import copy
import importlib
import importlib.util
import sys

import pytest
import torch

from specpilot.kernels import rope_store
from specpilot.models.random_checkpoint import random_model, tiny_config
from specpilot.models.transformer import Attention, use_rope_store

# Triton fixes interpreted vs compiled when `triton.language` is first imported: without CUDA,
# import it under TRITON_INTERPRET=1 at collection (as tests/kernels/conftest.py does).
if not torch.cuda.is_available() and importlib.util.find_spec("triton") and "triton.language" not in sys.modules:
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("TRITON_INTERPRET", "1")
        importlib.import_module("triton.language")

REL = 1e-5
PARENTS = [-1, 0, 0, 1, 1, 2]  # a tree of 6 nodes: root, two children, three grandchildren


@pytest.fixture
def interpreted(interpreter):
    interpreter("specpilot.kernels.rope_store_kernel", "rope_store_kernel")


@pytest.fixture
def launches(monkeypatch) -> list:
    """The row counts of every kernel launch from here on."""
    calls, real = [], rope_store.qk_norm_rope_store_eager

    def counted(qkv, *args):
        calls.append(qkv.shape[0] * qkv.shape[1])
        return real(qkv, *args)

    monkeypatch.setattr(rope_store, "qk_norm_rope_store_eager", counted)
    return calls


def models(**overrides):
    config = tiny_config(num_layers=2, head_dim=32, vocab_size=512, **overrides)
    plain = random_model(config, seed=2).requires_grad_(False)
    stored = copy.deepcopy(plain)
    use_rope_store(stored, True)
    return plain, stored


def causal(B: int, T: int, start: int, vocab: int, S: int, seed: int):
    g = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, vocab, (B, T), generator=g)
    positions = start + torch.arange(T).expand(B, T)
    mask = (torch.arange(S)[None, None, :] <= positions[..., None])[:, None]  # [B,1,T,S]
    return tokens, positions, positions.clone(), mask


def tree(B: int, start: int, vocab: int, S: int, seed: int):
    """tokens, positions, slots, mask of PARENTS after `start` committed tokens in every row."""
    N = len(PARENTS)
    depth, ancestors = [0] * N, torch.eye(N, dtype=torch.bool)
    for i, p in enumerate(PARENTS):
        if p >= 0:
            depth[i], ancestors[i] = depth[p] + 1, ancestors[i] | ancestors[p]
    g = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, vocab, (B, N), generator=g)
    positions = (start + torch.tensor(depth)).expand(B, N)
    slots = (start + torch.arange(N)).expand(B, N)
    mask = torch.zeros(B, 1, N, S, dtype=torch.bool)
    mask[..., :start] = True
    mask[..., start:start + N] = ancestors
    return tokens, positions, slots, mask


def assert_close(out, ref):
    err = (out.float() - ref.float()).abs().max()
    assert err <= REL * ref.float().abs().max(), f"{err} vs max {ref.float().abs().max()}"


@pytest.mark.parametrize("overrides", [{}, {"qk_norm": False, "family": "llama"}], ids=["qwen3", "llama"])
def test_the_kernel_forward_gives_the_old_logits_cache_and_tokens(interpreted, launches, overrides):
    plain, stored = models(**overrides)
    assert all(m.rope_store for m in stored.modules() if isinstance(m, Attention))
    assert not any(m.rope_store for m in plain.modules() if isinstance(m, Attention))
    B, S, V = 2, 24, plain.config.vocab_size
    cache, ref_cache = plain.new_cache(B, S), plain.new_cache(B, S)
    for chunk in (causal(B, 7, 0, V, S, seed=0), causal(B, 1, 7, V, S, seed=1), tree(B, 8, V, S, seed=2)):
        ref = plain(*chunk[:2], ref_cache, *chunk[2:])
        out = stored(*chunk[:2], cache, *chunk[2:])
        assert_close(out, ref)
        assert torch.equal(out.argmax(-1), ref.argmax(-1))
        for a, b in zip(cache.k + cache.v, ref_cache.k + ref_cache.v):
            assert_close(a, b)
    assert launches == [14, 14, 2, 2, 12, 12]  # one launch per layer and forward: prefill, step, tree


def test_packed_rows_and_other_head_sizes_keep_the_old_path(interpreted, launches):
    plain, stored = models()
    B, S, V = 2, 16, plain.config.vocab_size
    tokens, positions, slots, mask = causal(B, 4, 0, V, S, seed=3)
    pack = torch.tensor([0, 1, 2, 4, 5])  # row 1 keeps 2 of its 4 tokens
    ref = plain(tokens, positions, plain.new_cache(B, S), slots, mask, pack=pack)
    assert torch.equal(stored(tokens, positions, plain.new_cache(B, S), slots, mask, pack=pack), ref)
    small = random_model(tiny_config(num_layers=1, head_dim=16, vocab_size=512), seed=2).requires_grad_(False)
    on = copy.deepcopy(small)
    use_rope_store(on, True)
    assert not on.rope_store_applies(on.embed_tokens.weight)
    assert torch.equal(on(tokens, positions, on.new_cache(B, S), slots, mask),
                       small(tokens, positions, small.new_cache(B, S), slots, mask))
    assert not launches
