"""Escape blocks: the entries the GEMM adds after its K loop are exactly the escape correction."""

import pytest
import torch

from specpilot.kernels.escape_blocks import (
    MAX_SLOT,
    PLACEHOLDER_SCALED,
    build,
    escape_blocks,
    reference_correction,
)
from specpilot.w12 import encode
from specpilot.w12.codec import escape_columns, escape_rows
from specpilot.w12.layout import SCALE_BIAS


def escape_correction(enc, x: torch.Tensor) -> torch.Tensor:
    """[M, N] float64 in the kernel's scaled domain: sum over escapes (n, c, v) of
    (v * 2^(112 - e0[n]) - 2^-15) * x[m, c] -- the true weight minus what the slot decodes to."""
    rows, cols = escape_rows(enc), escape_columns(enc)
    v = enc.esc_val.view(torch.bfloat16).double()
    scale = torch.exp2((SCALE_BIAS - enc.base.to(torch.int64)[rows]).double())
    out = torch.zeros(x.shape[0], enc.shape[0], dtype=torch.float64)
    out.index_add_(1, rows, x.double()[:, cols] * (v * scale - PLACEHOLDER_SCALED))
    return out


@pytest.mark.parametrize("block_n, k_split", [(16, None), (64, None), (256, None), (16, 128), (64, 256)])
def test_entries_add_up_to_the_escape_correction(block_weight, block_n, k_split):
    enc = encode(block_weight(40, 300))
    blocks = build(enc, block_n, k_split)
    x = torch.randn(3, 300).bfloat16()
    got, want = reference_correction(blocks, x, 40), escape_correction(enc, x)
    assert torch.allclose(got, want, rtol=1e-12, atol=0.0)
    assert got[:, 3].abs().sum() > 0 and got[:, 0].abs().sum() == 0  # row 0 has no escapes


def test_each_split_slab_holds_only_its_own_columns(block_weight):
    enc = encode(block_weight(40, 300))
    blocks = build(enc, 16, 128)  # 300 columns padded to 384: three splits of 128
    assert blocks.splits == 3 and blocks.words.shape[0] == 3 * 3
    cols = (blocks.words & 0xFFFFFF).long()
    split = torch.arange(blocks.words.shape[0]) % 3
    real = blocks.values != 0
    assert bool(((cols // 128 == split[:, None]) | ~real).all())
    assert blocks.slot <= build(enc, 16).slot


def test_zeros_take_one_entry_other_escapes_two(block_weight):
    enc = encode(block_weight(40, 300))
    bits = enc.esc_val.to(torch.int32) & 0x7FFF
    zeros = int((bits == 0).sum())
    blocks = build(enc, 16)
    assert blocks.entries == zeros + 2 * (enc.num_escapes - zeros)  # non-zero values; the rest is padding


def test_slot_is_the_power_of_two_covering_the_busiest_block(block_weight):
    enc = encode(block_weight(40, 300))
    for block_n in (16, 64):
        blocks = build(enc, block_n)
        busiest = int((blocks.values != 0).sum(dim=1).max())
        assert blocks.slot >= max(16, busiest) and blocks.slot < 2 * max(16, busiest)
        assert blocks.slot & (blocks.slot - 1) == 0
        assert blocks.words.shape == blocks.values.shape == (-(-40 // block_n), blocks.slot)


@pytest.mark.parametrize("value", [float("inf"), float("nan"), 1e-40])
def test_escapes_no_entry_can_hold_exactly_give_none(block_weight, value):
    w = block_weight(40, 300)
    w[7, 9] = value  # Inf, NaN, a subnormal in a scale-0.02 row (2^-15 below its window: no BF16)
    assert build(encode(w), 16) is None


def test_too_many_entries_in_a_block_and_no_escapes_give_none(block_weight):
    w = block_weight(40, 300)
    w[9] = 0.0  # 300 zero escapes in one row block
    assert 300 > MAX_SLOT and build(encode(w), 16) is None
    assert build(encode(torch.ones(8, 128).bfloat16()), 16) is None


def test_cached_per_weight_and_block_size(block_weight):
    enc = encode(block_weight(40, 300))
    first = escape_blocks(enc, 16)
    assert escape_blocks(enc, 16) is first and escape_blocks(enc, 64) is not first
    moved = enc.to("cpu")
    assert not moved.derived and escape_blocks(moved, 16) is not first
