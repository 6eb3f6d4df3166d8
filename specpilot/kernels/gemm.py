"""GEMM path: y[M, N] = x[M, K] @ W[N, K].T on tensor cores for 1..64 rows, W12 or plain weights.

Owns the `tl.dot` kernel, its launcher and its reference. Each program decodes a [BLOCK_N, BLOCK_K]
weight tile in registers to BF16 (exact: the low 16 bits of a decoded float32 are zero) and uses it
as the B operand of y_tile += x_tile @ w_tile.T, so the decoded tile goes to shared memory once and
the MMA reads it there. (With the weights as the A operand -- "swap AB" -- the sm_90 build spent
~40% more instructions per weight: ~9 against ~6.3, reshuffling registers through shared memory.)
Rows of x beyond M are masked (no traffic); padding M up to 16 costs only MMA slots, which are
plentiful. With float32 or float16 activations both operands are widened to
float32 and the dot runs in IEEE float32, so no input is ever rounded.

Config flags: `bf16_decode` decodes W12 straight to packed BF16 pairs in PTX
(`tiles.decode_w12_bf16_ptx`, no float32 intermediate or conversion); `prefetch` double-buffers
the raw planes and x of the next K step in registers (as in the GEMV), for num_stages = 1.

Row blocks are split along K when there are too few of them to fill the GPU (tensor-core tiles
are wide, so small N needs it); the reduction is deterministic (`tiles.reduce_split_k`). Escapes
are applied by the program finishing a row block as two small dots per 16 escapes: a one-hot
matrix of escape values minus one of placeholders, times the gathered x columns. Inf/NaN escape
values are kept out of those dots (0 * Inf would leak NaN into other rows) and added row by row.

Does not own tile decoding (`tiles.py`), config choice (`configs.py`) or dispatch (`dispatch.py`).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from specpilot.kernels import tiles
from specpilot.kernels.configs import (
    GEMM_MAX_M,
    KernelPath,
    LaunchConfig,
    block_m,
    gemm_candidates,
)
from specpilot.kernels.launch import bf16_dots, prepare_launch, ptx_decode
from specpilot.kernels.reference import reference_linear
from specpilot.kernels.workspace import SplitKWorkspace
from specpilot.w12.weight import W12Weight

ESCAPE_CHUNK = 16  # the smallest K of a tl.dot

# -- configs ----------------------------------------------------------------------------------
configs = gemm_candidates  # the tiles the benchmark sweeps for a given M (see configs.py)


# -- kernel -----------------------------------------------------------------------------------
@triton.jit
def _dot(a, b, acc, DOT_BF16: tl.constexpr):
    if DOT_BF16:
        return tl.dot(a.to(tl.bfloat16), b.to(tl.bfloat16), acc)
    return tl.dot(a.to(tl.float32), b.to(tl.float32), acc, input_precision="ieee")


@triton.jit
def _load_x(x_ptr, m, M, K, k0, stride_xm, live, HALF_K: tl.constexpr, EVEN_K: tl.constexpr, GUARD: tl.constexpr):
    """x tile [BM, HK] at the lo and hi columns of the K tile at k0 (rows >= M read as zero).
    GUARD: predicate the loads on the scalar `live` too (a prefetch past the last step)."""
    lo = tiles.tile_columns(k0, HALF_K)
    x_rows = x_ptr + m[:, None] * stride_xm
    m_ok = (m < M)[:, None]
    if EVEN_K:
        mask_lo = m_ok
        mask_hi = m_ok
    else:
        mask_lo = m_ok & (lo < K)[None, :]
        mask_hi = m_ok & (lo + tiles.HALF < K)[None, :]
    if GUARD:
        mask_lo = tiles.predicate(mask_lo, live)
        mask_hi = tiles.predicate(mask_hi, live)
    x_lo = tl.load(x_rows + lo[None, :], mask=mask_lo, other=0.0)
    x_hi = tl.load(x_rows + (lo + tiles.HALF)[None, :], mask=mask_hi, other=0.0)
    return x_lo, x_hi


@triton.jit
def _decode(a, b, c, base, IS_W12: tl.constexpr, PTX_DECODE: tl.constexpr, BF16_DECODE: tl.constexpr):
    """(lo, hi) weight tiles from raw planes: W12 as float32, or as BF16 (same values) with BF16_DECODE."""
    if BF16_DECODE:
        w_lo, w_hi = tiles.decode_planes_bf16(a, b, c, base, IS_W12, PTX_DECODE)
    else:
        w_lo, w_hi = tiles.decode_planes(a, b, c, base, IS_W12, PTX_DECODE)
    return w_lo, w_hi  # one return: the compiler needs the same types on every return


@triton.jit
def _escape_correction(
    x_ptr, esc_ptr_ptr, esc_col_ptr, esc_val_ptr, base_ptr,
    rows, row0, M, N, stride_xm,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, CHUNK: tl.constexpr, DOT_BF16: tl.constexpr,
):
    """[BLOCK_M, BLOCK_N] float32: sum over escapes (n, c, v) of `rows` of x[m, c] * v - x[m, c] * p_n."""
    m = tl.arange(0, BLOCK_M)
    own_lo, own_hi, first, last, p = tiles.escape_span(esc_ptr_ptr, base_ptr, rows, row0, N, BLOCK_N)  # p [BN]
    corr = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    for e0 in range(first, last, CHUNK):
        e = e0 + tl.arange(0, CHUNK)
        emask = e < last
        col = tiles.escape_columns(esc_col_ptr, e, emask)
        v, finite = tiles.escape_values(esc_val_ptr, e, emask)
        xe = tl.load(x_ptr + m[:, None] * stride_xm + col[None, :],
                     mask=(m < M)[:, None] & emask[None, :], other=0.0)  # [BM, CHUNK]
        own = (e[:, None] >= own_lo[None, :]) & (e[:, None] < own_hi[None, :])  # [CHUNK, BN]
        values = tl.where(own & finite[:, None], v[:, None], 0.0)  # exact in BF16: they are BF16
        places = tl.where(own, p[None, :], 0.0)  # powers of two >= 2^-126: exact in BF16
        corr = _dot(xe, values, corr, DOT_BF16)
        corr = _dot(xe, -places, corr, DOT_BF16)
        if tl.sum((emask & ~finite).to(tl.int32)) > 0:
            for i in range(e0, tl.minimum(e0 + CHUNK, last)):  # rare: Inf/NaN weights, one at a time
                bits = tl.load(esc_val_ptr + i).to(tl.int32) << 16
                if (bits & tiles.EXP_FIELD) == tiles.EXP_FIELD:
                    ci = tl.load(esc_col_ptr + i).to(tl.int32)
                    if esc_col_ptr.dtype.element_ty == tl.int16:
                        ci = ci & 0xFFFF
                    xi = tl.load(x_ptr + m * stride_xm + ci, mask=m < M, other=0.0).to(tl.float32)  # [BM]
                    owner = (i >= own_lo) & (i < own_hi)  # [BN]
                    vi = bits.to(tl.float32, bitcast=True)
                    corr += tl.where(owner[None, :], xi[:, None] * vi, 0.0)
    return corr


@triton.jit(do_not_specialize=["M", "split_k", "steps_per_split"])
def _gemm_kernel(
    # pointers
    x_ptr, w_ptr, nib_ptr, base_ptr, esc_ptr_ptr, esc_col_ptr, esc_val_ptr, y_ptr, ws_ptr, count_ptr,
    # sizes
    M, N, K, Kp, split_k, steps_per_split,
    # strides
    stride_xm, stride_ym, stride_w, stride_nib,
    # meta
    IS_W12: tl.constexpr, DOT_BF16: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr, EVEN_N: tl.constexpr, EVEN_K: tl.constexpr, PTX_DECODE: tl.constexpr,
    ESC_CHUNK: tl.constexpr, PREFETCH: tl.constexpr, BF16_DECODE: tl.constexpr,
):
    HALF_K: tl.constexpr = BLOCK_K // 2
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    row0 = pid_n * BLOCK_N
    rows = row0 + tl.arange(0, BLOCK_N)
    m = tl.arange(0, BLOCK_M)
    m_ok = (m < M)[:, None]

    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)  # y tile [BM, BN]
    step0 = pid_k * steps_per_split
    step1 = tl.minimum(step0 + steps_per_split, tl.cdiv(Kp, BLOCK_K))
    if IS_W12:
        base = tiles.load_base(base_ptr, rows, N)  # loop-invariant
    else:
        base = 0
    if PREFETCH:
        # Register double buffering (as in the GEMV): the raw planes and x of step + 1 are loaded
        # before step is decoded and multiplied; the last iteration's prefetch is predicated off.
        a, b, c = tiles.load_planes(
            w_ptr, nib_ptr, rows, step0 * BLOCK_K, N, K, Kp, stride_w, stride_nib, True,
            IS_W12, HALF_K, EVEN_N, EVEN_K, False,
        )
        x_lo, x_hi = _load_x(x_ptr, m, M, K, step0 * BLOCK_K, stride_xm, True, HALF_K, EVEN_K, False)
        for step in range(step0, step1):
            live = step + 1 < step1
            a_next, b_next, c_next = tiles.load_planes(
                w_ptr, nib_ptr, rows, (step + 1) * BLOCK_K, N, K, Kp, stride_w, stride_nib, live,
                IS_W12, HALF_K, EVEN_N, EVEN_K, True,
            )
            x_lo_next, x_hi_next = _load_x(x_ptr, m, M, K, (step + 1) * BLOCK_K, stride_xm, live,
                                           HALF_K, EVEN_K, True)
            w_lo, w_hi = _decode(a, b, c, base, IS_W12, PTX_DECODE, BF16_DECODE)
            acc = _dot(x_lo, tl.trans(w_lo), acc, DOT_BF16)
            acc = _dot(x_hi, tl.trans(w_hi), acc, DOT_BF16)
            a, b, c = a_next, b_next, c_next
            x_lo, x_hi = x_lo_next, x_hi_next
    else:
        for step in range(step0, step1):
            a, b, c = tiles.load_planes(
                w_ptr, nib_ptr, rows, step * BLOCK_K, N, K, Kp, stride_w, stride_nib, True,
                IS_W12, HALF_K, EVEN_N, EVEN_K, False,
            )
            x_lo, x_hi = _load_x(x_ptr, m, M, K, step * BLOCK_K, stride_xm, True, HALF_K, EVEN_K, False)
            w_lo, w_hi = _decode(a, b, c, base, IS_W12, PTX_DECODE, BF16_DECODE)
            # The decoded tile is the B operand: it goes to shared memory once, where the MMA reads it.
            acc = _dot(x_lo, tl.trans(w_lo), acc, DOT_BF16)
            acc = _dot(x_hi, tl.trans(w_hi), acc, DOT_BF16)

    y_offsets = m[:, None] * stride_ym + rows[None, :]
    y_mask = m_ok & (rows < N)[None, :]
    if split_k > 1:
        is_last, acc = tiles.reduce_split_k(
            acc, ws_ptr, count_ptr, pid_n, pid_k, split_k, m[:, None] * N + rows[None, :], y_mask, M * N,
        )
    else:
        is_last = pid_k == 0
    if is_last:
        if IS_W12:
            acc += _escape_correction(
                x_ptr, esc_ptr_ptr, esc_col_ptr, esc_val_ptr, base_ptr, rows, row0, M, N, stride_xm,
                BLOCK_M, BLOCK_N, ESC_CHUNK, DOT_BF16,
            )
        tl.store(y_ptr + y_offsets, acc.to(y_ptr.dtype.element_ty), mask=y_mask)


# -- wrapper ----------------------------------------------------------------------------------
def gemm(x: torch.Tensor, weight: W12Weight | torch.Tensor, config: LaunchConfig,
         workspace: SplitKWorkspace | None = None) -> torch.Tensor:
    """y [M, N] in x's dtype for x [M, K] (1 <= M <= 64) and a W12 or plain weight [N, K]."""
    run = prepare_launch(x, weight, config, KernelPath.GEMM, GEMM_MAX_M, workspace)
    _gemm_kernel[run.grid](
        *run.args,
        IS_W12=run.ops.is_w12, DOT_BF16=bf16_dots(x, run.ops),
        BLOCK_M=block_m(KernelPath.GEMM, x.shape[0]), BLOCK_N=config.block_n, BLOCK_K=config.block_k,
        EVEN_N=run.even_n, EVEN_K=run.even_k,
        PTX_DECODE=ptx_decode(config), ESC_CHUNK=ESCAPE_CHUNK, PREFETCH=config.prefetch,
        BF16_DECODE=config.bf16_decode, num_warps=config.num_warps, num_stages=config.num_stages,
    )
    return run.y.to(x.dtype)


# -- reference --------------------------------------------------------------------------------
reference = reference_linear  # decode (W12) or take the weight, then a float32 matmul
