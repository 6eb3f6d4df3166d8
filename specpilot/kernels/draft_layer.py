"""A draft model's decoder layer in four fused kernels, for the few rows of a draft step (M = B*T <= 16).

Owns: the kernels' launchers, the custom ops torch.compile sees (`specpilot::draft_norm_qkv_rope`,
which writes the cache, and `specpilot::draft_rows_linear`), when they apply (`MAX_ROWS`, `DTYPES`,
`kernels_available`) and pure-torch versions of the same math (`reference_*`, the model's eager
ops in the model's order), used where the kernels cannot run.

The kernels (`draft_layer_kernel.py`), per layer of `models.fused_decoder.FusedDecoder`:
- `norm_qkv_rope`: h -> RMSNorm -> qkv projection -> q/k norm (Qwen3) -> RoPE; k and v written
  straight into the KV cache at (row, slot), q returned. One program per head (q, then k, then v):
  the head's D rows as two halves of D/2, so RoPE pairs columns d and d + D/2 in registers.
- `gemv_residual`: h + x @ W.T (o_proj, down_proj), the residual add in the epilogue.
- `norm_gate_up_silu`: h -> RMSNorm -> gate|up projection -> silu(gate) * up; a program owns the
  matching gate and up rows, so the product is formed in registers.
- `norm_gemv`: h -> RMSNorm -> x @ W.T (the final norm and lm_head).
Between them only the attention (`CachedAttention.attend_over_cache`, the `attention` knob's kernel).

The rules:
- Every program takes all M rows (padded to BLOCK_M = 16, the smallest tl.dot) and recomputes the
  norm's rms of each row in its prologue (C is small): no normed copy of h is ever written.
- float32 accumulation over the K columns (tl.dot: BF16 operands on BF16 models, IEEE float32 on
  float32 ones); every value the reference rounds to the model dtype is rounded there too (the
  normed operand, the projection, the q/k norm, each RoPE product and sum, the residual add, silu
  and the product), so the kernels differ from the reference only by summation order.
- Shapes are static per call and nothing reads the host: a CUDA graph or a compiled proposal
  captures them as launched.
- float32 and BF16 models; weights [N, K] with unit innermost stride; head_dim a power of two from
  32 to 256 with RoPE over all of it.

Does not own the model's forward (`models.fused_decoder`) or the attention.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from specpilot import env
from specpilot.kernels.configs import next_pow2
from specpilot.kernels.dispatch import kernels_available
from specpilot.kernels.launch import launch_options, pdl

MAX_ROWS = 16  # rows (B*T) of one call: one tl.dot row block; a catch-up window or a frontier of up to 16
DTYPES = {torch.float32: 0, torch.bfloat16: 1}  # -> the kernels' ROUND code
HEAD_DIMS = (32, 64, 128, 256)
PLAIN, RESIDUAL, SWIGLU = 0, 1, 2  # the epilogues of `rows_linear`


def _rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm as the dense model computes it (`models.ops.rms_norm`: float32, one rounding to x's
    dtype, then the weight); restated here because kernels sit below models (a test keeps them equal)."""
    h = x.float()
    return weight * (h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)


