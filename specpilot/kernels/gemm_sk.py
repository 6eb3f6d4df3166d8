"""Prototype: the W12 GEMM as one flat, balanced stream of (row tile, K step) units per program.

Why: in-kernel %globaltimer stamps (bench/results/w12/w12_timeline.md) show that at M=1 the
standard grid loses its time at the end: on Qwen3-32B qkv the 28 SMs that run two of the 160 row
tiles finish 4.3 µs after the median SM, on 8B gate_up the SMs' last programs end between 32.9 and
39.4 µs. Here program p of P takes units [p U / P, (p + 1) U / P) of the U = tiles x K-steps units
in tile-major order, in ONE loop, so Triton's pipeliner keeps loading across tile boundaries (the
stream-K of bench/results/w12/stream_k.md ran a loop per tile segment and refilled the pipeline at
each). A segment that covers a whole tile is finished by its program; otherwise its contributors
store float32 partials and the last to arrive sums them in contributor order
(`_reduce_in_loop`), adds the tile's escape blocks (one slab per row block, all columns) and
the row scale, and stores the tile.

W12 weights with escape blocks only; bf16 (or, under the interpreter, float32) activations.
Not dispatched: bench/prototypes/w12_stream_flat.py times it against the tuned standard grid.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from specpilot.kernels import tiles
from specpilot.kernels.configs import GEMM_MAX_M, KernelPath, block_m
from specpilot.kernels.escape_blocks import escape_blocks
from specpilot.kernels.gemm import _dot, _escape_block, _load_xt
from specpilot.kernels.launch import bf16_dots, check_activations, output_buffer, ptx_decode, sm_count, weight_operands
from specpilot.kernels.workspace import shared_workspace
from specpilot.w12.weight import W12Weight


@triton.jit
def _reduce_in_loop(acc, ws_ptr, count_ptr, tile, idx, n, offsets, mask, stride,
                    MAX_C: tl.constexpr, THREADS: tl.constexpr):
    """`tiles.reduce_split_k` in a form Triton still software-pipelines the K loop around: no CTA
    barrier (`tl.debug_barrier` in a loop stops the pipeliner) -- every thread instead counts its
    own arrival with an acq_rel atomic (releasing its own partial stores), so the tile's counter
    reaches n * THREADS - 1 only once every thread of every contributor has stored -- and the sum
    unrolled to MAX_C >= n slots (a loop nested in the K loop stops the pipeliner too)."""
    tl.store(ws_ptr + idx * stride + offsets, acc, mask=mask)
    old = tl.atomic_add(count_ptr + tile + tl.zeros([THREADS], tl.int32), 1, sem="acq_rel", scope="gpu")  # one per thread
    is_last = tl.max(old, axis=0) == n * THREADS - 1
    total = acc
    if is_last:
        total = tl.zeros_like(acc)
        for s in tl.static_range(MAX_C):
            total += tl.load(ws_ptr + s * stride + offsets, mask=mask & (offsets * 0 + s < n), other=0.0,
                             cache_modifier=".cg")
        tl.atomic_xchg(count_ptr + tile, 0, sem="relaxed")
    return is_last, total


@triton.jit(do_not_specialize=["M", "steps", "units", "programs"])
def _gemm_sk_kernel(
    x_ptr, w_ptr, hi_ptr, base_ptr, y_ptr, ws_ptr, count_ptr, ebw_ptr, ebv_ptr,
    M, N, K, Kp, steps, units, programs,
    stride_xm, stride_ym, stride_w, stride_hi,
    DOT_BF16: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    EVEN_N: tl.constexpr, EVEN_K: tl.constexpr, PTX_DECODE: tl.constexpr, STAGES: tl.constexpr,
    ESC_SLOT: tl.constexpr, MAX_C: tl.constexpr, THREADS: tl.constexpr,
):
    p = tl.program_id(0)
    u0 = p * units // programs
    u1 = (p + 1) * units // programs
    m = tl.arange(0, BLOCK_M)
    acc = tl.zeros([BLOCK_N, BLOCK_M], dtype=tl.float32)  # y^T of the current segment [BN, BM]
    for u in tl.range(u0, u1, num_stages=STAGES):
        tile = u // steps
        step = u - tile * steps
        rows = tile * BLOCK_N + tl.arange(0, BLOCK_N)
        w = tiles.load_w12_tile(w_ptr, hi_ptr, rows, step, N, Kp, stride_w, stride_hi,
                                BLOCK_N, BLOCK_K, EVEN_N, EVEN_K, PTX_DECODE, False)  # [BN, BK] scaled
        xt = _load_xt(x_ptr, m, M, K, step, stride_xm, BLOCK_K, EVEN_K)  # [BK, BM]
        acc = _dot(w, xt, tl.where((step == 0) | (u == u0), 0.0, acc), DOT_BF16)
        if (step == steps - 1) | (u == u1 - 1):  # this program's segment of `tile` ends here
            first_unit = tile * steps
            p_first = ((first_unit + 1) * programs - 1) // units  # the program holding the tile's first unit
            p_last = ((first_unit + steps) * programs - 1) // units
            mask = (rows < N)[:, None] & (m < M)[None, :]
            is_last = p_first == p_last  # one program holds the whole tile: no partials
            total = acc
            if p_first != p_last:
                is_last, total = _reduce_in_loop(acc, ws_ptr, count_ptr, tile, p - p_first, p_last - p_first + 1,
                                                 rows[:, None] + m[None, :] * N, mask, M * N, MAX_C, THREADS)
            if is_last:
                e = tile * ESC_SLOT + tl.arange(0, ESC_SLOT)  # the row block's slab: all its columns
                total = _escape_block(x_ptr, x_ptr, tl.load(ebw_ptr + e), tl.load(ebv_ptr + e), m, M, stride_xm,
                                      total, BLOCK_N, DOT_BF16, False)
                out = tl.trans(total) * tiles.row_scale(base_ptr, rows, N)[None, :]  # [BM, BN]
                tiles.store_rows(out, y_ptr, rows, M, N, stride_ym, BLOCK_M)


def gemm_sk(x: torch.Tensor, weight: W12Weight, block_n: int = 64, block_k: int = 256, num_warps: int = 4,
            num_stages: int = 3, programs_per_sm: int = 2, programs: int | None = None) -> torch.Tensor:
    """y [M, N] for x [M, K] and a W12 weight with escape blocks, every program an equal share of
    the (row tile, K step) units (`programs`: that many, else programs_per_sm per SM)."""
    ops = weight_operands(weight)
    check_activations(x, ops, GEMM_MAX_M)
    found = escape_blocks(weight, block_n, None)
    if found is None:
        raise ValueError("gemm_sk needs a weight with escape blocks (see specpilot.kernels.escape_blocks)")
    M = x.shape[0]
    tiles_n = -(-ops.N // block_n)
    steps = -(-ops.Kp // block_k)
    units = tiles_n * steps
    programs = min(units, programs or programs_per_sm * sm_count(x.device))
    per = units / programs
    contributors = int(-(-steps // int(per))) + 1 if per >= 1 else steps
    ws = shared_workspace(x.device)
    if not ws.fits(contributors, M, ops.N, tiles_n):
        raise ValueError(f"the split-K workspace cannot hold {contributors} partials of [{M}, {ops.N}]")
    y = output_buffer(x, ops.N)
    _gemm_sk_kernel[(programs,)](
        x, ops.w, ops.hi, ops.base, y, ws.partials, ws.counters, found.words, found.values,
        M, ops.N, ops.K, ops.Kp, steps, units, programs,
        x.stride(0), y.stride(0), ops.stride_w, ops.stride_hi,
        DOT_BF16=bf16_dots(x, ops), BLOCK_M=block_m(KernelPath.GEMM, M), BLOCK_N=block_n, BLOCK_K=block_k,
        EVEN_N=ops.N % block_n == 0, EVEN_K=ops.K % block_k == 0, PTX_DECODE=ptx_decode(),
        STAGES=num_stages, ESC_SLOT=found.slot, MAX_C=contributors, THREADS=32 * num_warps, num_warps=num_warps, num_stages=num_stages,
        maxnreg=min(255, 65536 // (32 * num_warps * max(2, min(programs_per_sm, 3)))) // 8 * 8,
    )
    return y.to(x.dtype)
