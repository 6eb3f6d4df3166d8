"""The physical layout of a W12 weight (format version 1), and the bit-level helpers every
encoder, decoder and kernel agrees on.

Owns: the constants of the layout, packing/unpacking the nibble plane, and the dense-code ->
BF16 bit formula. Does not own choosing windows or escapes (`codec.py`), the tensor container
(`weight.py`) or files on disk (`checkpoint.py`).

A BF16 weight W [N, K] (N output rows, K input columns) is stored per row n as:

    base    uint8  [N]           e0, the lowest biased exponent of the row's window; the window is
                                 the 16 exponents e0 .. e0+15, with 1 <= e0 <= 239 so every window
                                 value is a normal number (exponent field 1..254).
    mant    uint8  [N, Kp]       byte k = sign << 7 | mantissa7, in natural column order.
    offs    uint8  [N, Kp / 2]   exponent offsets (exponent - e0, 4 bits). Columns are cut into
                                 groups of 128; nibble byte 64*g + i holds the offset of column
                                 128*g + i in its low nibble and of column 128*g + 64 + i in its
                                 high nibble.
    esc_ptr int32  [N + 1]       escapes in CSR form: row n owns escapes esc_ptr[n] .. esc_ptr[n+1]
    esc_col int16  [E]           their columns, sorted within a row (uint16 values stored in int16;
                                 int32 when Kp > 65536)
    esc_val int16  [E]           their exact BF16 bit patterns

`Kp` is K rounded up to a multiple of 128. Every in-window weight costs 8 + 4 = 12 bits. Weights
outside the window -- zeros, subnormals, +-Inf, NaN with any payload, and normal values of rare
exponents -- are escapes; their plane slots (and the padding columns K..Kp) hold the code 0, the
*placeholder*, which decodes to p = +2^(e0 - 127), the smallest positive value of the window.
Storage: 12 bits per weight, 5 bytes per row (base, CSR pointer), 4 bytes per escape (6 with int32
columns), and the padding of K to Kp -- 12.0098 bits per weight at K = 4096 without escapes.

Why this shape:
  * Decoding is a handful of register ops and needs no table: sign-extend the mant byte and shift
    it to the top of a float32 (sign lands in bit 31, mantissa in bits 22..16), clear the exponent
    field with a mask, and or in (offset + e0) << 23. Shifting the result right by 16 gives the
    BF16 pattern. See `dense_bits`. On the GPU (`specpilot.kernels.tiles.decode_w12_ptx`) a weight
    costs three instructions: one byte permute (sign extension and shift at once), one shift of a
    word of four biased exponents (nibbles + e0 added bytewise for four weights at a time), and
    one bitwise select, giving the float32 (GEMV; tensor cores take it packed to BF16).
  * A program reading 16 bytes of the nibble plane also reads two contiguous 16-byte runs of the
    mant plane (the low and high half of a group) and two contiguous runs of x: every load is a
    full 16-byte vector, with no de-interleaving in registers.
  * Escapes never slow the dense stream: a kernel decodes the placeholder like any other code and
    afterwards adds, in float32 and before rounding its output, y[m, n] += x[m, c] * v - x[m, c] * p
    for each escape (n, c, v) of its rows. Zeros, Inf and NaN then come out as in the reference
    (decode, then a float32 matmul), up to float32 summation order.
"""

from __future__ import annotations

import torch

FORMAT_VERSION = 1
WINDOW = 16  # binary exponents per row window (4-bit offsets)
GROUP = 128  # columns per nibble group
HALF = GROUP // 2  # columns per half group: low nibbles cover the first, high nibbles the second
MIN_BASE = 1  # smallest window bottom (exponent field 0 is zero/subnormal)
MAX_BASE = 254 - (WINDOW - 1)  # 239: largest window bottom (exponent field 255 is Inf/NaN)
BF16_EXP_MASK = 0x7F80


def padded_columns(K: int) -> int:
    """Kp: K rounded up to a whole number of nibble groups."""
    return -(-K // GROUP) * GROUP


def escape_column_dtype(Kp: int) -> torch.dtype:
    """int16 (holding uint16 values) while columns fit in 16 bits, else int32."""
    return torch.int16 if Kp <= 1 << 16 else torch.int32


def pack_offsets(offsets: torch.Tensor) -> torch.Tensor:
    """[R, Kp] offsets in 0..15 (any integer dtype) -> nibble plane [R, Kp/2] uint8."""
    R, Kp = offsets.shape
    o = offsets.to(torch.uint8).view(R, Kp // GROUP, 2, HALF)
    return (o[:, :, 0, :] | (o[:, :, 1, :] << 4)).reshape(R, Kp // 2)


def unpack_offsets(offs: torch.Tensor) -> torch.Tensor:
    """Nibble plane [R, Kp/2] uint8 -> offsets [R, Kp] int32."""
    R, half = offs.shape
    b = offs.to(torch.int32).view(R, half // HALF, 1, HALF)
    return torch.cat([b & 0xF, b >> 4], dim=2).reshape(R, 2 * half)


def dense_bits(mant: torch.Tensor, offsets: torch.Tensor, base: torch.Tensor) -> torch.Tensor:
    """BF16 bit patterns (int32 in 0..65535) of the dense codes; mant/offsets [R, C], base [R]."""
    m = mant.to(torch.int32)
    exponent = base.to(torch.int32)[:, None] + offsets.to(torch.int32)
    return ((m & 0x80) << 8) | (exponent << 7) | (m & 0x7F)


def bits_to_int16(bits: torch.Tensor) -> torch.Tensor:
    """Integers in 0..65535 -> int16 with the same 16 bits (values >= 32768 become negative)."""
    return (((bits + 0x8000) & 0xFFFF) - 0x8000).to(torch.int16)


def bits_to_bf16(bits: torch.Tensor) -> torch.Tensor:
    """int32 patterns in 0..65535 -> the bfloat16 tensor with exactly those bits."""
    return bits_to_int16(bits).view(torch.bfloat16)


def bf16_to_bits(weight: torch.Tensor) -> torch.Tensor:
    """bfloat16 tensor -> its bit patterns as int32 in 0..65535."""
    return weight.contiguous().view(torch.int16).to(torch.int32) & 0xFFFF
