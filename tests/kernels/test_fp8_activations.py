"""`quantize_activations`: per-row, per-group amax / 448 scales, e4m3 codes within half an e4m3 ulp
of x / scale, the amax reaching +-448 exactly, zero groups scaled by 1, a partial last group."""

import pytest
import torch

from specpilot.kernels.fp8_activations import quantize_activations


def test_scales_codes_and_error_bound():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(3, 300, generator=g) * torch.tensor([[1.0], [1e-3], [50.0]])
    x[1, 128:256] = 0.0  # an all-zero group
    codes, scale = quantize_activations(x.bfloat16(), 128)
    assert codes.dtype == torch.float8_e4m3fn and codes.shape == (3, 300) and scale.shape == (3, 3)
    xf = x.bfloat16().float()
    for m in range(3):
        for b in range(3):
            group = xf[m, 128 * b:128 * (b + 1)]
            amax = group.abs().max()
            want = amax / 448 if amax > 0 else torch.tensor(1.0)
            assert scale[m, b] == want
            q = codes[m, 128 * b:128 * (b + 1)].float()
            if amax > 0:
                assert q.abs().max() == 448.0
            back = q * scale[m, b]
            assert bool(((back - group).abs() <= torch.maximum(group.abs() * 2**-4, scale[m, b] * 2**-10)).all())
    _, s1 = quantize_activations(x, 300)  # the per-channel weights' grouping: one scale per row
    assert s1.shape == (3, 1) and torch.equal(s1[:, 0], x.abs().amax(1) / 448)


def test_bad_inputs():
    with pytest.raises(ValueError, match=r"x \[M, K\]"):
        quantize_activations(torch.ones(2, 3, 4), 2)
    with pytest.raises(ValueError, match="positive group"):
        quantize_activations(torch.ones(2, 4), 0)
