"""The Triton kernels of `draft_layer.py` (imported on first use: importing Triton needs it installed).
Named `*_gemv_kernel`: a kernel profile (`bench.kernel_profile`) counts them with the projections."""

import triton
import triton.language as tl

from specpilot.kernels import tiles
from specpilot.kernels.attention_kernel import _dot
from specpilot.kernels.gdn_kernel import _round

EPILOGUE_PLAIN: tl.constexpr = tl.constexpr(0)  # y = x @ W.T
EPILOGUE_RESIDUAL: tl.constexpr = tl.constexpr(1)  # y = h + x @ W.T
EPILOGUE_SWIGLU: tl.constexpr = tl.constexpr(2)  # y = silu(x @ Wg.T) * (x @ Wu.T), W = [Wg | Wu] rows


@triton.jit
def _rstd(x_ptr, sx_m, m, m_ok, C, eps, BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr):
    """1 / sqrt(mean(x^2) + eps) of rows m [BM] of x (C columns), in float32."""
    acc = tl.zeros([BLOCK_M, BLOCK_K], dtype=tl.float32)
    for c0 in range(0, C, BLOCK_K):
        cols = c0 + tl.arange(0, BLOCK_K)
        x = tl.load(x_ptr + m[:, None] * sx_m + cols[None, :], mask=m_ok[:, None] & (cols < C)[None, :],
                    other=0.0).to(tl.float32)
        acc += x * x
    return 1.0 / tl.sqrt(tl.sum(acc, axis=1) / C + eps)


@triton.jit
def _operand(x_ptr, nw_ptr, sx_m, m, m_ok, cols, c_ok, rstd, NORM: tl.constexpr, ROUND: tl.constexpr):
    """x [BM, BK] at rows m, columns cols as float32; NORM: RMS-normed as `ops.rms_norm` rounds it,
    round(w * round(x * rstd)) in the model dtype."""
    x = tl.load(x_ptr + m[:, None] * sx_m + cols[None, :], mask=m_ok[:, None] & c_ok[None, :], other=0.0)
    x = x.to(tl.float32)
    if NORM:
        w = tl.load(nw_ptr + cols, mask=c_ok, other=0.0).to(tl.float32)
        x = _round(w[None, :] * _round(x * rstd[:, None], ROUND), ROUND)
    return x


@triton.jit
def _weights(w_ptr, rows, r_ok, cols, c_ok, sw_n):
    """W [BN, BK] at rows, cols (unit column stride), in its dtype, zero outside."""
    return tl.load(w_ptr + rows[:, None] * sw_n + cols[None, :], mask=r_ok[:, None] & c_ok[None, :], other=0.0)


@triton.jit
def draft_gemv_kernel(
    # pointers
    x_ptr, nw_ptr, w_ptr, h_ptr, y_ptr,
    # sizes
    M, N, K, eps,
    # strides (every innermost one is 1)
    sx_m, sw_n, sh_m, sy_m,
    # meta
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, NORM: tl.constexpr,
    EPILOGUE: tl.constexpr, ROUND: tl.constexpr, DOT_BF16: tl.constexpr, PDL: tl.constexpr = False,
):
    """One block of BLOCK_N output columns for all M <= BLOCK_M rows: the rows of x (RMS-normed by
    nw in the prologue where NORM) times W's rows, a [BM, BN] float32 accumulator over K in BLOCK_K
    steps (tl.dot), rounded to the model dtype; then the epilogue: plain, plus the residual h
    (rounded once more, as `h + delta`), or SwiGLU over the gate rows [0, N) and up rows [N, 2N)
    this program owns (silu(gate) rounded, times up rounded, as `ops.silu_mul`)."""
    nb = tl.program_id(0)
    n = nb * BLOCK_N + tl.arange(0, BLOCK_N)
    n_ok = n < N
    m = tl.arange(0, BLOCK_M)
    m_ok = m < M
    tiles.wait_for_inputs(PDL)
    if NORM:
        rstd = _rstd(x_ptr, sx_m, m, m_ok, K, eps, BLOCK_M, BLOCK_K)
    else:
        rstd = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    acc_up = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        cols = k0 + tl.arange(0, BLOCK_K)
        k_ok = cols < K
        x = _operand(x_ptr, nw_ptr, sx_m, m, m_ok, cols, k_ok, rstd, NORM, ROUND)
        acc += _dot(x, tl.trans(_weights(w_ptr, n, n_ok, cols, k_ok, sw_n)), DOT_BF16)
        if EPILOGUE == 2:
            acc_up += _dot(x, tl.trans(_weights(w_ptr, n + N, n_ok, cols, k_ok, sw_n)), DOT_BF16)
    tiles.release_dependents(PDL)
    y = _round(acc, ROUND)
    out_ok = m_ok[:, None] & n_ok[None, :]
    if EPILOGUE == 1:
        h = tl.load(h_ptr + m[:, None] * sh_m + n[None, :], mask=out_ok, other=0.0).to(tl.float32)
        y = _round(h + y, ROUND)
    if EPILOGUE == 2:
        act = _round(y / (1.0 + tl.exp(-y)), ROUND)
        y = _round(act * _round(acc_up, ROUND), ROUND)
    tl.store(y_ptr + m[:, None] * sy_m + n[None, :], y.to(y_ptr.dtype.element_ty), mask=out_ok)


