"""The reference codec: bit-exact round trips over every BF16 pattern and the window rule."""

import pytest
import torch

from specpilot.w12 import decode, encode
from specpilot.w12.codec import choose_windows, exponent_histogram
from specpilot.w12.layout import (
    MAX_BASE,
    MIN_BASE,
    bf16_to_bits,
    bits_to_bf16,
    padded_columns,
)


def bits(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.int16)


def from_patterns(patterns) -> torch.Tensor:
    return bits_to_bf16(torch.as_tensor(patterns, dtype=torch.int32))


def assert_round_trip(w: torch.Tensor):
    enc = encode(w)
    enc.validate("test")
    assert torch.equal(bits(decode(enc)), bits(w))
    return enc


ALL = from_patterns(torch.arange(65536)).reshape(256, 256)  # row r: patterns 256r .. 256r+255


def test_every_bf16_pattern_round_trips():
    enc = assert_round_trip(ALL)
    # Each row spans two exponents of one sign; only the rows touching exponent 0 (zeros,
    # subnormals) or 255 (Inf, NaN) escape, 128 weights each.
    assert enc.num_escapes == 4 * 128


@pytest.mark.parametrize("shape", [(512, 128), (128, 512), (65536, 1), (1, 65536), (97, 676)])
def test_every_pattern_shuffled_across_rows(shape):
    g = torch.Generator().manual_seed(shape[0])
    flat = ALL.reshape(-1)[torch.randperm(65536, generator=g)]
    n = shape[0] * shape[1]
    w = torch.cat([flat, flat])[:n].reshape(shape)
    assert_round_trip(w)


def test_nan_payloads_zero_signs_inf_and_subnormals_survive():
    g = torch.Generator().manual_seed(0)
    w = (torch.randn(5, 300, generator=g) * 0.02).bfloat16()
    specials = [0x7FC0, 0x7F81, 0x7FFF, 0xFFC1, 0xFF80 | 0x2A, 0x0000, 0x8000, 0x7F80, 0xFF80,
                0x0001, 0x8001, 0x007F, 0x807F, 0x0040]
    cols = torch.randperm(300, generator=g)[: len(specials)]
    w[2, cols] = from_patterns(specials)
    enc = assert_round_trip(w)
    assert int(enc.esc_ptr[3] - enc.esc_ptr[2]) >= len(specials)


def test_all_escape_rows():
    w = torch.zeros(4, 200, dtype=torch.bfloat16)
    w[1] = float("nan")
    w[2] = from_patterns([0x7F80, 0xFF80, 0x0001, 0x8000] * 50)
    w[3, ::2] = -0.0
    enc = assert_round_trip(w)
    assert enc.num_escapes == 4 * 200
    assert enc.base.tolist() == [MIN_BASE] * 4  # no window covers anything: the smallest start wins


