"""GEMM path: y[M, N] = x[M, K] @ W[N, K].T on tensor cores for 1..128 rows, W12 or plain weights.

Owns the `tl.dot` kernel, its launcher and its reference. The weights are the MMA's A operand
("swap AB"): each program computes y^T [BLOCK_N, BLOCK_M] += W tile [BLOCK_N, BLOCK_K] @ x^T tile
[BLOCK_K, BLOCK_M], so a weight row block of 64-256 rows fills the MMA's M dimension and the few
activation rows (padded to 16, masked: no traffic) its N dimension. W12 groups are decoded in
registers straight into the A fragment (`tiles.assemble`: the stored column order of format 2 is
that fragment), and Triton pipelines the raw planes through shared memory with cp.async
(`num_stages` buffers) and issues wgmma on sm_90. Plain weights take the same loop, A from shared
memory. With float32 or float16 activations both operands are widened to float32 and the dot runs
in IEEE float32, so no input is ever rounded.

W12 tiles are decoded scaled by 2^(112 - e0) per row (see `specpilot.w12.layout`), every escape slot
as the placeholder 2^-15. The escapes are added in that scaled domain, one of two ways
(`escape_plan`, ESC_MODE):
- escape blocks (`escape_blocks.py`; the default): each row block's entries are loaded before the
  K loop from addresses fixed by the program id, and after it one gather of x at their columns
  and one one-hot dot add them, each split-K program its own columns -- one memory round trip.
  The gather reads row-major x, one 32-byte sector per (entry, row), so its traffic grows with M;
  with `LaunchConfig.gather_t` the call first copies x^T [K, M] (a kernel of its own) and the
  gather reads each column's M values side by side: it pays on large weights at many rows (the
  lm_heads at M = 64), while small projections lose the copy's time, so configs opt in
  (`GATHER_T_MIN_M`, `GATHER_T_MIN_WEIGHTS`; `scripts/w12_kernels.py` times both);
- the epilogue correction, for weights escape blocks cannot express (Inf/NaN, values whose scaled
  form is no normal BF16, rows full of escapes): the program finishing a row block reads its CSR
  escapes, 16 at a time, and adds two one-hot dots per chunk (values, minus placeholders), the
  non-finite ones row by row; each chunk costs two dependent loads.
The program that finishes a row block multiplies by 2^(e0 - 112) -- exact; every program loads
that scale before its K loop (loaded after it, the cold bytes cost one more DRAM round trip at
the end, up to 3%). Row blocks are split along K when there are too few of them to fill the GPU;
the reduction is deterministic (`tiles.reduce_split_k`). Registers are capped so two programs fit an SM, or three where a
config asks for it (`LaunchConfig.resident`, `max_registers`).

The first K step's MMA reads `where(step == step0, 0, acc)`, which Triton lowers to wgmma's
use-accumulator flag. Starting from the zeros instead, the path that skips the loop hands the
accumulator registers a plain move, and ptxas then serializes every wgmma of the kernel (info
C7515): the K loop then waits after each HGMMA, slower at every M and more so at more rows
(`scripts/w12_kernels.py` times the kernel). The SASS test holds the loop to one wait per K step.

With `LaunchConfig.tma` the weight tiles come by TMA from tensor descriptors instead (`tma.py`):
the same tiles, so the same output bit for bit; a weight TMA cannot describe keeps cp.async. With
`LaunchConfig.tma_x` the x^T tiles come by TMA as well (a box of x, transposed in shared memory)
when x fills at least three quarters of the box's rows; with fewer they take the plain loads
(`tma.x_descriptor`).

Launched with programmatic dependent launch (`launch.pdl`), a program loads its first weight tile
(and its escapes) before it waits for the previous kernel (`tiles.wait_for_inputs`); the first MMA
then reads x after the wait and the loop runs from the second step (the same sums in the same order).

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
from specpilot.kernels.escape_blocks import SLOT_STEP, escape_blocks
from specpilot.kernels.launch import Launch, bf16_dots, launch_options, prepare_launch, ptx_decode
from specpilot.kernels.reference import reference_linear
from specpilot.kernels.tma import descriptors as tma_descriptors
from specpilot.kernels.tma import x_descriptor
from specpilot.kernels.workspace import SplitKWorkspace
from specpilot.w12.weight import W12Weight

ESCAPE_CHUNK: tl.constexpr = tl.constexpr(16)  # escapes per step of the epilogue correction: a tl.dot's smallest K
ESC_NONE: tl.constexpr = tl.constexpr(0)  # ESC_MODE: no escapes (or "off")
ESC_BLOCKS: tl.constexpr = tl.constexpr(1)  # escape blocks, loaded before the K loop, added after it
ESC_EPILOGUE: tl.constexpr = tl.constexpr(2)  # the CSR escapes, added by the program finishing a row block

# -- configs ----------------------------------------------------------------------------------
configs = gemm_candidates  # the tiles the benchmark sweeps for a given M (see configs.py)


# -- kernel -----------------------------------------------------------------------------------
@triton.jit
def _dot(a, b, acc, DOT_BF16: tl.constexpr):
    if DOT_BF16:
        return tl.dot(a.to(tl.bfloat16), b.to(tl.bfloat16), acc)
    return tl.dot(a.to(tl.float32), b.to(tl.float32), acc, input_precision="ieee")


@triton.jit
def _weight_tile(w_ptr, hi_ptr, lo_desc, hi_desc, rows, row0, step, N, K, Kp, stride_w, stride_hi,
                 BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, EVEN_N: tl.constexpr, EVEN_K: tl.constexpr,
                 PTX_DECODE: tl.constexpr, IS_W12: tl.constexpr, TMA: tl.constexpr):
    """Weight tile [BN, BK] of K tile `step` (W12 decoded, scaled), by TMA or plain loads."""
    if IS_W12 and TMA:  # boxes [BN, G] of the int64 lo / int32 hi groups; zeros past N and Kp
        g0 = step * (BLOCK_K // 8)
        w = tiles.decode_tile(lo_desc.load([row0, g0]), hi_desc.load([row0, g0]), BLOCK_N, BLOCK_K, PTX_DECODE, False)
    elif IS_W12:
        w = tiles.load_w12_tile(w_ptr, hi_ptr, rows, step, N, Kp, stride_w, stride_hi,
                                BLOCK_N, BLOCK_K, EVEN_N, EVEN_K, PTX_DECODE, False)
    elif TMA:  # box [BN, BK]; zeros past N and K
        w = lo_desc.load([row0, step * BLOCK_K])
    else:
        w = tiles.load_dense_tile(w_ptr, rows, step, N, K, stride_w, BLOCK_K, EVEN_N, EVEN_K)
    return w


@triton.jit
def _x_tile(x_ptr, x_desc, m, M, K, step, stride_xm, BLOCK_K: tl.constexpr, EVEN_K: tl.constexpr,
            TMA_X: tl.constexpr):
    """x^T tile [BK, BM] of K tile `step`, by TMA (a box [BM, BK] of x, transposed) or plain loads."""
    if TMA_X:  # box [BM, BK] of x; zeros past M and K
        return tl.trans(x_desc.load([0, step * BLOCK_K]))
    return _load_xt(x_ptr, m, M, K, step, stride_xm, BLOCK_K, EVEN_K)


@triton.jit
def _load_xt(x_ptr, m, M, K, step, stride_xm, BLOCK_K: tl.constexpr, EVEN_K: tl.constexpr):
    """x^T tile [BK, BM] of K tile `step` (rows >= M and columns >= K read as zero)."""
    k = step * BLOCK_K + tl.max_contiguous(tl.multiple_of(tl.arange(0, BLOCK_K), BLOCK_K), BLOCK_K)
    mask = (m < M)[None, :]
    if not EVEN_K:
        mask = mask & (k < K)[:, None]
    return tl.load(x_ptr + m[None, :] * stride_xm + k[:, None], mask=mask, other=0.0)


@triton.jit
def _escape_correction(
    x_ptr, esc_ptr_ptr, esc_col_ptr, esc_val_ptr, base_ptr, rows, row0, M, N, stride_xm,
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


@triton.jit
def _escape_block(x_ptr, xt_ptr, word, bits, m, M, stride_xm, acc, BLOCK_N: tl.constexpr, DOT_BF16: tl.constexpr,
                  GATHER_T: tl.constexpr):
    """acc [BN, BM] plus this program's entries (`escape_blocks`: word, bits [SLOT]): a one-hot
    [BN, SLOT] matrix of their scaled values times x^T at their columns (GATHER_T: read from
    xt [K, M], a column's M values side by side, instead of x [M, K], one sector per value)."""
    col = word & 0xFFFFFF
    row = (word >> 24) & 0xFF
    mask = (m < M)[None, :] & (bits != 0)[:, None]  # padding (value 0) reads nothing
    if GATHER_T:
        xe = tl.load(xt_ptr + col[:, None] * M + m[None, :], mask=mask, other=0.0)  # [SLOT, BM]
    else:
        xe = tl.load(x_ptr + m[None, :] * stride_xm + col[:, None], mask=mask, other=0.0)  # [SLOT, BM]
    v = bits.to(tl.bfloat16, bitcast=True)
    a = tl.where(tl.arange(0, BLOCK_N)[:, None] == row[None, :], v[None, :], 0.0)  # [BN, SLOT]
    return _dot(a, xe, acc, DOT_BF16)


@triton.jit(do_not_specialize=["M", "split_k", "steps_per_split"])
def _gemm_kernel(
    # pointers
    x_ptr, w_ptr, hi_ptr, base_ptr, esc_ptr_ptr, esc_col_ptr, esc_val_ptr, y_ptr, ws_ptr, count_ptr,
    # sizes
    M, N, K, Kp, split_k, steps_per_split,
    # strides
    stride_xm, stride_ym, stride_w, stride_hi,
    # escape blocks (ESC_MODE 1); xt: x transposed [K, M] (GATHER_T)
    ebw_ptr, ebv_ptr, xt_ptr,
    # TMA: tensor descriptors of the weight tiles (`tma.py`; W12 lo/hi, plain: both the weight);
    # without TMA the weight's own pointers, unused; TMA_X: x's descriptor, else x's pointer, unused
    lo_desc, hi_desc, x_desc,
    # meta
    IS_W12: tl.constexpr, DOT_BF16: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr, EVEN_N: tl.constexpr, EVEN_K: tl.constexpr, PTX_DECODE: tl.constexpr,
    STAGES: tl.constexpr, ESC_MODE: tl.constexpr, ESC_SLOT: tl.constexpr, GATHER_T: tl.constexpr,
    TMA: tl.constexpr, TMA_X: tl.constexpr, PDL: tl.constexpr = False,
):
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    row0 = pid_n * BLOCK_N
    rows = row0 + tl.arange(0, BLOCK_N)
    m = tl.arange(0, BLOCK_M)
    step0 = pid_k * steps_per_split
    step1 = tl.minimum(step0 + steps_per_split, tl.cdiv(Kp, BLOCK_K))

    if IS_W12 and ESC_MODE == ESC_BLOCKS:  # fixed addresses: in registers by the end of the loop
        e = (pid_n * split_k + pid_k) * ESC_SLOT + tl.arange(0, ESC_SLOT)  # this program's slab
        esc_word = tl.load(ebw_ptr + e)  # [SLOT] row_in_block << 24 | column
        esc_bits = tl.load(ebv_ptr + e)  # [SLOT] BF16 bits, 0 = padding
    if IS_W12:  # issued before the loop: the [BN] base bytes, cold in L2, arrive under it
        scale = tiles.row_scale(base_ptr, rows, N)  # [BN]
    acc = tl.zeros([BLOCK_N, BLOCK_M], dtype=tl.float32)  # y^T tile [BN, BM]
    if PDL:  # the first step's weight tile loads (and decodes) before the wait: it is no kernel's output
        w = _weight_tile(w_ptr, hi_ptr, lo_desc, hi_desc, rows, row0, step0, N, K, Kp, stride_w, stride_hi,
                         BLOCK_N, BLOCK_K, EVEN_N, EVEN_K, PTX_DECODE, IS_W12, TMA)
    tiles.wait_for_inputs(PDL)  # the loads above read the weight only; x and the stores come after
    if PDL:
        acc = _dot(w, _x_tile(x_ptr, x_desc, m, M, K, step0, stride_xm, BLOCK_K, EVEN_K, TMA_X), acc, DOT_BF16)
        first = step0 + 1
    else:
        first = step0
    # STAGES > 1: Triton software-pipelines the loads of this loop through shared memory.
    for step in tl.range(first, step1, num_stages=STAGES):
        w = _weight_tile(w_ptr, hi_ptr, lo_desc, hi_desc, rows, row0, step, N, K, Kp, stride_w, stride_hi,
                         BLOCK_N, BLOCK_K, EVEN_N, EVEN_K, PTX_DECODE, IS_W12, TMA)
        xt = _x_tile(x_ptr, x_desc, m, M, K, step, stride_xm, BLOCK_K, EVEN_K, TMA_X)
        # The first step's MMA ignores acc: Triton turns the select into wgmma's use-accumulator flag.
        acc = _dot(w, xt, tl.where(step == step0, 0.0, acc), DOT_BF16)
    tiles.release_dependents(PDL)
    if IS_W12 and ESC_MODE == ESC_BLOCKS:
        acc = _escape_block(x_ptr, xt_ptr, esc_word, esc_bits, m, M, stride_xm, acc, BLOCK_N, DOT_BF16, GATHER_T)

    out = tl.trans(acc)  # [BM, BN]
    y_mask = (m < M)[:, None] & (rows < N)[None, :]
    if split_k > 1:
        is_last, out = tiles.reduce_split_k(
            out, ws_ptr, count_ptr, pid_n, pid_k, split_k, m[:, None] * N + rows[None, :], y_mask, M * N,
        )
    else:
        is_last = pid_k == 0
    if is_last:
        if IS_W12:
            out = out * scale[None, :]
        if IS_W12 and ESC_MODE == ESC_EPILOGUE:
            out += _escape_correction(x_ptr, esc_ptr_ptr, esc_col_ptr, esc_val_ptr, base_ptr, rows, row0, M, N,
                                      stride_xm, BLOCK_M, BLOCK_N, ESCAPE_CHUNK, DOT_BF16)
        tiles.store_rows(out, y_ptr, rows, M, N, stride_ym, BLOCK_M)


# -- wrapper ----------------------------------------------------------------------------------
ESCAPE_MODES = ("auto", "blocks", "epilogue", "off")


def escape_plan(weight: W12Weight | torch.Tensor, config: LaunchConfig, escapes: str = "auto",
                k_split: int | None = None):
    """(ESC_MODE, EscapeBlocks or None) for a launch whose K splits cover `k_split` columns each
    (None: one split): no escapes -> none; else the weight's escape blocks for this row-block size
    and split when it has them (`escape_blocks`), else the epilogue correction."""
    if escapes not in ESCAPE_MODES:
        raise ValueError(f"escapes must be one of {sorted(ESCAPE_MODES)}, got {escapes!r}")
    if not isinstance(weight, W12Weight) or not weight.num_escapes or escapes == "off":
        return ESC_NONE, None
    if escapes == "epilogue":
        return ESC_EPILOGUE, None
    found = escape_blocks(weight, config.block_n, k_split)
    if found is None and escapes == "blocks":
        raise ValueError(f"this weight has no escape blocks of {config.block_n} rows (see specpilot.kernels.escape_blocks)")
    return (ESC_BLOCKS, found) if found is not None else (ESC_EPILOGUE, None)


def escape_operands(run: Launch, weight: W12Weight | torch.Tensor, config: LaunchConfig, escapes: str = "auto"):
    """(ESC_MODE, EscapeBlocks or None, the kernel's escape-block pointers, ESC_SLOT) of a GEMM or
    GEMV launch: the escape plan for its K splits (each covers steps_per_split * block_k columns).
    Without blocks the pointers are unused: any int32 and int16 tensors keep their types stable."""
    k_split = run.steps_per_split * config.block_k if run.grid[1] > 1 else None
    mode, found = escape_plan(weight, config, escapes, k_split)
    if found is None:
        return mode, None, (run.ops.esc_ptr, run.ops.esc_val), SLOT_STEP
    return mode, found, (found.words, found.values), found.slot


def plan_launch(x: torch.Tensor, weight: W12Weight | torch.Tensor, config: LaunchConfig,
                workspace: SplitKWorkspace | None = None, escapes: str = "auto"):
    """(Launch, ESC_MODE, EscapeBlocks or None, escape-block pointers, ESC_SLOT) of `gemm`: the grid,
    then the escape operands for its K splits (`escape_operands`)."""
    run = prepare_launch(x, weight, config, KernelPath.GEMM, GEMM_MAX_M, workspace)
    return (run, *escape_operands(run, weight, config, escapes))


def gemm(x: torch.Tensor, weight: W12Weight | torch.Tensor, config: LaunchConfig,
         workspace: SplitKWorkspace | None = None, escapes: str = "auto") -> torch.Tensor:
    """y [M, N] in x's dtype for x [M, K] (1 <= M <= GEMM_MAX_M = 128) and a W12 or plain weight [N, K].

    `escapes` picks how W12 escapes are added, for tests and `scripts/w12_escape_cost.py`: "auto"
    (escape blocks where the weight has them, else the epilogue), "blocks", "epilogue" -- all exact --
    or "off", which skips them: a wrong result, timed only; nothing else may pass it."""
    run, mode, _, block_args, slot = plan_launch(x, weight, config, workspace, escapes)
    gather_t = config.gather_t and mode.value == ESC_BLOCKS.value
    xt = x.t().contiguous() if gather_t else x  # [K, M]: its own kernel
    descs = tma_descriptors(weight, run.ops, config) if config.tma else None
    bm = block_m(KernelPath.GEMM, x.shape[0])
    x_desc = x_descriptor(x, bm, config)
    _gemm_kernel[run.grid](
        *run.args, *block_args, xt, *(descs or (run.ops.w, run.ops.hi)), x if x_desc is None else x_desc,
        GATHER_T=gather_t, TMA=descs is not None, TMA_X=x_desc is not None,
        IS_W12=run.ops.is_w12, DOT_BF16=bf16_dots(x, run.ops),
        BLOCK_M=bm, BLOCK_N=config.block_n, BLOCK_K=config.block_k,
        EVEN_N=run.even_n, EVEN_K=run.even_k, PTX_DECODE=ptx_decode(config),
        STAGES=config.num_stages, ESC_MODE=mode.value, ESC_SLOT=slot, PDL=run.pdl,
        num_warps=config.num_warps, num_stages=config.num_stages, maxnreg=config.max_registers,
        **launch_options(run.pdl),
    )
    return run.y.to(x.dtype)


# -- reference --------------------------------------------------------------------------------
reference = reference_linear  # decode (W12) or take the weight, then a float32 matmul
