"""W12Weight: exact storage cost, row fusion, device moves and validation of untrusted planes."""

import dataclasses

import pytest
import torch

from specpilot.errors import CheckpointError
from specpilot.models.fusion import concat_rows
from specpilot.w12 import W12Weight, decode, encode
from specpilot.w12.layout import padded_columns, stored_positions


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
    with pytest.raises(ValueError, match="plane hi "):
        dataclasses.replace(enc, hi=enc.hi[:, :-1].contiguous())
    with pytest.raises(ValueError, match="plane lo "):
        dataclasses.replace(enc, lo=enc.lo.to(torch.int16))
    with pytest.raises(ValueError, match="base"):
        dataclasses.replace(enc, base=enc.base.to(torch.int32))


def corrupt(enc: W12Weight, **changes) -> W12Weight:
    return dataclasses.replace(enc, **changes)


def assert_validate(enc: W12Weight, fails: bool) -> None:
    """validate() raises the placeholder error exactly when `fails`."""
    if fails:
        with pytest.raises(CheckpointError, match="placeholder"):
            enc.validate("x")
    else:
        enc.validate("x")


def test_validate_catches_what_would_break_the_kernels():
    w = random_weight(4, 200, seed=5)
    w[1, 8] = 0.0
    w[1, 17] = 0.0
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


def test_validate_finds_escape_slots_at_their_stored_positions():
    # Row 1 escapes columns 8 and 17. Stored positions: column 8 -> 2, column 17 -> 5 (column 2
    # sits at position 8): a check in column order would look at the wrong slots.
    w = random_weight(4, 200, seed=5)
    w[1, 8] = 0.0
    w[1, 17] = 0.0
    enc = encode(w)
    assert stored_positions(torch.tensor([8, 17, 2])).tolist() == [2, 5, 8]
    assert enc.esc_col[enc.esc_ptr[1] : enc.esc_ptr[2]].tolist() == [8, 17]
    for position, fails in ((2, True), (5, True), (8, False), (17, False)):
        lo = enc.lo.clone()
        lo[1, position] = 3  # positions 8 and 17 hold columns 2 and 5: where a column-order check looks
        assert_validate(corrupt(enc, lo=lo), fails)
    # hi byte 4g + j: low nibble position 8g + j, high nibble 8g + 4 + j.
    for byte, flip, fails in (
        (2, 0x01, True),  # low nibble: position 2 = column 8, an escape
        (2, 0x10, False),  # high nibble: position 6 = column 24
        (1, 0x10, True),  # high nibble: position 5 = column 17, an escape
        (1, 0x01, False),  # low nibble: position 1 = column 1
        (4, 0x01, False),  # low nibble: position 8 = column 2, not column 8
    ):
        hi = enc.hi.clone()
        hi[1, byte] ^= flip
        assert_validate(corrupt(enc, hi=hi), fails)


def test_take_rows_permutes_and_splits_exactly():
    """Rows are stored independently: any row selection (with their escapes) decodes to those rows."""
    from specpilot.w12.codec import decode, encode

    g = torch.Generator().manual_seed(0)
    w = (torch.randn(37, 96, generator=g) * 0.02).to(torch.bfloat16)
    w[3, 5] = 3.0e4  # escapes in some rows
    w[20, :4] = -1.0e-30
    enc = encode(w)
    perm = torch.randperm(37, generator=g)
    assert torch.equal(decode(enc.take_rows(perm)).view(torch.int16), w[perm].view(torch.int16))
    parts = enc.split_rows([10, 27])
    assert torch.equal(decode(parts[1]).view(torch.int16), w[10:].view(torch.int16))
    assert torch.equal(decode(type(enc).concat_rows(parts)).view(torch.int16), w.view(torch.int16))
