"""The unpack kernel decodes bit-exactly (the same tile decoder the GEMV/GEMM kernels use)."""

import pytest
import torch

from specpilot.w12 import decode, encode
from specpilot.w12.layout import bits_to_bf16


@pytest.fixture
def assert_unpacks_exactly(to_device):
    def check(w: torch.Tensor):
        from specpilot.kernels.w12_unpack import unpack

        enc = encode(w)
        out = unpack(to_device(enc)).cpu()
        assert out.dtype == torch.bfloat16
        assert torch.equal(out.view(torch.int16), decode(enc).view(torch.int16))
        assert torch.equal(out.view(torch.int16), w.view(torch.int16))

    return check


def test_every_bf16_pattern(assert_unpacks_exactly):
    assert_unpacks_exactly(bits_to_bf16(torch.arange(65536, dtype=torch.int32)).reshape(256, 256))


def test_every_pattern_shuffled_into_odd_rows(assert_unpacks_exactly):
    flat = bits_to_bf16(torch.randperm(65536, generator=torch.Generator().manual_seed(0)).to(torch.int32))
    assert_unpacks_exactly(flat[: 97 * 675].reshape(97, 675))


@pytest.mark.parametrize("shape", [(1, 1), (37, 300), (5, 129)])
def test_escape_heavy_odd_shapes(assert_unpacks_exactly, make_weight, shape):
    assert_unpacks_exactly(make_weight(*shape, seed=3))
