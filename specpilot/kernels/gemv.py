"""GEMV path: y[M, N] = x[M, K] @ W[N, K].T for 1..8 rows, W12 or plain weights, fp32 accumulation.

Owns the FMA kernel for few rows, its launcher and its reference. Each program streams a block of
BLOCK_N weight rows over its share of K, decoding W12 codes in registers right after the loads
(W12 moves 1.5 bytes per weight instead of 2, which is the whole speedup when weights dominate
traffic). Each activation row m keeps its own [BLOCK_N, BLOCK_K/2] float32 tile of partial
products, reduced once at the end, so the loop body is loads, ~3 integer ops per weight for the
decode (inline PTX, `tiles.decode_w12_ptx`), and per row a widening of x and an FMA. x is read as
a tile of the weights' shape with row stride 0, which gives it the weights' register layout (no
shuffles through shared memory). Row blocks are split along K when there are too few of them to
keep every SM streaming; splits reduce through `tiles.reduce_split_k` in a fixed order, so results
do not depend on scheduling. Escapes are added by the program that finishes a row block, in
float32, before the output is rounded.

With `LaunchConfig.prefetch` the loop double-buffers in registers: the raw planes and x rows 0-1
of K step i + 1 are loaded before step i is decoded and multiplied (the last prefetch is predicated
off), so a program keeps two steps of DRAM loads in flight instead of relying on occupancy alone;
the arithmetic and its order are unchanged (bit-identical results).

Cost per weight in the sm_90 SASS of the main loop: ~6.5 instructions at M = 1, ~9 at M = 2,
~13 at M = 4, ~22 at M = 8 -- which is why the dispatcher prefers the tensor-core GEMM from M = 2
unless a tuned table says otherwise.

Does not own tile decoding (`tiles.py`), config choice (`configs.py`) or the M-based dispatch
(`dispatch.py`).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from specpilot.kernels import tiles
from specpilot.kernels.configs import (
    GEMV_MAX_M,
    KernelPath,
    LaunchConfig,
    block_m,
    gemv_candidates,
)
from specpilot.kernels.launch import prepare_launch, ptx_decode
from specpilot.kernels.reference import reference_linear
from specpilot.kernels.workspace import SplitKWorkspace
from specpilot.w12.weight import W12Weight

ESCAPE_CHUNK = 16

# -- configs ----------------------------------------------------------------------------------
configs = gemv_candidates  # the tiles the benchmark sweeps for a given M (see configs.py)


# -- kernel -----------------------------------------------------------------------------------
@triton.jit
def _load_x_row(x_tile, zero_rows, row, M, K, lo, stride_xm, live,
                EVEN_M: tl.constexpr, EVEN_K: tl.constexpr, GUARD: tl.constexpr):
    """x[row] at the tile's (lo, lo + 64) columns as two [BN, HK] tiles; x_tile [BN, HK] points at row 0.
    GUARD: predicate the loads on the scalar `live` too (a prefetch past the last step)."""
    ptr = x_tile + row * stride_xm
    row_ok = (zero_rows + row) < M  # [BN, 1]
    if EVEN_M and EVEN_K:
        if GUARD:
            x_lo = tl.load(ptr, mask=tiles.live_mask(ptr, live))
            x_hi = tl.load(ptr + tiles.HALF, mask=tiles.live_mask(ptr, live))
        else:
            x_lo = tl.load(ptr)
            x_hi = tl.load(ptr + tiles.HALF)
    else:
        if EVEN_K:
            mask_lo = row_ok
            mask_hi = row_ok
        else:
            mask_lo = row_ok & (lo < K)[None, :]
            mask_hi = row_ok & (lo + tiles.HALF < K)[None, :]
        if GUARD:
            mask_lo = tiles.predicate(mask_lo, live)
            mask_hi = tiles.predicate(mask_hi, live)
        x_lo = tl.load(ptr, mask=mask_lo, other=0.0)
        x_hi = tl.load(ptr + tiles.HALF, mask=mask_hi, other=0.0)
    return x_lo, x_hi


@triton.jit
def _fma_x(acc, w_lo, w_hi, x_lo, x_hi, PTX: tl.constexpr):
    """acc [BN, HK] += w * x over both tile halves (lo first, as in every variant)."""
    acc = tl.fma(w_lo, tiles.to_float32(x_lo, PTX), acc)
    return tl.fma(w_hi, tiles.to_float32(x_hi, PTX), acc)


@triton.jit
def _fma_row(acc, w_lo, w_hi, x_tile, zero_rows, row, M, K, lo, stride_xm,
             EVEN_M: tl.constexpr, EVEN_K: tl.constexpr, PTX: tl.constexpr):
    """acc [BN, HK] += w * x[row] over both tile halves; x_tile [BN, HK] points at row 0."""
    x_lo, x_hi = _load_x_row(x_tile, zero_rows, row, M, K, lo, stride_xm, True, EVEN_M, EVEN_K, False)
    return _fma_x(acc, w_lo, w_hi, x_lo, x_hi, PTX)


@triton.jit
def _fma_rows_2_to_7(acc2, acc3, acc4, acc5, acc6, acc7, w_lo, w_hi, x_tile, zero_rows, M, K, lo, stride_xm,
                     BLOCK_M: tl.constexpr, EVEN_M: tl.constexpr, EVEN_K: tl.constexpr, PTX: tl.constexpr):
    """Activation rows 2..BLOCK_M-1 (BLOCK_M is 4 or 8), each read in the step; both K loops use it."""
    acc2 = _fma_row(acc2, w_lo, w_hi, x_tile, zero_rows, 2, M, K, lo, stride_xm, EVEN_M, EVEN_K, PTX)
    acc3 = _fma_row(acc3, w_lo, w_hi, x_tile, zero_rows, 3, M, K, lo, stride_xm, EVEN_M, EVEN_K, PTX)
    if BLOCK_M > 4:
        acc4 = _fma_row(acc4, w_lo, w_hi, x_tile, zero_rows, 4, M, K, lo, stride_xm, EVEN_M, EVEN_K, PTX)
        acc5 = _fma_row(acc5, w_lo, w_hi, x_tile, zero_rows, 5, M, K, lo, stride_xm, EVEN_M, EVEN_K, PTX)
        acc6 = _fma_row(acc6, w_lo, w_hi, x_tile, zero_rows, 6, M, K, lo, stride_xm, EVEN_M, EVEN_K, PTX)
        acc7 = _fma_row(acc7, w_lo, w_hi, x_tile, zero_rows, 7, M, K, lo, stride_xm, EVEN_M, EVEN_K, PTX)
    return acc2, acc3, acc4, acc5, acc6, acc7


@triton.jit
def _put_row(out, acc, row, m):
    """out [BM, BN] with row `row` set to the K-sum of acc [BN, HK]."""
    return tl.where((m == row)[:, None], tl.sum(acc, axis=1)[None, :], out)


@triton.jit(do_not_specialize=["M", "split_k", "steps_per_split"])
def _gemv_kernel(
    # pointers
    x_ptr, w_ptr, nib_ptr, base_ptr, esc_ptr_ptr, esc_col_ptr, esc_val_ptr, y_ptr, ws_ptr, count_ptr,
    # sizes
    M, N, K, Kp, split_k, steps_per_split,
    # strides
    stride_xm, stride_ym, stride_w, stride_nib,
    # meta
    IS_W12: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    EVEN_M: tl.constexpr, EVEN_N: tl.constexpr, EVEN_K: tl.constexpr, PTX_DECODE: tl.constexpr,
    ESC_CHUNK: tl.constexpr, PREFETCH: tl.constexpr, LOOP_STAGES: tl.constexpr,
):
    HALF_K: tl.constexpr = BLOCK_K // 2
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    row0 = pid_n * BLOCK_N
    rows = row0 + tl.arange(0, BLOCK_N)
    m = tl.arange(0, BLOCK_M)
    m_ok = (m < M)[:, None]
    step0 = pid_k * steps_per_split
    step1 = tl.minimum(step0 + steps_per_split, tl.cdiv(Kp, BLOCK_K))
    # One [BN, HK] accumulator per activation row (unrolled: BLOCK_M <= 8); unused ones fold away.
    acc0 = tl.zeros([BLOCK_N, HALF_K], dtype=tl.float32)
    acc1 = tl.zeros_like(acc0)
    acc2 = tl.zeros_like(acc0)
    acc3 = tl.zeros_like(acc0)
    acc4 = tl.zeros_like(acc0)
    acc5 = tl.zeros_like(acc0)
    acc6 = tl.zeros_like(acc0)
    acc7 = tl.zeros_like(acc0)
    zero_rows = (rows * 0)[:, None]
    if PREFETCH:
        # Register double buffering: the raw planes (and x rows 0-1) of step + 1 are loaded before
        # step is decoded and multiplied, so each program keeps two K steps of loads in flight.
        # The last iteration's prefetch is predicated off (no access); its values go unused.
        # Same arithmetic, in the same order, as the plain loop below.
        if IS_W12:
            base = tiles.load_base(base_ptr, rows, N)  # loop-invariant
        else:
            base = 0
        a, b, c = tiles.load_planes(
            w_ptr, nib_ptr, rows, step0 * BLOCK_K, N, K, Kp, stride_w, stride_nib, True,
            IS_W12, HALF_K, EVEN_N, EVEN_K, False,
        )
        lo0 = tiles.tile_columns(step0 * BLOCK_K, HALF_K)
        x_first = x_ptr + zero_rows + lo0[None, :]
        x0_lo, x0_hi = _load_x_row(x_first, zero_rows, 0, M, K, lo0, stride_xm, True, EVEN_M, EVEN_K, False)
        if BLOCK_M > 1:
            x1_lo, x1_hi = _load_x_row(x_first, zero_rows, 1, M, K, lo0, stride_xm, True, EVEN_M, EVEN_K, False)
        for step in range(step0, step1):
            live = step + 1 < step1
            k_next = (step + 1) * BLOCK_K
            lo_next = tiles.tile_columns(k_next, HALF_K)
            a_next, b_next, c_next = tiles.load_planes(
                w_ptr, nib_ptr, rows, k_next, N, K, Kp, stride_w, stride_nib, live,
                IS_W12, HALF_K, EVEN_N, EVEN_K, True,
            )
            x_next = x_ptr + zero_rows + lo_next[None, :]
            x0_lo_next, x0_hi_next = _load_x_row(x_next, zero_rows, 0, M, K, lo_next, stride_xm, live,
                                                 EVEN_M, EVEN_K, True)
            if BLOCK_M > 1:
                x1_lo_next, x1_hi_next = _load_x_row(x_next, zero_rows, 1, M, K, lo_next, stride_xm, live,
                                                     EVEN_M, EVEN_K, True)
            w_lo, w_hi = tiles.decode_planes(a, b, c, base, IS_W12, PTX_DECODE)
            w_lo = tiles.to_float32(w_lo, PTX_DECODE)
            w_hi = tiles.to_float32(w_hi, PTX_DECODE)
            acc0 = _fma_x(acc0, w_lo, w_hi, x0_lo, x0_hi, PTX_DECODE)
            if BLOCK_M > 1:
                acc1 = _fma_x(acc1, w_lo, w_hi, x1_lo, x1_hi, PTX_DECODE)
            if BLOCK_M > 2:  # rows 2..7 are read in the step (carrying them would cost registers)
                lo = tiles.tile_columns(step * BLOCK_K, HALF_K)  # recomputed: keeps its contiguity hints
                x_tile = x_ptr + zero_rows + lo[None, :]
                acc2, acc3, acc4, acc5, acc6, acc7 = _fma_rows_2_to_7(
                    acc2, acc3, acc4, acc5, acc6, acc7, w_lo, w_hi, x_tile, zero_rows, M, K, lo, stride_xm,
                    BLOCK_M, EVEN_M, EVEN_K, PTX_DECODE)
            a, b, c = a_next, b_next, c_next
            x0_lo, x0_hi = x0_lo_next, x0_hi_next
            if BLOCK_M > 1:
                x1_lo, x1_hi = x1_lo_next, x1_hi_next
    else:
        # LOOP_STAGES > 1: Triton software-pipelines this loop's loads through shared memory
        # (cp.async, LOOP_STAGES buffers), so the DRAM latency of step + 1.. hides behind step.
        for step in tl.range(step0, step1, num_stages=LOOP_STAGES):
            w_lo, w_hi, lo = tiles.load_weight_tile(
                w_ptr, nib_ptr, base_ptr, rows, step * BLOCK_K, N, K, Kp, stride_w, stride_nib,
                IS_W12, HALF_K, EVEN_N, EVEN_K, PTX_DECODE,
            )
            w_lo = tiles.to_float32(w_lo, PTX_DECODE)
            w_hi = tiles.to_float32(w_hi, PTX_DECODE)
            # x row m is read as a [BN, HK] tile with row stride 0: the same shape and contiguity as the
            # weight tile, hence the same register layout (no shuffle through shared memory); the
            # repeated reads hit L1.
            x_tile = x_ptr + zero_rows + lo[None, :]
            acc0 = _fma_row(acc0, w_lo, w_hi, x_tile, zero_rows, 0, M, K, lo, stride_xm,
                            EVEN_M, EVEN_K, PTX_DECODE)
            if BLOCK_M > 1:
                acc1 = _fma_row(acc1, w_lo, w_hi, x_tile, zero_rows, 1, M, K, lo, stride_xm,
                                EVEN_M, EVEN_K, PTX_DECODE)
            if BLOCK_M > 2:
                acc2, acc3, acc4, acc5, acc6, acc7 = _fma_rows_2_to_7(
                    acc2, acc3, acc4, acc5, acc6, acc7, w_lo, w_hi, x_tile, zero_rows, M, K, lo, stride_xm,
                    BLOCK_M, EVEN_M, EVEN_K, PTX_DECODE)
    out = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)  # [BM, BN]
    out = _put_row(out, acc0, 0, m)
    if BLOCK_M > 1:
        out = _put_row(out, acc1, 1, m)
    if BLOCK_M > 2:
        out = _put_row(out, acc2, 2, m)
        out = _put_row(out, acc3, 3, m)
    if BLOCK_M > 4:
        out = _put_row(out, acc4, 4, m)
        out = _put_row(out, acc5, 5, m)
        out = _put_row(out, acc6, 6, m)
        out = _put_row(out, acc7, 7, m)

    y_offsets = m[:, None] * stride_ym + rows[None, :]
    y_mask = m_ok & (rows < N)[None, :]
    if split_k > 1:
        is_last, out = tiles.reduce_split_k(
            out, ws_ptr, count_ptr, pid_n, pid_k, split_k, m[:, None] * N + rows[None, :], y_mask, M * N,
        )
    else:
        is_last = pid_k == 0
    if is_last:
        if IS_W12:
            out += tiles.escape_correction_mn(
                x_ptr, esc_ptr_ptr, esc_col_ptr, esc_val_ptr, base_ptr, rows, row0, M, N, stride_xm,
                BLOCK_M, BLOCK_N, ESC_CHUNK,
            )
        tl.store(y_ptr + y_offsets, out.to(y_ptr.dtype.element_ty), mask=y_mask)


# -- wrapper ----------------------------------------------------------------------------------
def gemv(x: torch.Tensor, weight: W12Weight | torch.Tensor, config: LaunchConfig,
         workspace: SplitKWorkspace | None = None) -> torch.Tensor:
    """y [M, N] in x's dtype for x [M, K] (1 <= M <= 8) and a W12 or plain weight [N, K]."""
    run = prepare_launch(x, weight, config, KernelPath.GEMV, GEMV_MAX_M, workspace)
    bm = block_m(KernelPath.GEMV, x.shape[0])
    _gemv_kernel[run.grid](
        *run.args,
        IS_W12=run.ops.is_w12, BLOCK_M=bm, BLOCK_N=config.block_n, BLOCK_K=config.block_k,
        EVEN_M=x.shape[0] == bm, EVEN_N=run.even_n, EVEN_K=run.even_k,
        PTX_DECODE=ptx_decode(config), ESC_CHUNK=ESCAPE_CHUNK, PREFETCH=config.prefetch,
        LOOP_STAGES=config.num_stages, num_warps=config.num_warps, num_stages=config.num_stages,
    )
    return run.y.to(x.dtype)


# -- reference --------------------------------------------------------------------------------
reference = reference_linear  # decode (W12) or take the weight, then a float32 matmul
