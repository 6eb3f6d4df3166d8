"""The W12 layout helpers: the stored column order, packing both planes, and the code <-> bits formula."""

import pytest
import torch

from specpilot.w12.layout import (
    BLOCK,
    MAX_BASE,
    MIN_BASE,
    SCALE_BIAS,
    WINDOW,
    bf16_to_bits,
    bits_to_bf16,
    code_parts,
    dense_bits,
    nibble_location,
    pack_planes,
    stored_columns,
    stored_positions,
    unpack_planes,
)

KPS = [128, 256, 4096, 65536 + 128]


@pytest.mark.parametrize("Kp", KPS)
def test_stored_columns_permute_within_blocks_and_stored_positions_invert_them(Kp):
    columns = stored_columns(Kp)  # [Kp]
    assert columns.dtype == torch.int64 and columns.shape == (Kp,)
    assert torch.equal(columns.sort().values, torch.arange(Kp))
    blocks = columns.view(Kp // BLOCK, BLOCK) // BLOCK  # the block of each stored position's column
    assert torch.equal(blocks, torch.arange(Kp // BLOCK)[:, None].expand(-1, BLOCK))
    assert torch.equal(stored_positions(columns), torch.arange(Kp))
    assert torch.equal(columns[stored_positions(torch.arange(Kp))], torch.arange(Kp))


def test_stored_positions_accepts_any_integer_tensor():
    c = torch.tensor([[8, 2], [17, 65608]], dtype=torch.int32)  # 65608 = 32 * 2050 + 8
    assert stored_positions(c).tolist() == [[2, 8], [5, 65602]]
    assert stored_positions(c[:, :1].to(torch.int16)).tolist() == [[2], [5]]


def test_each_group_holds_one_threads_mma_fragment():
    # Group c of a block (stored positions 8c .. 8c+7) holds columns 2c + {0, 1, 8, 9, 16, 17, 24, 25}.
    columns = stored_columns(256).tolist()
    assert columns[0:8] == [0, 1, 8, 9, 16, 17, 24, 25]  # block 0, c = 0
    assert columns[24:32] == [6, 7, 14, 15, 22, 23, 30, 31]  # block 0, c = 3
    assert columns[160 + 24 : 160 + 32] == [166, 167, 174, 175, 182, 183, 190, 191]  # block 5, c = 3
    for block in range(0, 256, BLOCK):
        for c in range(4):
            expected = [block + 2 * c + d for d in (0, 1, 8, 9, 16, 17, 24, 25)]
            assert columns[block + 8 * c : block + 8 * c + 8] == expected


def random_codes(R, Kp, seed=0):
    g = torch.Generator().manual_seed(seed)
    low = torch.randint(0, 256, (R, Kp), generator=g, dtype=torch.int32)
    nibble = torch.randint(0, 16, (R, Kp), generator=g, dtype=torch.int32)
    return low, nibble


@pytest.mark.parametrize("R, Kp", [(1, 128), (5, 256), (3, 4096)])
def test_pack_and_unpack_planes_round_trip(R, Kp):
    low, nibble = random_codes(R, Kp, seed=Kp)
    lo, hi = pack_planes(low, nibble)
    assert lo.dtype == hi.dtype == torch.uint8
    assert lo.shape == (R, Kp) and hi.shape == (R, Kp // 2)
    assert lo.is_contiguous() and hi.is_contiguous()
    back_low, back_nibble = unpack_planes(lo, hi)
    assert back_low.dtype == back_nibble.dtype == torch.int32
    assert torch.equal(back_low, low) and torch.equal(back_nibble, nibble)


def test_pack_planes_puts_each_code_in_its_byte_and_half():
    # One column at a time: its low byte lands at its stored position p, its nibble in hi byte
    # 4 (p // 8) + p % 4, low half when p % 8 < 4; nothing else is touched.
    Kp = 128
    for column in range(Kp):
        low = torch.zeros(1, Kp, dtype=torch.int32)
        nibble = torch.zeros(1, Kp, dtype=torch.int32)
        low[0, column], nibble[0, column] = 0xA5, 0xB
        lo, hi = pack_planes(low, nibble)
        p = int(stored_positions(torch.tensor(column)))
        expected_lo = torch.zeros(Kp, dtype=torch.uint8)
        expected_lo[p] = 0xA5
        expected_hi = torch.zeros(Kp // 2, dtype=torch.uint8)
        expected_hi[4 * (p // 8) + p % 4] = 0xB if p % 8 < 4 else 0xB0
        assert torch.equal(lo[0], expected_lo) and torch.equal(hi[0], expected_hi), column
        byte, shift = nibble_location(torch.tensor(p))  # what W12Weight.validate reads
        assert (int(hi[0, int(byte)]) >> int(shift)) & 0xF == 0xB, column


def every_code(base: torch.Tensor):
    """[R] bases -> BF16 bits [R, 4096] of every in-window value (16 offsets x 2 signs x 128
    mantissas) of each row's window, and their offsets."""
    offset = torch.arange(WINDOW, dtype=torch.int32).repeat_interleave(256)  # [4096]
    sign = torch.arange(2, dtype=torch.int32).repeat_interleave(128).repeat(WINDOW)
    mantissa = torch.arange(128, dtype=torch.int32).repeat(2 * WINDOW)
    exponent = base.to(torch.int32)[:, None] + offset
    return (sign << 15) | (exponent << 7) | mantissa, offset.expand(base.shape[0], -1)


def test_code_parts_and_dense_bits_invert_each_other_for_every_window():
    base = torch.arange(MIN_BASE, MAX_BASE + 1, dtype=torch.int32)  # [239]
    bits, offset = every_code(base)  # [239, 4096]
    low, nibble = code_parts(bits, offset)
    assert int(low.min()) == 0 and int(low.max()) == 255
    assert int(nibble.min()) == 0 and int(nibble.max()) == 15
    # The 4096 values of a window get the 4096 distinct 12-bit codes.
    codes = (nibble << 8) | low
    assert torch.equal(codes.sort(dim=1).values, torch.arange(4096, dtype=torch.int32).expand_as(codes))
    assert torch.equal(dense_bits(low, nibble, base), bits)


def test_code_parts_by_hand():
    # 1.5 (exponent 127, mantissa 0x40) and -0.75 (sign, exponent 126, mantissa 0x40) at e0 = 112:
    # offsets 15 and 14 -> low bytes 0x80 | 0x40 and 0x40, nibbles 0 << 3 | 7 and 1 << 3 | 7.
    bits = bf16_to_bits(torch.tensor([1.5, -0.75], dtype=torch.bfloat16))
    low, nibble = code_parts(bits, torch.tensor([15, 14], dtype=torch.int32))
    assert low.tolist() == [0xC0, 0x40] and nibble.tolist() == [0x7, 0xF]
    assert dense_bits(low[None], nibble[None], torch.tensor([112])).tolist() == [[0x3FC0, 0xBF40]]


def test_scaled_decode_is_a_byte_formula():
    # The kernels decode with e0 = SCALE_BIAS: the BF16 high byte is s << 7 | 0x38 | o >> 1, that
    # is, the nibble's sign bit moved to bit 7 and 0x38 or-ed in; the low byte is the `lo` byte.
    assert SCALE_BIAS % WINDOW == 0 and MIN_BASE <= SCALE_BIAS <= MAX_BASE
    bits, offset = every_code(torch.tensor([SCALE_BIAS]))
    low, nibble = code_parts(bits, offset)
    high_byte = ((nibble & 8) << 4) | 0x38 | (nibble & 7)
    assert torch.equal(dense_bits(low, nibble, torch.tensor([SCALE_BIAS])), (high_byte << 8) | low)


def test_bit_pattern_conversions_round_trip():
    patterns = torch.arange(65536, dtype=torch.int32)
    assert torch.equal(bf16_to_bits(bits_to_bf16(patterns)), patterns)
