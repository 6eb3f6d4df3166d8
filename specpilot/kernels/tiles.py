"""Triton building blocks shared by the GEMV, GEMM and unpack kernels.

Owns: reading one [BLOCK_N, BLOCK_K] weight tile (W12 planes decoded in registers, or plain
weights), the two W12 decoders (portable Triton ops, and inline PTX for the GPU: same bits, about
half the instructions), BF16 widening, the deterministic split-K reduction, and the escape
correction of the GEMV path. Every function here is `@triton.jit` and inlined into its caller.
Imports Triton at module level, so only kernel modules import it, lazily (see
`specpilot.kernels.dispatch`).

Tile geometry: a K tile of BLOCK_K columns starting at k0 (a multiple of 128) is read as two
halves of HALF_K = BLOCK_K / 2 columns, `lo` = k0 + j + 64 * (j // 64) and `hi` = lo + 64 for
j < HALF_K: exactly the columns whose offsets share nibble byte k0 / 2 + j (see
`specpilot.w12.layout`). Plain weights are read at the same columns so both formats share one
kernel body; a dot product does not care about the order of K.
"""

from __future__ import annotations

import triton
import triton.language as tl

from specpilot.w12 import layout

HALF: tl.constexpr = tl.constexpr(layout.HALF)
EXP_FIELD: tl.constexpr = tl.constexpr(0x7F800000)  # float32 exponent bits


@triton.jit
def decode_w12(mant, nibble, exp_bits):
    """uint8 sign|mantissa bytes, int32 offsets 0..15, int32 (e0 << 23) -> float32 weights (exact)."""
    # Sign-extending the byte puts the sign in bit 31 and the mantissa in bits 22..16; the mask
    # clears what the extension smeared over the exponent field; the or writes e0 + offset there.
    top = mant.to(tl.int8, bitcast=True).to(tl.int32) << 16
    bits = (top & ~EXP_FIELD) | ((nibble << 23) + exp_bits)
    return bits.to(tl.float32, bitcast=True)


# Four weights per instance, in PTX: $4 packs 4 mant bytes, $5 the 4 nibble bytes, $6 is e0 * 0x01010101.
#   e  = (nibbles & 0x0F0F0F0F) + e0 per byte        4 biased exponents at once (e0 + 15 <= 254: no carry)
#   t  = prmt(mant, 0, 0x8j44)                       byte j sign-extended and shifted left by 16
#   $j = lop3(t, e << (23 - 8j), 0x807FFFFF, 0xE4)   select: sign and mantissa from t, exponent from e
# (t's low 16 bits are zero, so the select needs one mask). 3 instructions per weight + 2-3 per 4.
_ASM_TAIL = """
prmt.b32 t, $4, z, 0x8044; shl.b32 $0, e, 23; lop3.b32 $0, t, $0, k, 0xE4;
prmt.b32 t, $4, z, 0x9144; shl.b32 $1, e, 15; lop3.b32 $1, t, $1, k, 0xE4;
prmt.b32 t, $4, z, 0xA244; shl.b32 $2, e, 7;  lop3.b32 $2, t, $2, k, 0xE4;
prmt.b32 t, $4, z, 0xB344; shr.u32 $3, e, 1;  lop3.b32 $3, t, $3, k, 0xE4;
}"""
_ASM_HEAD = "{\n.reg .b32 e, t, z, k;\nmov.b32 z, 0;\nmov.b32 k, 0x807FFFFF;\n"
ASM_DECODE_LOW: tl.constexpr = tl.constexpr(_ASM_HEAD + "and.b32 e, $5, 0x0F0F0F0F;\nadd.u32 e, e, $6;" + _ASM_TAIL)
ASM_DECODE_HIGH: tl.constexpr = tl.constexpr(
    _ASM_HEAD + "shr.u32 e, $5, 4;\nand.b32 e, e, 0x0F0F0F0F;\nadd.u32 e, e, $6;" + _ASM_TAIL
)


