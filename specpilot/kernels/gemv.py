"""GEMV path: y[M, N] = x[M, K] @ W[N, K].T for 1..8 rows, W12 or plain weights, fp32 FMAs.

Owns the FMA kernel for few rows, its launcher and its reference. Each program streams a block of
BLOCK_N weight rows over its share of K, a *group* of 8 codes at a time (see
`specpilot.w12.layout`): a W12 group is 8 bytes of `lo` and 4 of `hi`, decoded in registers
right after the loads by the inline-PTX decoder (`tiles.decode_groups`: ~2.25 instructions per
float32 weight), and code i of every group meets x at that code's column, gathered from x
(which the repeated reads keep in L1; BF16 x on the GPU a pair of columns per inline-PTX load).
So the weights stay in the registers they were loaded into: nothing is reordered into column
order, and nothing passes through shared memory (assembling tiles in column order, as the
tensor-core GEMM needs them, makes Triton convert them through shared memory, which at these row
counts is slower than the GEMM itself).

Each activation row m keeps one [BLOCK_N, G] float32 accumulator (G = BLOCK_K / 8), summed over
the codes of a group in code order, over the K steps in order, and over G once at the end. Plain
weights run the same loop in the same order, their codes read by column (`_dense_codes`; BF16
pairs as one 32-bit load): on escape-free weights W12 gives the plain kernel's output bit for
bit, since the decoders' scaling by 2^(112 - e0) is undone exactly per row. The loop's loads are
plain loads with several programs per SM: pipelining them through shared memory (`num_stages` > 1,
cp.async), a register prefetch of the next step and TMA loads were all slower
(`scripts/w12_kernels.py` times the GEMV's configs against cuBLAS). Row blocks are split along K
when there are too few of them to keep every SM streaming; splits reduce through
`tiles.reduce_split_k` in a fixed order, so results do not depend on scheduling.

W12 escapes come from escape blocks (`gemm.escape_operands`): this program's slab is loaded before
the K loop and added in the scaled domain after it. A slab of at most G entries (the benchmark's
shapes: a few escapes per row block) is loaded one entry per lane of the accumulators' G axis and
each product x[m, column] * value added into acc[its row, its lane] before the sum over G: no
reduction or layout change of its own, where a one-hot [BM, SLOT, BN] sum after the loop goes
through shared memory and slows the kernel (`scripts/w12_kernels.py` times it on weights with
escapes). Wider slabs keep the one-hot sum. Weights without blocks take the CSR correction of the program
that finishes a row block (three dependent loads after the loop).

Launched with programmatic dependent launch (`launch.pdl`), a program loads and decodes its first
K step's weights and its escapes before it waits for the previous kernel (`tiles.wait_for_inputs`),
then reads x; the sums run in the same order either way.

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
from specpilot.kernels.gemm import ESC_BLOCKS, ESC_EPILOGUE, escape_operands
from specpilot.kernels.launch import launch_options, prepare_launch, ptx_decode
from specpilot.kernels.reference import reference_linear
from specpilot.kernels.workspace import SplitKWorkspace
from specpilot.w12.weight import W12Weight

ESCAPE_CHUNK = 16

# -- configs ----------------------------------------------------------------------------------
configs = gemv_candidates  # the tiles the benchmark sweeps for a given M (see configs.py)


# -- kernel -----------------------------------------------------------------------------------
@triton.jit
def _code_offset(i: tl.constexpr):
    """Column of code i of a group, relative to code 0's: 0, 1, 8, 9, 16, 17, 24, 25."""
    return (i % 2) + 8 * (i // 2)


@triton.jit
def _x_code(x_ptr, row, col0, i: tl.constexpr, M, K, stride_xm, EVEN_M: tl.constexpr, EVEN_K: tl.constexpr):
    """x[row] at code i of the groups whose code 0 is at columns col0 [G], as float32 [G]."""
    col = col0 + _code_offset(i)
    ptr = x_ptr + row * stride_xm + col
    if EVEN_M and EVEN_K:
        xv = tl.load(ptr)
    else:
        mask = (col * 0 + row) < M
        if not EVEN_K:
            mask = mask & (col < K)
        xv = tl.load(ptr, mask=mask, other=0.0)
    return xv.to(tl.float32)


# x[row] at two adjacent columns of BF16 activations, as float32, from one 32-bit load through the
# read-only cache. Inline PTX so that the load keeps the layout of its addresses (the groups' slice
# of the weight tile): a tl.load of the same gather is given a layout of its own by Triton, then
# converted through shared memory, two CTA barriers per code and K step (sm_90 SASS).
ASM_X_PAIR: tl.constexpr = tl.constexpr(
    "{.reg .b32 p; ld.global.nc.b32 p, [$2]; shl.b32 $0, p, 16; and.b32 $1, p, 0xFFFF0000;}")


@triton.jit
def _x_pair(x_ptr, row, col0, q: tl.constexpr, M, stride_xm):
    """x[row] at codes 2q and 2q + 1 (columns col0 + 8q and the next) of BF16 x: float32 [G] each.
    Rows past M read row M - 1 (valid memory; the caller stores no output for them)."""
    ptr = x_ptr + tl.minimum(row, M - 1) * stride_xm + col0 + 8 * q
    return tl.inline_asm_elementwise(ASM_X_PAIR, "=r,=r,l", [ptr.to(tl.int64, bitcast=True)],
                                     dtype=(tl.float32, tl.float32), is_pure=True, pack=1)


@triton.jit
def _fma_codes(acc, o0, o1, o2, o3, o4, o5, o6, o7, x_ptr, row, col0, M, K, stride_xm,
               EVEN_M: tl.constexpr, EVEN_K: tl.constexpr, X_PAIRS: tl.constexpr):
    """acc [BN, G] += the 8 codes of each group times x[row] at their columns, in code order.
    X_PAIRS: x is BF16 on the GPU with 4-byte aligned rows and K a multiple of BLOCK_K."""
    if X_PAIRS:
        x0, x1 = _x_pair(x_ptr, row, col0, 0, M, stride_xm)
        x2, x3 = _x_pair(x_ptr, row, col0, 1, M, stride_xm)
        x4, x5 = _x_pair(x_ptr, row, col0, 2, M, stride_xm)
        x6, x7 = _x_pair(x_ptr, row, col0, 3, M, stride_xm)
    else:
        x0 = _x_code(x_ptr, row, col0, 0, M, K, stride_xm, EVEN_M, EVEN_K)
        x1 = _x_code(x_ptr, row, col0, 1, M, K, stride_xm, EVEN_M, EVEN_K)
        x2 = _x_code(x_ptr, row, col0, 2, M, K, stride_xm, EVEN_M, EVEN_K)
        x3 = _x_code(x_ptr, row, col0, 3, M, K, stride_xm, EVEN_M, EVEN_K)
        x4 = _x_code(x_ptr, row, col0, 4, M, K, stride_xm, EVEN_M, EVEN_K)
        x5 = _x_code(x_ptr, row, col0, 5, M, K, stride_xm, EVEN_M, EVEN_K)
        x6 = _x_code(x_ptr, row, col0, 6, M, K, stride_xm, EVEN_M, EVEN_K)
        x7 = _x_code(x_ptr, row, col0, 7, M, K, stride_xm, EVEN_M, EVEN_K)
    acc = tl.fma(o0, x0[None, :], acc)
    acc = tl.fma(o1, x1[None, :], acc)
    acc = tl.fma(o2, x2[None, :], acc)
    acc = tl.fma(o3, x3[None, :], acc)
    acc = tl.fma(o4, x4[None, :], acc)
    acc = tl.fma(o5, x5[None, :], acc)
    acc = tl.fma(o6, x6[None, :], acc)
    acc = tl.fma(o7, x7[None, :], acc)
    return acc


@triton.jit
def _dense_pair(w32, rows, col0, q: tl.constexpr, N, K, stride_w, EVEN_N: tl.constexpr, EVEN_K: tl.constexpr):
    """Codes 2q and 2q + 1 (adjacent columns) of plain BF16 weights as float32: one 32-bit load."""
    col = col0 + 8 * q
    pair = tl.max_contiguous(tl.multiple_of(col // 2, 4), 4)  # groups 4b..4b+3 read 4 consecutive pairs
    ptr = w32 + rows[:, None] * (stride_w // 2) + pair[None, :]
    if EVEN_N and EVEN_K:
        p = tl.load(ptr)
    else:
        p = tl.load(ptr, mask=(rows < N)[:, None] & (col < K)[None, :], other=0)
    return (p << 16).to(tl.float32, bitcast=True), (p & -65536).to(tl.float32, bitcast=True)


@triton.jit
def _dense_code(w_ptr, rows, col0, i: tl.constexpr, N, K, stride_w, EVEN_N: tl.constexpr, EVEN_K: tl.constexpr):
    """Code i of plain weights of any float dtype as float32 [BN, G]."""
    col = col0 + _code_offset(i)
    ptr = w_ptr + rows[:, None] * stride_w + col[None, :]
    if EVEN_N and EVEN_K:
        return tl.load(ptr).to(tl.float32)
    return tl.load(ptr, mask=(rows < N)[:, None] & (col < K)[None, :], other=0.0).to(tl.float32)


@triton.jit
def _dense_codes(w_ptr, rows, col0, N, K, stride_w, EVEN_N: tl.constexpr, EVEN_K: tl.constexpr, PAIRS: tl.constexpr):
    """The 8 codes of each group of plain weights, float32 [BN, G] each, in the order W12 decodes them.
    PAIRS: BF16 with an even row length, read a pair of adjacent codes per 32-bit load."""
    if PAIRS:
        w32 = w_ptr.to(tl.pointer_type(tl.int32))
        o0, o1 = _dense_pair(w32, rows, col0, 0, N, K, stride_w, EVEN_N, EVEN_K)
        o2, o3 = _dense_pair(w32, rows, col0, 1, N, K, stride_w, EVEN_N, EVEN_K)
        o4, o5 = _dense_pair(w32, rows, col0, 2, N, K, stride_w, EVEN_N, EVEN_K)
        o6, o7 = _dense_pair(w32, rows, col0, 3, N, K, stride_w, EVEN_N, EVEN_K)
    else:
        o0 = _dense_code(w_ptr, rows, col0, 0, N, K, stride_w, EVEN_N, EVEN_K)
        o1 = _dense_code(w_ptr, rows, col0, 1, N, K, stride_w, EVEN_N, EVEN_K)
        o2 = _dense_code(w_ptr, rows, col0, 2, N, K, stride_w, EVEN_N, EVEN_K)
        o3 = _dense_code(w_ptr, rows, col0, 3, N, K, stride_w, EVEN_N, EVEN_K)
        o4 = _dense_code(w_ptr, rows, col0, 4, N, K, stride_w, EVEN_N, EVEN_K)
        o5 = _dense_code(w_ptr, rows, col0, 5, N, K, stride_w, EVEN_N, EVEN_K)
        o6 = _dense_code(w_ptr, rows, col0, 6, N, K, stride_w, EVEN_N, EVEN_K)
        o7 = _dense_code(w_ptr, rows, col0, 7, N, K, stride_w, EVEN_N, EVEN_K)
    return o0, o1, o2, o3, o4, o5, o6, o7


@triton.jit
def _escape_block(x_ptr, word, bits, m, M, stride_xm, BLOCK_N: tl.constexpr):
    """[BM, BN] float32: this program's escape-block entries (`escape_blocks`: word, bits [SLOT]) at
    their rows, sum of value * x[m, column] (each product exact: BF16 times BF16)."""
    col = word & 0xFFFFFF
    row = (word >> 24) & 0xFF
    xe = tl.load(x_ptr + m[:, None] * stride_xm + col[None, :],
                 mask=(m < M)[:, None] & (bits != 0)[None, :], other=0.0).to(tl.float32)  # [BM, SLOT]
    v = (bits.to(tl.int32) << 16).to(tl.float32, bitcast=True)  # [SLOT]
    hit = tl.arange(0, BLOCK_N)[None, :] == row[:, None]  # [SLOT, BN]
    return tl.sum(tl.where(hit[None, :, :], (xe * v[None, :])[:, :, None], 0.0), axis=1)


# One 32-bit word, or one BF16 value as float32, through the read-only cache: inline PTX, so that
# the loaded [G] vector keeps the layout of its addresses (a slice of the accumulator's, as `_x_pair`).
ASM_LD_B32: tl.constexpr = tl.constexpr("ld.global.nc.b32 $0, [$1];")
ASM_LD_BF16: tl.constexpr = tl.constexpr("{.reg .b32 w; ld.global.nc.u16 w, [$1]; shl.b32 $0, w, 16;}")


@triton.jit
def _ld_word(ptr, PTX: tl.constexpr):
    """int32 at ptr [G]."""
    if PTX:
        return tl.inline_asm_elementwise(ASM_LD_B32, "=r,l", [ptr.to(tl.int64, bitcast=True)],
                                         dtype=tl.int32, is_pure=True, pack=1)
    return tl.load(ptr)


@triton.jit
def _ld_bf16(ptr, PTX: tl.constexpr):
    """The BF16 bit patterns at ptr [G] (int16 storage) as float32."""
    if PTX:
        return tl.inline_asm_elementwise(ASM_LD_BF16, "=r,l", [ptr.to(tl.int64, bitcast=True)],
                                         dtype=tl.float32, is_pure=True, pack=1)
    return (tl.load(ptr).to(tl.int32) << 16).to(tl.float32, bitcast=True)


@triton.jit
def _entries_into_acc(acc, x_ptr, row, M, stride_xm, word, v, BLOCK_N: tl.constexpr, PTX: tl.constexpr):
    """acc [BN, G] plus this program's escape-block entries for activation row `row`: entry j
    (word, value v [G], lanes past the slot hold v = 0) adds v * x[row, column] at [its row, j].
    Each product is exact (BF16 times BF16); acc's sum over G then carries it into the row."""
    col = word & 0xFFFFFF
    ptr = x_ptr + tl.minimum(row, M - 1) * stride_xm + col  # rows past M read row M - 1 (not stored)
    if PTX:  # BF16 x (X_PAIRS)
        xe = _ld_bf16(ptr, PTX)
    else:
        xe = tl.load(ptr).to(tl.float32)
    prod = tl.where(v != 0.0, xe * v, 0.0)  # [G]; padding adds 0 even where x is Inf or NaN
    hit = tl.arange(0, BLOCK_N)[:, None] == ((word >> 24) & 0xFF)[None, :]  # [BN, G]
    return acc + tl.where(hit, prod[None, :], 0.0)


@triton.jit
def _put_row(out, acc, row, m):
    """out [BM, BN] with row `row` set to the sum over groups of acc [BN, G]."""
    return tl.where((m == row)[:, None], tl.sum(acc, axis=1)[None, :], out)


@triton.jit
def _step_codes(w_ptr, hi_ptr, rows, step, N, K, Kp, stride_w, stride_hi, BLOCK_K: tl.constexpr,
                EVEN_N: tl.constexpr, EVEN_K: tl.constexpr, IS_W12: tl.constexpr, PTX_DECODE: tl.constexpr,
                PAIRS: tl.constexpr):
    """One K step's weights: (col0 [G], the 8 codes [BN, G] each, W12 scaled): G = BLOCK_K / 8 groups."""
    G: tl.constexpr = BLOCK_K // tiles.WORD
    g = step * G + tl.max_contiguous(tl.multiple_of(tl.arange(0, G), G), G)  # [G] groups
    col0 = (g // 4) * 32 + (g % 4) * 2  # [G] the column of each group's code 0
    if IS_W12:
        lo, hi = tiles.load_groups(w_ptr, hi_ptr, rows, step, N, Kp, stride_w, stride_hi, BLOCK_K, EVEN_N, EVEN_K)
        o0, o1, o2, o3, o4, o5, o6, o7 = tiles.decode_groups(lo, hi, PTX_DECODE, True)  # [BN, G] each, scaled
    else:
        o0, o1, o2, o3, o4, o5, o6, o7 = _dense_codes(w_ptr, rows, col0, N, K, stride_w, EVEN_N, EVEN_K, PAIRS)
    return col0, o0, o1, o2, o3, o4, o5, o6, o7


@triton.jit
def _step_fma(acc0, acc1, acc2, acc3, acc4, acc5, acc6, acc7, o0, o1, o2, o3, o4, o5, o6, o7, x_ptr, col0, M, K,
              stride_xm, BLOCK_M: tl.constexpr, EVEN_M: tl.constexpr, EVEN_K: tl.constexpr, X_PAIRS: tl.constexpr):
    """Each activation row's accumulator plus one K step's codes times x (rows past BLOCK_M untouched)."""
    acc0 = _fma_codes(acc0, o0, o1, o2, o3, o4, o5, o6, o7, x_ptr, 0, col0, M, K, stride_xm, EVEN_M, EVEN_K, X_PAIRS)
    if BLOCK_M > 1:
        acc1 = _fma_codes(acc1, o0, o1, o2, o3, o4, o5, o6, o7, x_ptr, 1, col0, M, K, stride_xm, EVEN_M, EVEN_K, X_PAIRS)
    if BLOCK_M > 2:
        acc2 = _fma_codes(acc2, o0, o1, o2, o3, o4, o5, o6, o7, x_ptr, 2, col0, M, K, stride_xm, EVEN_M, EVEN_K, X_PAIRS)
        acc3 = _fma_codes(acc3, o0, o1, o2, o3, o4, o5, o6, o7, x_ptr, 3, col0, M, K, stride_xm, EVEN_M, EVEN_K, X_PAIRS)
    if BLOCK_M > 4:
        acc4 = _fma_codes(acc4, o0, o1, o2, o3, o4, o5, o6, o7, x_ptr, 4, col0, M, K, stride_xm, EVEN_M, EVEN_K, X_PAIRS)
        acc5 = _fma_codes(acc5, o0, o1, o2, o3, o4, o5, o6, o7, x_ptr, 5, col0, M, K, stride_xm, EVEN_M, EVEN_K, X_PAIRS)
        acc6 = _fma_codes(acc6, o0, o1, o2, o3, o4, o5, o6, o7, x_ptr, 6, col0, M, K, stride_xm, EVEN_M, EVEN_K, X_PAIRS)
        acc7 = _fma_codes(acc7, o0, o1, o2, o3, o4, o5, o6, o7, x_ptr, 7, col0, M, K, stride_xm, EVEN_M, EVEN_K, X_PAIRS)
    return acc0, acc1, acc2, acc3, acc4, acc5, acc6, acc7


@triton.jit(do_not_specialize=["M", "split_k", "steps_per_split"])
def _gemv_kernel(
    # pointers
    x_ptr, w_ptr, hi_ptr, base_ptr, esc_ptr_ptr, esc_col_ptr, esc_val_ptr, y_ptr, ws_ptr, count_ptr,
    # sizes
    M, N, K, Kp, split_k, steps_per_split,
    # strides
    stride_xm, stride_ym, stride_w, stride_hi,
    # escape blocks (ESC_MODE 1, `escape_blocks.py`)
    ebw_ptr, ebv_ptr,
    # meta
    IS_W12: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    EVEN_M: tl.constexpr, EVEN_N: tl.constexpr, EVEN_K: tl.constexpr, PTX_DECODE: tl.constexpr,
    ESC_CHUNK: tl.constexpr, STAGES: tl.constexpr, PAIRS: tl.constexpr, X_PAIRS: tl.constexpr,
    ESC_MODE: tl.constexpr, ESC_SLOT: tl.constexpr, PDL: tl.constexpr = False,
):
    G: tl.constexpr = BLOCK_K // tiles.WORD
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    row0 = pid_n * BLOCK_N
    rows = row0 + tl.arange(0, BLOCK_N)
    m = tl.arange(0, BLOCK_M)
    step0 = pid_k * steps_per_split
    step1 = tl.minimum(step0 + steps_per_split, tl.cdiv(Kp, BLOCK_K))
    # Escape blocks whose slab fits in G lanes are added into the accumulators (`_entries_into_acc`),
    # with no reduction or layout change of their own; wider slabs by a one-hot sum after the loop.
    ESC_IN_ACC: tl.constexpr = ESC_SLOT <= G
    if IS_W12 and ESC_MODE == ESC_BLOCKS:  # fixed addresses: in registers by the end of the loop
        slab = (pid_n * split_k + pid_k) * ESC_SLOT
        if ESC_IN_ACC:
            lane = tl.arange(0, G)
            e = slab + tl.minimum(lane, ESC_SLOT - 1)  # [G]: lanes past the slot re-read its last entry
            esc_word = _ld_word(ebw_ptr + e, X_PAIRS)  # [G] row_in_block << 24 | column
            esc_v = tl.where(lane < ESC_SLOT, _ld_bf16(ebv_ptr + e, X_PAIRS), 0.0)  # [G] scaled entry, 0 = padding
        else:
            e = slab + tl.arange(0, ESC_SLOT)  # this program's slab
            esc_word = tl.load(ebw_ptr + e)  # [SLOT] row_in_block << 24 | column
            esc_bits = tl.load(ebv_ptr + e)  # [SLOT] BF16 bits of the scaled entry, 0 = padding
    if IS_W12:  # issued before the loop: the [BN] base bytes, cold in L2, arrive under it
        scale = tiles.row_scale(base_ptr, rows, N)  # [BN]
    # One [BN, G] accumulator per activation row (unrolled: BLOCK_M <= 8); unused ones fold away.
    acc0 = tl.zeros([BLOCK_N, G], dtype=tl.float32)
    acc1 = tl.zeros_like(acc0)
    acc2 = tl.zeros_like(acc0)
    acc3 = tl.zeros_like(acc0)
    acc4 = tl.zeros_like(acc0)
    acc5 = tl.zeros_like(acc0)
    acc6 = tl.zeros_like(acc0)
    acc7 = tl.zeros_like(acc0)
    if PDL:  # the first step's weights load (and decode) before the wait: they are no kernel's output
        col0, o0, o1, o2, o3, o4, o5, o6, o7 = _step_codes(
            w_ptr, hi_ptr, rows, step0, N, K, Kp, stride_w, stride_hi, BLOCK_K, EVEN_N, EVEN_K, IS_W12, PTX_DECODE,
            PAIRS)
    tiles.wait_for_inputs(PDL)  # the loads above read the weight only; x and the stores come after
    if PDL:
        acc0, acc1, acc2, acc3, acc4, acc5, acc6, acc7 = _step_fma(
            acc0, acc1, acc2, acc3, acc4, acc5, acc6, acc7, o0, o1, o2, o3, o4, o5, o6, o7, x_ptr, col0, M, K,
            stride_xm, BLOCK_M, EVEN_M, EVEN_K, X_PAIRS)
        first = step0 + 1
    else:
        first = step0
    for step in tl.range(first, step1, num_stages=STAGES):
        col0, o0, o1, o2, o3, o4, o5, o6, o7 = _step_codes(
            w_ptr, hi_ptr, rows, step, N, K, Kp, stride_w, stride_hi, BLOCK_K, EVEN_N, EVEN_K, IS_W12, PTX_DECODE,
            PAIRS)
        acc0, acc1, acc2, acc3, acc4, acc5, acc6, acc7 = _step_fma(
            acc0, acc1, acc2, acc3, acc4, acc5, acc6, acc7, o0, o1, o2, o3, o4, o5, o6, o7, x_ptr, col0, M, K,
            stride_xm, BLOCK_M, EVEN_M, EVEN_K, X_PAIRS)
    tiles.release_dependents(PDL)
    if IS_W12 and ESC_MODE == ESC_BLOCKS and ESC_IN_ACC:  # scaled entries, before any sum
        acc0 = _entries_into_acc(acc0, x_ptr, 0, M, stride_xm, esc_word, esc_v, BLOCK_N, X_PAIRS)
        if BLOCK_M > 1:
            acc1 = _entries_into_acc(acc1, x_ptr, 1, M, stride_xm, esc_word, esc_v, BLOCK_N, X_PAIRS)
        if BLOCK_M > 2:
            acc2 = _entries_into_acc(acc2, x_ptr, 2, M, stride_xm, esc_word, esc_v, BLOCK_N, X_PAIRS)
            acc3 = _entries_into_acc(acc3, x_ptr, 3, M, stride_xm, esc_word, esc_v, BLOCK_N, X_PAIRS)
        if BLOCK_M > 4:
            acc4 = _entries_into_acc(acc4, x_ptr, 4, M, stride_xm, esc_word, esc_v, BLOCK_N, X_PAIRS)
            acc5 = _entries_into_acc(acc5, x_ptr, 5, M, stride_xm, esc_word, esc_v, BLOCK_N, X_PAIRS)
            acc6 = _entries_into_acc(acc6, x_ptr, 6, M, stride_xm, esc_word, esc_v, BLOCK_N, X_PAIRS)
            acc7 = _entries_into_acc(acc7, x_ptr, 7, M, stride_xm, esc_word, esc_v, BLOCK_N, X_PAIRS)
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

    if IS_W12 and ESC_MODE == ESC_BLOCKS and not ESC_IN_ACC:  # scaled, before the split-K reduction
        out += _escape_block(x_ptr, esc_word, esc_bits, m, M, stride_xm, BLOCK_N)

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
            out += tiles.escape_correction_mn(
                x_ptr, esc_ptr_ptr, esc_col_ptr, esc_val_ptr, base_ptr, rows, row0, M, N, stride_xm,
                BLOCK_M, BLOCK_N, ESC_CHUNK,
            )
        tiles.store_rows(out, y_ptr, rows, M, N, stride_ym, BLOCK_M)


# -- wrapper ----------------------------------------------------------------------------------
def dense_pairs(weight: W12Weight | torch.Tensor) -> bool:
    """Whether plain weights are read a BF16 pair per 32-bit load: BF16, even row length and stride,
    4-byte aligned (a view starting at an odd column takes the per-code loads)."""
    return (isinstance(weight, torch.Tensor) and weight.dtype == torch.bfloat16
            and weight.shape[1] % 2 == 0 and weight.stride(0) % 2 == 0 and weight.data_ptr() % 4 == 0)


def x_pairs(x: torch.Tensor, config: LaunchConfig, even_k: bool) -> bool:
    """Whether x is read a BF16 pair per 32-bit inline-PTX load: BF16 on the GPU (the PTX decoder's
    condition), rows 4-byte aligned, and no K tile past K (the pairs are not masked)."""
    return (ptx_decode(config) and x.dtype == torch.bfloat16 and even_k
            and x.stride(0) % 2 == 0 and x.data_ptr() % 4 == 0)


def gemv(x: torch.Tensor, weight: W12Weight | torch.Tensor, config: LaunchConfig,
         workspace: SplitKWorkspace | None = None, escapes: str = "auto") -> torch.Tensor:
    """y [M, N] in x's dtype for x [M, K] (1 <= M <= 8) and a W12 or plain weight [N, K].

    `escapes` as in `gemm.gemm`: "auto" (escape blocks where the weight has them, else the
    epilogue), "blocks", "epilogue" -- all exact -- or "off" (wrong results, for timing only)."""
    run = prepare_launch(x, weight, config, KernelPath.GEMV, GEMV_MAX_M, workspace)
    mode, _, block_args, slot = escape_operands(run, weight, config, escapes)
    bm = block_m(KernelPath.GEMV, x.shape[0])
    _gemv_kernel[run.grid](
        *run.args, *block_args, ESC_MODE=mode.value, ESC_SLOT=slot,
        IS_W12=run.ops.is_w12, BLOCK_M=bm, BLOCK_N=config.block_n, BLOCK_K=config.block_k,
        EVEN_M=x.shape[0] == bm, EVEN_N=run.even_n, EVEN_K=run.even_k,
        PTX_DECODE=ptx_decode(config), ESC_CHUNK=ESCAPE_CHUNK, STAGES=config.num_stages,
        PAIRS=dense_pairs(weight), X_PAIRS=x_pairs(x, config, run.even_k), PDL=run.pdl,
        num_warps=config.num_warps, num_stages=config.num_stages, **launch_options(run.pdl),
    )
    return run.y.to(x.dtype)


# -- reference --------------------------------------------------------------------------------
reference = reference_linear  # decode (W12) or take the weight, then a float32 matmul
