"""W12 -> BF16 unpack on the GPU: the whole [N, K] matrix, bit-exact.

Owns the kernel that decodes the dense planes (the same `tiles.load_w12_tile` the GEMV/GEMM
kernels use, then the row scale, so a test of this kernel against the reference decoder pins down
their decoding too), its launcher, which then writes the escapes with one scatter, and its
reference (`codec.decode`).
Used for projections with more than 64 rows (prefill), where decoding once and calling cuBLAS
beats decoding per tile. Does not own the codec (`specpilot.w12.codec`).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from specpilot.kernels import tiles
from specpilot.kernels.launch import ptx_decode
from specpilot.w12.codec import decode, escape_columns, escape_rows
from specpilot.w12.layout import padded_columns
from specpilot.w12.weight import W12Weight

# -- configs ----------------------------------------------------------------------------------
BLOCK_N = 16
BLOCK_K = 256
NUM_WARPS = 4


# -- kernel -----------------------------------------------------------------------------------
@triton.jit
def _unpack_kernel(
    # pointers
    lo_ptr, hi_ptr, base_ptr, out_ptr,
    # sizes
    N, K, Kp,
    # strides
    stride_lo, stride_hi, stride_out,
    # meta
    BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, PTX_DECODE: tl.constexpr,
):
    rows = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    step = tl.program_id(1)
    w = tiles.load_w12_tile(lo_ptr, hi_ptr, rows, step, N, Kp, stride_lo, stride_hi,
                            BLOCK_N, BLOCK_K, False, False, PTX_DECODE, True)  # [BN, BK] float32, scaled
    w = w * tiles.row_scale(base_ptr, rows, N)[:, None]  # exact: the true in-window values (placeholders too)
    # Store BF16 bit patterns as int16: exact (the float32 values have zero low halves).
    bits = (w.to(tl.int32, bitcast=True) >> 16).to(tl.int16)
    k = step * BLOCK_K + tl.arange(0, BLOCK_K)
    tl.store(out_ptr + rows[:, None] * stride_out + k[None, :], bits, mask=(rows < N)[:, None] & (k < K)[None, :])


# -- wrapper ----------------------------------------------------------------------------------
def unpack(weight: W12Weight, out: torch.Tensor | None = None) -> torch.Tensor:
    """The exact BF16 matrix [N, K] of `weight`, decoded on its device (into `out`, a contiguous
    [N, K] BF16 or int16 tensor there, when given: a reused buffer)."""
    N, K = weight.shape
    if out is None:
        out = torch.empty(N, K, dtype=torch.int16, device=weight.device)  # BF16 bits [N, K]
    elif out.shape != (N, K) or not out.is_contiguous() or out.element_size() != 2 or out.device != weight.device:
        raise ValueError(f"unpack: out must be a contiguous 2-byte [{N}, {K}] tensor on {weight.device}")
    out = out.view(torch.int16)
    grid = (triton.cdiv(N, BLOCK_N), triton.cdiv(padded_columns(K), BLOCK_K))
    _unpack_kernel[grid](
        weight.lo, weight.hi, weight.base, out,
        N, K, padded_columns(K),
        weight.lo.stride(0), weight.hi.stride(0), out.stride(0),
        BLOCK_N=BLOCK_N, BLOCK_K=BLOCK_K, PTX_DECODE=ptx_decode(), num_warps=NUM_WARPS,
    )
    if weight.num_escapes:
        flat = escape_rows(weight) * K + escape_columns(weight)
        out.view(-1)[flat] = weight.esc_val
    return out.view(torch.bfloat16)


# -- reference --------------------------------------------------------------------------------
reference = decode
