"""The Triton kernels of `moe_gemv.py` (imported on first use: importing Triton needs it installed)."""

import triton
import triton.language as tl

from specpilot.kernels import tiles
from specpilot.kernels.gdn_kernel import _round

NO_EXPERT: tl.constexpr = tl.constexpr(2**40)  # the sort key of a lane past k (above every real key)


@triton.jit
def _pair(ids_ptr, p, topk, si_t):
    """(token, slot, expert) of pair p = token * k + slot."""
    t = p // topk
    j = p % topk
    return t, j, tl.load(ids_ptr + t * si_t + j)


@triton.jit
def _row_block(w_ptr, rows, cols, r_ok, c_ok, sw_n, EVEN_N: tl.constexpr, EVEN_K: tl.constexpr):
    """The weights at rows [BN] x cols [BK] (row stride sw_n, unit column stride) as float32."""
    ptr = w_ptr + rows[:, None] * sw_n + cols[None, :]
    if EVEN_N and EVEN_K:
        return tl.load(ptr).to(tl.float32)
    return tl.load(ptr, mask=r_ok[:, None] & c_ok[None, :], other=0.0).to(tl.float32)


@triton.jit
def _vector(ptr, rows, cols, c_ok, EVEN_K: tl.constexpr):
    """The vector at cols [BK] as float32, broadcast over rows [BN]: loaded in the weight tile's
    layout (each thread the columns its weights meet; repeats hit L1), so that no layout
    conversion through shared memory (barriers in the K loop) joins it to the tile."""
    ptr = ptr + (cols[None, :] + rows[:, None] * 0)
    if EVEN_K:
        return tl.load(ptr).to(tl.float32)
    return tl.load(ptr, mask=c_ok[None, :], other=0.0).to(tl.float32)


@triton.jit(do_not_specialize=["topk"])
def moe_gate_up_kernel(
    # pointers
    x_ptr, ids_ptr, w_ptr, h_ptr,
    # sizes
    topk, C, I,
    # strides (every innermost one is 1)
    sx_t, si_t, sw_e, sw_n, sh_p,
    # meta
    BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, EVEN_N: tl.constexpr, EVEN_K: tl.constexpr,
    ROUND: tl.constexpr, PDL: tl.constexpr = False,
):
    """One (pair, block of BLOCK_N intermediate rows): gate and up rows of the pair's expert times
    x[token], each a [BN, BK] float32 accumulator over the C columns in BLOCK_K steps, summed over
    BK at the end; then h = round(round(silu(round(gate))) * round(up)), as the model's eager
    silu_mul rounds in the model dtype."""
    p = tl.program_id(0)
    nb = tl.program_id(1)
    tiles.wait_for_inputs(PDL)  # the expert id is the router's output: nothing to load before it
    t, _, e = _pair(ids_ptr, p, topk, si_t)
    rows = nb * BLOCK_N + tl.arange(0, BLOCK_N)
    r_ok = rows < I
    wg = w_ptr + e * sw_e  # gate rows [0, I), up rows [I, 2I)
    wu = wg + I * sw_n
    x_row = x_ptr + t * sx_t
    acc_g = tl.zeros([BLOCK_N, BLOCK_K], dtype=tl.float32)
    acc_u = tl.zeros([BLOCK_N, BLOCK_K], dtype=tl.float32)
    for c0 in range(0, C, BLOCK_K):
        cols = c0 + tl.arange(0, BLOCK_K)
        c_ok = cols < C
        xv = _vector(x_row, rows, cols, c_ok, EVEN_K)
        acc_g += _row_block(wg, rows, cols, r_ok, c_ok, sw_n, EVEN_N, EVEN_K) * xv
        acc_u += _row_block(wu, rows, cols, r_ok, c_ok, sw_n, EVEN_N, EVEN_K) * xv
    tiles.release_dependents(PDL)
    gate = _round(tl.sum(acc_g, axis=1), ROUND)
    up = _round(tl.sum(acc_u, axis=1), ROUND)
    act = _round(gate / (1.0 + tl.exp(-gate)), ROUND)
    h = _round(act * up, ROUND)
    tl.store(h_ptr + p * sh_p + rows, h.to(h_ptr.dtype.element_ty), mask=r_ok)


