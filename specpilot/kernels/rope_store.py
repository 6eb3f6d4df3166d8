"""A dense attention layer's q/k norm, RoPE and K/V cache write in one kernel (`System.rope_store`).

Owns: the launcher of `rope_store_kernel.py`, when it applies (`applies`: `DTYPES`,
`HEAD_DIMS`, `kernels_available`) and a pure-torch version of the same math
(`reference_qk_norm_rope_store`), used where the kernel cannot run.

Between a layer's qkv projection and its attention, `Transformer.forward` otherwise runs the fused
op `models.ops.qkv_norm_rope` (compiled by inductor on CUDA into about two kernels), two indexed
writes of k and v into the cache (with their copies), and once per forward the gathers and casts
of the RoPE tables (four kernels): each a few microseconds of launch inside a CUDA graph. The
kernel does all of it in one launch per layer, gathering cos and sin by position itself.

The rounding rule (that of inductor's compiled `ops.qkv_norm_rope` on CUDA, not of its eager ops):
- qkv is loaded and the q/k norm computed in float32 (rsqrt of the mean square plus eps);
- the normalised head is rounded once to the model dtype (the explicit `h.to(x.dtype)` of
  `ops.rms_norm`); the weight multiply and RoPE are float32, with cos and sin rounded to the model
  dtype first (the eager path casts the tables to it before use);
- q, k and v are rounded to the model dtype once, at the store.
So on float32 models it is the eager op up to the norm's summation order (and rsqrt's last bit); on
BF16 ones it differs from the eager op (which rounds every product and sum) by those roundings, and
from the compiled op by the norm's summation order and instruction choice: within one ulp of each
head's largest value, not always bit-equal (`tests/gpu/test_rope_store_cuda.py` checks the bound).
A target with the kernel therefore rounds unlike one without it (as a compiled verification does):
speculation with it equals AR with it, and the guard judges it against stock.

The kernel: one program per (block of rows, head), heads in qkv's order (q, k, v); a head's D
columns as two halves of D/2, so RoPE pairs columns d and d + D/2 in registers (the norm, RoPE and
store are `tiles.qk_norm_rope` and `tiles.store_head`, shared with `draft_layer`'s qkv kernel).
Shapes are static per call and nothing reads the host: a CUDA graph captures it as launched (a
forward traced by torch.compile keeps the plain ops, which inductor fuses:
`Transformer.rope_store_applies`). float32 and BF16 models; head_dim a power of two from 32 to 256
with RoPE over all of it; GQA (H a multiple of Hkv); caches [B, Hkv, S, D] with unit innermost
stride.

Does not own the model's forward (`models.transformer`) or which systems use it (`engine.session`).
"""

from __future__ import annotations

import torch

from specpilot import env
from specpilot.kernels.configs import next_pow2
from specpilot.kernels.dispatch import kernels_available
from specpilot.kernels.draft_layer import _rope
from specpilot.kernels.launch import launch_options, pdl

DTYPES = {torch.float32: 0, torch.bfloat16: 1}  # -> the kernel's ROUND code
HEAD_DIMS = (32, 64, 128, 256)
MAX_BLOCK_M = 16  # rows per program on a GPU (a decode step's few rows take the next power of two)
INTERPRETER_BLOCK_M = 64  # under the interpreter a program costs its ops, not its size: few, wide ones



def block_m(M: int) -> int:
    """Rows per program: M's next power of two, at least 2, at most `MAX_BLOCK_M`
    (`INTERPRETER_BLOCK_M` under the interpreter)."""
    return min(INTERPRETER_BLOCK_M if env.triton_interpret() else MAX_BLOCK_M, max(2, next_pow2(M)))


def applies(qkv: torch.Tensor, head_dim: int, rotary_dim: int) -> bool:
    """Whether a layer with this projection output (its dtype and device), head size and rotary size
    runs the kernel."""
    return (kernels_available(qkv) and qkv.dtype in DTYPES and head_dim in HEAD_DIMS
            and rotary_dim == head_dim)


def _check(qkv, cos_table, positions, k_cache, v_cache, slots, H, Hkv, D) -> tuple[int, int]:
    B, T, N = qkv.shape
    if (N != (H + 2 * Hkv) * D or H % Hkv or qkv.dtype not in DTYPES or D not in HEAD_DIMS
            or k_cache.shape[:2] != (B, Hkv) or k_cache.shape[-1] != D or v_cache.shape != k_cache.shape
            or k_cache.dtype != qkv.dtype or v_cache.dtype != qkv.dtype or cos_table.shape[-1] != D
            or positions.shape != (B, T) or slots.shape != (B, T)
            or qkv.stride(-1) != 1 or k_cache.stride(-1) != 1 or v_cache.stride(-1) != 1
            or cos_table.stride(-1) != 1):
        raise ValueError(f"rope_store: expects qkv [B,T,(H+2Hkv)D] (D in {HEAD_DIMS}, H a multiple of Hkv), "
                         "caches [B,Hkv,S,D] in qkv's dtype (float32 or bfloat16), tables [P,D], positions and "
                         f"slots [B,T], unit last strides; got qkv {tuple(qkv.shape)} {qkv.dtype} with H={H}, "
                         f"Hkv={Hkv}, D={D}, cache {tuple(k_cache.shape)} {k_cache.dtype}, table "
                         f"{tuple(cos_table.shape)}, positions {tuple(positions.shape)}, slots {tuple(slots.shape)}")
    return B * T, T


