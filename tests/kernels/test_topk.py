"""The fused top-k of log-probabilities (`kernels.topk`), run by Triton's interpreter on CPU: the
same indices as torch.log_softmax + torch.topk, values equal to float32 rounding, ties to the
lower index, and the torch path wherever the kernel does not apply."""

import pytest
import torch

from specpilot.kernels import topk


def ulps(logits: torch.Tensor, n: int = 8) -> float:
    """`n` float32 ulps of the largest normaliser (log-sum-exp of a row): the two sides sum its V
    terms in different orders, and each log-probability carries that rounding."""
    return n * torch.finfo(torch.float32).eps * logits.float().logsumexp(-1).abs().max().item()


@pytest.fixture
def interpret(monkeypatch):
    pytest.importorskip("triton")
    monkeypatch.setenv("TRITON_INTERPRET", "1")


@pytest.mark.parametrize("V,k", [(8192, 4), (1000, 8), (300, 1)])
def test_fused_equals_log_softmax_topk(interpret, V, k):
    logits = torch.randn(3, 5, V, generator=torch.Generator().manual_seed(V)) * 4  # [3,5,V]
    values, indices = topk.fused(logits, k)
    want_v, want_i = topk.reference(logits, k)
    assert values.shape == indices.shape == (3, 5, k) and indices.dtype == torch.int64
    assert torch.equal(indices, want_i)
    torch.testing.assert_close(values, want_v, rtol=0, atol=ulps(logits))


def test_fused_reads_bf16_and_strided_rows(interpret):
    logits = torch.randn(4, 2 * 512, generator=torch.Generator().manual_seed(1)).to(torch.bfloat16)[:, ::2]
    values, indices = topk.fused(logits, 4)
    want_v, want_i = topk.reference(logits, 4)
    # bf16 rounds some logits equal; torch.topk orders such ties as it likes: compare what they pick
    assert torch.equal(logits.gather(1, indices), logits.gather(1, want_i))
    torch.testing.assert_close(values, want_v, rtol=0, atol=ulps(logits))


def test_ties_go_to_the_lower_index(interpret):
    logits = torch.zeros(2, 64)
    logits[0, [9, 3, 40]] = 5.0
    logits[1, [63, 0]] = 2.0
    _, indices = topk.fused(logits, 3)
    assert indices.tolist() == [[3, 9, 40], [0, 63, 1]]


def test_cpu_and_large_vocabularies_take_the_torch_path():
    logits = torch.randn(2, 100)
    assert not topk.fused_available(logits, 4)
    values, indices = topk.top_log_probs(logits, 4)
    want_v, want_i = topk.reference(logits, 4)
    assert torch.equal(values, want_v) and torch.equal(indices, want_i)
    meta = torch.empty(2, topk.MAX_VOCAB + 1, device="meta")
    assert not topk.fused_available(meta, 4)
