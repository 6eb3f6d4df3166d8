"""The physical layout of a W12 weight (format version 2), and the bit-level helpers every
encoder, decoder and kernel agrees on.

Owns: the constants of the layout, the column order of the planes, packing/unpacking both planes,
and the code -> BF16 bit formula. Does not own choosing windows or escapes (`codec.py`), the
tensor container (`weight.py`) or files on disk (`checkpoint.py`).

Each in-window weight of a BF16 matrix W [N, K] is 12 bits: its sign s, its exponent offset
o = exponent - e0 in the row's window (4 bits), and its 7 mantissa bits m. Per row n:

    base    uint8  [N]           e0, the lowest biased exponent of the row's window; the window is
                                 the 16 exponents e0 .. e0+15, with 1 <= e0 <= 239 so every window
                                 value is a normal number (exponent field 1..254).
    lo      uint8  [N, Kp]       the low byte of each code: (o & 1) << 7 | m.
    hi      uint8  [N, Kp / 2]   the high nibble of each code: s << 3 | o >> 1. Byte 4g + j holds
                                 the nibble of stored position 8g + j in its low half and of
                                 position 8g + 4 + j in its high half.
    esc_ptr int32  [N + 1]       escapes in CSR form: row n owns escapes esc_ptr[n] .. esc_ptr[n+1]
    esc_col int16  [E]           their columns, sorted within a row (uint16 values stored in int16;
                                 int32 when Kp > 65536)
    esc_val int16  [E]           their exact BF16 bit patterns

Column order. Both planes store a row in *stored positions*, not columns: within each block of 32
columns, the 8 codes of group c (stored positions 8c .. 8c+7) are columns 2c + {0, 1, 8, 9, 16,
17, 24, 25} of the block (`stored_columns`). Those are exactly the elements one thread holds in the
A operand of a tensor-core MMA (m16n8k16 / wgmma with A in registers: columns 2c, 2c+1, 2c+8, 2c+9
of each 16-wide step), so a kernel that loads 8 bytes of `lo` and 4 of `hi` has decoded, in
registers, the MMA fragment of two K steps of one row, with no shuffle through shared memory.

`Kp` is K rounded up to a multiple of 128; padding codes are 0. Every in-window weight costs
8 + 4 = 12 bits. Weights outside the window -- zeros, subnormals, +-Inf, NaN with any payload, and
normal values of rare exponents -- are escapes; their slots (and the padding) hold the code 0, the
*placeholder*, which decodes to p = +2^(e0 - 127), the smallest positive value of the window.
Storage: 12 bits per weight, 5 bytes per row (base, CSR pointer), 4 bytes per escape (6 with int32
columns), and the padding of K to Kp -- 12.0098 bits per weight at K = 4096 without escapes.

Decoding, and why the high nibble holds the sign. A kernel decodes the *scaled* weight
w' = w * 2^(SCALE_BIAS - e0), whose exponent field is 112 + o: as 112 is a multiple of 16, w''s
BF16 high byte is s << 7 | 0x38 | o >> 1 and its low byte is the stored `lo` byte, with no carry
from e0 + o. So four high bytes come from one 32-bit word of nibbles with a shift and two bitwise
ops, and each pair of BF16 weights is one byte permute of the `lo` word and that word: ~1.25
instructions per weight in all (format version 1, sign with the mantissa and e0 added in the
kernel, needed ~2.3). The kernel multiplies each row's float32 result by 2^(e0 - SCALE_BIAS); a
scaling by a power of two commutes with every float32 rounding, so the result equals the
unscaled computation's unless a partial sum leaves float32's normal range (|x| * 2^(112 - e0)
would have to pass 2^127; weights near 2^-15 keep it near 1).

Escapes never slow the dense stream: a kernel decodes the placeholder like any other code and
afterwards adds, in float32 and before rounding its output, y[m, n] += x[m, c] * v - x[m, c] * p
for each escape (n, c, v) of its rows. Zeros, Inf and NaN then come out as in the reference
(decode, then a float32 matmul), up to float32 summation order.
"""

from __future__ import annotations

import functools

import torch

FORMAT_VERSION = 2
WINDOW = 16  # binary exponents per row window (4-bit offsets)
K_PAD = 128  # K is padded to a multiple of this; every kernel K tile is a multiple of it
BLOCK = 32  # columns per block of the stored order (two 16-wide MMA K steps)
CODES_PER_WORD = 8  # codes per word pair (a group c): 8 bytes of `lo`, 4 bytes (8 nibbles) of `hi`
MIN_BASE = 1  # smallest window bottom (exponent field 0 is zero/subnormal)
MAX_BASE = 254 - (WINDOW - 1)  # 239: largest window bottom (exponent field 255 is Inf/NaN)
SCALE_BIAS = 112  # kernels decode w * 2^(SCALE_BIAS - e0): exponent field SCALE_BIAS + o
BF16_EXP_MASK = 0x7F80