def row_with_exponents(exponents, K=64) -> torch.Tensor:
    e = torch.as_tensor(exponents, dtype=torch.int32).repeat(K // len(exponents) + 1)[:K]
    mant = torch.arange(K, dtype=torch.int32) % 128
    sign = (torch.arange(K, dtype=torch.int32) % 3 == 0).to(torch.int32)
    return bits_to_bf16((sign << 15) | (e << 7) | mant)[None, :]


@pytest.mark.parametrize(
    "exponents, base",
    [
        (range(239, 255), MAX_BASE),  # the top of the range: window 239..254
        (range(240, 255), MAX_BASE),  # fewer exponents at the top still end at 254
        (range(1, 17), MIN_BASE),  # the bottom: window 1..16
        (range(1, 11), MIN_BASE),
        ([254], MAX_BASE),  # a single exponent: the smallest start still covering it
        ([100], 85),
    ],
)
def test_window_at_the_edges_of_the_exponent_range(exponents, base):
    w = row_with_exponents(list(exponents))
    enc = assert_round_trip(w)
    assert enc.base.tolist() == [base]
    assert enc.num_escapes == 0


def test_ties_go_to_the_smallest_start_deterministically():
    # Two equal clusters 40 binades apart: windows starting 85..100 and 125..140 tie.
    w = row_with_exponents([100, 140])
    enc = assert_round_trip(w)
    assert enc.base.tolist() == [85]
    assert enc.num_escapes == 32
    again = encode(w.clone())
    assert all(torch.equal(a, b) for a, b in zip(enc.planes().values(), again.planes().values()))
    flipped = encode(w.flip(1))  # column order does not matter to the window
    assert flipped.base.tolist() == [85]


def brute_force_base(row_bits: list[int]) -> int:
    exps = [(b >> 7) & 0xFF for b in row_bits]
    best, best_start = -1, None
    for start in range(MIN_BASE, MAX_BASE + 1):
        covered = sum(1 for e in exps if start <= e < start + 16)
        if covered > best:
            best, best_start = covered, start
    return best_start


def test_window_choice_matches_brute_force():
    g = torch.Generator().manual_seed(3)
    scales = torch.exp2(torch.randint(-40, 40, (24, 1), generator=g).float())
    spread = torch.exp2(torch.randint(0, 30, (24, 1), generator=g).float())
    w = (torch.randn(24, 50, generator=g) * scales * torch.rand(24, 50, generator=g) ** spread).bfloat16()
    b = bf16_to_bits(w)
    chosen = choose_windows(exponent_histogram(b))
    assert chosen.tolist() == [brute_force_base(row) for row in b.tolist()]
    assert_round_trip(w)


@pytest.mark.parametrize("shape", [(1, 1), (1, 7), (7, 1), (37, 300), (3, 128), (2, 129), (5, 383)])
def test_shapes_not_divisible_by_any_block(shape):
    g = torch.Generator().manual_seed(sum(shape))
    w = (torch.randn(shape, generator=g) * 0.02).bfloat16()
    w.view(-1)[0] = 0.0
    enc = assert_round_trip(w)
    assert enc.lo.shape == (shape[0], padded_columns(shape[1]))
    assert enc.hi.shape == (shape[0], padded_columns(shape[1]) // 2)


def test_dense_codes_follow_the_layout():
    # e0 = 112 (the smallest start covering exponents 116..127), so offset o = exponent - 112.
    # column  value                     s  exp  o   m     lo = (o&1)<<7|m  nibble = s<<3|o>>1  stored position
    #   0     1.5        0x3FC0          0  127  15  0x40  0xC0             0x7                 0
    #   2     -0.75      0xBF40          1  126  14  0x40  0x40             0xF                 8
    #   8     149/8192   121<<7 | 0x15   0  121   9  0x15  0x95             0x4                 2
    #  16     -1.0       0xBF80          1  127  15  0x00  0x80             0xF                 4
    #  17     -255/2^18  sign|116<<7|7F  1  116   4  0x7F  0x7F             0xA                 5
    # 129     1.5        0x3FC0          0  127  15  0x40  0xC0             0x7                 129
    # Every other column is 0.0: an escape, whose slot holds the placeholder code 0.
    w = torch.zeros(1, 130, dtype=torch.bfloat16)
    cols = [0, 2, 8, 16, 17, 129]
    w[0, cols] = from_patterns([0x3FC0, 0xBF40, (121 << 7) | 0x15, 0xBF80, 0x8000 | (116 << 7) | 0x7F, 0x3FC0])
    enc = assert_round_trip(w)
    assert int(enc.base[0]) == 112
    assert enc.num_escapes == 130 - len(cols)
    lo, hi = enc.lo[0].tolist(), enc.hi[0].tolist()
    # lo: position p holds the column stored there (2 <-> 8 swap places; 16 and 17 sit at 4 and 5).
    assert lo[0] == 0xC0 and lo[8] == 0x40 and lo[2] == 0x95 and lo[4] == 0x80 and lo[5] == 0x7F
    assert lo[129] == 0xC0
    assert lo[1] == lo[9] == 0  # columns 1 and 3 (positions 1 and 9) are escapes
    # hi byte 4g + j: position 8g + j in the low nibble, 8g + 4 + j in the high nibble.
    assert hi[0] == 0x7 | 0xF << 4  # positions 0 (column 0) and 4 (column 16)
    assert hi[1] == 0x0 | 0xA << 4  # positions 1 (column 1, escape) and 5 (column 17)
    assert hi[2] == 0x4 | 0x0 << 4  # positions 2 (column 8) and 6 (column 24, escape)
    assert hi[4] == 0xF | 0x0 << 4  # positions 8 (column 2) and 12 (column 18, escape)
    assert hi[65] == 0x7  # positions 129 (column 129) and 133 (column 145, padding)
    assert hi[3] == hi[5] == hi[6] == hi[7] == hi[64] == 0  # escapes and padding only
    assert lo[130:] == [0] * 126 and hi[66:] == [0] * 62  # block 4 beyond 128/129 and block 5+: padding


def test_wide_rows_store_escape_columns_in_int32():
    K = 65536 + 100
    w = torch.full((2, K), 0.5, dtype=torch.bfloat16)
    w[1, 65600] = 0.0
    w[0, 3] = float("inf")
    enc = assert_round_trip(w)
    assert enc.esc_col.dtype == torch.int32
    narrow = encode(w[:, :65536])
    assert narrow.esc_col.dtype == torch.int16
    assert torch.equal(bits(decode(narrow)), bits(w[:, :65536]))


def test_rejects_what_it_cannot_store_exactly():
    with pytest.raises(TypeError):
        encode(torch.zeros(3, 4))
    with pytest.raises(ValueError):
        encode(torch.zeros(4, dtype=torch.bfloat16))
    with pytest.raises(ValueError):
        encode(torch.zeros(0, 4, dtype=torch.bfloat16))