@triton.jit(do_not_specialize=["topk"])
def moe_down_kernel(
    # pointers
    h_ptr, ids_ptr, wts_ptr, w_ptr, y_ptr,
    # sizes
    topk, C, I,
    # strides (every innermost one is 1)
    sh_p, si_t, swt_t, sw_e, sw_n, sy_p,
    # meta
    BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, EVEN_N: tl.constexpr, EVEN_K: tl.constexpr,
    ROUND: tl.constexpr, PDL: tl.constexpr = False,
):
    """One (pair, block of BLOCK_N output rows): y = round(round(down rows of the pair's expert
    times h[pair]) * weight[pair]), the matmul as in `moe_gate_up_kernel` over the I columns."""
    p = tl.program_id(0)
    nb = tl.program_id(1)
    tiles.wait_for_inputs(PDL)
    t, j, e = _pair(ids_ptr, p, topk, si_t)
    rows = nb * BLOCK_N + tl.arange(0, BLOCK_N)
    r_ok = rows < C
    wd = w_ptr + e * sw_e
    h_row = h_ptr + p * sh_p
    acc = tl.zeros([BLOCK_N, BLOCK_K], dtype=tl.float32)
    for c0 in range(0, I, BLOCK_K):
        cols = c0 + tl.arange(0, BLOCK_K)
        c_ok = cols < I
        acc += _row_block(wd, rows, cols, r_ok, c_ok, sw_n, EVEN_N, EVEN_K) * _vector(h_row, rows, cols, c_ok, EVEN_K)
    tiles.release_dependents(PDL)
    w = tl.load(wts_ptr + t * swt_t + j).to(tl.float32)
    y = _round(_round(tl.sum(acc, axis=1), ROUND) * w, ROUND)
    tl.store(y_ptr + p * sy_p + rows, y.to(y_ptr.dtype.element_ty), mask=r_ok)


@triton.jit(do_not_specialize=["topk"])
def moe_sum_kernel(
    # pointers
    y_ptr, ids_ptr, out_ptr,
    # sizes
    topk, C,
    # strides
    sy_p, si_t, so_t,
    # meta
    BLOCK_C: tl.constexpr, KP2: tl.constexpr, ROUND: tl.constexpr, PDL: tl.constexpr = False,
):
    """One (token, block of BLOCK_C columns): out = the token's k pair outputs summed in
    increasing expert order (ties by slot), rounded after each add as a sum in the model dtype.
    The order comes from a selection over the token's k ids in registers: no sorted copy."""
    t = tl.program_id(0)
    cb = tl.program_id(1)
    cols = cb * BLOCK_C + tl.arange(0, BLOCK_C)
    c_ok = cols < C
    tiles.wait_for_inputs(PDL)
    slot = tl.arange(0, KP2)
    ids = tl.load(ids_ptr + t * si_t + slot, mask=slot < topk, other=NO_EXPERT)
    key = ids * KP2 + slot  # [KP2] int64, distinct: expert order, then slot
    prev = tl.min(key, axis=0) - 1
    acc = tl.zeros([BLOCK_C], dtype=tl.float32)
    for _ in range(topk):
        cur = tl.min(tl.where(key > prev, key, NO_EXPERT * KP2), axis=0)  # the next pair in order
        yv = tl.load(y_ptr + (t * topk + cur % KP2) * sy_p + cols, mask=c_ok, other=0.0).to(tl.float32)
        acc = _round(acc + yv, ROUND)
        prev = cur
    tiles.release_dependents(PDL)
    tl.store(out_ptr + t * so_t + cols, acc.to(out_ptr.dtype.element_ty), mask=c_ok)