@triton.jit
def decode_w12_ptx(mant, nib, exp_bytes, HIGH: tl.constexpr):
    """`decode_w12` in PTX, 4 weights at a time: uint8 mant and nibble-byte tiles (low or high nibbles),
    int32 e0 * 0x01010101 broadcast to the tile -> float32 weights. GPU only (no interpreter)."""
    if HIGH:
        return tl.inline_asm_elementwise(ASM_DECODE_HIGH, "=r,=r,=r,=r,r,r,r,r,r,r", [mant, nib, exp_bytes],
                                         dtype=tl.float32, is_pure=True, pack=4)
    return tl.inline_asm_elementwise(ASM_DECODE_LOW, "=r,=r,=r,=r,r,r,r,r,r,r", [mant, nib, exp_bytes],
                                     dtype=tl.float32, is_pure=True, pack=4)


@triton.jit
def to_float32(v, PTX: tl.constexpr):
    """v as float32. BF16 pairs widen with one shift or mask each in PTX (the compiler's conversion
    spends a byte permute more on every second element); other dtypes convert normally."""
    if PTX and v.dtype == tl.bfloat16:
        return tl.inline_asm_elementwise("shl.b32 $0, $2, 16;\nand.b32 $1, $2, 0xFFFF0000;", "=r,=r,r", [v],
                                         dtype=tl.float32, is_pure=True, pack=2)
    return v.to(tl.float32)


