"""FP8 projection kernel: y[M, N] = x[M, K] @ W[N, K].T for e4m3 weights with float32 scales, any M.

Owns the Triton kernel, its launcher and its launch heuristic for the two FP8 paths:
  - weight-only: x in BF16 / FP16 / float32, W[n, k] = code[n, k] * scale[n, k // block_k];
  - W8A8: x given as e4m3 codes with a row-wise scale grid of its own (`fp8_activations`:
    dynamic per-token scales, per block_k group), y = sum_k xcode * xscale * wcode * wscale.
The scale grid is `FP8Weight`'s row-wise one ([N, Kb], Kb = ceil(K / block_k)): per-channel is
Kb = 1 (block_k = K), block-wise 128x128 has its block rows already expanded to one scale row
per weight row. Scales are applied in float32 to each K tile's tensor-core product (block-wise) or
once after the K loop (per-channel), never folded into the weights, so the only roundings are the
fp32 accumulation's: the result is within `kernels.reference.error_bound` of the float32
dequantize-then-matmul reference (`reference`), the summation order fixed (deterministic).

Decoding: e4m3 codes always load as their bytes (uint8: a masked load fills 0, which Triton
cannot cast to float8); on CUDA they are bitcast to float8e4nv and convert in hardware; under the
CPU interpreter (which cannot convert float8) they decode by bit moves: e4m3's
s.eeee.mmm placed at fp16's bits s.0eeee.mmm0000000 is the same value times 2^-8, subnormals
included, so the decoded tile is exact and the 2^8 is restored once at the end (a power of two:
the fp32 sums are the same up to that exact factor). Both give the same bits.

Tiles are [BLOCK_M, BLOCK_K] x [BLOCK_N, BLOCK_K] tensor-core products (BLOCK_M >= 16 also for
M = 1: the weight stream, not the arithmetic, bounds these row counts); programs iterate M
fastest so that the row blocks of one weight tile run together and share it through L2. With too
few tiles for the SMs, K is split and reduced in split order by the last split
(`tiles.reduce_split_k`, the W12 kernels' deterministic reduction, on the shared workspace).

Does not own the activation quantization's definition (`fp8_activations`), which kernel a
projection runs (`fp8_dispatch`) or the weights' form (`models.fp8_linear`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from specpilot.kernels import tiles
from specpilot.kernels.launch import sm_count
from specpilot.kernels.workspace import shared_workspace

E4M3 = torch.float8_e4m3fn
MAX_SPLIT_K = 16
DOT_DTYPES = (torch.bfloat16, torch.float16, torch.float32)


# -- configs ----------------------------------------------------------------------------------
@dataclass(frozen=True)
class FP8Config:
    """A launch of the FP8 kernel: tile sizes, K split and Triton's warps and pipeline stages."""
    block_m: int
    block_n: int
    block_k: int
    split_k: int = 1
    num_warps: int = 4
    num_stages: int = 4


def tile_k(block_k: int, K: int) -> int:
    """The K tile: 128 when it divides the scale block (or the scales are per channel), else the
    largest power of two dividing block_k; a scale block must hold whole tiles."""
    if block_k >= K:
        return 128
    t = 128
    while t >= 16 and block_k % t:
        t //= 2
    if t < 16:
        raise ValueError(f"FP8 kernel needs a scale block of a multiple of 16 columns, got block_k={block_k}")
    return t


def choose_config(M: int, N: int, K: int, block_k: int, device: torch.device) -> FP8Config:
    """The heuristic launch config: the smallest row tile that covers M (up to 128), 64 weight rows a
    program (128 above 32 rows), and K split until the tiles fill the SMs twice over."""
    bm = 16 if M <= 16 else 32 if M <= 32 else 64 if M <= 64 else 128
    bn = 64 if M <= 32 else 128
    bk = tile_k(block_k, K)
    tiles_mn = triton.cdiv(M, bm) * triton.cdiv(N, bn)
    steps = triton.cdiv(K, bk)
    split = max(1, min(MAX_SPLIT_K, steps, triton.cdiv(2 * sm_count(device), tiles_mn)))
    split = triton.cdiv(steps, triton.cdiv(steps, split))  # no empty splits
    warps = 4 if bm * bn <= 64 * 64 else 8
    return FP8Config(bm, bn, bk, split, warps, 4 if bm <= 64 else 3)


