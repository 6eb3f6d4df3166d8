"""Triton building blocks shared by the GEMM, GEMV and unpack kernels, and by the kernels that end
in an attention layer's K/V cache.

Owns: reading one [BLOCK_N, BLOCK_K] weight tile (W12 planes decoded in registers, or plain
weights), the two W12 decoders (inline PTX for the GPU and portable Triton ops for the
interpreter: the same bits), the per-row scale of the decoded weights, the deterministic split-K
reduction, the escape correction, and one attention head's q/k norm + RoPE and its store into q
or the K/V cache (`qk_norm_rope`, `store_head`: the draft qkv kernel and `rope_store`). Every
function here is `@triton.jit` and inlined into its caller. Imports Triton at module level, so only
kernel modules import it, lazily (see `specpilot.kernels.dispatch`).

W12 tiles are read a *group* at a time (see `specpilot.w12.layout`): 8 bytes of the `lo` plane
(one int64) and 4 of the `hi` plane (one int32) hold 8 codes. A tile is [BN, G] such words
(G = BLOCK_K / 8); the decoder turns each group into 8 weights (8 tensors [BN, G]), and
`assemble` joins them into the [BN, BLOCK_K] tile in column order -- stored position 8c + 2q + r of
a 32-column block is column 2c + r + 8q -- with joins, permutes and reshapes only. Nothing is
moved: those are the registers of a tensor-core A fragment, so when the tile feeds `tl.dot` as the
A operand Triton loads the groups straight into that layout and the decoded weights never touch
shared memory (checked in the sm_90 SASS: `python -m specpilot.kernels.aot --sass gemm`).

Decoded W12 weights are scaled, w' = w * 2^(112 - e0) (the decode needs no add); callers multiply
each row's float32 result by `row_scale` = 2^(e0 - 112), exact for every power of two.
"""

from __future__ import annotations

import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

from specpilot.kernels.gdn_kernel import _round
from specpilot.w12 import layout

EXP_FIELD: tl.constexpr = tl.constexpr(0x7F800000)  # float32 exponent bits
SCALE_EXP: tl.constexpr = tl.constexpr(127 - layout.SCALE_BIAS)  # row scale 2^(e0 - 112): field e0 + 15
WORD: tl.constexpr = tl.constexpr(layout.CODES_PER_WORD)

# One group: after the 8 outputs, $8 is the int64 of 8 `lo` bytes and $9 the int32 of 8 nibbles.
# For the low nibbles (codes 0-3) and the high ones (4-7) of the word:
#   t = nibbles << 4 (low) or >> 4 (high);  u = the sign bit from t (low) or the word (high), the rest from the other
#   e = (u & 0x87878787) | 0x38383838: four BF16 high bytes s << 7 | 0x38 | o >> 1
# then one byte permute per BF16 pair: (lo byte 2i, e byte 2i, lo byte 2i+1, e byte 2i+1).
# 1.25 instructions per weight. A float32 weight is its BF16 pair half shifted or masked into place.
_ASM_EXPONENTS = """
.reg .b32 la, lb, t, u, ea, eb, p;
mov.b64 {la, lb}, $L;
shl.b32 t, $H, 4;
lop3.b32 u, t, $H, 0x80808080, 0xE4;
lop3.b32 ea, u, 0x87878787, 0x38383838, 0xEA;
shr.u32 t, $H, 4;
lop3.b32 u, $H, t, 0x80808080, 0xE4;
lop3.b32 eb, u, 0x87878787, 0x38383838, 0xEA;
"""
_ASM_PAIRS_BF16 = """
prmt.b32 p, la, ea, 0x5140; mov.b32 {$0, $1}, p;
prmt.b32 p, la, ea, 0x7362; mov.b32 {$2, $3}, p;
prmt.b32 p, lb, eb, 0x5140; mov.b32 {$4, $5}, p;
prmt.b32 p, lb, eb, 0x7362; mov.b32 {$6, $7}, p;
"""
_ASM_PAIRS_F32 = """
prmt.b32 p, la, ea, 0x5140; shl.b32 $0, p, 16; and.b32 $1, p, 0xFFFF0000;
prmt.b32 p, la, ea, 0x7362; shl.b32 $2, p, 16; and.b32 $3, p, 0xFFFF0000;
prmt.b32 p, lb, eb, 0x5140; shl.b32 $4, p, 16; and.b32 $5, p, 0xFFFF0000;
prmt.b32 p, lb, eb, 0x7362; shl.b32 $6, p, 16; and.b32 $7, p, 0xFFFF0000;
"""
_ASM_HEAD = "{" + _ASM_EXPONENTS.replace("$L", "$8").replace("$H", "$9")  # operands after the 8 outputs
ASM_DECODE_BF16: tl.constexpr = tl.constexpr(_ASM_HEAD + _ASM_PAIRS_BF16 + "}")
ASM_DECODE_F32: tl.constexpr = tl.constexpr(_ASM_HEAD + _ASM_PAIRS_F32 + "}")


