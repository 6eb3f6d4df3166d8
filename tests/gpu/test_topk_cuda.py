"""The fused top-k of log-probabilities on a CUDA GPU (`pytest -m gpu`): the same indices as
torch.log_softmax + torch.topk on logits without ties, values equal to float32 rounding."""

import pytest
import torch

from specpilot.kernels import topk

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("V,k", [(8192, 4), (32000, 8), (151936, 4)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_top_log_probs_on_cuda(V, k, dtype):
    g = torch.Generator().manual_seed(V)
    logits = (torch.randperm(V, generator=g).float() / V * 20).repeat(6, 1).view(2, 3, V)  # distinct in each row
    logits = logits.to("cuda", dtype)
    values, indices = topk.top_log_probs(logits, k)
    want_v, want_i = topk.reference(logits, k)
    assert topk.fused_available(logits, k) == (V <= topk.MAX_VOCAB)
    assert torch.equal(logits.gather(-1, indices), logits.gather(-1, want_i))
    if dtype == torch.float32:
        assert torch.equal(indices, want_i)
    torch.testing.assert_close(values, want_v, rtol=0, atol=1e-5)