# -- kernel -----------------------------------------------------------------------------------
@triton.jit
def _decode(codes, DOT: tl.constexpr):
    """e4m3 bytes (uint8) -> their values times 2^-8, exact, in the dot dtype."""
    c = codes.to(tl.int32)
    half = (((c & 0x80) << 8) | ((c & 0x7F) << 7)).to(tl.int16).to(tl.float16, bitcast=True)
    return half.to(DOT)


@triton.jit
def _round_to_bf16(v):
    """float32 [..] rounded to nearest even at bf16's precision (still float32): the interpreter
    converts float32 to bf16 by truncation, so its results are rounded here first."""
    bits = v.to(tl.int32, bitcast=True)
    bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & -65536
    return bits.to(tl.float32, bitcast=True)


@triton.jit
def _operand(tile, IS_CODES: tl.constexpr, NATIVE: tl.constexpr, DOT: tl.constexpr):
    """A loaded tile as a tensor-core operand in the dot dtype: e4m3 codes arrive as their bytes
    (uint8, so masked loads can fill 0), converted in hardware (NATIVE) or decoded exactly."""
    if not IS_CODES:  # one return: Triton visits the statements after a static branch's return
        out = tile.to(DOT)
    elif NATIVE:
        out = tile.to(tl.float8e4nv, bitcast=True).to(DOT)
    else:
        out = _decode(tile, DOT)
    return out


@triton.jit(do_not_specialize=["M", "split_k", "steps_per_split"])
def _fp8_gemm_kernel(
    # pointers
    x_ptr, w_ptr, w_scale_ptr, x_scale_ptr, y_ptr, ws_ptr, count_ptr,
    # sizes
    M, N, K, split_k, steps_per_split,
    # strides (elements)
    stride_xm, stride_wn, stride_wsn, stride_xsm, stride_ym,
    # meta-parameters
    SCALE_STEPS: tl.constexpr,  # K tiles per scale block; 0: one scale per row (per-channel)
    X_CODES: tl.constexpr,      # x is e4m3 codes with a row-wise scale grid (W8A8)
    NATIVE: tl.constexpr,       # bytes bitcast to float8 and converted in hardware (CUDA); else decoded
    DOT: tl.constexpr,          # the tensor-core operands' dtype
    FACTOR: tl.constexpr,       # 2^8 per decoded operand (1.0 when NATIVE)
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, EVEN_K: tl.constexpr,
):
    pid_m = tl.program_id(0)  # fastest: the row blocks of one weight tile run together
    pid_n = tl.program_id(1)
    pid_k = tl.program_id(2)
    m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)  # [BM]
    n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)  # [BN]
    kk = tl.arange(0, BLOCK_K)  # [BK]
    m_ok, n_ok = m < M, n < N
    step0 = pid_k * steps_per_split
    step1 = tl.minimum(step0 + steps_per_split, tl.cdiv(K, BLOCK_K))
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for step in range(step0, step1):
        k = step * BLOCK_K + kk
        if EVEN_K:
            x = tl.load(x_ptr + m[:, None] * stride_xm + k[None, :], mask=m_ok[:, None], other=0)
            w = tl.load(w_ptr + n[:, None] * stride_wn + k[None, :], mask=n_ok[:, None], other=0)
        else:
            k_ok = k < K
            x = tl.load(x_ptr + m[:, None] * stride_xm + k[None, :], mask=m_ok[:, None] & k_ok[None, :], other=0)
            w = tl.load(w_ptr + n[:, None] * stride_wn + k[None, :], mask=n_ok[:, None] & k_ok[None, :], other=0)
        if X_CODES and NATIVE:  # e4m3 x e4m3 on the tensor cores, float32 accumulation
            part = tl.dot(x.to(tl.float8e4nv, bitcast=True), tl.trans(w.to(tl.float8e4nv, bitcast=True)))  # [BM, BN]
        elif DOT == tl.float32:
            xo = _operand(x, X_CODES, NATIVE, DOT)  # [BM, BK]
            wo = _operand(w, True, NATIVE, DOT)  # [BN, BK]
            part = tl.dot(xo, tl.trans(wo), input_precision="ieee")  # [BM, BN]
        else:
            part = tl.dot(_operand(x, X_CODES, NATIVE, DOT), tl.trans(_operand(w, True, NATIVE, DOT)))  # [BM, BN]
        if SCALE_STEPS > 0:  # block-wise: this tile's scales, applied before the sum over K tiles
            kb = step // SCALE_STEPS
            part = part * tl.load(w_scale_ptr + n * stride_wsn + kb, mask=n_ok, other=0.0)[None, :]
            if X_CODES:
                part = part * tl.load(x_scale_ptr + m * stride_xsm + kb, mask=m_ok, other=0.0)[:, None]
        acc += part
    if SCALE_STEPS == 0:  # per-channel: one scale per weight row (and per activation row)
        acc = acc * tl.load(w_scale_ptr + n * stride_wsn, mask=n_ok, other=0.0)[None, :]
        if X_CODES:
            acc = acc * tl.load(x_scale_ptr + m * stride_xsm, mask=m_ok, other=0.0)[:, None]
    if FACTOR != 1.0:
        acc = acc * FACTOR  # exact: undoes the decode's 2^-8 per operand
    y_mask = m_ok[:, None] & n_ok[None, :]
    if split_k > 1:
        tile = pid_m * tl.num_programs(1) + pid_n
        is_last, acc = tiles.reduce_split_k(acc, ws_ptr, count_ptr, tile, pid_k, split_k,
                                            m[:, None] * N + n[None, :], y_mask, M * N)
    else:
        is_last = pid_k == 0
    if is_last:
        if not NATIVE and y_ptr.dtype.element_ty == tl.bfloat16:
            acc = _round_to_bf16(acc)
        tl.store(y_ptr + m[:, None] * stride_ym + n[None, :], acc.to(y_ptr.dtype.element_ty), mask=y_mask)