@triton.jit
def tile_columns(k0, HALF_K: tl.constexpr):
    """Columns [HALF_K] of the low half of the K tile starting at k0 (the high half is + 64)."""
    j = tl.arange(0, HALF_K)
    lo = k0 + j + (j // HALF) * HALF
    return tl.max_contiguous(tl.multiple_of(lo, HALF), HALF)  # runs of 64 starting at multiples of 64


@triton.jit
def load_weight_tile(
    w_ptr, nib_ptr, base_ptr,
    rows, k0, N, K, Kp,
    stride_w, stride_nib,
    IS_W12: tl.constexpr, HALF_K: tl.constexpr, EVEN_N: tl.constexpr, EVEN_K: tl.constexpr,
    PTX_DECODE: tl.constexpr,
):
    """Weights of `rows` x the K tile at k0 as (lo [BN, HALF_K], hi [BN, HALF_K], lo columns [HALF_K]).

    W12 tiles come back as float32 (decoded, placeholders included); plain tiles in their own dtype.
    Out-of-range rows and columns read as code 0 / zero; callers mask x so they contribute nothing.
    PTX_DECODE selects the inline-PTX decoder (GPU) over the portable one (same bits).
    """
    lo = tile_columns(k0, HALF_K)
    hi = lo + HALF
    row_ok = rows < N
    if IS_W12:
        col_ok = lo < Kp  # the planes are padded to Kp; lo < Kp implies hi < Kp
        mask = row_ok[:, None] & col_ok[None, :]
        nib_cols = tl.max_contiguous(tl.multiple_of(k0 // 2 + tl.arange(0, HALF_K), HALF_K), HALF_K)
        if EVEN_N and EVEN_K:
            nib = tl.load(nib_ptr + rows[:, None] * stride_nib + nib_cols[None, :])
            m_lo = tl.load(w_ptr + rows[:, None] * stride_w + lo[None, :])
            m_hi = tl.load(w_ptr + rows[:, None] * stride_w + hi[None, :])
        else:
            nib = tl.load(nib_ptr + rows[:, None] * stride_nib + nib_cols[None, :], mask=mask, other=0)
            m_lo = tl.load(w_ptr + rows[:, None] * stride_w + lo[None, :], mask=mask, other=0)
            m_hi = tl.load(w_ptr + rows[:, None] * stride_w + hi[None, :], mask=mask, other=0)
        base = tl.load(base_ptr + rows, mask=row_ok, other=1).to(tl.int32)[:, None]
        if PTX_DECODE:
            exp_bytes = tl.broadcast_to(base * 0x01010101, m_lo.shape)
            w_lo = decode_w12_ptx(m_lo, nib, exp_bytes, False)
            w_hi = decode_w12_ptx(m_hi, nib, exp_bytes, True)
        else:
            nib = nib.to(tl.int32)
            w_lo = decode_w12(m_lo, nib & 0xF, base << 23)
            w_hi = decode_w12(m_hi, nib >> 4, base << 23)
    else:
        if EVEN_N and EVEN_K:
            w_lo = tl.load(w_ptr + rows[:, None] * stride_w + lo[None, :])
            w_hi = tl.load(w_ptr + rows[:, None] * stride_w + hi[None, :])
        else:
            w_lo = tl.load(w_ptr + rows[:, None] * stride_w + lo[None, :],
                           mask=row_ok[:, None] & (lo < K)[None, :], other=0.0)
            w_hi = tl.load(w_ptr + rows[:, None] * stride_w + hi[None, :],
                           mask=row_ok[:, None] & (hi < K)[None, :], other=0.0)
    return w_lo, w_hi, lo


@triton.jit
def reduce_split_k(acc, ws_ptr, count_ptr, tile, pid_k, split_k, ws_offsets, ws_mask, split_stride):
    """Deterministic split-K: every split stores its float32 partial; the last to arrive at the
    tile's counter sums all partials in split order 0..split_k-1 and resets the counter.

    Returns (is_last, total); only the last split may use `total`. The barrier before the atomic
    (acq_rel, gpu scope) orders all threads' partial stores before the arrival; `.cg` loads read
    the partials from L2, never from a stale L1 line.
    """
    tl.store(ws_ptr + pid_k * split_stride + ws_offsets, acc, mask=ws_mask)
    tl.debug_barrier()
    arrived = tl.atomic_add(count_ptr + tile, 1)
    is_last = arrived == split_k - 1
    total = acc
    if is_last:
        total = tl.zeros_like(acc)
        for s in range(split_k):
            total += tl.load(ws_ptr + s * split_stride + ws_offsets, mask=ws_mask, other=0.0, cache_modifier=".cg")
        tl.atomic_xchg(count_ptr + tile, 0)
    return is_last, total


@triton.jit
def escape_columns(esc_col_ptr, e, emask):
    """Escape columns [CHUNK] as int32 (int16 storage holds uint16 values)."""
    col = tl.load(esc_col_ptr + e, mask=emask, other=0).to(tl.int32)
    if esc_col_ptr.dtype.element_ty == tl.int16:
        col = col & 0xFFFF
    return col


@triton.jit
def escape_values(esc_val_ptr, e, emask):
    """(float32 values [CHUNK], is-finite [CHUNK]) of escapes e from their BF16 bit patterns."""
    bits = tl.load(esc_val_ptr + e, mask=emask, other=0).to(tl.int32) << 16
    finite = (bits & EXP_FIELD) != EXP_FIELD
    return bits.to(tl.float32, bitcast=True), finite


@triton.jit
def placeholder_values(base_ptr, rows, N):
    """p = 2^(e0 - 127) per row [BN], the value every escape slot decodes to."""
    return (tl.load(base_ptr + rows, mask=rows < N, other=1).to(tl.int32) << 23).to(tl.float32, bitcast=True)


@triton.jit
def escape_correction_mn(
    x_ptr, esc_ptr_ptr, esc_col_ptr, esc_val_ptr, base_ptr,
    rows, row0, M, N, stride_xm,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, CHUNK: tl.constexpr,
):
    """[BLOCK_M, BLOCK_N] float32: sum over the escapes (n, c, v) of `rows` of x[m, c] * v - x[m, c] * p_n.

    Escapes are visited CHUNK at a time; `where` (a select, not a product) keeps an Inf or NaN
    escape out of the rows that do not own it.
    """
    m = tl.arange(0, BLOCK_M)
    row_ok = rows < N
    own_lo = tl.load(esc_ptr_ptr + rows, mask=row_ok, other=0)
    own_hi = tl.load(esc_ptr_ptr + rows + 1, mask=row_ok, other=0)
    first = tl.load(esc_ptr_ptr + row0)
    last = tl.load(esc_ptr_ptr + tl.minimum(row0 + BLOCK_N, N))
    p = placeholder_values(base_ptr, rows, N)
    corr = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    for e0 in range(first, last, CHUNK):
        e = e0 + tl.arange(0, CHUNK)
        emask = e < last
        col = escape_columns(esc_col_ptr, e, emask)
        v, _ = escape_values(esc_val_ptr, e, emask)
        xe = tl.load(x_ptr + m[:, None] * stride_xm + col[None, :],
                     mask=(m < M)[:, None] & emask[None, :], other=0.0).to(tl.float32)  # [BM, CHUNK]
        own = (e[:, None] >= own_lo[None, :]) & (e[:, None] < own_hi[None, :])  # [CHUNK, BN]
        term = xe[:, :, None] * v[None, :, None] - xe[:, :, None] * p[None, None, :]  # [BM, CHUNK, BN]
        corr += tl.sum(tl.where(own[None, :, :], term, 0.0), axis=1)
    return corr
