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


# BF16 pairs straight from the planes, four weights per instance (pack=4 -> two packed registers):
# $2 packs 4 mant bytes m0..m3, $3 the 4 nibble bytes, $4 is e0 * 0x01010101; $0 = (w0, w1), $1 = (w2, w3),
# element 0 in the low half.
#   e  = (nibbles & 0x0F0F0F0F) + e0 per byte, then bytes permuted to (e0, e2, e1, e3)
#   p  = prmt(mant, 0, 0x9180) = (m0, sign0 x 8, m1, sign1 x 8)     [(m2, s2, m3, s3) for $1]
#   q  = e << 7: e0 at bits 7..14, e1 at bits 23..30                 [e >> 1 for $1: e2, e3]
#   $0 = lop3(p, q, 0x807F807F, 0xE4): mantissas and signs from p, exponents from q.
# Per 4 weights: 2-3 (exponents) + 1 (permute) + 2 shifts + 2 prmt + 2 lop3, no float32 -> BF16 conversion.
_ASM_BF16_TAIL = """
prmt.b32 e, e, z, 0x3120;
shl.b32 q, e, 7; prmt.b32 p, $2, z, 0x9180; lop3.b32 $0, p, q, k, 0xE4;
shr.u32 q, e, 1; prmt.b32 p, $2, z, 0xB3A2; lop3.b32 $1, p, q, k, 0xE4;
}"""
_ASM_BF16_HEAD = "{\n.reg .b32 e, p, q, z, k;\nmov.b32 z, 0;\nmov.b32 k, 0x807F807F;\n"
ASM_DECODE_BF16_LOW: tl.constexpr = tl.constexpr(
    _ASM_BF16_HEAD + "and.b32 e, $3, 0x0F0F0F0F;\nadd.u32 e, e, $4;" + _ASM_BF16_TAIL
)
ASM_DECODE_BF16_HIGH: tl.constexpr = tl.constexpr(
    _ASM_BF16_HEAD + "shr.u32 e, $3, 4;\nand.b32 e, e, 0x0F0F0F0F;\nadd.u32 e, e, $4;" + _ASM_BF16_TAIL
)


@triton.jit
def decode_w12_ptx(mant, nib, exp_bytes, HIGH: tl.constexpr):
    """`decode_w12` in PTX, 4 weights at a time: uint8 mant and nibble-byte tiles (low or high nibbles),
    int32 e0 * 0x01010101 broadcast to the tile -> float32 weights. GPU only (no interpreter)."""
    return tl.inline_asm_elementwise(ASM_DECODE_HIGH if HIGH else ASM_DECODE_LOW, "=r,=r,=r,=r,r,r,r,r,r,r",
                                     [mant, nib, exp_bytes], dtype=tl.float32, is_pure=True, pack=4)


@triton.jit
def decode_w12_bf16_ptx(mant, nib, exp_bytes, HIGH: tl.constexpr):
    """`decode_w12_ptx` producing BF16 (the same values: their float32 forms have zero low halves).
    GPU only (no interpreter)."""
    return tl.inline_asm_elementwise(ASM_DECODE_BF16_HIGH if HIGH else ASM_DECODE_BF16_LOW, "=r,=r,r,r,r,r,r,r",
                                     [mant, nib, exp_bytes], dtype=tl.bfloat16, is_pure=True, pack=4)


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
def predicate(mask, live):
    """mask & live for a scalar `live`, as a select (Triton's interpreter mistypes `tensor & scalar`
    of booleans); the result stays uniform along rows and columns wherever `mask` is."""
    return tl.where(live, mask, False)


@triton.jit
def live_mask(ptrs, live):
    """A mask of ptrs' shape that is `live` everywhere (a uniform predicate: loads stay vectorized)."""
    return predicate(tl.full(ptrs.shape, True, tl.int1), live)