# -- wrapper ----------------------------------------------------------------------------------
def check_operands(x: torch.Tensor, data: torch.Tensor, scale: torch.Tensor, block_k: int,
                   x_scale: torch.Tensor | None = None) -> None:
    """Raise ValueError (one line) unless x [M, K], e4m3 codes [N, K] and scales [N, Kb] (and, for
    W8A8, e4m3 x with x_scale [M, Kb]) fit together on one device."""
    if data.dim() != 2 or data.dtype != E4M3:
        raise ValueError(f"FP8 kernel needs e4m3 weight codes [N, K], got {data.dtype} {list(data.shape)}")
    N, K = data.shape
    if not isinstance(block_k, int) or block_k < 1:
        raise ValueError(f"FP8 kernel needs a positive integer block_k, got {block_k!r}")
    Kb = -(-K // block_k)
    if scale.dtype != torch.float32 or tuple(scale.shape) != (N, Kb):
        raise ValueError(f"FP8 kernel needs float32 weight scales [{N}, {Kb}] for block_k={block_k}, "
                         f"got {scale.dtype} {list(scale.shape)}")
    if x.dim() != 2 or x.shape[1] != K:
        raise ValueError(f"FP8 kernel needs activations [M, {K}], got {list(x.shape)}")
    if x_scale is None:
        if x.dtype not in DOT_DTYPES:
            raise ValueError(f"FP8 weight-only kernel needs bf16, fp16 or float32 activations, got {x.dtype}")
    else:
        if x.dtype != E4M3:
            raise ValueError(f"FP8 W8A8 kernel needs e4m3 activation codes, got {x.dtype}")
        if x_scale.dtype != torch.float32 or tuple(x_scale.shape) != (x.shape[0], Kb):
            raise ValueError(f"FP8 W8A8 kernel needs float32 activation scales [{x.shape[0]}, {Kb}], "
                             f"got {x_scale.dtype} {list(x_scale.shape)}")
    tensors = [x, data, scale] + ([x_scale] if x_scale is not None else [])
    if len({t.device for t in tensors}) != 1:
        raise ValueError("FP8 kernel operands are on different devices: " + ", ".join(str(t.device) for t in tensors))
    if data.stride(1) != 1 or x.stride(1) != 1:
        raise ValueError("FP8 kernel needs weight codes and activations contiguous along K")
    tile_k(block_k, K)


def fp8_gemm(x: torch.Tensor, data: torch.Tensor, scale: torch.Tensor, block_k: int,
             x_scale: torch.Tensor | None = None, out_dtype: torch.dtype | None = None,
             config: FP8Config | None = None) -> torch.Tensor:
    """y [M, N] for x [M, K] and e4m3 codes [N, K] with scales [N, Kb]: weight-only (x in bf16,
    fp16 or float32; y in x's dtype) or, with `x_scale` [M, Kb], W8A8 (x e4m3 codes; y in
    `out_dtype`, default bf16). `config`: a launch config, else `choose_config`'s."""
    check_operands(x, data, scale, block_k, x_scale)
    M, K = x.shape
    N = data.shape[0]
    w8a8 = x_scale is not None
    out_dtype = out_dtype or (torch.bfloat16 if w8a8 else x.dtype)
    y = torch.empty(M, N, dtype=out_dtype, device=x.device)
    if M == 0:
        return y
    c = config or choose_config(M, N, K, block_k, x.device)
    if block_k < K and block_k % c.block_k:
        raise ValueError(f"FP8 launch config block_k={c.block_k} does not divide the scale block {block_k}")
    native = x.is_cuda
    # the interpreter's bf16/fp16 dot is wrong (Triton 3.9): it multiplies the exactly upcast operands
    # in float32 instead, the same products (bf16 x e4m3 is exact in float32) and fp32 sums
    dot = (torch.bfloat16 if w8a8 else x.dtype) if native else torch.float32
    steps = triton.cdiv(K, c.block_k)
    per_split = triton.cdiv(steps, c.split_k)
    split = triton.cdiv(steps, per_split)
    ws = shared_workspace(x.device)
    grid = (triton.cdiv(M, c.block_m), triton.cdiv(N, c.block_n), split)
    if split > 1 and not ws.fits(split, M, N, grid[0] * grid[1]):
        per_split, split = steps, 1
        grid = (grid[0], grid[1], 1)
    def codes(t):  # e4m3 passed as its bytes: a masked load fills uint8 0 (an int cannot cast to float8)
        return t.view(torch.uint8)

    xs = x_scale if w8a8 else scale  # an unused pointer still needs a tensor
    _fp8_gemm_kernel[grid](
        codes(x) if w8a8 else x, codes(data), scale, xs, y, ws.partials, ws.counters,
        M, N, K, split, per_split,
        x.stride(0), data.stride(0), scale.stride(0), xs.stride(0), y.stride(0),
        SCALE_STEPS=0 if block_k >= K else block_k // c.block_k, X_CODES=w8a8, NATIVE=native,
        DOT=_TL_DTYPES[dot], FACTOR=1.0 if native else (65536.0 if w8a8 else 256.0),
        BLOCK_M=c.block_m, BLOCK_N=c.block_n, BLOCK_K=c.block_k, EVEN_K=K % c.block_k == 0,
        num_warps=c.num_warps, num_stages=c.num_stages,
    )
    return y


_TL_DTYPES = {torch.bfloat16: tl.bfloat16, torch.float16: tl.float16, torch.float32: tl.float32}


# -- reference --------------------------------------------------------------------------------
def dequantize(data: torch.Tensor, scale: torch.Tensor, block_k: int) -> torch.Tensor:
    """W [N, K] float32 = code * scale[n, k // block_k] (`FP8Weight.dequantize`'s rule)."""
    K = data.shape[1]
    return data.float() * scale.repeat_interleave(block_k, dim=1)[:, :K]


def reference(x: torch.Tensor, data: torch.Tensor, scale: torch.Tensor, block_k: int,
              x_scale: torch.Tensor | None = None) -> torch.Tensor:
    """y [M, N] float32: the dequantized operands multiplied in float32 (what the kernel computes
    up to summation order); W8A8's x is its codes times their scales."""
    xf = x.float() if x_scale is None else dequantize(x, x_scale, block_k)
    return xf @ dequantize(data, scale, block_k).T
