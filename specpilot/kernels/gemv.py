"""GEMV path: y[M, N] = x[M, K] @ W[N, K].T for 1..8 rows, W12 or plain weights, fp32 FMAs.

Owns the FMA kernel for few rows, its launcher and its reference. Each program streams a block of
BLOCK_N weight rows over its share of K; W12 groups are decoded in registers right after the loads
(`tiles.load_w12_tile` with float32 output: ~2.25 instructions per weight for the decode itself)
and scaled back per row at the end. Each activation row m keeps its own [BLOCK_N, BLOCK_K]
float32 tile of partial products, reduced once at the end, so the loop body is loads, the decode,
and per row a widening of x and an FMA. x is read as a tile of the weights' shape with row stride
0 (the repeated reads hit L1). For plain weights that tile has the weights' register layout; a
W12 tile comes out of `tiles.assemble` in the MMA-fragment layout, which Triton converts through
shared memory to meet x's (sm_90 SASS at M = 1: 5.1 instructions per weight for W12, 3.6 for
BF16). With `num_stages` > 1 Triton pipelines the loop's loads through shared memory (cp.async).
Row blocks are split along K when there are too few of them to keep every SM streaming; splits
reduce through `tiles.reduce_split_k` in a fixed order, so results do not depend on scheduling.
Escapes are added by the program that finishes a row block, in float32, before the output is
rounded.

The tensor-core GEMM (`gemm.py`) needs fewer instructions per weight at every M (the FMAs are the
MMA's; ~2.6 per W12 weight in n64 k256 s3 at M <= 16, `python -m specpilot.kernels.aot --sass`)
and won 137 of the 140 (format, M, shape) entries of the session-3 H200 sweep (the GEMV won three
with plain BF16 weights); this path stays for the tuned table to choose where it is faster, and
as a second implementation the tests hold to the same reference.

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
def _fma_row(acc, w, x_ptr, zero_rows, row, M, K, k, stride_xm, EVEN_M: tl.constexpr, EVEN_K: tl.constexpr):
    """acc [BN, BK] += w * x[row, k] (x read as a [BN, BK] tile with row stride 0)."""
    ptr = x_ptr + row * stride_xm + zero_rows + k[None, :]
    if EVEN_M and EVEN_K:
        xv = tl.load(ptr)
    else:
        mask = (zero_rows + row) < M
        if not EVEN_K:
            mask = mask & (k < K)[None, :]
        xv = tl.load(ptr, mask=mask, other=0.0)
    return tl.fma(w, xv.to(tl.float32), acc)


@triton.jit
def _put_row(out, acc, row, m):
    """out [BM, BN] with row `row` set to the K-sum of acc [BN, BK]."""
    return tl.where((m == row)[:, None], tl.sum(acc, axis=1)[None, :], out)


@triton.jit(do_not_specialize=["M", "split_k", "steps_per_split"])
def _gemv_kernel(
    # pointers
    x_ptr, w_ptr, hi_ptr, base_ptr, esc_ptr_ptr, esc_col_ptr, esc_val_ptr, y_ptr, ws_ptr, count_ptr,
    # sizes
    M, N, K, Kp, split_k, steps_per_split,
    # strides
    stride_xm, stride_ym, stride_w, stride_hi,
    # meta
    IS_W12: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    EVEN_M: tl.constexpr, EVEN_N: tl.constexpr, EVEN_K: tl.constexpr, PTX_DECODE: tl.constexpr,
    ESC_CHUNK: tl.constexpr, STAGES: tl.constexpr,
):
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    row0 = pid_n * BLOCK_N
    rows = row0 + tl.arange(0, BLOCK_N)
    m = tl.arange(0, BLOCK_M)
    step0 = pid_k * steps_per_split
    step1 = tl.minimum(step0 + steps_per_split, tl.cdiv(Kp, BLOCK_K))
    zero_rows = (rows * 0)[:, None]
    # One [BN, BK] accumulator per activation row (unrolled: BLOCK_M <= 8); unused ones fold away.
    acc0 = tl.zeros([BLOCK_N, BLOCK_K], dtype=tl.float32)
    acc1 = tl.zeros_like(acc0)
    acc2 = tl.zeros_like(acc0)
    acc3 = tl.zeros_like(acc0)
    acc4 = tl.zeros_like(acc0)
    acc5 = tl.zeros_like(acc0)
    acc6 = tl.zeros_like(acc0)
    acc7 = tl.zeros_like(acc0)
    for step in tl.range(step0, step1, num_stages=STAGES):
        if IS_W12:
            w = tiles.load_w12_tile(w_ptr, hi_ptr, rows, step, N, Kp, stride_w, stride_hi,
                                    BLOCK_N, BLOCK_K, EVEN_N, EVEN_K, PTX_DECODE, True)  # [BN, BK] scaled
        else:
            w = tiles.load_dense_tile(w_ptr, rows, step, N, K, stride_w, BLOCK_K, EVEN_N, EVEN_K).to(tl.float32)
        k = step * BLOCK_K + tl.max_contiguous(tl.multiple_of(tl.arange(0, BLOCK_K), BLOCK_K), BLOCK_K)
        acc0 = _fma_row(acc0, w, x_ptr, zero_rows, 0, M, K, k, stride_xm, EVEN_M, EVEN_K)
        if BLOCK_M > 1:
            acc1 = _fma_row(acc1, w, x_ptr, zero_rows, 1, M, K, k, stride_xm, EVEN_M, EVEN_K)
        if BLOCK_M > 2:
            acc2 = _fma_row(acc2, w, x_ptr, zero_rows, 2, M, K, k, stride_xm, EVEN_M, EVEN_K)
            acc3 = _fma_row(acc3, w, x_ptr, zero_rows, 3, M, K, k, stride_xm, EVEN_M, EVEN_K)
        if BLOCK_M > 4:
            acc4 = _fma_row(acc4, w, x_ptr, zero_rows, 4, M, K, k, stride_xm, EVEN_M, EVEN_K)
            acc5 = _fma_row(acc5, w, x_ptr, zero_rows, 5, M, K, k, stride_xm, EVEN_M, EVEN_K)
            acc6 = _fma_row(acc6, w, x_ptr, zero_rows, 6, M, K, k, stride_xm, EVEN_M, EVEN_K)
            acc7 = _fma_row(acc7, w, x_ptr, zero_rows, 7, M, K, k, stride_xm, EVEN_M, EVEN_K)
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

    y_mask = (m < M)[:, None] & (rows < N)[None, :]
    if split_k > 1:
        is_last, out = tiles.reduce_split_k(
            out, ws_ptr, count_ptr, pid_n, pid_k, split_k, m[:, None] * N + rows[None, :], y_mask, M * N,
        )
    else:
        is_last = pid_k == 0
    if is_last:
        if IS_W12:
            out = out * tiles.row_scale(base_ptr, rows, N)[None, :]
            out += tiles.escape_correction_mn(
                x_ptr, esc_ptr_ptr, esc_col_ptr, esc_val_ptr, base_ptr, rows, row0, M, N, stride_xm,
                BLOCK_M, BLOCK_N, ESC_CHUNK,
            )
        tiles.store_rows(out, y_ptr, rows, M, N, stride_ym, BLOCK_M)


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
        PTX_DECODE=ptx_decode(config), ESC_CHUNK=ESCAPE_CHUNK, STAGES=config.num_stages,
        num_warps=config.num_warps, num_stages=config.num_stages,
    )
    return run.y.to(x.dtype)


# -- reference --------------------------------------------------------------------------------
reference = reference_linear  # decode (W12) or take the weight, then a float32 matmul