@triton.jit
def load_planes(
    w_ptr, nib_ptr,
    rows, k0, N, K, Kp,
    stride_w, stride_nib, live,
    IS_W12: tl.constexpr, HALF_K: tl.constexpr, EVEN_N: tl.constexpr, EVEN_K: tl.constexpr,
    GUARD: tl.constexpr,
):
    """The raw K tile at k0 of `rows`, undecoded: W12 (mant lo, mant hi, nibbles), uint8 [BN, HALF_K];
    plain weights (w lo, w hi, w lo) in their own dtype (the third is a duplicate, so both formats
    carry the same tuple through a prefetching loop).

    Out-of-range rows and columns read as code 0 / zero. GUARD: also predicate every load on the
    scalar `live` (a prefetch past the last K step issues no memory access; its values, undefined
    on the unmasked path, must not be used).
    """
    lo = tile_columns(k0, HALF_K)
    hi = lo + HALF
    row_ok = rows < N
    w_lo_ptr = w_ptr + rows[:, None] * stride_w + lo[None, :]
    w_hi_ptr = w_ptr + rows[:, None] * stride_w + hi[None, :]
    if IS_W12:
        nib_cols = tl.max_contiguous(tl.multiple_of(k0 // 2 + tl.arange(0, HALF_K), HALF_K), HALF_K)
        nib_tile_ptr = nib_ptr + rows[:, None] * stride_nib + nib_cols[None, :]
        if EVEN_N and EVEN_K:
            if GUARD:
                nib = tl.load(nib_tile_ptr, mask=live_mask(nib_tile_ptr, live))
                m_lo = tl.load(w_lo_ptr, mask=live_mask(w_lo_ptr, live))
                m_hi = tl.load(w_hi_ptr, mask=live_mask(w_hi_ptr, live))
            else:
                nib = tl.load(nib_tile_ptr)
                m_lo = tl.load(w_lo_ptr)
                m_hi = tl.load(w_hi_ptr)
        else:
            mask = row_ok[:, None] & (lo < Kp)[None, :]  # the planes are padded to Kp; lo < Kp implies hi < Kp
            if GUARD:
                mask = predicate(mask, live)
            nib = tl.load(nib_tile_ptr, mask=mask, other=0)
            m_lo = tl.load(w_lo_ptr, mask=mask, other=0)
            m_hi = tl.load(w_hi_ptr, mask=mask, other=0)
        first, second, third = m_lo, m_hi, nib
    else:
        if EVEN_N and EVEN_K:
            if GUARD:
                w_lo = tl.load(w_lo_ptr, mask=live_mask(w_lo_ptr, live))
                w_hi = tl.load(w_hi_ptr, mask=live_mask(w_hi_ptr, live))
            else:
                w_lo = tl.load(w_lo_ptr)
                w_hi = tl.load(w_hi_ptr)
        else:
            mask_lo = row_ok[:, None] & (lo < K)[None, :]
            mask_hi = row_ok[:, None] & (hi < K)[None, :]
            if GUARD:
                mask_lo = predicate(mask_lo, live)
                mask_hi = predicate(mask_hi, live)
            w_lo = tl.load(w_lo_ptr, mask=mask_lo, other=0.0)
            w_hi = tl.load(w_hi_ptr, mask=mask_hi, other=0.0)
        first, second, third = w_lo, w_hi, w_lo
    # One return statement: the compiler (unlike the interpreter) requires every return of a
    # function to have the same types, constexpr branches included.
    return first, second, third


@triton.jit
def load_base(base_ptr, rows, N):
    """e0 of `rows` as int32 [BN, 1] (1 for rows past N: any valid window decodes their zero codes)."""
    return tl.load(base_ptr + rows, mask=rows < N, other=1).to(tl.int32)[:, None]


@triton.jit
def decode_planes(a, b, c, base, IS_W12: tl.constexpr, PTX_DECODE: tl.constexpr):
    """(lo, hi) weight tiles from `load_planes`' raw tiles: W12 decoded to float32 with the row
    bases `base` [BN, 1] (`load_base`); plain weights passed through in their own dtype."""
    if IS_W12:
        if PTX_DECODE:
            exp_bytes = tl.broadcast_to(base * 0x01010101, a.shape)
            w_lo = decode_w12_ptx(a, c, exp_bytes, False)
            w_hi = decode_w12_ptx(b, c, exp_bytes, True)
        else:
            nib = c.to(tl.int32)
            w_lo = decode_w12(a, nib & 0xF, base << 23)
            w_hi = decode_w12(b, nib >> 4, base << 23)
    else:
        w_lo, w_hi = a, b
    return w_lo, w_hi


@triton.jit
def decode_planes_bf16(a, b, c, base, IS_W12: tl.constexpr, PTX_DECODE: tl.constexpr):
    """`decode_planes` with W12 weights as BF16 (exact); with PTX_DECODE straight to packed BF16
    pairs (`decode_w12_bf16_ptx`, ~2.3 instructions per weight instead of ~3.6 + a conversion)."""
    if IS_W12:
        if PTX_DECODE:
            exp_bytes = tl.broadcast_to(base * 0x01010101, a.shape)
            w_lo = decode_w12_bf16_ptx(a, c, exp_bytes, False)
            w_hi = decode_w12_bf16_ptx(b, c, exp_bytes, True)
        else:
            f_lo, f_hi = decode_planes(a, b, c, base, IS_W12, PTX_DECODE)
            w_lo = f_lo.to(tl.bfloat16)
            w_hi = f_hi.to(tl.bfloat16)
    else:
        w_lo, w_hi = a, b
    return w_lo, w_hi


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
    a, b, c = load_planes(w_ptr, nib_ptr, rows, k0, N, K, Kp, stride_w, stride_nib, True,
                          IS_W12, HALF_K, EVEN_N, EVEN_K, False)
    if IS_W12:
        base = load_base(base_ptr, rows, N)
    else:
        base = 0
    w_lo, w_hi = decode_planes(a, b, c, base, IS_W12, PTX_DECODE)
    return w_lo, w_hi, tile_columns(k0, HALF_K)


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
def escape_span(esc_ptr_ptr, base_ptr, rows, row0, N, BLOCK_N: tl.constexpr):
    """The escapes of a row block: (own_lo [BN], own_hi [BN]: each row's CSR range; first, last: the
    block's; p [BN]: each row's placeholder value). Both escape corrections start here."""
    row_ok = rows < N
    own_lo = tl.load(esc_ptr_ptr + rows, mask=row_ok, other=0)
    own_hi = tl.load(esc_ptr_ptr + rows + 1, mask=row_ok, other=0)
    first = tl.load(esc_ptr_ptr + row0)
    last = tl.load(esc_ptr_ptr + tl.minimum(row0 + BLOCK_N, N))
    return own_lo, own_hi, first, last, placeholder_values(base_ptr, rows, N)


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
    own_lo, own_hi, first, last, p = escape_span(esc_ptr_ptr, base_ptr, rows, row0, N, BLOCK_N)
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