def _rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x * cos + rotate_half(x) * sin (`models.ops.qkv_norm_rope`'s RoPE)."""
    x1, x2 = x.chunk(2, dim=-1)
    return x * cos + torch.cat([-x2, x1], dim=-1) * sin


@dataclass(frozen=True)
class Blocking:
    """Columns per K step and warps per program (the grid is per head, or per block of `block_n(N)` rows)."""

    block_k: int = 128
    num_warps: int = 4


BLOCKING = Blocking()



INTERPRETER_BLOCK_N = 128  # under the interpreter a program costs its ops, not its size: few, wide ones


def block_n(N: int) -> int:
    """Output rows per program: the largest of 64, 32, 16 that still gives >= 128 programs (a GPU's
    SMs each streaming its share of the weights), else 16; `INTERPRETER_BLOCK_N` under the
    interpreter (the same sums in the same order: a block of rows never splits a row's K loop)."""
    if env.triton_interpret():
        return INTERPRETER_BLOCK_N
    for bn in (64, 32):
        if -(-N // bn) >= 128:
            return bn
    return 16


def _block_k(K: int) -> int:
    return max(16, min(BLOCKING.block_k, next_pow2(K)))


def _bf16_dots(x: torch.Tensor) -> bool:
    """BF16 operands on the tensor cores for BF16 models; IEEE float32 dots (exact products of BF16
    values, float32 sums) under the interpreter, which mishandles BF16 dots."""
    return x.dtype == torch.bfloat16 and not env.triton_interpret()


def applies(x: torch.Tensor, rows: int) -> bool:
    """Whether a forward of `rows` rows in x's dtype and device runs the kernels."""
    return kernels_available(x) and x.dtype in DTYPES and 0 < rows <= MAX_ROWS


# ---- the projections with a prologue and an epilogue ----------------------------------------------

def _check_rows(x, w, residual, norm_w, epilogue) -> tuple[int, int, int]:
    M, K = x.shape
    N = w.shape[0] // (2 if epilogue == SWIGLU else 1)
    if (w.dim() != 2 or w.shape[1] != K or w.dtype != x.dtype or x.dtype not in DTYPES or M > MAX_ROWS
            or x.stride(-1) != 1 or w.stride(-1) != 1
            or (residual is not None and (residual.shape != (M, N) or residual.stride(-1) != 1))
            or (norm_w is not None and norm_w.shape != (K,))):
        raise ValueError(f"draft_layer.rows_linear: expects x [M<={MAX_ROWS},K], W [N,K] (2N for SwiGLU) in x's dtype "
                         f"(float32 or bfloat16), unit last strides; got x {tuple(x.shape)} {x.dtype}, "
                         f"W {tuple(w.shape)} {w.dtype}")
    return M, N, K


def rows_linear_eager(x: torch.Tensor, w: torch.Tensor, residual: torch.Tensor | None, norm_w: torch.Tensor | None,
                      eps: float, epilogue: int) -> torch.Tensor:
    """`rows_linear` by the kernel, called directly."""
    from specpilot.kernels import draft_layer_kernel as kernels

    M, N, K = _check_rows(x, w, residual, norm_w, epilogue)
    y = torch.empty(M, N, dtype=x.dtype, device=x.device)
    bn = block_n(N)
    on = pdl(x.device)
    h = residual if residual is not None else y
    kernels.draft_gemv_kernel[(-(-N // bn),)](
        x, norm_w if norm_w is not None else x, w, h, y,
        M, N, K, eps,
        x.stride(0), w.stride(0), h.stride(0), y.stride(0),
        BLOCK_M=MAX_ROWS, BLOCK_N=bn, BLOCK_K=_block_k(K), NORM=norm_w is not None, EPILOGUE=epilogue,
        ROUND=DTYPES[x.dtype], DOT_BF16=_bf16_dots(x), PDL=on,
        num_warps=BLOCKING.num_warps, num_stages=2, **launch_options(on),
    )
    return y


def reference_rows_linear(x, w, residual, norm_w, eps: float, epilogue: int) -> torch.Tensor:
    """`rows_linear` as the model's eager ops compute it."""
    if norm_w is not None:
        x = _rms_norm(x, norm_w, eps)
    y = F.linear(x, w)
    if epilogue == SWIGLU:
        gate, up = y.chunk(2, dim=-1)
        return F.silu(gate) * up
    return residual + y if epilogue == RESIDUAL else y


@torch.library.custom_op("specpilot::draft_rows_linear", mutates_args=())
def _rows_linear_op(x: torch.Tensor, w: torch.Tensor, residual: torch.Tensor | None, norm_w: torch.Tensor | None,
                    eps: float, epilogue: int) -> torch.Tensor:
    return rows_linear_eager(x, w, residual, norm_w, eps, epilogue)


@_rows_linear_op.register_fake
def _(x, w, residual, norm_w, eps, epilogue):
    return x.new_empty(x.shape[0], w.shape[0] // (2 if epilogue == SWIGLU else 1))


def rows_linear(x: torch.Tensor, w: torch.Tensor, residual: torch.Tensor | None = None,
                norm_w: torch.Tensor | None = None, eps: float = 0.0, epilogue: int = PLAIN) -> torch.Tensor:
    """y [M,N] of x [M,K]: x RMS-normed by norm_w (if given), times W [N,K].T, then `epilogue`:
    PLAIN, RESIDUAL (residual [M,N] + y) or SWIGLU (W [2N,K] = [gate | up] rows: silu(gate) * up).
    The kernel where it applies (one custom op under torch.compile), else `reference_rows_linear`."""
    args = (x, w, residual, norm_w, eps, epilogue)
    if not applies(x, x.shape[0]):
        return reference_rows_linear(*args)
    if torch.compiler.is_compiling():
        return torch.ops.specpilot.draft_rows_linear(*args)
    return rows_linear_eager(*args)


def gemv_residual(h: torch.Tensor, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """h + x @ W.T: the output projection (o_proj, down_proj) with the residual add. h [M,N], x [M,K]."""
    return rows_linear(x, w, residual=h, epilogue=RESIDUAL)


def norm_gate_up_silu(h: torch.Tensor, norm_w: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    """silu(gate) * up [M,I] of rms_norm(h) [M,C] and the fused gate|up weight [2I,C]."""
    return rows_linear(h, w, norm_w=norm_w, eps=eps, epilogue=SWIGLU)


def norm_gemv(h: torch.Tensor, norm_w: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    """rms_norm(h) @ W.T [M,N] (the final norm and lm_head)."""
    return rows_linear(h, w, norm_w=norm_w, eps=eps)


# ---- the attention's input: norm, qkv, q/k norm, RoPE, the cache write ---------------------------

def _check_qkv(h, qkv_w, k_cache, v_cache, H, Hkv) -> tuple[int, int]:
    M, C = h.shape
    _, Hc, _, D = k_cache.shape
    if (qkv_w.shape != ((H + 2 * Hkv) * D, C) or qkv_w.dtype != h.dtype or h.dtype not in DTYPES or M > MAX_ROWS
            or Hc != Hkv or v_cache.shape != k_cache.shape or D not in HEAD_DIMS or k_cache.dtype != h.dtype
            or h.stride(-1) != 1 or qkv_w.stride(-1) != 1 or k_cache.stride(-1) != 1 or v_cache.stride(-1) != 1):
        raise ValueError(f"draft_layer.norm_qkv_rope: expects h [M<={MAX_ROWS},C], qkv_w [(H+2Hkv)D,C], caches "
                         f"[B,Hkv,S,D] (D in {HEAD_DIMS}) in h's dtype, unit last strides; got h {tuple(h.shape)} "
                         f"{h.dtype}, qkv_w {tuple(qkv_w.shape)}, cache {tuple(k_cache.shape)} {k_cache.dtype}")
    return M, D


def norm_qkv_rope_eager(h, norm_w, qkv_w, q_norm_w, k_norm_w, cos, sin, positions, slots, k_cache, v_cache,
                        T: int, H: int, Hkv: int, eps: float) -> torch.Tensor:
    """`norm_qkv_rope` by the kernel, called directly."""
    from specpilot.kernels import draft_layer_kernel as kernels

    M, D = _check_qkv(h, qkv_w, k_cache, v_cache, H, Hkv)
    q = torch.empty(M, H, D, dtype=h.dtype, device=h.device)
    positions, slots = positions.contiguous(), slots.contiguous()
    on = pdl(h.device)
    qk = q_norm_w is not None
    kernels.draft_qkv_gemv_kernel[(H + 2 * Hkv,)](
        h, norm_w, qkv_w, q_norm_w if qk else h, k_norm_w if qk else h, cos, sin, positions, slots, q,
        k_cache, v_cache,
        M, T, h.shape[1], H, Hkv, eps,
        h.stride(0), qkv_w.stride(0), cos.stride(0), q.stride(0), q.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2), v_cache.stride(0), v_cache.stride(1),
        v_cache.stride(2),
        BLOCK_M=MAX_ROWS, BLOCK_K=_block_k(h.shape[1]), HALF=D // 2, QK_NORM=qk, ROUND=DTYPES[h.dtype],
        DOT_BF16=_bf16_dots(h), PDL=on, num_warps=BLOCKING.num_warps, num_stages=2,
        **launch_options(on),
    )
    return q


def reference_norm_qkv_rope(h, norm_w, qkv_w, q_norm_w, k_norm_w, cos, sin, positions, slots, k_cache, v_cache,
                            T: int, H: int, Hkv: int, eps: float) -> torch.Tensor:
    """`norm_qkv_rope` as the model's eager ops compute it (`Transformer.forward`'s first steps of a layer)."""
    M, C = h.shape
    B, D = M // T, k_cache.shape[-1]
    x = _rms_norm(h, norm_w, eps).view(B, T, C)
    c = cos[positions].to(h.dtype).view(B, T, 1, D)
    s = sin[positions].to(h.dtype).view(B, T, 1, D)
    q, k, v = F.linear(x, qkv_w).split([H * D, Hkv * D, Hkv * D], dim=-1)
    q, k, v = q.view(B, T, H, D), k.view(B, T, Hkv, D), v.view(B, T, Hkv, D)
    if q_norm_w is not None:
        q, k = _rms_norm(q, q_norm_w, eps), _rms_norm(k, k_norm_w, eps)
    q, k = _rope(q, c, s), _rope(k, c, s)
    rows = torch.arange(B, device=h.device)[:, None].expand(B, T)
    k_cache[rows, :, slots.view(B, T)] = k
    v_cache[rows, :, slots.view(B, T)] = v
    return q.reshape(M, H, D)


@torch.library.custom_op("specpilot::draft_norm_qkv_rope", mutates_args=("k_cache", "v_cache"))
def _norm_qkv_rope_op(h: torch.Tensor, norm_w: torch.Tensor, qkv_w: torch.Tensor, q_norm_w: torch.Tensor | None,
                      k_norm_w: torch.Tensor | None, cos: torch.Tensor, sin: torch.Tensor, positions: torch.Tensor,
                      slots: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, T: int, H: int, Hkv: int,
                      eps: float) -> torch.Tensor:
    return norm_qkv_rope_eager(h, norm_w, qkv_w, q_norm_w, k_norm_w, cos, sin, positions, slots, k_cache, v_cache,
                               T, H, Hkv, eps)


@_norm_qkv_rope_op.register_fake
def _(h, norm_w, qkv_w, q_norm_w, k_norm_w, cos, sin, positions, slots, k_cache, v_cache, T, H, Hkv, eps):
    return h.new_empty(h.shape[0], H, k_cache.shape[-1])


def norm_qkv_rope(h: torch.Tensor, norm_w: torch.Tensor, qkv_w: torch.Tensor, q_norm_w: torch.Tensor | None,
                  k_norm_w: torch.Tensor | None, cos: torch.Tensor, sin: torch.Tensor, positions: torch.Tensor,
                  slots: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, T: int, H: int, Hkv: int,
                  eps: float) -> torch.Tensor:
    """q [M,H,D] of the residual stream h [M,C] (M = B*T rows, row m = (m // T, m % T)): RMSNorm by
    norm_w, the fused qkv projection [(H+2Hkv)D, C], q/k norms (weights [D], or None), RoPE by the
    tables cos, sin [P,D] (rounded to h's dtype, as `Transformer._rope` does) at positions [M]; k and
    v written into k_cache, v_cache [B,Hkv,S,D] at (m // T, slots[m]). The kernel where it applies (one custom op under torch.compile), else
    `reference_norm_qkv_rope`."""
    args = (h, norm_w, qkv_w, q_norm_w, k_norm_w, cos, sin, positions, slots, k_cache, v_cache, T, H, Hkv, eps)
    if not applies(h, h.shape[0]):
        return reference_norm_qkv_rope(*args)
    if torch.compiler.is_compiling():
        return torch.ops.specpilot.draft_norm_qkv_rope(*args)
    return norm_qkv_rope_eager(*args)