def padded_columns(K: int) -> int:
    """Kp: K rounded up to a multiple of K_PAD (128)."""
    return -(-K // K_PAD) * K_PAD


def escape_column_dtype(Kp: int) -> torch.dtype:
    """int16 (holding uint16 values) while columns fit in 16 bits, else int32."""
    return torch.int16 if Kp <= 1 << 16 else torch.int32


@functools.cache
def _block_columns() -> tuple[int, ...]:
    """Column (within a 32-column block) of each stored position 0..31: group c = p // 8 holds
    columns 2c + (i % 2) + 8 (i // 2) for i = p % 8."""
    return tuple(2 * (p // 8) + (p % 8) % 2 + 8 * ((p % 8) // 2) for p in range(BLOCK))


def stored_columns(Kp: int, device: torch.device | str = "cpu") -> torch.Tensor:
    """[Kp] int64: the column each stored position holds (a permutation within 32-column blocks)."""
    block = torch.tensor(_block_columns(), dtype=torch.int64, device=device)
    return (torch.arange(0, Kp, BLOCK, device=device)[:, None] + block[None, :]).reshape(Kp)


def stored_positions(columns: torch.Tensor) -> torch.Tensor:
    """The stored position of each column (inverse of `stored_columns`), any integer tensor."""
    c = columns.long()
    within = c % BLOCK
    # column 2g + r + 8q (g = 0..3, r = 0..1, q = 0..3) sits at position 8g + 2q + r
    g, r, q = (within % 8) // 2, within % 2, within // 8
    return c - within + 8 * g + 2 * q + r


def nibble_location(positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(byte of `hi`, bit shift 0 or 4) holding the nibble of each stored position."""
    word, code = positions // CODES_PER_WORD, positions % CODES_PER_WORD
    return word * (CODES_PER_WORD // 2) + code % 4, 4 * (code // 4)


def pack_planes(low: torch.Tensor, nibble: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Codes in column order -> (lo [R, Kp], hi [R, Kp/2]) uint8 in stored order.

    low: [R, Kp] the low bytes (o & 1) << 7 | m; nibble: [R, Kp] s << 3 | o >> 1 (any integer dtype).
    """
    R, Kp = low.shape
    order = stored_columns(Kp, low.device)
    lo = low[:, order].to(torch.uint8)
    n = nibble[:, order].to(torch.uint8).view(R, Kp // CODES_PER_WORD, 2, 4)
    hi = (n[:, :, 0, :] | (n[:, :, 1, :] << 4)).reshape(R, Kp // 2)
    return lo.contiguous(), hi.contiguous()


def unpack_planes(lo: torch.Tensor, hi: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(lo [R, Kp], hi [R, Kp/2]) uint8 -> (low bytes, nibbles), int32 [R, Kp] in column order."""
    R, Kp = lo.shape
    h = hi.to(torch.int32).view(R, Kp // CODES_PER_WORD, 1, 4)
    nib = torch.cat([h & 0xF, h >> 4], dim=2).reshape(R, Kp)
    order = stored_columns(Kp, lo.device)
    low = torch.empty(R, Kp, dtype=torch.int32, device=lo.device)
    nibble = torch.empty_like(low)
    low[:, order] = lo.to(torch.int32)
    nibble[:, order] = nib
    return low, nibble


def code_parts(bits: torch.Tensor, offset: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """BF16 bit patterns and their offsets in the window -> (low byte, nibble), int32, any shape."""
    low = ((offset & 1) << 7) | (bits & 0x7F)
    nibble = (((bits >> 15) & 1) << 3) | (offset >> 1)
    return low, nibble


def dense_bits(low: torch.Tensor, nibble: torch.Tensor, base: torch.Tensor) -> torch.Tensor:
    """BF16 bit patterns (int32 in 0..65535) of the codes; low/nibble [R, C] (column order), base [R]."""
    offset = ((nibble & 7) << 1) | (low >> 7)
    exponent = base.to(torch.int32)[:, None] + offset
    return ((nibble >> 3) << 15) | (exponent << 7) | (low & 0x7F)


def bits_to_int16(bits: torch.Tensor) -> torch.Tensor:
    """Integers in 0..65535 -> int16 with the same 16 bits (values >= 32768 become negative)."""
    return (((bits + 0x8000) & 0xFFFF) - 0x8000).to(torch.int16)


def bits_to_bf16(bits: torch.Tensor) -> torch.Tensor:
    """int32 patterns in 0..65535 -> the bfloat16 tensor with exactly those bits."""
    return bits_to_int16(bits).view(torch.bfloat16)


def bf16_to_bits(weight: torch.Tensor) -> torch.Tensor:
    """bfloat16 tensor -> its bit patterns as int32 in 0..65535."""
    return weight.contiguous().view(torch.int16).to(torch.int32) & 0xFFFF