@triton.jit
def draft_qkv_gemv_kernel(
    # pointers
    x_ptr, nw_ptr, w_ptr, qw_ptr, kw_ptr, cos_ptr, sin_ptr, pos_ptr, slot_ptr, q_ptr, kc_ptr, vc_ptr,
    # sizes
    M, T, C, H, Hkv, eps,
    # strides (every innermost one is 1)
    sx_m, sw_n, sr_p, sq_m, sq_h, skc_b, skc_h, skc_s, svc_b, svc_h, svc_s,
    # meta
    BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr, HALF: tl.constexpr, QK_NORM: tl.constexpr,
    ROUND: tl.constexpr, DOT_BF16: tl.constexpr, PDL: tl.constexpr = False,
):
    """One head (query heads 0..H-1, then the Hkv key heads, then the value heads) for all M rows:
    the RMS-normed rows of x times the head's D = 2 HALF rows of the fused qkv weight, as two
    [BM, HALF] accumulators (the halves RoPE rotates into each other: no register shuffle), rounded;
    then for q and k the per-head RMSNorm (QK_NORM) and RoPE at each row's position, every step
    rounded as `ops.qkv_norm_rope` rounds it. Queries go to q [M, H, D]; keys and values straight
    into the cache at (row m // T, the head, slot[m])."""
    head = tl.program_id(0)
    m = tl.arange(0, BLOCK_M)
    m_ok = m < M
    d = tl.arange(0, HALF)
    lo_rows = head * (2 * HALF) + d
    hi_rows = lo_rows + HALF
    d_ok = d < HALF
    tiles.wait_for_inputs(PDL)
    rstd = _rstd(x_ptr, sx_m, m, m_ok, C, eps, BLOCK_M, BLOCK_K)
    acc_lo = tl.zeros([BLOCK_M, HALF], dtype=tl.float32)
    acc_hi = tl.zeros([BLOCK_M, HALF], dtype=tl.float32)
    for c0 in range(0, C, BLOCK_K):
        cols = c0 + tl.arange(0, BLOCK_K)
        c_ok = cols < C
        x = _operand(x_ptr, nw_ptr, sx_m, m, m_ok, cols, c_ok, rstd, True, ROUND)
        acc_lo += _dot(x, tl.trans(_weights(w_ptr, lo_rows, d_ok, cols, c_ok, sw_n)), DOT_BF16)
        acc_hi += _dot(x, tl.trans(_weights(w_ptr, hi_rows, d_ok, cols, c_ok, sw_n)), DOT_BF16)
    tiles.release_dependents(PDL)
    lo = _round(acc_lo, ROUND)
    hi = _round(acc_hi, ROUND)
    if head < H + Hkv:  # q or k: norm and RoPE, every step rounded as the eager ops round it
        pos = tl.load(pos_ptr + m, mask=m_ok, other=0)
        lo, hi = tiles.qk_norm_rope(lo, hi, head < H, qw_ptr, kw_ptr, cos_ptr, sin_ptr, pos, m_ok, sr_p, eps,
                                    HALF, QK_NORM, ROUND, True)
    tiles.store_head(lo, hi, head, m, m_ok, T, H, Hkv, slot_ptr, q_ptr, sq_m, sq_h, kc_ptr, skc_b, skc_h, skc_s,
                     vc_ptr, svc_b, svc_h, svc_s, HALF)
