"""W12Linear on CPU (no interpreter): decoded weights are exact, so outputs equal F.linear's."""

import copy

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from specpilot.errors import ConfigError
from specpilot.models.w12_linear import W12Linear
from specpilot.w12 import encode


@pytest.fixture(autouse=True)
def reference_forward(monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)


def bf16_linear(N=37, K=300, seed=0) -> nn.Linear:
    g = torch.Generator().manual_seed(seed)
    lin = nn.Linear(K, N, bias=False)
    with torch.no_grad():
        lin.weight.copy_((torch.randn(N, K, generator=g) * 0.02).bfloat16().float())
        lin.weight[0, :3] = 0.0
    return lin


def test_forward_equals_f_linear_exactly():
    lin = bf16_linear()
    module = W12Linear.from_linear(lin)
    x = torch.randn(2, 5, 300)
    assert torch.equal(module(x), F.linear(x, lin.weight))
    assert torch.equal(module(x.bfloat16()), F.linear(x.bfloat16(), lin.weight.bfloat16()))
    assert (module.in_features, module.out_features) == (300, 37)


def test_buffers_follow_the_module():
    w = encode((torch.randn(8, 130) * 0.02).bfloat16())
    module = W12Linear(w)
    assert isinstance(module, W12Linear)
    assert set(dict(module.named_buffers())) == {"lo", "hi", "base", "esc_ptr", "esc_col", "esc_val"}
    clone = copy.deepcopy(module, {id(b): b for b in module.buffers()})
    assert clone.lo is module.lo and clone.hi is module.hi  # a deepcopy with the engine's memo shares the planes
    assert "bits/weight" in repr(module)


def test_only_exact_bf16_weights_are_encoded():
    lin = nn.Linear(16, 4, bias=False)
    with torch.no_grad():
        lin.weight.fill_(1.0 + 2**-12)  # needs more than BF16's 8 significant bits
    with pytest.raises(ConfigError, match="BF16"):
        W12Linear.from_linear(lin)
    with pytest.raises(ValueError, match="bias"):
        W12Linear.from_linear(nn.Linear(16, 4))
