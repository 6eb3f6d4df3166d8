"""W12Weight: exact storage cost, row fusion, device moves and validation of untrusted planes."""

import dataclasses

import pytest
import torch

from specpilot.errors import CheckpointError
from specpilot.models.fusion import concat_rows
from specpilot.w12 import W12Weight, decode, encode
from specpilot.w12.layout import padded_columns


def random_weight(N, K, seed=0, std=0.02):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(N, K, generator=g) * std).bfloat16()


def test_storage_cost_counts_every_byte():
    w = random_weight(37, 300)
    w[0, :5] = 0.0
    w[3, 7] = float("nan")
    enc = encode(w)
    N, K, E = 37, 300, enc.num_escapes
    Kp = padded_columns(K)
    expected = N * Kp + N * Kp // 2 + N + 4 * (N + 1) + E * (2 + 2)
    assert E == 6
    assert enc.nbytes_total == expected
    assert enc.bits_per_weight == pytest.approx(8 * expected / (N * K))


def test_random_projection_weights_cost_about_twelve_bits():
    # Per-row overhead (1 byte of base + 4 of CSR pointer) over K = 4096 is 0.0098 bits/weight; a
    # normal weight escapes when it is below the window (|w| < 2^-16 of its top, about 4e-5 of
    # them) or above it (beyond ~3 sigma when the window sits low), each costing 32 bits.
    enc = encode(random_weight(256, 4096, seed=1))
    assert 12.0 < enc.bits_per_weight < 12.02
    assert enc.num_escapes < 1e-4 * 256 * 4096


def test_concat_rows_stacks_rows_and_escapes():
    parts = [random_weight(n, 300, seed=n) for n in (5, 1, 9)]
    parts[0][4, 0] = 0.0
    parts[2][0, 299] = float("inf")
    parts[2][8, :] = 0.0
    fused = concat_rows([encode(p) for p in parts])
    assert isinstance(fused, W12Weight) and fused.shape == (15, 300)
    fused.validate("fused")
    assert torch.equal(decode(fused).view(torch.int16), torch.cat(parts).view(torch.int16))
    with pytest.raises(ValueError):
        W12Weight.concat_rows([encode(random_weight(2, 300)), encode(random_weight(2, 301))])


def test_to_moves_every_plane_and_keeps_shape():
    enc = encode(random_weight(3, 130))
    moved = enc.to("cpu")
    assert moved.shape == enc.shape and moved.device == torch.device("cpu")
    assert "N=3, K=130" in repr(enc)


def test_planes_with_wrong_dtype_or_shape_are_refused():
    enc = encode(random_weight(3, 130))
    with pytest.raises(ValueError, match="offs"):
        dataclasses.replace(enc, offs=enc.offs[:, :-1].contiguous())
    with pytest.raises(ValueError, match="base"):
        dataclasses.replace(enc, base=enc.base.to(torch.int32))


def corrupt(enc: W12Weight, **changes) -> W12Weight:
    return dataclasses.replace(enc, **changes)


def test_validate_catches_what_would_break_the_kernels():
    w = random_weight(4, 200, seed=5)
    w[1, 10] = 0.0
    w[1, 20] = 0.0
    enc = encode(w)
    enc.validate("ok")
    base = enc.base.clone()
    base[0] = 250
    with pytest.raises(CheckpointError, match="window base"):
        corrupt(enc, base=base).validate("x")
    ptr = enc.esc_ptr.clone()
    ptr[-1] += 1
    with pytest.raises(CheckpointError, match="CSR"):
        corrupt(enc, esc_ptr=ptr).validate("x")
    col = enc.esc_col.flip(0).contiguous()
    with pytest.raises(CheckpointError, match="increasing"):
        corrupt(enc, esc_col=col).validate("x")
    col = enc.esc_col.clone()
    col[0] = 250
    with pytest.raises(CheckpointError, match="out of range"):
        corrupt(enc, esc_col=col).validate("x")
    mant = enc.mant.clone()
    mant[1, 10] = 3
    with pytest.raises(CheckpointError, match="placeholder"):
        corrupt(enc, mant=mant).validate("x")
    offs = enc.offs.clone()
    offs[1, 20] = 0x10  # high nibble: column 84, not an escape -> fine
    corrupt(enc, offs=offs).validate("x")
    offs[1, 20] = 0x01  # low nibble: column 20, an escape
    with pytest.raises(CheckpointError, match="placeholder"):
        corrupt(enc, offs=offs).validate("x")