@triton.jit
def _code(lo, hi, i: tl.constexpr, F32: tl.constexpr):
    """Portable decode of code i of each group: lo [BN, G] int64, hi [BN, G] int32 -> scaled weights."""
    low = ((lo >> (8 * i)) & 0xFF).to(tl.int32)
    nib = (hi >> (8 * (i % 4) + 4 * (i // 4))) & 0xF
    bits = ((nib & 8) << 12) | ((nib & 7) << 8) | 0x3800 | low  # s | 0x38 | o >> 1 | (o & 1) m
    w = bits.to(tl.int16).to(tl.bfloat16, bitcast=True)
    if F32:
        w = w.to(tl.float32)
    return w


@triton.jit
def decode_groups(lo, hi, PTX: tl.constexpr, F32: tl.constexpr):
    """8 tensors [BN, G] (BF16, or float32 with F32): code i of every group, scaled by 2^(112 - e0).
    PTX: the inline-PTX decoder (GPU); else portable Triton ops (the same bits)."""
    if PTX:
        if F32:
            o0, o1, o2, o3, o4, o5, o6, o7 = tl.inline_asm_elementwise(
                ASM_DECODE_F32, "=r,=r,=r,=r,=r,=r,=r,=r,l,r", [lo, hi],
                dtype=(tl.float32,) * 8, is_pure=True, pack=1)
        else:
            o0, o1, o2, o3, o4, o5, o6, o7 = tl.inline_asm_elementwise(
                ASM_DECODE_BF16, "=h,=h,=h,=h,=h,=h,=h,=h,l,r", [lo, hi],
                dtype=(tl.bfloat16,) * 8, is_pure=True, pack=1)
    else:
        o0 = _code(lo, hi, 0, F32)
        o1 = _code(lo, hi, 1, F32)
        o2 = _code(lo, hi, 2, F32)
        o3 = _code(lo, hi, 3, F32)
        o4 = _code(lo, hi, 4, F32)
        o5 = _code(lo, hi, 5, F32)
        o6 = _code(lo, hi, 6, F32)
        o7 = _code(lo, hi, 7, F32)
    # One return statement: the compiler (unlike the interpreter) requires every return of a
    # function to have the same types, constexpr branches included.
    return o0, o1, o2, o3, o4, o5, o6, o7


@triton.jit
def assemble(o0, o1, o2, o3, o4, o5, o6, o7, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """The 8 codes of each group [BN, G] -> the tile [BN, BLOCK_K] in column order.

    Group g = 4b + c, code i = 2q + r is column 32b + 8q + 2c + r (`layout.stored_columns`).
    """
    t = tl.join(tl.join(tl.join(o0, o1), tl.join(o2, o3)), tl.join(tl.join(o4, o5), tl.join(o6, o7)))
    t = tl.permute(t, (0, 1, 4, 3, 2))  # [BN, G, q_hi, q_lo, r]
    t = tl.reshape(t, [BLOCK_N, BLOCK_K // 32, 4, 2, 2, 2])  # [BN, b, c, q_hi, q_lo, r]
    t = tl.permute(t, (0, 1, 3, 4, 2, 5))  # [BN, b, q_hi, q_lo, c, r]
    return tl.reshape(t, [BLOCK_N, BLOCK_K])


@triton.jit
def load_groups(lo_ptr, hi_ptr, rows, step, N, Kp, stride_lo, stride_hi,
                BLOCK_K: tl.constexpr, EVEN_N: tl.constexpr, EVEN_K: tl.constexpr):
    """The raw W12 groups of `rows` x K tile `step`: (lo [BN, G] int64, hi [BN, G] int32).
    Rows past N and groups past Kp read as code 0 (the placeholder; callers give x zeros there)."""
    G: tl.constexpr = BLOCK_K // WORD
    g = step * G + tl.max_contiguous(tl.multiple_of(tl.arange(0, G), G), G)
    lo64 = lo_ptr.to(tl.pointer_type(tl.int64))
    hi32 = hi_ptr.to(tl.pointer_type(tl.int32))
    lo_tile = lo64 + rows[:, None] * (stride_lo // WORD) + g[None, :]
    hi_tile = hi32 + rows[:, None] * (stride_hi // (WORD // 2)) + g[None, :]
    if EVEN_N and EVEN_K:
        lo = tl.load(lo_tile)
        hi = tl.load(hi_tile)
    else:
        mask = (rows < N)[:, None] & (g < Kp // WORD)[None, :]
        lo = tl.load(lo_tile, mask=mask, other=0)
        hi = tl.load(hi_tile, mask=mask, other=0)
    return lo, hi


@triton.jit
def load_w12_tile(lo_ptr, hi_ptr, rows, step, N, Kp, stride_lo, stride_hi,
                  BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, EVEN_N: tl.constexpr, EVEN_K: tl.constexpr,
                  PTX: tl.constexpr, F32: tl.constexpr):
    """W12 weights of `rows` x K tile `step`, decoded and scaled: [BN, BLOCK_K] BF16 (or float32)."""
    lo, hi = load_groups(lo_ptr, hi_ptr, rows, step, N, Kp, stride_lo, stride_hi, BLOCK_K, EVEN_N, EVEN_K)
    return decode_tile(lo, hi, BLOCK_N, BLOCK_K, PTX, F32)


@triton.jit
def decode_tile(lo, hi, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, PTX: tl.constexpr, F32: tl.constexpr):
    """Raw groups (lo [BN, G] int64, hi [BN, G] int32), however loaded -> [BN, BLOCK_K] decoded, scaled."""
    o0, o1, o2, o3, o4, o5, o6, o7 = decode_groups(lo, hi, PTX, F32)
    return assemble(o0, o1, o2, o3, o4, o5, o6, o7, BLOCK_N, BLOCK_K)


@triton.jit
def load_dense_tile(w_ptr, rows, step, N, K, stride_w,
                    BLOCK_K: tl.constexpr, EVEN_N: tl.constexpr, EVEN_K: tl.constexpr):
    """Plain weights of `rows` x K tile `step`: [BN, BLOCK_K] in their own dtype (zero outside)."""
    k = step * BLOCK_K + tl.max_contiguous(tl.multiple_of(tl.arange(0, BLOCK_K), BLOCK_K), BLOCK_K)
    tile = w_ptr + rows[:, None] * stride_w + k[None, :]
    if EVEN_N and EVEN_K:
        return tl.load(tile)
    return tl.load(tile, mask=(rows < N)[:, None] & (k < K)[None, :], other=0.0)


@triton.jit
def row_scale(base_ptr, rows, N):
    """2^(e0 - 112) per row [BN] as float32: undoes the decoders' scaling (exact)."""
    e0 = tl.load(base_ptr + rows, mask=rows < N, other=1).to(tl.int32)
    return ((e0 + SCALE_EXP) << 23).to(tl.float32, bitcast=True)


@triton.jit
def reduce_split_k(acc, ws_ptr, count_ptr, tile, pid_k, split_k, ws_offsets, ws_mask, split_stride):
    """Deterministic split-K: every split stores its float32 partial; the last to arrive at the
    tile's counter sums all partials in split order 0..split_k-1 and resets the counter.

    Returns (is_last, total); only the last split may use `total`. The barrier before the atomic
    (acq_rel, gpu scope) orders all threads' partial stores before the arrival; `.cg` loads read
    the partials from L2, never from a stale L1 line. The reset is relaxed: nothing in this launch
    reads the counter again, and the kernel boundary orders it before the next launch. An acq_rel
    reset would put a second fence on the last split's path, a measurable cost per call on the
    split rows at M = 1 (`scripts/w12_kernels.py` times them).
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
        tl.atomic_xchg(count_ptr + tile, 0, sem="relaxed")
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


@triton.jit
def wait_for_inputs(PDL: tl.constexpr):
    """Under programmatic dependent launch (`launch.pdl`), block until the kernel before this one in
    the stream has finished and its writes are visible. A kernel may load only what no kernel writes
    (weights, their scales and escapes) before this, and may store nothing before it: its output
    buffer can be memory the previous kernel still reads."""
    if PDL:
        gdc_wait()


@triton.jit
def release_dependents(PDL: tl.constexpr):
    """Under programmatic dependent launch, let the next kernel's programs start (they wait in
    `wait_for_inputs` until this kernel is done): called once a program's main loop is over, so
    that the waiting programs never take an SM from this kernel's own."""
    if PDL:
        gdc_launch_dependents()


@triton.jit
def store_rows(out, y_ptr, rows, M, N, stride_ym, BLOCK_M: tl.constexpr):
    """Round out [BM, BN] (float32) once to y's dtype and store the valid rows x columns."""
    m = tl.arange(0, BLOCK_M)
    y_mask = (m < M)[:, None] & (rows < N)[None, :]
    tl.store(y_ptr + m[:, None] * stride_ym + rows[None, :], out.to(y_ptr.dtype.element_ty), mask=y_mask)


# ---- one attention head after its projection: q/k norm, RoPE, the store -----------------------

@triton.jit
def qk_norm_rope(lo, hi, is_q, qw_ptr, kw_ptr, cos_ptr, sin_ptr, pos, m_ok, sr_p, eps,
                 HALF: tl.constexpr, QK_NORM: tl.constexpr, ROUND: tl.constexpr, EAGER: tl.constexpr):
    """A q (is_q) or k head of rows [BM] as its halves lo, hi [BM, HALF] (float32, D = 2 HALF, the
    halves RoPE rotates into each other): the per-head RMSNorm by q's or k's weight [D] (QK_NORM),
    then RoPE at positions pos [BM] from the float32 tables cos, sin [P, D] (row stride sr_p), their
    values rounded to the model dtype first (as `Transformer._rope` casts them).
    The rounding (ROUND: the model dtype's grid) follows one of two references:
    - EAGER: the eager ops (`ops.qkv_norm_rope` step by step): 1 / sqrt of the mean square, and every
      product and sum rounded, as each torch op returns the model dtype;
    - else the op as inductor compiles it on CUDA: rsqrt, one rounding after the normalisation (the
      explicit `.to(x.dtype)` of `ops.rms_norm`), the weight multiply and RoPE in float32; the
      caller's store rounds once.
    Returns the new (lo, hi), float32."""
    d = tl.arange(0, HALF)
    if QK_NORM:
        w_lo = tl.where(is_q, tl.load(qw_ptr + d), tl.load(kw_ptr + d)).to(tl.float32)
        w_hi = tl.where(is_q, tl.load(qw_ptr + HALF + d), tl.load(kw_ptr + HALF + d)).to(tl.float32)
        ms = (tl.sum(lo * lo, axis=1) + tl.sum(hi * hi, axis=1)) / (2 * HALF) + eps
        if EAGER:
            rs = 1.0 / tl.sqrt(ms)
            lo = _round(w_lo[None, :] * _round(lo * rs[:, None], ROUND), ROUND)
            hi = _round(w_hi[None, :] * _round(hi * rs[:, None], ROUND), ROUND)
        else:
            rs = tl.math.rsqrt(ms)
            lo = w_lo[None, :] * _round(lo * rs[:, None], ROUND)
            hi = w_hi[None, :] * _round(hi * rs[:, None], ROUND)
    at = pos[:, None] * sr_p + d[None, :]
    cos_lo = _round(tl.load(cos_ptr + at, mask=m_ok[:, None], other=0.0).to(tl.float32), ROUND)
    cos_hi = _round(tl.load(cos_ptr + at + HALF, mask=m_ok[:, None], other=0.0).to(tl.float32), ROUND)
    sin_lo = _round(tl.load(sin_ptr + at, mask=m_ok[:, None], other=0.0).to(tl.float32), ROUND)
    sin_hi = _round(tl.load(sin_ptr + at + HALF, mask=m_ok[:, None], other=0.0).to(tl.float32), ROUND)
    # x * cos + rotate_half(x) * sin, rotate_half(x) = [-hi, lo]
    if EAGER:
        new_lo = _round(_round(lo * cos_lo, ROUND) - _round(hi * sin_lo, ROUND), ROUND)
        new_hi = _round(_round(hi * cos_hi, ROUND) + _round(lo * sin_hi, ROUND), ROUND)
    else:
        new_lo = lo * cos_lo - hi * sin_lo
        new_hi = hi * cos_hi + lo * sin_hi
    return new_lo, new_hi


@triton.jit
def store_head(lo, hi, head, m, m_ok, T, H, Hkv, slot_ptr, q_ptr, sq_m, sq_h, kc_ptr, skc_b, skc_h, skc_s,
               vc_ptr, svc_b, svc_h, svc_s, HALF: tl.constexpr):
    """Store head `head` (query heads 0..H-1, then the Hkv key heads, then the value heads) of rows m
    [BM] from its halves lo, hi [BM, HALF] (float32, rounded once to the destination's dtype):
    queries to q [M, H, D] (strides sq_m, sq_h), keys and values into their cache [B, Hkv, S, D] at
    (row m // T, the head, slot[m]). Unit innermost strides."""
    d = tl.arange(0, HALF)
    ok = m_ok[:, None] & (d < HALF)[None, :]
    if head < H:
        at = q_ptr + m[:, None] * sq_m + head * sq_h + d[None, :]
        tl.store(at, lo.to(q_ptr.dtype.element_ty), mask=ok)
        tl.store(at + HALF, hi.to(q_ptr.dtype.element_ty), mask=ok)
    else:
        b = m // T
        slot = tl.load(slot_ptr + m, mask=m_ok, other=0)
        if head < H + Hkv:
            at = kc_ptr + b[:, None] * skc_b + (head - H) * skc_h + slot[:, None] * skc_s + d[None, :]
            tl.store(at, lo.to(kc_ptr.dtype.element_ty), mask=ok)
            tl.store(at + HALF, hi.to(kc_ptr.dtype.element_ty), mask=ok)
        else:
            at = vc_ptr + b[:, None] * svc_b + (head - H - Hkv) * svc_h + slot[:, None] * svc_s + d[None, :]
            tl.store(at, lo.to(vc_ptr.dtype.element_ty), mask=ok)
            tl.store(at + HALF, hi.to(vc_ptr.dtype.element_ty), mask=ok)