def qk_norm_rope_store_eager(qkv, q_weight, k_weight, cos_table, sin_table, positions, k_cache, v_cache, slots,
                             H: int, Hkv: int, D: int, eps: float) -> torch.Tensor:
    """`qk_norm_rope_store` by the kernel, called directly."""
    from specpilot.kernels import rope_store_kernel as kernels

    M, T = _check(qkv, cos_table, positions, k_cache, v_cache, slots, H, Hkv, D)
    x = qkv.reshape(M, -1)  # [M,(H+2Hkv)D]: a view of a contiguous projection
    q = torch.empty(qkv.shape[0], T, H, D, dtype=qkv.dtype, device=qkv.device)
    positions, slots = positions.reshape(M).contiguous(), slots.reshape(M).contiguous()
    if M == 0:  # no rows: nothing to write (a grid of no programs is not launched)
        return q
    qk = q_weight is not None
    bm = block_m(M)
    on = pdl(qkv.device)
    kernels.rope_store_kernel[(-(-M // bm), H + 2 * Hkv)](
        x, q_weight if qk else x, k_weight if qk else x, cos_table, sin_table, positions, slots, q, k_cache, v_cache,
        M, T, H, Hkv, eps,
        x.stride(0), cos_table.stride(0), H * D, D,
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2), v_cache.stride(0), v_cache.stride(1),
        v_cache.stride(2),
        BLOCK_M=bm, HALF=D // 2, QK_NORM=qk, ROUND=DTYPES[qkv.dtype], PDL=on,
        num_warps=4 if bm * D >= 2048 else 2, num_stages=1, **launch_options(on),
    )
    return q


def _rms_norm_compiled(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """`models.ops.rms_norm` as inductor rounds it, in float32: one rounding to x's dtype after the
    normalisation, the weight multiply unrounded (restated: kernels sit below models)."""
    h = x.float()
    h = (h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype).float()
    return weight.float() * h


def reference_qk_norm_rope_store(qkv, q_weight, k_weight, cos_table, sin_table, positions, k_cache, v_cache, slots,
                                 H: int, Hkv: int, D: int, eps: float) -> torch.Tensor:
    """`qk_norm_rope_store` in torch ops, rounded by the module docstring's rule (the compiled op's)."""
    B, T, _ = qkv.shape
    c = cos_table[positions].to(qkv.dtype).float()[:, :, None]  # [B,T,1,D]
    s = sin_table[positions].to(qkv.dtype).float()[:, :, None]
    q, k, v = qkv.split([H * D, Hkv * D, Hkv * D], dim=-1)
    q, k, v = q.view(B, T, H, D), k.view(B, T, Hkv, D), v.view(B, T, Hkv, D)
    if q_weight is not None:
        q, k = _rms_norm_compiled(q, q_weight, eps), _rms_norm_compiled(k, k_weight, eps)
    q, k = _rope(q.float(), c, s).to(qkv.dtype), _rope(k.float(), c, s).to(qkv.dtype)
    rows = torch.arange(B, device=qkv.device)[:, None].expand(B, T)
    k_cache[rows, :, slots] = k
    v_cache[rows, :, slots] = v
    return q


def qk_norm_rope_store(qkv: torch.Tensor, q_weight: torch.Tensor | None, k_weight: torch.Tensor | None,
                       cos_table: torch.Tensor, sin_table: torch.Tensor, positions: torch.Tensor,
                       k_cache: torch.Tensor, v_cache: torch.Tensor, slots: torch.Tensor, H: int, Hkv: int, D: int,
                       eps: float) -> torch.Tensor:
    """q [B,T,H,D] of the fused projection qkv [B,T,(H+2Hkv)D]: q/k RMSNorm by q_weight, k_weight [D]
    (or None: no q/k norm) and RoPE by the float32 tables cos_table, sin_table [P,D] at positions
    [B,T]; k and v of token (b, t) written to k_cache, v_cache [B,Hkv,S,D] at [b, :, slots[b, t]].
    Rounded as the module docstring says. The kernel where it applies, else
    `reference_qk_norm_rope_store`."""
    args = (qkv, q_weight, k_weight, cos_table, sin_table, positions, k_cache, v_cache, slots, H, Hkv, D, eps)
    if not applies(qkv, D, cos_table.shape[-1]):
        return reference_qk_norm_rope_store(*args)
    return qk_norm_rope_store_eager(*args)
